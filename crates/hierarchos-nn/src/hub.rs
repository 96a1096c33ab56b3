//! Model arguments that are Hugging Face Hub ids: the files a causal LM needs are fetched with `hf-hub` into the
//! standard cache (`models--owner--name/snapshots/<commit>/`, shared with Python's `huggingface_hub`), and the
//! snapshot folder is used like any local model folder.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use hf_hub::api::sync::{Api, ApiBuilder, ApiError};
use hf_hub::{Cache, Repo, RepoType};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::weights::{INDEX_FILE, SINGLE_FILE};

/// The model configuration, required.
const CONFIG_FILE: &str = "config.json";
/// Tokenizer and generation files, fetched when the repository has them.
const OPTIONAL_FILES: [&str; 5] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",
];

/// Where and how to reach the Hub; `from_env` reads the variables `huggingface_hub` reads.
#[derive(Clone, Debug)]
pub struct HubOptions {
    /// Base URL (`HF_ENDPOINT`, default `https://huggingface.co`).
    pub endpoint: String,
    /// The hub cache folder (`HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`).
    pub cache_dir: PathBuf,
    /// Bearer token for private and gated repositories (`HF_TOKEN`, else the token file beside the cache).
    pub token: Option<String>,
    /// Use only what is cached (`HF_HUB_OFFLINE=1`).
    pub offline: bool,
    /// Draw download progress bars (on when stderr is a terminal).
    pub progress: bool,
}

impl HubOptions {
    /// The options the environment asks for.
    pub fn from_env() -> Result<HubOptions> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let hf_home = match var("HF_HOME") {
            Some(home) => PathBuf::from(home),
            None => {
                let cache = match var("XDG_CACHE_HOME") {
                    Some(xdg) => PathBuf::from(xdg),
                    None => PathBuf::from(var("HOME").ok_or_else(|| {
                        Error::Hub("cannot locate the cache: set HF_HOME or HF_HUB_CACHE (HOME is not set)".into())
                    })?)
                    .join(".cache"),
                };
                cache.join("huggingface")
            }
        };
        let cache_dir = var("HF_HUB_CACHE").map_or_else(|| hf_home.join("hub"), PathBuf::from);
        let token = var("HF_TOKEN")
            .or_else(|| var("HUGGING_FACE_HUB_TOKEN"))
            .or_else(|| Cache::new(hf_home.join("hub")).token());
        let offline = var("HF_HUB_OFFLINE")
            .is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"));
        Ok(HubOptions {
            endpoint: var("HF_ENDPOINT").unwrap_or_else(|| "https://huggingface.co".into()),
            cache_dir,
            token,
            offline,
            progress: std::io::stderr().is_terminal(),
        })
    }
}

/// The model folder for `arg`: a local folder as is, otherwise a Hub id fetched at `revision` (default `main`)
/// with the options of the environment.
pub fn resolve_model(arg: &str, revision: Option<&str>) -> Result<PathBuf> {
    let path = Path::new(arg);
    if path.is_dir() {
        return Ok(path.to_path_buf());
    }
    resolve_model_with(arg, revision, &HubOptions::from_env()?)
}

/// [`resolve_model`] with explicit options instead of the environment's.
pub fn resolve_model_with(arg: &str, revision: Option<&str>, options: &HubOptions) -> Result<PathBuf> {
    resolve_model_reporting(arg, revision, options, None)
}

/// A file's download progress: its name, bytes so far, its size in bytes.
pub type Report<'a> = &'a mut dyn FnMut(&str, u64, u64);

/// [`resolve_model_with`], telling `report` how each download progresses (an app's progress bar) instead of
/// drawing terminal bars.
pub fn resolve_model_reporting(
    arg: &str,
    revision: Option<&str>,
    options: &HubOptions,
    report: Option<Report>,
) -> Result<PathBuf> {
    let path = Path::new(arg);
    if path.is_dir() {
        return Ok(path.to_path_buf());
    }
    if path.exists() {
        return Err(Error::Invalid(format!("{arg}: a file, not a model folder or Hub id")));
    }
    if !is_repo_id(arg) {
        return Err(Error::Invalid(format!(
            "{arg}: no such folder, and not a Hub id (owner/name)"
        )));
    }
    let revision = revision.unwrap_or("main");
    check_revision(revision)?;
    if options.offline {
        cached_snapshot(arg, revision, options)
    } else {
        download(arg, revision, options, report)
    }
}

