//! The MLP of the decoder families: gated as Llama's, `down(act(gate(x)) * up(x))`, or plain as StarCoder2's,
//! `down(act(up(x)))`.

use std::borrow::Cow;

use hierarchos_core::{Result, Tensor, UnaryOp};

use crate::config::Activation;
use crate::linear::{Linear, linear_parameters};
use crate::norm::Norm;

/// A feed-forward block.
#[derive(Clone, Debug)]
pub struct Mlp {
    /// `[intermediate, hidden]`: the gated branch; `None` in a plain MLP.
    pub gate_proj: Option<Linear>,
    /// `[intermediate, hidden]`: the linear branch (the only one of a plain MLP).
    pub up_proj: Linear,
    /// `[hidden, intermediate]`: back to the model width.
    pub down_proj: Linear,
    /// The activation of the gate.
    pub act: Activation,
    /// `gate_proj` and `up_proj` stacked (their weights are views of it): one matmul, in training too
    /// ([`Linear::stacked_for`]), while the projections hold views of it and neither has an active adapter
    /// ([`Linear::holds`]). `None` when they cannot be stacked (see [`Linear::stack`]) or there is no gate.
    pub gate_up: Option<Linear>,
    /// The checkpoint holds gate and up as one matrix under this name (Phi-3's `gate_up_proj`, gate rows
    /// first): `gate_up` is then that parameter, always computed as one product, and `gate_proj` and `up_proj` are
    /// views of it.
    pub fused_gate_up: Option<&'static str>,
    /// The Hugging Face module names of `gate_proj`, `up_proj` and `down_proj` (StarCoder2's `c_fc` and
    /// `c_proj`, Mixtral's experts' `w1`, `w3` and `w2`).
    pub names: [&'static str; 3],
}

impl Mlp {
    /// `residual + down(act(gate(norm(x))) * up(norm(x)))`, the norm and the residual optional (with quantized
    /// projections at decode they run inside the projections' launches, as does the activation).
    pub fn forward(&self, x: &Tensor, norm: Option<&Norm>, residual: Option<&Tensor>) -> Result<Tensor> {
        let act = match self.act {
            Activation::Silu => UnaryOp::Silu,
            Activation::Gelu => UnaryOp::Gelu,
            Activation::GeluTanh => UnaryOp::GeluTanh,
            Activation::Relu => UnaryOp::Relu,
            Activation::Relu2 => UnaryOp::Relu2,
        };
        let Some(gate_proj) = &self.gate_proj else {
            let normed = norm.map(|n| n.forward(x)).transpose()?;
            let hidden = self.up_proj.forward(normed.as_ref().unwrap_or(x))?.unary(act)?;
            return self.down_proj.forward_fused(&hidden, None, None, residual);
        };
        let stacked = match (&self.gate_up, self.fused_gate_up) {
            (Some(gate_up), Some(_)) => Some(Cow::Borrowed(gate_up)),
            (Some(gate_up), None) => gate_up.stacked_for(&[gate_proj, &self.up_proj])?,
            (None, _) => None,
        };
        let hidden = match stacked {
            Some(gate_up) => gate_up.forward_fused(x, norm, Some(act), None)?,
            None => {
                let normed = norm.map(|n| n.forward(x)).transpose()?;
                let x = normed.as_ref().unwrap_or(x);
                gate_proj.forward(x)?.gated(&self.up_proj.forward(x)?, act)?
            }
        };
        self.down_proj.forward_fused(&hidden, None, None, residual)
    }

    /// Whether every projection runs fused at decode (see [`Linear::fuses`]): a gated MLP only.
    pub fn fuses(&self) -> bool {
        let Some(gate_proj) = &self.gate_proj else { return false };
        let parts = [gate_proj, &self.up_proj];
        self.gate_up.as_ref().is_some_and(|s| s.fuses() && s.holds(&parts)) && self.down_proj.fuses()
    }

    /// The projections with their Hugging Face module names, in module order.
    pub fn linears(&self) -> Vec<(&'static str, &Linear)> {
        if let (Some(name), Some(gate_up)) = (self.fused_gate_up, &self.gate_up) {
            return vec![(name, gate_up), (self.names[2], &self.down_proj)];
        }
        let gate = self.gate_proj.as_ref().map(|g| (self.names[0], g));
        gate.into_iter()
            .chain([(self.names[1], &self.up_proj), (self.names[2], &self.down_proj)])
            .collect()
    }

    /// [`Mlp::linears`], mutable.
    pub fn linears_mut(&mut self) -> Vec<(&'static str, &mut Linear)> {
        if let (Some(name), Some(gate_up)) = (self.fused_gate_up, &mut self.gate_up) {
            return vec![(name, gate_up), (self.names[2], &mut self.down_proj)];
        }
        let gate = self.gate_proj.as_mut().map(|g| (self.names[0], g));
        gate.into_iter()
            .chain([(self.names[1], &mut self.up_proj), (self.names[2], &mut self.down_proj)])
            .collect()
    }

    /// Makes `gate_up` and the projections one again after weights were replaced (see
    /// [`crate::attention::Attention::restack`]).
    pub(crate) fn restack(&mut self) -> Result<()> {
        match (self.fused_gate_up, &self.gate_up) {
            (Some(_), Some(gate_up)) => {
                let n = self.up_proj.weight_shape()[0];
                let mut parts = gate_up.split_rows(&[n, n])?;
                self.up_proj = parts.pop().expect("two parts");
                self.gate_proj = parts.pop();
            }
            _ => {
                self.gate_up = match &mut self.gate_proj {
                    Some(gate_proj) => Linear::stack(&mut [gate_proj, &mut self.up_proj])?,
                    None => None,
                };
            }
        }
        Ok(())
    }

    /// The parameters with their Hugging Face names (`gate_proj.weight`, ...).
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        linear_parameters(self.linears())
    }
}
