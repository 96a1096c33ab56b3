//! The model configuration, read from a Hugging Face `config.json`.

use std::path::Path;

use serde_json::{Map, Value};

use crate::alibi::Alibi;
use crate::error::{Error, Result};
use crate::norm::NormKind;
use crate::registry::Family;

/// Activation of the MLP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `silu` (Llama, Mistral, Qwen).
    Silu,
    /// `gelu` / `gelu_python` (exact).
    Gelu,
    /// The tanh approximation, under the names of transformers' several implementations of it:
    /// `gelu_pytorch_tanh`, `gelu_new`, `gelu_fast`, `gelu_accurate`, `gelu_python_tanh`.
    GeluTanh,
    /// `relu`.
    Relu,
    /// `relu2`: ReLU squared (Arcee).
    Relu2,
}

/// How rotary position frequencies are scaled for long contexts.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    Default,
    /// Positions divided by `factor`.
    Linear {
        /// Scale factor.
        factor: f64,
    },
    /// NTK-aware dynamic scaling once the sequence passes `original_max_position_embeddings`.
    Dynamic {
        /// Scale factor.
        factor: f64,
        /// The config's `max_position_embeddings`: transformers scales from there, whatever the block says.
        original_max_position_embeddings: usize,
    },
    /// Llama 3.1's frequency-band scaling.
    Llama3 {
        /// Scale factor.
        factor: f64,
        /// Low-frequency band factor.
        low_freq_factor: f64,
        /// High-frequency band factor.
        high_freq_factor: f64,
        /// Context length the model was trained with.
        original_max_position_embeddings: usize,
    },
    /// YaRN.
    Yarn {
        /// Scale factor.
        factor: f64,
        /// Context length the model was trained with.
        original_max_position_embeddings: usize,
        /// Fast boundary of the ramp (default 32).
        beta_fast: f64,
        /// Slow boundary of the ramp (default 1).
        beta_slow: f64,
        /// Attention temperature factor; `None` derives it from `factor` (0.1 ln(factor) + 1).
        attention_factor: Option<f64>,
    },
    /// LongRoPE (Phi-3 128k, Phi-3.5, Phi-4-mini): each frequency divided by its own factor, the short ones while
    /// the sequence fits the pretraining length and the long ones past it.
    LongRope {
        /// Per-frequency factors (rotated dimensions / 2 of them) within the pretraining length.
        short_factor: Vec<f64>,
        /// Per-frequency factors past it.
        long_factor: Vec<f64>,
        /// Context length the model was trained with.
        original_max_position_embeddings: usize,
        /// What the cosines and sines are multiplied by.
        attention_factor: f64,
    },
}

/// Rotary embedding settings.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    /// Base of the frequencies (`rope_theta`).
    pub theta: f64,
    /// Long-context scaling.
    pub scaling: RopeScaling,
}

/// The module names of a checkpoint around its layers: `{model}.embed_tokens`, `{model}.layers.N.{attention}`,
/// `{model}.{final_norm}`, `{head}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModuleNames {
    /// The decoder's module (`model`; GPT-NeoX: `gpt_neox`, GPT-2: `transformer`).
    pub model: &'static str,
    /// The token embedding inside it (`embed_tokens`; `embed_in`, `wte`).
    pub embed: &'static str,
    /// The learned position embedding inside it, where the model has one (GPT-2's `wpe`).
    pub positions: &'static str,
    /// The list of layers inside it (`layers`; GPT-2: `h`).
    pub layers: &'static str,
    /// A layer's input norm (`input_layernorm`; GPT-2: `ln_1`).
    pub input_norm: &'static str,
    /// A pre-norm layer's MLP-input norm (`post_attention_layernorm`; GPT-2: `ln_2`).
    pub mlp_input_norm: &'static str,
    /// The attention inside each layer (`self_attn`; `attention`).
    pub attention: &'static str,
    /// The MLP inside each layer (`mlp`; empty for OPT, whose `fc1` and `fc2` sit in the layer itself).
    pub mlp: &'static str,
    /// The final norm inside the decoder (`norm`; Phi's `final_layernorm`, GPT-NeoX's `final_layer_norm`).
    pub final_norm: &'static str,
    /// The output head (`lm_head`; `embed_out`).
    pub head: &'static str,
}

impl ModuleNames {
    /// The token embedding's module path (`model.embed_tokens`, GPT-2's `transformer.wte`).
    pub fn embedding(&self) -> String {
        format!("{}.{}", self.model, self.embed)
    }

    /// The token embedding's weight (`model.embed_tokens.weight`).
    pub fn embedding_weight(&self) -> String {
        format!("{}.weight", self.embedding())
    }

    /// The base model's module, whose name checkpoints of the bare base model leave out (`model`, GPT-2's
    /// `transformer`; OPT's `model` of `model.decoder`).
    pub fn base_module(&self) -> &'static str {
        self.model.split('.').next().unwrap_or(self.model)
    }

    /// The module path of layer `i` (`model.layers.3`, GPT-2's `transformer.h.3`).
    pub fn layer(&self, i: usize) -> String {
        format!("{}.{}.{i}", self.model, self.layers)
    }

    /// BLOOM's names, which Falcon's take over (but for its parallel norms).
    pub const BLOOM: ModuleNames = ModuleNames {
        model: "transformer",
        embed: "word_embeddings",
        layers: "h",
        attention: "self_attention",
        final_norm: "ln_f",
        ..ModuleNames::LLAMA
    };

    /// GPT-2's names, which GPT-BigCode's share and GPT-Neo's take over (but for its attention's path).
    pub const GPT2: ModuleNames = ModuleNames {
        model: "transformer",
        embed: "wte",
        positions: "wpe",
        layers: "h",
        attention: "attn",
        mlp: "mlp",
        input_norm: "ln_1",
        mlp_input_norm: "ln_2",
        final_norm: "ln_f",
        head: "lm_head",
    };

    /// Llama's names, which most families share.
    pub const LLAMA: ModuleNames = ModuleNames {
        model: "model",
        embed: "embed_tokens",
        positions: "embed_positions",
        layers: "layers",
        input_norm: "input_layernorm",
        mlp_input_norm: "post_attention_layernorm",
        attention: "self_attn",
        mlp: "mlp",
        final_norm: "norm",
        head: "lm_head",
    };
}

/// The row order of a fused q/k/v checkpoint matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkvLayout {
    /// All query rows, then all key rows, then all value rows (Phi-3).
    Blocks,
    /// Key/value head by key/value head: the rows of the query heads that share it, then its key rows and its
    /// value rows (Falcon; GPT-NeoX, with one query head per key/value head, is `q, k, v` head by head).
    Grouped,
}

/// Where a decoder layer norms its attention and MLP branches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormPlacement {
    /// The branches' inputs (Llama's `input_layernorm` and `post_attention_layernorm`).
    Pre,
    /// The branches' outputs, before their residual adds, with no input norms (OLMo 2's and EXAONE 4's
    /// `post_attention_layernorm` and `post_feedforward_layernorm`).
    Post,
    /// Both (Gemma 2's `input_layernorm`, `post_attention_layernorm`, `pre_feedforward_layernorm` and
    /// `post_feedforward_layernorm`).
    Sandwich,
    /// One input norm read by attention and MLP side by side, both outputs added to the residual stream
    /// (Cohere's and Phi's parallel block: `x + attn(norm(x)) + mlp(norm(x))`).
    Parallel,
    /// Attention and MLP side by side, each with its own input norm (GPT-NeoX's parallel residual:
    /// `x + attn(norm1(x)) + mlp(norm2(x))`).
    ParallelTwoNorms,
}

/// The shapes of multi-head latent attention (DeepSeek-V3): keys and values are expanded per head from one
/// compressed latent, and one rotary key is shared by all heads, so a checkpoint holds no per-head k/v projection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatentAttentionConfig {
    /// Rank of the queries' low-rank projection (`q_a_proj`, `q_a_layernorm`, `q_b_proj`); `None`: one `q_proj`.
    pub q_lora_rank: Option<usize>,
    /// Width of the normed key/value latent (`kv_lora_rank`).
    pub kv_lora_rank: usize,
    /// Query/key dimensions per head without rotary (`qk_nope_head_dim`).
    pub nope_dim: usize,
    /// Query/key dimensions per head that rotate (`qk_rope_head_dim`); the key's are shared by all heads.
    pub rope_dim: usize,
    /// Value dimensions per head (`v_head_dim`).
    pub v_dim: usize,
}

/// How a router scores experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouterScoring {
    /// A softmax over all experts; the best `top_k` probabilities weight the chosen (Mixtral, Qwen-MoE, OLMoE).
    Softmax,
    /// A sigmoid per expert (DeepSeek-V3). The experts are chosen by score plus the checkpoint's correction bias
    /// (`e_score_correction_bias`), among the `top_groups` of `groups` equal groups of experts whose two best
    /// such scores sum highest; the scores without the bias weight them.
    GroupedSigmoid {
        /// Groups of experts (`n_group`).
        groups: usize,
        /// Groups each token chooses from (`topk_group`).
        top_groups: usize,
    },
}

/// The expert every token goes through besides its routed ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedExpertConfig {
    /// Its module name in the block (`shared_expert`; DeepSeek-V3's `shared_experts`).
    pub name: &'static str,
    /// Width of its gated MLP.
    pub intermediate_size: usize,
    /// Its output is scaled by a sigmoid gate (Qwen2-MoE's `shared_expert_gate`, `[1, hidden]`).
    pub gated: bool,
}

/// How a mixture-of-experts block routes each token to `top_k` of its experts.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    /// Routed experts per block (`num_local_experts` or `num_experts`).
    pub num_experts: usize,
    /// Experts each token goes through (`num_experts_per_tok`).
    pub top_k: usize,
    /// Width of one routed expert's gated MLP (`moe_intermediate_size`, else `intermediate_size`).
    pub expert_intermediate_size: usize,
    /// The chosen experts' probabilities are divided by their sum (Mixtral always; the others' `norm_topk_prob`).
    pub normalize_top_k: bool,
    /// How the router scores the experts.
    pub scoring: RouterScoring,
    /// The chosen experts' weights are multiplied by it (DeepSeek-V3's `routed_scaling_factor`; 1 elsewhere).
    pub routed_scaling_factor: f64,
    /// The shared expert (Qwen2-MoE's gated `shared_expert`, DeepSeek-V3's `shared_experts`); `None` without one.
    pub shared_expert: Option<SharedExpertConfig>,
    /// Layers with a dense MLP of `intermediate_size` in place of the experts (Qwen's `mlp_only_layers` and
    /// `decoder_sparse_step`), ascending.
    pub dense_layers: Vec<usize>,
    /// The block's module name in checkpoints (`block_sparse_moe` in Mixtral, `mlp` in the others).
    pub block_name: &'static str,
    /// The module names of each expert's gate, up and down projections (Mixtral's `w1`, `w3`, `w2`).
    pub expert_names: [&'static str; 3],
    /// What the config asks of training that training here does not do, with the field that asks it: Mixtral's
    /// router noise (`router_jitter_noise`), the load-balancing loss (`output_router_logits`). Inference ignores
    /// both, as transformers' does; training refuses to start rather than differ.
    pub training_unsupported: Option<String>,
}

