//! Reproducible parameter initialization from the counter-based generator.

use hierarchos_core::{DType, Device, Result, Tensor, no_grad};

use crate::{CausalLm, ModelConfig};

/// Hands out disjoint slices of one Philox stream, so a model built from a seed is the same on every device and
/// does not depend on the order kernels run in.
#[derive(Clone, Debug)]
pub struct ParamRng {
    seed: u64,
    offset: u64,
}

impl ParamRng {
    /// A stream for `seed`.
    pub fn new(seed: u64) -> Self {
        ParamRng { seed, offset: 0 }
    }

    /// Uniform values in `[lo, hi)` (f32), advancing the stream past them.
    pub fn uniform(&mut self, shape: &[usize], lo: f64, hi: f64, device: &Device) -> Result<Tensor> {
        let u = Tensor::rand(shape, self.seed, self.offset, DType::F32, device)?;
        self.offset += shape.iter().product::<usize>() as u64;
        no_grad(|| u.mul_scalar(hi - lo)?.add_scalar(lo))
    }

    /// Normal values of mean 0 and standard deviation `std` (f32), advancing the stream past them.
    pub fn normal(&mut self, shape: &[usize], std: f64, device: &Device) -> Result<Tensor> {
        let z = Tensor::randn(shape, self.seed, self.offset, DType::F32, device)?;
        self.offset += shape.iter().product::<usize>() as u64;
        no_grad(|| z.mul_scalar(std))
    }
}

impl CausalLm {
    /// A new model of `config` with every parameter trainable, initialized as transformers initializes one
    /// (weight matrices and embeddings from N(0, `initializer_range`), the padding token's embedding row 0, norm
    /// weights 1 (0 for Gemma's norms, which scale by `1 + weight`), biases 0), drawn from
    /// `seed`: training from scratch. The draws use the device's `log` and `cos`, so another GPU may differ in
    /// the last bits.
    pub fn init_random(config: &ModelConfig, seed: u64, device: &Device) -> crate::Result<CausalLm> {
        let mut rng = ParamRng::new(seed);
        let embedding = config.names.embedding_weight();
        CausalLm::build(config, &mut |name, shape| {
            let t = if name.ends_with(".bias") {
                Tensor::zeros(shape, DType::F32, device)?
            } else if shape.len() == 1 {
                let one = if config.norm_unit_offset { 0.0 } else { 1.0 };
                Tensor::full(shape, one, DType::F32, device)?
            } else {
                let w = rng.normal(shape, config.initializer_range, device)?;
                match config.padding_idx {
                    Some(pad) if name == embedding => {
                        let keep: Vec<f32> = (0..shape[0]).map(|row| (row != pad) as u32 as f32).collect();
                        let keep = Tensor::from_slice(&keep, &[shape[0], 1], device)?;
                        no_grad(|| w.mul(&keep))?
                    }
                    _ => w,
                }
            };
            Ok(t.requires_grad_())
        })
    }
}
