//! RMSNorm as Llama, Mistral and Qwen use it (statistics in f32, weight applied after normalizing), and as Gemma
//! does (scaled by `1 + weight`, so that a zero weight is the identity).

use std::borrow::Cow;

use hierarchos_core::{Result, Tensor};

/// `x / sqrt(mean(x²) + eps) * weight` over the last dimension, in one fused kernel (`* (1 + weight)` with
/// `unit_offset`).
#[derive(Clone, Debug)]
pub struct RmsNorm {
    /// `[dim]`.
    pub weight: Tensor,
    /// Added to the mean square before the square root.
    pub eps: f64,
    /// Gemma's form: the normalized values are scaled by `1 + weight` (formed in f32, as transformers does).
    pub unit_offset: bool,
}

impl RmsNorm {
    /// Normalizes the last dimension of `x`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.rms_norm(Some(&*self.scale()?), self.eps)
    }

    /// `(x + residual, norm(x + residual))` in one kernel: a residual add and the norm after it, bit for bit
    /// what the two ops give.
    pub fn add_forward(&self, x: &Tensor, residual: &Tensor) -> Result<(Tensor, Tensor)> {
        x.add_rms_norm(residual, Some(&*self.scale()?), self.eps)
    }

    /// What the normalized values are multiplied by: the weight, or `1 + weight` (a new tensor, through which
    /// gradients reach the weight).
    pub fn scale(&self) -> Result<Cow<'_, Tensor>> {
        Ok(if self.unit_offset {
            Cow::Owned(self.weight.add_scalar(1.0)?)
        } else {
            Cow::Borrowed(&self.weight)
        })
    }

    /// The parameters with their Hugging Face names.
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        vec![("weight".to_string(), self.weight.clone())]
    }
}
