//! The fused AdamW update: one launch per parameter tensor reads the gradient once and writes the parameter and
//! both moment estimates in place (a composed update would be a dozen launches and as many temporaries).

use std::sync::Arc;

use hierarchos_wgpu::{DType, Dispatch, Gpu, Language};

use crate::error::{Error, Result};
use crate::tensor::Tensor;

const ADAMW_WGSL: &str = include_str!("../../../../wgsl/adamw.wgsl");

/// The scalars of one AdamW step, as `torch.optim.AdamW` takes them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWStep {
    /// Learning rate of this step (after any schedule).
    pub lr: f64,
    /// Decay rate of the first moment.
    pub beta1: f64,
    /// Decay rate of the second moment.
    pub beta2: f64,
    /// Added to the denominator.
    pub eps: f64,
    /// Decoupled weight decay (the parameter shrinks by `lr * weight_decay` of itself).
    pub weight_decay: f64,
    /// How many steps this parameter has taken, this one included (1 on the first): the bias corrections.
    pub step: u64,
    /// Factor applied to the gradient first (gradient clipping's; 1 leaves it as is).
    pub grad_scale: f64,
}

impl Tensor {
    /// One AdamW step in place: `self` (the parameter), `m` and `v` (its moment estimates) are dense f32 tensors
    /// of one shape, `grad` an f32 tensor of that shape in any layout. Not recorded by autograd.
    pub fn adamw_update(&self, grad: &Tensor, m: &Tensor, v: &Tensor, s: &AdamWStep) -> Result<()> {
        const OP: &str = "adamw";
        for t in [self, grad, m, v] {
            if t.dtype() != DType::F32 {
                return Err(Error::DTypeMismatch {
                    op: OP,
                    expected: "f32 parameters, gradients and moments".into(),
                    got: t.dtype(),
                });
            }
            if t.shape() != self.shape() {
                return Err(Error::ShapeMismatch {
                    op: OP,
                    lhs: self.shape().to_vec(),
                    rhs: t.shape().to_vec(),
                });
            }
            if !Arc::ptr_eq(t.device(), self.device()) {
                return Err(Error::Invalid {
                    op: OP,
                    message: "the parameter, its gradient and moments live on different devices".into(),
                });
            }
        }
        if [self, m, v].iter().any(|t| !t.is_contiguous()) {
            return Err(Error::Invalid {
                op: OP,
                message: "the parameter and its moments must be dense".into(),
            });
        }
        let written = [self.buffer(), m.buffer(), v.buffer()];
        if (0..3).any(|a| (a + 1..3).any(|b| std::ptr::eq(written[a], written[b]))) {
            return Err(Error::Invalid {
                op: OP,
                message: "the parameter and its two moments must be separate buffers".into(),
            });
        }
        let valid = s.lr.is_finite()
            && s.lr >= 0.0
            && (0.0..1.0).contains(&s.beta1)
            && (0.0..1.0).contains(&s.beta2)
            && s.eps.is_finite()
            && s.eps > 0.0
            && s.weight_decay.is_finite()
            && s.weight_decay >= 0.0
            && s.grad_scale.is_finite()
            && s.step >= 1;
        if !valid {
            return Err(Error::Invalid {
                op: OP,
                message: format!("invalid AdamW settings {s:?}"),
            });
        }
        let n = self.numel();
        if n == 0 {
            return Ok(());
        }
        let grad = crate::autograd::no_grad(|| grad.contiguous())?;
        let t = s.step.min(i32::MAX as u64) as i32;
        let bits = |x: f64| (x as f32).to_bits();
        let params = [
            n as u32,
            self.layout().offset as u32,
            grad.layout().offset as u32,
            m.layout().offset as u32,
            v.layout().offset as u32,
            bits(1.0 - s.lr * s.weight_decay),
            bits(1.0 - s.beta1),
            bits(s.beta2),
            bits(1.0 - s.beta2),
            bits(s.lr / (1.0 - s.beta1.powi(t))),
            bits((1.0 - s.beta2.powi(t)).sqrt()),
            bits(s.eps),
            bits(s.grad_scale),
        ];
        // Four elements per thread where the length and the offsets allow vec4 loads.
        let width = if n.is_multiple_of(4) && params[1..5].iter().all(|o| o.is_multiple_of(4)) {
            4
        } else {
            1
        };
        self.device().dispatch(Dispatch {
            op: OP,
            runtime_checks: false,
            language: Language::Wgsl,
            key: &format!("adamw:{width}"),
            source: &|| {
                let v = if width == 4 { "vec4<f32>" } else { "f32" };
                format!("alias V = {v};\nconst W: u32 = {width}u;\n{ADAMW_WGSL}")
            },
            buffers: &[self.buffer(), grad.buffer(), m.buffer(), v.buffer()],
            params: &params,
            workgroups: Gpu::grid(((n / width) as u32).div_ceil(256)),
        })?;
        Ok(())
    }
}
