//! Safetensors loading: a save -> open -> load round trip, f16/bf16/f64 conversion, sharded weights, and corrupt
//! files, each of which must give an error naming the file (and the tensor) rather than a panic.

mod common;
use common::*;

use std::path::Path;

use hierarchos::core::Tensor;
use hierarchos::nn::weights::{INDEX_FILE, SINGLE_FILE, save_f32};
use hierarchos::nn::{Error, Weights};

/// The bytes of a safetensors file from raw entries (name, dtype, shape, data), written by hand so that tests can
/// make any dtype and any corruption.
fn safetensors_bytes(entries: &[(&str, &str, &[usize], Vec<u8>)]) -> Vec<u8> {
    let mut header = String::from("{");
    let mut offset = 0;
    for (i, (name, dtype, shape, data)) in entries.iter().enumerate() {
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            r#""{name}":{{"dtype":"{dtype}","shape":{shape:?},"data_offsets":[{offset},{}]}}"#,
            offset + data.len()
        ));
        offset += data.len();
    }
    header.push('}');
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    for (_, _, _, data) in entries {
        bytes.extend_from_slice(data);
    }
    bytes
}

/// The error message, checked to name every one of `words` (file names, tensor names).
fn weights_err(e: Error, words: &[&str]) -> String {
    let msg = e.to_string();
    for w in words {
        assert!(msg.contains(w), "error does not mention {w:?}: {msg}");
    }
    msg
}