/// Passes hf-hub's progress calls on to a [`Report`].
struct Reporter<'a, 'b> {
    report: &'a mut dyn FnMut(&str, u64, u64),
    file: &'b str,
    done: u64,
    size: u64,
}

impl hf_hub::api::Progress for Reporter<'_, '_> {
    fn init(&mut self, size: usize, _filename: &str) {
        self.size = size as u64;
        (self.report)(self.file, 0, self.size);
    }

    fn update(&mut self, size: usize) {
        self.done += size as u64;
        (self.report)(self.file, self.done, self.size);
    }

    fn finish(&mut self) {
        (self.report)(self.file, self.size, self.size);
    }
}

/// A revision that names a branch, tag or commit and cannot step outside the cache folder.
pub(crate) fn check_revision(revision: &str) -> Result<()> {
    if revision.is_empty() || revision.starts_with('/') || revision.split('/').any(|p| p == ".." || p == ".") {
        return Err(Error::Invalid(format!(
            "revision '{revision}' is not a branch, tag or commit"
        )));
    }
    Ok(())
}

/// `name` or `owner/name` with the characters the Hub allows; anything else is taken for a mistyped path.
pub(crate) fn is_repo_id(arg: &str) -> bool {
    let parts: Vec<&str> = arg.split('/').collect();
    parts.len() <= 2
        && parts.iter().all(|p| {
            !p.is_empty()
                && !p.starts_with(['.', '-'])
                && !p.ends_with(['.', '-'])
                && !p.contains("..")
                && !p.contains("--")
                && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        })
}

fn repo_dir(repo_id: &str, options: &HubOptions) -> PathBuf {
    options.cache_dir.join(Repo::model(repo_id.to_string()).folder_name())
}

/// The cached snapshot of `repo_id` at `revision` (a branch or tag through `refs/`, or a commit hash), checked to
/// hold the config and every weights file.
fn cached_snapshot(repo_id: &str, revision: &str, options: &HubOptions) -> Result<PathBuf> {
    let dir = repo_dir(repo_id, options);
    let not_cached = |what: String| {
        Error::Hub(format!(
            "HF_HUB_OFFLINE is set and {repo_id} (revision {revision}) is not in the cache {}: {what}; run once \
             online or unset HF_HUB_OFFLINE",
            options.cache_dir.display()
        ))
    };
    let Some(snapshot) = cached_snapshot_dir(&dir, revision) else {
        return Err(not_cached("no snapshot".into()));
    };
    for file in required_files(&snapshot, |f| snapshot.join(f).is_file())? {
        if !snapshot.join(&file).is_file() {
            return Err(not_cached(format!("{file} is missing")));
        }
    }
    Ok(snapshot)
}

/// The snapshot folder of `revision` (a branch or tag through `refs/`, or a commit hash) in the cache folder of
/// one repository, when it is there.
pub(crate) fn cached_snapshot_dir(repo_dir: &Path, revision: &str) -> Option<PathBuf> {
    let commit = match std::fs::read_to_string(repo_dir.join("refs").join(revision)) {
        Ok(commit) => commit.trim().to_string(),
        Err(_) => revision.to_string(),
    };
    Some(repo_dir.join("snapshots").join(commit)).filter(|s| s.is_dir())
}

/// The files a model needs: the config and the weights (the index and its shards when sharded). `has` tells
/// whether the repository holds a file; the index is read from `snapshot` once present there.
fn required_files(snapshot: &Path, has: impl Fn(&str) -> bool) -> Result<Vec<String>> {
    let mut files = vec![CONFIG_FILE.to_string()];
    if has(INDEX_FILE) {
        files.push(INDEX_FILE.to_string());
        let index_path = snapshot.join(INDEX_FILE);
        if index_path.is_file() {
            files.extend(shard_names(&index_path)?);
        }
    } else {
        files.push(SINGLE_FILE.to_string());
    }
    Ok(files)
}

