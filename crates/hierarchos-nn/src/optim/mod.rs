//! Optimizers: they read each parameter's `.grad` and overwrite the parameter in place.

mod adamw;
mod sgd;

pub use adamw::{AdamW, AdamWConfig, Moments};
pub use sgd::Sgd;
