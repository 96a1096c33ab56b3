//! The transformers fixtures under tests/fixtures (see its README.md): folders and the float64 references.

use std::path::{Path, PathBuf};

use hierarchos::core::Tensor;
use hierarchos::nn::CausalLm;
use hierarchos::nn::optim::AdamW;

use super::dev;

/// The fixtures of every validated architecture of the registry (one tiny random model each): what the parity
/// tests run, so that no family is called validated without them.
pub fn validated() -> Vec<&'static str> {
    hierarchos::nn::registry::validated_fixtures()
}

/// The folder of fixture `name`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// Every tensor of `dir/reference.safetensors` whose name starts with `prefix`, by the rest of the name, sorted
/// by it, as f64.
pub fn reference_tensors(dir: &Path, prefix: &str) -> Vec<(String, Vec<f64>)> {
    tensors_of(&dir.join("reference.safetensors"), prefix)
}

/// The f32 or f64 tensors of a safetensors file whose names start with `prefix`, as in [`reference_tensors`].
fn tensors_of(file: &Path, prefix: &str) -> Vec<(String, Vec<f64>)> {
    let bytes = std::fs::read(file).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<(String, Vec<f64>)> = st
        .tensors()
        .into_iter()
        .filter_map(|(name, t)| {
            let rest = name.strip_prefix(prefix)?.to_string();
            let v = match t.dtype() {
                safetensors::Dtype::F64 => t
                    .data()
                    .chunks_exact(8)
                    .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
                safetensors::Dtype::F32 => t
                    .data()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
                    .collect(),
                other => panic!("{name}: {other:?} is not a reference dtype"),
            };
            Some((rest, v))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Every parameter after the fixture's two damped AdamW steps in float64, by name, sorted: the saved f32
/// parameters plus the steps' f32 changes (`adamw_damped_delta/<name>`; the sum is within 1e-10 of
/// transformers' float64 result, see tests/fixtures/README.md).
pub fn adamw_damped_reference(dir: &Path) -> Vec<(String, Vec<f64>)> {
    let initial = tensors_of(&dir.join("model.safetensors"), "");
    let deltas = reference_tensors(dir, "adamw_damped_delta/");
    deltas
        .into_iter()
        .map(|(name, delta)| {
            let (_, start) = initial
                .iter()
                .find(|(n, _)| *n == name)
                .unwrap_or_else(|| panic!("{name} is not in model.safetensors"));
            (name, start.iter().zip(&delta).map(|(a, d)| a + d).collect())
        })
        .collect()
}

/// The two prompts of the fixture, `[2, 24]` token ids.
pub fn input_ids(dir: &Path) -> Tensor {
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor("input_ids").unwrap();
    let ids: Vec<u32> = t
        .data()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
        .collect();
    Tensor::from_slice(&ids, t.shape(), &dev()).unwrap()
}

/// `reference.json` of the fixture.
pub fn report(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap()
}

/// The fixtures' two training steps: batch A (the first prompt of `ids`), then batch B (the second), each a
/// causal-LM loss, a backward and `opt`'s step on `params` at lr 1e-3; returns the loss before each step.
pub fn two_steps(lm: &CausalLm, ids: &Tensor, params: &[(String, Tensor)], opt: &mut AdamW) -> Vec<f64> {
    (0..2)
        .map(|row| {
            let batch = ids.narrow(0, row, 1).unwrap();
            let loss = lm.loss(&batch, &batch).unwrap();
            let value = loss.to_vec::<f32>().unwrap()[0] as f64;
            loss.backward().unwrap();
            opt.step(params, 1e-3, 1.0).unwrap();
            value
        })
        .collect()
}
