//! Dtype casts, dense copies and constant tensors.

use hierarchos_wgpu::{COMMON_WGSL, DType, Dispatch, Gpu, Language};

use crate::autograd::{Node, grad_enabled, no_grad};
use crate::error::Result;
use crate::ops::map::Map;
use crate::tensor::{Device, Tensor};

const CAST_TO_16_WGSL: &str = include_str!("../../../../wgsl/cast_to_16.wgsl");

impl Tensor {
    /// The values converted to `dtype` (floats round to nearest even; float to integer truncates toward zero).
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        let out = match self.dense_f32_to_16(dtype)? {
            Some(out) => out,
            None => {
                let body = format!("return {}(x0);", dtype.compute_type());
                Map::elementwise("to_dtype", &[self], dtype, body)?.run()?
            }
        };
        if !grad_enabled() || !self.requires_grad() || !dtype.is_float() {
            return Ok(out);
        }
        let src = self.dtype();
        let node = Node::record("to_dtype", &[self], Box::new(move |g| Ok(vec![Some(g.to_dtype(src)?)])));
        Ok(out.with_node(node))
    }

    /// The cast of a dense f32 tensor to f16 or bf16 by the kernel that converts eight elements per thread,
    /// where it applies (element count a multiple of 8, offset of 4); `None` leaves it to the elementwise map.
    /// Mixed-precision training casts every product's operands, and this kernel moves them at memory speed where
    /// the map's one 16-bit store per thread did not.
    fn dense_f32_to_16(&self, dtype: DType) -> Result<Option<Tensor>> {
        let n = self.numel();
        let fits = self.dtype() == DType::F32
            && matches!(dtype, DType::F16 | DType::BF16)
            && self.is_contiguous()
            && self.layout().offset.is_multiple_of(4)
            && n.is_multiple_of(8)
            && n > 0;
        if !fits {
            return Ok(None);
        }
        let device = self.device();
        let out = device.alloc("to_dtype", Tensor::bytes_for(n, dtype))?;
        let round = match dtype {
            DType::F16 => "f32_to_f16",
            _ => "f32_to_bf16",
        };
        device.dispatch(Dispatch {
            op: "to_dtype",
            runtime_checks: false,
            language: Language::Wgsl,
            key: &format!("cast_to_16:{dtype}"),
            source: &|| format!("fn round16(v: f32) -> u32 {{ return {round}(v); }}\n{CAST_TO_16_WGSL}{COMMON_WGSL}"),
            buffers: &[&out, self.buffer()],
            params: &[(n / 8) as u32, (self.layout().offset / 4) as u32],
            workgroups: Gpu::grid((n / 8).div_ceil(256) as u32),
        })?;
        Ok(Some(Tensor::from_buffer(out, self.shape(), dtype, None)))
    }

    /// A dense row-major copy (always copies; see [`Tensor::contiguous`]).
    pub fn copy(&self) -> Result<Tensor> {
        let out = Map::elementwise("copy", &[self], self.dtype(), "return x0;".into())?.run()?;
        let node = Node::record("copy", &[self], Box::new(|g| Ok(vec![Some(g.clone())])));
        Ok(out.with_node(node))
    }

    /// A tensor with every element `value`, which an integer dtype must hold exactly.
    pub fn full(shape: &[usize], value: f64, dtype: DType, device: &Device) -> Result<Tensor> {
        if let Some((lo, hi)) = integer_range(dtype)
            && !(value.fract() == 0.0 && (lo..=hi).contains(&value))
        {
            return Err(crate::Error::Invalid {
                op: "full",
                message: format!("{value} is no {dtype} value"),
            });
        }
        no_grad(|| Tensor::zeros(shape, dtype, device)?.add_scalar(value))
    }

    /// A tensor of ones.
    pub fn ones(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(shape, 1.0, dtype, device)
    }

    /// Ones with the shape, dtype and device of `self`.
    pub fn ones_like(&self) -> Result<Tensor> {
        Tensor::ones(self.shape(), self.dtype(), self.device())
    }

    /// `start, start + step, ...` below `end` (like `torch.arange`), as a 1-D tensor of `dtype`.
    pub fn arange(start: f64, end: f64, step: f64, dtype: DType, device: &Device) -> Result<Tensor> {
        if step == 0.0 || !step.is_finite() || !start.is_finite() || !end.is_finite() {
            return Err(crate::Error::Invalid {
                op: "arange",
                message: format!("bad range {start}..{end} step {step}"),
            });
        }
        let count = ((end - start) / step).ceil().max(0.0);
        let n = count.min(usize::MAX as f64) as usize;
        Tensor::check_shape("arange", &[n])?;
        let values = (0..n).map(|i| start + i as f64 * step);
        // Integers straight from f64 (through f32, 2^24 + 1 became 2^24), and only those the dtype holds.
        if let Some((lo, hi)) = integer_range(dtype) {
            let last = start + n.saturating_sub(1) as f64 * step;
            if n > 0 && [start, last].iter().any(|v| v.trunc() < lo || v.trunc() > hi) {
                return Err(crate::Error::Invalid {
                    op: "arange",
                    message: format!("{start}..{end} step {step} leaves the range of {dtype}"),
                });
            }
        }
        match dtype {
            DType::U32 => Tensor::from_slice(&values.map(|v| v as u32).collect::<Vec<_>>(), &[n], device),
            DType::I32 => Tensor::from_slice(&values.map(|v| v as i32).collect::<Vec<_>>(), &[n], device),
            _ => no_grad(|| {
                Tensor::from_slice(&values.map(|v| v as f32).collect::<Vec<_>>(), &[n], device)?.to_dtype(dtype)
            }),
        }
    }
}

impl Tensor {
    /// Overwrites the elements of `self` (a dense tensor) with `src`, broadcast and cast to `self`'s dtype. Not
    /// recorded by autograd: it is how optimizers update parameters without changing their identity.
    pub fn assign(&self, src: &Tensor) -> Result<()> {
        let body = format!("return {}(x0);", self.dtype().compute_type());
        let mut map = Map::elementwise("assign", &[src], self.dtype(), body)?;
        map.inputs[0].1 = src.layout().broadcast_to("assign", self.shape())?;
        map.shape = self.shape().to_vec();
        map.run_into(self)
    }
}

/// The smallest and largest value of an integer dtype, as f64 (which holds both exactly); `None` for floats.
pub(crate) fn integer_range(dtype: DType) -> Option<(f64, f64)> {
    match dtype {
        DType::U32 => Some((0.0, u32::MAX as f64)),
        DType::I32 => Some((i32::MIN as f64, i32::MAX as f64)),
        _ => None,
    }
}
