//! The GGUF reader on small files written here: every metadata type, alignment, tensor infos and data, the
//! corrupt cases (each an error naming the field, never a panic), a fuzz loop of truncations and byte flips, and
//! the Llama q/k row order llama.cpp's converter permutes.

mod common;

use std::path::Path;

use common::*;
use hierarchos::nn::gguf::{GgmlType, Gguf, Value, ValueType};
use hierarchos::nn::{ModelConfig, RopeConfig, RopeScaling};

fn type_id(t: ValueType) -> u32 {
    use ValueType::*;
    [U8, I8, U16, I16, U32, I32, F32, Bool, String, Array, U64, I64, F64]
        .iter()
        .position(|&x| x == t)
        .unwrap() as u32
}

fn value_type(v: &Value) -> ValueType {
    match v {
        Value::U8(_) => ValueType::U8,
        Value::I8(_) => ValueType::I8,
        Value::U16(_) => ValueType::U16,
        Value::I16(_) => ValueType::I16,
        Value::U32(_) => ValueType::U32,
        Value::I32(_) => ValueType::I32,
        Value::F32(_) => ValueType::F32,
        Value::Bool(_) => ValueType::Bool,
        Value::String(_) => ValueType::String,
        Value::Array(..) => ValueType::Array,
        Value::U64(_) => ValueType::U64,
        Value::I64(_) => ValueType::I64,
        Value::F64(_) => ValueType::F64,
    }
}

fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s);
}