/// Everything the generic decoder needs to know about one model; families differ only in these options.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// The `model_type` of `config.json` (one of [`crate::registry::ARCHITECTURES`]).
    pub model_type: String,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Model width.
    pub hidden_size: usize,
    /// MLP width.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (GQA when fewer than query heads, MQA when 1).
    pub num_key_value_heads: usize,
    /// Size of one head (`head_dim`, else hidden_size / num_attention_heads).
    pub head_dim: usize,
    /// Longest context the model supports.
    pub max_position_embeddings: usize,
    /// Epsilon of the norms (RMSNorm's, or LayerNorm's where `norm_kind` says so).
    pub rms_norm_eps: f64,
    /// RMSNorm (Llama and most) or LayerNorm (OLMo) in the blocks and at the end; q/k norms are RMSNorms.
    pub norm_kind: NormKind,
    /// The block and final norms have a weight (all but OLMo's).
    pub norm_weight: bool,
    /// The block and final norms have a bias.
    pub norm_bias: bool,
    /// q, k and v are clamped to `[-clip_qkv, clip_qkv]` after their projections (OLMo).
    pub clip_qkv: Option<f64>,
    /// A gated MLP (`down(act(gate(x)) * up(x))`, Llama and most); plain (`down(act(up(x)))`) when false.
    pub mlp_gated: bool,
    /// The Hugging Face module names of the MLP's gate, up and down projections (StarCoder2's plain MLP: `c_fc`
    /// and `c_proj`).
    pub mlp_names: [&'static str; 3],
    /// A mixture of experts in place of the MLP (on all layers but its `dense_layers`); `None` in dense models.
    pub moe: Option<MoeConfig>,
    /// q and k are clamped after their norms (OLMoE), not before (OLMo).
    pub clip_after_qk_norm: bool,
    /// Rotary embedding (of the full-attention layers, where layer types differ).
    pub rope: RopeConfig,
    /// The rotary embedding of the sliding-window layers where it differs from `rope` (OLMo 3 scales only its
    /// full-attention layers' frequencies).
    pub sliding_rope: Option<RopeConfig>,
    /// The leading dimensions of each head that rotate (`head_dim`, or StableLM's and Nemotron's
    /// `partial_rotary_factor` of it), as transformers' rotary `dim`: an odd one rotates one dimension more (see
    /// `RotaryEmbedding::new`).
    pub rotary_dim: usize,
    /// The output projection shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// q/k/v projections have biases (Qwen2; Llama's `attention_bias`).
    pub attention_bias: bool,
    /// The output projection of attention has a bias (Llama's `attention_bias` also sets it).
    pub o_proj_bias: bool,
    /// MLP projections have biases (Llama's `mlp_bias`).
    pub mlp_bias: bool,
    /// RMSNorm on queries and keys before rotary (Qwen3, OLMo 2, EXAONE 4).
    pub qk_norm: bool,
    /// The q/k norms span the whole projections (OLMo 2: weights of `heads · head_dim`), not one head (Qwen3).
    pub qk_norm_over_heads: bool,
    /// The q/k norms are LayerNorms of each head with a weight per head (`[heads, head_dim]`; Cohere's
    /// `use_qk_norm`), not RMSNorms sharing one weight.
    pub qk_norm_per_head_layer: bool,
    /// Each head's q/k norm weight is its own parameter (StableLM's `q_layernorm.norms.N.weight`).
    pub qk_norm_split: bool,
    /// The q/k norms are one LayerNorm of `head_dim` with weight and bias that every head shares (Phi's
    /// `qk_layernorm`).
    pub qk_norm_shared_layer: bool,
    /// The module names of the q/k norms (`q_norm`, `k_norm`; StableLM: `q_layernorm`, `k_layernorm`).
    pub qk_norm_names: [&'static str; 2],
    /// Where the layers norm the residual stream's branches.
    pub norm_placement: NormPlacement,
    /// Rotary pairs are adjacent dimensions `(2i, 2i + 1)` (Cohere), not `(i, i + d/2)`.
    pub interleaved_rope: bool,
    /// The module names of the attention's query, key, value and output projections (Phi's output: `dense`).
    pub attention_names: [&'static str; 4],
    /// The checkpoint holds q, k and v as one matrix under this module name (Phi-3's `qkv_proj`), in this
    /// row order.
    pub fused_qkv: Option<(&'static str, QkvLayout)>,
    /// The checkpoint holds the MLP's gate and up projections as one matrix under this name (Phi-3's
    /// `gate_up_proj`, gate rows first).
    pub fused_gate_up: Option<&'static str>,
    /// The module names around the layers (`model.embed_tokens`, ..., GPT-NeoX's `gpt_neox.embed_in`).
    pub names: ModuleNames,
    /// The layers' projection weights are stored `[in, out]` (GPT-2's `Conv1D`).
    pub conv1d: bool,
    /// Learned absolute position embeddings are added to the token embeddings (GPT-2's `wpe`, of
    /// `max_position_embeddings + position_offset` rows).
    pub position_embeddings: bool,
    /// Position p reads row p + this of the position embeddings (OPT's 2, a relic of fairseq's padding rows).
    pub position_offset: usize,
    /// The output head has a bias (Phi).
    pub lm_head_bias: bool,
    /// The logits are multiplied by it (Cohere's `logit_scale`; 1 elsewhere).
    pub logit_scale: f64,
    /// Attention scores `s` become `c · tanh(s / c)` before the softmax (Gemma 2's `attn_logit_softcapping`).
    pub attention_softcap: Option<f64>,
    /// Logits `z` become `c · tanh(z / c)` (Gemma 2's `final_logit_softcapping`).
    pub final_logit_softcap: Option<f64>,
    /// Attend only to the last `n` positions (Mistral; Qwen2 when `use_sliding_window`), on every layer but
    /// `full_attention_layers`.
    pub sliding_window: Option<usize>,
    /// In a hybrid model, the layers that attend to every position despite `sliding_window` (OLMo 3, EXAONE 4,
    /// Qwen2 below `max_window_layers`).
    pub full_attention_layers: Vec<usize>,
    /// MLP activation.
    pub hidden_act: Activation,
    /// Beginning-of-sequence token.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence tokens (config.json may list several).
    pub eos_token_ids: Vec<u32>,
    /// The embedding row of the padding token (`pad_token_id`), which transformers' `nn.Embedding(padding_idx)`
    /// leaves out of the lookup's gradient and initializes to zero: every family but GPT-2, GPT-NeoX and Falcon.
    /// Training must match that, or the row moves wherever the id occurs in the data.
    pub padding_idx: Option<usize>,
    /// Standard deviation of the normal initialization of weight matrices (for training from scratch).
    pub initializer_range: f64,
    /// The token embeddings are multiplied by it (Granite's `embedding_multiplier`, Gemma's `sqrt(hidden_size)`;
    /// 1 elsewhere).
    pub embedding_multiplier: f64,
    /// Each attention and MLP output is multiplied by it before its residual add (Granite; 1 elsewhere).
    pub residual_multiplier: f64,
    /// The attention score scale in place of `1 / sqrt(head_dim)` (Granite's `attention_multiplier`).
    pub attention_multiplier: Option<f64>,
    /// Layer i's score scale is further divided by i + 1 (GPT-2's `scale_attn_by_inverse_layer_idx`), which keeps
    /// deep stacks' scores small.
    pub attention_scale_by_inverse_layer: bool,
    /// ALiBi in place of rotary (BLOOM; Falcon's `alibi`): each head's scores get a bias linear in the key's
    /// position, in the family's arithmetic.
    pub alibi: Option<Alibi>,
    /// The embeddings pass through a LayerNorm of this name under the model's module before the first layer
    /// (BLOOM's `word_embeddings_layernorm`).
    pub embedding_norm: Option<&'static str>,
    /// The logits are divided by it (Granite's `logits_scaling`; 1 elsewhere).
    pub logits_scaling: f64,
    /// Layers that take no rotary embedding (SmolLM3's `no_rope_layers` zeros), ascending.
    pub nope_layers: Vec<usize>,
    /// Every RMSNorm scales by `1 + weight` (Gemma).
    pub norm_unit_offset: bool,
    /// Multi-head latent attention in place of the q/k/v projections (DeepSeek-V3). `head_dim` is then the wider
    /// of the query/key and value heads (the narrower is zero-padded, so every attention kernel runs unchanged),
    /// `rotary_dim` the rotary part and `num_key_value_heads` the heads.
    pub latent_attention: Option<LatentAttentionConfig>,
}

impl ModelConfig {
    /// The sequence length at which generation throws the KV cache away and runs the whole sequence again, as
    /// transformers' Phi-3 does under LongRoPE: once the sequence passes the pretraining length, the keys cached
    /// under the short factors are rotated again with the long ones, as a forward over the whole sequence would.
    pub fn cache_reset_length(&self) -> Option<usize> {
        match &self.rope.scaling {
            RopeScaling::LongRope {
                original_max_position_embeddings,
                ..
            } if self.model_type == "phi3" => Some(original_max_position_embeddings + 1),
            _ => None,
        }
    }

    /// A plain Llama of this shape (`head_dim` = hidden / heads, rope theta 10000, RMSNorm eps 1e-6, untied,
    /// every other option neutral): what GGUF files and tests build on with struct update syntax.
    pub fn llama(
        vocab_size: usize,
        hidden_size: usize,
        intermediate_size: usize,
        num_hidden_layers: usize,
        num_attention_heads: usize,
        num_key_value_heads: usize,
    ) -> ModelConfig {
        let head_dim = hidden_size / num_attention_heads.max(1);
        ModelConfig {
            model_type: "llama".into(),
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            max_position_embeddings: 2048,
            rms_norm_eps: 1e-6,
            norm_kind: NormKind::Rms,
            norm_weight: true,
            norm_bias: false,
            clip_qkv: None,
            mlp_gated: true,
            mlp_names: ["gate_proj", "up_proj", "down_proj"],
            moe: None,
            clip_after_qk_norm: false,
            rope: RopeConfig {
                theta: 10000.0,
                scaling: RopeScaling::Default,
            },
            sliding_rope: None,
            rotary_dim: head_dim,
            tie_word_embeddings: false,
            attention_bias: false,
            o_proj_bias: false,
            mlp_bias: false,
            qk_norm: false,
            qk_norm_over_heads: false,
            qk_norm_per_head_layer: false,
            qk_norm_split: false,
            qk_norm_shared_layer: false,
            qk_norm_names: ["q_norm", "k_norm"],
            norm_placement: NormPlacement::Pre,
            interleaved_rope: false,
            attention_names: ["q_proj", "k_proj", "v_proj", "o_proj"],
            fused_qkv: None,
            fused_gate_up: None,
            names: ModuleNames::LLAMA,
            conv1d: false,
            position_embeddings: false,
            position_offset: 0,
            lm_head_bias: false,
            logit_scale: 1.0,
            attention_softcap: None,
            final_logit_softcap: None,
            sliding_window: None,
            full_attention_layers: Vec::new(),
            hidden_act: Activation::Silu,
            bos_token_id: Some(1),
            eos_token_ids: vec![2],
            padding_idx: None,
            initializer_range: 0.02,
            embedding_multiplier: 1.0,
            residual_multiplier: 1.0,
            attention_multiplier: None,
            attention_scale_by_inverse_layer: false,
            alibi: None,
            embedding_norm: None,
            logits_scaling: 1.0,
            nope_layers: Vec::new(),
            norm_unit_offset: false,
            latent_attention: None,
        }
    }

    /// Reads and validates `config.json`.
    pub fn from_file(path: &Path) -> Result<ModelConfig> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        ModelConfig::from_json(&text, path)
    }

    /// Parses and validates the text of a `config.json` as transformers 4.x and 5.x write it, filling absent
    /// fields with the defaults of the family's transformers config class; `path` only names the file in errors.
    pub fn from_json(text: &str, path: &Path) -> Result<ModelConfig> {
        let value: Value = serde_json::from_str(text).map_err(|e| Error::Config {
            path: path.to_path_buf(),
            message: format!("not valid JSON: {e}"),
        })?;
        let Value::Object(map) = &value else {
            return Err(Error::Config {
                path: path.to_path_buf(),
                message: "not a JSON object".into(),
            });
        };
        let f = Fields {
            map,
            path,
            prefix: String::new(),
        };
        let model_type = f.required("model_type", STRING)?;
        let family = Family::from_model_type(&model_type, path)?;
        parse(&f, family)
    }

    /// How many parameters a checkpoint of this configuration holds, without building the model: the figure
    /// model cards publish (tied embeddings counted once). The registry tests check it against the published
    /// counts of real configs and against the parameters of every fixture's built model. Counted in 128 bits
    /// (sizes up to 2^31 each, as parsing allows), saturating at `u64::MAX`.
    pub fn parameter_count(&self) -> u64 {
        let [hidden, inter, vocab] = [self.hidden_size, self.intermediate_size, self.vocab_size].map(|n| n as u128);
        let q = self.num_attention_heads as u128 * self.head_dim as u128;
        let kv = self.num_key_value_heads as u128 * self.head_dim as u128;
        let bias = |on: bool, n: u128| if on { n } else { 0 };
        let qk_norm = match (self.qk_norm, self.qk_norm_over_heads || self.qk_norm_per_head_layer) {
            (false, _) => 0,
            (true, false) => 2 * self.head_dim as u128 + bias(self.qk_norm_shared_layer, 2 * self.head_dim as u128),
            (true, true) => q + kv,
        };
        let attention = match self.latent_attention {
            None => {
                hidden * (q + 2 * kv)
                    + bias(self.attention_bias, q + 2 * kv)
                    + q * hidden
                    + bias(self.o_proj_bias, hidden)
                    + qk_norm
            }
            Some(m) => {
                let heads = self.num_attention_heads as u128;
                let [nope, rope, v, kv_rank] = [m.nope_dim, m.rope_dim, m.v_dim, m.kv_lora_rank].map(|n| n as u128);
                let q_out = heads * (nope + rope);
                let query = match m.q_lora_rank.map(|r| r as u128) {
                    Some(r) => hidden * r + bias(self.attention_bias, r) + r + r * q_out,
                    None => hidden * q_out,
                };
                let latent = hidden * (kv_rank + rope) + bias(self.attention_bias, kv_rank + rope) + kv_rank;
                query + latent + kv_rank * heads * (nope + v) + heads * v * hidden + bias(self.o_proj_bias, hidden)
            }
        };
        let branches = if self.mlp_gated { 2 } else { 1 };
        let mlp = (branches + 1) * hidden * inter + bias(self.mlp_bias, branches * inter + hidden);
        let norm = hidden * (self.norm_weight as u128 + self.norm_bias as u128);
        let layers = self.num_hidden_layers as u128;
        let feed_forward = match &self.moe {
            None => layers * mlp,
            Some(m) => {
                let dense = m.dense_layers.len() as u128;
                let experts = m.num_experts as u128 * 3 * hidden * m.expert_intermediate_size as u128;
                let shared = m
                    .shared_expert
                    .map_or(0, |s| 3 * hidden * s.intermediate_size as u128 + bias(s.gated, hidden));
                let router = m.num_experts as u128 * hidden;
                dense * mlp + (layers - dense) * (experts + shared + router)
            }
        };
        let head = if self.tie_word_embeddings {
            0
        } else {
            vocab * hidden + bias(self.lm_head_bias, vocab)
        };
        let norms = match self.norm_placement {
            NormPlacement::Parallel => 1,
            NormPlacement::Pre | NormPlacement::Post | NormPlacement::ParallelTwoNorms => 2,
            NormPlacement::Sandwich => 4,
        };
        let positions = if self.position_embeddings {
            (self.max_position_embeddings + self.position_offset) as u128 * hidden
        } else {
            0
        };
        let embedding_norm = if self.embedding_norm.is_some() { norm } else { 0 };
        let total = layers * (attention + norms * norm)
            + feed_forward
            + vocab * hidden
            + positions
            + embedding_norm
            + norm
            + head;
        u64::try_from(total).unwrap_or(u64::MAX)
    }
}

/// Family defaults that differ between the transformers config classes.
struct Defaults {
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    max_position_embeddings: usize,
    bos_token_id: Option<u32>,
    eos_token_ids: &'static [u32],
    tie_word_embeddings: bool,
}

/// `pad_token_id` where config.json has none: the config classes' defaults (None for the families not listed).
fn default_pad_token_id(family: Family) -> Option<i64> {
    match family {
        Family::Cohere | Family::Gemma | Family::Gemma2 | Family::Gemma3Text => Some(0),
        Family::Olmo | Family::Olmo2 | Family::Olmo3 | Family::Olmoe | Family::SeedOss | Family::Opt => Some(1),
        Family::Glm => Some(151329),
        Family::Phi3 => Some(32000),
        Family::Smollm3 => Some(128004),
        _ => None,
    }
}

/// The embedding row `pad_token_id` names, as `nn.Embedding` reads a padding index: negative ids count from the
/// end. An id outside the vocabulary (transformers refuses to build such a model) leaves every row trainable,
/// with a warning.
fn padding_row(pad_token_id: Option<i64>, vocab_size: usize, path: &Path) -> Option<usize> {
    let id = pad_token_id?;
    let vocab = vocab_size as i64;
    if (-vocab..vocab).contains(&id) {
        return Some(id.rem_euclid(vocab) as usize);
    }
    tracing::warn!(
        "{}: pad_token_id {id} is outside the vocabulary of {vocab_size}: no embedding row is kept from training",
        path.display()
    );
    None
}

fn defaults(family: Family) -> Defaults {
    match family {
        Family::Llama => Defaults {
            num_key_value_heads: None,
            head_dim: None,
            max_position_embeddings: 2048,
            bos_token_id: Some(1),
            eos_token_ids: &[2],
            tie_word_embeddings: false,
        },
        Family::Mistral => Defaults {
            num_key_value_heads: Some(8),
            head_dim: None,
            max_position_embeddings: 4096 * 32,
            bos_token_id: Some(1),
            eos_token_ids: &[2],
            tie_word_embeddings: false,
        },
        Family::Qwen2 => Defaults {
            num_key_value_heads: Some(32),
            head_dim: None,
            max_position_embeddings: 32768,
            bos_token_id: None,
            eos_token_ids: &[],
            tie_word_embeddings: false,
        },
        Family::Qwen3 => Defaults {
            num_key_value_heads: Some(32),
            head_dim: Some(128),
            max_position_embeddings: 32768,
            bos_token_id: None,
            eos_token_ids: &[],
            tie_word_embeddings: false,
        },
        Family::Granite => Defaults {
            num_key_value_heads: None,
            head_dim: None,
            max_position_embeddings: 2048,
            bos_token_id: Some(1),
            eos_token_ids: &[2],
            tie_word_embeddings: false,
        },
        Family::Gemma => Defaults {
            num_key_value_heads: Some(16),
            head_dim: Some(256),
            max_position_embeddings: 8192,
            bos_token_id: Some(2),
            eos_token_ids: &[1],
            tie_word_embeddings: true,
        },
        Family::Olmo2 => Defaults {
            num_key_value_heads: None,
            head_dim: None,
            max_position_embeddings: 2048,
            bos_token_id: None,
            eos_token_ids: &[50279],
            tie_word_embeddings: false,
        },
        Family::Stablelm => Defaults {
            num_key_value_heads: Some(32),
            head_dim: None,
            max_position_embeddings: 4096,
            bos_token_id: Some(0),
            eos_token_ids: &[0],
            tie_word_embeddings: false,
        },
        Family::SeedOss => Defaults {
            num_key_value_heads: Some(8),
            head_dim: Some(128),
            max_position_embeddings: 524288,
            bos_token_id: Some(0),
            eos_token_ids: &[2],
            tie_word_embeddings: false,
        },
        Family::Arcee => Defaults {
            num_key_value_heads: None,
            head_dim: None,
            max_position_embeddings: 4096,
            bos_token_id: Some(128000),
            eos_token_ids: &[128001],
            tie_word_embeddings: false,
        },
        Family::Starcoder2 => Defaults {
            num_key_value_heads: Some(2),
            head_dim: None,
            max_position_embeddings: 4096,
            bos_token_id: Some(50256),
            eos_token_ids: &[50256],
            tie_word_embeddings: true,
        },
        Family::Olmo => Defaults {
            num_key_value_heads: None,
            head_dim: None,
            max_position_embeddings: 2048,
            bos_token_id: None,
            eos_token_ids: &[50279],
            tie_word_embeddings: false,
        },
        Family::Exaone4 => Defaults {
            num_key_value_heads: Some(32),
            head_dim: None,
            max_position_embeddings: 2048,
            bos_token_id: Some(0),
            eos_token_ids: &[2],
            tie_word_embeddings: false,
        },
        Family::Smollm3 => Defaults {
            num_key_value_heads: Some(4),
            head_dim: None,
            max_position_embeddings: 32768,
            bos_token_id: Some(128000),
            eos_token_ids: &[128001],
            tie_word_embeddings: true,
        },
        Family::Mixtral => Defaults {
            num_key_value_heads: Some(8),
            head_dim: None,
            max_position_embeddings: 4096 * 32,
            bos_token_id: Some(1),
            eos_token_ids: &[2],
            tie_word_embeddings: false,
        },
        Family::Qwen2Moe => Defaults {
            num_key_value_heads: Some(16),
            head_dim: None,
            max_position_embeddings: 32768,
            bos_token_id: None,
            eos_token_ids: &[],
            tie_word_embeddings: false,
        },
        Family::Qwen3Moe => Defaults {
            num_key_value_heads: Some(4),
            head_dim: None,
            max_position_embeddings: 32768,
            bos_token_id: None,
            eos_token_ids: &[],
            tie_word_embeddings: false,
        },
        Family::Olmoe => Defaults {
            num_key_value_heads: None,
            head_dim: None,
            max_position_embeddings: 4096,
            bos_token_id: None,
            eos_token_ids: &[50279],
            tie_word_embeddings: false,
        },
        Family::Ministral => Defaults {
            num_key_value_heads: Some(8),
            head_dim: None,
            max_position_embeddings: 4096 * 32,
            bos_token_id: Some(1),
            eos_token_ids: &[2],
            tie_word_embeddings: false,
        },
        Family::Nemotron => Defaults {
            num_key_value_heads: None,
            head_dim: None,
            max_position_embeddings: 4096,
            bos_token_id: Some(2),
            eos_token_ids: &[3],
            tie_word_embeddings: false,
        },
        Family::Olmo3 => Defaults {
            num_key_value_heads: None,
            head_dim: None,
            max_position_embeddings: 2048,
            bos_token_id: None,
            eos_token_ids: &[50279],
            tie_word_embeddings: false,
        },
        Family::Gemma2 => Defaults {
            num_key_value_heads: Some(4),
            head_dim: Some(256),
            max_position_embeddings: 8192,
            bos_token_id: Some(2),
            eos_token_ids: &[1],
            tie_word_embeddings: true,
        },
        Family::Gemma3Text => Defaults {
            num_key_value_heads: Some(4),
            head_dim: Some(256),
            max_position_embeddings: 131_072,
            bos_token_id: Some(2),
            eos_token_ids: &[1],
            tie_word_embeddings: true,
        },
        Family::Cohere => Defaults {
            num_key_value_heads: None,
            head_dim: None,
            max_position_embeddings: 8192,
            bos_token_id: Some(5),
            eos_token_ids: &[255001],
            tie_word_embeddings: true,
        },
        Family::Phi => Defaults {
            num_key_value_heads: None,
            head_dim: None,
            max_position_embeddings: 2048,
            bos_token_id: Some(1),
            eos_token_ids: &[2],
            tie_word_embeddings: false,
        },
        Family::Phi3 => Defaults {
            num_key_value_heads: None,
            head_dim: None,
            max_position_embeddings: 4096,
            bos_token_id: Some(1),
            eos_token_ids: &[32000],
            tie_word_embeddings: false,
        },
        Family::GptNeox => Defaults {
            num_key_value_heads: None,
            head_dim: None,
            max_position_embeddings: 2048,
            bos_token_id: Some(0),
            eos_token_ids: &[2],
            tie_word_embeddings: false,
        },
        Family::Gptj => Defaults {
            num_key_value_heads: None,
            head_dim: None,
            max_position_embeddings: 2048,
            bos_token_id: Some(50256),
            eos_token_ids: &[50256],
            tie_word_embeddings: false,
        },
        Family::GptNeo => Defaults {
            num_key_value_heads: None,
            head_dim: None,
            max_position_embeddings: 2048,
            bos_token_id: Some(50256),
            eos_token_ids: &[50256],
            tie_word_embeddings: true,
        },
        Family::Gpt2 | Family::GptBigcode => Defaults {
            num_key_value_heads: None,
            head_dim: None,
            max_position_embeddings: 1024,
            bos_token_id: Some(50256),
            eos_token_ids: &[50256],
            tie_word_embeddings: true,
        },
        Family::Falcon => Defaults {
            num_key_value_heads: None,
            head_dim: None,
            max_position_embeddings: 2048,
            bos_token_id: Some(11),
            eos_token_ids: &[11],
            tie_word_embeddings: true,
        },
        // BLOOM has no position limit of its own (ALiBi); 2048, its training length, is only reported.
        Family::Bloom => Defaults {
            num_key_value_heads: None,
            head_dim: None,
            max_position_embeddings: 2048,
            bos_token_id: Some(1),
            eos_token_ids: &[2],
            tie_word_embeddings: true,
        },
        Family::Opt => Defaults {
            num_key_value_heads: None,
            head_dim: None,
            max_position_embeddings: 2048,
            bos_token_id: Some(2),
            eos_token_ids: &[2],
            tie_word_embeddings: true,
        },
        Family::Glm => Defaults {
            num_key_value_heads: Some(2),
            head_dim: Some(128),
            max_position_embeddings: 131072,
            bos_token_id: None,
            eos_token_ids: &[151329, 151336, 151338],
            tie_word_embeddings: false,
        },
        Family::DeepseekV3 => Defaults {
            num_key_value_heads: None,
            head_dim: None,
            max_position_embeddings: 4096,
            bos_token_id: Some(0),
            eos_token_ids: &[1],
            tie_word_embeddings: false,
        },
    }
}

fn parse(f: &Fields, family: Family) -> Result<ModelConfig> {
    let d = defaults(family);
    let positive = |key: &str| -> Result<usize> {
        let v = f.required(key, USIZE)?;
        if v == 0 {
            return Err(f.error(key, "must be positive"));
        }
        Ok(v)
    };
    let gpt2 = family == Family::Gpt2;
    let bigcode = family == Family::GptBigcode;
    let bloom = family == Family::Bloom;
    // GPT-2's, GPT-BigCode's, GPT-J's, GPT-Neo's and BLOOM's config.json keep their own names, which transformers
    // maps to the usual ones: either is read, the usual one where both are (as transformers sets it last).
    let key = |name: &'static str| -> &'static str {
        let own = match (family, name) {
            (Family::Gpt2 | Family::GptBigcode | Family::Gptj, "hidden_size") => "n_embd",
            (Family::Gpt2 | Family::GptBigcode | Family::Gptj, "max_position_embeddings") => "n_positions",
            (Family::Gpt2 | Family::GptBigcode | Family::Gptj | Family::Bloom, "num_hidden_layers") => "n_layer",
            (Family::Gpt2 | Family::GptBigcode | Family::Gptj | Family::Bloom, "num_attention_heads") => "n_head",
            (Family::GptNeo, "num_hidden_layers") => "num_layers",
            (Family::GptNeo, "num_attention_heads") => "num_heads",
            _ => return name,
        };
        if f.map.contains_key(name) { name } else { own }
    };
    let vocab_size = positive("vocab_size")?;
    // Falcon's and BLOOM's config classes take a legacy `n_embed` over `hidden_size`.
    let hidden_size = match family {
        Family::Falcon | Family::Bloom if f.map.contains_key("n_embed") => positive("n_embed")?,
        _ => positive(key("hidden_size"))?,
    };
    // GPT-2's and Falcon's MLPs are 4 x hidden unless n_inner / ffn_hidden_size say otherwise.
    let width_key = match family {
        Family::Gpt2 | Family::GptBigcode | Family::Gptj => Some("n_inner"),
        Family::GptNeo => Some("intermediate_size"),
        Family::Falcon => Some("ffn_hidden_size"),
        _ => None,
    };
    let intermediate_size = match width_key {
        // BLOOM's MLP is always 4 x hidden.
        None if bloom => 4 * hidden_size,
        None if family == Family::Opt => positive("ffn_dim")?,
        Some(k) => match f.or(k, None, USIZE)? {
            Some(0) => return Err(f.error(k, "must be positive")),
            Some(n) => n,
            None => 4 * hidden_size,
        },
        None => positive("intermediate_size")?,
    };
    let num_hidden_layers = positive(key("num_hidden_layers"))?;
    let num_attention_heads = positive(key("num_attention_heads"))?;
    // Falcon: grouped key/value heads in the new decoder architecture, else one (multi-query) or one per head.
    let falcon_new = family == Family::Falcon && f.or("new_decoder_architecture", Some(false), BOOL)? == Some(true);
    let num_key_value_heads = match family {
        Family::Falcon if falcon_new => f.or("num_kv_heads", None, USIZE)?.unwrap_or(num_attention_heads),
        Family::Falcon if f.or("multi_query", Some(true), BOOL)? == Some(true) => 1,
        Family::Falcon => num_attention_heads,
        Family::GptBigcode if not_null(f, "multi_query")? && f.or("multi_query", Some(true), BOOL)? == Some(true) => 1,
        // One key/value head per query head, whatever a stray `num_key_value_heads` says (transformers reads none).
        Family::GptNeox
        | Family::Gpt2
        | Family::GptBigcode
        | Family::GptNeo
        | Family::Gptj
        | Family::Bloom
        | Family::Opt => num_attention_heads,
        _ => f
            .or("num_key_value_heads", d.num_key_value_heads, USIZE)?
            .unwrap_or(num_attention_heads),
    };
    if num_key_value_heads == 0 || num_attention_heads % num_key_value_heads != 0 {
        return Err(f.error(
            "num_key_value_heads",
            &format!("{num_key_value_heads} does not divide num_attention_heads ({num_attention_heads})"),
        ));
    }
    let latent_attention = latent_attention(f, family)?;
    if latent_attention.is_some() && num_key_value_heads != num_attention_heads {
        return Err(f.error(
            "num_key_value_heads",
            &format!(
                "latent attention expands keys and values for every head: {num_key_value_heads} is not \
                 num_attention_heads ({num_attention_heads})"
            ),
        ));
    }
    // (DeepSeek-V3's config.json calls its rotary part `head_dim`; the attention of StableLM, GPT-NeoX, GPT-2,
    // GPT-BigCode, GPT-Neo, GPT-J, Falcon, BLOOM and OPT splits hidden_size evenly whatever `head_dim` says.)
    let head_dim_key = match family {
        Family::Stablelm
        | Family::GptNeox
        | Family::Gpt2
        | Family::GptBigcode
        | Family::GptNeo
        | Family::Gptj
        | Family::Falcon
        | Family::Bloom
        | Family::Opt => None,
        _ => f.or("head_dim", d.head_dim, USIZE)?,
    };
    let head_dim = match head_dim_key {
        _ if let Some(m) = latent_attention => (m.nope_dim + m.rope_dim).max(m.v_dim),
        Some(0) => return Err(f.error("head_dim", "must be positive")),
        Some(h) => h,
        None if hidden_size % num_attention_heads != 0 => {
            return Err(f.error(
                "num_attention_heads",
                &format!("{num_attention_heads} does not divide hidden_size ({hidden_size}) and head_dim is not set"),
            ));
        }
        None => hidden_size / num_attention_heads,
    };
    // BLOOM's config has no limit to read (ALiBi); its default is only reported.
    let max_position_embeddings = match bloom {
        true => d.max_position_embeddings,
        false => f
            .or(key("max_position_embeddings"), Some(d.max_position_embeddings), USIZE)?
            .unwrap_or(d.max_position_embeddings),
    };
    // YaRN derives its factor from it, GPT-2 sizes its position table by it.
    if max_position_embeddings == 0 {
        return Err(f.error(key("max_position_embeddings"), "must be positive"));
    }
    // OLMo's and OPT's LayerNorms have their epsilon fixed at 1e-5.
    let rms_norm_eps = match family {
        Family::Olmo | Family::Opt => 1e-5,
        Family::Starcoder2 => f.or("norm_epsilon", Some(1e-5), F64)?.unwrap_or(1e-5),
        Family::Gpt2 | Family::GptBigcode | Family::GptNeo | Family::Gptj | Family::Falcon | Family::Bloom => {
            f.or("layer_norm_epsilon", Some(1e-5), F64)?.unwrap_or(1e-5)
        }
        Family::Glm => f.or("rms_norm_eps", Some(1.5625e-7), F64)?.unwrap_or(1.5625e-7),
        Family::Stablelm | Family::Cohere | Family::Phi | Family::GptNeox => {
            f.or("layer_norm_eps", Some(1e-5), F64)?.unwrap_or(1e-5)
        }
        Family::Nemotron => f.or("norm_eps", Some(1e-5), F64)?.unwrap_or(1e-5),
        // The config classes' defaults: 1e-5 for these, 1e-6 for the others.
        Family::Olmo2
        | Family::Exaone4
        | Family::Arcee
        | Family::Mixtral
        | Family::Olmoe
        | Family::Olmo3
        | Family::Phi3 => f.or("rms_norm_eps", Some(1e-5), F64)?.unwrap_or(1e-5),
        _ => f.or("rms_norm_eps", Some(1e-6), F64)?.unwrap_or(1e-6),
    };
    if !(rms_norm_eps > 0.0 && rms_norm_eps.is_finite()) {
        return Err(f.error("rms_norm_eps", "must be positive"));
    }
    let (rope, sliding_rope) = rope_configs(f, family, max_position_embeddings)?;
    let rotary_dim = match latent_attention {
        Some(m) => m.rope_dim,
        None => rotary_dim(f, family, head_dim)?,
    };
    // Rotary embeddings pair the dimensions they rotate (an odd partial count rotates one more, within an even
    // head), and the attention kernels, of layers without rotary too, take even heads.
    if head_dim % 2 == 1 {
        let named = if head_dim_key.is_some() {
            "head_dim"
        } else {
            key("num_attention_heads")
        };
        return Err(f.error(
            named,
            &format!("heads of {head_dim} dimensions: odd head sizes are not supported"),
        ));
    }
    if latent_attention.is_some() && rotary_dim % 2 == 1 {
        return Err(f.error(
            "qk_rope_head_dim",
            &format!("{rotary_dim} is odd: rotary pairs dimensions"),
        ));
    }
    for scaling in [&rope.scaling]
        .into_iter()
        .chain(sliding_rope.as_ref().map(|r| &r.scaling))
    {
        if let RopeScaling::LongRope {
            short_factor,
            long_factor,
            ..
        } = scaling
            && (short_factor.len() != rotary_dim.div_ceil(2) || long_factor.len() != rotary_dim.div_ceil(2))
        {
            return Err(f.error(
                "rope_scaling",
                &format!(
                    "longrope needs one short and one long factor per rotated pair ({}), found {} and {}",
                    rotary_dim.div_ceil(2),
                    short_factor.len(),
                    long_factor.len()
                ),
            ));
        }
    }
    let flag = |key: &str| -> Result<bool> { Ok(f.or(key, Some(false), BOOL)?.unwrap_or(false)) };
    let tie_word_embeddings = f
        .or("tie_word_embeddings", Some(d.tie_word_embeddings), BOOL)?
        .unwrap_or(d.tie_word_embeddings);
    let (attention_bias, o_proj_bias, mlp_bias) = match family {
        Family::Llama | Family::Granite | Family::Smollm3 | Family::Arcee | Family::Nemotron => {
            let b = flag("attention_bias")?;
            (b, b, flag("mlp_bias")?)
        }
        // Their MLPs never have biases, whatever mlp_bias says.
        Family::Qwen3
        | Family::Olmo2
        | Family::Gemma
        | Family::Olmo
        | Family::Qwen3Moe
        | Family::Olmoe
        | Family::Olmo3
        | Family::Gemma2
        | Family::Gemma3Text
        | Family::Cohere
        | Family::DeepseekV3 => {
            let b = flag("attention_bias")?;
            (b, b, false)
        }
        Family::Phi | Family::Gpt2 | Family::GptBigcode | Family::Bloom => (true, true, true),
        // GPT-Neo's q, k and v have no biases, its output projection and MLP do; GPT-J's MLP only.
        Family::GptNeo => (false, true, true),
        Family::Gptj => (false, false, true),
        Family::Opt => {
            let b = f.or("enable_bias", Some(true), BOOL)?.unwrap_or(true);
            (b, b, b)
        }
        Family::Falcon => {
            let b = flag("bias")?;
            (b, b, b)
        }
        Family::GptNeox => {
            let b = f.or("attention_bias", Some(true), BOOL)?.unwrap_or(true);
            (b, b, true)
        }
        Family::Qwen2 => (true, false, false),
        Family::Qwen2Moe => (f.or("qkv_bias", Some(true), BOOL)?.unwrap_or(true), false, false),
        Family::Glm => (f.or("attention_bias", Some(true), BOOL)?.unwrap_or(true), false, false),
        // EXAONE 4's projections never have biases.
        Family::Exaone4 => (false, false, false),
        Family::Stablelm => (flag("use_qkv_bias")?, false, false),
        Family::SeedOss => (
            f.or("attention_bias", Some(true), BOOL)?.unwrap_or(true),
            flag("attention_out_bias")?,
            flag("mlp_bias")?,
        ),
        Family::Starcoder2 => {
            let b = f.or("use_bias", Some(true), BOOL)?.unwrap_or(true);
            (b, b, b)
        }
        Family::Mistral | Family::Mixtral | Family::Ministral | Family::Phi3 => (false, false, false),
    };
    let smollm3_nope = nope_layers(f, family, num_hidden_layers)?;
    let windows = sliding_window(f, family, num_hidden_layers, &smollm3_nope)?;
    // Gemma's MLP (transformers 5) takes `hidden_act`, the tanh GELU unless said otherwise.
    let default_act = match family {
        Family::Gemma | Family::Gemma2 | Family::Gemma3Text | Family::Starcoder2 => "gelu_pytorch_tanh",
        Family::Phi => "gelu_new",
        Family::GptNeox => "gelu",
        Family::Gpt2 | Family::GptNeo | Family::Gptj => "gelu_new",
        Family::GptBigcode => "gelu_pytorch_tanh",
        Family::Opt => "relu",
        Family::Falcon => "gelu",
        Family::Bloom => "gelu_new",
        Family::Arcee | Family::Nemotron => "relu2",
        _ => "silu",
    };
    // Gemma 2's and 3's MLPs take `hidden_activation`, GPT-2's `activation_function`.
    let act_key = match family {
        Family::Gemma2 | Family::Gemma3Text => "hidden_activation",
        Family::Gpt2 | Family::GptBigcode | Family::GptNeo | Family::Gptj | Family::Opt => "activation_function",
        Family::Falcon => "activation",
        _ => "hidden_act",
    };
    // BLOOM's MLP has its own tanh GELU (the same formula) and reads no activation key.
    let act = match family {
        Family::Bloom => Some(default_act.to_string()),
        _ => f.or(act_key, Some(default_act.to_string()), STRING)?,
    };
    let hidden_act = match act.as_deref() {
        Some("silu" | "swish") => Activation::Silu,
        Some("gelu" | "gelu_python") => Activation::Gelu,
        Some("gelu_pytorch_tanh" | "gelu_new" | "gelu_fast" | "gelu_accurate" | "gelu_python_tanh") => {
            Activation::GeluTanh
        }
        Some("relu") => Activation::Relu,
        Some("relu2") => Activation::Relu2,
        other => {
            return Err(f.error(
                act_key,
                &format!(
                    "unsupported activation {other:?}; supported: silu, swish, gelu, gelu_python, gelu_pytorch_tanh, \
                     gelu_new, gelu_fast, gelu_accurate, gelu_python_tanh, relu, relu2"
                ),
            ));
        }
    };
    let default_range = match family {
        Family::Starcoder2 => 0.018042,
        Family::Nemotron => 0.0134,
        _ => 0.02,
    };
    // OPT's config calls it `init_std`.
    let range_key = if family == Family::Opt {
        "init_std"
    } else {
        "initializer_range"
    };
    let initializer_range = f.or(range_key, Some(default_range), F64)?.unwrap_or(default_range);
    let multiplier = |key: &str| -> Result<f64> {
        if family != Family::Granite {
            return Ok(1.0);
        }
        let v = f.or(key, Some(1.0), F64)?.unwrap_or(1.0);
        if !(v > 0.0 && v.is_finite()) {
            return Err(f.error(key, "must be positive"));
        }
        Ok(v)
    };
    let embedding_multiplier = match family {
        // transformers multiplies by sqrt(hidden_size) as a tensor of the activations' dtype (f32).
        Family::Gemma | Family::Gemma2 | Family::Gemma3Text => (hidden_size as f64).sqrt() as f32 as f64,
        _ => multiplier("embedding_multiplier")?,
    };
    let residual_multiplier = multiplier("residual_multiplier")?;
    // Falcon's layers: the new decoder architecture's two parallel LayerNorms (or one), else a parallel block with
    // one LayerNorm (Falcon-7B) or a sequential one.
    let falcon_placement = match f.or("num_ln_in_parallel_attn", None, USIZE)? {
        _ if family != Family::Falcon => NormPlacement::Pre,
        Some(1) if falcon_new => NormPlacement::Parallel,
        None | Some(2) if falcon_new => NormPlacement::ParallelTwoNorms,
        Some(n) if falcon_new => return Err(f.error("num_ln_in_parallel_attn", &format!("{n} is not 1 or 2"))),
        _ if f.or("parallel_attn", Some(true), BOOL)? == Some(true) => NormPlacement::Parallel,
        _ => NormPlacement::Pre,
    };
    // GPT-2 may leave its scores unscaled, or scale them down layer by layer.
    let attention_scale_by_inverse_layer =
        gpt2 && f.or("scale_attn_by_inverse_layer_idx", Some(false), BOOL)? == Some(true);
    let attention_multiplier = match family {
        Family::Granite => Some(multiplier("attention_multiplier")?),
        Family::Gpt2 | Family::GptBigcode if f.or("scale_attn_weights", Some(true), BOOL)? == Some(false) => Some(1.0),
        // GPT-Neo never scales its scores.
        Family::GptNeo => Some(1.0),
        Family::Gemma2 | Family::Gemma3Text => {
            let scalar = f.or("query_pre_attn_scalar", Some(256.0), F64)?.unwrap_or(256.0);
            if !(scalar > 0.0 && scalar.is_finite()) {
                return Err(f.error("query_pre_attn_scalar", "must be positive"));
            }
            Some(scalar.powf(-0.5))
        }
        _ if let Some(m) = latent_attention => Some(latent_attention_scale(f, m.nope_dim + m.rope_dim)?),
        _ => None,
    };
    let softcap = |key: &str, default: Option<f64>| -> Result<Option<f64>> {
        if !matches!(family, Family::Gemma2 | Family::Gemma3Text) {
            return Ok(None);
        }
        match f.or(key, default, F64)? {
            Some(c) if !(c > 0.0 && c.is_finite()) => Err(f.error(key, "must be positive")),
            c => Ok(c),
        }
    };
    let gemma2 = family == Family::Gemma2;
    // Gemma 3's config class keeps an `attn_logit_softcapping` that its attention never applies.
    let attention_softcap = match family {
        Family::Gemma3Text => None,
        _ => softcap("attn_logit_softcapping", gemma2.then_some(50.0))?,
    };
    let final_logit_softcap = softcap("final_logit_softcapping", gemma2.then_some(30.0))?;
    let logits_scaling = multiplier("logits_scaling")?;
    // OPT's LayerNorms may have neither weight nor bias (`layer_norm_elementwise_affine`).
    let norm_affine = family != Family::Opt || f.or("layer_norm_elementwise_affine", Some(true), BOOL)? == Some(true);
    let alibi = match family {
        Family::Bloom => Some(Alibi::Bloom),
        Family::Falcon if f.or("alibi", Some(false), BOOL)? == Some(true) => Some(Alibi::Falcon),
        _ => None,
    };
    // OPT-350m's post-norm layers and projected embeddings, and OPT without its final norm, are not built.
    if family == Family::Opt {
        if f.or("do_layer_norm_before", Some(true), BOOL)? == Some(false) {
            return Err(f.error("do_layer_norm_before", "post-norm OPT layers are not supported"));
        }
        if f.or("word_embed_proj_dim", None, USIZE)?
            .is_some_and(|d| d != hidden_size)
        {
            return Err(f.error(
                "word_embed_proj_dim",
                "embeddings projected to hidden_size are not supported",
            ));
        }
        if f.or("_remove_final_layer_norm", Some(false), BOOL)? == Some(true) {
            return Err(f.error(
                "_remove_final_layer_norm",
                "OPT without its final norm is not supported",
            ));
        }
    }
    if family == Family::Bloom && f.or("apply_residual_connection_post_layernorm", Some(false), BOOL)? == Some(true) {
        return Err(f.error(
            "apply_residual_connection_post_layernorm",
            "residual connections from the normed input are not supported",
        ));
    }
    // EXAONE 4's layers rotate only when they slide or when the config sets no window at all (transformers
    // checks the config's `sliding_window`, not the layer's): with a window and no sliding layer, none rotates.
    let nope_layers = match family {
        // ALiBi biases the scores by position instead of rotating queries and keys.
        _ if alibi.is_some() => (0..num_hidden_layers).collect(),
        Family::Exaone4 if windows.window.is_some() => windows.full_layers.clone(),
        Family::Exaone4 if windows.configured => (0..num_hidden_layers).collect(),
        // GPT-2, GPT-BigCode, GPT-Neo and OPT have positions in their embeddings, no rotary anywhere.
        Family::Gpt2 | Family::GptBigcode | Family::GptNeo | Family::Opt => (0..num_hidden_layers).collect(),
        _ => smollm3_nope,
    };
    // Gemma's bidirectional attention (an encoder-style option) is not causal: refused.
    let gemmas = matches!(family, Family::Gemma | Family::Gemma2 | Family::Gemma3Text);
    if gemmas && f.or("use_bidirectional_attention", Some(false), BOOL)? == Some(true) {
        return Err(f.error("use_bidirectional_attention", "only causal attention is supported"));
    }
    // Phi and GPT-J tie only the head's weight, not its bias: not built.
    if matches!(family, Family::Phi | Family::Gptj) && tie_word_embeddings {
        return Err(f.error(
            "tie_word_embeddings",
            "a tied head with its own bias (Phi, GPT-J) is not supported",
        ));
    }
    let cohere_qk_norm = family == Family::Cohere && f.or("use_qk_norm", Some(false), BOOL)? == Some(true);
    let stablelm_qk_norm = family == Family::Stablelm && f.or("qk_layernorm", Some(false), BOOL)? == Some(true);
    let phi_qk_norm = family == Family::Phi && f.or("qk_layernorm", Some(false), BOOL)? == Some(true);
    let logit_scale = match family {
        Family::Cohere => match f.or("logit_scale", Some(0.0625), F64)?.unwrap_or(1.0) {
            s if s.is_finite() && s > 0.0 => s,
            _ => return Err(f.error("logit_scale", "must be positive")),
        },
        _ => 1.0,
    };
    let clip_qkv = match family {
        Family::Olmo | Family::Olmoe => f.or("clip_qkv", None, F64)?,
        _ => None,
    };
    if clip_qkv.is_some_and(|c| !(c > 0.0 && c.is_finite())) {
        return Err(f.error("clip_qkv", "must be positive"));
    }
    if !(initializer_range >= 0.0 && initializer_range.is_finite()) {
        return Err(f.error(range_key, "must be a finite non-negative number"));
    }
    let bos_token_id = f.or("bos_token_id", d.bos_token_id, U32)?;
    let padding_idx = match family {
        Family::Gpt2
        | Family::GptBigcode
        | Family::GptNeo
        | Family::Gptj
        | Family::GptNeox
        | Family::Falcon
        | Family::Bloom => None,
        _ => padding_row(
            f.or("pad_token_id", default_pad_token_id(family), I64)?,
            vocab_size,
            f.path,
        ),
    };
    let eos_token_ids = match f.map.get("eos_token_id") {
        None => d.eos_token_ids.to_vec(),
        // GLM's config class puts its three end tokens where config.json says null too.
        Some(Value::Null) if family == Family::Glm => d.eos_token_ids.to_vec(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| (U32.read)(v).ok_or_else(|| f.error("eos_token_id", &format!("expected token ids, found {v}"))))
            .collect::<Result<_>>()?,
        Some(_) => f.or("eos_token_id", None, U32)?.into_iter().collect(),
    };
    Ok(ModelConfig {
        model_type: family.model_type().to_string(),
        vocab_size,
        hidden_size,
        intermediate_size,
        num_hidden_layers,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        max_position_embeddings,
        rms_norm_eps,
        rope,
        sliding_rope,
        rotary_dim,
        tie_word_embeddings,
        attention_bias,
        o_proj_bias,
        mlp_bias,
        qk_norm: matches!(
            family,
            Family::Qwen3
                | Family::Olmo2
                | Family::Exaone4
                | Family::Qwen3Moe
                | Family::Olmoe
                | Family::Olmo3
                | Family::Gemma3Text
        ) || cohere_qk_norm
            || stablelm_qk_norm
            || phi_qk_norm,
        qk_norm_over_heads: matches!(family, Family::Olmo2 | Family::Olmoe | Family::Olmo3),
        qk_norm_per_head_layer: cohere_qk_norm || stablelm_qk_norm,
        qk_norm_split: stablelm_qk_norm,
        qk_norm_shared_layer: phi_qk_norm,
        qk_norm_names: match family {
            Family::Stablelm | Family::Phi => ["q_layernorm", "k_layernorm"],
            _ => ["q_norm", "k_norm"],
        },
        norm_placement: match family {
            Family::Olmo2 | Family::Exaone4 | Family::Olmo3 => NormPlacement::Post,
            Family::Gemma2 | Family::Gemma3Text => NormPlacement::Sandwich,
            Family::Cohere | Family::Phi | Family::Gptj => NormPlacement::Parallel,
            Family::Stablelm if f.or("use_parallel_residual", Some(false), BOOL)? == Some(true) => {
                NormPlacement::Parallel
            }
            Family::Falcon => falcon_placement,
            Family::GptNeox if f.or("use_parallel_residual", Some(true), BOOL)?.unwrap_or(true) => {
                NormPlacement::ParallelTwoNorms
            }
            _ => NormPlacement::Pre,
        },
        interleaved_rope: matches!(family, Family::Cohere | Family::Glm | Family::Gptj)
            || (family == Family::DeepseekV3 && f.or("rope_interleave", Some(true), BOOL)? == Some(true)),
        attention_names: match family {
            Family::Phi | Family::GptNeox | Family::Falcon | Family::Bloom => ["q_proj", "k_proj", "v_proj", "dense"],
            Family::Gpt2 | Family::GptBigcode => ["q_proj", "k_proj", "v_proj", "c_proj"],
            Family::Opt | Family::GptNeo | Family::Gptj => ["q_proj", "k_proj", "v_proj", "out_proj"],
            _ => ["q_proj", "k_proj", "v_proj", "o_proj"],
        },
        names: match family {
            Family::Phi => ModuleNames {
                final_norm: "final_layernorm",
                ..ModuleNames::LLAMA
            },
            Family::GptNeox => ModuleNames {
                model: "gpt_neox",
                embed: "embed_in",
                attention: "attention",
                final_norm: "final_layer_norm",
                head: "embed_out",
                ..ModuleNames::LLAMA
            },
            Family::Falcon => ModuleNames {
                input_norm: if falcon_placement == NormPlacement::ParallelTwoNorms {
                    "ln_attn"
                } else {
                    "input_layernorm"
                },
                mlp_input_norm: if falcon_placement == NormPlacement::ParallelTwoNorms {
                    "ln_mlp"
                } else {
                    "post_attention_layernorm"
                },
                ..ModuleNames::BLOOM
            },
            Family::Bloom => ModuleNames::BLOOM,
            Family::Opt => ModuleNames {
                model: "model.decoder",
                mlp: "",
                input_norm: "self_attn_layer_norm",
                mlp_input_norm: "final_layer_norm",
                final_norm: "final_layer_norm",
                ..ModuleNames::LLAMA
            },
            Family::GptNeo => ModuleNames {
                attention: "attn.attention",
                ..ModuleNames::GPT2
            },
            Family::Gpt2 | Family::GptBigcode | Family::Gptj => ModuleNames::GPT2,
            _ => ModuleNames::LLAMA,
        },
        lm_head_bias: matches!(family, Family::Phi | Family::Gptj),
        logit_scale,
        fused_qkv: match family {
            Family::Phi3 => Some(("qkv_proj", QkvLayout::Blocks)),
            Family::GptNeox | Family::Falcon | Family::Bloom => Some(("query_key_value", QkvLayout::Grouped)),
            Family::Gpt2 => Some(("c_attn", QkvLayout::Blocks)),
            // GPT-BigCode's c_attn is q, k and v as blocks with multi-query attention, else per head.
            Family::GptBigcode if num_key_value_heads == 1 => Some(("c_attn", QkvLayout::Blocks)),
            Family::GptBigcode => Some(("c_attn", QkvLayout::Grouped)),
            _ => None,
        },
        fused_gate_up: matches!(family, Family::Phi3 | Family::Glm).then_some("gate_up_proj"),
        conv1d: gpt2,
        position_embeddings: gpt2 || bigcode || matches!(family, Family::GptNeo | Family::Opt),
        position_offset: if family == Family::Opt { 2 } else { 0 },
        attention_softcap,
        final_logit_softcap,
        sliding_window: windows.window,
        full_attention_layers: windows.full_layers,
        hidden_act,
        bos_token_id,
        padding_idx,
        eos_token_ids,
        initializer_range,
        embedding_multiplier,
        residual_multiplier,
        attention_multiplier,
        attention_scale_by_inverse_layer,
        alibi,
        embedding_norm: (family == Family::Bloom).then_some("word_embeddings_layernorm"),
        logits_scaling,
        nope_layers,
        norm_unit_offset: matches!(
            family,
            Family::Gemma | Family::Gemma2 | Family::Gemma3Text | Family::Nemotron
        ),
        norm_kind: match family {
            Family::Olmo
            | Family::Starcoder2
            | Family::Stablelm
            | Family::Nemotron
            | Family::Cohere
            | Family::Phi
            | Family::GptNeox
            | Family::Gpt2
            | Family::GptBigcode
            | Family::GptNeo
            | Family::Gptj
            | Family::Falcon
            | Family::Bloom
            | Family::Opt => NormKind::Layer,
            _ => NormKind::Rms,
        },
        norm_weight: family != Family::Olmo && norm_affine,
        norm_bias: matches!(
            family,
            Family::Starcoder2
                | Family::Stablelm
                | Family::Nemotron
                | Family::Phi
                | Family::GptNeox
                | Family::Gpt2
                | Family::GptBigcode
                | Family::GptNeo
                | Family::Gptj
                | Family::Falcon
                | Family::Bloom
        ) || (family == Family::Opt && norm_affine),
        mlp_gated: !matches!(
            family,
            Family::Starcoder2
                | Family::Arcee
                | Family::Nemotron
                | Family::Phi
                | Family::GptNeox
                | Family::Gpt2
                | Family::GptBigcode
                | Family::GptNeo
                | Family::Gptj
                | Family::Falcon
                | Family::Bloom
                | Family::Opt
        ),
        mlp_names: match family {
            Family::Starcoder2 | Family::Gpt2 | Family::GptBigcode | Family::GptNeo => ["gate_proj", "c_fc", "c_proj"],
            Family::Gptj => ["gate_proj", "fc_in", "fc_out"],
            Family::Phi | Family::Opt => ["gate_proj", "fc1", "fc2"],
            Family::GptNeox | Family::Falcon | Family::Bloom => ["gate_proj", "dense_h_to_4h", "dense_4h_to_h"],
            _ => ["gate_proj", "up_proj", "down_proj"],
        },
        moe: moe(f, family, num_hidden_layers, intermediate_size)?,
        clip_after_qk_norm: family == Family::Olmoe,
        clip_qkv,
        latent_attention,
    })
}

/// DeepSeek-V3's latent attention shapes (`None` for the other families), with its config class's defaults.
fn latent_attention(f: &Fields, family: Family) -> Result<Option<LatentAttentionConfig>> {
    if family != Family::DeepseekV3 {
        return Ok(None);
    }
    let dim = |key: &str, default: usize| -> Result<usize> {
        match f.or(key, Some(default), USIZE)?.unwrap_or(default) {
            0 => Err(f.error(key, "must be positive")),
            n => Ok(n),
        }
    };
    let q_lora_rank = match f.map.get("q_lora_rank") {
        Some(Value::Null) => None,
        _ => Some(dim("q_lora_rank", 1536)?),
    };
    let rope_dim = dim("qk_rope_head_dim", 64)?;
    if !rope_dim.is_multiple_of(2) {
        return Err(f.error("qk_rope_head_dim", "must be even (rotary dimensions come in pairs)"));
    }
    Ok(Some(LatentAttentionConfig {
        q_lora_rank,
        kv_lora_rank: dim("kv_lora_rank", 512)?,
        nope_dim: dim("qk_nope_head_dim", 128)?,
        rope_dim,
        v_dim: dim("v_head_dim", 128)?,
    }))
}

/// DeepSeek-V3's softmax scale for query/key heads of `qk_dim`: `1 / sqrt(qk_dim)`, times the square of YaRN's
/// factor for `mscale_all_dim` when the rotary embedding is scaled (transformers' `yarn_apply_mscale`).
fn latent_attention_scale(f: &Fields, qk_dim: usize) -> Result<f64> {
    let scale = (qk_dim as f64).powf(-0.5);
    let Some(b) = rope_block(f)? else { return Ok(scale) };
    let kind = match b.or("rope_type", None, STRING)? {
        Some(kind) => Some(kind),
        None => b.or("type", None, STRING)?,
    };
    if kind.is_none_or(|k| k == "default") {
        return Ok(scale);
    }
    match b.or("mscale_all_dim", None, F64)? {
        Some(all) if all != 0.0 => {
            let m = yarn_mscale(b.required("factor", F64)?, all);
            Ok(scale * m * m)
        }
        _ => Ok(scale),
    }
}

/// The mixture-of-experts settings of the MoE families (`None` for the others), with their config classes'
/// defaults.
fn moe(f: &Fields, family: Family, layers: usize, intermediate_size: usize) -> Result<Option<MoeConfig>> {
    let (default_experts, default_top_k) = match family {
        Family::Mixtral => (8, 2),
        Family::Qwen2Moe => (60, 4),
        Family::Qwen3Moe => (128, 8),
        Family::Olmoe => (64, 8),
        Family::DeepseekV3 => (256, 8),
        _ => return Ok(None),
    };
    let count = |key: &str, default: usize| -> Result<usize> {
        match f.or(key, Some(default), USIZE)?.unwrap_or(default) {
            0 => Err(f.error(key, "must be positive")),
            n => Ok(n),
        }
    };
    // transformers treats the two spellings as one attribute and writes either.
    let experts_key = match (family, f.map.contains_key("num_local_experts")) {
        (Family::DeepseekV3, false) => "n_routed_experts",
        (_, true) => "num_local_experts",
        (_, false) => "num_experts",
    };
    let num_experts = count(experts_key, default_experts)?;
    let top_k = count("num_experts_per_tok", default_top_k)?;
    if top_k > num_experts {
        return Err(f.error(
            "num_experts_per_tok",
            &format!("{top_k} is more than the {num_experts} experts"),
        ));
    }
    let qwen = matches!(family, Family::Qwen2Moe | Family::Qwen3Moe);
    let expert_intermediate_size = match family {
        Family::Qwen2Moe => count("moe_intermediate_size", 1408)?,
        Family::Qwen3Moe => count("moe_intermediate_size", 768)?,
        Family::DeepseekV3 => count("moe_intermediate_size", 2048)?,
        _ => intermediate_size,
    };
    let normalize_top_k = match family {
        Family::Mixtral => true,
        Family::DeepseekV3 => f.or("norm_topk_prob", Some(true), BOOL)?.unwrap_or(true),
        _ => f.or("norm_topk_prob", Some(false), BOOL)?.unwrap_or(false),
    };
    let shared_expert = match family {
        Family::Qwen2Moe => Some(SharedExpertConfig {
            name: "shared_expert",
            intermediate_size: count("shared_expert_intermediate_size", 5632)?,
            gated: true,
        }),
        // n_shared_experts of them run as one MLP as wide as all of them.
        Family::DeepseekV3 => match f.or("n_shared_experts", Some(1), USIZE)?.unwrap_or(1) {
            0 => None,
            n => Some(SharedExpertConfig {
                name: "shared_experts",
                intermediate_size: n * expert_intermediate_size,
                gated: false,
            }),
        },
        _ => None,
    };
    let scoring = match family {
        Family::DeepseekV3 => {
            let groups = count("n_group", 8)?;
            let top_groups = count("topk_group", 4)?;
            let per_group = num_experts / groups;
            if !num_experts.is_multiple_of(groups) || per_group < 2 {
                return Err(f.error(
                    "n_group",
                    &format!("{groups} groups do not split {num_experts} experts in equal groups of at least 2"),
                ));
            }
            if top_groups > groups || top_k > top_groups * per_group {
                return Err(f.error(
                    "topk_group",
                    &format!(
                        "{top_groups} of {groups} groups of {per_group} experts cannot hold {top_k} chosen experts"
                    ),
                ));
            }
            RouterScoring::GroupedSigmoid { groups, top_groups }
        }
        _ => RouterScoring::Softmax,
    };
    let routed_scaling_factor = match family {
        Family::DeepseekV3 => match f.or("routed_scaling_factor", Some(2.5), F64)?.unwrap_or(2.5) {
            s if s > 0.0 && s.is_finite() => s,
            _ => return Err(f.error("routed_scaling_factor", "must be positive")),
        },
        _ => 1.0,
    };
    let dense_layers = if qwen {
        let step = count("decoder_sparse_step", 1)?;
        let listed = match f.map.get("mlp_only_layers") {
            None | Some(Value::Null) => Vec::new(),
            // Indices past the last layer name no layer (transformers ignores them too).
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    (USIZE.read)(v).ok_or_else(|| f.error("mlp_only_layers", &format!("{v} is not a layer index")))
                })
                .collect::<Result<Vec<usize>>>()?,
            Some(other) => return Err(f.error("mlp_only_layers", &format!("expected a list, found {other}"))),
        };
        (0..layers)
            .filter(|i| listed.contains(i) || (i + 1) % step != 0)
            .collect()
    } else if family == Family::DeepseekV3 {
        let dense = f.or("first_k_dense_replace", Some(3), USIZE)?.unwrap_or(3);
        (0..dense.min(layers)).collect()
    } else {
        Vec::new()
    };
    let jitter = match family {
        Family::Mixtral => f.or("router_jitter_noise", Some(0.0), F64)?.unwrap_or(0.0),
        _ => 0.0,
    };
    let training_unsupported = if jitter != 0.0 {
        Some(f.error(
            "router_jitter_noise",
            "router noise in training is not supported; set it to 0",
        ))
    } else if family != Family::DeepseekV3
        && f.or("output_router_logits", Some(false), BOOL)? == Some(true)
        && f.or(
            "router_aux_loss_coef",
            Some(if family == Family::Olmoe { 0.01 } else { 0.001 }),
            F64,
        )? != Some(0.0)
    {
        // transformers adds the loss times router_aux_loss_coef: a coefficient of 0 trains as without it.
        Some(f.error(
            "output_router_logits",
            "the router's load-balancing loss is not supported in training; set it to false (or \
             router_aux_loss_coef to 0)",
        ))
    } else {
        None
    }
    .map(|e| e.to_string());
    Ok(Some(MoeConfig {
        num_experts,
        top_k,
        expert_intermediate_size,
        normalize_top_k,
        scoring,
        routed_scaling_factor,
        shared_expert,
        dense_layers,
        block_name: if family == Family::Mixtral {
            "block_sparse_moe"
        } else {
            "mlp"
        },
        expert_names: if family == Family::Mixtral {
            ["w1", "w3", "w2"]
        } else {
            ["gate_proj", "up_proj", "down_proj"]
        },
        training_unsupported,
    }))
}