/// The shard files an index names, each once, in order of first mention.
fn shard_names(index_path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(index_path).map_err(|source| Error::Io {
        path: index_path.to_path_buf(),
        source,
    })?;
    let value: Value = serde_json::from_str(&text).map_err(|e| Error::Weights {
        path: index_path.to_path_buf(),
        message: format!("not valid JSON: {e}"),
    })?;
    let Some(map) = value.get("weight_map").and_then(Value::as_object) else {
        return Err(Error::Weights {
            path: index_path.to_path_buf(),
            message: "no `weight_map` object".into(),
        });
    };
    let mut shards: Vec<String> = Vec::new();
    for file in map.values().filter_map(Value::as_str) {
        if !shards.iter().any(|s| s == file) {
            shards.push(file.to_string());
        }
    }
    Ok(shards)
}

/// An `hf-hub` client for the endpoint, cache, token and progress bars of `options`.
pub(crate) fn api(options: &HubOptions) -> std::result::Result<Api, ApiError> {
    ApiBuilder::from_cache(Cache::new(options.cache_dir.clone()))
        .with_endpoint(options.endpoint.trim_end_matches('/').to_string())
        .with_token(options.token.clone())
        .with_progress(options.progress)
        .build()
}

/// Fetches what is missing from the cache. The revision is resolved to its commit once, and every file is
/// fetched at that commit, so a branch that moves meanwhile cannot mix files of two commits.
fn download(repo_id: &str, revision: &str, options: &HubOptions, mut report: Option<Report>) -> Result<PathBuf> {
    let hub = |what: String| Error::Hub(format!("{repo_id} (revision {revision}): {what}"));
    let api = api(options).map_err(|e| hub(format!("cannot start the HTTP client: {e}")))?;
    let info = api
        .repo(Repo::with_revision(
            repo_id.to_string(),
            RepoType::Model,
            revision.to_string(),
        ))
        .info()
        .map_err(|e| {
            hub(format!(
                "cannot read the repository from {}: {e} (check the id and revision; private or gated \
                 repositories need HF_TOKEN)",
                options.endpoint
            ))
        })?;
    let commit = info.sha;
    let listed: Vec<&str> = info.siblings.iter().map(|s| s.rfilename.as_str()).collect();
    let has = |f: &str| listed.contains(&f);
    if !has(CONFIG_FILE) {
        return Err(hub(format!("the repository has no {CONFIG_FILE}")));
    }
    if !has(INDEX_FILE) && !has(SINGLE_FILE) {
        return Err(hub(format!(
            "the repository has neither {SINGLE_FILE} nor {INDEX_FILE} (only safetensors weights are supported)"
        )));
    }
    let pinned = api.repo(Repo::with_revision(
        repo_id.to_string(),
        RepoType::Model,
        commit.clone(),
    ));
    let snapshot = repo_dir(repo_id, options).join("snapshots").join(&commit);
    let mut fetch = |file: &str| -> Result<()> {
        if snapshot.join(file).is_file() {
            return Ok(());
        }
        let got = match report.as_deref_mut() {
            Some(report) => pinned.download_with_progress(
                file,
                Reporter {
                    report,
                    file,
                    done: 0,
                    size: 0,
                },
            ),
            None => pinned.download(file),
        }
        .map_err(|e| hub(format!("downloading {file}: {e}")))?;
        if got != snapshot.join(file) {
            return Err(hub(format!(
                "{file} arrived as {} instead of at commit {commit}",
                got.display()
            )));
        }
        Ok(())
    };
    fetch(CONFIG_FILE)?;
    if has(INDEX_FILE) {
        fetch(INDEX_FILE)?;
    }
    for file in required_files(&snapshot, has)? {
        if !has(&file) {
            return Err(hub(format!(
                "{INDEX_FILE} names {file}, which the repository does not have"
            )));
        }
        fetch(&file)?;
    }
    for file in OPTIONAL_FILES.into_iter().filter(|f| has(f)) {
        fetch(file)?;
    }
    Cache::new(options.cache_dir.clone())
        .repo(Repo::with_revision(
            repo_id.to_string(),
            RepoType::Model,
            revision.to_string(),
        ))
        .create_ref(&commit)
        .map_err(|e| hub(format!("writing the cache ref for {revision}: {e}")))?;
    Ok(snapshot)
}
