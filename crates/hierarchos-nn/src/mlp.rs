//! The gated MLP of Llama-style decoders: `down(act(gate(x)) * up(x))`.

use hierarchos_core::{Result, Tensor, UnaryOp, grad_enabled};

use crate::config::Activation;
use crate::linear::{Linear, prefixed};
use crate::norm::Norm;

/// A gated feed-forward block.
#[derive(Clone, Debug)]
pub struct Mlp {
    /// `[intermediate, hidden]`: the gated branch.
    pub gate_proj: Linear,
    /// `[intermediate, hidden]`: the linear branch.
    pub up_proj: Linear,
    /// `[hidden, intermediate]`: back to the model width.
    pub down_proj: Linear,
    /// The activation of the gate.
    pub act: Activation,
    /// `gate_proj` and `up_proj` stacked (their weights are views of it): one matmul when nothing needs
    /// gradients and the projections still hold views of it ([`Linear::holds`]). `None` when they cannot be
    /// stacked (see [`Linear::stack`]).
    pub gate_up: Option<Linear>,
}

impl Mlp {
    /// `residual + down(act(gate(norm(x))) * up(norm(x)))`, the norm and the residual optional (with quantized
    /// projections at decode they run inside the projections' launches, as does the activation).
    pub fn forward(&self, x: &Tensor, norm: Option<&Norm>, residual: Option<&Tensor>) -> Result<Tensor> {
        let act = match self.act {
            Activation::Silu => UnaryOp::Silu,
            Activation::Gelu => UnaryOp::Gelu,
            Activation::GeluTanh => UnaryOp::GeluTanh,
        };
        let differentiable =
            grad_enabled() && (x.requires_grad() || self.gate_proj.requires_grad() || self.up_proj.requires_grad());
        let hidden = match &self.gate_up {
            Some(gate_up) if !differentiable && gate_up.holds(&[&self.gate_proj, &self.up_proj]) => {
                gate_up.forward_fused(x, norm, Some(act), None)?
            }
            _ => {
                let normed = norm.map(|n| n.forward(x)).transpose()?;
                let x = normed.as_ref().unwrap_or(x);
                self.gate_proj.forward(x)?.gated(&self.up_proj.forward(x)?, act)?
            }
        };
        self.down_proj.forward_fused(&hidden, None, None, residual)
    }

    /// Whether every projection runs fused at decode (see [`Linear::fuses`]).
    pub fn fuses(&self) -> bool {
        let parts = [&self.gate_proj, &self.up_proj];
        self.gate_up.as_ref().is_some_and(|s| s.fuses() && s.holds(&parts)) && self.down_proj.fuses()
    }

    /// The parameters with their Hugging Face names (`gate_proj.weight`, ...).
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        [
            prefixed("gate_proj", self.gate_proj.parameters()),
            prefixed("up_proj", self.up_proj.parameters()),
            prefixed("down_proj", self.down_proj.parameters()),
        ]
        .concat()
    }
}
