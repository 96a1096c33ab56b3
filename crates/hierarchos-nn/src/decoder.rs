//! The generic decoder-only causal language model: Llama, Mistral, Qwen2 and Qwen3 are this one model with
//! different [`ModelConfig`] options (biases, q/k norm, sliding window, rope scaling, tied embeddings).

use hierarchos_core::ops::loss::IGNORE_INDEX;
use hierarchos_core::quant::QTensor;
use hierarchos_core::{DType, Device, Tensor};

use crate::alibi::alibi_slopes;
use crate::attention::{Attention, AttentionContext, qkv_views};
use crate::config::{LatentAttentionConfig, ModelConfig, NormPlacement, RouterScoring};
use crate::embedding::Embedding;
use crate::error::{Error, Result};
use crate::feed_forward::FeedForward;
use crate::kv_cache::KvCache;
use crate::latent_attention::{LatentAttention, LatentQuery};
use crate::linear::{Linear, LinearWeight, module_path, prefixed};
use crate::lora::LoraConfig;
use crate::mlp::Mlp;
use crate::moe::{Moe, SharedExpert};
use crate::norm::{Norm, NormKind};
use crate::rope::{RopeTables, RotaryEmbedding};
use crate::self_attention::SelfAttention;
use crate::weights::Weights;

/// One decoder block: pre-norm (Llama) `x + attn(norm(x))`, then `x + mlp(norm(x))`; post-norm (OLMo 2)
/// `x + norm(attn(x))`, then `x + norm(mlp(x))`; or both (Gemma 2's sandwich) `x + norm(attn(norm(x)))`, then
/// `x + norm(mlp(norm(x)))`.
#[derive(Clone, Debug)]
pub struct DecoderLayer {
    /// Norm before attention (`input_layernorm`); `None` in a post-norm layer.
    pub input_layernorm: Option<Norm>,
    /// Self-attention.
    pub self_attn: SelfAttention,
    /// Norm of the attention output before its residual add (`post_attention_layernorm` of OLMo 2 and Gemma 2).
    pub attention_output_norm: Option<Norm>,
    /// Norm before the MLP (Llama's `post_attention_layernorm`, Gemma 2's `pre_feedforward_layernorm`).
    pub mlp_input_norm: Option<Norm>,
    /// The MLP (gated or plain), or a mixture of experts.
    pub mlp: FeedForward,
    /// Norm of the MLP output before its residual add (`post_feedforward_layernorm`).
    pub mlp_output_norm: Option<Norm>,
    /// The checkpoint names of the input, attention-output, MLP-input and MLP-output norms (`input_layernorm`,
    /// ...; GPT-2's `ln_1` and `ln_2`).
    pub norm_names: [&'static str; 4],
    /// Attention and MLP side by side (Cohere, Phi): the MLP reads the layer's input (normed by `mlp_input_norm`,
    /// else the attention's input norm), and both outputs are added to the residual stream.
    pub parallel: bool,
    /// Multiplies the attention and MLP outputs before their residual adds (Granite's `residual_multiplier`).
    pub residual_multiplier: Option<f64>,
}

impl DecoderLayer {
    /// The block on the residual stream `x` (`[B, T, hidden]`), given `normed = input_layernorm(x)` (`x` itself
    /// in a post-norm layer): returns the new stream and `next_norm` of it (the stream itself when `None`: a
    /// post-norm layer follows). In a pre-norm layer each residual add is fused with the norm after it (the
    /// MLP's, then the next layer's input norm or the model's final norm), bit for bit the unfused result.
    pub fn forward(
        &self,
        x: &Tensor,
        normed: &Tensor,
        next_norm: Option<&Norm>,
        ctx: &AttentionContext,
        cache: Option<(&KvCache, usize)>,
    ) -> Result<(Tensor, Tensor)> {
        let scaled = |y: Tensor| -> Result<Tensor> {
            Ok(match self.residual_multiplier {
                Some(r) => y.mul_scalar(r)?,
                None => y,
            })
        };
        let output_norm = |norm: &Option<Norm>, y: Tensor| -> Result<Tensor> {
            scaled(match norm {
                Some(n) => n.forward(&y)?,
                None => y,
            })
        };
        let attn = output_norm(
            &self.attention_output_norm,
            self.self_attn.forward(normed, None, None, ctx, cache)?,
        )?;
        let (x, h) = match (&self.mlp_input_norm, self.parallel) {
            (Some(n), true) => (x.add(&attn)?, n.forward(x)?),
            (None, true) => (x.add(&attn)?, normed.clone()),
            (Some(n), false) => n.add_forward(x, &attn)?,
            (None, false) => {
                let x = x.add(&attn)?;
                (x.clone(), x)
            }
        };
        let mlp = output_norm(&self.mlp_output_norm, self.mlp.forward(&h, None, None)?)?;
        match next_norm {
            Some(n) => Ok(n.add_forward(&x, &mlp)?),
            None => {
                let x = x.add(&mlp)?;
                Ok((x.clone(), x))
            }
        }
    }

    /// The same block with each norm run by the projection after it and each residual add by the projection
    /// before it: how quantized layers decode, in six launches (Q/K/V with the input norm, rotary and cache
    /// update, attention, O with the residual, gate/up with the norm and activation, down with the residual).
    pub fn forward_fused(
        &self,
        x: &Tensor,
        ctx: &AttentionContext,
        cache: Option<(&KvCache, usize)>,
    ) -> Result<Tensor> {
        let x = self
            .self_attn
            .forward(x, self.input_layernorm.as_ref(), Some(x), ctx, cache)?;
        self.mlp.forward(&x, self.mlp_input_norm.as_ref(), Some(&x))
    }

