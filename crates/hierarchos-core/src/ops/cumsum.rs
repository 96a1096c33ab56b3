//! Cumulative sum along a dimension.

use hierarchos_wgpu::DType;

use crate::autograd::{Node, grad_enabled, no_grad};
use crate::error::{Error, Result};
use crate::ops::rows::{Binding, RowKernel, dim_last};
use crate::shape::resolve_dim;
use crate::tensor::Tensor;

const CUMSUM_WGSL: &str = include_str!("../../../../wgsl/cumsum.wgsl");

impl Tensor {
    /// Running sums along `dim` (`out[j] = Σ_{k <= j} x[k]`, like `torch.cumsum`): position ids from masks,
    /// prefix sums of lengths. Floats only; sums are accumulated in f32.
    pub fn cumsum(&self, dim: isize) -> Result<Tensor> {
        self.scan(dim, false)
    }

    /// Cumulative sum from the start (`reverse` false) or from the end of `dim`; each is the other's gradient.
    fn scan(&self, dim: isize, reverse: bool) -> Result<Tensor> {
        const OP: &str = "cumsum";
        let dtype = self.dtype();
        if !dtype.is_float() {
            return Err(Error::DTypeMismatch {
                op: OP,
                expected: "a float dtype".into(),
                got: dtype,
            });
        }
        if self.rank() == 0 {
            resolve_dim(OP, dim, 1)?;
            return self.reshape(&[1])?.scan(0, reverse)?.reshape(&[]);
        }
        let d = resolve_dim(OP, dim, self.rank())?;
        let (view, back) = dim_last(self, d)?;
        let (lead, cols) = view.shape.split_at(view.shape.len() - 1);
        let y = RowKernel {
            scalars: [reverse as u32, 0, 0, 0, 0, 0],
            views: vec![&view],
            bindings: vec![Binding::read("x", self)],
            ..RowKernel::new(OP, lead, cols[0], &[CUMSUM_WGSL])
        }
        .output_f32(self.device())?
        .permute(&back)?;
        let y = if dtype == DType::F32 {
            y
        } else {
            no_grad(|| y.to_dtype(dtype))?
        };
        if !grad_enabled() || !self.requires_grad() {
            return Ok(y);
        }
        let node = Node::record(
            OP,
            &[self],
            Box::new(move |g| Ok(vec![Some(g.scan(d as isize, !reverse)?)])),
        );
        Ok(y.with_node(node))
    }
}
