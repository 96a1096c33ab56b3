//! The normalization layers of the decoder families: RMSNorm as Llama, Mistral and Qwen use it (statistics in f32,
//! weight applied after normalizing), as Gemma does (scaled by `1 + weight`, so that a zero weight is the
//! identity), and LayerNorm with or without its weight and bias (OLMo's has neither).

use std::borrow::Cow;

use hierarchos_core::{Result, Tensor};

/// Which statistic a [`Norm`] divides by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormKind {
    /// `x / sqrt(mean(x²) + eps)`.
    Rms,
    /// `(x - mean) / sqrt(var + eps)`, the biased variance (`torch.nn.LayerNorm`).
    Layer,
}

/// A normalization over the last dimension, then `* weight + bias` where they exist, in one fused kernel.
#[derive(Clone, Debug)]
pub struct Norm {
    /// RMSNorm or LayerNorm.
    pub kind: NormKind,
    /// `[dim]`; `None` for a norm without parameters.
    pub weight: Option<Tensor>,
    /// `[dim]` (LayerNorm only).
    pub bias: Option<Tensor>,
    /// Added to the mean square (or variance) before the square root.
    pub eps: f64,
    /// Gemma's form: the normalized values are scaled by `1 + weight` (formed in f32, as transformers does).
    pub unit_offset: bool,
    /// One weight `[head_dim]` per head, each its own parameter (StableLM's per-head q/k LayerNorms,
    /// `norms.N.weight`), in place of `weight`; stacked `[heads, head_dim]` for each use.
    pub head_weights: Vec<Tensor>,
}

/// `residual + block(norm(x))`, the norm and the residual optional, as separate ops: how a block runs them when it
/// cannot fuse them into its own launches (latent attention, mixtures of experts).
pub(crate) fn normed_residual(
    x: &Tensor,
    norm: Option<&Norm>,
    residual: Option<&Tensor>,
    block: impl FnOnce(&Tensor) -> crate::error::Result<Tensor>,
) -> crate::error::Result<Tensor> {
    let normed = norm.map(|n| n.forward(x)).transpose()?;
    let y = block(normed.as_ref().unwrap_or(x))?;
    Ok(match residual {
        Some(r) => r.add(&y)?,
        None => y,
    })
}

impl Norm {
    /// Normalizes the last dimension of `x`. A weight of more than one dimension (Cohere's q/k norms: one row per
    /// head) multiplies the normalized values of its trailing dimensions.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let scale = self.scale()?;
        let (fused, after) = match scale {
            Some(s) if s.rank() > 1 => (None, Some(s)),
            s => (s, None),
        };
        let y = match self.kind {
            NormKind::Rms => x.rms_norm(fused.as_deref(), self.eps)?,
            NormKind::Layer => x.layer_norm(fused.as_deref(), self.bias.as_ref(), self.eps)?,
        };
        match after {
            Some(s) => y.mul(&s),
            None => Ok(y),
        }
    }

    /// `(x + residual, norm(x + residual))` in one kernel: a residual add and the norm after it, bit for bit
    /// what the two ops give.
    pub fn add_forward(&self, x: &Tensor, residual: &Tensor) -> Result<(Tensor, Tensor)> {
        let scale = self.scale()?;
        match self.kind {
            NormKind::Rms => x.add_rms_norm(residual, scale.as_deref(), self.eps),
            NormKind::Layer => x.add_layer_norm(residual, scale.as_deref(), self.bias.as_ref(), self.eps),
        }
    }

    /// What the normalized values are multiplied by: the weight (the per-head weights stacked), `1 + weight` (a new
    /// tensor, through which gradients reach the weight), or nothing.
    pub fn scale(&self) -> Result<Option<Cow<'_, Tensor>>> {
        let weight = match self.head_weights.is_empty() {
            true => self.weight.as_ref().map(Cow::Borrowed),
            false => Some(Cow::Owned(Tensor::stack(&self.head_weights, 0)?)),
        };
        Ok(match weight {
            Some(w) if self.unit_offset => Some(Cow::Owned(w.add_scalar(1.0)?)),
            w => w,
        })
    }

    /// The width of the weight, if the norm has one.
    pub fn width(&self) -> Option<usize> {
        self.weight.as_ref().map(Tensor::numel)
    }

    /// The parameters with their Hugging Face names (`weight`, `bias`, or the per-head `norms.N.weight`).
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        let heads = self
            .head_weights
            .iter()
            .enumerate()
            .map(|(i, w)| (format!("norms.{i}.weight"), w.clone()));
        [("weight", &self.weight), ("bias", &self.bias)]
            .into_iter()
            .filter_map(|(name, t)| t.as_ref().map(|t| (name.to_string(), t.clone())))
            .chain(heads)
            .collect()
    }

    /// Stops gradients into the parameters (a frozen base under an adapter).
    pub fn detach(&mut self) {
        for t in [&mut self.weight, &mut self.bias].into_iter().flatten() {
            *t = t.detach();
        }
        for t in &mut self.head_weights {
            *t = t.detach();
        }
    }
}
