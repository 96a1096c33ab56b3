//! Optimizers: they read each parameter's `.grad` and overwrite the parameter in place.

mod adamw;
mod clip;
mod sgd;

pub use adamw::{AdamW, AdamWConfig, Moments, trainer_leaves_undecayed};
#[cfg(not(target_arch = "wasm32"))]
pub use clip::grad_norm;
pub use clip::grad_norm_squared;
pub use sgd::Sgd;
