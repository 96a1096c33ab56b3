//! The affine layer `y = x Wᵀ + b`, stored as Hugging Face / PyTorch store it (`weight` is `[out, in]`).

use hierarchos_core::quant::QTensor;
use hierarchos_core::{Device, Result, Tensor};

use crate::init::ParamRng;

/// The weight matrix of a layer: dense (trainable), or ggml blocks kept quantized on the GPU (frozen, read by
/// the dequantizing matmul).
#[derive(Clone, Debug)]
pub enum LinearWeight {
    /// `[out_features, in_features]`.
    Dense(Tensor),
    /// `[out_features, in_features]` in a ggml block format.
    Quantized(QTensor),
}

/// A fully connected layer.
#[derive(Clone, Debug)]
pub struct Linear {
    /// The `[out_features, in_features]` matrix.
    pub weight: LinearWeight,
    /// `[out_features]`, if the layer has a bias.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// A trainable layer initialized as `torch.nn.Linear` does: weight and bias uniform in ±1/√in.
    pub fn new(
        in_features: usize,
        out_features: usize,
        bias: bool,
        rng: &mut ParamRng,
        device: &Device,
    ) -> Result<Self> {
        let bound = 1.0 / (in_features.max(1) as f64).sqrt();
        let weight = rng
            .uniform(&[out_features, in_features], -bound, bound, device)?
            .requires_grad_();
        let bias = if bias {
            Some(rng.uniform(&[out_features], -bound, bound, device)?.requires_grad_())
        } else {
            None
        };
        Ok(Linear {
            weight: LinearWeight::Dense(weight),
            bias,
        })
    }

    /// `x Wᵀ + b` over the last dimension of `x`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = match &self.weight {
            LinearWeight::Dense(w) => x.matmul(&w.t()?)?,
            LinearWeight::Quantized(q) => x.matmul_q(q)?,
        };
        match &self.bias {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }

    /// The parameters with their Hugging Face names (`weight`, `bias`); a quantized weight is frozen and not
    /// listed.
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = Vec::new();
        if let LinearWeight::Dense(w) = &self.weight {
            p.push(("weight".to_string(), w.clone()));
        }
        if let Some(b) = &self.bias {
            p.push(("bias".to_string(), b.clone()));
        }
        p
    }
}

/// `params` with their names put under `prefix` (`weight` in `q_proj` becomes `q_proj.weight`), so that a module's
/// parameter list is its children's, named the way Hugging Face names them.
pub(crate) fn prefixed(prefix: &str, params: Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
    params.into_iter().map(|(n, t)| (format!("{prefix}.{n}"), t)).collect()
}
