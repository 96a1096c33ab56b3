//! Optimizers: they read each parameter's `.grad` and overwrite the parameter in place.

mod adamw;
#[cfg(not(target_arch = "wasm32"))]
mod clip;
mod sgd;

pub use adamw::{AdamW, AdamWConfig, Moments};
#[cfg(not(target_arch = "wasm32"))]
pub use clip::{clip_factor, grad_norm, grad_norm_squared};
pub use sgd::Sgd;
