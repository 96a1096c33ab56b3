//! The affine layer `y = x Wᵀ + b`, stored as Hugging Face / PyTorch store it (`weight` is `[out, in]`).

use hierarchos_core::{Device, Result, Tensor};

use crate::init::ParamRng;

/// A fully connected layer.
#[derive(Clone, Debug)]
pub struct Linear {
    /// `[out_features, in_features]`.
    pub weight: Tensor,
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
        Ok(Linear { weight, bias })
    }

    /// `x Wᵀ + b` over the last dimension of `x`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = x.matmul(&self.weight.t()?)?;
        match &self.bias {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }

    /// The parameters with their Hugging Face names (`weight`, `bias`).
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = vec![("weight".to_string(), self.weight.clone())];
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
