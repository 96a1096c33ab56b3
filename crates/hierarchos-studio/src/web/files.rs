//! Bytes into the page: a model folder fetched over HTTP from next to the page, or files the user picks (the
//! browser has no file system to read a folder from).

use std::path::Path;

use anyhow::{Context, Result, bail};
use hierarchos_nn::ModelFiles;
use hierarchos_nn::model_files::COPIED_FILES;
use hierarchos_nn::weights::{INDEX_FILE, SINGLE_FILE};
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;

/// A model's files as the page got them.
pub struct ModelBytes {
    /// Where they came from (a URL or "picked files"), for messages.
    pub label: String,
    /// `config.json` and the tokenizer files.
    pub files: ModelFiles,
    /// `model.safetensors`, if there was one (without it the model starts from random weights).
    pub weights: Option<Vec<u8>>,
}

fn js_error(what: &str, e: wasm_bindgen::JsValue) -> anyhow::Error {
    anyhow::anyhow!("{what}: {}", e.as_string().unwrap_or_else(|| format!("{e:?}")))
}

/// The body of `url`, or `None` when the server answers 404.
async fn fetch(url: &str) -> Result<Option<Vec<u8>>> {
    let window = web_sys::window().context("no window")?;
    let response: web_sys::Response = JsFuture::from(window.fetch_with_str(url))
        .await
        .map_err(|e| js_error(url, e))?
        .dyn_into()
        .map_err(|e| js_error(url, e))?;
    if response.status() == 404 {
        return Ok(None);
    }
    if !response.ok() {
        bail!("{url}: HTTP {} {}", response.status(), response.status_text());
    }
    let body = JsFuture::from(response.array_buffer().map_err(|e| js_error(url, e))?)
        .await
        .map_err(|e| js_error(url, e))?;
    Ok(Some(js_sys::Uint8Array::new(&body).to_vec()))
}

/// The model folder at `url` (relative to the page): `config.json`, the tokenizer files it has, and
/// `model.safetensors` if present.
pub async fn fetch_model(url: &str) -> Result<ModelBytes> {
    let base = url.trim_end_matches('/');
    let mut named = Vec::new();
    for name in std::iter::once("config.json").chain(COPIED_FILES) {
        if let Some(bytes) = fetch(&format!("{base}/{name}")).await? {
            named.push((name.to_string(), bytes));
        }
    }
    let files = ModelFiles::from_named(Path::new(base), named)?;
    let weights = fetch(&format!("{base}/{SINGLE_FILE}")).await?;
    if weights.is_none() && fetch(&format!("{base}/{INDEX_FILE}")).await?.is_some() {
        bail!("{base}: sharded weights ({INDEX_FILE}) are too large for the web demo; use a single {SINGLE_FILE}");
    }
    Ok(ModelBytes {
        label: base.to_string(),
        files,
        weights,
    })
}

/// Model files the user picks: `config.json` (required), the tokenizer files and `model.safetensors`. `None`
/// when the dialog was cancelled.
pub async fn pick_model() -> Result<Option<ModelBytes>> {
    let Some(handles) = rfd::AsyncFileDialog::new()
        .set_title("Pick config.json, tokenizer.json (and tokenizer_config.json) and model.safetensors")
        .pick_files()
        .await
    else {
        return Ok(None);
    };
    let mut named = Vec::new();
    let mut weights = None;
    for handle in handles {
        let (name, bytes) = (handle.file_name(), handle.read().await);
        if name == SINGLE_FILE {
            weights = Some(bytes);
        } else {
            named.push((name, bytes));
        }
    }
    let label = "picked files";
    Ok(Some(ModelBytes {
        label: label.into(),
        files: ModelFiles::from_named(Path::new(label), named)?,
        weights,
    }))
}

/// A `.txt` or `.jsonl` training file the user picks, by name; `None` when the dialog was cancelled.
pub async fn pick_data() -> Option<(String, Vec<u8>)> {
    let handle = rfd::AsyncFileDialog::new()
        .set_title("Pick training data")
        .add_filter("text or JSON lines", &["txt", "jsonl"])
        .pick_file()
        .await?;
    Some((handle.file_name(), handle.read().await))
}
