//! Causal self-attention with rotary positions: multi-head, grouped-query (GQA) and multi-query (MQA), optional
//! q/k/v biases (Qwen2), per-head q/k RMSNorm (Qwen3) and sliding windows (Mistral).

use std::borrow::Cow;
use std::cell::OnceCell;

use hierarchos_core::ops::attention::{MAX_HEAD_DIM, NewKeys, STEP_MAX_QUERIES};
use hierarchos_core::ops::flash_attention::{flash_attention_fits, rotary_flash_attention_fits};
use hierarchos_core::{Device, Tensor, grad_enabled};

use crate::alibi::Alibi;
use crate::config::QkvLayout;
use crate::error::{Error, Result};
use crate::kv_cache::KvCache;
use crate::linear::{Linear, linear_parameters, prefixed};
use crate::norm::Norm;
use crate::rope::RopeTables;

/// One attention block. Query head `h` reads key/value head `h / (num_heads / num_kv_heads)`, as transformers'
/// `repeat_kv` pairs them.
#[derive(Clone, Debug)]
pub struct Attention {
    /// `[heads * head_dim, hidden]`.
    pub q_proj: Linear,
    /// `[kv_heads * head_dim, hidden]`.
    pub k_proj: Linear,
    /// `[kv_heads * head_dim, hidden]`.
    pub v_proj: Linear,
    /// `[hidden, heads * head_dim]`.
    pub o_proj: Linear,
    /// RMSNorm of the queries before rotary, per head (Qwen3) or over the whole projection (OLMo 2).
    pub q_norm: Option<Norm>,
    /// RMSNorm of the keys before rotary, as `q_norm`.
    pub k_norm: Option<Norm>,
    /// q, k and v are clamped to `[-c, c]` after their projections (OLMo's `clip_qkv`).
    pub clip_qkv: Option<f64>,
    /// q and k are clamped after their norms (OLMoE), not before them (OLMo).
    pub clip_after_norm: bool,
    /// Scores `s` become `c · tanh(s / c)` before the softmax (Gemma 2); the composed attention runs them.
    pub softcap: Option<f64>,
    /// Rotary pairs are adjacent dimensions (Cohere). Queries and keys are then de-interleaved (pairs `(2i, 2i+1)`
    /// of the rotary part moved to `(i, i + r/2)`) before the usual rotary: the scores do not change under one
    /// permutation of both, so every kernel runs as for Llama.
    pub interleaved_rope: bool,
    /// The module names of the query, key, value and output projections (`q_proj`, ..., Phi's `dense`).
    pub names: [&'static str; 4],
    /// The checkpoint holds q, k and v as one matrix under this name, in this row order (Phi-3's `qkv_proj`,
    /// GPT-NeoX's `query_key_value`): `qkv` is then that parameter, always computed as one product (and adapted
    /// as one layer), and `q_proj`, `k_proj` and `v_proj` are views of its blocks (see [`qkv_views`]).
    pub fused_qkv: Option<(&'static str, QkvLayout)>,
    /// The attention's module name in the layer (`self_attn`, GPT-NeoX's `attention`).
    pub module: &'static str,
    /// The module names of `q_norm` and `k_norm` (StableLM's `q_layernorm`, `k_layernorm`).
    pub norm_names: [&'static str; 2],
    /// The leading dimensions of each head that rotate (all of them, or StableLM's partial rotary); the rest
    /// pass through.
    pub rotary_dim: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (divides `num_heads`).
    pub num_kv_heads: usize,
    /// Size of one head.
    pub head_dim: usize,
    /// `q_proj`, `k_proj` and `v_proj` stacked (their weights are views of it): one matmul, in training too
    /// ([`Linear::stacked_for`]), while the projections hold views of it and none has an active adapter
    /// ([`Linear::holds`]; replacing one makes the layer run them separately). `None` when they cannot be stacked
    /// (see [`Linear::stack`]).
    pub qkv: Option<Linear>,
}

/// Queries of a cached step up to which rotary, cache update and attention run as one fused kernel; longer
/// prompts take flash attention's forward (or the batched matmuls where it does not fit). On an H200 the 110M
/// Llama shape prefills 128 / 256 / 512 / 1024 / 2048 tokens at 43.7 / 59.6 / 75.5 / 86.9 / 84.7K tokens/s with
/// it, at 40.7 / 60.7 / 75.4 / 77.4 / 62.7K with the batched matmuls.
pub const FUSED_ATTENTION_MAX_QUERIES: usize = 64;

/// What every layer of one forward shares: the rotary tables of the new positions, where queries and keys
/// start, the sliding window, and the additive mask and ALiBi biases (built on first use, once for all layers).
#[derive(Debug)]
pub struct AttentionContext {
    /// Rotary tables of the new positions.
    pub tables: RopeTables,
    /// Position of the first query (0 without a cache).
    pub query_start: usize,
    /// Position of the first key attended to (later than 0 when a sliding window lets older keys go).
    pub key_start: usize,
    /// The sliding window of the layers this context serves, if they slide.
    pub window: Option<usize>,
    /// The attention score scale the query tables carry (what the dimensions past a partial rotary are
    /// multiplied by).
    pub score_scale: f64,
    mask: OnceCell<Option<Tensor>>,
    /// ALiBi's form and slope of each query head (BLOOM, Falcon-RW), `None` without ALiBi.
    alibi_slopes: Option<(Alibi, Vec<f32>)>,
    alibi: OnceCell<Tensor>,
}

impl AttentionContext {
    /// The context of queries from `query_start` over keys from `key_start`, with the score scale the query
    /// tables carry.
    pub fn new(
        tables: RopeTables,
        query_start: usize,
        key_start: usize,
        window: Option<usize>,
        score_scale: f64,
    ) -> Self {
        AttentionContext {
            tables,
            query_start,
            key_start,
            window,
            score_scale,
            mask: OnceCell::new(),
            alibi_slopes: None,
            alibi: OnceCell::new(),
        }
    }

    /// This context with ALiBi: head h's score over the key at position p gains `form.bias(slopes[h], p, ..)`,
    /// as transformers adds it.
    pub fn with_alibi(mut self, form: Alibi, slopes: Vec<f32>) -> Self {
        self.alibi_slopes = Some((form, slopes));
        self
    }

    /// The `[heads, S]` ALiBi biases of `s` keys from `key_start` on the scale of the scaled scores; `None`
    /// without ALiBi.
    pub fn alibi(&self, s: usize, device: &Device) -> Result<Option<&Tensor>> {
        let Some((form, slopes)) = &self.alibi_slopes else {
            return Ok(None);
        };
        if self.alibi.get().is_none() {
            let biases: Vec<f32> = slopes
                .iter()
                .flat_map(|&slope| {
                    (self.key_start..self.key_start + s).map(move |pos| form.bias(slope, pos, self.score_scale))
                })
                .collect();
            let _ = self.alibi.set(Tensor::from_slice(&biases, &[slopes.len(), s], device)?);
        }
        Ok(self.alibi.get())
    }

    /// The `[T, S]` additive mask (0 or -inf) of `t` queries over `s` keys, `None` when every key is visible.
    pub fn mask(&self, t: usize, s: usize, device: &Device) -> Result<Option<&Tensor>> {
        if self.mask.get().is_none() {
            let mask = attention_mask(self.query_start, t, self.key_start, s, self.window)
                .map(|m| Tensor::from_slice(&m, &[t, s], device))
                .transpose()?;
            let _ = self.mask.set(mask);
        }
        Ok(self.mask.get().and_then(Option::as_ref))
    }
}

impl Attention {
    /// `residual + attention(norm(x))` for `x` `[B, T, hidden]` at the positions `ctx` describes (the norm and
    /// the residual are optional: with quantized projections at decode they run inside the projections'
    /// launches). With a cache, the new keys and values are appended to layer `layer` of it and the queries
    /// attend over the cached prefix too; when nothing needs gradients, that step runs fused kernels (rotary and
    /// cache update in one launch, attention in another). Training runs [`Tensor::flash_attention`], which never
    /// stores the `[T, S]` scores.
    pub fn forward(
        &self,
        x: &Tensor,
        norm: Option<&Norm>,
        residual: Option<&Tensor>,
        ctx: &AttentionContext,
        cache: Option<(&KvCache, usize)>,
    ) -> Result<Tensor> {
        let (b, t) = (x.shape()[0], x.shape()[1]);
        let (h, kvh, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        // The q/k norms take each head (Qwen3: weights of D) or the whole projection (OLMo 2: of n·D).
        let heads = |y: Tensor, n: usize, norm: &Option<Norm>| -> Result<Tensor> {
            // (A weight per head, `[n, D]`, normalizes each head: Cohere.)
            let whole = norm
                .as_ref()
                .filter(|m| m.width() != Some(d) && m.weight.as_ref().is_some_and(|w| w.rank() == 1));
            let y = match whole {
                Some(m) => m.forward(&y)?,
                None => y,
            };
            let y = y.reshape(&[b, t, n, d])?;
            Ok(match norm {
                Some(m) if whole.is_none() => m.forward(&y)?,
                _ => y,
            })
        };
        let projections = [&self.q_proj, &self.k_proj, &self.v_proj];
        let fused = self.fused_qkv.and(self.qkv.as_ref());
        let trainable = match fused {
            Some(qkv) => qkv.requires_grad(),
            None => projections.iter().any(|l| l.requires_grad()),
        };
        let differentiable = grad_enabled() && (x.requires_grad() || trainable);
        let stacked = match (&self.qkv, fused) {
            (Some(qkv), Some(_)) => Some(Cow::Borrowed(qkv)),
            (Some(qkv), None) => qkv.stacked_for(&projections)?,
            (None, _) => None,
        };
        let (q, k, v) = match stacked {
            Some(qkv) => {
                let y = qkv.forward_fused(x, norm, None, None)?;
                match self.fused_qkv {
                    Some((_, QkvLayout::Grouped)) => {
                        let g = h / kvh;
                        let y = y.reshape(&[b, t, kvh, g + 2, d])?;
                        let part = |at: usize, n: usize| -> Result<Tensor> {
                            Ok(y.narrow(3, at, n)?.contiguous()?.reshape(&[b, t, kvh * n * d])?)
                        };
                        (part(0, g)?, part(g, 1)?, part(g + 1, 1)?)
                    }
                    _ => (
                        y.narrow(-1, 0, h * d)?,
                        y.narrow(-1, h * d, kvh * d)?,
                        y.narrow(-1, (h + kvh) * d, kvh * d)?,
                    ),
                }
            }
            None => {
                let normed = norm.map(|n| n.forward(x)).transpose()?;
                let x = normed.as_ref().unwrap_or(x);
                (
                    self.q_proj.forward(x)?,
                    self.k_proj.forward(x)?,
                    self.v_proj.forward(x)?,
                )
            }
        };
        let clip = |y: Tensor| -> Result<Tensor> {
            match self.clip_qkv {
                Some(c) => Ok(y.clamp(-c, c)?),
                None => Ok(y),
            }
        };
        let (q, k) = match self.clip_after_norm {
            true => (clip(heads(q, h, &self.q_norm)?)?, clip(heads(k, kvh, &self.k_norm)?)?),
            false => (heads(clip(q)?, h, &self.q_norm)?, heads(clip(k)?, kvh, &self.k_norm)?),
        };
        let v = heads(clip(v)?, kvh, &None)?;
        let (q, k) = match self.interleaved_rope {
            true => (deinterleave(q, self.rotary_dim)?, deinterleave(k, self.rotary_dim)?),
            false => (q, k),
        };
        let y = attend_heads(q, k, v, self.rotary_dim, self.softcap, differentiable, ctx, cache)?;
        Ok(self
            .o_proj
            .forward_fused(&y.reshape(&[b, t, h * d])?, None, None, residual)?)
    }

    /// The linear layers with their module names (`q_proj`, ..., or the fused `qkv_proj`), in module order.
    pub fn linears(&self) -> Vec<(&'static str, &Linear)> {
        let [q, k, v, o] = self.names;
        match (self.fused_qkv, &self.qkv) {
            (Some((name, _)), Some(qkv)) => vec![(name, qkv), (o, &self.o_proj)],
            _ => vec![
                (q, &self.q_proj),
                (k, &self.k_proj),
                (v, &self.v_proj),
                (o, &self.o_proj),
            ],
        }
    }

    /// [`Attention::linears`], mutable.
    pub fn linears_mut(&mut self) -> Vec<(&'static str, &mut Linear)> {
        let [q, k, v, o] = self.names;
        match (self.fused_qkv, &mut self.qkv) {
            (Some((name, _)), Some(qkv)) => vec![(name, qkv), (o, &mut self.o_proj)],
            _ => vec![
                (q, &mut self.q_proj),
                (k, &mut self.k_proj),
                (v, &mut self.v_proj),
                (o, &mut self.o_proj),
            ],
        }
    }

    /// Makes `qkv` and the projections one again after weights were replaced (merged adapters, another dtype):
    /// a fused checkpoint's projections become views of the fused matrix anew, separate ones are stacked anew.
    pub(crate) fn restack(&mut self) -> Result<()> {
        match (self.fused_qkv, &self.qkv) {
            (Some((_, layout)), Some(qkv)) => {
                let (h, kvh, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
                [self.q_proj, self.k_proj, self.v_proj] = qkv_views(qkv, layout, [h * d, kvh * d, kvh * d])?;
            }
            _ => self.qkv = Linear::stack(&mut [&mut self.q_proj, &mut self.k_proj, &mut self.v_proj])?,
        }
        Ok(())
    }

    /// Whether every projection runs fused at decode (see [`Linear::fuses`]).
    pub fn fuses(&self) -> bool {
        let parts = [&self.q_proj, &self.k_proj, &self.v_proj];
        self.qkv.as_ref().is_some_and(|s| s.fuses() && s.holds(&parts)) && self.o_proj.fuses()
    }

    /// The parameters with their Hugging Face names (`q_proj.weight`, ..., `q_norm.weight`).
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = linear_parameters(self.linears());
        let [q_norm, k_norm] = self.norm_names;
        if let Some(n) = &self.q_norm {
            p.extend(prefixed(q_norm, n.parameters()));
        }
        if let Some(n) = &self.k_norm {
            p.extend(prefixed(k_norm, n.parameters()));
        }
        p
    }
}

/// Rotary, the cache and attention for heads already projected: queries `[B, T, H, D]`, keys and values
/// `[B, T, KVH, D]`, of which the leading `rotary_dim` dimensions of each head rotate (the rest of the queries'
/// take the score scale). Scores are soft-capped by `softcap` and biased by the context's ALiBi; `differentiable`
/// says whether gradients will flow, which rules out the fused inference kernels. Returns `[B, T, H, D]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_heads(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rotary_dim: usize,
    softcap: Option<f64>,
    differentiable: bool,
    ctx: &AttentionContext,
    cache: Option<(&KvCache, usize)>,
) -> Result<Tensor> {
    let (t, d) = (q.shape()[1], q.shape()[3]);
    let differentiable = differentiable || (grad_enabled() && [&q, &k, &v].iter().any(|y| y.requires_grad()));
    // The fused kernels rotate whole heads and neither soft-cap nor bias the scores; such layers take the
    // composed path.
    let partial = rotary_dim < d;
    let biased = softcap.is_some() || ctx.alibi_slopes.is_some();
    let fused = !partial && !biased;
    let rotate = |x: Tensor, cos: &Tensor, sin: &Tensor, pass_scale: f64| -> Result<Tensor> {
        if !partial {
            return Ok(x.rope(cos, sin)?);
        }
        let r = rotary_dim;
        let rotated = x.narrow(-1, 0, r)?.rope(cos, sin)?;
        let passed = match x.narrow(-1, r, d - r)? {
            p if pass_scale != 1.0 => p.mul_scalar(pass_scale)?,
            p => p,
        };
        Ok(Tensor::cat(&[rotated, passed], -1)?)
    };
    Ok(match cache {
        // The fused kernels take heads of up to MAX_HEAD_DIM; larger ones run the batched matmuls below.
        Some((cache, layer)) if !differentiable && fused && t <= STEP_MAX_QUERIES && d <= MAX_HEAD_DIM => {
            let (k_cache, v_cache) = cache.buffers(layer);
            let new = NewKeys {
                k: &k,
                v: &v,
                tables: ctx.tables.step(),
            };
            q.attention_step(new, k_cache, v_cache, cache.len(), ctx.window)?
        }
        Some((cache, layer)) if !differentiable && fused && Tensor::rope_into_cache_fits(q.device()) => {
            let (k_new, v_new) = cache.new_positions(layer, t)?;
            let q = q.rope_into_cache(&k, &v, ctx.tables.step(), &k_new, &v_new)?;
            let (keys, values) = cache.cached(layer, ctx.key_start, cache.len() + t)?;
            if t <= FUSED_ATTENTION_MAX_QUERIES && d <= MAX_HEAD_DIM {
                q.cached_attention(&keys, &values, ctx.query_start, ctx.key_start, ctx.window)?
            } else if flash_attention_fits(&q, &keys, &values) {
                q.flash_attention(&keys, &values, ctx.query_start, ctx.key_start, ctx.window)?
            } else {
                let mask = ctx.mask(t, keys.shape()[2], q.device())?;
                scaled_dot_product(&q, &keys, &values, mask)?.permute(&[0, 2, 1, 3])?
            }
        }
        _ => {
            let heads = |x: &Tensor| x.permute(&[0, 2, 1, 3]);
            let (qh, kh, vh) = (heads(&q)?, heads(&k)?, heads(&v)?);
            // Training's path: the attention kernels rotate q and k as they read them, so that no rotary kernels
            // run and the gradients of q, k and v cut from one projection come back as one tensor.
            if fused && cache.is_none() && ctx.key_start == 0 && rotary_flash_attention_fits(&qh, &kh, &vh) {
                return Ok(qh.rotary_flash_attention(&kh, &vh, ctx.tables.step(), ctx.query_start, 0, ctx.window)?);
            }
            // Attention keeps v for its backward: a view of a wider projection would keep all of it alive (q and
            // k before rotation included).
            let v = match differentiable && !v.is_contiguous() {
                true => heads(&v.contiguous()?)?,
                false => vh,
            };
            let q = rotate(qh, &ctx.tables.cos_q, &ctx.tables.sin_q, ctx.score_scale)?;
            let k = rotate(kh, &ctx.tables.cos_k, &ctx.tables.sin_k, 1.0)?;
            let (k, v) = match cache {
                Some((cache, layer)) => cache.append(layer, &k, &v, ctx.key_start)?,
                None if ctx.key_start == 0 => (k, v),
                None => {
                    return Err(Error::Invalid(
                        "attention: keys before the first new position need a cache".into(),
                    ));
                }
            };
            // Anything else (16-bit activations, larger heads) takes the composed path.
            if !biased && flash_attention_fits(&q, &k, &v) {
                q.flash_attention(&k, &v, ctx.query_start, ctx.key_start, ctx.window)?
            } else {
                let s = k.shape()[2];
                let (mask, alibi) = (ctx.mask(t, s, q.device())?, ctx.alibi(s, q.device())?);
                attend(&q, &k, &v, mask, alibi, softcap)?.permute(&[0, 2, 1, 3])?
            }
        }
    })
}

/// Heads `[B, T, n, D]` with the pairs of adjacent dimensions of the leading `r` (the rotary part) split into
/// the two halves of that part (see [`Attention::interleaved_rope`]).
pub(crate) fn deinterleave(y: Tensor, r: usize) -> Result<Tensor> {
    let s = y.shape().to_vec();
    let d = s[3];
    let halves = |x: Tensor| -> Result<Tensor> {
        Ok(x.reshape(&[s[0], s[1], s[2], r / 2, 2])?
            .permute(&[0, 1, 2, 4, 3])?
            .contiguous()?
            .reshape(&[s[0], s[1], s[2], r])?)
    };
    if r == d {
        return halves(y);
    }
    Ok(Tensor::cat(
        &[halves(y.narrow(-1, 0, r)?)?, y.narrow(-1, r, d - r)?],
        -1,
    )?)
}

/// The query, key and value projections of a fused matrix as views of it (`rows` each): its three blocks, or
/// for a matrix grouped by key/value head (which no separate matrix can view) empty placeholders, since such a
/// layer always computes the fused product.
pub(crate) fn qkv_views(qkv: &Linear, layout: QkvLayout, rows: [usize; 3]) -> Result<[Linear; 3]> {
    let rows = match layout {
        QkvLayout::Blocks => rows,
        QkvLayout::Grouped => [0; 3],
    };
    qkv.split_rows(&rows)?
        .try_into()
        .map_err(|_| Error::Invalid("attention: a fused q/k/v matrix splits in three".into()))
}

/// `softmax(q kᵀ + mask) v` for queries `[B, H, T, D]` (already carrying the score scale) and keys and values
/// `[B, KVH, S, D]` (any layout, e.g. a view of a cache). The `H / KVH` query heads that share a key/value head
/// are stacked into the rows of one product, so grouped keys and values are never repeated in memory. `mask` is
/// `[T, S]`, added to the scores of every head. Returns `[B, H, T, D]`.
pub fn scaled_dot_product(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
    attend(q, k, v, mask, None, None)
}

/// [`scaled_dot_product`], the scores soft-capped to `c · tanh(s / c)` first when `softcap` is `Some(c)`, then
/// each head's biases `[H, S]` (ALiBi) added.
fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    bias: Option<&Tensor>,
    softcap: Option<f64>,
) -> Result<Tensor> {
    let bad = || {
        Error::Invalid(format!(
            "attention: queries {:?}, keys {:?}, values {:?}, mask {:?}, biases {:?} do not fit",
            q.shape(),
            k.shape(),
            v.shape(),
            mask.map(|m| m.shape().to_vec()),
            bias.map(|a| a.shape().to_vec())
        ))
    };
    if q.rank() != 4 || k.rank() != 4 || v.shape() != k.shape() {
        return Err(bad());
    }
    let (b, h, t, d) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let (kvh, s) = (k.shape()[1], k.shape()[2]);
    if k.shape()[0] != b || k.shape()[3] != d || kvh == 0 || !h.is_multiple_of(kvh) {
        return Err(bad());
    }
    if mask.is_some_and(|m| m.shape() != [t, s]) || bias.is_some_and(|a| a.shape() != [h, s]) {
        return Err(bad());
    }
    let g = h / kvh;
    let scores = q.contiguous()?.reshape(&[b, kvh, g * t, d])?.matmul(&k.t()?)?;
    let scores = match softcap {
        Some(c) => scores.div_scalar(c)?.tanh()?.mul_scalar(c)?,
        None => scores,
    };
    let probs = match (mask, bias) {
        (None, None) => scores.softmax(-1)?,
        _ => {
            let mut scores = scores.reshape(&[b, kvh, g, t, s])?;
            if let Some(a) = bias {
                scores = scores.add(&a.reshape(&[kvh, g, 1, s])?)?;
            }
            if let Some(m) = mask {
                scores = scores.add(m)?;
            }
            scores.softmax(-1)?.reshape(&[b, kvh, g * t, s])?
        }
    };
    Ok(probs.matmul(v)?.reshape(&[b, h, t, d])?)
}

/// The additive mask of queries at positions `q_start..q_start + t` over keys at `k_start..k_start + s`: key `j`
/// is visible from query `i` iff `j <= i` and, with a sliding `window`, `i - window < j` (transformers' rule).
/// `None` when every key is visible to every query.
pub fn attention_mask(q_start: usize, t: usize, k_start: usize, s: usize, window: Option<usize>) -> Option<Vec<f32>> {
    let visible = |i: usize, j: usize| j <= i && window.is_none_or(|w| j + w > i);
    let mask: Vec<f32> = (q_start..q_start + t)
        .flat_map(|i| (k_start..k_start + s).map(move |j| if visible(i, j) { 0.0 } else { f32::NEG_INFINITY }))
        .collect();
    mask.iter().any(|&m| m != 0.0).then_some(mask)
}
