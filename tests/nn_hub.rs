//! Hub ids: fetched from a tiny Hub-like HTTP server on 127.0.0.1 (started and stopped inside each test) into a
//! temporary cache, at a revision, with a token, and then offline from the cache alone.

mod common;
use common::tmpdir;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hierarchos::nn::hub::{HubOptions, resolve_model, resolve_model_with};
use hierarchos::nn::weights::{INDEX_FILE, save_f32};
use hierarchos::nn::{Error, ModelConfig, Weights};

const REPO: &str = "tiny-org/tiny-llama";
const MAIN_SHA: &str = "1111111111111111111111111111111111111111";
const V1_SHA: &str = "2222222222222222222222222222222222222222";
const TOKEN: &str = "hf_test_token";

fn config(layers: usize) -> String {
    format!(
        r#"{{"model_type": "llama", "vocab_size": 8, "hidden_size": 4, "intermediate_size": 8,
            "num_hidden_layers": {layers}, "num_attention_heads": 2}}"#
    )
}

/// The bytes of a one-tensor f32 safetensors file.
fn safetensors(name: &str, data: &[f32]) -> Vec<u8> {
    let dir = tmpdir("hub-st");
    let path = dir.join("x.safetensors");
    save_f32(&path, &[(name, &[data.len()], data)]).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    bytes
}

/// Repository contents per commit: `main` is sharded with a tokenizer, `v1` has a single file and a different
/// config.
fn commits() -> HashMap<&'static str, Vec<(&'static str, Vec<u8>)>> {
    let index = r#"{"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
        "b": "model-00002-of-00002.safetensors"}}"#;
    HashMap::from([
        (
            MAIN_SHA,
            vec![
                ("config.json", config(2).into_bytes()),
                (INDEX_FILE, index.as_bytes().to_vec()),
                ("model-00001-of-00002.safetensors", safetensors("a", &[1.0, 2.0])),
                ("model-00002-of-00002.safetensors", safetensors("b", &[3.0])),
                ("tokenizer.json", b"{\"tokenizer\": true}".to_vec()),
                ("README.md", b"# not fetched".to_vec()),
            ],
        ),
        (
            V1_SHA,
            vec![
                ("config.json", config(1).into_bytes()),
                ("model.safetensors", safetensors("a", &[5.0])),
            ],
        ),
    ])
}

