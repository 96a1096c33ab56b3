//! The model families Hierarchos runs, keyed by the `model_type` of `config.json`, each with how far it is
//! supported. Anything else fails closed, so a model that merely looks similar is never run with the wrong
//! architecture. `hierarchos archs` prints this table and ARCHITECTURES.md is generated from it (a test fails when
//! the file is stale).

use std::fmt::Write as _;
use std::path::Path;

use crate::error::{Error, Result};

/// The decoder families one generic decoder covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Llama 1-3 (incl. llama3 rope scaling, optional attention and MLP biases).
    Llama,
    /// Mistral (sliding-window attention).
    Mistral,
    /// Qwen2 / Qwen2.5 (bias on q, k and v).
    Qwen2,
    /// Qwen3 (per-head RMSNorm on queries and keys).
    Qwen3,
    /// IBM Granite 3 (multipliers on the embeddings, residual branches, attention scores and logits).
    Granite,
    /// SmolLM3 (layers without rotary embeddings).
    Smollm3,
    /// Gemma (RMSNorm scaled by `1 + weight`, embeddings times `sqrt(hidden_size)`, GeGLU MLP).
    Gemma,
    /// OLMo 2 (post-norm layers, RMSNorm over the whole q and k projections).
    Olmo2,
    /// EXAONE 4 (post-norm layers, per-head RMSNorm on queries and keys).
    Exaone4,
    /// OLMo (1): LayerNorm without parameters, optional clipping of q, k and v.
    Olmo,
    /// StarCoder2 (LayerNorm with bias, plain GELU MLP, biases everywhere).
    Starcoder2,
    /// Arcee AFM (plain ReLU² MLP).
    Arcee,
    /// ByteDance Seed-OSS (biases on q, k and v, the output projection's own bias flag).
    SeedOss,
    /// StableLM (LayerNorm with bias, partial rotary embeddings, optional q/k/v biases).
    Stablelm,
    /// Mixtral (Mistral with a mixture of experts in place of the MLP).
    Mixtral,
    /// Qwen1.5/Qwen2-MoE (experts plus a gated shared expert, q/k/v biases).
    Qwen2Moe,
    /// Qwen3-MoE (Qwen3's attention with a mixture of experts).
    Qwen3Moe,
    /// OLMoE (OLMo 2's whole-projection q/k norms in pre-norm layers, a mixture of experts).
    Olmoe,
    /// Ministral (Mistral sliding on the layers `layer_types` marks).
    Ministral,
    /// NVIDIA Nemotron (LayerNorm scaled by `1 + weight`, partial rotary, plain ReLU² MLP).
    Nemotron,
    /// OLMo 3 (OLMo 2 with sliding-window layers and per-layer-type rotary settings).
    Olmo3,
    /// Gemma 2 (Gemma with sandwich norms, soft-capped attention scores and logits, alternating windows).
    Gemma2,
    /// Gemma 3's text model (Gemma 2's sandwich norms, per-head q/k norms, local and global rotary bases).
    Gemma3Text,
    /// Cohere Command R (parallel block, LayerNorm without bias, interleaved rotary, scaled logits).
    Cohere,
    /// Microsoft Phi-1/1.5/2 (parallel block, LayerNorm with bias, partial rotary, biases everywhere).
    Phi,
    /// Microsoft Phi-3, Phi-3.5 and Phi-4-mini (Llama with fused q/k/v and gate/up checkpoint matrices).
    Phi3,
    /// EleutherAI GPT-NeoX and Pythia (parallel residual with two LayerNorms, partial rotary, fused q/k/v with
    /// heads interleaved).
    GptNeox,
    /// OpenAI GPT-2 (learned absolute positions, no rotary, LayerNorm with bias, `Conv1D` weights stored
    /// `[in, out]`, fused q/k/v).
    Gpt2,
    /// BigCode GPT-BigCode (StarCoder 1, SantaCoder): GPT-2 with linear layers and multi-query attention.
    GptBigcode,
    /// EleutherAI GPT-Neo (learned positions, unscaled scores, global and sliding-window layers alternating).
    GptNeo,
    /// EleutherAI GPT-J (parallel block with one LayerNorm, rotary on interleaved pairs of the first rotary_dim
    /// dimensions, a head with a bias).
    Gptj,
    /// TII Falcon (fused q/k/v grouped by key/value head, multi-query or grouped, parallel blocks with one or two
    /// LayerNorms).
    Falcon,
    /// BigScience BLOOM (ALiBi in place of rotary, a LayerNorm of the embeddings, fused q/k/v with heads
    /// interleaved).
    Bloom,
    /// Meta OPT (learned positions offset by 2, pre-norm LayerNorms with bias, a ReLU MLP fc1 -> fc2).
    Opt,
    /// THUDM GLM-4 (chat-hf): interleaved partial rotary, q/k/v biases, fused gate/up.
    Glm,
    /// DeepSeek-V3 (and DeepSeek-V2-Lite-style configs of it): multi-head latent attention, a mixture of experts
    /// with group-limited sigmoid routing and shared experts.
    DeepseekV3,
}