/// SmolLM3's `no_rope_layers`: one 0 (no rotary) or 1 per layer; when absent, every `no_rope_layer_interval`-th
/// layer (default 4) goes without. Other families rotate every layer.
fn nope_layers(f: &Fields, family: Family, layers: usize) -> Result<Vec<usize>> {
    if family != Family::Smollm3 {
        return Ok(Vec::new());
    }
    let rotates = match per_layer(f, "no_rope_layers", layers, "0 or 1", |v| match v.as_u64() {
        Some(flag @ (0 | 1)) => Some(flag == 1),
        _ => None,
    })? {
        Some(rotates) => rotates,
        None => {
            let interval = f.or("no_rope_layer_interval", Some(4), USIZE)?.unwrap_or(4);
            if interval == 0 {
                return Err(f.error("no_rope_layer_interval", "must be positive"));
            }
            (0..layers).map(|i| (i + 1) % interval != 0).collect()
        }
    };
    Ok((0..layers).filter(|&i| !rotates[i]).collect())
}

/// A list of one entry per layer (`no_rope_layers`, `layer_types`), each read by `read` (`None`: not one of
/// `expected`); `None` when the key is absent or null.
fn per_layer(
    f: &Fields,
    key: &str,
    layers: usize,
    expected: &str,
    read: impl Fn(&Value) -> Option<bool>,
) -> Result<Option<Vec<bool>>> {
    match f.map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) if items.len() != layers => {
            Err(f.error(key, &format!("has {} entries for {layers} layers", items.len())))
        }
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| read(v).ok_or_else(|| f.error(key, &format!("expected {expected}, found {v}"))))
            .collect::<Result<_>>()
            .map(Some),
        Some(other) => Err(f.error(key, &format!("expected a list, found {other}"))),
    }
}

