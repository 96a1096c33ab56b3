//! Tensor operations. Each file holds one family: its WGSL kernel (or the body it gives the shared
//! elementwise kernel) next to its backward rule.

pub mod binary;
pub mod cast;
pub mod concat;
pub(crate) mod map;
pub(crate) mod math;
pub mod reduce;
pub mod unary;
