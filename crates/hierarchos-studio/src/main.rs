//! The desktop Studio: opens the compute device first and hands it to eframe's wgpu renderer, so that drawing and
//! training share one device. Without a device, a window says why.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use hierarchos_core::default_device;
use hierarchos_studio::no_adapter::NoAdapterApp;
use hierarchos_studio::{Autorun, StudioApp, StudioOptions};

/// Hierarchos Studio: fine-tune a model with live loss curves and chat with the result.
#[derive(Parser)]
#[command(name = "hierarchos-studio", version, about)]
struct Args {
    /// Model folder or Hub id to open (default: the embedded model).
    model: Option<String>,
    /// Train this many steps on the embedded corpus (or the preselected data) as soon as the model is loaded.
    #[arg(long)]
    train_steps: Option<usize>,
    /// With --train-steps: when training ends, save a PNG of the window here and quit.
    #[arg(long, requires = "train_steps")]
    screenshot: Option<PathBuf>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HIERARCHOS_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let device = match default_device() {
        Ok(device) => device,
        Err(e) if args.train_steps.is_some() => {
            // A scripted run must not wait for a person to close a window.
            return Err(e).context("opening a GPU adapter (install mesa-vulkan-drivers without a GPU)");
        }
        Err(e) => return no_adapter(e.to_string()),
    };
    let options = eframe::NativeOptions {
        viewport: eframe::egui::ViewportBuilder::default()
            .with_inner_size([1200.0, 860.0])
            .with_title("Hierarchos Studio"),
        renderer: eframe::Renderer::Wgpu,
        wgpu_options: hierarchos_studio::shared_wgpu(&device),
        ..Default::default()
    };
    let mut studio = StudioOptions::from_env();
    studio.model = args.model;
    studio.autorun = args.train_steps.map(|steps| Autorun {
        steps,
        screenshot: args.screenshot,
    });
    eframe::run_native(
        "Hierarchos Studio",
        options,
        Box::new(move |cc| Ok(Box::new(StudioApp::new(&cc.egui_ctx, device, studio)))),
    )
    .map_err(|e| anyhow::anyhow!("{e}"))
}

/// Without an adapter to compute on, a window that says so, drawn with whatever wgpu finds to draw with (OpenGL
/// included); only when nothing can draw does the reason go to stderr alone.
fn no_adapter(reason: String) -> Result<()> {
    eprintln!("hierarchos-studio: no GPU adapter to compute on: {reason}");
    let options = eframe::NativeOptions {
        viewport: eframe::egui::ViewportBuilder::default()
            .with_inner_size([640.0, 280.0])
            .with_title("Hierarchos Studio"),
        renderer: eframe::Renderer::Wgpu,
        ..Default::default()
    };
    let shown = reason.clone();
    eframe::run_native(
        "Hierarchos Studio",
        options,
        Box::new(move |_| Ok(Box::new(NoAdapterApp { reason: shown }))),
    )
    .map_err(|e| anyhow::anyhow!("no GPU adapter to compute on ({reason}), and none to draw a window with ({e})"))
}