/// Whether `key` is absent or set: a null, which the config class would refuse, is refused by name.
fn not_null(f: &Fields, key: &str) -> Result<bool> {
    match f.map.get(key) {
        Some(Value::Null) => Err(f.error(key, "must not be null")),
        _ => Ok(true),
    }
}

/// GPT-Neo's local (sliding) layers: `attention_layers` ("global" or "local" per layer), else `attention_types`
/// expanded as its config class expands it (`[[["global", "local"], 12]]`: that pair 12 times).
fn gpt_neo_local_layers(f: &Fields, layers: usize) -> Result<Vec<bool>> {
    let local = |v: &Value| match v.as_str() {
        Some("local") => Some(true),
        Some("global") => Some(false),
        _ => None,
    };
    if let Some(listed) = per_layer(f, "attention_layers", layers, "global or local", local)? {
        return Ok(listed);
    }
    let default = serde_json::json!([[["global", "local"], 12]]);
    let types = match f.map.get("attention_types") {
        None | Some(Value::Null) => &default,
        Some(v) => v,
    };
    let bad = |what: &str| f.error("attention_types", what);
    let mut expanded = Vec::new();
    for entry in types
        .as_array()
        .ok_or_else(|| bad("expected a list of [types, count] pairs"))?
    {
        let (Some(kinds), Some(count)) = (
            entry.get(0).and_then(Value::as_array),
            entry.get(1).and_then(Value::as_u64),
        ) else {
            return Err(bad(&format!("expected [types, count], found {entry}")));
        };
        let total = (kinds.len() as u64)
            .checked_mul(count)
            .and_then(|n| n.checked_add(expanded.len() as u64));
        if total.is_none_or(|n| n > layers as u64) {
            return Err(bad(&format!("gives more layers than num_layers {layers}")));
        }
        for _ in 0..count {
            for kind in kinds {
                expanded.push(local(kind).ok_or_else(|| bad(&format!("expected global or local, found {kind}")))?);
            }
        }
    }
    if expanded.len() != layers {
        return Err(bad(&format!("gives {} layers for num_layers {layers}", expanded.len())));
    }
    Ok(expanded)
}

