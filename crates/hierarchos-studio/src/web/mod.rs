//! The web demo: the Studio's crates built for wasm32, on the browser's WebGPU adapter. One page loads a model
//! (the embedded tiny model, a folder served next to the page, or files the user picks), generates from it and
//! fine-tunes it with a live loss curve. Nothing blocks: every GPU readback is awaited, so the page stays live.
//!
//! The page's query string can script a run (what the headless-browser test does): `model=<url of a model
//! folder>` (or `pick=1`: open the file picker at once, for the test to fill), `prompt=<text>` and `tokens=<n>`
//! for a greedy generation, `train_steps=<n>` for training after it. The outcome is written as JSON into the
//! page's `#hierarchos-result` element.

mod app;
mod files;
mod tasks;

use hierarchos_core::Gpu;
use wasm_bindgen::prelude::*;

pub use app::WebApp;

/// A run scripted by the page's query string.
#[derive(Clone, Debug, Default)]
pub struct Script {
    /// The model folder to fetch (relative to the page), instead of the embedded model.
    pub model: Option<String>,
    /// Open the model file picker at start instead (a test sets the files).
    pub pick: bool,
    /// A prompt to answer greedily.
    pub prompt: Option<String>,
    /// New tokens for it.
    pub tokens: usize,
    /// Training steps after the generation.
    pub train_steps: usize,
}

impl Script {
    /// The script in the page's query string (`None` without one).
    fn from_page() -> Option<Script> {
        let search = web_sys::window()?.location().search().ok()?;
        let query = web_sys::UrlSearchParams::new_with_str(&search).ok()?;
        let number = |key: &str| query.get(key).and_then(|v| v.parse().ok()).unwrap_or(0);
        let script = Script {
            model: query.get("model"),
            pick: query.get("pick").is_some_and(|v| v == "1"),
            prompt: query.get("prompt"),
            tokens: number("tokens"),
            train_steps: number("train_steps"),
        };
        let scripted = script.model.is_some() || script.pick || script.prompt.is_some() || script.train_steps > 0;
        scripted.then_some(script)
    }
}

/// Writes the outcome of a scripted run into `#hierarchos-result` (and the console).
fn publish(result: &serde_json::Value) {
    let text = result.to_string();
    web_sys::console::log_1(&format!("hierarchos-result {text}").into());
    if let Some(element) = web_sys::window()
        .and_then(|w| w.document())
        .and_then(|d| d.get_element_by_id("hierarchos-result"))
    {
        element.set_text_content(Some(&text));
    }
}

/// Starts the demo on the canvas with id `canvas_id`: opens the WebGPU device, then hands it to eframe's wgpu
/// painter so that drawing and compute share it. Without a WebGPU adapter the error is shown in the page.
#[wasm_bindgen]
pub async fn start(canvas_id: String) -> Result<(), JsValue> {
    let document = web_sys::window().and_then(|w| w.document()).ok_or("no document")?;
    let canvas = document
        .get_element_by_id(&canvas_id)
        .ok_or_else(|| format!("no element #{canvas_id}"))?
        .dyn_into::<web_sys::HtmlCanvasElement>()?;
    let device = match Gpu::init_default().await {
        Ok(device) => device,
        Err(e) => {
            let message = format!(
                "No WebGPU adapter: {e}. Use a browser with WebGPU (Chrome, Edge; Chromium needs \
                 --enable-unsafe-webgpu on Linux)."
            );
            if let Some(status) = document.get_element_by_id("status") {
                status.set_text_content(Some(&message));
            }
            publish(&serde_json::json!({ "error": message }));
            return Err(message.into());
        }
    };
    let options = eframe::WebOptions {
        wgpu_options: crate::shared_wgpu(&device),
        ..Default::default()
    };
    let script = Script::from_page();
    eframe::WebRunner::new()
        .start(
            canvas,
            options,
            Box::new(move |cc| Ok(Box::new(WebApp::new(&cc.egui_ctx, device, script)))),
        )
        .await
}
