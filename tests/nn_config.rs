//! `config.json` parsing: the public configs of one model per family as transformers 4.x wrote them, the
//! transformers 5 `rope_parameters` block, every rope scaling type, family defaults, and malformed files.

use std::path::Path;

use hierarchos::nn::{
    Activation, Alibi, Error, ModelConfig, NormKind, NormPlacement, QkvLayout, RopeScaling, alibi_slopes,
};

const PATH: &str = "models/x/config.json";

fn parse(text: &str) -> hierarchos::nn::Result<ModelConfig> {
    ModelConfig::from_json(text, Path::new(PATH))
}

/// The error message, checked to name the file and every one of `words`.
fn err(text: &str, words: &[&str]) -> Error {
    let e = parse(text).expect_err("config should be rejected");
    let msg = e.to_string();
    assert!(msg.contains(PATH), "error does not name the file: {msg}");
    for w in words {
        assert!(msg.contains(w), "error does not mention {w:?}: {msg}");
    }
    e
}

/// A minimal valid config of `model_type` with `extra` fields appended (later keys win in serde_json).
fn tiny(model_type: &str, extra: &str) -> String {
    let mut s = format!(
        r#"{{"model_type": "{model_type}", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4"#
    );
    if !extra.is_empty() {
        s.push_str(", ");
        s.push_str(extra);
    }
    s.push('}');
    s
}

const LLAMA_3_2_1B: &str = r#"{
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
}"#;

const MISTRAL_7B_V0_1: &str = r#"{
  "architectures": ["MistralForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "sliding_window": 4096,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
}"#;

const QWEN2_5_0_5B: &str = r#"{
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_mrope": false,
  "use_sliding_window": false,
  "vocab_size": 151936
}"#;

const QWEN3_0_6B: &str = r#"{
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}"#;

#[test]
fn llama_3_2_1b() {
    let c = parse(LLAMA_3_2_1B).unwrap();
    assert_eq!(c.model_type, "llama");
    assert_eq!(
        (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers),
        (128256, 2048, 8192, 16)
    );
    assert_eq!((c.num_attention_heads, c.num_key_value_heads, c.head_dim), (32, 8, 64));
    assert_eq!(c.max_position_embeddings, 131072);
    assert_eq!(c.rms_norm_eps, 1e-5);
    assert_eq!(c.rope.theta, 500000.0);
    assert_eq!(
        c.rope.scaling,
        RopeScaling::Llama3 {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192
        }
    );
    assert!(c.tie_word_embeddings);
    assert!(!c.attention_bias && !c.o_proj_bias && !c.mlp_bias && !c.qk_norm);
    assert_eq!(c.sliding_window, None);
    assert_eq!(c.hidden_act, Activation::Silu);
    assert_eq!(c.bos_token_id, Some(128000));
    assert_eq!(c.eos_token_ids, vec![128001]);
}