/// Where a model slides its attention window.
struct Windows {
    /// The window of the sliding layers; `None` when no layer slides.
    window: Option<usize>,
    /// The layers that attend to everything while others slide.
    full_layers: Vec<usize>,
    /// The config sets a window (even if no layer uses it).
    configured: bool,
}

/// The window and the layers that do not slide: Mistral, Mixtral and StarCoder2 slide over every layer unless
/// `sliding_window` is null; EXAONE 4 over the layers `layer_types` (or the pattern of every fourth layer full)
/// marks, OLMo 3 over the layers `layer_types` (or three of every four) marks, Gemma 2 and 3 over the layers
/// `layer_types` (or every other one, five of every six `sliding_window_pattern`) marks, Ministral over the layers
/// `layer_types` (or all) marks; the Qwens and SmolLM3 only with `use_sliding_window`, and then Qwen3-MoE on every layer, the others as
/// `layer_types` lists, or else Qwen2 from layer `max_window_layers` on, Qwen2-MoE on the even layers below it
/// and SmolLM3 on its layers without rotary (`nope`).
fn sliding_window(f: &Fields, family: Family, layers: usize, nope: &[usize]) -> Result<Windows> {
    let none = |configured| {
        Ok(Windows {
            window: None,
            full_layers: Vec::new(),
            configured,
        })
    };
    let window = match family {
        Family::Llama
        | Family::Granite
        | Family::Gemma
        | Family::Olmo2
        | Family::Olmo
        | Family::Arcee
        | Family::SeedOss
        | Family::Stablelm
        | Family::Olmoe
        | Family::Nemotron
        | Family::Cohere
        | Family::Phi
        | Family::GptNeox
        | Family::Gpt2
        | Family::GptBigcode
        | Family::Gptj
        | Family::Falcon
        | Family::Bloom
        | Family::Opt
        | Family::Glm
        | Family::DeepseekV3 => {
            return none(false);
        }
        Family::Mistral => f.or("sliding_window", Some(4096), USIZE)?,
        Family::GptNeo => {
            not_null(f, "window_size")?;
            f.or("window_size", Some(256), USIZE)?
        }
        Family::Starcoder2 | Family::Mixtral | Family::Phi3 => f.or("sliding_window", None, USIZE)?,
        Family::Exaone4 | Family::Ministral | Family::Olmo3 | Family::Gemma2 | Family::Gemma3Text => {
            f.or("sliding_window", Some(4096), USIZE)?
        }
        Family::Qwen2 | Family::Qwen3 | Family::Smollm3 | Family::Qwen2Moe | Family::Qwen3Moe => {
            if !f.or("use_sliding_window", Some(false), BOOL)?.unwrap_or(false) {
                return none(false);
            }
            let default = if family == Family::Smollm3 { None } else { Some(4096) };
            f.or("sliding_window", default, USIZE)?
        }
    };
    let Some(window) = window else { return none(false) };
    if window == 0 {
        let key = if family == Family::GptNeo {
            "window_size"
        } else {
            "sliding_window"
        };
        return Err(f.error(key, "must be positive"));
    }
    if matches!(
        family,
        Family::Mistral | Family::Starcoder2 | Family::Mixtral | Family::Qwen3Moe | Family::Phi3
    ) {
        return Ok(Windows {
            window: Some(window),
            full_layers: Vec::new(),
            configured: true,
        });
    }
    let listed = match family {
        Family::GptNeo => Some(gpt_neo_local_layers(f, layers)?),
        _ => per_layer(
            f,
            "layer_types",
            layers,
            "sliding_attention or full_attention",
            |v| match v.as_str() {
                Some("sliding_attention") => Some(true),
                Some("full_attention") => Some(false),
                _ => None,
            },
        )?,
    };
    let sliding: Vec<bool> = match listed {
        Some(sliding) => sliding,
        None if family == Family::Exaone4 => {
            let pattern = f.or("sliding_window_pattern", Some(4), USIZE)?.unwrap_or(4).max(1);
            (0..layers).map(|i| (i + 1) % pattern != 0).collect()
        }
        None if family == Family::Olmo3 => (0..layers).map(|i| (i + 1) % 4 != 0).collect(),
        None if family == Family::Gemma2 => (0..layers).map(|i| i % 2 == 0).collect(),
        None if family == Family::Gemma3Text => {
            let pattern = f.or("sliding_window_pattern", Some(6), USIZE)?.unwrap_or(6).max(1);
            (0..layers).map(|i| (i + 1) % pattern != 0).collect()
        }
        None if family == Family::Ministral => vec![true; layers],
        None if family == Family::Smollm3 => (0..layers).map(|i| nope.contains(&i)).collect(),
        // Qwen2-MoE slides on every other layer below max_window_layers.
        None if family == Family::Qwen2Moe => {
            let below = f.or("max_window_layers", Some(28), USIZE)?.unwrap_or(28);
            (0..layers).map(|i| i % 2 == 0 && i < below).collect()
        }
        None => {
            let first = f.or("max_window_layers", Some(28), USIZE)?.unwrap_or(28);
            (0..layers).map(|i| i >= first).collect()
        }
    };
    if !sliding.contains(&true) {
        return none(true);
    }
    Ok(Windows {
        window: Some(window),
        full_layers: (0..layers).filter(|&i| !sliding[i]).collect(),
        configured: true,
    })
}

