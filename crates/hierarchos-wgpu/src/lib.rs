//! The GPU runtime of Hierarchos.
//!
//! Every tensor op is a WGSL compute shader, except what WGSL cannot express yet (the tensor-core product: GLSL
//! compiled to SPIR-V at build time, passed through to Vulkan). This crate opens a device through wgpu (Vulkan first, also Metal,
//! DX12 and WebGPU), detects subgroups, f16, timestamps and cooperative matrices, pools buffers, caches compiled
//! pipelines and records many dispatches per queue submission. It knows nothing about tensors: shapes and
//! autograd live in `hierarchos-core`.

#![warn(missing_docs)]

mod dtype;
mod error;
mod glsl;
mod gpu;
mod hardware;
mod options;
#[cfg(not(target_arch = "wasm32"))]
mod pipeline_cache;
mod profiler;

pub use dtype::{Access, COMMON_WGSL, DType};
pub use error::{GpuError, Result};
#[cfg(not(target_arch = "wasm32"))]
pub use gpu::list_adapters;
pub use gpu::{AdapterSummary, Caps, Dispatch, Gpu, GpuBuffer, Language, MemoryStats, PendingRead};
pub use options::GpuOptions;
pub use profiler::KernelTime;
pub use wgpu;
