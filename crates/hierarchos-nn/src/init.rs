//! Reproducible parameter initialization from the counter-based generator.

use hierarchos_core::{DType, Device, Result, Tensor, no_grad};

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
}