/// The leading dimensions of a head that rotate: `partial_rotary_factor` of them (in the rope block, else at the
/// top level; GPT-NeoX's `rotary_pct`) for the families whose attention splits the heads; every other family
/// rotates whole heads and refuses a partial factor.
fn rotary_dim(f: &Fields, family: Family, head_dim: usize) -> Result<usize> {
    // GPT-J names its rotated dimensions; without one, transformers' GPT-J rotates by the hidden size (only a
    // single head fits), and it fails on an odd count.
    if family == Family::Gptj {
        return match f.or("rotary_dim", Some(64), USIZE)? {
            Some(r) if r > 0 && r <= head_dim && r % 2 == 0 => Ok(r),
            Some(r) => Err(f.error(
                "rotary_dim",
                &format!("{r} is not an even number up to head_dim {head_dim}"),
            )),
            None => Err(f.error(
                "rotary_dim",
                "null (rotating by the whole hidden size) is not supported",
            )),
        };
    }
    let block = rope_block(f)?;
    let nested = match &block {
        Some(b) => b.or("partial_rotary_factor", None, F64)?,
        None => None,
    };
    let default = match family {
        Family::Stablelm => 0.25,
        Family::Nemotron | Family::Phi | Family::Glm => 0.5,
        Family::GptNeox => 0.25,
        _ => 1.0,
    };
    let factor = match nested {
        Some(p) => p,
        // GPT-NeoX's config class reads only its classic `rotary_pct`, even beside a `partial_rotary_factor`.
        None if family == Family::GptNeox => f.or("rotary_pct", Some(default), F64)?.unwrap_or(default),
        None => f.or("partial_rotary_factor", Some(default), F64)?.unwrap_or(default),
    };
    if factor == 1.0 {
        return Ok(head_dim);
    }
    let dim = (head_dim as f64 * factor) as usize;
    if !matches!(
        family,
        Family::Stablelm | Family::Nemotron | Family::Phi | Family::Phi3 | Family::GptNeox | Family::Glm
    ) {
        return Err(f.error(
            "partial_rotary_factor",
            "partial rotary embeddings are not supported for this family",
        ));
    }
    // An odd number rotates one dimension more where transformers slices the heads by the width of its cos
    // table; StableLM and Phi slice them by the odd number and fail.
    let odd_ok = matches!(family, Family::Nemotron | Family::Phi3 | Family::GptNeox | Family::Glm);
    if !(factor > 0.0 && factor < 1.0) || dim == 0 || (!dim.is_multiple_of(2) && !odd_ok) {
        return Err(f.error(
            "partial_rotary_factor",
            &format!("{factor} of heads of {head_dim} is not an even number of rotated dimensions"),
        ));
    }
    Ok(dim)
}