    /// Whether [`DecoderLayer::forward_fused`] is the faster way: a pre-norm layer, every projection quantized,
    /// without bias, and no multiplier between the projections and the residual adds they fuse.
    pub fn fuses(&self) -> bool {
        self.self_attn.fuses()
            && self.mlp.fuses()
            && self.residual_multiplier.is_none()
            && !self.parallel
            && self.input_layernorm.is_some()
            && self.mlp_input_norm.is_some()
            && self.attention_output_norm.is_none()
            && self.mlp_output_norm.is_none()
    }

    /// The linear layers with their paths inside the layer (`self_attn.q_proj`, ..., `mlp.down_proj`), in
    /// module order.
    fn linears(&self) -> Vec<(String, &Linear)> {
        let mut v = self.self_attn.linears();
        v.extend(self.mlp.linears());
        v
    }

    /// [`DecoderLayer::linears`], mutable.
    fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        let mut v = self.self_attn.linears_mut();
        v.extend(self.mlp.linears_mut());
        v
    }

    /// The parameters with their Hugging Face names relative to the layer.
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        let [input, attention_output, mlp_input, mlp_output] = self.norm_names;
        let optional =
            |name: &str, norm: &Option<Norm>| norm.as_ref().map_or_else(Vec::new, |n| prefixed(name, n.parameters()));
        [
            optional(input, &self.input_layernorm),
            self.self_attn.parameters(),
            optional(attention_output, &self.attention_output_norm),
            optional(mlp_input, &self.mlp_input_norm),
            self.mlp.parameters(),
            optional(mlp_output, &self.mlp_output_norm),
        ]
        .concat()
    }

    /// The layer's norms (of the residual stream and of queries and keys), for freezing.
    pub(crate) fn norms_mut(&mut self) -> impl Iterator<Item = &mut Norm> {
        [
            &mut self.input_layernorm,
            &mut self.attention_output_norm,
            &mut self.mlp_input_norm,
            &mut self.mlp_output_norm,
        ]
        .into_iter()
        .flatten()
        .chain(self.self_attn.norms_mut())
    }
}

/// A decoder-only language model with its output head.
#[derive(Clone, Debug)]
pub struct CausalLm {
    config: ModelConfig,
    /// `model.embed_tokens`.
    pub embed_tokens: Embedding,
    /// Learned absolute position embeddings added to the token embeddings (GPT-2's `transformer.wpe`).
    pub embed_positions: Option<Embedding>,
    /// The norm of the embeddings before the first layer (BLOOM's `transformer.word_embeddings_layernorm`).
    pub embed_norm: Option<Norm>,
    /// `model.layers.N`.
    pub layers: Vec<DecoderLayer>,
    /// `model.norm`, the final norm.
    pub norm: Norm,
    /// `lm_head`; `None` when the embedding matrix is reused (tied embeddings), or for a tied model whose
    /// embedding is in a block format (GGUF) a frozen quantized copy of it, which reads a quarter of the bytes.
    /// While the embedding requires grad the tied matrix itself is used, so that training sees one matrix.
    pub lm_head: Option<Linear>,
    rotary: RotaryEmbedding,
    /// The rotary frequencies of the sliding-window layers, where they differ (OLMo 3).
    sliding_rotary: Option<RotaryEmbedding>,
    /// The settings of the LoRA adapter attached to some of the linear layers (see `lora.rs`).
    pub(crate) adapter: Option<Box<LoraConfig>>,
}

/// The output head's module path, which adapters name: `lm_head` in every family under transformers 5, GPT-NeoX's
/// too, whose checkpoints call its weight `embed_out` (renamed on load).
pub(crate) const HEAD_MODULE: &str = "lm_head";

impl CausalLm {
    /// Loads every tensor the config implies from `weights`, each with the shape it must have (under its name, or
    /// without the base model's prefix in a checkpoint of the bare base model: see [`Weights::stored_name`]).
    pub fn load(config: &ModelConfig, weights: &Weights, device: &Device) -> Result<CausalLm> {
        CausalLm::load_from(config, weights, device, false)
    }

    /// Like [`CausalLm::load`], with every parameter trainable (collecting gradients), for training.
    pub fn load_trainable(config: &ModelConfig, weights: &Weights, device: &Device) -> Result<CausalLm> {
        CausalLm::load_from(config, weights, device, true)
    }

    fn load_from(config: &ModelConfig, weights: &Weights, device: &Device, trainable: bool) -> Result<CausalLm> {
        let base = config.names.base_module();
        CausalLm::build(config, &mut |name, shape| {
            let t = weights.load(weights.stored_name(name, base), shape, device)?;
            Ok(if trainable { t.requires_grad_() } else { t })
        })
    }

    /// Builds the model from `tensor(name, shape)`, called once per parameter with its Hugging Face name and
    /// the shape the config implies (weights from a file, random weights for tests, ...).
    pub fn build(config: &ModelConfig, tensor: &mut dyn FnMut(&str, &[usize]) -> Result<Tensor>) -> Result<CausalLm> {
        CausalLm::build_with(config, tensor, &mut |_, _| Ok(None))
    }

