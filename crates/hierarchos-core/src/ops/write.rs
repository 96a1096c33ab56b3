//! In-place writes into part of a tensor: how a key/value cache appends the new positions without copying what
//! it already holds.

use std::sync::Arc;

use hierarchos_wgpu::{Access, COMMON_WGSL, Dispatch, Gpu, Language};

use crate::error::{Error, Result};
use crate::shape::{MAX_DIMS, resolve_dim};
use crate::tensor::Tensor;

const WRITE_WGSL: &str = include_str!("../../../../wgsl/write.wgsl");

impl Tensor {
    /// Copies `src` into `self.narrow(dim, start, src.shape[dim])`, in place. `self` must be dense and of an
    /// unpacked dtype (f32, u32, i32, or f16 on devices that store it natively), `src` of the same dtype and
    /// shape outside `dim`, read through any layout. Not recorded by autograd (like [`Tensor::assign`]): a cache
    /// holds values, not a differentiable history.
    pub fn write_at(&self, dim: isize, start: usize, src: &Tensor) -> Result<()> {
        const OP: &str = "write_at";
        let d = resolve_dim(OP, dim, self.rank())?;
        if src.dtype() != self.dtype() {
            return Err(Error::DTypeMismatch {
                op: OP,
                expected: self.dtype().to_string(),
                got: src.dtype(),
            });
        }
        let fits = src.rank() == self.rank()
            && (0..self.rank()).all(|k| k == d || src.shape()[k] == self.shape()[k])
            && start
                .checked_add(src.shape()[d])
                .is_some_and(|end| end <= self.shape()[d]);
        if !fits {
            return Err(Error::ShapeMismatch {
                op: OP,
                lhs: self.shape().to_vec(),
                rhs: src.shape().to_vec(),
            });
        }
        if !self.is_contiguous() {
            return Err(Error::Invalid {
                op: OP,
                message: "the destination must be dense".into(),
            });
        }
        let device = self.device().clone();
        let native_f16 = device.caps().f16;
        let dst_access = Access::new(self.dtype(), native_f16);
        if dst_access.packed {
            return Err(Error::DTypeMismatch {
                op: OP,
                expected: "an unpacked destination (f32, u32, i32 or native f16)".into(),
                got: self.dtype(),
            });
        }
        if !Arc::ptr_eq(src.device(), &device) {
            return Err(Error::Invalid {
                op: OP,
                message: "source and destination live on different devices".into(),
            });
        }
        if std::ptr::eq(src.buffer(), self.buffer()) {
            return Err(Error::Invalid {
                op: OP,
                message: "the destination is also the source".into(),
            });
        }
        let n = src.numel();
        if n == 0 {
            return Ok(());
        }
        self.mark_written();
        let region = self.layout().narrow(d, start, src.shape()[d])?;
        let src_access = Access::new(src.dtype(), native_f16);
        let mut params = vec![n as u32, src.rank() as u32];
        let pad = |v: &[usize]| {
            (0..MAX_DIMS)
                .map(|k| v.get(k).copied().unwrap_or(1) as u32)
                .collect::<Vec<_>>()
        };
        params.extend(pad(src.shape()));
        for l in [src.layout(), &region] {
            params.push(l.offset as u32);
            params.extend((0..MAX_DIMS).map(|k| l.strides.get(k).copied().unwrap_or(0) as u32));
        }
        let key = format!("write_at:{}:{}", self.dtype(), src_access.storage_type());
        let source = || {
            let mut s = String::new();
            if native_f16 && self.dtype() == hierarchos_wgpu::DType::F16 {
                s.push_str("enable f16;\n");
            }
            s.push_str("@group(0) @binding(0) var<storage, read> p: array<u32>;\n");
            s.push_str(&format!(
                "@group(0) @binding(1) var<storage, read_write> out: array<{}>;\n\
                 @group(0) @binding(2) var<storage, read> in0: array<{}>;\n",
                dst_access.storage_type(),
                src_access.storage_type()
            ));
            s.push_str(&src_access.load_fn("in0"));
            s.push_str(&dst_access.store_fn("out"));
            s.push_str(COMMON_WGSL);
            s.push_str(WRITE_WGSL);
            s
        };
        device.dispatch(Dispatch {
            op: OP,
            runtime_checks: false,
            language: Language::Wgsl,
            key: &key,
            source: &source,
            buffers: &[self.buffer(), src.buffer()],
            params: &params,
            workgroups: Gpu::grid((n as u32).div_ceil(256)),
        })?;
        Ok(())
    }
}
