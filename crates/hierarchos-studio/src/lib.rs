//! Hierarchos Studio: pick a model, fine-tune it with live loss curves, and chat with the result. The window is
//! egui (through eframe); training and generation run on a worker thread on the same GPU device. Built for
//! wasm32, the same crates make the web demo (`web`): WebGPU, files fetched or picked, async GPU work.

#![warn(missing_docs)]

#[cfg(not(target_arch = "wasm32"))]
pub mod app;
#[cfg(not(target_arch = "wasm32"))]
mod chat_panel;
mod device_panel;
pub mod embedded;
pub mod metrics;
#[cfg(not(target_arch = "wasm32"))]
mod model_panel;
#[cfg(not(target_arch = "wasm32"))]
pub mod no_adapter;
#[cfg(not(target_arch = "wasm32"))]
pub mod runs;
#[cfg(not(target_arch = "wasm32"))]
mod train_panel;
#[cfg(target_arch = "wasm32")]
pub mod web;
mod widgets;
#[cfg(not(target_arch = "wasm32"))]
pub mod worker;

#[cfg(not(target_arch = "wasm32"))]
pub use app::{Autorun, StudioApp, StudioOptions, Tab};

use eframe::egui_wgpu::{WgpuConfiguration, WgpuSetup, WgpuSetupExisting};
use hierarchos_core::Device;

/// eframe's wgpu setup on `device`'s own instance, adapter, device and queue, so that the window draws on the
/// device that computes.
pub fn shared_wgpu(device: &Device) -> WgpuConfiguration {
    let (instance, adapter, wgpu_device, queue) = device.wgpu_parts();
    WgpuConfiguration {
        wgpu_setup: WgpuSetup::Existing(WgpuSetupExisting {
            instance: instance.clone(),
            adapter: adapter.clone(),
            device: wgpu_device.clone(),
            queue: queue.clone(),
        }),
        ..Default::default()
    }
}
