//! Hierarchos tensors: eager, GPU-resident n-dimensional arrays with a tape autograd.
//!
//! Every op runs as a WGSL compute shader through [`hierarchos_wgpu`]; views (reshape, permute, narrow,
//! broadcast) share storage; every differentiable op records its backward rule when an input requires grad.
//!
//! ```no_run
//! use hierarchos_core::{DType, Tensor, default_device};
//! let dev = default_device()?;
//! let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], &dev)?.requires_grad_();
//! let loss = x.mul(&x)?.sum_all()?;
//! loss.backward()?;
//! assert_eq!(x.grad().unwrap().to_vec::<f32>()?, vec![2.0, 4.0, 6.0]);
//! # Ok::<(), hierarchos_core::Error>(())
//! ```

#![warn(missing_docs)]

mod autocast;
mod autograd;
mod error;
pub mod ops;
pub mod quant;
pub mod shape;
mod tensor;

pub use autocast::{autocast, autocast_dtype};
pub use autograd::{grad_enabled, no_grad};
pub use error::{Error, Result};
pub use hierarchos_wgpu::{DType, Gpu, GpuOptions};
pub use ops::binary::{BinaryOp, CmpOp};
pub use ops::reduce::ReduceOp;
pub use ops::unary::UnaryOp;
#[cfg(not(target_arch = "wasm32"))]
pub use tensor::default_device;
pub use tensor::{Device, Element, PendingVec, Tensor};
