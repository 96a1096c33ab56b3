//! Multi-head latent attention (DeepSeek-V3): each position's keys and values for all heads come from one small
//! normed latent (`kv_lora_rank` wide) through `kv_b_proj`, plus one rotary key part shared by all heads; the
//! queries come through their own low-rank projection or one matrix.
//!
//! Once projected, the heads run through the same rotary, cache and attention kernels as every other family:
//! the rotary part is moved to the front of each query and key head (the scores do not change when the query and
//! key dimensions are permuted alike), and the narrower of the query/key and value heads is zero-padded to the
//! wider (zero dimensions add nothing to the scores or the output, which is cut back to the value width).

use hierarchos_core::Tensor;

use crate::attention::{AttentionContext, attend_heads, deinterleave};
use crate::config::LatentAttentionConfig;
use crate::error::Result;
use crate::kv_cache::KvCache;
use crate::linear::{Linear, linear_parameters, prefixed};
use crate::norm::Norm;

/// Where the queries come from.
#[derive(Clone, Debug)]
pub enum LatentQuery {
    /// One projection, `q_proj` `[heads * (nope + rope), hidden]` (no `q_lora_rank`).
    Full(Linear),
    /// `q_b_proj(q_a_layernorm(q_a_proj(x)))` through the rank `q_lora_rank`.
    LowRank {
        /// `[q_lora_rank, hidden]`.
        q_a_proj: Linear,
        /// RMSNorm of the rank-`q_lora_rank` queries.
        q_a_layernorm: Norm,
        /// `[heads * (nope + rope), q_lora_rank]`.
        q_b_proj: Linear,
    },
}

/// One latent attention block, named as transformers' `DeepseekV3Attention`.
#[derive(Clone, Debug)]
pub struct LatentAttention {
    /// The query projection(s).
    pub query: LatentQuery,
    /// `[kv_lora_rank + rope, hidden]`: the latent, then the rotary key part shared by all heads.
    pub kv_a_proj_with_mqa: Linear,
    /// RMSNorm of the latent.
    pub kv_a_layernorm: Norm,
    /// `[heads * (nope + v), kv_lora_rank]`: each head's key part without rotary, then its value.
    pub kv_b_proj: Linear,
    /// `[hidden, heads * v]`.
    pub o_proj: Linear,
    /// Heads.
    pub num_heads: usize,
    /// The latent, query/key and value widths.
    pub shape: LatentAttentionConfig,
    /// The rotary dimensions are adjacent pairs (`rope_interleave`), de-interleaved before the usual rotary.
    pub interleaved_rope: bool,
}

impl LatentAttention {
    /// Attention of `x` (`[B, T, hidden]`, already normed) at the positions `ctx` describes; with a cache, the new
    /// keys and values (expanded per head) are appended to layer `layer` of it.
    pub fn forward(&self, x: &Tensor, ctx: &AttentionContext, cache: Option<(&KvCache, usize)>) -> Result<Tensor> {
        let (b, t) = (x.shape()[0], x.shape()[1]);
        let h = self.num_heads;
        let LatentAttentionConfig {
            kv_lora_rank: rank,
            nope_dim: nope,
            rope_dim: rope,
            v_dim,
            ..
        } = self.shape;
        let d = (nope + rope).max(v_dim);
        let q = match &self.query {
            LatentQuery::Full(q_proj) => q_proj.forward(x)?,
            LatentQuery::LowRank {
                q_a_proj,
                q_a_layernorm,
                q_b_proj,
            } => q_b_proj.forward(&q_a_layernorm.forward(&q_a_proj.forward(x)?)?)?,
        }
        .reshape(&[b, t, h, nope + rope])?;
        let compressed = self.kv_a_proj_with_mqa.forward(x)?;
        let latent = self.kv_a_layernorm.forward(&compressed.narrow(-1, 0, rank)?)?;
        let kv = self.kv_b_proj.forward(&latent)?.reshape(&[b, t, h, nope + v_dim])?;
        let (q_rot, k_rot) = (
            q.narrow(-1, nope, rope)?,
            compressed.narrow(-1, rank, rope)?.reshape(&[b, t, 1, rope])?,
        );
        let (q_rot, k_rot) = match self.interleaved_rope {
            true => (deinterleave(q_rot, rope)?, deinterleave(k_rot, rope)?),
            false => (q_rot, k_rot),
        };
        let k_rot = k_rot.broadcast_to(&[b, t, h, rope])?;
        let padded = |parts: Vec<Tensor>, width: usize| -> Result<Tensor> {
            let mut parts = parts;
            if width < d {
                parts.push(Tensor::zeros(&[b, t, h, d - width], q.dtype(), x.device())?);
            }
            Ok(Tensor::cat(&parts, -1)?)
        };
        let q = padded(vec![q_rot, q.narrow(-1, 0, nope)?], nope + rope)?;
        let k = padded(vec![k_rot, kv.narrow(-1, 0, nope)?], nope + rope)?;
        let v = padded(vec![kv.narrow(-1, nope, v_dim)?], v_dim)?;
        let y = attend_heads(q, k, v, rope, None, false, ctx, cache)?;
        let y = match v_dim < d {
            true => y.narrow(-1, 0, v_dim)?,
            false => y,
        };
        Ok(self.o_proj.forward(&y.reshape(&[b, t, h * v_dim])?)?)
    }

    /// The linear layers with their module names, in module order.
    pub fn linears(&self) -> Vec<(&'static str, &Linear)> {
        let mut v = match &self.query {
            LatentQuery::Full(q_proj) => vec![("q_proj", q_proj)],
            LatentQuery::LowRank { q_a_proj, q_b_proj, .. } => vec![("q_a_proj", q_a_proj), ("q_b_proj", q_b_proj)],
        };
        v.extend([
            ("kv_a_proj_with_mqa", &self.kv_a_proj_with_mqa),
            ("kv_b_proj", &self.kv_b_proj),
            ("o_proj", &self.o_proj),
        ]);
        v
    }

    /// [`LatentAttention::linears`], mutable.
    pub fn linears_mut(&mut self) -> Vec<(&'static str, &mut Linear)> {
        let mut v = match &mut self.query {
            LatentQuery::Full(q_proj) => vec![("q_proj", q_proj)],
            LatentQuery::LowRank { q_a_proj, q_b_proj, .. } => vec![("q_a_proj", q_a_proj), ("q_b_proj", q_b_proj)],
        };
        v.extend([
            ("kv_a_proj_with_mqa", &mut self.kv_a_proj_with_mqa),
            ("kv_b_proj", &mut self.kv_b_proj),
            ("o_proj", &mut self.o_proj),
        ]);
        v
    }

    /// The two norms of the block (for freezing).
    pub(crate) fn norms_mut(&mut self) -> Vec<&mut Norm> {
        let mut v = vec![&mut self.kv_a_layernorm];
        if let LatentQuery::LowRank { q_a_layernorm, .. } = &mut self.query {
            v.push(q_a_layernorm);
        }
        v
    }

    /// The parameters with their Hugging Face names (`q_a_proj.weight`, `q_a_layernorm.weight`, ...).
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = linear_parameters(self.linears());
        if let LatentQuery::LowRank { q_a_layernorm, .. } = &self.query {
            p.extend(prefixed("q_a_layernorm", q_a_layernorm.parameters()));
        }
        p.extend(prefixed("kv_a_layernorm", self.kv_a_layernorm.parameters()));
        p
    }
}