/// The encoding of a value (without its type id), written independently of the reader.
fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_string(out, s.as_bytes()),
        Value::Array(t, items) => {
            out.extend_from_slice(&type_id(*t).to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

/// One tensor to write: name, ggml dims (innermost first), ggml type id, data bytes.
struct T {
    name: String,
    dims: Vec<u64>,
    ty: u32,
    data: Vec<u8>,
}

fn f32_tensor(name: &str, shape: &[usize], values: &[f32]) -> T {
    T {
        name: name.into(),
        dims: shape.iter().rev().map(|&d| d as u64).collect(),
        ty: 0,
        data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// A GGUF v3 file; `alignment` is also written as `general.alignment` when it is not 32.
fn build(kvs: &[(&str, Value)], tensors: &[T], alignment: u64) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    let mut kvs: Vec<(&str, Value)> = kvs.to_vec();
    if alignment != 32 {
        kvs.push(("general.alignment", Value::U32(alignment as u32)));
    }
    out.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
    for (k, v) in &kvs {
        put_string(&mut out, k.as_bytes());
        out.extend_from_slice(&type_id(value_type(v)).to_le_bytes());
        put_value(&mut out, v);
    }
    let mut offset = 0u64;
    let mut offsets = Vec::new();
    for t in tensors {
        put_string(&mut out, t.name.as_bytes());
        out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&t.ty.to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        offsets.push(offset);
        offset = (offset + t.data.len() as u64).next_multiple_of(alignment);
    }
    let data_start = (out.len() as u64).next_multiple_of(alignment);
    out.resize(data_start as usize, 0);
    for (t, &o) in tensors.iter().zip(&offsets) {
        out.resize((data_start + o) as usize, 0);
        out.extend_from_slice(&t.data);
    }
    out
}

fn parse(bytes: &[u8]) -> hierarchos::nn::Result<Gguf> {
    Gguf::from_bytes(bytes.to_vec(), Path::new("test.gguf"))
}

fn every_type() -> Vec<(&'static str, Value)> {
    vec![
        ("u8", Value::U8(200)),
        ("i8", Value::I8(-100)),
        ("u16", Value::U16(60000)),
        ("i16", Value::I16(-30000)),
        ("u32", Value::U32(4_000_000_000)),
        ("i32", Value::I32(-2_000_000_000)),
        ("f32", Value::F32(1.5e-5)),
        ("bool.true", Value::Bool(true)),
        ("bool.false", Value::Bool(false)),
        ("string", Value::String("héllo ✓".into())),
        ("string.empty", Value::String(String::new())),
        ("u64", Value::U64(u64::MAX)),
        ("i64", Value::I64(i64::MIN)),
        ("f64", Value::F64(-2.5e300)),
        (
            "array.u32",
            Value::Array(ValueType::U32, vec![Value::U32(1), Value::U32(2), Value::U32(3)]),
        ),
        (
            "array.string",
            Value::Array(
                ValueType::String,
                vec![Value::String("a b".into()), Value::String("".into())],
            ),
        ),
        ("array.empty", Value::Array(ValueType::F64, vec![])),
        (
            "array.nested",
            Value::Array(
                ValueType::Array,
                vec![
                    Value::Array(ValueType::I8, vec![Value::I8(-1)]),
                    Value::Array(ValueType::Bool, vec![Value::Bool(true), Value::Bool(false)]),
                ],
            ),
        ),
    ]
}

/// A small valid file with metadata of every type and three tensors (f32, f16 and Q4_0 blocks).
fn sample(alignment: u64) -> (Vec<u8>, Vec<f32>) {
    let mut rng = Rng::new("gguf sample");
    let m = rng.vec(3 * 5, -1.0, 1.0);
    let h: Vec<u8> = (0..7)
        .flat_map(|i| half::f16::from_f32(i as f32 * 0.5).to_bits().to_le_bytes())
        .collect();
    let q: Vec<u8> = (0..2 * 18).map(|i| i as u8).collect();
    let tensors = [
        f32_tensor("matrix", &[3, 5], &m),
        T {
            name: "half".into(),
            dims: vec![7],
            ty: 1,
            data: h,
        },
        T {
            name: "blocks".into(),
            dims: vec![32, 2],
            ty: 2,
            data: q,
        },
    ];
    (build(&every_type(), &tensors, alignment), m)
}

#[test]
fn every_metadata_type_round_trips() {
    let (bytes, _) = sample(32);
    let g = parse(&bytes).unwrap();
    assert_eq!(g.version(), 3);
    for (k, v) in every_type() {
        assert_eq!(g.get(k), Some(&v), "{k}");
    }
    let order: Vec<&str> = g.metadata().iter().map(|(k, _)| k.as_str()).collect();
    let want: Vec<&str> = every_type().iter().map(|(k, _)| *k).collect();
    assert_eq!(order, want, "metadata keeps file order");
    assert_eq!(g.get("u16").unwrap().as_u64(), Some(60000));
    assert_eq!(g.get("i8").unwrap().as_u64(), None);
    assert_eq!(g.get("i8").unwrap().as_f64(), Some(-100.0));
    assert_eq!(g.get("string").unwrap().as_str(), Some("héllo ✓"));
    assert_eq!(g.get("missing"), None);
}

#[test]
fn tensor_infos_and_alignment() {
    for alignment in [32u64, 8, 64, 256] {
        let (bytes, m) = sample(alignment);
        let g = parse(&bytes).unwrap();
        assert_eq!(g.alignment(), alignment);
        assert_eq!(g.data_start() as u64 % alignment, 0);
        assert_eq!(g.tensors().len(), 3);
        let t = g.tensor("matrix").unwrap();
        assert_eq!((t.shape(), t.ty, t.len(), t.size), (vec![3, 5], GgmlType::F32, 15, 60));
        let got: Vec<f32> = g
            .tensor_bytes("matrix")
            .unwrap()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, m);
        let h = g.tensor("half").unwrap();
        assert_eq!((h.shape(), h.ty, h.size), (vec![7], GgmlType::F16, 14));
        assert_eq!(
            &g.tensor_bytes("half").unwrap()[2..4],
            &half::f16::from_f32(0.5).to_bits().to_le_bytes()
        );
        let q = g.tensor("blocks").unwrap();
        assert_eq!((q.shape(), q.ty, q.size), (vec![2, 32], GgmlType::Q4_0, 36));
        assert_eq!(
            g.tensor_bytes("blocks").unwrap(),
            &(0..36).map(|i| i as u8).collect::<Vec<_>>()[..]
        );
        assert!(g.tensor_bytes("nope").is_err());
    }
}

/// `bytes` must fail to parse with a message containing every one of `words`.
fn assert_err(what: &str, bytes: &[u8], words: &[&str]) {
    let err = match parse(bytes) {
        Ok(_) => panic!("{what}: parsed"),
        Err(e) => e.to_string(),
    };
    for w in words {
        assert!(err.contains(w), "{what}: error {err:?} does not mention {w:?}");
    }
    eprintln!("{what}: {err}");
}

fn header(version: u32, tensors: u64, kvs: u64) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&tensors.to_le_bytes());
    out.extend_from_slice(&kvs.to_le_bytes());
    out
}