/// How far a family is supported, each level including the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    /// `config.json` parses and every tensor of a checkpoint maps to a parameter.
    Registered,
    /// Forward, generation and training run.
    Executes,
    /// Logits, greedy generation and two AdamW steps match transformers' float64 references on a tiny model of
    /// the family (the fixtures named in its [`Architecture`], checked by the parity tests in CI).
    Validated,
}

impl Status {
    /// The lower-case name `hierarchos archs` prints.
    pub fn name(self) -> &'static str {
        match self {
            Status::Registered => "registered",
            Status::Executes => "executes",
            Status::Validated => "validated",
        }
    }
}

/// One supported `model_type`: its family, status, and the evidence for it.
#[derive(Clone, Copy, Debug)]
pub struct Architecture {
    /// The family (and with it the `model_type`).
    pub family: Family,
    /// How far it is supported.
    pub status: Status,
    /// The fixtures under `tests/fixtures/` (made by `scripts/make_fixtures.py`) whose parity tests validate it;
    /// every validated family has at least one, and the parity tests run exactly these.
    pub fixtures: &'static [&'static str],
    /// What the family adds to the plain Llama decoder, as the options of the one generic decoder.
    pub features: &'static str,
    /// What keeps a family that has fixtures from being validated (the part of the parity that fails).
    pub gap: Option<&'static str>,
}

