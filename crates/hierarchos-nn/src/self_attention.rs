//! The attention half of a decoder layer: projections to query, key and value heads (most families), or
//! multi-head latent attention (DeepSeek-V3).

use hierarchos_core::Tensor;

use crate::attention::{Attention, AttentionContext};
use crate::error::Result;
use crate::kv_cache::KvCache;
use crate::latent_attention::LatentAttention;
use crate::linear::{Linear, prefixed};
use crate::norm::{Norm, normed_residual};

/// What a decoder layer attends with.
// One per layer: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum SelfAttention {
    /// Query, key and value projections (separate or fused).
    Standard(Attention),
    /// Keys and values from one latent per position (DeepSeek-V3).
    Latent(LatentAttention),
}

impl SelfAttention {
    /// `residual + attention(norm(x))`, the norm and the residual optional (standard attention runs them inside
    /// its projections' launches where it can).
    pub fn forward(
        &self,
        x: &Tensor,
        norm: Option<&Norm>,
        residual: Option<&Tensor>,
        ctx: &AttentionContext,
        cache: Option<(&KvCache, usize)>,
    ) -> Result<Tensor> {
        match self {
            SelfAttention::Standard(a) => a.forward(x, norm, residual, ctx, cache),
            SelfAttention::Latent(a) => normed_residual(x, norm, residual, |x| a.forward(x, ctx, cache)),
        }
    }

    /// The standard attention, when the block is one.
    pub fn standard(&self) -> Option<&Attention> {
        match self {
            SelfAttention::Standard(a) => Some(a),
            SelfAttention::Latent(_) => None,
        }
    }

    /// [`SelfAttention::standard`], mutable.
    pub fn standard_mut(&mut self) -> Option<&mut Attention> {
        match self {
            SelfAttention::Standard(a) => Some(a),
            SelfAttention::Latent(_) => None,
        }
    }

    /// The block's module name in the layer (`self_attn`, GPT-NeoX's `attention`).
    pub fn module(&self) -> &'static str {
        match self {
            SelfAttention::Standard(a) => a.module,
            SelfAttention::Latent(_) => "self_attn",
        }
    }

    /// Whether the block runs fused at decode ([`Attention::fuses`]; latent attention never does).
    pub fn fuses(&self) -> bool {
        self.standard().is_some_and(Attention::fuses)
    }

    /// The linear layers with their module paths inside the layer (`self_attn.q_proj`, ...), in module order.
    pub fn linears(&self) -> Vec<(String, &Linear)> {
        match self {
            SelfAttention::Standard(a) => prefixed(self.module(), a.linears()),
            SelfAttention::Latent(a) => prefixed(self.module(), a.linears()),
        }
    }

    /// [`SelfAttention::linears`], mutable.
    pub fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        let module = self.module();
        match self {
            SelfAttention::Standard(a) => prefixed(module, a.linears_mut()),
            SelfAttention::Latent(a) => prefixed(module, a.linears_mut()),
        }
    }

    /// The parameters with their Hugging Face names relative to the layer (`self_attn.q_proj.weight`, ...).
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        let params = match self {
            SelfAttention::Standard(a) => a.parameters(),
            SelfAttention::Latent(a) => a.parameters(),
        };
        prefixed(self.module(), params)
    }

    /// The block's own norms (q/k norms, the latent's norms), for freezing.
    pub(crate) fn norms_mut(&mut self) -> Vec<&mut Norm> {
        match self {
            SelfAttention::Standard(a) => [&mut a.q_norm, &mut a.k_norm].into_iter().flatten().collect(),
            SelfAttention::Latent(a) => a.norms_mut(),
        }
    }

    /// Makes stacked projections one again after weights were replaced (see [`Attention::restack`]).
    pub(crate) fn restack(&mut self) -> Result<()> {
        match self {
            SelfAttention::Standard(a) => a.restack(),
            SelfAttention::Latent(_) => Ok(()),
        }
    }
}