    /// Like [`CausalLm::build`], but each linear layer's weight is first asked of `quantized(name, [out, in])`:
    /// a [`QTensor`] returned there stays quantized on the GPU (frozen; GGUF models), `None` falls back to
    /// `tensor`.
    pub fn build_with(
        config: &ModelConfig,
        tensor: &mut dyn FnMut(&str, &[usize]) -> Result<Tensor>,
        quantized: QuantSource,
    ) -> Result<CausalLm> {
        let c = config;
        let (hidden, d) = (c.hidden_size, c.head_dim);
        let (h, kvh) = (c.num_attention_heads, c.num_key_value_heads);
        if hidden == 0 || d == 0 || h == 0 || kvh == 0 || !h.is_multiple_of(kvh) || c.vocab_size == 0 {
            return Err(Error::Invalid(format!(
                "model: hidden_size {hidden}, head_dim {d}, {h} heads and {kvh} key/value heads do not make a model \
                 (the key/value heads must divide the heads; none may be 0)"
            )));
        }
        let names = c.names;
        let embed_name = names.embedding_weight();
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let p = names.layer(i);
            let a = format!("{p}.{}", names.attention);
            let m = module_path(&p, names.mlp);
            let self_attn = match c.latent_attention {
                Some(m) => SelfAttention::Latent(latent_attention(tensor, quantized, &a, c, m)?),
                None => SelfAttention::Standard(standard_attention(tensor, quantized, &a, c)?),
            };
            let feed_forward = match &c.moe {
                Some(moe) if !moe.dense_layers.contains(&i) => {
                    let b = format!("{p}.{}", moe.block_name);
                    let experts = (0..moe.num_experts)
                        .map(|e| {
                            let names = moe.expert_names;
                            mlp(
                                tensor,
                                quantized,
                                &format!("{b}.experts.{e}"),
                                moe.expert_intermediate_size,
                                names,
                                c,
                            )
                        })
                        .collect::<Result<Vec<Mlp>>>()?;
                    let shared_expert = moe
                        .shared_expert
                        .map(|shared| -> Result<SharedExpert> {
                            let names = ["gate_proj", "up_proj", "down_proj"];
                            let name = format!("{b}.{}", shared.name);
                            Ok(SharedExpert {
                                name: shared.name,
                                mlp: mlp(tensor, quantized, &name, shared.intermediate_size, names, c)?,
                                gate: shared
                                    .gated
                                    .then(|| {
                                        let gate = format!("{b}.shared_expert_gate");
                                        linear(tensor, quantized, &gate, 1, hidden, false, false)
                                    })
                                    .transpose()?,
                            })
                        })
                        .transpose()?;
                    // A buffer: never trained, whatever the source made of it.
                    let correction_bias = match moe.scoring {
                        RouterScoring::GroupedSigmoid { .. } => {
                            Some(tensor(&format!("{b}.gate.e_score_correction_bias"), &[moe.num_experts])?.detach())
                        }
                        RouterScoring::Softmax => None,
                    };
                    FeedForward::Moe(Moe {
                        name: moe.block_name,
                        gate: linear(
                            tensor,
                            quantized,
                            &format!("{b}.gate"),
                            moe.num_experts,
                            hidden,
                            false,
                            false,
                        )?,
                        experts,
                        top_k: moe.top_k,
                        normalize_top_k: moe.normalize_top_k,
                        scoring: moe.scoring,
                        correction_bias,
                        routed_scaling_factor: moe.routed_scaling_factor,
                        shared_expert,
                    })
                }
                _ => FeedForward::Mlp(
                    mlp(tensor, quantized, &m, c.intermediate_size, c.mlp_names, c)?,
                    names.mlp,
                ),
            };
            // Which of the input and MLP-input norms (pre) and of the output norms (post) the layers have.
            let parallel = matches!(
                c.norm_placement,
                NormPlacement::Parallel | NormPlacement::ParallelTwoNorms
            );
            let (pre, post) = match c.norm_placement {
                NormPlacement::Pre | NormPlacement::Parallel | NormPlacement::ParallelTwoNorms => (true, false),
                NormPlacement::Post => (false, true),
                NormPlacement::Sandwich => (true, true),
            };
            let norm_names = [
                names.input_norm,
                "post_attention_layernorm",
                if post {
                    "pre_feedforward_layernorm"
                } else {
                    names.mlp_input_norm
                },
                "post_feedforward_layernorm",
            ];
            let mut norm = |on: bool, name: &str| -> Result<Option<Norm>> {
                on.then(|| block_norm(tensor, format!("{p}.{name}"), hidden, c))
                    .transpose()
            };
            let input_layernorm = norm(pre, norm_names[0])?;
            let attention_output_norm = norm(post, norm_names[1])?;
            let mlp_input_norm = norm(pre && c.norm_placement != NormPlacement::Parallel, norm_names[2])?;
            let mlp_output_norm = norm(post, norm_names[3])?;
            layers.push(DecoderLayer {
                input_layernorm,
                self_attn,
                attention_output_norm,
                mlp_input_norm,
                mlp: feed_forward,
                mlp_output_norm,
                norm_names,
                parallel,
                residual_multiplier: (c.residual_multiplier != 1.0).then_some(c.residual_multiplier),
            });
        }
        let embed_tokens = Embedding {
            weight: tensor(&embed_name, &[c.vocab_size, hidden])?,
            padding_idx: c.padding_idx,
        };
        let embed_positions = c
            .position_embeddings
            .then(|| -> Result<Embedding> {
                let name = format!("{}.{}.weight", names.model, names.positions);
                Ok(Embedding {
                    weight: tensor(&name, &[c.max_position_embeddings + c.position_offset, hidden])?,
                    padding_idx: None,
                })
            })
            .transpose()?;
        let embed_norm = c
            .embedding_norm
            .map(|name| block_norm(tensor, format!("{}.{name}", names.model), hidden, c))
            .transpose()?;
        let final_norm = block_norm(tensor, format!("{}.{}", names.model, names.final_norm), hidden, c)?;
        let lm_head = if c.tie_word_embeddings {
            // A tied head may still be held quantized (a GGUF file keeps the embedding matrix in a block format,
            // dequantized for lookups): the logits then read a quarter of the bytes.
            quantized(&embed_name, [c.vocab_size, hidden])?.map(|q| Linear {
                weight: LinearWeight::Quantized(q),
                bias: None,
                lora: None,
                transposed: false,
            })
        } else {
            Some(linear(
                tensor,
                quantized,
                names.head,
                c.vocab_size,
                hidden,
                c.lm_head_bias,
                false,
            )?)
        };
        Ok(CausalLm {
            config: c.clone(),
            embed_tokens,
            embed_positions,
            embed_norm,
            layers,
            norm: final_norm,
            lm_head,
            rotary: RotaryEmbedding::new(c.rotary_dim, &c.rope)?,
            sliding_rotary: c
                .sliding_rope
                .as_ref()
                .map(|rope| RotaryEmbedding::new(c.rotary_dim, rope))
                .transpose()?,
            adapter: None,
        })
    }

    /// The configuration the model was built from.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The device holding the parameters.
    pub fn device(&self) -> &Device {
        self.embed_tokens.weight.device()
    }

    /// The rotary frequencies.
    pub fn rotary(&self) -> &RotaryEmbedding {
        &self.rotary
    }

    /// An empty cache for `batch` sequences of up to `max_len` positions.
    pub fn new_cache(&self, batch: usize, max_len: usize) -> Result<KvCache> {
        let c = &self.config;
        KvCache::new(
            c.num_hidden_layers,
            batch,
            c.num_key_value_heads,
            c.head_dim,
            max_len,
            self.device(),
        )
    }

    /// Logits `[B, T, vocab]` (f32) for token ids `[B, T]` (u32 or i32). With a cache, the ids continue the
    /// sequences it holds (their positions start at `cache.len()`) and are appended to it.
    pub fn forward(&self, ids: &Tensor, cache: Option<&mut KvCache>) -> Result<Tensor> {
        let h = self.hidden_states(ids, cache)?;
        self.logits(&h)
    }

    /// The causal-LM loss of transformers: the mean cross-entropy of the logits at each position against the
    /// label of the next one, for token ids `[B, T]` and labels `[B, T]` (pass the ids again to train on every
    /// next token; i32 labels of -100, e.g. padding, are skipped).
    pub fn loss(&self, ids: &Tensor, labels: &Tensor) -> Result<Tensor> {
        if ids.rank() != 2 || labels.shape() != ids.shape() || ids.shape()[1] < 2 {
            return Err(Error::Invalid(format!(
                "loss: ids {:?} and labels {:?} must both be [batch, positions >= 2]",
                ids.shape(),
                labels.shape()
            )));
        }
        let (b, t) = (ids.shape()[0], ids.shape()[1]);
        let logits = self.forward(ids, None)?;
        // Position p is scored against label p + 1 and the last position against the ignored label, rather
        // than narrowing the logits: the backward of a narrow pads the gradient of the whole `[B, T, vocab]`
        // logits with zeros (one extra pass over the largest tensor of the step), while an ignored label's
        // gradient row is written as zeros by the loss kernel itself.
        let next = labels.narrow(1, 1, t - 1)?.to_dtype(DType::I32)?;
        let ignored = Tensor::from_slice(&vec![IGNORE_INDEX; b], &[b, 1], logits.device())?;
        Ok(logits.cross_entropy(&Tensor::cat(&[next, ignored], 1)?)?)
    }

    /// Logits `[B, vocab]` of the last position only: what generation needs, without the output projection of
    /// every prompt position.
    pub fn forward_last(&self, ids: &Tensor, cache: Option<&mut KvCache>) -> Result<Tensor> {
        let (x, normed) = self.final_stream(ids, cache)?;
        let t = x.shape()[1];
        let last = |h: &Tensor| -> Result<Tensor> { Ok(h.narrow(1, t - 1, 1)?.squeeze(1)?) };
        match (self.head(), normed) {
            // The final norm runs inside the head's launch.
            (Some(head), None) => self.scale_logits(head.forward_fused(&last(&x)?, Some(&self.norm), None, None)?),
            (_, Some(normed)) => self.logits(&last(&normed)?),
            (None, None) => self.logits(&last(&self.norm.forward(&x)?)?),
        }
    }

    /// The final-norm hidden states `[B, T, hidden]`.
    pub fn hidden_states(&self, ids: &Tensor, cache: Option<&mut KvCache>) -> Result<Tensor> {
        match self.final_stream(ids, cache)? {
            (_, Some(normed)) => Ok(normed),
            (x, None) => Ok(self.norm.forward(&x)?),
        }
    }

    /// The residual stream after the last layer, with its final norm when the layers already computed it (the
    /// unfused path adds the last residual and norms in one kernel; the fused path leaves the norm to the head).
    fn final_stream(&self, ids: &Tensor, cache: Option<&mut KvCache>) -> Result<(Tensor, Option<Tensor>)> {
        if ids.rank() != 2 || ids.shape()[1] == 0 {
            return Err(Error::Invalid(format!(
                "forward: ids must be [batch, tokens] with at least one token, got {:?}",
                ids.shape()
            )));
        }
        let (b, t) = (ids.shape()[0], ids.shape()[1]);
        let start = cache.as_ref().map_or(0, |c| c.len());
        if let Some(c) = &cache {
            if c.batch() != b || start + t > c.max_len() {
                return Err(Error::Invalid(format!(
                    "forward: {t} new positions of {b} sequences do not fit a cache of batch {} holding {start} of \
                     {} positions",
                    c.batch(),
                    c.max_len()
                )));
            }
            if c.layers() != self.layers.len() {
                return Err(Error::Invalid(format!(
                    "forward: the cache has {} layers, the model {}",
                    c.layers(),
                    self.layers.len()
                )));
            }
        }
        let c = &self.config;
        let scale = c.attention_multiplier.unwrap_or(1.0 / (c.head_dim as f64).sqrt());
        // Each layer attends with or without the sliding window (hybrid models mix them), rotates its queries
        // and keys or not (SmolLM3's and EXAONE 4's layers without rotary) and scales its scores (GPT-2's scale
        // by inverse layer index): one context per kind present.
        let kind_of = |i: usize| {
            let window = c.sliding_window.filter(|_| !c.full_attention_layers.contains(&i));
            let layer_scale = if c.attention_scale_by_inverse_layer {
                scale / (i + 1) as f64
            } else {
                scale
            };
            (window, !c.nope_layers.contains(&i), layer_scale)
        };
        let mut kinds: Vec<(Option<usize>, bool, f64)> = Vec::new();
        let layer_kinds: Vec<usize> = (0..self.layers.len())
            .map(|i| {
                let kind = kind_of(i);
                kinds.iter().position(|&k| k == kind).unwrap_or_else(|| {
                    kinds.push(kind);
                    kinds.len() - 1
                })
            })
            .collect();
        // The rotary table a kind reads: identity (no rotary), the sliding layers' own (OLMo 3, Gemma 3), or the
        // model's.
        let table_of = |&(window, rotary, _): &(Option<usize>, bool, f64)| match (rotary, &self.sliding_rotary) {
            (false, _) => 0,
            (true, Some(_)) if window.is_some() => 1,
            _ => 2,
        };
        // Built on first use and shared by the kinds that read the same table at the same scale.
        let mut tables: Vec<((usize, f64), RopeTables)> = Vec::new();
        let contexts = kinds
            .iter()
            .map(|kind @ &(window, _, layer_scale)| -> Result<AttentionContext> {
                let at = (table_of(kind), layer_scale);
                let tables = match tables.iter().find(|(key, _)| *key == at) {
                    Some((_, built)) => built.clone(),
                    None => {
                        let built = match (at.0, &self.sliding_rotary) {
                            (0, _) => self.rotary.identity_tables(t, layer_scale, self.device())?,
                            (1, Some(sliding)) => sliding.device_tables(start, t, layer_scale, self.device())?,
                            _ => self.rotary.device_tables(start, t, layer_scale, self.device())?,
                        };
                        tables.push((at, built.clone()));
                        built
                    }
                };
                // With a cache, keys no query of this step can see are left out of the product entirely.
                let key_start = match (&cache, window) {
                    (Some(_), Some(w)) => (start + 1).saturating_sub(w),
                    _ => 0,
                };
                let (q_start, k_start) = if cache.is_some() { (start, key_start) } else { (0, 0) };
                let ctx = AttentionContext::new(tables, q_start, k_start, window, layer_scale);
                Ok(match c.alibi {
                    Some(form) => ctx.with_alibi(form, alibi_slopes(c.num_attention_heads)),
                    None => ctx,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let ctx_of = |i: usize| &contexts[layer_kinds[i]];
        let mut x = self.embed_tokens.forward(ids)?;
        if c.embedding_multiplier != 1.0 {
            x = x.mul_scalar(c.embedding_multiplier)?;
        }
        if let Some(positions) = &self.embed_positions {
            let (table, offset) = (positions.weight.shape()[0], c.position_offset);
            if start + t + offset > table {
                return Err(Error::Invalid(format!(
                    "forward: positions {start}..{} pass the {} of the model's position embeddings",
                    start + t,
                    table.saturating_sub(offset)
                )));
            }
            let at: Vec<u32> = (start + offset..start + offset + t).map(|p| p as u32).collect();
            x = x.add(&positions.forward(&Tensor::from_slice(&at, &[t], self.device())?)?)?;
        }
        if let Some(norm) = &self.embed_norm {
            x = norm.forward(&x)?;
        }
        let normed = if !self.layers.is_empty() && self.layers.iter().all(DecoderLayer::fuses) {
            for (i, layer) in self.layers.iter().enumerate() {
                x = layer.forward_fused(&x, ctx_of(i), cache.as_deref().map(|c| (c, i)))?;
            }
            None
        } else {
            // The norm before layer i: its input norm (none in a post-norm layer), the final norm after the last.
            let norm_before = |i: usize| {
                self.layers
                    .get(i)
                    .map_or(Some(&self.norm), |l| l.input_layernorm.as_ref())
            };
            let mut normed = match norm_before(0) {
                Some(n) => n.forward(&x)?,
                None => x.clone(),
            };
            for (i, layer) in self.layers.iter().enumerate() {
                let next_norm = norm_before(i + 1);
                (x, normed) = layer.forward(&x, &normed, next_norm, ctx_of(i), cache.as_deref().map(|c| (c, i)))?;
            }
            Some(normed)
        };
        if let Some(c) = cache {
            c.advance(t);
        }
        Ok((x, normed))
    }

    /// Logits `[..., vocab]` of final hidden states: `lm_head`, or the embedding matrix when tied (divided by
    /// Granite's `logits_scaling`, times Cohere's `logit_scale`, soft-capped by Gemma 2's `final_logit_softcapping`).
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let logits = match self.head() {
            Some(head) => head.forward(hidden)?,
            None => hidden.matmul(&self.embed_tokens.weight.t()?)?,
        };
        self.scale_logits(logits)
    }

    fn scale_logits(&self, logits: Tensor) -> Result<Tensor> {
        let logits = match self.config.logits_scaling {
            s if s != 1.0 => logits.div_scalar(s)?,
            _ => logits,
        };
        let logits = match self.config.logit_scale {
            s if s != 1.0 => logits.mul_scalar(s)?,
            _ => logits,
        };
        match self.config.final_logit_softcap {
            Some(c) => Ok(logits.div_scalar(c)?.tanh()?.mul_scalar(c)?),
            None => Ok(logits),
        }
    }

    /// The output projection: `lm_head`, unless it is a frozen copy of a tied embedding that now trains.
    fn head(&self) -> Option<&Linear> {
        match &self.lm_head {
            Some(_) if self.config.tie_word_embeddings && self.embed_tokens.weight.requires_grad() => None,
            head => head.as_ref(),
        }
    }

    /// The linear layers with their module paths (`model.layers.0.self_attn.q_proj`, ..., `lm_head`), the
    /// names PEFT targets adapters by.
    pub fn linears(&self) -> Vec<(String, &Linear)> {
        let mut v = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            v.extend(prefixed(&self.config.names.layer(i), layer.linears()));
        }
        if let Some(head) = &self.lm_head {
            v.push((HEAD_MODULE.to_string(), head));
        }
        v
    }

    /// Whether PEFT's `all-linear` leaves out the layer at `path`, as it does with transformers 5: the output head,
    /// and a mixture of experts' router and routed experts (parameters there, not linear modules).
    pub(crate) fn outside_all_linear(&self, path: &str) -> bool {
        if path == HEAD_MODULE {
            return true;
        }
        self.config.moe.as_ref().is_some_and(|moe| {
            let block = format!(".{}.", moe.block_name);
            path.split_once(&block)
                .is_some_and(|(_, inner)| inner == "gate" || inner.starts_with("experts."))
        })
    }

    /// [`CausalLm::linears`], mutable.
    pub fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        let mut v = Vec::new();
        let names = self.config.names;
        for (i, layer) in self.layers.iter_mut().enumerate() {
            v.extend(prefixed(&names.layer(i), layer.linears_mut()));
        }
        if let Some(head) = &mut self.lm_head {
            v.push((HEAD_MODULE.to_string(), head));
        }
        v
    }

    /// Stacks Q/K/V and gate/up anew from the layers' current weights (after weights were replaced: merged
    /// adapters, another dtype), so that inference runs them as one product again and the old stacks are freed.
    pub(crate) fn restack(&mut self) -> Result<()> {
        for layer in &mut self.layers {
            layer.self_attn.restack()?;
            match &mut layer.mlp {
                FeedForward::Mlp(m, _) => m.restack()?,
                FeedForward::Moe(moe) => {
                    for expert in &mut moe.experts {
                        expert.restack()?;
                    }
                    if let Some(shared) = &mut moe.shared_expert {
                        shared.mlp.restack()?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Every parameter with its exact Hugging Face name (`model.layers.0.self_attn.q_proj.weight`, ...); a tied
    /// output head is listed once, as `model.embed_tokens.weight`.
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        let names = self.config.names;
        let mut p = prefixed(&names.embedding(), self.embed_tokens.parameters());
        if let Some(positions) = &self.embed_positions {
            p.extend(prefixed(
                &format!("{}.{}", names.model, names.positions),
                positions.parameters(),
            ));
        }
        if let (Some(norm), Some(name)) = (&self.embed_norm, self.config.embedding_norm) {
            p.extend(prefixed(&format!("{}.{name}", names.model), norm.parameters()));
        }
        for (i, layer) in self.layers.iter().enumerate() {
            p.extend(prefixed(&names.layer(i), layer.parameters()));
        }
        p.extend(prefixed(
            &format!("{}.{}", names.model, names.final_norm),
            self.norm.parameters(),
        ));
        if let Some(head) = &self.lm_head {
            p.extend(prefixed(names.head, head.parameters()));
        }
        p
    }

    /// The tensors a checkpoint holds beside the parameters, which training leaves alone (DeepSeek-V3's
    /// `e_score_correction_bias`), with their Hugging Face names.
    pub fn buffers(&self) -> Vec<(String, Tensor)> {
        let names = self.config.names;
        let mut b = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            if let FeedForward::Moe(moe) = &layer.mlp {
                b.extend(prefixed(&format!("{}.{}", names.layer(i), moe.name), moe.buffers()));
            }
        }
        b
    }

    /// Elements in [`CausalLm::parameters`] (what model cards call the parameter count).
    pub fn parameter_count(&self) -> usize {
        self.parameters().iter().map(|(_, p)| p.numel()).sum()
    }
}

/// Source of named parameter tensors for [`CausalLm::build`].
type TensorSource<'a> = &'a mut dyn FnMut(&str, &[usize]) -> Result<Tensor>;

/// Source of quantized linear weights for [`CausalLm::build_with`] (`None`: take the dense tensor).
pub type QuantSource<'a> = &'a mut dyn FnMut(&str, [usize; 2]) -> Result<Option<QTensor>>;

/// The query, key, value and output projections (separate, or views of one fused matrix) and the q/k norms of
/// the attention module `a` (`model.layers.N.self_attn`).
fn standard_attention(tensor: TensorSource, quantized: QuantSource, a: &str, c: &ModelConfig) -> Result<Attention> {
    let (hidden, d) = (c.hidden_size, c.head_dim);
    let (h, kvh) = (c.num_attention_heads, c.num_key_value_heads);
    let [q_name, k_name, v_name, o_name] = c.attention_names;
    // Separate q/k/v projections stacked for inference, or the views of one fused checkpoint matrix.
    let (q_proj, k_proj, v_proj, qkv) = match c.fused_qkv {
        Some((name, layout)) => {
            let rows = [h * d, kvh * d, kvh * d];
            let fused = linear(
                tensor,
                quantized,
                &format!("{a}.{name}"),
                rows.iter().sum(),
                hidden,
                c.attention_bias,
                c.conv1d,
            )?;
            let [q, k, v] = qkv_views(&fused, layout, rows)?;
            (q, k, v, Some(fused))
        }
        None => {
            let mut q = linear(
                tensor,
                quantized,
                &format!("{a}.{q_name}"),
                h * d,
                hidden,
                c.attention_bias,
                c.conv1d,
            )?;
            let mut k = linear(
                tensor,
                quantized,
                &format!("{a}.{k_name}"),
                kvh * d,
                hidden,
                c.attention_bias,
                c.conv1d,
            )?;
            let mut v = linear(
                tensor,
                quantized,
                &format!("{a}.{v_name}"),
                kvh * d,
                hidden,
                c.attention_bias,
                c.conv1d,
            )?;
            let qkv = Linear::stack(&mut [&mut q, &mut k, &mut v])?;
            (q, k, v, qkv)
        }
    };
    let o_proj = linear(
        tensor,
        quantized,
        &format!("{a}.{o_name}"),
        hidden,
        h * d,
        c.o_proj_bias,
        c.conv1d,
    )?;
    let (q_norm, k_norm) = if c.qk_norm {
        // Per head with one weight (Qwen3) or a weight per head (Cohere's LayerNorm), or over the whole
        // projection (OLMo 2).
        let (q, k): (&[usize], &[usize]) = match (c.qk_norm_over_heads, c.qk_norm_per_head_layer) {
            (true, _) => (&[h * d], &[kvh * d]),
            (false, true) => (&[h, d], &[kvh, d]),
            (false, false) => (&[d], &[d]),
        };
        let [q_norm_name, k_norm_name] = c.qk_norm_names;
        (
            Some(qk_norm(tensor, format!("{a}.{q_norm_name}"), q, c)?),
            Some(qk_norm(tensor, format!("{a}.{k_norm_name}"), k, c)?),
        )
    } else {
        (None, None)
    };
    Ok(Attention {
        q_proj,
        k_proj,
        v_proj,
        o_proj,
        q_norm,
        k_norm,
        clip_qkv: c.clip_qkv,
        clip_after_norm: c.clip_after_qk_norm,
        softcap: c.attention_softcap,
        interleaved_rope: c.interleaved_rope,
        names: c.attention_names,
        fused_qkv: c.fused_qkv,
        norm_names: c.qk_norm_names,
        module: c.names.attention,
        rotary_dim: c.rotary_dim.next_multiple_of(2),
        num_heads: h,
        num_kv_heads: kvh,
        head_dim: d,
        qkv,
    })
}

/// The latent attention module `a` of DeepSeek-V3 (its latent norms keep RMSNorm's default epsilon 1e-6, as
/// transformers builds them, whatever `rms_norm_eps` says).
fn latent_attention(
    tensor: TensorSource,
    quantized: QuantSource,
    a: &str,
    c: &ModelConfig,
    m: LatentAttentionConfig,
) -> Result<LatentAttention> {
    let (hidden, h) = (c.hidden_size, c.num_attention_heads);
    let q_width = h * (m.nope_dim + m.rope_dim);
    let name = |part: &str| format!("{a}.{part}");
    let query = match m.q_lora_rank {
        None => LatentQuery::Full(linear(
            tensor,
            quantized,
            &name("q_proj"),
            q_width,
            hidden,
            false,
            false,
        )?),
        Some(rank) => LatentQuery::LowRank {
            q_a_proj: linear(
                tensor,
                quantized,
                &name("q_a_proj"),
                rank,
                hidden,
                c.attention_bias,
                false,
            )?,
            q_a_layernorm: Norm {
                eps: 1e-6,
                ..block_norm(tensor, name("q_a_layernorm"), rank, c)?
            },
            q_b_proj: linear(tensor, quantized, &name("q_b_proj"), q_width, rank, false, false)?,
        },
    };
    let (rank, rope) = (m.kv_lora_rank, m.rope_dim);
    let kv_a_proj_with_mqa = linear(
        tensor,
        quantized,
        &name("kv_a_proj_with_mqa"),
        rank + rope,
        hidden,
        c.attention_bias,
        false,
    )?;
    let kv_a_layernorm = Norm {
        eps: 1e-6,
        ..block_norm(tensor, name("kv_a_layernorm"), rank, c)?
    };
    let kv_b_proj = linear(
        tensor,
        quantized,
        &name("kv_b_proj"),
        h * (m.nope_dim + m.v_dim),
        rank,
        false,
        false,
    )?;
    let o_proj = linear(
        tensor,
        quantized,
        &name("o_proj"),
        hidden,
        h * m.v_dim,
        c.o_proj_bias,
        false,
    )?;
    Ok(LatentAttention {
        query,
        kv_a_proj_with_mqa,
        kv_a_layernorm,
        kv_b_proj,
        o_proj,
        num_heads: h,
        shape: m,
        interleaved_rope: c.interleaved_rope,
    })
}

/// The layer `name` (`name.weight`, and `name.bias` when `bias`) mapping `inp` features to `out`.
fn linear(
    tensor: TensorSource,
    quantized: QuantSource,
    name: &str,
    out: usize,
    inp: usize,
    bias: bool,
    transposed: bool,
) -> Result<Linear> {
    let weight_name = format!("{name}.weight");
    let shape = if transposed { [inp, out] } else { [out, inp] };
    let from_quantized = match transposed {
        true => None,
        false => quantized(&weight_name, [out, inp])?,
    };
    let weight = match from_quantized {
        Some(q) if q.shape() == [out, inp] => LinearWeight::Quantized(q),
        Some(q) => return Err(wrong_shape(&weight_name, &q.shape(), &[out, inp])),
        None => {
            let w = tensor(&weight_name, &shape)?;
            if w.shape() != shape {
                return Err(wrong_shape(&weight_name, w.shape(), &shape));
            }
            LinearWeight::Dense(w)
        }
    };
    Ok(Linear {
        weight,
        bias: if bias {
            Some(tensor(&format!("{name}.bias"), &[out])?)
        } else {
            None
        },
        lora: None,
        transposed,
    })
}

/// The MLP `name` (`name.gate_proj`, ... as `names` says) of width `width`: gated unless the config's MLPs are
/// plain; gate and up stacked for inference.
fn mlp(
    tensor: TensorSource,
    quantized: QuantSource,
    name: &str,
    width: usize,
    names: [&'static str; 3],
    c: &ModelConfig,
) -> Result<Mlp> {
    let [gate_name, up_name, down_name] = names;
    let hidden = c.hidden_size;
    let mut load = |part: &str, out: usize, inp: usize| {
        linear(
            tensor,
            quantized,
            &format!("{name}.{part}"),
            out,
            inp,
            c.mlp_bias,
            c.conv1d,
        )
    };
    let fused_gate_up = c.fused_gate_up.filter(|_| c.mlp_gated);
    let (gate_proj, up_proj, gate_up) = match fused_gate_up {
        Some(fused_name) => {
            let fused = load(fused_name, 2 * width, hidden)?;
            let mut parts = fused.split_rows(&[width, width])?;
            let up = parts.pop().expect("two parts");
            (parts.pop(), up, Some(fused))
        }
        None => {
            let mut gate = c.mlp_gated.then(|| load(gate_name, width, hidden)).transpose()?;
            let mut up = load(up_name, width, hidden)?;
            let stacked = match &mut gate {
                Some(g) => Linear::stack(&mut [g, &mut up])?,
                None => None,
            };
            (gate, up, stacked)
        }
    };
    let down_proj = load(down_name, hidden, width)?;
    Ok(Mlp {
        gate_proj,
        up_proj,
        down_proj,
        act: c.hidden_act,
        gate_up,
        fused_gate_up,
        names,
    })
}

/// The error for a parameter whose source gave another shape than the config implies.
fn wrong_shape(name: &str, got: &[usize], want: &[usize]) -> Error {
    Error::Invalid(format!("{name}: shape {got:?}, but the config implies {want:?}"))
}

/// The norm `name` of a block or the model's final norm (`name.weight`, `name.bias` as the config says).
fn block_norm(tensor: TensorSource, name: String, dim: usize, c: &ModelConfig) -> Result<Norm> {
    let mut param = |on: bool, part: &str| on.then(|| tensor(&format!("{name}.{part}"), &[dim])).transpose();
    Ok(Norm {
        kind: c.norm_kind,
        weight: param(c.norm_weight, "weight")?,
        bias: param(c.norm_bias, "bias")?,
        eps: c.rms_norm_eps,
        unit_offset: c.norm_unit_offset,
        head_weights: Vec::new(),
    })
}

/// The norm `name` of queries or keys (always with weights): an RMSNorm, or with `qk_norm_per_head_layer` a
/// LayerNorm of each head whose `[heads, head_dim]` weight is one parameter or, with `qk_norm_split`, one per head
/// (`name.norms.N.weight`), or with `qk_norm_shared_layer` one LayerNorm with a bias that every head shares.
fn qk_norm(tensor: TensorSource, name: String, shape: &[usize], c: &ModelConfig) -> Result<Norm> {
    let (weight, head_weights) = match (c.qk_norm_split, shape) {
        (true, &[heads, d]) => (
            None,
            (0..heads)
                .map(|i| tensor(&format!("{name}.norms.{i}.weight"), &[d]))
                .collect::<Result<Vec<_>>>()?,
        ),
        _ => (Some(tensor(&format!("{name}.weight"), shape)?), Vec::new()),
    };
    let bias = match c.qk_norm_shared_layer {
        true => Some(tensor(&format!("{name}.bias"), shape)?),
        false => None,
    };
    Ok(Norm {
        kind: if c.qk_norm_per_head_layer || c.qk_norm_shared_layer {
            NormKind::Layer
        } else {
            NormKind::Rms
        },
        weight,
        bias,
        eps: c.rms_norm_eps,
        unit_offset: c.norm_unit_offset,
        head_weights,
    })
}