/// Every supported architecture, in the order errors and `hierarchos archs` list them.
pub const ARCHITECTURES: [Architecture; 36] = [
    Architecture {
        family: Family::Llama,
        status: Status::Validated,
        fixtures: &["llama", "llama3_tied"],
        features: "RMSNorm, rotary (default, linear, dynamic, llama3, yarn scaling), gated SiLU MLP, GQA, optional \
                   attention and MLP biases, tied or separate head",
        gap: None,
    },
    Architecture {
        family: Family::Mistral,
        status: Status::Validated,
        fixtures: &["mistral"],
        features: "sliding-window attention on every layer",
        gap: None,
    },
    Architecture {
        family: Family::Qwen2,
        status: Status::Validated,
        fixtures: &["qwen2"],
        features: "biases on q, k and v; with use_sliding_window, a sliding window from layer max_window_layers on",
        gap: None,
    },
    Architecture {
        family: Family::Qwen3,
        status: Status::Validated,
        fixtures: &["qwen3"],
        features: "per-head RMSNorm on queries and keys before rotary, explicit head_dim",
        gap: None,
    },
    Architecture {
        family: Family::Granite,
        status: Status::Validated,
        fixtures: &["granite"],
        features: "embedding_multiplier, residual_multiplier (on each attention and MLP output), \
                   attention_multiplier (the score scale), logits divided by logits_scaling",
        gap: None,
    },
    Architecture {
        family: Family::Smollm3,
        status: Status::Validated,
        fixtures: &["smollm3"],
        features: "no rotary embedding on the layers no_rope_layers marks (by default every fourth)",
        gap: None,
    },
    Architecture {
        family: Family::Gemma,
        status: Status::Executes,
        fixtures: &["gemma"],
        features: "RMSNorm scaled by 1 + weight, embeddings times sqrt(hidden_size) (rounded to f32), gated \
                   tanh-GELU MLP, explicit head_dim, tied head",
        gap: Some(
            "logits and greedy generation match; two damped AdamW steps land 3.05e-7 from the float64 reference \
             on one embedding row (bound 2.5e-7; PyTorch's own f32 1.57e-7)",
        ),
    },
    Architecture {
        family: Family::Olmo2,
        status: Status::Validated,
        fixtures: &["olmo2"],
        features: "post-norm layers (each attention and MLP output normed before its residual add, no input \
                   norm), RMSNorm over the whole q and k projections before the heads split",
        gap: None,
    },
    Architecture {
        family: Family::Exaone4,
        status: Status::Validated,
        fixtures: &["exaone4", "exaone4_hybrid"],
        features: "post-norm layers (as OLMo 2) with per-head RMSNorm on queries and keys (as Qwen3); hybrid \
                   models slide on the layers layer_types marks, their global layers without rotary",
        gap: None,
    },
    Architecture {
        family: Family::Olmo,
        status: Status::Validated,
        fixtures: &["olmo"],
        features: "LayerNorm without weight or bias (eps 1e-5) in place of RMSNorm, q, k and v clamped to \
                   [-clip_qkv, clip_qkv] when set",
        gap: None,
    },
    Architecture {
        family: Family::Starcoder2,
        status: Status::Validated,
        fixtures: &["starcoder2"],
        features: "LayerNorm with weight and bias (norm_epsilon), a plain MLP c_fc -> tanh GELU -> c_proj, biases \
                   on every projection (use_bias), sliding window on every layer when set",
        gap: None,
    },
    Architecture {
        family: Family::Arcee,
        status: Status::Validated,
        fixtures: &["arcee"],
        features: "a plain MLP up_proj -> ReLU² (relu2) -> down_proj",
        gap: None,
    },
    Architecture {
        family: Family::SeedOss,
        status: Status::Validated,
        fixtures: &["seed_oss"],
        features: "biases on q, k and v (attention_bias), on the output projection only with attention_out_bias; \
                   the residual and attention dropout of training are not applied",
        gap: None,
    },
    Architecture {
        family: Family::Stablelm,
        status: Status::Validated,
        fixtures: &["stablelm", "stablelm_parallel"],
        features: "LayerNorm with weight and bias (layer_norm_eps), rotary on the first partial_rotary_factor of \
                   each head (default 0.25), q/k/v biases with use_qkv_bias; StableLM 2 12B's parallel residual \
                   (use_parallel_residual) and LayerNorm of each query and key head with its own weight \
                   (qk_layernorm)",
        gap: None,
    },
    Architecture {
        family: Family::Mixtral,
        status: Status::Validated,
        fixtures: &["mixtral"],
        features: "a mixture of experts in place of the MLP: a router picks num_experts_per_tok of \
                   num_local_experts gated SiLU experts per token (softmax, top-k, renormalized); sliding window \
                   when set; experts in the Hub's block_sparse_moe.experts.N.w1/w2/w3 layout; the router's \
                   load-balancing loss (output_router_logits) and router noise, which inference ignores, stop \
                   training at its start",
        gap: None,
    },
    Architecture {
        family: Family::Qwen2Moe,
        status: Status::Validated,
        fixtures: &["qwen2_moe"],
        features: "experts (softmax, top-k, renormalized only with norm_topk_prob) plus a shared expert scaled by \
                   a sigmoid gate, q/k/v biases (qkv_bias), dense MLP layers by mlp_only_layers and \
                   decoder_sparse_step",
        gap: None,
    },
    Architecture {
        family: Family::Qwen3Moe,
        status: Status::Validated,
        fixtures: &["qwen3_moe"],
        features: "Qwen3's per-head q/k RMSNorm with experts (moe_intermediate_size, norm_topk_prob), dense MLP \
                   layers by mlp_only_layers and decoder_sparse_step",
        gap: None,
    },
    Architecture {
        family: Family::Olmoe,
        status: Status::Validated,
        fixtures: &["olmoe"],
        features: "pre-norm layers with RMSNorm over the whole q and k projections (as OLMo 2), q, k and v \
                   clamped after those norms when clip_qkv is set, experts (norm_topk_prob)",
        gap: None,
    },
    Architecture {
        family: Family::Ministral,
        status: Status::Validated,
        fixtures: &["ministral"],
        features: "Mistral's attention sliding only on the layers layer_types marks (all of them when it is absent \
                   and sliding_window is set)",
        gap: None,
    },
    Architecture {
        family: Family::Nemotron,
        status: Status::Validated,
        fixtures: &["nemotron"],
        features: "LayerNorm with bias scaled by 1 + weight (LayerNorm1P, norm_eps), rotary on the first \
                   partial_rotary_factor of each head (default 0.5), a plain MLP up_proj -> ReLU² -> down_proj",
        gap: None,
    },
    Architecture {
        family: Family::Olmo3,
        status: Status::Validated,
        fixtures: &["olmo3"],
        features: "OLMo 2's post-norm layers and whole-projection q/k norms, sliding windows on the layers \
                   layer_types marks (by default three of every four), rotary settings per layer type (the \
                   classic rope_scaling scales the full-attention layers only)",
        gap: None,
    },
    Architecture {
        family: Family::Gemma2,
        status: Status::Executes,
        fixtures: &["gemma2"],
        features: "Gemma's norms, embeddings and GELU MLP with sandwich norms (input, post-attention, \
                   pre- and post-feedforward), attention scores soft-capped by tanh (attn_logit_softcapping; the \
                   composed attention runs them), final logits soft-capped (final_logit_softcapping), score scale \
                   query_pre_attn_scalar^-1/2, sliding window on every other layer",
        gap: Some(
            "logits, greedy generation and the adapter's AdamW steps match; two damped AdamW steps land 3.38e-7 \
             from the float64 reference on the embedding (bound 2.5e-7; PyTorch's own f32 1.28e-7): as Gemma's, \
             the gradients are as close to float64 as PyTorch's, but the few embedding entries whose gradient is \
             near the damping epsilon pass their rounding straight into the update",
        ),
    },
    Architecture {
        family: Family::Gemma3Text,
        status: Status::Validated,
        fixtures: &["gemma3_text"],
        features: "Gemma 2's layers with per-head q/k RMSNorm (1 + weight), final logits soft-capped only when \
                   set (attention scores never: transformers ignores attn_logit_softcapping for Gemma 3), sliding \
                   layers (five of every six by default) with their own rotary base (rope_local_base_freq or \
                   per-layer-type rope_parameters), the full-attention layers' rope scaling",
        gap: None,
    },
    Architecture {
        family: Family::Cohere,
        status: Status::Validated,
        fixtures: &["cohere", "cohere_qk_norm"],
        features: "a parallel block (attention and MLP both read the one input norm, both added to the residual), \
                   LayerNorm with weight and no bias (layer_norm_eps), rotary on interleaved pairs of dimensions, \
                   logits multiplied by logit_scale, tied head; with use_qk_norm (Command R+), a LayerNorm of each \
                   query and key head with a weight per head",
        gap: None,
    },
    Architecture {
        family: Family::Phi,
        status: Status::Validated,
        fixtures: &["phi", "phi_qk_layernorm"],
        features: "a parallel block, LayerNorm with weight and bias, rotary on the first partial_rotary_factor of \
                   each head (default 0.5), biases on every projection and the head, a plain MLP fc1 -> tanh GELU \
                   -> fc2, the output projection named dense and the final norm final_layernorm; with qk_layernorm, \
                   one LayerNorm with weight and bias that every query head shares and another for the keys",
        gap: None,
    },
    Architecture {
        family: Family::Phi3,
        status: Status::Validated,
        fixtures: &["phi3", "phi3_longrope"],
        features: "q, k and v in one checkpoint matrix (qkv_proj) and gate and up in another (gate_up_proj), each \
                   computed as one product and adapted as one layer; sliding window on every layer when set, \
                   partial_rotary_factor (Phi-4-mini); the LongRoPE of the 128k models, Phi-3.5 and Phi-4-mini \
                   (short factors within the pretraining length, long ones past it, chosen per forward as \
                   transformers does, and the cache computed again when generation passes that length); the \
                   residual dropout of training is not applied",
        gap: None,
    },
    Architecture {
        family: Family::GptNeox,
        status: Status::Validated,
        fixtures: &["gpt_neox", "gpt_neox_sequential", "gpt_neox_odd_rotary"],
        features: "the parallel residual (use_parallel_residual: attention and MLP each with its own LayerNorm of \
                   the layer's input, both added to it), LayerNorm with weight and bias, rotary on the first \
                   rotary_pct of each head (default 0.25; an odd number rotates one more), q, k and v in one \
                   matrix with each head's rows together (query_key_value), biases everywhere, a plain GELU MLP, \
                   the gpt_neox.* and embed_out names",
        gap: None,
    },
    Architecture {
        family: Family::Gpt2,
        status: Status::Validated,
        fixtures: &["gpt2", "gpt2_inverse_layer_scale"],
        features: "learned absolute position embeddings (wpe) added to the token embeddings and no rotary, \
                   LayerNorm with weight and bias (ln_1, ln_2, ln_f), Conv1D weights kept as stored ([in, out]), \
                   q, k and v in one matrix (c_attn), a plain tanh-GELU MLP (c_fc, c_proj), biases everywhere, \
                   tied head, the transformer.h.N names and the n_embd / n_layer / n_head / n_positions / n_inner \
                   keys; scale_attn_weights false leaves the scores unscaled, scale_attn_by_inverse_layer_idx \
                   divides layer i's by i + 1",
        gap: None,
    },
    Architecture {
        family: Family::GptBigcode,
        status: Status::Validated,
        fixtures: &["gpt_bigcode"],
        features: "GPT-2's layout with linear layers (weights [out, in]): learned absolute positions (wpe), \
                   LayerNorms ln_1 / ln_2 / ln_f with bias, a tanh-GELU MLP c_fc -> c_proj, biases everywhere, tied \
                   head; multi_query (one key/value head, c_attn holding q, k and v as blocks) or one key/value \
                   head per query head (c_attn with each head's rows together); scale_attn_weights false leaves \
                   the scores unscaled",
        gap: None,
    },
    Architecture {
        family: Family::GptNeo,
        status: Status::Validated,
        fixtures: &["gpt_neo"],
        features: "learned absolute positions (wpe), scores not scaled by 1/sqrt(head_dim), global layers and \
                   local ones attending to the last window_size positions as attention_layers (or attention_types) \
                   says, q, k and v without biases and out_proj with one (attn.attention), LayerNorms ln_1 / ln_2 / \
                   ln_f with bias, a tanh-GELU MLP c_fc -> c_proj (4 x hidden unless intermediate_size), tied head, \
                   the num_layers / num_heads keys",
        gap: None,
    },
    Architecture {
        family: Family::Gptj,
        status: Status::Validated,
        fixtures: &["gptj"],
        features: "a parallel block (attention and MLP both read ln_1, both added to the residual), rotary on \
                   interleaved pairs of the first rotary_dim dimensions of each head (base 10000), q, k, v and \
                   out_proj without biases, a tanh-GELU MLP fc_in -> fc_out with biases, LayerNorms with bias, \
                   an untied head with a bias, the n_embd / n_layer / n_head / n_positions keys (positions past \
                   n_positions rotate on, where transformers' table ends); a tied head fails closed",
        gap: None,
    },
    Architecture {
        family: Family::Falcon,
        status: Status::Validated,
        fixtures: &["falcon", "falcon_new", "falcon_alibi"],
        features: "q, k and v in one matrix grouped by key/value head (multi_query: one key/value head; the new \
                   decoder architecture: num_kv_heads), a parallel block with one LayerNorm (Falcon-7B) or two \
                   (ln_attn, ln_mlp) or a sequential block (parallel_attn false), LayerNorm with bias, biases as \
                   bias says, a plain GELU MLP (ffn_hidden_size), the transformer.h.N.self_attention names; with \
                   alibi (Falcon-RW), ALiBi biases in place of rotary, formed in bf16 as transformers forms them \
                   (its composed attention path, not the fused kernels)",
        gap: None,
    },
    Architecture {
        family: Family::Bloom,
        status: Status::Validated,
        fixtures: &["bloom"],
        features: "ALiBi in place of rotary (the slopes times the key's position in f32, added after the score \
                   scale; the composed attention path), a LayerNorm of the embeddings \
                   (word_embeddings_layernorm), q, k and v in one matrix with each head's rows together \
                   (query_key_value), LayerNorm with bias, biases everywhere, a tanh-GELU MLP 4 x hidden \
                   (dense_h_to_4h, dense_4h_to_h), tied head, the transformer.h.N.self_attention names and the \
                   n_layer / n_head / n_embed keys; apply_residual_connection_post_layernorm fails closed",
        gap: None,
    },
    Architecture {
        family: Family::Opt,
        status: Status::Validated,
        fixtures: &["opt"],
        features: "learned absolute positions (embed_positions, max_position_embeddings + 2 rows, row p + 2 for \
                   position p) added to the token embeddings and no rotary, pre-norm LayerNorms with bias \
                   (self_attn_layer_norm, final_layer_norm; layer_norm_elementwise_affine), q, k, v and out_proj \
                   and a plain MLP fc1 -> ReLU -> fc2 with biases as enable_bias says, tied head, the \
                   model.decoder.* names; the post-norm layers of OPT-350m (do_layer_norm_before false) and \
                   projected embeddings (word_embed_proj_dim) fail closed",
        gap: None,
    },
    Architecture {
        family: Family::Glm,
        status: Status::Validated,
        fixtures: &["glm"],
        features: "rotary on interleaved pairs of the first partial_rotary_factor of each head (default 0.5), \
                   biases on q, k and v (attention_bias), gate and up in one matrix (gate_up_proj), RMSNorm eps \
                   1.5625e-7 by default",
        gap: None,
    },
    Architecture {
        family: Family::DeepseekV3,
        status: Status::Validated,
        fixtures: &["deepseek_v3", "deepseek_v3_lite"],
        features: "multi-head latent attention: queries through a low-rank projection with an RMSNorm (q_lora_rank) \
                   or one q_proj, keys and values expanded per head from a normed latent (kv_lora_rank), one \
                   rotary key per position shared by all heads, rotary on interleaved pairs (rope_interleave), \
                   value heads of their own width, YaRN's mscale_all_dim in the softmax scale; a mixture of experts \
                   whose sigmoid router with a correction bias chooses among the best groups (n_group, topk_group), \
                   weights scaled by routed_scaling_factor, shared experts, dense first layers \
                   (first_k_dense_replace); the latent is not what the cache keeps (keys and values are)",
        gap: None,
    },
];