fn kv(key: &str, ty: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    put_string(&mut out, key.as_bytes());
    out.extend_from_slice(&ty.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

fn tensor_info(name: &str, dims: &[u64], ty: u32, offset: u64) -> Vec<u8> {
    let mut out = Vec::new();
    put_string(&mut out, name.as_bytes());
    out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
    for d in dims {
        out.extend_from_slice(&d.to_le_bytes());
    }
    out.extend_from_slice(&ty.to_le_bytes());
    out.extend_from_slice(&offset.to_le_bytes());
    out
}

#[test]
fn corrupt_headers_are_errors() {
    assert_err("empty", b"", &["magic", "truncated"]);
    assert_err("bad magic", b"GGML\x03\0\0\0", &["magic", "not a GGUF file"]);
    assert_err("version 1", &header(1, 0, 0), &["version", "unsupported version 1"]);
    assert_err("version 4", &header(4, 0, 0), &["version", "4"]);
    assert_err(
        "big-endian",
        &header(3u32.swap_bytes(), 0, 0),
        &["version", "big-endian"],
    );
    assert_err("no counts", &header(3, 0, 0)[..12], &["tensor_count"]);
    assert_err(
        "kv count past the end",
        &header(3, 0, 1 << 40),
        &["metadata_kv_count", "do not fit"],
    );
    assert_err(
        "tensor count past the end",
        &header(3, u64::MAX, 0),
        &["tensor_count", "do not fit"],
    );
    let ok = header(3, 0, 0);
    assert!(parse(&ok).is_ok(), "an empty file with no tensors or metadata is valid");
}

#[test]
fn corrupt_metadata_is_an_error() {
    let with = |kvs: &[Vec<u8>]| {
        let mut out = header(3, 0, kvs.len() as u64);
        for k in kvs {
            out.extend_from_slice(k);
        }
        out
    };
    assert_err(
        "unknown value type",
        &with(&[kv("a.key", 13, &[0; 8])]),
        &["metadata 'a.key' type", "unknown value type 13"],
    );
    let mut long = Vec::new();
    put_string(&mut long, b"abc");
    long.truncate(8 + 2);
    assert_err(
        "string past the end",
        &with(&[kv("s", 8, &long)]),
        &["metadata 's'", "truncated"],
    );
    let mut huge = (u64::MAX - 3).to_le_bytes().to_vec();
    huge.extend_from_slice(b"xyz");
    assert_err("huge string length", &with(&[kv("s", 8, &huge)]), &["metadata 's'"]);
    let mut arr = 4u32.to_le_bytes().to_vec();
    arr.extend_from_slice(&(1u64 << 62).to_le_bytes());
    assert_err(
        "array count past the end",
        &with(&[kv("arr", 9, &arr)]),
        &["metadata 'arr' count", "do not fit"],
    );
    let mut arr = 77u32.to_le_bytes().to_vec();
    arr.extend_from_slice(&1u64.to_le_bytes());
    assert_err(
        "unknown array type",
        &with(&[kv("arr", 9, &arr)]),
        &["metadata 'arr' element type", "77"],
    );
    let mut nested = Vec::new();
    for _ in 0..100 {
        nested.extend_from_slice(&9u32.to_le_bytes());
        nested.extend_from_slice(&1u64.to_le_bytes());
    }
    assert_err("deep nesting", &with(&[kv("deep", 9, &nested)]), &["nested"]);
    assert_err(
        "bool 2",
        &with(&[kv("flag", 7, &[2])]),
        &["metadata 'flag'", "bool byte is 2"],
    );
    assert_err(
        "not UTF-8",
        &with(&[kv("s", 8, &[2, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xfe])]),
        &["metadata 's'", "UTF-8"],
    );
    let mut bad_key = Vec::new();
    put_string(&mut bad_key, &[0xc3]);
    bad_key.extend_from_slice(&0u32.to_le_bytes());
    bad_key.push(1);
    assert_err("key not UTF-8", &with(&[bad_key]), &["metadata #0 key", "UTF-8"]);
    assert_err(
        "duplicate key",
        &with(&[kv("k", 0, &[1]), kv("k", 0, &[2])]),
        &["metadata 'k'", "twice"],
    );
    for (what, payload, ty) in [
        ("alignment 0", 0u32.to_le_bytes().to_vec(), 4),
        ("alignment 48", 48u32.to_le_bytes().to_vec(), 4),
        ("alignment as u64", 64u64.to_le_bytes().to_vec(), 10),
    ] {
        assert_err(
            what,
            &with(&[kv("general.alignment", ty, &payload)]),
            &["general.alignment", "power of two"],
        );
    }
}

#[test]
fn corrupt_tensor_infos_are_errors() {
    let file = |infos: &[Vec<u8>], data: usize| {
        let mut out = header(3, infos.len() as u64, 0);
        for i in infos {
            out.extend_from_slice(i);
        }
        out.resize(out.len().next_multiple_of(32) + data, 0);
        out
    };
    assert!(parse(&file(&[tensor_info("w", &[4, 2], 0, 0)], 32)).is_ok());
    assert_err(
        "unknown tensor type",
        &file(&[tensor_info("w", &[4], 4, 0)], 64),
        &["tensor 'w' type", "unknown ggml type 4"],
    );
    assert_err(
        "too many dims",
        &file(&[tensor_info("w", &[1; 5], 0, 0)], 64),
        &["tensor 'w' n_dims", "5 dimensions"],
    );
    assert_err(
        "misaligned",
        &file(&[tensor_info("w", &[4], 0, 4)], 64),
        &["tensor 'w' offset", "alignment 32"],
    );
    assert_err(
        "data past the end",
        &file(&[tensor_info("w", &[4, 4], 0, 0)], 32),
        &["tensor 'w' data", "past the end"],
    );
    assert_err(
        "offset past the end",
        &file(&[tensor_info("w", &[1], 0, 1 << 40)], 32),
        &["tensor 'w' data", "past the end"],
    );
    assert_err(
        "offset overflow",
        &file(&[tensor_info("w", &[1], 0, u64::MAX - 31)], 32),
        &["tensor 'w'", "past the end"],
    );
    assert_err(
        "dims overflow",
        &file(&[tensor_info("w", &[1 << 32, 1 << 32], 0, 0)], 32),
        &["tensor 'w'", "overflow"],
    );
    assert_err(
        "partial block",
        &file(&[tensor_info("q", &[48, 1], 2, 0)], 64),
        &["tensor 'q'", "whole Q4_0 blocks of 32"],
    );
    assert_err(
        "overlap",
        &file(&[tensor_info("a", &[16], 0, 0), tensor_info("b", &[8], 0, 32)], 128),
        &["tensor 'a'", "overlaps tensor 'b'"],
    );
    assert_err(
        "duplicate name",
        &file(&[tensor_info("a", &[1], 0, 0), tensor_info("a", &[1], 0, 32)], 64),
        &["tensor 'a'", "twice"],
    );
    let mut truncated = file(&[tensor_info("w", &[4], 0, 0)], 16);
    truncated.truncate(truncated.len() - 1);
    assert_err("truncated data", &truncated, &["tensor 'w' data", "past the end"]);
}

#[test]
fn every_truncation_is_an_error() {
    let (bytes, _) = sample(32);
    for n in 0..bytes.len() {
        assert!(
            parse(&bytes[..n]).is_err(),
            "a file cut to {n} of {} bytes parsed",
            bytes.len()
        );
    }
    assert!(parse(&bytes).is_ok());
}

#[test]
fn fuzzed_files_never_panic() {
    let (bytes, _) = sample(32);
    let mut rng = Rng::new("gguf fuzz");
    let config = tiny_config();
    let weights = hf_weights(&config, &mut rng);
    let llama = llama_gguf(&config, &weights);
    let (mut ok, mut err) = (0, 0);
    for i in 0..20000 {
        let mut b = if i % 2 == 0 { bytes.clone() } else { llama.clone() };
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(b.len());
            b[at] = match rng.below(4) {
                0 => 0,
                1 => 0xff,
                2 => b[at] ^ (1 << rng.below(8)),
                _ => rng.next_u64() as u8,
            };
        }
        if rng.below(4) == 0 {
            b.truncate(rng.below(b.len() + 1));
        }
        match parse(&b) {
            Ok(g) => {
                ok += 1;
                let _ = hierarchos::nn::gguf::model_config(&g);
                let _ = hierarchos::nn::gguf::tokenizer(&g);
                if let Ok(c) = hierarchos::nn::gguf::model_config(&g) {
                    for (name, shape, _) in &weights {
                        let _ = g.hf_tensor_f32(name, shape, &c);
                    }
                }
                for t in g.tensors() {
                    let data = g.tensor_bytes(&t.name).unwrap();
                    assert_eq!(data.len() as u64, t.size);
                }
            }
            Err(_) => err += 1,
        }
    }
    eprintln!("fuzz: {ok} parsed, {err} rejected");
    assert!(err > 0);
}

/// llama.cpp's `permute` of q/k rows for its rope layout (convert_hf_to_gguf.py), written from its reshape:
/// `w.reshape(heads, 2, rows / heads / 2, cols).swapaxes(1, 2).reshape(rows, cols)`.
fn llama_cpp_permute(w: &[f32], rows: usize, cols: usize, heads: usize) -> Vec<f32> {
    let half = rows / heads / 2;
    let mut out = vec![0.0; w.len()];
    for h in 0..heads {
        for j in 0..half {
            for s in 0..2 {
                let dst = (h * half + j) * 2 + s;
                let src = (h * 2 + s) * half + j;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

fn tiny_config() -> ModelConfig {
    ModelConfig {
        model_type: "llama".into(),
        head_dim: 4,
        rotary_dim: 4,
        max_position_embeddings: 64,
        rms_norm_eps: 1e-5,
        rope: RopeConfig {
            theta: 500.0,
            scaling: RopeScaling::Default,
        },
        tie_word_embeddings: true,
        bos_token_id: Some(1),
        eos_token_ids: vec![2],
        ..ModelConfig::llama(11, 8, 12, 2, 2, 1)
    }
}

/// Random Hugging Face weights of `config`, by name.
fn hf_weights(config: &ModelConfig, rng: &mut Rng) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let mut out = Vec::new();
    hierarchos::nn::CausalLm::build(config, &mut |name, shape| {
        out.push((
            name.to_string(),
            shape.to_vec(),
            rng.vec(shape.iter().product(), -0.5, 0.5),
        ));
        Ok(hierarchos::core::Tensor::zeros(
            shape,
            hierarchos::core::DType::F32,
            &dev(),
        )?)
    })
    .unwrap();
    out
}

fn llama_gguf(config: &ModelConfig, weights: &[(String, Vec<usize>, Vec<f32>)]) -> Vec<u8> {
    let kvs = [
        ("general.architecture", Value::String("llama".into())),
        ("llama.block_count", Value::U32(config.num_hidden_layers as u32)),
        (
            "llama.context_length",
            Value::U32(config.max_position_embeddings as u32),
        ),
        ("llama.embedding_length", Value::U32(config.hidden_size as u32)),
        ("llama.feed_forward_length", Value::U32(config.intermediate_size as u32)),
        (
            "llama.attention.head_count",
            Value::U32(config.num_attention_heads as u32),
        ),
        (
            "llama.attention.head_count_kv",
            Value::U32(config.num_key_value_heads as u32),
        ),
        ("llama.rope.freq_base", Value::F32(config.rope.theta as f32)),
        (
            "llama.attention.layer_norm_rms_epsilon",
            Value::F32(config.rms_norm_eps as f32),
        ),
        ("llama.vocab_size", Value::U32(config.vocab_size as u32)),
        ("llama.rope.dimension_count", Value::U32(config.head_dim as u32)),
        ("tokenizer.ggml.bos_token_id", Value::U32(1)),
        ("tokenizer.ggml.eos_token_id", Value::U32(2)),
    ];
    let tensors: Vec<T> = weights
        .iter()
        .map(|(name, shape, values)| {
            let heads = if name.contains("q_proj") {
                config.num_attention_heads
            } else if name.contains("k_proj") {
                config.num_key_value_heads
            } else {
                0
            };
            let stored = if heads > 0 {
                llama_cpp_permute(values, shape[0], shape[1], heads)
            } else {
                values.clone()
            };
            f32_tensor(&hierarchos::nn::gguf::gguf_name(name).unwrap(), shape, &stored)
        })
        .collect();
    build(&kvs, &tensors, 32)
}

#[test]
fn llama_config_and_weights_come_back_in_hugging_face_layout() {
    let config = tiny_config();
    let mut rng = Rng::new("gguf llama");
    let weights = hf_weights(&config, &mut rng);
    let g = parse(&llama_gguf(&config, &weights)).unwrap();
    let read = hierarchos::nn::gguf::model_config(&g).unwrap();
    // f32 metadata: the epsilon comes back as the f32 nearest 1e-5.
    assert_eq!(
        read,
        ModelConfig {
            rms_norm_eps: 1e-5f32 as f64,
            ..config.clone()
        }
    );
    for (name, shape, values) in &weights {
        assert_eq!(&g.hf_tensor_f32(name, shape, &config).unwrap(), values, "{name}");
    }
    let err = g
        .hf_tensor_f32("model.norm.weight", &[9], &config)
        .unwrap_err()
        .to_string();
    assert!(err.contains("output_norm.weight") && err.contains("[9]"), "{err}");
    let err = g
        .hf_tensor_f32("lm_head.weight", &[11, 8], &config)
        .unwrap_err()
        .to_string();
    assert!(err.contains("output.weight") && err.contains("missing"), "{err}");
    let lm = g.load(&config, &dev(), true).unwrap();
    assert_eq!(lm.parameters().len(), weights.len());
}

#[test]
fn bad_model_metadata_is_an_error() {
    let config = tiny_config();
    let weights = hf_weights(&config, &mut Rng::new("gguf bad config"));
    let good = llama_gguf(&config, &weights);
    let g = parse(&good).unwrap();
    assert!(
        hierarchos::nn::gguf::tokenizer(&g)
            .unwrap_err()
            .to_string()
            .contains("tokenizer.ggml.model")
    );
    let with = |extra: (&str, Value)| {
        let kvs = vec![("general.architecture", Value::String("llama".into())), extra];
        parse(&build(&kvs, &[], 32)).unwrap()
    };
    let err = hierarchos::nn::gguf::model_config(&with(("llama.embedding_length", Value::String("576".into()))))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("llama.embedding_length") && err.contains("expected a non-negative integer"),
        "{err}"
    );
    let err = hierarchos::nn::gguf::model_config(&with(("llama.block_count", Value::U32(3))))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("llama.embedding_length") && err.contains("missing"),
        "{err}"
    );
    let arch_error = |arch: &str| {
        let file = parse(&build(&[("general.architecture", Value::String(arch.into()))], &[], 32)).unwrap();
        hierarchos::nn::gguf::model_config(&file).unwrap_err().to_string()
    };
    // An unknown architecture lists the known ones; a known family without GGUF support says so.
    let err = arch_error("mpt");
    assert!(err.contains("mpt") && err.contains("llama"), "{err}");
    let err = arch_error("gpt2");
    assert!(err.contains("gpt2") && err.contains("not supported"), "{err}");
}
