//! The registry of architectures: ARCHITECTURES.md is current, every validated family has fixtures of its own
//! `model_type` (which the parity tests run), and each family's real-size config parses with the parameter count
//! its model card publishes.

mod common;
use common::fixtures::fixture;
use common::*;

use std::path::Path;

use hierarchos::nn::registry::{markdown, validated_fixtures};
use hierarchos::nn::{ARCHITECTURES, CausalLm, ModelConfig, Status, Weights};

#[test]
fn architectures_md_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURES.md");
    let file = std::fs::read_to_string(&path).unwrap();
    assert!(
        file == markdown(),
        "ARCHITECTURES.md is stale: run `cargo run -p hierarchos-cli -- archs --markdown > ARCHITECTURES.md`"
    );
}

/// A validated family has at least one fixture and no gap; a family with fixtures that is not validated says
/// what it lacks. Every fixture is of its family's own `model_type`, with the references the parity tests compare
/// against; and the parameter count computed from the config is the built model's.
#[test]
fn families_have_their_fixtures() {
    for arch in &ARCHITECTURES {
        let validated = arch.status == Status::Validated;
        assert!(
            !validated || !arch.fixtures.is_empty(),
            "{:?} is validated without fixtures",
            arch.family
        );
        assert_eq!(
            arch.gap.is_some(),
            !validated && !arch.fixtures.is_empty(),
            "{:?}: a gap is what keeps a family with fixtures from validated",
            arch.family
        );
        for name in arch.fixtures {
            let dir = fixture(name);
            let config = ModelConfig::from_file(&dir.join("config.json")).unwrap();
            assert_eq!(config.model_type, arch.family.model_type(), "fixture {name}");
            let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            for t in ["logits", "greedy_ids", "greedy_logits", "adamw_damped_losses"] {
                assert!(st.tensor(t).is_ok(), "fixture {name} lacks {t}");
            }
            let lm = CausalLm::load(&config, &Weights::open(&dir).unwrap(), &dev()).unwrap();
            let built: usize = lm.parameters().iter().map(|(_, t)| t.numel()).sum();
            assert_eq!(config.parameter_count(), built as u64, "fixture {name}");
        }
    }
    assert!(validated_fixtures().contains(&"qwen3"));
}

