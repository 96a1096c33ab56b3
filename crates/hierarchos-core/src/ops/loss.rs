//! Losses: cross-entropy as one fused log-softmax + NLL kernel per row, and its backward in one pass over the logits.

use hierarchos_wgpu::DType;

use crate::autograd::{Node, grad_enabled, no_grad};
use crate::error::{Error, Result};
use crate::ops::map::Map;
use crate::ops::rows::{Binding, ROW_LOGSUMEXP_WGSL, RowKernel};
use crate::shape::{Layout, numel};
use crate::tensor::Tensor;

const CROSS_ENTROPY_WGSL: &str = include_str!("../../../../wgsl/cross_entropy.wgsl");
const CROSS_ENTROPY_FORWARD_WGSL: &str = include_str!("../../../../wgsl/cross_entropy_forward.wgsl");
const CROSS_ENTROPY_BACKWARD_WGSL: &str = include_str!("../../../../wgsl/cross_entropy_backward.wgsl");

/// A scalar view of element `k` of `t`, for the elementwise kernel.
fn element(t: &Tensor, k: usize) -> Layout {
    Layout {
        shape: vec![],
        strides: vec![],
        offset: t.layout().offset + k,
    }
}

/// The target that [`Tensor::cross_entropy`] skips: PyTorch's default `ignore_index`, and what Hugging Face puts
/// at padded labels.
pub const IGNORE_INDEX: i32 = -100;

impl Tensor {
    /// Mean cross-entropy of logits `self` (`[..., C]`) against class indices `targets` (`[...]`, i32 or u32),
    /// skipping targets equal to [`IGNORE_INDEX`].
    pub fn cross_entropy(&self, targets: &Tensor) -> Result<Tensor> {
        self.cross_entropy_with(targets, Some(IGNORE_INDEX.into()))
    }

    /// Mean cross-entropy over the targets that are not `ignore_index`, as `torch.nn.functional.cross_entropy` with
    /// mean reduction: NaN when every target is ignored. Logits of any float dtype (math in f32); the loss has
    /// their dtype. A target outside `0..C` (other than `ignore_index`) makes the loss and its gradient NaN rather
    /// than an error, because checking would make the host wait for the GPU; nothing is read out of bounds.
    /// For u32 targets a negative `ignore_index` matches nothing.
    pub fn cross_entropy_with(&self, targets: &Tensor, ignore_index: Option<i64>) -> Result<Tensor> {
        let op = "cross_entropy";
        if !self.dtype().is_float() {
            return Err(Error::DTypeMismatch {
                op,
                expected: "float logits".into(),
                got: self.dtype(),
            });
        }
        let ignore = match targets.dtype() {
            DType::I32 => ignore_index.and_then(|i| i32::try_from(i).ok()).map(|i| i as u32),
            DType::U32 => ignore_index.and_then(|i| u32::try_from(i).ok()),
            got => {
                return Err(Error::DTypeMismatch {
                    op,
                    expected: "i32 or u32 targets".into(),
                    got,
                });
            }
        };
        let Some(&cols) = self.shape().last() else {
            return Err(Error::RankMismatch {
                op,
                expected: ">= 1".into(),
                got: vec![],
            });
        };
        let lead = &self.shape()[..self.rank() - 1];
        if targets.shape() != lead {
            return Err(Error::ShapeMismatch {
                op,
                lhs: self.shape().to_vec(),
                rhs: targets.shape().to_vec(),
            });
        }
        if !std::sync::Arc::ptr_eq(targets.device(), self.device()) {
            return Err(Error::Invalid {
                op,
                message: "inputs live on different devices".into(),
            });
        }
        let rows = numel(lead);
        if cols == 0 && rows > 0 {
            return Err(Error::Invalid {
                op,
                message: format!("logits {:?} have no classes", self.shape()),
            });
        }
        let (has_ignore, ignore_bits) = (ignore.is_some() as u32, ignore.unwrap_or(0));
        let device = self.device().clone();
        let per_row_out = Tensor::from_buffer(
            device.alloc(op, Tensor::bytes_for(rows * 5, DType::F32))?,
            &[rows, 5],
            DType::F32,
            None,
        );
        RowKernel {
            scalars: [has_ignore, ignore_bits, 0, 0, 0, 0],
            views: vec![self.layout(), targets.layout()],
            bindings: vec![
                Binding::write("out", &per_row_out),
                Binding::read("logits", self),
                Binding::read("targets", targets),
            ],
            ..RowKernel::new(
                op,
                lead,
                cols,
                &[CROSS_ENTROPY_WGSL, ROW_LOGSUMEXP_WGSL, CROSS_ENTROPY_FORWARD_WGSL],
            )
        }
        .run(&device)?;
        let sums = no_grad(|| per_row_out.narrow(1, 0, 2)?.sum(&[0], false))?;
        let loss = Map {
            op,
            inputs: vec![(&sums, element(&sums, 0)), (&sums, element(&sums, 1))],
            shape: vec![],
            dtype: self.dtype(),
            body: "return x0 / x1;".into(),
            preload: true,
            extras: vec![],
            quad_body: None,
        }
        .run()?;
        if !grad_enabled() || !self.requires_grad() {
            return Ok(loss);
        }
        let (logits, targets) = (self.detach(), targets.detach());
        let node = Node::record(
            op,
            &[self],
            Box::new(move |g| {
                let shape = logits.shape();
                let grad = RowKernel {
                    scalars: [
                        has_ignore,
                        ignore_bits,
                        g.layout().offset as u32,
                        sums.layout().offset as u32,
                        0,
                        0,
                    ],
                    views: vec![logits.layout(), targets.layout()],
                    bindings: vec![
                        Binding::read("rowstats", &per_row_out),
                        Binding::read("sums", &sums),
                        Binding::read("g", g),
                        Binding::read("logits", &logits),
                        Binding::read("targets", &targets),
                    ],
                    ..RowKernel::new(
                        "cross_entropy_backward",
                        &shape[..shape.len() - 1],
                        cols,
                        &[CROSS_ENTROPY_WGSL, CROSS_ENTROPY_BACKWARD_WGSL],
                    )
                }
                .output(logits.dtype(), g.device())?;
                Ok(vec![Some(grad)])
            }),
        );
        Ok(loss.with_node(node))
    }
}
