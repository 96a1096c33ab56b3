//! Optimizers: they read each parameter's `.grad` and overwrite the parameter in place.

mod sgd;

pub use sgd::Sgd;
