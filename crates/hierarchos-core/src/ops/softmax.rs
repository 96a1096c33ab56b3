//! Softmax and log-softmax along any dimension.

use crate::autograd::{Node, grad_enabled};
use crate::error::{Error, Result};
use crate::ops::rows::{Binding, ROW_LOGSUMEXP_WGSL, RowKernel, dim_last};
use crate::shape::resolve_dim;
use crate::tensor::Tensor;

const SOFTMAX_WGSL: &str = include_str!("../../../../wgsl/softmax.wgsl");

impl Tensor {
    /// `exp(x) / Σ exp(x)` along `dim`, computed stably (attention weights, output distributions). A row of
    /// only -inf gives NaN, as in PyTorch.
    pub fn softmax(&self, dim: isize) -> Result<Tensor> {
        self.softmax_along("softmax", dim, false)
    }

    /// `x - log Σ exp(x)` along `dim`: log-probabilities without the underflow of `softmax().log()`.
    pub fn log_softmax(&self, dim: isize) -> Result<Tensor> {
        self.softmax_along("log_softmax", dim, true)
    }

    fn softmax_along(&self, op: &'static str, dim: isize, log: bool) -> Result<Tensor> {
        let dtype = self.dtype();
        if !dtype.is_float() {
            return Err(Error::DTypeMismatch {
                op,
                expected: "a float dtype".into(),
                got: dtype,
            });
        }
        if self.rank() == 0 {
            resolve_dim(op, dim, 1)?;
            return self.reshape(&[1])?.softmax_along(op, 0, log)?.reshape(&[]);
        }
        let d = resolve_dim(op, dim, self.rank())?;
        let (view, back) = dim_last(self, d)?;
        let (lead, cols) = view.shape.split_at(view.shape.len() - 1);
        let y = RowKernel {
            views: vec![&view],
            bindings: vec![Binding::read("x", self)],
            defs: format!("const LOG: bool = {log};\n"),
            ..RowKernel::new(op, lead, cols[0], &[ROW_LOGSUMEXP_WGSL, SOFTMAX_WGSL])
        }
        .output(dtype, self.device())?
        .permute(&back)?;
        if !grad_enabled() || !self.requires_grad() {
            return Ok(y);
        }
        let saved = y.detach();
        let dim = d as isize;
        let node = Node::record(
            op,
            &[self],
            Box::new(move |g| {
                let gx = if log {
                    g.sub(&saved.exp()?.mul(&g.sum(&[dim], true)?)?)?
                } else {
                    saved.mul(&g.sub(&g.mul(&saved)?.sum(&[dim], true)?)?)?
                };
                Ok(vec![Some(gx)])
            }),
        );
        Ok(y.with_node(node))
    }
}