impl Family {
    /// The family of `model_type`; `path` names the config file in the error listing the supported types.
    pub fn from_model_type(model_type: &str, path: &Path) -> Result<Family> {
        ARCHITECTURES
            .iter()
            .map(|a| a.family)
            .find(|family| family.model_type() == model_type)
            .ok_or_else(|| Error::UnknownModelType {
                path: path.to_path_buf(),
                found: model_type.to_string(),
                supported: supported_model_types().join(", "),
            })
    }

    /// The `model_type` string of `config.json`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Mistral => "mistral",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Granite => "granite",
            Family::Smollm3 => "smollm3",
            Family::Gemma => "gemma",
            Family::Olmo2 => "olmo2",
            Family::Exaone4 => "exaone4",
            Family::Olmo => "olmo",
            Family::Starcoder2 => "starcoder2",
            Family::Arcee => "arcee",
            Family::SeedOss => "seed_oss",
            Family::Stablelm => "stablelm",
            Family::Mixtral => "mixtral",
            Family::Qwen2Moe => "qwen2_moe",
            Family::Qwen3Moe => "qwen3_moe",
            Family::Olmoe => "olmoe",
            Family::Ministral => "ministral",
            Family::Nemotron => "nemotron",
            Family::Olmo3 => "olmo3",
            Family::Gemma2 => "gemma2",
            Family::Gemma3Text => "gemma3_text",
            Family::Cohere => "cohere",
            Family::Phi => "phi",
            Family::Phi3 => "phi3",
            Family::GptNeox => "gpt_neox",
            Family::Gpt2 => "gpt2",
            Family::GptBigcode => "gpt_bigcode",
            Family::GptNeo => "gpt_neo",
            Family::Gptj => "gptj",
            Family::Falcon => "falcon",
            Family::Bloom => "bloom",
            Family::Opt => "opt",
            Family::Glm => "glm",
            Family::DeepseekV3 => "deepseek_v3",
        }
    }

    /// The family's entry in [`ARCHITECTURES`].
    pub fn architecture(self) -> &'static Architecture {
        ARCHITECTURES
            .iter()
            .find(|a| a.family == self)
            .expect("every family is registered")
    }
}

