//! The affine layer `y = x Wᵀ + b`, stored as Hugging Face / PyTorch store it (`weight` is `[out, in]`).

use std::borrow::Cow;

use hierarchos_core::quant::{Fusion, QTensor};
use hierarchos_core::{DType, Device, Result, Tensor, UnaryOp, grad_enabled, no_grad};

use crate::init::ParamRng;
use crate::lora::Lora;
use crate::norm::{Norm, NormKind};

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
    /// A LoRA adapter whose low-rank update is added to the output (unless merged into `weight`).
    pub lora: Option<Lora>,
    /// The dense weight is stored `[in_features, out_features]`, as GPT-2's `Conv1D` checkpoints hold it (the
    /// parameter keeps the checkpoint's layout, so that it trains and saves as transformers has it).
    pub transposed: bool,
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
            lora: None,
            transposed: false,
        })
    }

    /// `x Wᵀ + b` over the last dimension of `x`, plus the adapter's update when it has an unmerged one.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = match &self.weight {
            LinearWeight::Dense(w) if self.transposed => x.matmul(w)?,
            LinearWeight::Dense(w) => x.matmul(&w.t()?)?,
            LinearWeight::Quantized(q) => x.matmul_q(q)?,
        };
        let y = match &self.bias {
            Some(b) => y.add(b)?,
            None => y,
        };
        match self.lora.as_ref().filter(|l| l.active()) {
            Some(lora) => y.add(&lora.forward(x)?),
            None => Ok(y),
        }
    }

    /// `residual + gate(norm(x) Wᵀ + b)`, each part optional (`gate` splits the output in halves: `op(first) *
    /// second`, for a stacked gate/up layer). Quantized weights without bias run it as one launch at decode
    /// ([`Tensor::matmul_q_fused`]); anything else runs the separate ops.
    pub fn forward_fused(
        &self,
        x: &Tensor,
        norm: Option<&Norm>,
        gate: Option<UnaryOp>,
        residual: Option<&Tensor>,
    ) -> Result<Tensor> {
        // The fused launch takes an RMSNorm with a weight; any other norm runs as its own op.
        let fusable = norm.is_none_or(|n| n.kind == NormKind::Rms && n.weight.is_some());
        if let (LinearWeight::Quantized(q), None, true, true) = (&self.weight, &self.bias, self.fuses(), fusable) {
            let scale = norm.map(Norm::scale).transpose()?.flatten();
            let fusion = Fusion {
                norm: norm.zip(scale.as_deref()).map(|(n, s)| (s, n.eps)),
                gate,
                residual,
            };
            return x.matmul_q_fused(q, fusion);
        }
        let y = match norm {
            Some(norm) => self.forward(&norm.forward(x)?)?,
            None => self.forward(x)?,
        };
        let y = match gate {
            Some(op) => {
                let n = self.weight_shape()[0] / 2;
                y.narrow(-1, 0, n)?.gated(&y.narrow(-1, n, n)?, op)?
            }
            None => y,
        };
        match residual {
            Some(r) => r.add(&y),
            None => Ok(y),
        }
    }

    /// Whether [`Linear::forward_fused`] runs as one launch at decode: quantized weights, no bias, no unmerged
    /// adapter.
    pub fn fuses(&self) -> bool {
        matches!((&self.weight, &self.bias), (LinearWeight::Quantized(_), None)) && !self.has_active_lora()
    }

    /// Whether an adapter's update is added to the output (one is attached, on, and not merged into the weight).
    pub fn has_active_lora(&self) -> bool {
        self.lora.as_ref().is_some_and(|l| l.active())
    }

    /// Puts the weights (and biases) of `layers`, which read the same input, back to back in one buffer and
    /// returns the layer computing all their outputs side by side, so that inference runs them as one matmul
    /// (Q/K/V, gate/up): a decode step is bound by launches. Each layer's weight becomes a view of the stacked
    /// one (no second copy is kept; a trainable weight stays a trainable leaf). `None` when they cannot share
    /// one matmul: dense and quantized mixed, different dtypes, block formats or input sizes, biases on some only.
    pub fn stack(layers: &mut [&mut Linear]) -> Result<Option<Linear>> {
        let Some(first) = layers.first() else {
            return Ok(None);
        };
        let [_, cols] = first.weight_shape();
        let rows: Vec<usize> = layers.iter().map(|l| l.weight_shape()[0]).collect();
        // 16-bit values are stored two per word: a part starting inside a word could not be updated in place.
        let fits = |dtype: DType, sizes: &[usize]| {
            !matches!(dtype, DType::F16 | DType::BF16) || sizes.iter().all(|n| n % 2 == 0)
        };
        let sizes: Vec<usize> = rows.iter().map(|r| r * cols).collect();
        if layers.iter().any(|l| l.transposed) {
            return Ok(None);
        }
        let with_bias = first.bias.is_some();
        let same_weights = match &first.weight {
            LinearWeight::Dense(w) => {
                layers
                    .iter()
                    .all(|l| matches!(&l.weight, LinearWeight::Dense(v) if v.dtype() == w.dtype()))
                    && fits(w.dtype(), &sizes)
            }
            LinearWeight::Quantized(q) => layers
                .iter()
                .all(|l| matches!(&l.weight, LinearWeight::Quantized(v) if v.ggml_type() == q.ggml_type())),
        };
        let same_biases = match &first.bias {
            Some(b) => {
                layers
                    .iter()
                    .all(|l| l.bias.as_ref().is_some_and(|c| c.dtype() == b.dtype()))
                    && fits(b.dtype(), &rows)
            }
            None => layers.iter().all(|l| l.bias.is_none()),
        };
        if !same_weights || !same_biases || layers.iter().any(|l| l.weight_shape()[1] != cols) {
            return Ok(None);
        }
        let weight = match &first.weight {
            LinearWeight::Dense(_) => {
                let mut parts: Vec<&mut Tensor> = layers
                    .iter_mut()
                    .filter_map(|l| match &mut l.weight {
                        LinearWeight::Dense(w) => Some(w),
                        LinearWeight::Quantized(_) => None,
                    })
                    .collect();
                LinearWeight::Dense(stack_rows(&mut parts)?)
            }
            LinearWeight::Quantized(_) => {
                let parts: Vec<QTensor> = layers
                    .iter()
                    .filter_map(|l| match &l.weight {
                        LinearWeight::Quantized(q) => Some(q.clone()),
                        LinearWeight::Dense(_) => None,
                    })
                    .collect();
                let stacked = QTensor::cat_rows(&parts.iter().collect::<Vec<_>>())?;
                let mut at = 0;
                for (layer, n) in layers.iter_mut().zip(&rows) {
                    layer.weight = LinearWeight::Quantized(stacked.narrow_rows(at, *n)?);
                    at += n;
                }
                LinearWeight::Quantized(stacked)
            }
        };
        let bias = if with_bias {
            let mut parts: Vec<&mut Tensor> = layers.iter_mut().filter_map(|l| l.bias.as_mut()).collect();
            Some(stack_rows(&mut parts)?)
        } else {
            None
        };
        Ok(Some(Linear {
            weight,
            bias,
            lora: None,
            transposed: false,
        }))
    }

    /// Views of consecutive row blocks of this layer (`rows` of them each), weights and biases sharing its
    /// buffers: the separate projections of a fused checkpoint matrix (Phi-3's `qkv_proj`), which
    /// [`Linear::holds`] then recognises as parts of it.
    pub fn split_rows(&self, rows: &[usize]) -> Result<Vec<Linear>> {
        let mut at = 0;
        let mut parts = Vec::with_capacity(rows.len());
        for &n in rows {
            parts.push(Linear {
                weight: match &self.weight {
                    LinearWeight::Dense(w) if self.transposed => LinearWeight::Dense(w.narrow(1, at, n)?),
                    LinearWeight::Dense(w) => LinearWeight::Dense(w.narrow(0, at, n)?),
                    LinearWeight::Quantized(q) => LinearWeight::Quantized(q.narrow_rows(at, n)?),
                },
                bias: self.bias.as_ref().map(|b| b.narrow(0, at, n)).transpose()?,
                lora: None,
                transposed: self.transposed,
            });
            at += n;
        }
        Ok(parts)
    }

    /// Whether this stacked layer still holds `parts`' weights (each a view of its buffer, as
    /// [`Linear::stack`] left them) and computes what they do: a part whose weight was replaced since would be
    /// computed from stale values, and one with an unmerged adapter adds its update, so callers take the separate
    /// layers then.
    pub fn holds(&self, parts: &[&Linear]) -> bool {
        parts.iter().all(|p| {
            !p.has_active_lora()
                && match (&self.weight, &p.weight) {
                    (LinearWeight::Dense(w), LinearWeight::Dense(v)) => std::ptr::eq(w.buffer(), v.buffer()),
                    (LinearWeight::Quantized(w), LinearWeight::Quantized(v)) => w.shares_blocks(v),
                    _ => false,
                }
                && match (&self.bias, &p.bias) {
                    (Some(b), Some(c)) => std::ptr::eq(b.buffer(), c.buffer()),
                    (None, None) => true,
                    _ => false,
                }
        })
    }

    /// This stacked layer, to run in place of `parts` (views of it, see [`Linear::holds`]) as one product. While
    /// the parts' parameters record gradients, its weight and bias are joined from theirs without a copy
    /// ([`Tensor::cat_view`]), so that each part gets its share of the one product's gradient: training runs
    /// Q/K/V and gate/up as wide products, which fill the GPU better than three or two narrow ones. `None` when
    /// the parts no longer hold views of it, in order.
    pub fn stacked_for(&self, parts: &[&Linear]) -> Result<Option<Cow<'_, Linear>>> {
        if !self.holds(parts) {
            return Ok(None);
        }
        if !grad_enabled() || !parts.iter().any(|p| p.requires_grad()) {
            return Ok(Some(Cow::Borrowed(self)));
        }
        let weights: Option<Vec<Tensor>> = parts
            .iter()
            .map(|p| match &p.weight {
                LinearWeight::Dense(w) => Some(w.clone()),
                LinearWeight::Quantized(_) => None,
            })
            .collect();
        let Some(weight) = weights.map(|w| Tensor::cat_view(&w, 0)).transpose()?.flatten() else {
            return Ok(None);
        };
        let bias = match parts.iter().map(|p| p.bias.clone()).collect::<Option<Vec<Tensor>>>() {
            Some(biases) => match Tensor::cat_view(&biases, 0)? {
                Some(b) => Some(b),
                None => return Ok(None),
            },
            None => None,
        };
        Ok(Some(Cow::Owned(Linear {
            weight: LinearWeight::Dense(weight),
            bias,
            lora: None,
            transposed: false,
        })))
    }

    /// `[out_features, in_features]`.
    pub fn weight_shape(&self) -> [usize; 2] {
        match &self.weight {
            LinearWeight::Dense(w) if self.transposed => [w.shape()[1], w.shape()[0]],
            LinearWeight::Dense(w) => [w.shape()[0], w.shape()[1]],
            LinearWeight::Quantized(q) => q.shape(),
        }
    }

    fn weight_requires_grad(&self) -> bool {
        matches!(&self.weight, LinearWeight::Dense(w) if w.requires_grad())
    }

    /// Whether a gradient may flow into this layer's parameters or its adapter's.
    pub fn requires_grad(&self) -> bool {
        self.weight_requires_grad()
            || self.bias.as_ref().is_some_and(Tensor::requires_grad)
            || self
                .lora
                .as_ref()
                .is_some_and(|l| l.a.requires_grad() || l.b.requires_grad())
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

/// `parts` concatenated along their first dimension into one new tensor, each part replaced by its view of it; a
/// trainable part stays a trainable leaf.
fn stack_rows(parts: &mut [&mut Tensor]) -> Result<Tensor> {
    let values: Vec<Tensor> = parts.iter().map(|t| (**t).clone()).collect();
    let stacked = no_grad(|| Tensor::cat(&values, 0))?.detach();
    let mut at = 0;
    for part in parts.iter_mut() {
        let n = part.shape()[0];
        let view = stacked.narrow(0, at, n)?;
        **part = if part.requires_grad() {
            view.requires_grad_()
        } else {
            view
        };
        at += n;
    }
    Ok(stacked)
}

/// `items` (parameters, layers) with their names put under `prefix` (`weight` in `q_proj` becomes
/// `q_proj.weight`), so that a module's list is its children's, named the way Hugging Face names them.
pub(crate) fn prefixed<N: std::fmt::Display, T>(prefix: &str, items: Vec<(N, T)>) -> Vec<(String, T)> {
    items.into_iter().map(|(n, t)| (module_path(prefix, n), t)).collect()
}

/// `name` inside module `prefix` (`prefix.name`), where either may be empty (OPT's MLP module, whose
/// projections sit in the layer itself).
pub(crate) fn module_path(prefix: &str, name: impl std::fmt::Display) -> String {
    let name = name.to_string();
    match (prefix, name.as_str()) {
        ("", _) => name,
        (_, "") => prefix.to_string(),
        _ => format!("{prefix}.{name}"),
    }
}

/// The parameters of a module's named projections, each under its projection's name (`q_proj.weight`, ...).
pub(crate) fn linear_parameters(linears: Vec<(&str, &Linear)>) -> Vec<(String, Tensor)> {
    linears
        .into_iter()
        .flat_map(|(name, l)| prefixed(name, l.parameters()))
        .collect()
}
