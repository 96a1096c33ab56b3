//! Hierarchos: train, fine-tune and run transformer language models on any GPU wgpu reaches (Vulkan, Metal,
//! DX12, WebGPU). This crate re-exports the three layers so a program needs one dependency.

#![warn(missing_docs)]

/// Tensors, ops and autograd.
pub use hierarchos_core as core;
/// Layers, models and optimizers.
pub use hierarchos_nn as nn;
/// The GPU runtime.
pub use hierarchos_wgpu as runtime;