/// Real-size configs as their `config.json` files on the Hub hold them (fields that matter for the shapes), with
/// the parameter counts published for them: exact where the checkpoint's total is known here, else the model
/// card's figure to the digits it gives (e.g. 2.53B).
#[test]
fn real_configs_parse_with_published_parameter_counts() {
    let cases: [(&str, &str, u64); 39] = [
        (
            "meta-llama/Llama-3.2-1B",
            r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
                "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
                "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                 "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                "tie_word_embeddings": true, "attention_bias": false, "mlp_bias": false,
                "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu"}"#,
            1_235_814_400,
        ),
        (
            "mistralai/Mistral-7B-v0.1",
            r#"{"architectures": ["MistralForCausalLM"], "model_type": "mistral", "vocab_size": 32000,
                "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 32768,
                "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
                "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu"}"#,
            7_241_732_096,
        ),
        (
            "Qwen/Qwen2.5-0.5B",
            r#"{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 151936,
                "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 32768,
                "max_window_layers": 24, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
                "sliding_window": 32768, "use_sliding_window": false, "tie_word_embeddings": true,
                "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu"}"#,
            494_032_768,
        ),
        (
            "Qwen/Qwen3-0.6B",
            r#"{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
                "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                "max_position_embeddings": 40960, "max_window_layers": 28, "rms_norm_eps": 1e-06,
                "rope_theta": 1000000, "sliding_window": null, "use_sliding_window": false,
                "attention_bias": false, "tie_word_embeddings": true, "bos_token_id": 151643,
                "eos_token_id": 151645, "hidden_act": "silu"}"#,
            596_049_920,
        ),
        (
            "ibm-granite/granite-3.0-2b-base",
            r#"{"architectures": ["GraniteForCausalLM"], "model_type": "granite", "vocab_size": 49155,
                "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 40,
                "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 4096,
                "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "attention_bias": false, "mlp_bias": false,
                "embedding_multiplier": 12.0, "residual_multiplier": 0.22, "attention_multiplier": 0.015625,
                "logits_scaling": 8.0, "tie_word_embeddings": true, "bos_token_id": 0, "eos_token_id": 0,
                "hidden_act": "silu"}"#,
            2_530_000_000,
        ),
        (
            "HuggingFaceTB/SmolLM3-3B",
            r#"{"architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", "vocab_size": 128256,
                "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
                "num_attention_heads": 16, "num_key_value_heads": 4, "max_position_embeddings": 65536,
                "rms_norm_eps": 1e-06, "rope_theta": 5000000.0, "use_sliding_window": false,
                "no_rope_layer_interval": 4, "attention_bias": false, "mlp_bias": false,
                "tie_word_embeddings": true, "bos_token_id": null, "eos_token_id": 128012, "hidden_act": "silu"}"#,
            3_080_000_000,
        ),
        (
            "google/gemma-2b",
            r#"{"architectures": ["GemmaForCausalLM"], "model_type": "gemma", "vocab_size": 256000,
                "hidden_size": 2048, "intermediate_size": 16384, "num_hidden_layers": 18,
                "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256,
                "max_position_embeddings": 8192, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
                "attention_bias": false, "hidden_act": "gelu", "bos_token_id": 2, "eos_token_id": 1,
                "pad_token_id": 0}"#,
            2_506_172_416,
        ),
        (
            "allenai/OLMo-2-1124-7B",
            r#"{"architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2", "vocab_size": 100352,
                "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 4096,
                "rms_norm_eps": 1e-06, "rope_theta": 500000, "attention_bias": false,
                "tie_word_embeddings": false, "bos_token_id": null, "eos_token_id": 100257,
                "pad_token_id": 100277, "hidden_act": "silu"}"#,
            7_300_000_000,
        ),
        (
            "LGAI-EXAONE/EXAONE-4.0-1.2B",
            r#"{"architectures": ["Exaone4ForCausalLM"], "model_type": "exaone4", "vocab_size": 102400,
                "hidden_size": 2048, "intermediate_size": 4096, "num_hidden_layers": 30,
                "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                "max_position_embeddings": 65536, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
                "rope_scaling": {"factor": 16.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                 "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                "sliding_window": null, "tie_word_embeddings": true, "bos_token_id": 1,
                "eos_token_id": 361, "hidden_act": "silu"}"#,
            1_280_000_000,
        ),
        (
            "allenai/OLMo-1B-hf",
            r#"{"architectures": ["OlmoForCausalLM"], "model_type": "olmo", "vocab_size": 50304,
                "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                "num_attention_heads": 16, "num_key_value_heads": 16, "max_position_embeddings": 2048,
                "rope_theta": 10000.0, "attention_bias": false, "clip_qkv": null, "tie_word_embeddings": true,
                "bos_token_id": null, "eos_token_id": 50279, "pad_token_id": 1, "hidden_act": "silu"}"#,
            1_180_000_000,
        ),
        (
            "bigcode/starcoder2-3b",
            r#"{"architectures": ["Starcoder2ForCausalLM"], "model_type": "starcoder2", "vocab_size": 49152,
                "hidden_size": 3072, "intermediate_size": 12288, "num_hidden_layers": 30,
                "num_attention_heads": 24, "num_key_value_heads": 2, "max_position_embeddings": 16384,
                "norm_epsilon": 1e-05, "rope_theta": 999999.4420358813, "sliding_window": 4096,
                "use_bias": true, "hidden_act": "gelu_pytorch_tanh", "bos_token_id": 0, "eos_token_id": 0}"#,
            3_030_000_000,
        ),
        (
            "arcee-ai/AFM-4.5B",
            r#"{"architectures": ["ArceeForCausalLM"], "model_type": "arcee", "vocab_size": 128004,
                "hidden_size": 2560, "intermediate_size": 18432, "num_hidden_layers": 36,
                "num_attention_heads": 20, "num_key_value_heads": 4, "head_dim": 128,
                "max_position_embeddings": 65536, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
                "rope_scaling": {"rope_type": "yarn", "factor": 20.0, "original_max_position_embeddings": 4096,
                                 "beta_fast": 32.0, "beta_slow": 1.0},
                "hidden_act": "relu2", "tie_word_embeddings": false, "attention_bias": false,
                "mlp_bias": false, "bos_token_id": 128000, "eos_token_id": 128001}"#,
            4_620_000_000,
        ),
        (
            "ByteDance-Seed/Seed-OSS-36B-Base",
            r#"{"architectures": ["SeedOssForCausalLM"], "model_type": "seed_oss", "vocab_size": 155136,
                "hidden_size": 5120, "intermediate_size": 27648, "num_hidden_layers": 64,
                "num_attention_heads": 80, "num_key_value_heads": 8, "head_dim": 128,
                "max_position_embeddings": 524288, "rms_norm_eps": 1e-06, "rope_theta": 10000000.0,
                "attention_bias": true, "attention_out_bias": false, "mlp_bias": false,
                "tie_word_embeddings": false, "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "silu"}"#,
            36_000_000_000,
        ),
        (
            "stabilityai/stablelm-2-1_6b",
            r#"{"architectures": ["StableLmForCausalLM"], "model_type": "stablelm", "vocab_size": 100352,
                "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
                "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 4096,
                "layer_norm_eps": 1e-05, "rope_theta": 10000, "partial_rotary_factor": 0.25,
                "use_qkv_bias": true, "qk_layernorm": false, "use_parallel_residual": false,
                "tie_word_embeddings": false, "bos_token_id": 100257, "eos_token_id": 100257,
                "hidden_act": "silu"}"#,
            1_640_000_000,
        ),
        (
            "mistralai/Mixtral-8x7B-v0.1",
            r#"{"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": 32000,
                "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 32768,
                "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null,
                "num_local_experts": 8, "num_experts_per_tok": 2, "output_router_logits": false,
                "router_aux_loss_coef": 0.02, "tie_word_embeddings": false, "bos_token_id": 1,
                "eos_token_id": 2, "hidden_act": "silu"}"#,
            46_700_000_000,
        ),
        (
            "Qwen/Qwen1.5-MoE-A2.7B",
            r#"{"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "vocab_size": 151936,
                "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
                "num_attention_heads": 16, "num_key_value_heads": 16, "max_position_embeddings": 8192,
                "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "num_experts": 60,
                "num_experts_per_tok": 4, "norm_topk_prob": false, "decoder_sparse_step": 1,
                "max_window_layers": 21, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
                "sliding_window": 32768, "use_sliding_window": false, "tie_word_embeddings": false,
                "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu"}"#,
            14_300_000_000,
        ),
        (
            "Qwen/Qwen3-30B-A3B",
            r#"{"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 151936,
                "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48,
                "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                "max_position_embeddings": 40960, "moe_intermediate_size": 768, "num_experts": 128,
                "num_experts_per_tok": 8, "norm_topk_prob": true, "decoder_sparse_step": 1,
                "mlp_only_layers": [], "max_window_layers": 48, "rms_norm_eps": 1e-06,
                "rope_theta": 1000000.0, "sliding_window": null, "use_sliding_window": false,
                "attention_bias": false, "tie_word_embeddings": false, "bos_token_id": 151643,
                "eos_token_id": 151645, "hidden_act": "silu"}"#,
            30_500_000_000,
        ),
        (
            "allenai/OLMoE-1B-7B-0924",
            r#"{"architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "vocab_size": 50304,
                "hidden_size": 2048, "intermediate_size": 1024, "num_hidden_layers": 16,
                "num_attention_heads": 16, "num_key_value_heads": 16, "max_position_embeddings": 4096,
                "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": false, "clip_qkv": null,
                "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "attention_bias": false,
                "tie_word_embeddings": false, "bos_token_id": null, "eos_token_id": 50279, "pad_token_id": 1,
                "hidden_act": "silu"}"#,
            6_920_000_000,
        ),
        (
            "mistralai/Ministral-8B-Instruct-2410",
            r#"{"architectures": ["MistralForCausalLM"], "model_type": "ministral", "vocab_size": 131072,
                "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                "max_position_embeddings": 32768, "rms_norm_eps": 1e-05, "rope_theta": 100000000.0,
                "sliding_window": 32768, "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2,
                "hidden_act": "silu"}"#,
            8_020_000_000,
        ),
        (
            "nvidia/Nemotron-Mini-4B-Instruct",
            r#"{"architectures": ["NemotronForCausalLM"], "model_type": "nemotron", "vocab_size": 256000,
                "hidden_size": 3072, "intermediate_size": 9216, "num_hidden_layers": 32,
                "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128,
                "max_position_embeddings": 4096, "norm_eps": 1e-05, "rope_theta": 10000,
                "partial_rotary_factor": 0.5, "hidden_act": "relu2", "attention_bias": false,
                "mlp_bias": false, "tie_word_embeddings": false, "bos_token_id": 2, "eos_token_id": 3}"#,
            4_190_000_000,
        ),
        (
            "allenai/Olmo-3-1025-7B",
            r#"{"architectures": ["Olmo3ForCausalLM"], "model_type": "olmo3", "vocab_size": 100278,
                "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 65536,
                "rms_norm_eps": 1e-06, "rope_theta": 500000,
                "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192,
                                 "attention_factor": 1.2079441541679836, "beta_fast": 32, "beta_slow": 1},
                "sliding_window": 4096, "attention_bias": false, "tie_word_embeddings": false,
                "bos_token_id": null, "eos_token_id": 100257, "pad_token_id": 100277, "hidden_act": "silu"}"#,
            7_300_000_000,
        ),
        (
            "google/gemma-2-2b",
            r#"{"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "vocab_size": 256000,
                "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                "max_position_embeddings": 8192, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
                "query_pre_attn_scalar": 256, "sliding_window": 4096, "final_logit_softcapping": 30.0,
                "attn_logit_softcapping": 50.0, "hidden_activation": "gelu_pytorch_tanh",
                "attention_bias": false, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}"#,
            2_614_341_888,
        ),
        (
            "google/gemma-3-1b-pt",
            r#"{"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 262144,
                "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26,
                "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
                "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
                "rope_local_base_freq": 10000, "rope_scaling": null, "query_pre_attn_scalar": 256,
                "sliding_window": 512, "sliding_window_pattern": 6, "final_logit_softcapping": null,
                "attn_logit_softcapping": null, "hidden_activation": "gelu_pytorch_tanh",
                "attention_bias": false, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}"#,
            999_885_952,
        ),
        (
            "CohereForAI/c4ai-command-r-v01",
            r#"{"architectures": ["CohereForCausalLM"], "model_type": "cohere", "vocab_size": 256000,
                "hidden_size": 8192, "intermediate_size": 22528, "num_hidden_layers": 40,
                "num_attention_heads": 64, "num_key_value_heads": 64, "max_position_embeddings": 8192,
                "layer_norm_eps": 1e-05, "logit_scale": 0.0625, "rope_theta": 8000000.0,
                "use_qk_norm": false, "attention_bias": false, "tie_word_embeddings": true,
                "bos_token_id": 5, "eos_token_id": 255001, "pad_token_id": 0, "hidden_act": "silu"}"#,
            35_000_000_000,
        ),
        (
            "microsoft/phi-2",
            r#"{"architectures": ["PhiForCausalLM"], "model_type": "phi", "vocab_size": 51200,
                "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 2048,
                "layer_norm_eps": 1e-05, "partial_rotary_factor": 0.4, "rope_theta": 10000.0,
                "qk_layernorm": false, "hidden_act": "gelu_new", "tie_word_embeddings": false,
                "bos_token_id": 50256, "eos_token_id": 50256}"#,
            2_779_683_840,
        ),
        (
            "microsoft/Phi-3-mini-4k-instruct",
            r#"{"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": 32064,
                "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 4096,
                "original_max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
                "rope_scaling": null, "sliding_window": 2047, "tie_word_embeddings": false,
                "bos_token_id": 1, "eos_token_id": 32000, "pad_token_id": 32000, "hidden_act": "silu"}"#,
            3_821_079_552,
        ),
        (
            "EleutherAI/pythia-410m",
            r#"{"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "vocab_size": 50304,
                "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                "num_attention_heads": 16, "max_position_embeddings": 2048, "layer_norm_eps": 1e-05,
                "rotary_pct": 0.25, "rotary_emb_base": 10000, "use_parallel_residual": true,
                "hidden_act": "gelu", "tie_word_embeddings": false, "bos_token_id": 0, "eos_token_id": 0}"#,
            405_334_016,
        ),
        (
            "openai-community/gpt2",
            r#"{"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 50257, "n_embd": 768,
                "n_layer": 12, "n_head": 12, "n_positions": 1024, "n_ctx": 1024, "n_inner": null,
                "layer_norm_epsilon": 1e-05, "activation_function": "gelu_new", "scale_attn_weights": true,
                "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1, "bos_token_id": 50256,
                "eos_token_id": 50256}"#,
            124_439_808,
        ),
        (
            "tiiuae/falcon-7b",
            r#"{"architectures": ["FalconForCausalLM"], "model_type": "falcon", "vocab_size": 65024,
                "hidden_size": 4544, "num_hidden_layers": 32, "num_attention_heads": 71,
                "multi_query": true, "parallel_attn": true, "new_decoder_architecture": false, "bias": false,
                "alibi": false, "layer_norm_epsilon": 1e-05, "bos_token_id": 11, "eos_token_id": 11}"#,
            6_921_720_704,
        ),
        (
            "bigscience/bloom-560m",
            r#"{"architectures": ["BloomForCausalLM"], "model_type": "bloom", "vocab_size": 250880,
                "hidden_size": 1024, "n_layer": 24, "n_head": 16, "n_inner": null, "layer_norm_epsilon": 1e-05,
                "apply_residual_connection_post_layernorm": false, "offset_alibi": 100, "pretraining_tp": 1,
                "slow_but_exact": false, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3,
                "unk_token_id": 0}"#,
            559_214_592,
        ),
        (
            "facebook/opt-125m",
            r#"{"architectures": ["OPTForCausalLM"], "model_type": "opt", "vocab_size": 50272, "hidden_size": 768,
                "num_hidden_layers": 12, "num_attention_heads": 12, "ffn_dim": 3072, "max_position_embeddings": 2048,
                "activation_function": "relu", "do_layer_norm_before": true, "word_embed_proj_dim": 768,
                "bos_token_id": 2, "eos_token_id": 2, "pad_token_id": 1, "prefix": "</s>"}"#,
            125_239_296,
        ),
        (
            "bigcode/tiny_starcoder_py",
            r#"{"architectures": ["GPTBigCodeForCausalLM"], "model_type": "gpt_bigcode", "vocab_size": 49152,
                "n_embd": 768, "n_layer": 20, "n_head": 12, "n_inner": 3072, "n_positions": 8192,
                "multi_query": true, "activation_function": "gelu_pytorch_tanh", "layer_norm_epsilon": 1e-05,
                "bos_token_id": 0, "eos_token_id": 0}"#,
            164_000_000,
        ),
        (
            "EleutherAI/gpt-neo-125m",
            r#"{"architectures": ["GPTNeoForCausalLM"], "model_type": "gpt_neo", "vocab_size": 50257,
                "hidden_size": 768, "num_layers": 12, "num_heads": 12, "intermediate_size": null,
                "max_position_embeddings": 2048, "window_size": 256, "attention_types": [[["global", "local"], 6]],
                "activation_function": "gelu_new", "bos_token_id": 50256, "eos_token_id": 50256}"#,
            125_000_000,
        ),
        (
            "EleutherAI/gpt-j-6b",
            r#"{"architectures": ["GPTJForCausalLM"], "model_type": "gptj", "vocab_size": 50400, "n_embd": 4096,
                "n_layer": 28, "n_head": 16, "n_inner": null, "n_positions": 2048, "rotary_dim": 64,
                "activation_function": "gelu_new", "tie_word_embeddings": false, "bos_token_id": 50256,
                "eos_token_id": 50256}"#,
            6_000_000_000,
        ),
        (
            "CohereForAI/c4ai-command-r-plus",
            r#"{"architectures": ["CohereForCausalLM"], "model_type": "cohere", "vocab_size": 256000,
                "hidden_size": 12288, "intermediate_size": 33792, "num_hidden_layers": 64,
                "num_attention_heads": 96, "num_key_value_heads": 8, "max_position_embeddings": 8192,
                "layer_norm_eps": 1e-05, "logit_scale": 0.8333333333333334, "rope_theta": 75000000.0,
                "use_qk_norm": true, "attention_bias": false, "tie_word_embeddings": true,
                "bos_token_id": 5, "eos_token_id": 255001, "pad_token_id": 0, "hidden_act": "silu"}"#,
            104_000_000_000,
        ),
        (
            "stabilityai/stablelm-2-12b",
            r#"{"architectures": ["StableLmForCausalLM"], "model_type": "stablelm", "vocab_size": 100352,
                "hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 40,
                "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 4096,
                "layer_norm_eps": 1e-05, "rope_theta": 10000, "partial_rotary_factor": 0.25,
                "use_qkv_bias": false, "qk_layernorm": true, "use_parallel_residual": true,
                "tie_word_embeddings": false, "bos_token_id": 100257, "eos_token_id": 100257,
                "hidden_act": "silu"}"#,
            12_100_000_000,
        ),
        (
            "THUDM/glm-4-9b-chat-hf",
            r#"{"architectures": ["GlmForCausalLM"], "model_type": "glm", "vocab_size": 151552,
                "hidden_size": 4096, "intermediate_size": 13696, "num_hidden_layers": 40,
                "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128,
                "max_position_embeddings": 131072, "rms_norm_eps": 1.5625e-07, "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5, "attention_bias": true, "tie_word_embeddings": false,
                "eos_token_id": [151329, 151336, 151338], "pad_token_id": 151329, "hidden_act": "silu"}"#,
            9_400_000_000,
        ),
        (
            // The main model (the checkpoint's multi-token-prediction layer 61 is not part of it).
            "deepseek-ai/DeepSeek-V3",
            r#"{"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 129280,
                "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
                "num_hidden_layers": 61, "num_nextn_predict_layers": 1, "num_attention_heads": 128,
                "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256, "ep_size": 1,
                "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
                "v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "noaux_tc", "n_group": 8,
                "topk_group": 4, "num_experts_per_tok": 8, "moe_layer_freq": 1, "first_k_dense_replace": 3,
                "norm_topk_prob": true, "scoring_func": "sigmoid", "hidden_act": "silu",
                "max_position_embeddings": 163840, "rms_norm_eps": 1e-06, "rope_theta": 10000,
                "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                "original_max_position_embeddings": 4096, "type": "yarn"}, "tie_word_embeddings": false,
                "bos_token_id": 0, "eos_token_id": 1, "attention_bias": false, "attention_dropout": 0.0}"#,
            671_000_000_000,
        ),
        (
            // DeepSeek-V2-Lite's layout (no q_lora_rank, one group) under the deepseek_v3 type.
            "moonshotai/Moonlight-16B-A3B",
            r#"{"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 163840,
                "hidden_size": 2048, "intermediate_size": 11264, "moe_intermediate_size": 1408,
                "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16,
                "n_shared_experts": 2, "n_routed_experts": 64, "routed_scaling_factor": 2.446, "kv_lora_rank": 512,
                "q_lora_rank": null, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
                "n_group": 1, "topk_group": 1, "num_experts_per_tok": 6, "first_k_dense_replace": 1,
                "norm_topk_prob": true, "hidden_act": "silu", "max_position_embeddings": 8192,
                "rms_norm_eps": 1e-05, "rope_theta": 50000.0, "rope_scaling": null, "tie_word_embeddings": false,
                "bos_token_id": 163584, "eos_token_id": 163585}"#,
            16_000_000_000,
        ),
    ];
    for (name, json, published) in cases {
        let config = ModelConfig::from_json(json, Path::new(name)).unwrap();
        // A round figure is a model card's size to its last non-zero digit.
        let digits = published.to_string().trim_end_matches('0').len() as u32;
        let unit = 10u64.pow(published.to_string().len() as u32 - digits);
        let count = config.parameter_count();
        assert_eq!(
            (count + unit / 2) / unit * unit,
            published,
            "{name}: {count} parameters"
        );
    }
    for arch in &ARCHITECTURES {
        let model_type = arch.family.model_type();
        assert!(
            cases
                .iter()
                .any(|(_, json, _)| json.contains(&format!(r#""model_type": "{model_type}""#))),
            "{model_type} has no real-size config here"
        );
    }
}
