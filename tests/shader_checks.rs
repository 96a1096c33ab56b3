//! Kernels compile without wgpu's runtime checks unless `GpuOptions::shader_checks` (`HIERARCHOS_SHADER_CHECKS=1`)
//! asks for them: the checks only clamp what the kernels already keep in range, so a model's logits and
//! gradients come out bit for bit the same either way.

mod common;
use common::fixtures::*;

use hierarchos::core::{Gpu, GpuOptions};
use hierarchos::nn::{CausalLm, ModelConfig, Weights};

/// Logits and every gradient of one training step of fixture `name` on a device opened with `shader_checks`.
fn step(name: &str, shader_checks: bool) -> Vec<Vec<f32>> {
    let options = GpuOptions {
        shader_checks,
        ..GpuOptions::from_env()
    };
    let d = pollster::block_on(Gpu::open(&options)).unwrap();
    let dir = fixture(name);
    let config = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let weights = Weights::open(&dir).unwrap();
    let lm = CausalLm::build(&config, &mut |n, s| Ok(weights.load(n, s, &d)?.requires_grad_())).unwrap();
    let ids = hierarchos::core::Tensor::from_slice(&input_ids(&dir).to_vec::<u32>().unwrap(), &[2, 24], &d).unwrap();
    let logits = lm.forward(&ids, None).unwrap();
    lm.loss(&ids, &ids).unwrap().backward().unwrap();
    let mut out = vec![logits.to_vec::<f32>().unwrap()];
    out.extend(
        lm.parameters()
            .iter()
            .map(|(_, p)| p.grad().unwrap().to_vec::<f32>().unwrap()),
    );
    out
}

#[test]
fn runtime_checks_change_no_result() {
    for name in ["llama", "deepseek_v3"] {
        assert_eq!(step(name, false), step(name, true), "{name}");
    }
}