/// The supported `model_type`s, for help texts and errors.
pub fn supported_model_types() -> Vec<&'static str> {
    ARCHITECTURES.iter().map(|a| a.family.model_type()).collect()
}

/// The fixtures of every validated architecture: what all the parity tests run (logits, generation, training,
/// adapters).
pub fn validated_fixtures() -> Vec<&'static str> {
    ARCHITECTURES
        .iter()
        .filter(|a| a.status == Status::Validated)
        .flat_map(|a| a.fixtures.iter().copied())
        .collect()
}

/// The fixtures of every architecture, validated or not: the logits and generation parity tests run these too
/// (a family short of validation lists what it lacks in [`Architecture::gap`]).
pub fn all_fixtures() -> Vec<&'static str> {
    ARCHITECTURES.iter().flat_map(|a| a.fixtures.iter().copied()).collect()
}

/// ARCHITECTURES.md: the registry as a Markdown table, with how each status is earned.
pub fn markdown() -> String {
    let mut s = String::from(
        "# Architectures\n\n\
         Generated from `crates/hierarchos-nn/src/registry.rs` by `hierarchos archs --markdown`; a test fails when \
         this file is stale.\n\n\
         - **registered**: `config.json` parses and every tensor of a checkpoint maps to a parameter.\n\
         - **executes**: forward, generation and training run.\n\
         - **validated**: on a tiny random model of the family (`scripts/make_fixtures.py`, references from \
         transformers in float64), logits within 2e-5, identical greedy generations through the KV cache, and two \
         damped AdamW steps within 2.5e-7, in CI.\n\n\
         Any other `model_type` is refused with an error naming the supported ones.\n\n\
         | model_type | status | fixtures | what it adds to Llama | short of validation |\n|---|---|---|---|---|\n",
    );
    for a in &ARCHITECTURES {
        let fixtures: Vec<String> = a.fixtures.iter().map(|f| format!("`{f}`")).collect();
        let _ = writeln!(
            s,
            "| `{}` | {} | {} | {} | {} |",
            a.family.model_type(),
            a.status.name(),
            fixtures.join(", "),
            a.features,
            a.gap.unwrap_or("")
        );
    }
    let validated = ARCHITECTURES.iter().filter(|a| a.status == Status::Validated).count();
    let _ = writeln!(s, "\n{validated} of {} architectures validated.", ARCHITECTURES.len());
    s
}
