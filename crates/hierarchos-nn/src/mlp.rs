//! The gated MLP of Llama-style decoders: `down(act(gate(x)) * up(x))`.

use hierarchos_core::{Result, Tensor, UnaryOp, grad_enabled};

use crate::config::Activation;
use crate::linear::{Linear, LinearWeight, prefixed};

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
    /// gradients. `None` when they cannot be stacked (see [`Linear::stack`]).
    pub gate_up: Option<Linear>,
}

impl Mlp {
    /// `down(act(gate(x)) * up(x))`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let act = match self.act {
            Activation::Silu => UnaryOp::Silu,
            Activation::Gelu => UnaryOp::Gelu,
            Activation::GeluTanh => UnaryOp::GeluTanh,
        };
        let differentiable =
            grad_enabled() && (x.requires_grad() || self.gate_proj.requires_grad() || self.up_proj.requires_grad());
        let hidden = match &self.gate_up {
            Some(Linear {
                weight: LinearWeight::Quantized(q),
                bias: None,
            }) if !differentiable => x.matmul_q_gated(q, act)?,
            Some(gate_up) if !differentiable => {
                let y = gate_up.forward(x)?;
                let n = self.gate_proj.weight_shape()[0];
                y.narrow(-1, 0, n)?.gated(&y.narrow(-1, n, n)?, act)?
            }
            _ => self.gate_proj.forward(x)?.gated(&self.up_proj.forward(x)?, act)?,
        };
        self.down_proj.forward(&hidden)
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
