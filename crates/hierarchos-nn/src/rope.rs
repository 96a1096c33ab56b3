//! Rotary position embedding tables, computed on the host as Hugging Face transformers computes them for each
//! rope type, so that positions rotate by the same angles as in the reference.
//!
//! Transformers builds `inv_freq` in f32 and, even for a float64 model, forms the angles `inv_freq * position`
//! and their cosines and sines in f32 (its rotary forward forces f32). The tables here follow that: each
//! `inv_freq` is computed in f64 from the formula and rounded to f32, the angle is the f32-rounded product, and
//! `cos`/`sin` are the correctly rounded f32 values times the attention factor.

use hierarchos_core::{Device, Tensor};

use crate::config::{RopeConfig, RopeScaling};
use crate::error::{Error, Result};

/// The rotary frequencies of one model.
#[derive(Clone, Debug)]
pub struct RotaryEmbedding {
    /// Transformers' rotary `dim`: the frequencies are `base^(-2i / dim)` for `2i < dim`.
    dim: usize,
    rope: RopeConfig,
}

/// The cosines and sines for a run of positions, as one device tensor `[4, T, D/2]`: the key tables and the
/// query tables, which also carry the attention scale `1/sqrt(D)` so that scaling the scores costs no dispatch.
#[derive(Clone, Debug)]
pub struct RopeTables {
    /// Cosines for keys, `[T, D/2]`.
    pub cos_k: Tensor,
    /// Sines for keys, `[T, D/2]`.
    pub sin_k: Tensor,
    /// Cosines for queries times the score scale, `[T, D/2]`.
    pub cos_q: Tensor,
    /// Sines for queries times the score scale, `[T, D/2]`.
    pub sin_q: Tensor,
}

impl RopeTables {
    /// The tables as the fused rotary and cache update takes them.
    pub fn step(&self) -> hierarchos_core::ops::rope::RopeTables<'_> {
        hierarchos_core::ops::rope::RopeTables {
            cos_q: &self.cos_q,
            sin_q: &self.sin_q,
            cos_k: &self.cos_k,
            sin_k: &self.sin_k,
        }
    }
}

impl RotaryEmbedding {
    /// Frequencies for `dim` rotating dimensions under `rope`. An odd `dim` (a partial rotary factor of an odd
    /// number of dimensions) still has a frequency for each pair from 0, so `dim + 1` dimensions rotate, as
    /// transformers' cos/sin tables are that wide.
    pub fn new(dim: usize, rope: &RopeConfig) -> Result<Self> {
        if dim == 0 {
            return Err(Error::Invalid("rotary embedding: no dimension rotates".into()));
        }
        Ok(RotaryEmbedding {
            dim,
            rope: rope.clone(),
        })
    }

    /// `inv_freq` (the `D/2` angular frequencies, f32-rounded as transformers stores them) for a forward whose
    /// largest position is `seq_len - 1`; only dynamic and longrope scaling depend on `seq_len`.
    pub fn inv_freq(&self, seq_len: usize) -> Vec<f64> {
        let (d, pairs) = (self.dim, self.rotated_dims() / 2);
        let theta = self.rope.theta;
        // base ** (2i / d) with the exponent formed in f32, as `torch.arange(0, d, 2).float() / d` does.
        let exponent = |i: usize| ((2 * i) as f32 / d as f32) as f64;
        let default = |base: f64| -> Vec<f64> { (0..pairs).map(|i| 1.0 / base.powf(exponent(i))).collect() };
        let f = match &self.rope.scaling {
            RopeScaling::Default => default(theta),
            RopeScaling::Linear { factor } => default(theta).into_iter().map(|v| v / factor).collect(),
            RopeScaling::Dynamic {
                factor,
                original_max_position_embeddings,
            } => {
                let original = *original_max_position_embeddings as f64;
                let seq = (seq_len as f64).max(original);
                let dd = d as f64;
                let base = theta * ((factor * seq / original) - (factor - 1.0)).powf(dd / (dd - 2.0));
                default(base)
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let old = *original_max_position_embeddings as f64;
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                default(theta)
                    .into_iter()
                    .map(|inv| {
                        let inv = round32(inv);
                        let wavelen = 2.0 * std::f64::consts::PI / inv;
                        if wavelen < high_wavelen {
                            inv
                        } else if wavelen > low_wavelen {
                            inv / factor
                        } else {
                            let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * inv / factor + smooth * inv
                        }
                    })
                    .collect()
            }
            RopeScaling::LongRope {
                short_factor,
                long_factor,
                original_max_position_embeddings,
                ..
            } => {
                let factors = if seq_len > *original_max_position_embeddings {
                    long_factor
                } else {
                    short_factor
                };
                // `1 / (factor * base ** exponent)` with each step rounded to f32, as transformers computes it.
                (0..pairs)
                    .map(|i| 1.0 / round32(round32(factors[i]) * round32(theta.powf(exponent(i)))))
                    .collect()
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                ..
            } => {
                let dd = d as f64;
                let original = *original_max_position_embeddings as f64;
                let correction_dim = |rotations: f64| {
                    dd * (original / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * theta.ln())
                };
                let low = correction_dim(*beta_fast).floor().max(0.0);
                let high = correction_dim(*beta_slow).ceil().min(dd - 1.0);
                let high = if low == high { high + 0.001 } else { high };
                (0..pairs)
                    .map(|i| {
                        let pos_freq = theta.powf(exponent(i));
                        let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                        let extrapolation = 1.0 - ramp;
                        (1.0 / (factor * pos_freq)) * (1.0 - extrapolation) + (1.0 / pos_freq) * extrapolation
                    })
                    .collect()
            }
        };
        f.into_iter().map(round32).collect()
    }