/// A Hub-like server: `/api/models/{repo}/revision/{rev}` answers the commit and its file list, and
/// `/{repo}/resolve/{rev}/{file}` serves files with the headers `hf-hub` reads (`x-repo-commit`, `etag`,
/// `content-range` for range requests). It requires the bearer token when one is given, logs each request line,
/// and stops when dropped, after 60 s, or after 500 requests, whichever comes first.
struct Server {
    endpoint: String,
    log: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    fn start(token: Option<&'static str>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (log2, stop2) = (log.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let commits = commits();
            let start = Instant::now();
            let mut served = 0;
            while !stop2.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(60) && served < 500 {
                match listener.accept() {
                    Ok((stream, _)) => {
                        served += 1;
                        handle(stream, &commits, token, &log2);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Server {
            endpoint,
            log,
            stop,
            thread: Some(thread),
        }
    }

    fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Logs "GET path [auth]" of one request, then answers it and closes the connection. The line is logged before
/// the answer goes out, so a client that got its answer finds its request in the log.
fn handle(
    stream: TcpStream,
    commits: &HashMap<&'static str, Vec<(&'static str, Vec<u8>)>>,
    token: Option<&str>,
    log: &Mutex<Vec<String>>,
) -> Option<()> {
    stream.set_nonblocking(false).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut request = String::new();
    reader.read_line(&mut request).ok()?;
    let mut headers = HashMap::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let path = request.split_whitespace().nth(1)?.to_string();
    let auth = headers.get("authorization").cloned().unwrap_or_default();
    log.lock().unwrap().push(format!("GET {path} {auth}"));
    let resolve = |rev: &str| match rev {
        "main" => Some(MAIN_SHA),
        "v1" => Some(V1_SHA),
        sha => commits.keys().find(|k| **k == sha).copied(),
    };
    let authorized = token.is_none_or(|t| auth == format!("Bearer {t}"));
    let mut out = stream;
    let info_prefix = format!("/api/models/{REPO}/revision/");
    let file_prefix = format!("/{REPO}/resolve/");
    let response: (u16, Vec<(String, String)>, Vec<u8>) = if !authorized {
        (401, vec![], b"unauthorized".to_vec())
    } else if let Some(sha) = path.strip_prefix(&info_prefix).and_then(resolve) {
        let siblings: Vec<String> = commits[sha]
            .iter()
            .map(|(name, _)| format!(r#"{{"rfilename": "{name}"}}"#))
            .collect();
        let body = format!(
            r#"{{"id": "{REPO}", "sha": "{sha}", "siblings": [{}]}}"#,
            siblings.join(",")
        );
        (
            200,
            vec![("content-type".into(), "application/json".into())],
            body.into_bytes(),
        )
    } else if let Some(data) = path
        .strip_prefix(&file_prefix)
        .and_then(|rest| rest.split_once('/'))
        .and_then(|(rev, file)| Some((resolve(rev)?, file)))
        .and_then(|(sha, file)| Some((sha, &commits[sha].iter().find(|(name, _)| *name == file)?.1)))
    {
        let (sha, data) = data;
        let etag = format!("\"{:016x}\"", fnv(data));
        let mut h = vec![("x-repo-commit".into(), sha.to_string()), ("etag".into(), etag)];
        match headers.get("range").and_then(|r| r.strip_prefix("bytes=")) {
            Some(range) => {
                let (a, b) = range.split_once('-')?;
                let a: usize = a.parse().ok()?;
                let b: usize = if b.is_empty() { data.len() - 1 } else { b.parse().ok()? };
                let b = b.min(data.len() - 1);
                h.push(("content-range".into(), format!("bytes {a}-{b}/{}", data.len())));
                (206, h, data[a..=b].to_vec())
            }
            None => (200, h, data.clone()),
        }
    } else {
        (404, vec![], b"not found".to_vec())
    };
    let (status, extra, body) = response;
    let mut head = format!(
        "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    out.write_all(head.as_bytes()).ok()?;
    out.write_all(&body).ok()?;
    out.flush().ok()
}

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn options(endpoint: &str, cache: &Path, offline: bool) -> HubOptions {
    HubOptions {
        endpoint: endpoint.to_string(),
        cache_dir: cache.to_path_buf(),
        token: Some(TOKEN.to_string()),
        offline,
        progress: false,
    }
}

#[test]
fn fetch_at_revision_then_offline() {
    let server = Server::start(Some(TOKEN));
    let cache = tmpdir("hub-cache");
    let opts = options(&server.endpoint, &cache, false);

    let dir = resolve_model_with(REPO, None, &opts).unwrap();
    assert_eq!(
        dir,
        cache
            .join("models--tiny-org--tiny-llama")
            .join("snapshots")
            .join(MAIN_SHA)
    );
    assert_eq!(
        ModelConfig::from_file(&dir.join("config.json"))
            .unwrap()
            .num_hidden_layers,
        2
    );
    let w = Weights::open(&dir).unwrap();
    assert_eq!(w.read_f32("a", &[2]).unwrap(), vec![1.0, 2.0]);
    assert_eq!(w.read_f32("b", &[1]).unwrap(), vec![3.0]);
    assert!(dir.join("tokenizer.json").is_file());
    assert!(!dir.join("README.md").exists() && !dir.join("tokenizer_config.json").exists());
    let log = server.requests();
    assert!(
        log.iter().all(|l| l.ends_with(&format!("Bearer {TOKEN}"))),
        "token not sent: {log:#?}"
    );
    assert!(
        log[0].starts_with(&format!("GET /api/models/{REPO}/revision/main ")),
        "{log:#?}"
    );
    // Every file is fetched at the commit the revision resolved to.
    assert!(
        log[1..]
            .iter()
            .all(|l| l.starts_with(&format!("GET /{REPO}/resolve/{MAIN_SHA}/"))),
        "{log:#?}"
    );
    let fetched = log.len();

    // A second call re-resolves the revision but downloads nothing.
    assert_eq!(resolve_model_with(REPO, None, &opts).unwrap(), dir);
    assert_eq!(server.requests().len(), fetched + 1);

    // --revision selects another commit.
    let v1 = resolve_model_with(REPO, Some("v1"), &opts).unwrap();
    assert!(v1.ends_with(V1_SHA));
    assert_eq!(
        ModelConfig::from_file(&v1.join("config.json"))
            .unwrap()
            .num_hidden_layers,
        1
    );
    assert_eq!(Weights::open(&v1).unwrap().read_f32("a", &[1]).unwrap(), vec![5.0]);
    assert!(server.requests().iter().any(|l| l.contains("/revision/v1 ")));

    // Without the token the server refuses, and the error says so.
    let anonymous = HubOptions {
        token: None,
        ..options(&server.endpoint, &tmpdir("hub-anon"), false)
    };
    let e = resolve_model_with(REPO, None, &anonymous).unwrap_err();
    assert!(matches!(e, Error::Hub(_)) && e.to_string().contains("HF_TOKEN"), "{e}");
    // An unknown repository.
    let e = resolve_model_with("tiny-org/absent", None, &opts).unwrap_err();
    assert!(e.to_string().contains("tiny-org/absent"), "{e}");
    drop(server);

    // Offline: the cache alone, by branch, tag or commit hash; no server is running any more.
    let offline = options("http://127.0.0.1:9", &cache, true);
    assert_eq!(resolve_model_with(REPO, None, &offline).unwrap(), dir);
    assert_eq!(resolve_model_with(REPO, Some("v1"), &offline).unwrap(), v1);
    assert_eq!(resolve_model_with(REPO, Some(MAIN_SHA), &offline).unwrap(), dir);
    for (repo, rev) in [("tiny-org/other", None), (REPO, Some("v2"))] {
        let e = resolve_model_with(repo, rev, &offline).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(e, Error::Hub(_)) && msg.contains("HF_HUB_OFFLINE") && msg.contains(repo),
            "{msg}"
        );
    }
    // A snapshot that lost a shard is not taken for a cached model.
    std::fs::remove_file(dir.join("model-00002-of-00002.safetensors")).unwrap();
    let e = resolve_model_with(REPO, None, &offline).unwrap_err();
    assert!(e.to_string().contains("model-00002-of-00002.safetensors"), "{e}");
    std::fs::remove_dir_all(&cache).unwrap();
}

#[test]
fn local_folders_and_bad_arguments() {
    let dir = tmpdir("hub-local");
    let opts = options("http://127.0.0.1:9", &dir.join("cache"), true);
    let arg = dir.to_str().unwrap();
    assert_eq!(resolve_model_with(arg, None, &opts).unwrap(), dir);
    std::fs::write(dir.join("file.txt"), "x").unwrap();
    let file = dir.join("file.txt");
    let e = resolve_model_with(file.to_str().unwrap(), None, &opts).unwrap_err();
    assert!(
        matches!(e, Error::Invalid(_)) && e.to_string().contains("file.txt"),
        "{e}"
    );
    for arg in [
        "./no/such/folder",
        "/no/such",
        "a/b/c",
        "../up",
        "org/-bad",
        "org//x",
        "",
    ] {
        let e = resolve_model_with(arg, None, &opts).unwrap_err();
        assert!(matches!(e, Error::Invalid(_)), "{arg}: {e}");
    }
    for rev in ["", "../../etc", "/abs", "a/./b"] {
        let e = resolve_model_with("org/x", Some(rev), &opts).unwrap_err();
        assert!(matches!(e, Error::Invalid(_)), "{rev}: {e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The only test that touches the process environment (tests run as threads of one process).
#[test]
fn environment_variables() {
    let server = Server::start(Some(TOKEN));
    let home = tmpdir("hub-home");
    // SAFETY: no other test in this binary reads these variables.
    unsafe {
        std::env::set_var("HF_ENDPOINT", &server.endpoint);
        std::env::set_var("HF_HOME", &home);
        std::env::set_var("HF_TOKEN", TOKEN);
        std::env::remove_var("HF_HUB_CACHE");
        std::env::remove_var("HF_HUB_OFFLINE");
    }
    let opts = HubOptions::from_env().unwrap();
    assert_eq!(
        (
            opts.endpoint.as_str(),
            opts.cache_dir.clone(),
            opts.token.as_deref(),
            opts.offline
        ),
        (server.endpoint.as_str(), home.join("hub"), Some(TOKEN), false)
    );
    let dir = resolve_model(REPO, Some("v1")).unwrap();
    assert_eq!(
        dir,
        home.join("hub/models--tiny-org--tiny-llama/snapshots").join(V1_SHA)
    );
    drop(server);
    unsafe { std::env::set_var("HF_HUB_OFFLINE", "1") };
    assert_eq!(resolve_model(REPO, Some("v1")).unwrap(), dir);
    let e = resolve_model(REPO, None).unwrap_err();
    assert!(e.to_string().contains("HF_HUB_OFFLINE"), "{e}");
    // The token file beside the cache when HF_TOKEN is unset; HF_HUB_CACHE moves the cache.
    std::fs::write(home.join("token"), "hf_from_file\n").unwrap();
    unsafe {
        std::env::remove_var("HF_TOKEN");
        std::env::set_var("HF_HUB_CACHE", home.join("elsewhere"));
    }
    let opts = HubOptions::from_env().unwrap();
    assert_eq!(
        (opts.token.as_deref(), opts.cache_dir, opts.offline),
        (Some("hf_from_file"), home.join("elsewhere"), true)
    );
    unsafe {
        for v in ["HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE"] {
            std::env::remove_var(v);
        }
    }
    std::fs::remove_dir_all(&home).unwrap();
}