#[test]
fn round_trip() {
    let dev = dev();
    let mut rng = Rng::new("round_trip");
    let dir = tmpdir("weights-rt");
    let a = rng.vec(3 * 17, -2.0, 2.0);
    let b = rng.vec(5, -1.0, 1.0);
    let tensors = vec![
        (
            "model.embed_tokens.weight".to_string(),
            Tensor::from_slice(&a, &[3, 17], &dev).unwrap(),
        ),
        // A transposed (non-contiguous) tensor is saved in its logical order.
        (
            "lm_head.weight".to_string(),
            Tensor::from_slice(&a, &[3, 17], &dev).unwrap().t().unwrap(),
        ),
        (
            "model.norm.weight".to_string(),
            Tensor::from_slice(&b, &[5], &dev).unwrap(),
        ),
        (
            "empty".to_string(),
            Tensor::from_slice::<f32>(&[], &[0, 4], &dev).unwrap(),
        ),
    ];
    let path = dir.join(SINGLE_FILE);
    Weights::save(&path, &tensors).unwrap();
    let w = Weights::open(&dir).unwrap();
    assert_eq!(
        w.names(),
        vec![
            "empty",
            "lm_head.weight",
            "model.embed_tokens.weight",
            "model.norm.weight"
        ]
    );
    assert!(w.contains("model.norm.weight") && !w.contains("model.norm.bias"));
    assert_eq!(w.shape("lm_head.weight"), Some(vec![17, 3]));
    let got = w.load("model.embed_tokens.weight", &[3, 17], &dev).unwrap();
    assert_eq!(got.shape(), &[3, 17]);
    assert_eq!(got.to_vec::<f32>().unwrap(), a);
    let t: Vec<f32> = (0..17 * 3).map(|i| a[(i % 3) * 17 + i / 3]).collect();
    assert_eq!(
        w.load("lm_head.weight", &[17, 3], &dev)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        t
    );
    assert_eq!(w.read_f32("model.norm.weight", &[5]).unwrap(), b);
    assert_eq!(w.load("empty", &[0, 4], &dev).unwrap().numel(), 0);
    // Saving again replaces the file atomically and leaves no temporary file behind.
    Weights::save(&path, &tensors[2..3]).unwrap();
    assert_eq!(Weights::open(&dir).unwrap().names(), vec!["model.norm.weight"]);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    // Duplicate names and mismatched data are refused.
    let dup = [tensors[2].clone(), tensors[2].clone()];
    weights_err(Weights::save(&path, &dup).unwrap_err(), &["model.norm.weight", "twice"]);
    weights_err(
        save_f32(&path, &[("x", &[2, 2], &[1.0])]).unwrap_err(),
        &["'x'", "[2, 2]"],
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Threads saving the same file at once each replace it whole: no save fails because another took its temporary
/// file, and the last rename leaves one of the complete files.
#[test]
fn concurrent_saves_of_one_file() {
    let dir = tmpdir("weights-concurrent");
    let path = dir.join(SINGLE_FILE);
    std::thread::scope(|s| {
        for t in 0..4 {
            let path = &path;
            s.spawn(move || {
                for i in 0..25 {
                    let v = (t * 100 + i) as f32;
                    save_f32(path, &[("x", &[3], &[v, v, v])]).unwrap();
                }
            });
        }
    });
    let got = Weights::open(&dir).unwrap().read_f32("x", &[3]).unwrap();
    assert!(got.iter().all(|&v| v == got[0]), "{got:?}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn half_and_double_are_converted() {
    let dev = dev();
    let mut rng = Rng::new("half_and_double_are_converted");
    let dir = tmpdir("weights-dtypes");
    let v = rng.vec(7, -3.0, 3.0);
    let f16: Vec<u8> = v.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect();
    let bf16: Vec<u8> = v.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect();
    let f64: Vec<u8> = v.iter().flat_map(|&x| (x as f64).to_le_bytes()).collect();
    let f32: Vec<u8> = v.iter().flat_map(|&x| x.to_le_bytes()).collect();
    // An odd header length puts the data at unaligned offsets: reading must not assume alignment.
    let bytes = safetensors_bytes(&[
        ("h", "F16", &[7], f16),
        ("b", "BF16", &[7], bf16),
        ("d", "F64", &[7], f64),
        ("s", "F32", &[7], f32),
    ]);
    std::fs::write(dir.join(SINGLE_FILE), &bytes).unwrap();
    let w = Weights::open(&dir).unwrap();
    let want_h: Vec<f32> = v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect();
    let want_b: Vec<f32> = v.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect();
    assert_eq!(w.load("h", &[7], &dev).unwrap().to_vec::<f32>().unwrap(), want_h);
    assert_eq!(w.load("b", &[7], &dev).unwrap().to_vec::<f32>().unwrap(), want_b);
    assert_eq!(w.load("d", &[7], &dev).unwrap().to_vec::<f32>().unwrap(), v);
    assert_eq!(w.load("s", &[7], &dev).unwrap().to_vec::<f32>().unwrap(), v);
    // The same bytes from memory (the path only labels errors).
    let mem = Weights::from_bytes(bytes, Path::new("in-memory.safetensors")).unwrap();
    assert_eq!(mem.read_f32("d", &[7]).unwrap(), v);
    weights_err(
        mem.read_f32("nope", &[1]).unwrap_err(),
        &["in-memory.safetensors", "'nope'"],
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Two shards and an index, as `save_pretrained` writes them for large models.
fn write_sharded(dir: &Path, a: &[f32], b: &[f32]) {
    save_f32(
        &dir.join("model-00001-of-00002.safetensors"),
        &[("model.embed_tokens.weight", &[2, 3], a)],
    )
    .unwrap();
    save_f32(
        &dir.join("model-00002-of-00002.safetensors"),
        &[("model.norm.weight", &[3], b), ("lm_head.weight", &[2, 3], a)],
    )
    .unwrap();
    let index = r#"{"metadata": {"total_size": 60}, "weight_map": {
        "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
        "model.norm.weight": "model-00002-of-00002.safetensors",
        "lm_head.weight": "model-00002-of-00002.safetensors"}}"#;
    std::fs::write(dir.join(INDEX_FILE), index).unwrap();
}

#[test]
fn sharded() {
    let dev = dev();
    let mut rng = Rng::new("sharded");
    let dir = tmpdir("weights-sharded");
    let a = rng.vec(6, -1.0, 1.0);
    let b = rng.vec(3, -1.0, 1.0);
    write_sharded(&dir, &a, &b);
    let w = Weights::open(&dir).unwrap();
    assert_eq!(
        w.names(),
        vec!["lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"]
    );
    assert_eq!(
        w.load("model.embed_tokens.weight", &[2, 3], &dev)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        a
    );
    assert_eq!(
        w.load("model.norm.weight", &[3], &dev)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        b
    );
    assert_eq!(w.read_f32("lm_head.weight", &[2, 3]).unwrap(), a);
    // A missing tensor is reported against the index; a misshapen one against its shard, with both shapes.
    weights_err(
        w.read_f32("model.layers.0.mlp.up_proj.weight", &[4, 3]).unwrap_err(),
        &[INDEX_FILE, "up_proj", "[4, 3]"],
    );
    weights_err(
        w.load("model.norm.weight", &[4], &dev).unwrap_err(),
        &[
            "model-00002-of-00002.safetensors",
            "model.norm.weight",
            "expected shape [4]",
            "found [3]",
        ],
    );
    // The index names a shard that is not there.
    std::fs::remove_file(dir.join("model-00001-of-00002.safetensors")).unwrap();
    weights_err(
        Weights::open(&dir).unwrap_err(),
        &[INDEX_FILE, "model-00001-of-00002.safetensors", "missing"],
    );
    // The index points a tensor at a shard that does not hold it.
    write_sharded(&dir, &a, &b);
    let index = std::fs::read_to_string(dir.join(INDEX_FILE)).unwrap().replace(
        r#""model.norm.weight": "model-00002-of-00002.safetensors""#,
        r#""model.norm.weight": "model-00001-of-00002.safetensors""#,
    );
    std::fs::write(dir.join(INDEX_FILE), index).unwrap();
    weights_err(
        Weights::open(&dir).unwrap_err(),
        &["model-00001-of-00002.safetensors", "model.norm.weight"],
    );
    // Index files that are not JSON, lack weight_map, or escape the folder.
    for bad in [
        "{oops",
        r#"{"metadata": {}}"#,
        r#"{"weight_map": {"x": "../x.safetensors"}}"#,
        r#"{"weight_map": {"x": 3}}"#,
    ] {
        std::fs::write(dir.join(INDEX_FILE), bad).unwrap();
        weights_err(Weights::open(&dir).unwrap_err(), &[INDEX_FILE]);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn corrupt_files() {
    let dir = tmpdir("weights-corrupt");
    let file = dir.join(SINGLE_FILE);
    let file_name = file.display().to_string();
    let open = |bytes: &[u8]| {
        std::fs::write(&file, bytes).unwrap();
        Weights::open(&dir)
    };
    let good = safetensors_bytes(&[("w", "F32", &[2], vec![0; 8])]);
    assert!(open(&good).is_ok());
    // Shorter than the 8-byte length prefix, and empty.
    weights_err(open(&good[..5]).unwrap_err(), &[&file_name, "8-byte"]);
    weights_err(open(&[]).unwrap_err(), &[&file_name]);
    // A header length past the end of the file, and an absurd one.
    let mut long = good.clone();
    long[..8].copy_from_slice(&(good.len() as u64 * 2).to_le_bytes());
    weights_err(open(&long).unwrap_err(), &[&file_name, "header length"]);
    let mut huge = good.clone();
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    weights_err(open(&huge).unwrap_err(), &[&file_name, "header length"]);
    // A header that is not JSON (or not UTF-8).
    let mut garbage = 10u64.to_le_bytes().to_vec();
    garbage.extend_from_slice(b"not json!!");
    weights_err(open(&garbage).unwrap_err(), &[&file_name, "JSON"]);
    let mut binary = 4u64.to_le_bytes().to_vec();
    binary.extend_from_slice(&[0xff, 0xfe, 0xfd, 0xfc]);
    weights_err(open(&binary).unwrap_err(), &[&file_name, "UTF-8"]);
    // Offsets past the end of the data, and data cut short.
    let past = safetensors_bytes(&[("w", "F32", &[100], vec![0; 400])]);
    weights_err(open(&past[..past.len() - 300]).unwrap_err(), &[&file_name]);
    let mut lying = String::from(r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8000]}}"#).into_bytes();
    let mut bytes = (lying.len() as u64).to_le_bytes().to_vec();
    bytes.append(&mut lying);
    bytes.extend_from_slice(&[0; 8]);
    weights_err(open(&bytes).unwrap_err(), &[&file_name]);
    // Shape and byte size disagree.
    weights_err(
        open(&safetensors_bytes(&[("w", "F32", &[3], vec![0; 8])])).unwrap_err(),
        &[&file_name],
    );
    // An unknown dtype string fails at open; a known but unsupported one when the tensor is loaded.
    weights_err(
        open(&safetensors_bytes(&[("w", "Q4", &[2], vec![0; 1])])).unwrap_err(),
        &[&file_name],
    );
    let ints = open(&safetensors_bytes(&[("ids", "I64", &[2], vec![0; 16])])).unwrap();
    weights_err(ints.read_f32("ids", &[2]).unwrap_err(), &[&file_name, "'ids'", "I64"]);
    // No weights at all.
    std::fs::remove_file(&file).unwrap();
    weights_err(Weights::open(&dir).unwrap_err(), &[SINGLE_FILE, INDEX_FILE]);
    std::fs::remove_dir_all(&dir).unwrap();
}
