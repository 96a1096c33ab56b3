//! Counter-based random tensors: the same (seed, offset) gives the same values on every device, and any slice
//! of a stream can be regenerated without the rest (dropout masks recomputed in backward, sharded init).
//!
//! Element `i` (row-major) of a tensor made with `seed` and `offset` is computed from Philox4x32-10
//! (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", the Random123 reference constants) with
//! key `(seed as u32, (seed >> 32) as u32)` and counter `(e as u32, (e >> 32) as u32, 0, 0)` where
//! `e = offset + i` (wrapping in 64 bits). Of its four output words `r0..r3`:
//! - `rand`: `(r0 >> (32 - b)) * 2^-b`, with `b` = 24 for f32, 11 for f16, 8 for bf16: uniform on `[0, 1)` in
//!   steps of `2^-b`, every value exact in the output dtype (so rounding never produces 1.0).
//! - `randn`: Box-Muller on `u1 = ((r0 >> 8) + 1) * 2^-24` (in `(0, 1]`) and `u2 = (r1 >> 8) * 2^-24`:
//!   `sqrt(-2 ln u1) * cos(2 pi u2)`, computed in f32 (then rounded to the dtype); this one depends on the
//!   device's `log` and `cos` in the last bits.

use hierarchos_wgpu::{DType, Dispatch, Gpu, Language};

use crate::autograd::no_grad;
use crate::error::{Error, Result};
use crate::shape::numel;
use crate::tensor::{Device, Tensor};

const RANDOM_WGSL: &str = include_str!("../../../../wgsl/random.wgsl");

impl Tensor {
    /// Uniform values on `[0, 1)` from the counter-based stream `(seed, offset)` (see the module docs for the
    /// exact mapping): reproducible across devices and independent of how the work is split.
    pub fn rand(shape: &[usize], seed: u64, offset: u64, dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::random("rand", shape, seed, offset, dtype, device, false)
    }

    /// Standard normal values (Box-Muller) from the counter-based stream `(seed, offset)`: weight
    /// initialization and noise that a seed reproduces.
    pub fn randn(shape: &[usize], seed: u64, offset: u64, dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::random("randn", shape, seed, offset, dtype, device, true)
    }

    fn random(
        op: &'static str,
        shape: &[usize],
        seed: u64,
        offset: u64,
        dtype: DType,
        device: &Device,
        normal: bool,
    ) -> Result<Tensor> {
        let bits = match dtype {
            DType::F32 => 24,
            DType::F16 => 11,
            DType::BF16 => 8,
            _ => {
                return Err(Error::DTypeMismatch {
                    op,
                    expected: "a float dtype".into(),
                    got: dtype,
                });
            }
        };
        Tensor::check_shape(op, shape)?;
        let n = numel(shape);
        let buf = device.alloc(op, Tensor::bytes_for(n, DType::F32))?;
        let out = Tensor::from_buffer(buf, shape, DType::F32, None);
        if n > 0 {
            let source = || {
                format!(
                    "@group(0) @binding(0) var<storage, read> p: array<u32>;\n\
                     @group(0) @binding(1) var<storage, read_write> out: array<f32>;\n\
                     const NORMAL: bool = {normal};\n{RANDOM_WGSL}"
                )
            };
            device.dispatch(Dispatch {
                op,
                runtime_checks: false,
                language: Language::Wgsl,
                key: &format!("random:{normal}"),
                source: &source,
                buffers: &[out.buffer()],
                params: &[
                    n as u32,
                    offset as u32,
                    (offset >> 32) as u32,
                    seed as u32,
                    (seed >> 32) as u32,
                    bits,
                ],
                workgroups: Gpu::grid((n as u32).div_ceil(256)),
            })?;
        }
        no_grad(|| out.to_dtype(dtype))
    }
}