/// The rotary block transformers' config classes read: a non-empty classic `rope_scaling`, which they take over
/// `rope_parameters` when a config has both, else `rope_parameters` (transformers 5).
fn rope_block<'a>(f: &Fields<'a>) -> Result<Option<Fields<'a>>> {
    match f.object("rope_scaling")? {
        Some(b) if !b.map.is_empty() => Ok(Some(b)),
        _ => f.object("rope_parameters"),
    }
}

/// The rotary settings of the full-attention layers and, where they differ, of the sliding ones, read as
/// transformers 5.17 reads them: the block's `rope_theta`, else the top-level one (GPT-NeoX's `rotary_emb_base`),
/// else the family's default. OLMo 3's and Gemma 3's `rope_parameters` may hold one block per layer type; their
/// classic forms scale the full-attention layers only and give the sliding ones Gemma 3's `rope_local_base_freq`,
/// or OLMo 3's default theta whatever `rope_theta` says.
fn rope_configs(
    f: &Fields,
    family: Family,
    max_position_embeddings: usize,
) -> Result<(RopeConfig, Option<RopeConfig>)> {
    // GPT-J's sin/cos table always has base 10000 and no scaling, whatever rope keys its config carries.
    if family == Family::Gptj {
        return Ok((
            RopeConfig {
                theta: 10000.0,
                scaling: RopeScaling::Default,
            },
            None,
        ));
    }
    let (full_default, sliding_default) = match family {
        Family::Olmo3 | Family::Cohere => (500_000.0, 500_000.0),
        Family::Gemma3Text => (1_000_000.0, 10000.0),
        Family::Mixtral => (1_000_000.0, 1_000_000.0),
        Family::Smollm3 => (2_000_000.0, 2_000_000.0),
        _ => (10000.0, 10000.0),
    };
    // GPT-NeoX's config class reads only `rotary_emb_base`, even beside a `rope_theta`.
    let top_theta = match family {
        Family::GptNeox => f.or("rotary_emb_base", None, F64)?,
        _ => f.or("rope_theta", None, F64)?,
    };
    // A top-level pretraining length overrides the block's for llama3, yarn and longrope; Phi-3's config class
    // always has one (4096 unless config.json says otherwise).
    let phi3_default = (family == Family::Phi3).then_some(4096);
    let top_original = match f.or("original_max_position_embeddings", phi3_default, USIZE)? {
        Some(0) => return Err(f.error("original_max_position_embeddings", "must be positive")),
        n => n,
    };
    let classic = rope_block(f)?;
    let per_type = match &classic {
        Some(p) if p.map.values().any(Value::is_object) => Some(p.clone()),
        _ => None,
    };
    let (full, sliding) = match per_type {
        Some(_) if !matches!(family, Family::Olmo3 | Family::Gemma3Text) => {
            return Err(f.error("rope_parameters", "per-layer-type rope parameters are not supported"));
        }
        Some(p) => {
            // A block without `rope_theta` takes the top-level one (the full-attention layers), Gemma 3's
            // `rope_local_base_freq` (the sliding ones) or the default; a missing block is default RoPE.
            let block = |name: &str, fallback: Option<f64>| -> Result<RopeConfig> {
                let b = p.object(name)?;
                let theta = match &b {
                    Some(b) => b.or("rope_theta", None, F64)?,
                    None => None,
                };
                rope_config(f, family, b, theta.or(fallback), max_position_embeddings, None)
            };
            let local = match family {
                Family::Gemma3Text => f.or("rope_local_base_freq", None, F64)?,
                _ => None,
            };
            (
                block("full_attention", Some(top_theta.unwrap_or(full_default)))?,
                block("sliding_attention", Some(local.unwrap_or(sliding_default)))?,
            )
        }
        None => {
            let theta = match &classic {
                Some(b) => b.or("rope_theta", None, F64)?.or(top_theta),
                None => top_theta,
            };
            let full = rope_config(
                f,
                family,
                classic,
                theta.or(Some(full_default)),
                max_position_embeddings,
                top_original,
            )?;
            let sliding = match family {
                Family::Olmo3 => RopeConfig {
                    theta: sliding_default,
                    scaling: RopeScaling::Default,
                },
                Family::Gemma3Text => RopeConfig {
                    theta: f
                        .or("rope_local_base_freq", Some(sliding_default), F64)?
                        .unwrap_or(sliding_default),
                    scaling: RopeScaling::Default,
                },
                _ => full.clone(),
            };
            (full, sliding)
        }
    };
    let sliding = (sliding != full).then_some(sliding);
    Ok((full, sliding))
}

