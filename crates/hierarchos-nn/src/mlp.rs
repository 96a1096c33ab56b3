//! The gated MLP of Llama-style decoders: `down(act(gate(x)) * up(x))`.

use hierarchos_core::{Result, Tensor, UnaryOp};

use crate::config::Activation;
use crate::linear::{Linear, prefixed};

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
}

impl Mlp {
    /// `down(act(gate(x)) * up(x))`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let act = match self.act {
            Activation::Silu => UnaryOp::Silu,
            Activation::Gelu => UnaryOp::Gelu,
            Activation::GeluTanh => UnaryOp::GeluTanh,
        };
        let hidden = self.gate_proj.forward(x)?.gated(&self.up_proj.forward(x)?, act)?;
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
