//! The feed-forward half of a decoder layer: a dense MLP, or a mixture of experts.

use hierarchos_core::Tensor;

use crate::error::Result;
use crate::linear::{Linear, prefixed};
use crate::mlp::Mlp;
use crate::moe::Moe;
use crate::norm::{Norm, normed_residual};

/// What a decoder layer runs after attention.
// One per layer: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum FeedForward {
    /// One MLP (gated or plain), with its module name in the layer (`mlp`; empty for OPT's, whose projections sit
    /// in the layer itself).
    Mlp(Mlp, &'static str),
    /// Routed experts (MoE families; their `dense_layers` keep an MLP).
    Moe(Moe),
}

impl FeedForward {
    /// `residual + block(norm(x))`, the norm and the residual optional (an MLP runs them inside its
    /// projections' launches where it can).
    pub fn forward(&self, x: &Tensor, norm: Option<&Norm>, residual: Option<&Tensor>) -> Result<Tensor> {
        match self {
            FeedForward::Mlp(mlp, _) => Ok(mlp.forward(x, norm, residual)?),
            FeedForward::Moe(moe) => normed_residual(x, norm, residual, |x| moe.forward(x)),
        }
    }

    /// The MLP, when the block is one.
    pub fn mlp(&self) -> Option<&Mlp> {
        match self {
            FeedForward::Mlp(mlp, _) => Some(mlp),
            FeedForward::Moe(_) => None,
        }
    }

    /// The block's module name in checkpoints (`mlp`, Mixtral's `block_sparse_moe`; empty for OPT's MLP, whose
    /// projections sit in the layer itself).
    pub fn name(&self) -> &'static str {
        match self {
            FeedForward::Mlp(_, module) => module,
            FeedForward::Moe(moe) => moe.name,
        }
    }

    /// Whether the block runs fused at decode ([`Mlp::fuses`]; experts never do).
    pub fn fuses(&self) -> bool {
        self.mlp().is_some_and(Mlp::fuses)
    }

    /// The linear layers with their module paths inside the layer (`mlp.gate_proj`,
    /// `block_sparse_moe.experts.0.w1`, ...), in module order.
    pub fn linears(&self) -> Vec<(String, &Linear)> {
        match self {
            FeedForward::Mlp(mlp, _) => prefixed(self.name(), mlp.linears()),
            FeedForward::Moe(moe) => prefixed(self.name(), moe.linears()),
        }
    }

    /// [`FeedForward::linears`], mutable.
    pub fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        let block = self.name();
        match self {
            FeedForward::Mlp(mlp, _) => prefixed(block, mlp.linears_mut()),
            FeedForward::Moe(moe) => prefixed(block, moe.linears_mut()),
        }
    }

    /// The parameters with their Hugging Face names relative to the layer (`mlp.gate_proj.weight`, ...).
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        let params = match self {
            FeedForward::Mlp(mlp, _) => mlp.parameters(),
            FeedForward::Moe(moe) => moe.parameters(),
        };
        prefixed(self.name(), params)
    }
}
