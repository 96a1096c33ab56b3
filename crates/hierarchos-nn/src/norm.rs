//! RMSNorm as Llama, Mistral and Qwen use it (statistics in f32, weight applied after normalizing).

use hierarchos_core::{Result, Tensor};

/// `x / sqrt(mean(x²) + eps) * weight` over the last dimension, in one fused kernel.
#[derive(Clone, Debug)]
pub struct RmsNorm {
    /// `[dim]`.
    pub weight: Tensor,
    /// Added to the mean square before the square root.
    pub eps: f64,
}

impl RmsNorm {
    /// Normalizes the last dimension of `x`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.rms_norm(Some(&self.weight), self.eps)
    }

    /// `(x + residual, norm(x + residual))` in one kernel: a residual add and the norm after it, bit for bit
    /// what the two ops give.
    pub fn add_forward(&self, x: &Tensor, residual: &Tensor) -> Result<(Tensor, Tensor)> {
        x.add_rms_norm(residual, Some(&self.weight), self.eps)
    }

    /// The parameters with their Hugging Face names.
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        vec![("weight".to_string(), self.weight.clone())]
    }
}
