//! Hierarchos Studio: pick a model, fine-tune it with live loss curves, and chat with the result. The window is
//! egui (through eframe); training and generation run on a worker thread on the same GPU device.

#![warn(missing_docs)]

pub mod app;
mod chat_panel;
mod device_panel;
pub mod embedded;
mod model_panel;
pub mod runs;
mod train_panel;
pub mod worker;

pub use app::{Autorun, StudioApp, StudioOptions, Tab};