    /// The factor the cosines and sines are multiplied by (YaRN's attention temperature; 1 otherwise).
    pub fn attention_scaling(&self) -> f64 {
        match &self.rope.scaling {
            RopeScaling::Yarn {
                factor,
                attention_factor,
                ..
            } => attention_factor.unwrap_or_else(|| if *factor <= 1.0 { 1.0 } else { 0.1 * factor.ln() + 1.0 }),
            RopeScaling::LongRope { attention_factor, .. } => *attention_factor,
            _ => 1.0,
        }
    }

    /// `(cos, sin)` for positions `start..start + len`, row-major `[len, D/2]`, as f32 values.
    pub fn tables(&self, start: usize, len: usize) -> (Vec<f32>, Vec<f32>) {
        let inv_freq = self.inv_freq(start + len);
        let scale = round32(self.attention_scaling());
        let mut cos = Vec::with_capacity(len * inv_freq.len());
        let mut sin = Vec::with_capacity(len * inv_freq.len());
        for pos in start..start + len {
            for &f in &inv_freq {
                let angle = round32(f * pos as f64);
                cos.push((round32(angle.cos()) * scale) as f32);
                sin.push((round32(angle.sin()) * scale) as f32);
            }
        }
        (cos, sin)
    }

    /// The device tables for positions `start..start + len` of keys and of queries (the latter times
    /// `score_scale`), uploaded at once.
    pub fn device_tables(&self, start: usize, len: usize, score_scale: f64, device: &Device) -> Result<RopeTables> {
        let (cos, sin) = self.tables(start, len);
        self.upload(cos, sin, score_scale, device)
    }

    /// Tables of `len` positions that rotate by nothing (cosines 1, sines 0; the queries' still carry the score
    /// scale): layers without rotary embeddings (SmolLM3's) run the same kernels with these.
    pub fn identity_tables(&self, len: usize, score_scale: f64, device: &Device) -> Result<RopeTables> {
        let n = len * self.rotated_dims() / 2;
        self.upload(vec![1.0; n], vec![0.0; n], score_scale, device)
    }

    fn upload(&self, cos: Vec<f32>, sin: Vec<f32>, score_scale: f64, device: &Device) -> Result<RopeTables> {
        let len = cos.len() / (self.rotated_dims() / 2);
        let scaled = |v: &[f32]| v.iter().map(|&x| (x as f64 * score_scale) as f32).collect::<Vec<_>>();
        let (cos_q, sin_q) = (scaled(&cos), scaled(&sin));
        let all: Vec<f32> = [cos, sin, cos_q, sin_q].concat();
        let half = self.rotated_dims() / 2;
        let t = Tensor::from_slice(&all, &[4, len, half], device)?;
        let part = |k: usize| -> Result<Tensor> { Ok(t.narrow(0, k, 1)?.squeeze(0)?) };
        Ok(RopeTables {
            cos_k: part(0)?,
            sin_k: part(1)?,
            cos_q: part(2)?,
            sin_q: part(3)?,
        })
    }

    /// The dimensions that rotate, which the tables are for: `dim` rounded up to even.
    pub fn rotated_dims(&self) -> usize {
        self.dim.next_multiple_of(2)
    }
}

/// `v` rounded to the nearest f32 (how a value passes through an f32 tensor).
fn round32(v: f64) -> f64 {
    v as f32 as f64
}
