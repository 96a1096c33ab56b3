//! The desktop Studio: opens the compute device first and hands it to eframe's wgpu renderer, so that drawing and
//! training share one device.

use std::sync::Arc;

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use hierarchos_core::default_device;
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
    let device = default_device().context("opening a GPU adapter (install mesa-vulkan-drivers without a GPU)")?;
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
    let device = Arc::clone(&device);
    eframe::run_native(
        "Hierarchos Studio",
        options,
        Box::new(move |cc| Ok(Box::new(StudioApp::new(&cc.egui_ctx, device, studio)))),
    )
    .map_err(|e| anyhow::anyhow!("{e}"))
}