#[test]
fn mistral_7b_v0_1() {
    let c = parse(MISTRAL_7B_V0_1).unwrap();
    assert_eq!(c.model_type, "mistral");
    assert_eq!((c.num_attention_heads, c.num_key_value_heads, c.head_dim), (32, 8, 128));
    assert_eq!(c.sliding_window, Some(4096));
    assert_eq!(c.rope.theta, 10000.0);
    assert_eq!(c.rope.scaling, RopeScaling::Default);
    assert!(!c.tie_word_embeddings && !c.attention_bias && !c.o_proj_bias && !c.mlp_bias && !c.qk_norm);
    assert_eq!((c.bos_token_id, c.eos_token_ids.clone()), (Some(1), vec![2]));
    // Mistral v0.2+ writes `"sliding_window": null`: full attention.
    let v02 = MISTRAL_7B_V0_1.replace(r#""sliding_window": 4096"#, r#""sliding_window": null"#);
    assert_eq!(parse(&v02).unwrap().sliding_window, None);
}

#[test]
fn qwen2_5_0_5b() {
    let c = parse(QWEN2_5_0_5B).unwrap();
    assert_eq!(c.model_type, "qwen2");
    assert_eq!(
        (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim),
        (896, 14, 2, 64)
    );
    assert_eq!(c.rope.theta, 1e6);
    assert!(c.tie_word_embeddings);
    // Qwen2 always has q/k/v biases and never an o_proj bias.
    assert!(c.attention_bias && !c.o_proj_bias && !c.mlp_bias && !c.qk_norm);
    // `sliding_window` is set but `use_sliding_window` is false.
    assert_eq!(c.sliding_window, None);
    assert_eq!((c.bos_token_id, c.eos_token_ids.clone()), (Some(151643), vec![151643]));
}

#[test]
fn qwen3_0_6b() {
    let c = parse(QWEN3_0_6B).unwrap();
    assert_eq!(c.model_type, "qwen3");
    // head_dim is explicit and differs from hidden_size / heads (64).
    assert_eq!(
        (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim),
        (1024, 16, 8, 128)
    );
    assert_eq!(c.rope.theta, 1e6);
    assert_eq!(c.rope.scaling, RopeScaling::Default);
    assert!(c.qk_norm && !c.attention_bias && !c.o_proj_bias && !c.mlp_bias);
    assert!(c.tie_word_embeddings);
    assert_eq!(c.sliding_window, None);
    assert_eq!(c.eos_token_ids, vec![151645]);
    let biased = QWEN3_0_6B.replace(r#""attention_bias": false"#, r#""attention_bias": true"#);
    let c = parse(&biased).unwrap();
    assert!(c.attention_bias && c.o_proj_bias);
    // A null head_dim falls back to hidden_size / heads; an absent one to Qwen3's default of 128.
    let null_head = QWEN3_0_6B.replace(r#""head_dim": 128"#, r#""head_dim": null"#);
    assert_eq!(parse(&null_head).unwrap().head_dim, 64);
    assert_eq!(
        parse(&tiny("qwen3", r#""num_key_value_heads": 4"#)).unwrap().head_dim,
        128
    );
}

#[test]
fn transformers_5_rope_parameters() {
    // transformers 5 moves rope_theta into `rope_parameters` and drops the top-level fields.
    let v5 = tiny(
        "llama",
        r#""rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
            "dtype": "float32", "transformers_version": "5.17.0""#,
    );
    let c = parse(&v5).unwrap();
    assert_eq!(c.rope.theta, 500000.0);
    assert!(matches!(c.rope.scaling, RopeScaling::Llama3 { factor: 8.0, .. }));
    let plain = tiny(
        "qwen2",
        r#""num_key_value_heads": 4, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}"#,
    );
    let c = parse(&plain).unwrap();
    assert_eq!((c.rope.theta, c.rope.scaling), (1e6, RopeScaling::Default));
    // rope_theta outside the block still counts when the block lacks it.
    let outside = tiny(
        "mistral",
        r#""num_key_value_heads": 4, "rope_theta": 2.5e5, "rope_parameters": {"rope_type": "default"}"#,
    );
    assert_eq!(parse(&outside).unwrap().rope.theta, 2.5e5);
    err(
        &tiny(
            "llama",
            r#""rope_parameters": {"full_attention": {"rope_theta": 1e4}, "sliding_attention": {"rope_theta": 1e4}}"#,
        ),
        &["rope_parameters", "per-layer"],
    );
}

/// Where transformers 5.17's config classes read rotary settings from, each expectation printed by them: a
/// non-empty `rope_scaling` wins over `rope_parameters`, a top-level pretraining length over the block's (Phi-3's
/// class always has one), the families' own default thetas, GPT-NeoX's own keys only, and LongRoPE with Phi-3's
/// older type names.
#[test]
fn rope_settings_come_from_where_transformers_reads_them() {
    let rope = |family: &str, extra: &str| parse(&tiny(family, extra)).unwrap().rope;
    let both = rope(
        "llama",
        r#""rope_parameters": {"rope_type": "default", "rope_theta": 10000},
           "rope_scaling": {"rope_type": "linear", "factor": 2.0}"#,
    );
    assert_eq!(both.scaling, RopeScaling::Linear { factor: 2.0 });
    assert_eq!(
        rope("llama", r#""rope_scaling": {}, "rope_theta": 500.0"#).scaling,
        RopeScaling::Default
    );
    let yarn = rope(
        "llama",
        r#""max_position_embeddings": 128, "original_max_position_embeddings": 16,
           "rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32}"#,
    );
    assert!(matches!(
        yarn.scaling,
        RopeScaling::Yarn {
            original_max_position_embeddings: 16,
            ..
        }
    ));
    let llama3 = rope(
        "llama",
        r#""max_position_embeddings": 128,
           "rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4}"#,
    );
    assert!(matches!(
        llama3.scaling,
        RopeScaling::Llama3 {
            original_max_position_embeddings: 128,
            ..
        }
    ));
    for (family, theta) in [("mixtral", 1e6), ("cohere", 5e5), ("smollm3", 2e6), ("qwen2", 1e4)] {
        assert_eq!(rope(family, r#""num_key_value_heads": 4"#).theta, theta, "{family}");
    }
    let neox = parse(&tiny("gpt_neox", r#""rope_theta": 1e6, "partial_rotary_factor": 0.5"#)).unwrap();
    assert_eq!((neox.rope.theta, neox.rotary_dim), (10000.0, 4));
    let pairs = 8;
    let factors = |v: f64| format!("[{}]", vec![v.to_string(); pairs].join(", "));
    let longrope = |family: &str, extra: &str, kind: &str| {
        let block = format!(
            r#""max_position_embeddings": 128{extra},
               "rope_scaling": {{"type": "{kind}", "short_factor": {}, "long_factor": {}}}"#,
            factors(1.5),
            factors(2.5)
        );
        parse(&tiny(family, &block)).map(|c| c.rope.scaling)
    };
    let expect = |original: usize, attention_factor: f64| RopeScaling::LongRope {
        short_factor: vec![1.5; pairs],
        long_factor: vec![2.5; pairs],
        original_max_position_embeddings: original,
        attention_factor,
    };
    // The factor defaults to max_position_embeddings over the pretraining length.
    let sqrt = |f: f64, original: f64| (1.0 + f.ln() / original.ln()).sqrt();
    assert_eq!(
        longrope("phi3", r#", "original_max_position_embeddings": 32"#, "longrope").unwrap(),
        expect(32, sqrt(4.0, 32.0))
    );
    assert_eq!(longrope("phi3", "", "yarn").unwrap(), expect(4096, 1.0));
    assert_eq!(
        longrope("llama", r#", "original_max_position_embeddings": 64"#, "longrope").unwrap(),
        expect(64, sqrt(2.0, 64.0))
    );
    let e = longrope("phi3", "", "linear").unwrap_err().to_string();
    assert!(e.contains("rope_scaling.type") && e.contains("longrope"), "{e}");
}

#[test]
fn rope_scaling_types() {
    let scaling = |block: &str| parse(&tiny("llama", &format!(r#""rope_scaling": {block}"#))).map(|c| c.rope.scaling);
    // The old `type` key and the newer `rope_type` key.
    assert_eq!(
        scaling(r#"{"type": "linear", "factor": 2.0}"#).unwrap(),
        RopeScaling::Linear { factor: 2.0 }
    );
    assert_eq!(
        scaling(r#"{"rope_type": "linear", "factor": 4}"#).unwrap(),
        RopeScaling::Linear { factor: 4.0 }
    );
    assert_eq!(scaling(r#"{"type": "default"}"#).unwrap(), RopeScaling::Default);
    assert_eq!(
        scaling(r#"{"type": "dynamic", "factor": 2.0}"#).unwrap(),
        RopeScaling::Dynamic {
            factor: 2.0,
            original_max_position_embeddings: 2048
        }
    );
    // transformers scales dynamic rope from max_position_embeddings, whatever the block says.
    assert_eq!(
        scaling(r#"{"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 1024}"#).unwrap(),
        RopeScaling::Dynamic {
            factor: 2.0,
            original_max_position_embeddings: 2048
        }
    );
    // Qwen3's documented YaRN setting.
    let yarn = parse(&tiny(
        "qwen3",
        r#""num_key_value_heads": 4, "max_position_embeddings": 131072,
           "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}"#,
    ))
    .unwrap();
    assert_eq!(
        yarn.rope.scaling,
        RopeScaling::Yarn {
            factor: 4.0,
            original_max_position_embeddings: 32768,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: None
        }
    );
    let explicit =
        scaling(r#"{"type": "yarn", "factor": 2.0, "beta_fast": 16, "beta_slow": 2, "attention_factor": 1.5}"#)
            .unwrap();
    assert_eq!(
        explicit,
        RopeScaling::Yarn {
            factor: 2.0,
            original_max_position_embeddings: 2048,
            beta_fast: 16.0,
            beta_slow: 2.0,
            attention_factor: Some(1.5)
        }
    );
    let RopeScaling::Yarn { attention_factor, .. } =
        scaling(r#"{"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0}"#).unwrap()
    else {
        panic!("yarn expected")
    };
    assert_eq!(attention_factor, Some(1.0));
    err(
        &tiny("llama", r#""rope_scaling": {"type": "longrope", "factor": 2.0}"#),
        &["rope_scaling.short_factor", "missing"],
    );
    err(
        &tiny("llama", r#""rope_scaling": {"type": "ntk", "factor": 2.0}"#),
        &["'ntk'", "longrope", "rope_scaling.type"],
    );
    err(
        &tiny(
            "llama",
            r#""rope_scaling": {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}"#,
        ),
        &["rope_scaling.low_freq_factor", "missing"],
    );
    err(
        &tiny("llama", r#""rope_scaling": {"type": "linear"}"#),
        &["rope_scaling.factor", "missing"],
    );
    err(
        &tiny("llama", r#""rope_scaling": {"type": "linear", "factor": -1}"#),
        &["rope_scaling.factor", "positive"],
    );
    err(
        &tiny("llama", r#""rope_scaling": "linear""#),
        &["rope_scaling", "object"],
    );
    err(&tiny("llama", r#""rope_theta": 0"#), &["rope_theta", "positive"]);
}

#[test]
fn family_defaults() {
    // Absent fields take the defaults of the transformers config class of each family.
    let llama = parse(&tiny("llama", "")).unwrap();
    assert_eq!(
        (llama.num_key_value_heads, llama.head_dim, llama.max_position_embeddings),
        (4, 16, 2048)
    );
    assert_eq!((llama.bos_token_id, llama.eos_token_ids.clone()), (Some(1), vec![2]));
    assert_eq!((llama.rope.theta, llama.rms_norm_eps), (10000.0, 1e-6));
    assert!(!llama.tie_word_embeddings);
    let llama = parse(&tiny("llama", r#""attention_bias": true, "mlp_bias": true"#)).unwrap();
    assert!(llama.attention_bias && llama.o_proj_bias && llama.mlp_bias);
    let mistral = parse(&tiny("mistral", r#""num_attention_heads": 16"#)).unwrap();
    assert_eq!(mistral.num_key_value_heads, 8);
    let qwen2 = parse(&tiny("qwen2", r#""num_attention_heads": 32"#)).unwrap();
    assert_eq!((qwen2.num_key_value_heads, qwen2.head_dim), (32, 2));
    let mistral = parse(&tiny("mistral", r#""num_key_value_heads": null"#)).unwrap();
    assert_eq!((mistral.num_key_value_heads, mistral.sliding_window), (4, Some(4096)));
    assert_eq!(mistral.max_position_embeddings, 131072);
    // Mistral has no biases whatever the config says.
    assert!(
        !parse(&tiny("mistral", r#""num_key_value_heads": 2, "attention_bias": true"#))
            .unwrap()
            .attention_bias
    );
    let qwen2 = parse(&tiny("qwen2", r#""num_key_value_heads": 2, "bos_token_id": null"#)).unwrap();
    assert_eq!((qwen2.bos_token_id, qwen2.eos_token_ids.clone()), (None, vec![]));
    // eos_token_id may be a list (Llama 3 instruct, generation configs).
    let multi = parse(&tiny("llama", r#""eos_token_id": [128001, 128008, 128009]"#)).unwrap();
    assert_eq!(multi.eos_token_ids, vec![128001, 128008, 128009]);
    let none = parse(&tiny("llama", r#""eos_token_id": null"#)).unwrap();
    assert!(none.eos_token_ids.is_empty());
    // transformers' names for each activation.
    for (name, act) in [
        ("gelu_pytorch_tanh", Activation::GeluTanh),
        ("gelu_fast", Activation::GeluTanh),
        ("gelu_accurate", Activation::GeluTanh),
        ("gelu_python_tanh", Activation::GeluTanh),
        ("gelu_python", Activation::Gelu),
        ("relu", Activation::Relu),
        ("swish", Activation::Silu),
    ] {
        let c = parse(&tiny("llama", &format!(r#""hidden_act": "{name}""#))).unwrap();
        assert_eq!(c.hidden_act, act, "{name}");
    }
}

#[test]
fn qwen_sliding_window() {
    let kv = r#""num_key_value_heads": 2"#;
    // All layers slide when max_window_layers is 0; none when it covers every layer.
    let all = parse(&tiny(
        "qwen2",
        &format!(r#"{kv}, "use_sliding_window": true, "sliding_window": 8, "max_window_layers": 0"#),
    ))
    .unwrap();
    assert_eq!(all.sliding_window, Some(8));
    let none = parse(&tiny(
        "qwen2",
        &format!(r#"{kv}, "use_sliding_window": true, "sliding_window": 8, "max_window_layers": 2"#),
    ))
    .unwrap();
    assert_eq!(none.sliding_window, None);
    let listed = parse(&tiny(
        "qwen3",
        &format!(r#"{kv}, "use_sliding_window": true, "sliding_window": 8, "layer_types": ["sliding_attention", "sliding_attention"]"#),
    ))
    .unwrap();
    assert_eq!(listed.sliding_window, Some(8));
    // Layers below max_window_layers attend to everything, the others slide.
    let mixed = parse(&tiny(
        "qwen2",
        &format!(r#"{kv}, "use_sliding_window": true, "sliding_window": 8, "max_window_layers": 1"#),
    ))
    .unwrap();
    assert_eq!((mixed.sliding_window, mixed.full_attention_layers), (Some(8), vec![0]));
}

#[test]
fn malformed_configs() {
    err("{not json", &["not valid JSON"]);
    err("[1, 2]", &["not a JSON object"]);
    err(r#"{"vocab_size": 10}"#, &["model_type", "missing"]);
    match err(&tiny("mpt", ""), &["mpt", "llama", "mistral", "qwen2", "qwen3"]) {
        Error::UnknownModelType { found, supported, .. } => {
            assert_eq!(found, "mpt");
            assert_eq!(supported, hierarchos::nn::supported_model_types().join(", "));
            assert!(supported.starts_with("llama, mistral, qwen2, qwen3, "), "{supported}");
        }
        other => panic!("expected UnknownModelType, got {other:?}"),
    }
    err(
        r#"{"model_type": "llama", "vocab_size": 10, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2}"#,
        &["hidden_size", "missing"],
    );
    err(&tiny("llama", r#""hidden_size": "64""#), &["hidden_size"]);
    err(&tiny("llama", r#""hidden_size": -64"#), &["hidden_size"]);
    err(&tiny("llama", r#""hidden_size": 64.5"#), &["hidden_size"]);
    err(&tiny("llama", r#""vocab_size": 0"#), &["vocab_size", "positive"]);
    err(
        &tiny("llama", r#""num_hidden_layers": null"#),
        &["num_hidden_layers", "missing"],
    );
    err(
        &tiny("llama", r#""hidden_size": 66"#),
        &["num_attention_heads", "hidden_size", "head_dim"],
    );
    // An explicit head_dim lifts the divisibility requirement.
    assert_eq!(
        parse(&tiny("llama", r#""hidden_size": 66, "head_dim": 16"#))
            .unwrap()
            .head_dim,
        16
    );
    err(
        &tiny("llama", r#""num_key_value_heads": 3"#),
        &["num_key_value_heads", "num_attention_heads"],
    );
    err(&tiny("llama", r#""num_key_value_heads": 0"#), &["num_key_value_heads"]);
    err(&tiny("llama", r#""head_dim": 0"#), &["head_dim", "positive"]);
    err(&tiny("llama", r#""rms_norm_eps": 0"#), &["rms_norm_eps"]);
    err(
        &tiny("llama", r#""hidden_act": "quick_gelu""#),
        &["hidden_act", "quick_gelu"],
    );
    err(&tiny("llama", r#""eos_token_id": [1, "two"]"#), &["eos_token_id"]);
    err(
        &tiny("llama", r#""tie_word_embeddings": "yes""#),
        &["tie_word_embeddings"],
    );
    err(
        &tiny("mistral", r#""num_key_value_heads": 2, "sliding_window": 0"#),
        &["sliding_window", "positive"],
    );
    err(
        &tiny("llama", r#""max_position_embeddings": 0"#),
        &["max_position_embeddings", "positive"],
    );
    // Sizes past 2^31 (no kernel indexes such tensors) are refused before any width derived from them overflows.
    err(
        &tiny("llama", r#""hidden_size": 9223372036854775808"#),
        &["hidden_size", "2^31"],
    );
    err(
        r#"{"model_type": "gpt2", "vocab_size": 10, "n_embd": 4294967296, "n_layer": 1, "n_head": 1}"#,
        &["n_embd", "2^31"],
    );
    err(
        &tiny("deepseek_v3", r#""n_shared_experts": 4611686018427387904"#),
        &["n_shared_experts"],
    );
}

#[test]
fn from_file() {
    let dir = std::env::temp_dir().join(format!("hierarchos-nn-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.json");
    std::fs::write(&path, QWEN3_0_6B).unwrap();
    assert_eq!(ModelConfig::from_file(&path).unwrap().head_dim, 128);
    let missing = dir.join("absent.json");
    let e = ModelConfig::from_file(&missing).unwrap_err();
    assert!(
        matches!(e, Error::Io { .. }) && e.to_string().contains("absent.json"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The options of the families after the first four: Granite's multipliers, SmolLM3's layers without rotary,
/// Gemma's norm and embedding scale, OLMo 2's post-norm layers; with transformers' defaults and bad values.
#[test]
fn family_options() {
    let g = parse(&tiny(
        "granite",
        r#""embedding_multiplier": 12.0, "residual_multiplier": 0.22, "attention_multiplier": 0.015625,
           "logits_scaling": 8.0"#,
    ))
    .unwrap();
    assert_eq!(
        (
            g.embedding_multiplier,
            g.residual_multiplier,
            g.attention_multiplier,
            g.logits_scaling
        ),
        (12.0, 0.22, Some(0.015625), 8.0)
    );
    // GraniteConfig's default attention multiplier is 1, not 1 / sqrt(head_dim).
    assert_eq!(parse(&tiny("granite", "")).unwrap().attention_multiplier, Some(1.0));
    err(
        &tiny("granite", r#""residual_multiplier": -1.0"#),
        &["residual_multiplier", "positive"],
    );
    let l = parse(&tiny("llama", r#""embedding_multiplier": 12.0"#)).unwrap();
    assert_eq!(
        (l.embedding_multiplier, l.attention_multiplier),
        (1.0, None),
        "only Granite reads them"
    );

    let s = parse(&tiny("smollm3", r#""num_hidden_layers": 8"#)).unwrap();
    assert_eq!(s.nope_layers, [3, 7], "every fourth layer by default");
    assert!(s.tie_word_embeddings);
    let s = parse(&tiny("smollm3", r#""no_rope_layers": [1, 0]"#)).unwrap();
    assert_eq!(s.nope_layers, [1]);
    err(
        &tiny("smollm3", r#""no_rope_layers": [1, 0, 1]"#),
        &["no_rope_layers", "3 entries for 2 layers"],
    );
    err(
        &tiny("smollm3", r#""no_rope_layers": [1, 2]"#),
        &["no_rope_layers", "0 or 1"],
    );
    assert!(
        parse(&tiny("llama", r#""no_rope_layers": [1, 0]"#))
            .unwrap()
            .nope_layers
            .is_empty()
    );

    let m = parse(&tiny(
        "gemma",
        r#""hidden_size": 3072, "head_dim": 256, "num_key_value_heads": 1"#,
    ))
    .unwrap();
    assert!(m.norm_unit_offset && m.tie_word_embeddings);
    assert_eq!(m.hidden_act, hierarchos::nn::Activation::GeluTanh);
    assert_eq!(m.embedding_multiplier, (3072f64).sqrt() as f32 as f64);

    let o = parse(&tiny("olmo2", "")).unwrap();
    assert!(o.norm_placement == NormPlacement::Post && o.qk_norm && o.qk_norm_over_heads && !o.tie_word_embeddings);
    let o = parse(&tiny("olmo", r#""clip_qkv": 8.0, "rms_norm_eps": 0.1"#)).unwrap();
    assert_eq!(
        (o.norm_kind, o.norm_weight, o.norm_bias),
        (hierarchos::nn::NormKind::Layer, false, false)
    );
    assert_eq!(
        (o.clip_qkv, o.rms_norm_eps),
        (Some(8.0), 1e-5),
        "OLMo's LayerNorm epsilon is fixed"
    );
    err(&tiny("olmo", r#""clip_qkv": -1.0"#), &["clip_qkv", "positive"]);
    let c = parse(&tiny("starcoder2", r#""norm_epsilon": 1e-4, "sliding_window": 16"#)).unwrap();
    assert_eq!(
        (c.norm_kind, c.norm_weight, c.norm_bias),
        (hierarchos::nn::NormKind::Layer, true, true)
    );
    assert_eq!((c.rms_norm_eps, c.sliding_window, c.mlp_gated), (1e-4, Some(16), false));
    assert_eq!(c.mlp_names, ["gate_proj", "c_fc", "c_proj"]);
    assert!(c.attention_bias && c.o_proj_bias && c.mlp_bias && c.tie_word_embeddings);
    let c = parse(&tiny("starcoder2", r#""use_bias": false"#)).unwrap();
    assert!(!c.attention_bias && !c.mlp_bias && c.sliding_window.is_none());
    let a = parse(&tiny("arcee", "")).unwrap();
    assert_eq!((a.hidden_act, a.mlp_gated), (hierarchos::nn::Activation::Relu2, false));
    assert_eq!(a.mlp_names, ["gate_proj", "up_proj", "down_proj"]);
    let so = parse(&tiny(
        "seed_oss",
        r#""num_key_value_heads": 2, "attention_out_bias": true"#,
    ))
    .unwrap();
    assert!(so.attention_bias && so.o_proj_bias && !so.mlp_bias);
    let so = parse(&tiny("seed_oss", r#""num_key_value_heads": 2"#)).unwrap();
    assert!(so.attention_bias && !so.o_proj_bias);
    let st = parse(&tiny("stablelm", r#""num_key_value_heads": 4, "use_qkv_bias": true"#)).unwrap();
    assert_eq!(
        (st.rotary_dim, st.head_dim),
        (4, 16),
        "a quarter of each head rotates by default"
    );
    assert!(st.attention_bias && !st.o_proj_bias && st.norm_bias);
    let nested =
        r#""num_key_value_heads": 4, "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}"#;
    assert_eq!(parse(&tiny("stablelm", nested)).unwrap().rotary_dim, 8);
    let twelve = parse(&tiny(
        "stablelm",
        r#""num_key_value_heads": 4, "qk_layernorm": true, "use_parallel_residual": true"#,
    ))
    .unwrap();
    assert!(twelve.qk_norm && twelve.qk_norm_per_head_layer && twelve.qk_norm_split);
    assert_eq!(twelve.qk_norm_names, ["q_layernorm", "k_layernorm"]);
    assert_eq!(twelve.norm_placement, NormPlacement::Parallel);
    err(
        &tiny("stablelm", r#""num_key_value_heads": 4, "partial_rotary_factor": 0.1"#),
        &["partial_rotary_factor", "even"],
    );
    err(
        &tiny("llama", r#""partial_rotary_factor": 0.5"#),
        &["partial_rotary_factor", "not supported"],
    );
    // SmolLM3 slides on its layers without rotary, and has no window unless the config sets one.
    let sw = r#""use_sliding_window": true, "sliding_window": 16, "no_rope_layers": [1, 0]"#;
    let sm = parse(&tiny("smollm3", sw)).unwrap();
    assert_eq!(
        (sm.sliding_window, &sm.full_attention_layers, &sm.nope_layers),
        (Some(16), &vec![0], &vec![1])
    );
    assert!(
        parse(&tiny("smollm3", r#""use_sliding_window": true"#))
            .unwrap()
            .sliding_window
            .is_none()
    );
    err(
        &tiny(
            "gemma",
            r#""num_key_value_heads": 1, "use_bidirectional_attention": true"#,
        ),
        &["causal"],
    );
    // Families whose projections never have biases, and the config classes' epsilon defaults.
    let e = parse(&tiny(
        "exaone4",
        r#""num_key_value_heads": 2, "attention_bias": true, "sliding_window": null"#,
    ))
    .unwrap();
    assert!(!e.attention_bias && !e.o_proj_bias && e.head_dim == 16);
    assert!(!parse(&tiny("olmo", r#""mlp_bias": true"#)).unwrap().mlp_bias);
    assert_eq!(parse(&tiny("olmo2", "")).unwrap().rms_norm_eps, 1e-5);
    assert_eq!(parse(&tiny("llama", "")).unwrap().rms_norm_eps, 1e-6);
    let q = parse(&tiny("qwen3", r#""num_key_value_heads": 2"#)).unwrap();
    assert!(q.norm_placement == NormPlacement::Pre && q.qk_norm && !q.qk_norm_over_heads);

    let e = parse(&tiny(
        "exaone4",
        r#""num_key_value_heads": 2, "head_dim": 16, "sliding_window": null"#,
    ))
    .unwrap();
    assert!(
        e.norm_placement == NormPlacement::Post && e.qk_norm && !e.qk_norm_over_heads && e.sliding_window.is_none()
    );
    let all_sliding = r#""num_key_value_heads": 2, "sliding_window": 64,
                         "layer_types": ["sliding_attention", "sliding_attention"]"#;
    assert_eq!(parse(&tiny("exaone4", all_sliding)).unwrap().sliding_window, Some(64));
    // The default pattern: every fourth layer global, and without rotary.
    let h = parse(&tiny(
        "exaone4",
        r#""num_key_value_heads": 2, "num_hidden_layers": 8, "sliding_window": 64"#,
    ))
    .unwrap();
    assert_eq!(
        (h.sliding_window, &h.full_attention_layers, &h.nope_layers),
        (Some(64), &vec![3, 7], &vec![3, 7])
    );
    // A window in the config with every layer full: none slides and none rotates, as transformers runs it.
    let full = r#""num_key_value_heads": 2, "sliding_window": 64, "layer_types": ["full_attention", "full_attention"]"#;
    let f = parse(&tiny("exaone4", full)).unwrap();
    assert_eq!((f.sliding_window, &f.nope_layers), (None, &vec![0, 1]));
    err(
        &tiny(
            "exaone4",
            r#""num_key_value_heads": 2, "layer_types": ["full_attention"]"#,
        ),
        &["layer_types", "1 entries for 2 layers"],
    );
}

/// OLMo 3's rotary settings per layer type (a block each, or the classic form scaling the full-attention layers
/// only) and its default pattern of three sliding layers in four; Ministral and Qwen2-MoE's windows.
#[test]
fn per_layer_type_windows_and_rotary() {
    let per_type = parse(&tiny(
        "olmo3",
        r#""num_hidden_layers": 4, "sliding_window": 16, "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0}}"#,
    ))
    .unwrap();
    assert_eq!(
        (per_type.sliding_window, per_type.full_attention_layers.clone()),
        (Some(16), vec![3])
    );
    assert_eq!(per_type.rope.theta, 500000.0);
    assert_eq!(per_type.rope.scaling, RopeScaling::Linear { factor: 2.0 });
    let sliding = per_type.sliding_rope.unwrap();
    assert_eq!((sliding.theta, sliding.scaling), (10000.0, RopeScaling::Default));

    let classic = parse(&tiny(
        "olmo3",
        r#""rope_theta": 500000, "rope_scaling": {"rope_type": "linear", "factor": 4.0}"#,
    ))
    .unwrap();
    assert_eq!(classic.rope.scaling, RopeScaling::Linear { factor: 4.0 });
    assert_eq!(
        classic.sliding_rope.map(|r| (r.theta, r.scaling)),
        Some((500000.0, RopeScaling::Default))
    );
    // Without scaling the two kinds of layers rotate alike: one table.
    assert!(
        parse(&tiny("olmo3", r#""rope_theta": 500000"#))
            .unwrap()
            .sliding_rope
            .is_none()
    );
    // A block without theta takes the top-level one; a missing block is default RoPE (as transformers fills it).
    let partial = parse(&tiny(
        "olmo3",
        r#""rope_theta": 1000.0, "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0}}"#,
    ))
    .unwrap();
    assert_eq!(
        (partial.rope.theta, partial.rope.scaling),
        (1000.0, RopeScaling::Linear { factor: 2.0 })
    );
    let sliding = partial.sliding_rope.unwrap();
    assert_eq!((sliding.theta, sliding.scaling), (500000.0, RopeScaling::Default));
    err(&tiny("phi", r#""tie_word_embeddings": true"#), &["tie_word_embeddings"]);
    err(
        &tiny(
            "llama",
            r#""rope_parameters": {"full_attention": {"rope_type": "default"}}"#,
        ),
        &["rope_parameters", "per-layer"],
    );

    let ministral = parse(&tiny("ministral", r#""num_key_value_heads": 2, "sliding_window": 8"#)).unwrap();
    assert_eq!(
        (ministral.sliding_window, ministral.full_attention_layers),
        (Some(8), vec![])
    );
    let listed = parse(&tiny(
        "ministral",
        r#""num_key_value_heads": 2, "sliding_window": 8, "layer_types": ["full_attention", "sliding_attention"]"#,
    ))
    .unwrap();
    assert_eq!(listed.full_attention_layers, vec![0]);
    let qwen2_moe = parse(&tiny(
        "qwen2_moe",
        r#""num_hidden_layers": 4, "num_key_value_heads": 2, "num_experts": 4, "num_experts_per_tok": 2,
            "use_sliding_window": true,
            "sliding_window": 8, "max_window_layers": 3"#,
    ))
    .unwrap();
    assert_eq!(
        (qwen2_moe.sliding_window, qwen2_moe.full_attention_layers),
        (Some(8), vec![1, 3])
    );
}

/// Nemotron: LayerNorm with bias scaled by 1 + weight, half the head rotating by default, a plain ReLU² MLP.
#[test]
fn nemotron_options() {
    let c = parse(&tiny("nemotron", r#""norm_eps": 1e-4"#)).unwrap();
    assert_eq!(
        (c.norm_kind, c.norm_unit_offset, c.norm_bias, c.rms_norm_eps),
        (NormKind::Layer, true, true, 1e-4)
    );
    assert_eq!((c.head_dim, c.rotary_dim), (16, 8));
    assert_eq!((c.mlp_gated, c.hidden_act), (false, Activation::Relu2));
}

/// Gemma 2 and 3: sandwich norms, soft-capping with the config classes' defaults (Gemma 2 caps, Gemma 3 does
/// not), the score scale from query_pre_attn_scalar, their window patterns and Gemma 3's local rotary base.
#[test]
fn gemma2_and_gemma3_options() {
    let g2 = parse(&tiny(
        "gemma2",
        r#""num_hidden_layers": 4, "query_pre_attn_scalar": 64"#,
    ))
    .unwrap();
    assert_eq!(g2.norm_placement, NormPlacement::Sandwich);
    assert_eq!((g2.attention_softcap, g2.final_logit_softcap), (Some(50.0), Some(30.0)));
    assert_eq!(g2.attention_multiplier, Some(0.125));
    assert_eq!((g2.sliding_window, g2.full_attention_layers), (Some(4096), vec![1, 3]));
    assert!(g2.norm_unit_offset && g2.hidden_act == Activation::GeluTanh);
    let uncapped = parse(&tiny(
        "gemma2",
        r#""attn_logit_softcapping": null, "final_logit_softcapping": null"#,
    ));
    assert_eq!(
        uncapped.map(|c| (c.attention_softcap, c.final_logit_softcap)).unwrap(),
        (None, None)
    );
    err(
        &tiny("gemma2", r#""attn_logit_softcapping": -1.0"#),
        &["attn_logit_softcapping"],
    );
    err(
        &tiny("gemma2", r#""hidden_activation": "swiglu""#),
        &["hidden_activation"],
    );

    let g3 = parse(&tiny(
        "gemma3_text",
        r#""num_hidden_layers": 7, "rope_theta": 1000000, "rope_local_base_freq": 10000,
           "rope_scaling": {"rope_type": "linear", "factor": 8.0}"#,
    ))
    .unwrap();
    assert_eq!(g3.norm_placement, NormPlacement::Sandwich);
    assert!(g3.qk_norm && !g3.qk_norm_over_heads);
    assert_eq!((g3.attention_softcap, g3.final_logit_softcap), (None, None));
    assert_eq!(g3.full_attention_layers, vec![5]);
    assert_eq!(
        (g3.rope.theta, g3.rope.scaling),
        (1e6, RopeScaling::Linear { factor: 8.0 })
    );
    let local = g3.sliding_rope.unwrap();
    assert_eq!((local.theta, local.scaling), (10000.0, RopeScaling::Default));
    // Gemma 3's attention never applies the soft-capping its config class keeps; the logits' it does.
    let capped = parse(&tiny(
        "gemma3_text",
        r#""attn_logit_softcapping": 2.0, "final_logit_softcapping": 30.0"#,
    ))
    .unwrap();
    assert_eq!(
        (capped.attention_softcap, capped.final_logit_softcap),
        (None, Some(30.0))
    );
    err(
        &tiny("gemma3_text", r#""use_bidirectional_attention": true"#),
        &["use_bidirectional_attention"],
    );
}

/// Cohere and Phi: parallel blocks, their norms, rotary forms, names and logit scaling; Cohere's q/k LayerNorm
/// of each head and Phi's one shared by the heads.
#[test]
fn cohere_and_phi_options() {
    let cohere = parse(&tiny("cohere", "")).unwrap();
    assert_eq!(cohere.norm_placement, NormPlacement::Parallel);
    assert_eq!(
        (cohere.norm_kind, cohere.norm_weight, cohere.norm_bias),
        (NormKind::Layer, true, false)
    );
    assert!(cohere.interleaved_rope && cohere.tie_word_embeddings);
    assert_eq!(cohere.logit_scale, 0.0625);
    let qk = parse(&tiny("cohere", r#""use_qk_norm": true"#)).unwrap();
    assert!(qk.qk_norm && qk.qk_norm_per_head_layer && !qk.qk_norm_over_heads);
    err(&tiny("cohere", r#""logit_scale": 0"#), &["logit_scale"]);

    let phi = parse(&tiny("phi", r#""partial_rotary_factor": 0.25"#)).unwrap();
    assert_eq!(phi.norm_placement, NormPlacement::Parallel);
    assert_eq!((phi.rotary_dim, phi.head_dim), (4, 16));
    assert_eq!(phi.attention_names[3], "dense");
    assert_eq!(
        (phi.names.final_norm, phi.mlp_names[1], phi.mlp_names[2]),
        ("final_layernorm", "fc1", "fc2")
    );
    assert!(phi.lm_head_bias && phi.attention_bias && phi.o_proj_bias && phi.mlp_bias && !phi.mlp_gated);
    assert_eq!(phi.hidden_act, Activation::GeluTanh);
    assert!(!phi.qk_norm);
    let phi_qk = parse(&tiny("phi", r#""qk_layernorm": true"#)).unwrap();
    assert!(phi_qk.qk_norm && phi_qk.qk_norm_shared_layer && !phi_qk.qk_norm_per_head_layer);
    assert_eq!(phi_qk.qk_norm_names, ["q_layernorm", "k_layernorm"]);
}

/// Phi-3: fused q/k/v and gate/up matrices, a window on every layer, Phi-4-mini's partial rotary; the longrope
/// scaling of the 128k models is refused.
#[test]
fn phi3_options() {
    let c = parse(&tiny(
        "phi3",
        r#""sliding_window": 2047, "partial_rotary_factor": 0.75"#,
    ))
    .unwrap();
    assert_eq!(
        (c.fused_qkv.map(|f| f.0), c.fused_gate_up),
        (Some("qkv_proj"), Some("gate_up_proj"))
    );
    assert_eq!((c.sliding_window, c.full_attention_layers), (Some(2047), vec![]));
    assert_eq!(c.rotary_dim, 12);
    err(
        &tiny(
            "phi3",
            r#""rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}"#,
        ),
        &["longrope", "rotated pair (8)", "found 1 and 1"],
    );
}

/// GPT-NeoX: the classic rotary_pct / rotary_emb_base keys, the parallel residual and its switch, the fused
/// q/k/v with heads interleaved and the module names.
#[test]
fn gpt_neox_options() {
    // Heads split hidden_size evenly, one key/value head each, whatever stray keys say (as transformers reads it).
    let stray = parse(&tiny("gpt_neox", r#""num_key_value_heads": 2, "head_dim": 24"#)).unwrap();
    assert_eq!((stray.num_key_value_heads, stray.head_dim), (4, 16));
    let c = parse(&tiny("gpt_neox", r#""rotary_pct": 0.5, "rotary_emb_base": 500"#)).unwrap();
    assert_eq!((c.rotary_dim, c.rope.theta), (8, 500.0));
    assert_eq!(c.norm_placement, NormPlacement::ParallelTwoNorms);
    assert_eq!(c.fused_qkv.map(|f| f.1), Some(QkvLayout::Grouped));
    assert_eq!(
        (c.names.model, c.names.embed, c.names.head),
        ("gpt_neox", "embed_in", "embed_out")
    );
    assert!(c.attention_bias && c.mlp_bias && c.norm_bias && c.hidden_act == Activation::Gelu);
    let sequential = parse(&tiny("gpt_neox", r#""use_parallel_residual": false"#)).unwrap();
    assert_eq!(
        (sequential.norm_placement, sequential.rotary_dim),
        (NormPlacement::Pre, 4)
    );
}

/// GPT-2: its own key names, the MLP width from n_inner (4 x n_embd when null), Conv1D weights, learned
/// positions and no rotary on any layer; unscaled scores and scores scaled down layer by layer.
#[test]
fn gpt2_options() {
    let c = parse(
        r#"{"model_type": "gpt2", "vocab_size": 100, "n_embd": 32, "n_layer": 3, "n_head": 4,
            "n_positions": 64, "n_inner": null}"#,
    )
    .unwrap();
    assert_eq!(
        (
            c.hidden_size,
            c.num_hidden_layers,
            c.num_attention_heads,
            c.max_position_embeddings
        ),
        (32, 3, 4, 64)
    );
    assert_eq!((c.intermediate_size, c.head_dim), (128, 8));
    assert!(c.conv1d && c.position_embeddings && c.tie_word_embeddings);
    assert_eq!(c.nope_layers, vec![0, 1, 2]);
    assert_eq!(
        (c.names.model, c.names.layers, c.names.input_norm),
        ("transformer", "h", "ln_1")
    );
    assert_eq!(c.hidden_act, Activation::GeluTanh);
    let unscaled = parse(
        r#"{"model_type": "gpt2", "vocab_size": 100, "n_embd": 32, "n_layer": 1, "n_head": 4,
            "scale_attn_weights": false}"#,
    );
    let unscaled = unscaled.unwrap();
    assert_eq!(unscaled.attention_multiplier, Some(1.0));
    assert!(!unscaled.attention_scale_by_inverse_layer);
    let by_layer = parse(
        r#"{"model_type": "gpt2", "vocab_size": 100, "n_embd": 32, "n_layer": 1, "n_head": 4,
            "scale_attn_by_inverse_layer_idx": true}"#,
    );
    assert!(by_layer.unwrap().attention_scale_by_inverse_layer);
}

/// Falcon's three layer layouts: multi-query with one LayerNorm in parallel (7B), the new decoder architecture's
/// grouped key/value heads with two LayerNorms, and a sequential block; ALiBi in place of rotary (Falcon-RW).
#[test]
fn falcon_layouts() {
    let base = r#""num_hidden_layers": 2, "alibi": false"#;
    let seven = parse(&tiny("falcon", base)).unwrap();
    assert_eq!(
        (seven.num_key_value_heads, seven.norm_placement),
        (1, NormPlacement::Parallel)
    );
    // The legacy `n_embed` wins over hidden_size, as Falcon's config class takes it.
    let legacy = parse(&tiny("falcon", &format!(r#"{base}, "n_embed": 32, "head_dim": 4"#))).unwrap();
    assert_eq!((legacy.hidden_size, legacy.head_dim), (32, 8));
    assert_eq!(
        (seven.intermediate_size, seven.names.input_norm),
        (256, "input_layernorm")
    );
    assert_eq!(seven.fused_qkv, Some(("query_key_value", QkvLayout::Grouped)));
    let new = parse(&tiny(
        "falcon",
        &format!(r#"{base}, "new_decoder_architecture": true, "num_kv_heads": 2, "ffn_hidden_size": 96"#),
    ))
    .unwrap();
    assert_eq!(
        (new.num_key_value_heads, new.norm_placement),
        (2, NormPlacement::ParallelTwoNorms)
    );
    assert_eq!(
        (new.names.input_norm, new.names.mlp_input_norm, new.intermediate_size),
        ("ln_attn", "ln_mlp", 96)
    );
    let sequential = parse(&tiny(
        "falcon",
        &format!(r#"{base}, "parallel_attn": false, "multi_query": false"#),
    ))
    .unwrap();
    assert_eq!(
        (sequential.num_key_value_heads, sequential.norm_placement),
        (4, NormPlacement::Pre)
    );
    assert!(sequential.alibi.is_none() && sequential.nope_layers.is_empty());
    let alibi = parse(&tiny("falcon", r#""alibi": true, "num_hidden_layers": 3"#)).unwrap();
    assert_eq!(alibi.alibi, Some(Alibi::Falcon));
    assert_eq!(alibi.nope_layers, vec![0, 1, 2]);
}

/// GLM-4: interleaved rotary on half of each head, q/k/v biases without an output bias, fused gate/up, its
/// small default epsilon.
#[test]
fn glm_options() {
    let c = parse(&tiny("glm", r#""num_key_value_heads": 2, "head_dim": 16"#)).unwrap();
    assert!(c.interleaved_rope && c.attention_bias && !c.o_proj_bias && !c.mlp_bias);
    assert_eq!(
        (c.rotary_dim, c.fused_gate_up, c.rms_norm_eps),
        (8, Some("gate_up_proj"), 1.5625e-7)
    );
    // GLM-4's three end tokens, where config.json gives none or null.
    assert_eq!(c.eos_token_ids, vec![151329, 151336, 151338]);
    let null = parse(&tiny(
        "glm",
        r#""num_key_value_heads": 2, "head_dim": 16, "eos_token_id": null"#,
    ))
    .unwrap();
    assert_eq!(null.eos_token_ids, vec![151329, 151336, 151338]);
}

/// transformers builds every family's token embedding but GPT-2's, GPT-NeoX's and Falcon's with
/// `padding_idx = pad_token_id` (the config class's default where config.json has none; negative ids count from
/// the end); an id outside the vocabulary keeps no row.
#[test]
fn padding_rows_follow_pad_token_id_and_the_family_defaults() {
    let row = |text: String| parse(&text).unwrap().padding_idx;
    assert_eq!(row(tiny("llama", "")), None, "Llama's config has no pad_token_id");
    assert_eq!(row(tiny("llama", r#""pad_token_id": 7"#)), Some(7));
    assert_eq!(row(tiny("llama", r#""pad_token_id": -1"#)), Some(99));
    assert_eq!(row(tiny("llama", r#""pad_token_id": 100"#)), None);
    let kv = r#""num_key_value_heads": 4"#;
    assert_eq!(row(tiny("gemma", kv)), Some(0));
    assert_eq!(row(tiny("gemma", &format!(r#"{kv}, "pad_token_id": null"#))), None);
    assert_eq!(row(tiny("olmo2", "")), Some(1));
    assert_eq!(
        row(tiny("phi3", "")),
        None,
        "Phi-3's default 32000 is past a vocabulary of 100"
    );
    assert_eq!(row(tiny("phi3", r#""vocab_size": 32064"#)), Some(32000));
    assert_eq!(row(tiny("gpt_neox", r#""pad_token_id": 7"#)), None);
    let gpt2 = r#"{"model_type": "gpt2", "vocab_size": 100, "n_embd": 32, "n_layer": 1, "n_head": 4,
        "pad_token_id": 7}"#;
    assert_eq!(parse(gpt2).unwrap().padding_idx, None);
    err(
        &tiny("llama", r#""pad_token_id": "<pad>""#),
        &["pad_token_id", "integer"],
    );
}

/// ALiBi's bias of a key at a position, per head, as Falcon's `build_alibi_tensor` gives it (values taken from
/// transformers 5.17: powers of two and other head counts, positions whose bf16 casts round).
#[test]
fn alibi_biases_match_transformers() {
    let cases: &[(usize, usize, usize, f64)] = &[
        (1, 0, 255, 0.99609375),
        (1, 0, 2049, 8.0),
        (3, 0, 7, 0.4375),
        (3, 1, 1000, 3.90625),
        (3, 2, 257, 64.0),
        (4, 2, 255, 3.984375),
        (6, 5, 7, 0.875),
        (6, 5, 1000, 125.0),
        (12, 11, 1, 0.08837890625),
        (12, 11, 7, 0.6171875),
        (12, 11, 255, 22.5),
        (12, 11, 257, 22.625),
        (12, 11, 2049, 181.0),
        (32, 0, 1, 0.83984375),
        (32, 0, 255, 214.0),
        (32, 0, 257, 215.0),
        (32, 16, 1, 0.052490234375),
        (32, 16, 1000, 52.5),
        (71, 0, 2049, 1880.0),
        (71, 35, 257, 11.3125),
        (71, 70, 1, 0.5703125),
        (71, 70, 7, 4.0),
        (71, 70, 1000, 572.0),
    ];
    for &(heads, head, pos, want) in cases {
        let slopes = alibi_slopes(heads);
        assert_eq!(slopes.len(), heads);
        let got = Alibi::Falcon.bias(slopes[head], pos, 1.0) as f64;
        assert_eq!(got, want, "{heads} heads, head {head}, position {pos}");
    }
    assert_eq!(Alibi::Falcon.bias(alibi_slopes(8)[0], 0, 0.5), 0.0);
    // Falcon adds the bias before the score scale, BLOOM after it, in f32.
    assert_eq!(Alibi::Falcon.bias(0.5, 3, 0.25), 0.375);
    let slope = alibi_slopes(12)[11];
    assert_eq!(Alibi::Bloom.bias(slope, 1000, 0.25), slope * 1000.0);
}

/// An odd number of rotated dimensions: GPT-NeoX, Phi-3, Nemotron and GLM rotate one more (transformers slices
/// their heads by the cos table's width); StableLM and Phi slice by the odd number and fail in transformers, so
/// they are refused.
#[test]
fn odd_rotary_dims() {
    let neox = parse(&tiny("gpt_neox", r#""rotary_pct": 0.3125"#)).unwrap();
    assert_eq!((neox.rotary_dim, neox.head_dim), (5, 16));
    err(
        &tiny(
            "stablelm",
            r#""partial_rotary_factor": 0.3125, "num_key_value_heads": 4"#,
        ),
        &["partial_rotary_factor"],
    );
    err(
        &tiny("phi", r#""partial_rotary_factor": 0.3125"#),
        &["partial_rotary_factor"],
    );
}

/// BLOOM: its own key names, the 4 x hidden MLP, one key/value head per query head, ALiBi in place of rotary, the
/// embeddings' LayerNorm; the residual from the normed input is refused.
#[test]
fn bloom_options() {
    let c = parse(
        r#"{"model_type": "bloom", "vocab_size": 100, "n_embed": 48, "n_layer": 3, "n_head": 6,
            "num_key_value_heads": 2, "head_dim": 4}"#,
    )
    .unwrap();
    assert_eq!(
        (
            c.hidden_size,
            c.num_hidden_layers,
            c.num_attention_heads,
            c.num_key_value_heads
        ),
        (48, 3, 6, 6)
    );
    assert_eq!((c.intermediate_size, c.head_dim), (192, 8));
    assert_eq!(c.alibi, Some(Alibi::Bloom));
    assert_eq!(c.nope_layers, vec![0, 1, 2]);
    assert_eq!(c.embedding_norm, Some("word_embeddings_layernorm"));
    assert_eq!(c.hidden_act, Activation::GeluTanh);
    assert!(c.tie_word_embeddings && c.attention_bias && c.o_proj_bias && c.mlp_bias && c.padding_idx.is_none());
    assert_eq!(c.fused_qkv, Some(("query_key_value", QkvLayout::Grouped)));
    assert_eq!(
        (c.names.model, c.names.layers, c.names.final_norm),
        ("transformer", "h", "ln_f")
    );
    err(
        r#"{"model_type": "bloom", "vocab_size": 100, "hidden_size": 48, "n_layer": 1, "n_head": 6,
            "apply_residual_connection_post_layernorm": true}"#,
        &["apply_residual_connection_post_layernorm"],
    );
    // The usual names, which transformers maps to n_layer and n_head, are read too; BLOOM reads no position limit.
    let usual = parse(
        r#"{"model_type": "bloom", "vocab_size": 100, "hidden_size": 48, "num_hidden_layers": 3,
            "num_attention_heads": 6, "seq_length": 0, "max_position_embeddings": 0}"#,
    )
    .unwrap();
    assert_eq!((usual.num_hidden_layers, usual.num_attention_heads), (3, 6));
    assert_eq!(usual.max_position_embeddings, 2048);
}

/// GPT-BigCode: GPT-2's keys and names with linear layers; multi-query attention (q, k and v as blocks of c_attn)
/// or a key/value head per query head (c_attn by head).
#[test]
fn gpt_bigcode_options() {
    let base = r#""model_type": "gpt_bigcode", "vocab_size": 100, "n_embd": 64, "n_layer": 2, "n_head": 4"#;
    let mq = parse(&format!("{{{base}}}")).unwrap();
    assert_eq!(
        (mq.num_key_value_heads, mq.head_dim, mq.intermediate_size),
        (1, 16, 256)
    );
    assert_eq!(mq.fused_qkv, Some(("c_attn", QkvLayout::Blocks)));
    assert!(!mq.conv1d && mq.position_embeddings && mq.tie_word_embeddings && mq.padding_idx.is_none());
    assert_eq!(mq.hidden_act, Activation::GeluTanh);
    let mha = parse(&format!(
        r#"{{{base}, "multi_query": false, "scale_attn_weights": false}}"#
    ))
    .unwrap();
    assert_eq!(mha.num_key_value_heads, 4);
    assert_eq!(mha.fused_qkv, Some(("c_attn", QkvLayout::Grouped)));
    assert_eq!(mha.attention_multiplier, Some(1.0));
    err(&format!(r#"{{{base}, "multi_query": null}}"#), &["multi_query", "null"]);
}

/// Heads of an odd size are refused by name at parse time (rotary pairs dimensions, and the attention kernels
/// take even heads), as is OPT's `init_std` read as its initializer range.
#[test]
fn odd_heads_are_refused_and_opt_reads_init_std() {
    err(&tiny("llama", r#""head_dim": 15"#), &["head_dim", "15"]);
    err(
        &tiny("gpt_neox", r#""hidden_size": 60"#),
        &["num_attention_heads", "15"],
    );
    let opt = parse(
        r#"{"model_type": "opt", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "ffn_dim": 96, "init_std": 0.05}"#,
    )
    .unwrap();
    assert_eq!(opt.initializer_range, 0.05);
}

/// OPT: learned positions two rows on, pre-norm LayerNorms (with or without parameters), biases as enable_bias
/// says, the MLP's projections in the layer itself; OPT-350m's post-norm layers and projected embeddings, and a
/// removed final norm, are refused.
#[test]
fn opt_options() {
    let opt = |extra: &str| {
        format!(
            r#"{{"model_type": "opt", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 4, "ffn_dim": 96, "max_position_embeddings": 32{extra}}}"#
        )
    };
    let c = parse(&opt("")).unwrap();
    assert!(c.position_embeddings && c.tie_word_embeddings);
    assert_eq!(
        (c.position_offset, c.max_position_embeddings, c.intermediate_size),
        (2, 32, 96)
    );
    assert_eq!((c.num_key_value_heads, c.head_dim, c.padding_idx), (4, 16, Some(1)));
    assert_eq!(c.hidden_act, Activation::Relu);
    assert_eq!(c.norm_placement, NormPlacement::Pre);
    assert!(c.norm_weight && c.norm_bias && c.attention_bias && c.o_proj_bias && c.mlp_bias && !c.mlp_gated);
    assert_eq!(
        (c.names.model, c.names.mlp, c.names.input_norm, c.names.mlp_input_norm),
        ("model.decoder", "", "self_attn_layer_norm", "final_layer_norm")
    );
    assert_eq!(c.nope_layers, vec![0, 1]);
    let bare = parse(&opt(
        r#", "enable_bias": false, "layer_norm_elementwise_affine": false"#,
    ))
    .unwrap();
    assert!(!bare.norm_weight && !bare.norm_bias && !bare.attention_bias && !bare.mlp_bias);
    err(&opt(r#", "do_layer_norm_before": false"#), &["do_layer_norm_before"]);
    err(&opt(r#", "word_embed_proj_dim": 32"#), &["word_embed_proj_dim"]);
    err(
        &opt(r#", "_remove_final_layer_norm": true"#),
        &["_remove_final_layer_norm"],
    );
    assert!(parse(&opt(r#", "word_embed_proj_dim": 64"#)).is_ok());
}

/// GPT-Neo: its own key names, unscaled scores, the window and which layers slide from attention_layers or
/// attention_types (expanded as transformers expands them), checked against the layer count.
#[test]
fn gpt_neo_options() {
    let neo = |extra: &str| {
        format!(
            r#"{{"model_type": "gpt_neo", "vocab_size": 100, "hidden_size": 64, "num_layers": 4, "num_heads": 4,
                "window_size": 16{extra}}}"#
        )
    };
    let c = parse(&neo(r#", "attention_types": [[["global", "local"], 2]]"#)).unwrap();
    assert_eq!(
        (c.num_hidden_layers, c.num_attention_heads, c.intermediate_size),
        (4, 4, 256)
    );
    assert_eq!(
        (c.sliding_window, c.full_attention_layers.clone()),
        (Some(16), vec![0, 2])
    );
    assert_eq!(c.attention_multiplier, Some(1.0));
    assert!(!c.attention_bias && c.o_proj_bias && c.mlp_bias && c.position_embeddings);
    assert_eq!(
        (c.names.attention, c.attention_names[3]),
        ("attn.attention", "out_proj")
    );
    let listed = parse(&neo(r#", "attention_layers": ["local", "local", "global", "local"]"#)).unwrap();
    assert_eq!(listed.full_attention_layers, vec![2]);
    let global = parse(&neo(r#", "attention_types": [[["global"], 4]]"#)).unwrap();
    assert_eq!(global.sliding_window, None);
    err(&neo(""), &["attention_types", "more layers than num_layers 4"]);
    err(
        &neo(r#", "attention_types": [[["global", "local"], 18446744073709551615]]"#),
        &["attention_types"],
    );
    err(
        &neo(r#", "attention_types": [[["global"], 3]]"#),
        &["attention_types", "3", "4"],
    );
    err(
        &neo(r#", "attention_types": [[["global", "local"], 2]], "window_size": null"#),
        &["window_size", "null"],
    );
    // A layer_types key, which GPT-Neo does not read, changes nothing.
    let stray = parse(&neo(
        r#", "attention_types": [[["global", "local"], 2]], "layer_types": 3"#,
    ))
    .unwrap();
    assert_eq!(stray.full_attention_layers, vec![0, 2]);
    err(
        &neo(r#", "attention_types": [[["global", "sliding"], 2]]"#),
        &["attention_types", "sliding"],
    );
    err(
        &neo(r#", "attention_types": [[["global", "local"], 2]], "window_size": 0"#),
        &["window_size"],
    );
}

/// GPT-J: GPT-2's key names, a parallel block with one norm, interleaved rotary on rotary_dim dimensions, a head
/// with a bias (so no tied head), and only an even rotary_dim up to the head size.
#[test]
fn gptj_options() {
    let gptj = |extra: &str| {
        format!(r#"{{"model_type": "gptj", "vocab_size": 100, "n_embd": 64, "n_layer": 2, "n_head": 4{extra}}}"#)
    };
    let c = parse(&gptj(r#", "rotary_dim": 8"#)).unwrap();
    assert_eq!((c.rotary_dim, c.head_dim, c.intermediate_size), (8, 16, 256));
    assert!(c.interleaved_rope && c.lm_head_bias && !c.tie_word_embeddings && c.mlp_bias && !c.attention_bias);
    assert_eq!(c.norm_placement, NormPlacement::Parallel);
    assert_eq!(
        (c.mlp_names[1], c.mlp_names[2], c.attention_names[3]),
        ("fc_in", "fc_out", "out_proj")
    );
    // transformers' default rotary_dim, 64, is wider than these heads of 16.
    err(&gptj(""), &["rotary_dim", "64"]);
    err(&gptj(r#", "rotary_dim": 7"#), &["rotary_dim", "7"]);
    err(&gptj(r#", "rotary_dim": null"#), &["rotary_dim"]);
    err(
        &gptj(r#", "rotary_dim": 8, "tie_word_embeddings": true"#),
        &["tie_word_embeddings"],
    );
    // GPT-J's rotary is base 10000 without scaling whatever rope keys the config carries (transformers reads none).
    let stray = parse(&gptj(
        r#", "rotary_dim": 8, "rope_theta": 5.0, "rope_scaling": {"rope_type": "linear", "factor": 4.0}"#,
    ))
    .unwrap();
    assert_eq!(
        (stray.rope.theta, &stray.rope.scaling),
        (10000.0, &RopeScaling::Default)
    );
    // Where both spellings are set, the usual name wins, as transformers sets it last.
    let both = parse(&gptj(
        r#", "rotary_dim": 8, "hidden_size": 128, "num_attention_heads": 8"#,
    ))
    .unwrap();
    assert_eq!((both.hidden_size, both.num_attention_heads), (128, 8));
}