/// One rotary setting from its block (`rope_parameters`, a layer type's block of it, or `rope_scaling`) and theta;
/// `top_original` is a pretraining length that overrides the block's.
fn rope_config(
    f: &Fields,
    family: Family,
    block: Option<Fields>,
    theta: Option<f64>,
    max_position_embeddings: usize,
    top_original: Option<usize>,
) -> Result<RopeConfig> {
    let theta = theta.unwrap_or(10000.0);
    if !(theta > 0.0 && theta.is_finite()) {
        return Err(f.error("rope_theta", "must be positive"));
    }
    let scaling = match block {
        Some(b) => rope_scaling(&b, family, max_position_embeddings, top_original)?,
        None => RopeScaling::Default,
    };
    Ok(RopeConfig { theta, scaling })
}

fn rope_scaling(
    b: &Fields,
    family: Family,
    max_position_embeddings: usize,
    top_original: Option<usize>,
) -> Result<RopeScaling> {
    let type_key = if b.map.contains_key("rope_type") {
        "rope_type"
    } else {
        "type"
    };
    let mut kind = b.or(type_key, None, STRING)?.unwrap_or_else(|| "default".to_string());
    if family == Family::Phi3 {
        // Phi-3's config class renames the types its first long-context checkpoints used, and takes no other.
        if kind == "su" || kind == "yarn" {
            kind = "longrope".to_string();
        }
        if kind != "default" && kind != "longrope" {
            return Err(b.error(
                type_key,
                &format!("Phi-3 takes rope type default or longrope, not '{kind}'"),
            ));
        }
    }
    let factor = |key: &str| -> Result<f64> {
        let v = b.required(key, F64)?;
        if !(v > 0.0 && v.is_finite()) {
            return Err(b.error(key, "must be positive"));
        }
        Ok(v)
    };
    let original = || -> Result<usize> {
        let n = match top_original {
            Some(n) => Some(n),
            None => b.or("original_max_position_embeddings", None, USIZE)?,
        };
        match n {
            Some(0) => Err(b.error("original_max_position_embeddings", "must be positive")),
            Some(n) => Ok(n),
            None => Ok(max_position_embeddings),
        }
    };
    // Where the block gives no factor: how far past the pretraining length the model reaches.
    let factor_or_stretch = |original: usize| -> Result<f64> {
        match b.map.get("factor") {
            None | Some(Value::Null) => Ok(max_position_embeddings as f64 / original as f64),
            Some(_) => factor("factor"),
        }
    };
    Ok(match kind.as_str() {
        "default" => RopeScaling::Default,
        "linear" => RopeScaling::Linear {
            factor: factor("factor")?,
        },
        "dynamic" => RopeScaling::Dynamic {
            factor: factor("factor")?,
            original_max_position_embeddings: max_position_embeddings,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: factor("factor")?,
            low_freq_factor: factor("low_freq_factor")?,
            high_freq_factor: factor("high_freq_factor")?,
            original_max_position_embeddings: original()?,
        },
        "longrope" => {
            let original = original()?;
            let list = |key: &str| -> Result<Vec<f64>> {
                let v = b.required(key, F64_LIST)?;
                if v.iter().any(|&x| !(x > 0.0 && x.is_finite())) {
                    return Err(b.error(key, "factors must be positive"));
                }
                Ok(v)
            };
            let factor = factor_or_stretch(original)?;
            let attention_factor = match b.or("attention_factor", None, F64)? {
                Some(a) => a,
                None if factor <= 1.0 => 1.0,
                None => (1.0 + factor.ln() / (original as f64).ln()).sqrt(),
            };
            RopeScaling::LongRope {
                short_factor: list("short_factor")?,
                long_factor: list("long_factor")?,
                original_max_position_embeddings: original,
                attention_factor,
            }
        }
        "yarn" => {
            let original = original()?;
            let factor = factor_or_stretch(original)?;
            if b.or("truncate", Some(true), BOOL)? == Some(false) {
                return Err(b.error("truncate", "yarn without truncation is not supported"));
            }
            let mscale = |key: &str| b.or(key, None, F64);
            let attention_factor = match (
                b.or("attention_factor", None, F64)?,
                mscale("mscale")?,
                mscale("mscale_all_dim")?,
            ) {
                (Some(a), _, _) => Some(a),
                (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                    Some(yarn_mscale(factor, m) / yarn_mscale(factor, all))
                }
                _ => None,
            };
            let beta = |key: &str, default: f64| -> Result<f64> {
                Ok(b.or(key, None, F64)?.filter(|&v| v != 0.0).unwrap_or(default))
            };
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: original,
                beta_fast: beta("beta_fast", 32.0)?,
                beta_slow: beta("beta_slow", 1.0)?,
                attention_factor,
            }
        }
        other => {
            return Err(b.error(
                type_key,
                &format!(
                    "unsupported rope type '{other}'; supported: default, linear, dynamic, llama3, yarn, longrope"
                ),
            ));
        }
    })
}

/// YaRN's attention scale for `mscale` / `mscale_all_dim` (DeepSeek-style configs).
fn yarn_mscale(factor: f64, mscale: f64) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * mscale * factor.ln() + 1.0
    }
}

/// Typed access to one JSON object, with errors naming the file and the field.
#[derive(Clone)]
struct Fields<'a> {
    map: &'a Map<String, Value>,
    path: &'a Path,
    /// `parent.` for a nested object, so errors name the field as `rope_scaling.factor`.
    prefix: String,
}

impl<'a> Fields<'a> {
    fn error(&self, key: &str, message: &str) -> Error {
        Error::Config {
            path: self.path.to_path_buf(),
            message: format!("field `{}{key}`: {message}", self.prefix),
        }
    }

    /// `default` when the key is absent, `None` when it is null, else the value read as `kind`.
    fn or<T>(&self, key: &str, default: Option<T>, kind: Kind<T>) -> Result<Option<T>> {
        match self.map.get(key) {
            None => Ok(default),
            Some(Value::Null) => Ok(None),
            Some(v) => (kind.read)(v)
                .map(Some)
                .ok_or_else(|| self.error(key, &format!("expected {}, found {v}", kind.expected))),
        }
    }

    fn required<T>(&self, key: &str, kind: Kind<T>) -> Result<T> {
        self.or(key, None, kind)?.ok_or_else(|| self.error(key, "missing"))
    }

    fn object(&self, key: &str) -> Result<Option<Fields<'a>>> {
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(map)) => Ok(Some(Fields {
                map,
                path: self.path,
                prefix: format!("{}{key}.", self.prefix),
            })),
            Some(v) => Err(self.error(key, &format!("expected an object, found {v}"))),
        }
    }
}

/// How to read one kind of JSON value, and what to call it when the value is something else.
struct Kind<T> {
    read: fn(&Value) -> Option<T>,
    expected: &'static str,
}

// Sizes below 2^31: no tensor the kernels index holds more elements, and sums and products of a few sizes (the
// parameter count, the widths derived from others) stay far from overflowing.
const USIZE: Kind<usize> = Kind {
    read: |v| v.as_u64().filter(|&n| n <= i32::MAX as u64).map(|n| n as usize),
    expected: "a non-negative integer below 2^31",
};
const U32: Kind<u32> = Kind {
    read: |v| v.as_u64().and_then(|n| u32::try_from(n).ok()),
    expected: "a token id",
};
const I64: Kind<i64> = Kind {
    read: Value::as_i64,
    expected: "an integer",
};
const F64: Kind<f64> = Kind {
    read: Value::as_f64,
    expected: "a number",
};
const F64_LIST: Kind<Vec<f64>> = Kind {
    read: |v| v.as_array()?.iter().map(Value::as_f64).collect(),
    expected: "a list of numbers",
};
const BOOL: Kind<bool> = Kind {
    read: Value::as_bool,
    expected: "true or false",
};
const STRING: Kind<String> = Kind {
    read: |v| v.as_str().map(str::to_string),
    expected: "a string",
};
