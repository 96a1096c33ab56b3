//! Hub ids: fetched from a tiny Hub-like HTTP server on 127.0.0.1 (started and stopped inside each test) into a
//! temporary cache, at a revision, with a token, and then offline from the cache alone.

mod common;
use common::hub::{Commits, HubServer, Repo};
use common::tmpdir;

use std::collections::HashMap;
use std::path::Path;

use hierarchos::nn::hub::{HubOptions, resolve_model, resolve_model_reporting, resolve_model_with};
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
fn commits() -> Commits {
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

/// The test repository served with `token` required.
fn server(token: Option<&'static str>) -> HubServer {
    HubServer::start(Repo {
        id: REPO,
        dataset: false,
        revisions: &[("main", MAIN_SHA), ("v1", V1_SHA)],
        commits: commits(),
        token,
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
    let server = server(Some(TOKEN));
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
    let server = server(Some(TOKEN));
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

#[test]
fn downloads_report_their_progress() {
    let server = server(Some(TOKEN));
    let cache = tmpdir("hub-progress");
    let opts = options(&server.endpoint, &cache, false);
    let mut calls: Vec<(String, u64, u64)> = Vec::new();
    let dir = resolve_model_reporting(
        REPO,
        None,
        &opts,
        Some(&mut |file, done, size| calls.push((file.to_string(), done, size))),
    )
    .unwrap();
    let mut files: Vec<&str> = calls.iter().map(|(f, _, _)| f.as_str()).collect();
    files.dedup();
    assert!(
        files.contains(&"config.json") && files.contains(&"tokenizer.json"),
        "{files:?}"
    );
    for file in files {
        let of_file: Vec<_> = calls.iter().filter(|(f, _, _)| f == file).collect();
        let size = std::fs::metadata(dir.join(file)).unwrap().len();
        assert_eq!(of_file.first().unwrap().1, 0, "{file} starts at 0");
        assert_eq!(of_file.last().unwrap().1, size, "{file} ends at its size");
        assert!(of_file.iter().all(|c| c.2 == size), "{file}: size {size}: {of_file:?}");
    }
    // Cached now: nothing to report.
    let mut again = 0;
    resolve_model_reporting(REPO, None, &opts, Some(&mut |_, _, _| again += 1)).unwrap();
    assert_eq!(again, 0);
}
