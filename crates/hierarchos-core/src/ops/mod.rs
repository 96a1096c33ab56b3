//! Tensor operations. Each file holds one family: its WGSL kernel (or the body it gives the shared
//! elementwise kernel) next to its backward rule.

pub mod adamw;
pub mod attention;
pub mod binary;
pub mod cast;
pub mod concat;
pub mod cumsum;
pub mod flash_attention;
mod flash_attention_coop;
pub mod index;
pub mod loss;
pub mod loss_scale;
pub(crate) mod map;
pub mod mask;
pub(crate) mod math;
pub mod matmul;
mod matmul_coop;
pub mod norm;
pub mod random;
pub mod reduce;
pub mod rope;
pub(crate) mod rows;
pub mod softmax;
mod spirv;
pub mod sum_squares_many;
pub mod unary;
pub mod write;
