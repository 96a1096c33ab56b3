//! The fused AdamW update: each parameter tensor's gradient is read once and the parameter and both moment
//! estimates are written in place (a composed update would be a dozen launches and as many temporaries), and one
//! launch updates as many tensors as the device's bindings allow, so that a model's hundred parameters take a few
//! launches rather than a hundred.

use std::fmt::Write;
use std::sync::Arc;

use hierarchos_wgpu::{DType, Dispatch, Gpu, GpuBuffer, Language};

use crate::error::{Error, Result};
use crate::tensor::Tensor;

const ADAMW_WGSL: &str = include_str!("../../../../wgsl/adamw.wgsl");
/// `grad_factor(t)`, the factor tensor t's gradient is multiplied by, and whether the launch updates at all: the
/// host's `grad_scale` alone, or times clipping's factor from a [`ClipGate`] (wgsl/adamw_gate.wgsl).
const UNGATED: &str =
    "fn grad_factor(t: u32) -> f32 {\n    return scalar(t, 12u);\n}\nfn live() -> bool {\n    return true;\n}\n";
const GATED: &str = include_str!("../../../../wgsl/adamw_gate.wgsl");
pub(crate) const FINITE: &str = include_str!("../../../../wgsl/finite.wgsl");
const OP: &str = "adamw";

/// Most tensors one launch updates (four storage buffers each), so that the kernels stay few and small.
const MAX_TENSORS: usize = 16;

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

/// One parameter's AdamW step: the parameter, `m` and `v` (its moment estimates) are dense f32 tensors of one
/// shape, updated in place; `grad` is an f32 tensor of that shape in any layout, in none of their buffers.
#[derive(Clone, Copy, Debug)]
pub struct AdamWUpdate<'a> {
    /// The parameter.
    pub param: &'a Tensor,
    /// Its gradient.
    pub grad: &'a Tensor,
    /// First moment.
    pub m: &'a Tensor,
    /// Second moment.
    pub v: &'a Tensor,
    /// The step's scalars.
    pub step: AdamWStep,
}

impl AdamWUpdate<'_> {
    /// The error [`adamw_update_many`] would give for this update, found before anything runs (so that a caller
    /// can name the parameter).
    pub fn check(&self) -> Result<()> {
        let p = self.param;
        for t in [p, self.grad, self.m, self.v] {
            if t.dtype() != DType::F32 {
                return Err(Error::DTypeMismatch {
                    op: OP,
                    expected: "f32 parameters, gradients and moments".into(),
                    got: t.dtype(),
                });
            }
            if t.shape() != p.shape() {
                return Err(Error::ShapeMismatch {
                    op: OP,
                    lhs: p.shape().to_vec(),
                    rhs: t.shape().to_vec(),
                });
            }
            if !Arc::ptr_eq(t.device(), p.device()) {
                return Err(Error::Invalid {
                    op: OP,
                    message: "the parameter, its gradient and moments live on different devices".into(),
                });
            }
        }
        if [p, self.m, self.v].iter().any(|t| !t.is_contiguous()) {
            return Err(Error::Invalid {
                op: OP,
                message: "the parameter and its moments must be dense".into(),
            });
        }
        let written = [p.buffer(), self.m.buffer(), self.v.buffer()];
        if (0..3).any(|a| (a + 1..3).any(|b| std::ptr::eq(written[a], written[b]))) {
            return Err(Error::Invalid {
                op: OP,
                message: "the parameter and its two moments must be separate buffers".into(),
            });
        }
        if written.iter().any(|w| std::ptr::eq(*w, self.grad.buffer())) {
            return Err(Error::Invalid {
                op: OP,
                message: "the gradient shares a buffer with the parameter or a moment".into(),
            });
        }
        let s = &self.step;
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
        Ok(())
    }
}

impl Tensor {
    /// One AdamW step in place on this parameter (see [`AdamWUpdate`]). Not recorded by autograd.
    pub fn adamw_update(&self, grad: &Tensor, m: &Tensor, v: &Tensor, s: &AdamWStep) -> Result<()> {
        adamw_update_many(
            &[AdamWUpdate {
                param: self,
                grad,
                m,
                v,
                step: *s,
            }],
            None,
        )
    }
}

/// Gradient clipping read on the device: the step's `[loss, squared gradient norm]` (f32, as the step computed
/// them), from which every thread of the update takes `clip_grad_norm_`'s factor, `max_norm / (norm + 1e-6)` at
/// most 1 (no clipping for a `max_norm` of 0), in f32 as PyTorch computes it. The norm is of the gradients as
/// they are; each update's `grad_scale` unscales both the norm and the gradient (a loss scale's inverse, or 1),
/// and so does a third statistic, the inverse of the loss scale the step ran at, where the scale lives on the
/// device ([`loss_scale_update`](crate::ops::loss_scale::loss_scale_update)).
/// Where the loss or the norm is not finite the update leaves everything as it was. So the host need not read
/// the norm back before the update, and the GPU need not wait for the host between training steps.
#[derive(Clone, Copy, Debug)]
pub struct ClipGate<'a> {
    /// `[loss, squared gradient norm]` or `[loss, squared gradient norm, inverse loss scale]`.
    pub stats: &'a Tensor,
    /// The largest global norm let through (0: no clipping).
    pub max_norm: f64,
}

impl ClipGate<'_> {
    /// Whether the statistics carry an inverse loss scale.
    fn scaled(&self) -> bool {
        self.stats.shape() == [3]
    }

    fn check(&self) -> Result<()> {
        let shape_ok = matches!(self.stats.shape(), [2] | [3]);
        if self.stats.dtype() != DType::F32 || !shape_ok || self.stats.layout().strides != [1] {
            return Err(Error::Invalid {
                op: OP,
                message: format!(
                    "the clip gate's statistics must be a dense f32 [loss, squared norm] or [loss, squared norm, \
                     inverse loss scale], got {} {:?}",
                    self.stats.dtype(),
                    self.stats.shape()
                ),
            });
        }
        if !(self.max_norm.is_finite() && self.max_norm >= 0.0) {
            return Err(Error::Invalid {
                op: OP,
                message: format!(
                    "the largest gradient norm {} is not finite and non-negative",
                    self.max_norm
                ),
            });
        }
        Ok(())
    }
}

/// A checked update with a dense gradient, ready to launch.
struct Ready<'a> {
    update: AdamWUpdate<'a>,
    grad: Tensor,
    words: [u32; 13],
}

impl Ready<'_> {
    /// Elements per thread: four where the length and every offset allow vec4 loads.
    fn width(&self) -> usize {
        if self.words[..5].iter().all(|w| w.is_multiple_of(4)) {
            4
        } else {
            1
        }
    }

    /// Whether this update binds a buffer that `other` binds too.
    fn shares_buffer(&self, other: &Ready<'_>) -> bool {
        self.buffers()
            .iter()
            .any(|a| other.buffers().iter().any(|b| std::ptr::eq(*a, *b)))
    }

    /// The buffers bound for this update, in binding order.
    fn buffers(&self) -> [&GpuBuffer; 4] {
        [
            self.update.param.buffer(),
            self.grad.buffer(),
            self.update.m.buffer(),
            self.update.v.buffer(),
        ]
    }
}

/// AdamW steps of many parameters, as few launches as the device's storage-buffer bindings allow, clipped on the
/// device by `gate` when given. Every update is checked before any runs, so that a bad one leaves all parameters
/// as they were. Not recorded by autograd.
pub fn adamw_update_many(updates: &[AdamWUpdate<'_>], gate: Option<&ClipGate<'_>>) -> Result<()> {
    for u in updates {
        u.check()?;
        if let Some(g) = gate
            && !Arc::ptr_eq(g.stats.device(), u.param.device())
        {
            return Err(Error::Invalid {
                op: OP,
                message: "the clip gate and the parameters live on different devices".into(),
            });
        }
    }
    if let Some(g) = gate {
        g.check()?;
        let apart = |u: &AdamWUpdate<'_>| {
            [u.param, u.m, u.v]
                .iter()
                .all(|t| !std::ptr::eq(t.buffer(), g.stats.buffer()))
        };
        if !updates.iter().all(apart) {
            return Err(Error::Invalid {
                op: OP,
                message: "the clip gate's statistics share a buffer with a parameter or a moment".into(),
            });
        }
    }
    let ready = crate::autograd::no_grad(|| {
        updates
            .iter()
            .filter(|u| u.param.numel() > 0)
            .map(|u| {
                let grad = u.grad.contiguous()?;
                let s = &u.step;
                let t = s.step.min(i32::MAX as u64) as i32;
                let bits = |x: f64| (x as f32).to_bits();
                let words = [
                    u.param.numel() as u32,
                    u.param.layout().offset as u32,
                    grad.layout().offset as u32,
                    u.m.layout().offset as u32,
                    u.v.layout().offset as u32,
                    bits(1.0 - s.lr * s.weight_decay),
                    bits(1.0 - s.beta1),
                    bits(s.beta2),
                    bits(1.0 - s.beta2),
                    bits(s.lr / (1.0 - s.beta1.powi(t))),
                    bits((1.0 - s.beta2.powi(t)).sqrt()),
                    bits(s.eps),
                    bits(s.grad_scale),
                ];
                Ok(Ready {
                    update: *u,
                    grad,
                    words,
                })
            })
            .collect::<Result<Vec<_>>>()
    })?;
    let Some(first) = ready.first() else {
        return Ok(());
    };
    let device = first.update.param.device();
    // The parameters and the gate take a binding each.
    let shared = 1 + usize::from(gate.is_some());
    let per_launch = ((device.limits().max_storage_buffers_per_shader_stage as usize).saturating_sub(shared) / 4)
        .clamp(1, MAX_TENSORS);
    for width in [4, 1] {
        // WebGPU forbids one launch to bind a buffer twice where one binding is written (even at disjoint
        // elements), so each update goes to the first launch that has room and none of its buffers: parameters
        // that are views of one buffer (stacked experts) spread over launches.
        let mut launches: Vec<Vec<&Ready<'_>>> = Vec::new();
        for r in ready.iter().filter(|r| r.width() == width) {
            match launches
                .iter_mut()
                .find(|l| l.len() < per_launch && !l.iter().any(|o| o.shares_buffer(r)))
            {
                Some(l) => l.push(r),
                None => launches.push(vec![r]),
            }
        }
        for l in &launches {
            run(device, l, width, gate)?;
        }
    }
    Ok(())
}

/// One launch over `launch`'s tensors, `width` elements per thread.
fn run(device: &crate::tensor::Device, launch: &[&Ready<'_>], width: usize, gate: Option<&ClipGate<'_>>) -> Result<()> {
    let max_norm = gate.map_or(0.0, |g| g.max_norm) as f32;
    let at = gate.map_or(0, |g| g.stats.layout().offset) as u32;
    let mut params = vec![launch.len() as u32, max_norm.to_bits(), at];
    let mut workgroups = 0u32;
    for r in launch {
        params.extend(r.words);
        params.push(workgroups);
        workgroups += (r.words[0] / width as u32).div_ceil(256);
    }
    let mut buffers: Vec<&GpuBuffer> = gate.iter().map(|g| g.stats.buffer()).collect();
    buffers.extend(launch.iter().flat_map(|r| r.buffers()));
    let count = launch.len();
    // Ungated, gated, or gated with a loss scale.
    let gated = gate.map_or(0, |g| 1 + usize::from(g.scaled()));
    device.dispatch(Dispatch {
        op: OP,
        runtime_checks: false,
        language: Language::Wgsl,
        key: &format!("adamw:{width}:{count}:{gated}"),
        source: &|| source(width, count, gated),
        buffers: &buffers,
        params: &params,
        workgroups: Gpu::grid(workgroups),
    })?;
    Ok(())
}

/// The kernel for `count` tensors, `width` elements per thread: bindings, `update` and the gradient factor
/// (`gated`: 0 without a gate, 1 with one, 2 with one carrying a loss scale).
fn source(width: usize, count: usize, gated: usize) -> String {
    let v = if width == 4 { "vec4<f32>" } else { "f32" };
    let mut s = format!(
        "alias V = {v};\nconst W: u32 = {width}u;\n\
         @group(0) @binding(0) var<storage, read> p: array<u32>;\n"
    );
    let first = 1 + usize::from(gated > 0);
    if gated > 0 {
        let _ = writeln!(s, "const SCALED: bool = {};", gated == 2);
        s.push_str(FINITE);
        s.push_str(GATED);
    } else {
        s.push_str(UNGATED);
    }
    for t in 0..count {
        for (k, (name, mode)) in [
            ("param", "read_write"),
            ("grad", "read"),
            ("m", "read_write"),
            ("v", "read_write"),
        ]
        .into_iter()
        .enumerate()
        {
            let _ = writeln!(
                s,
                "@group(0) @binding({}) var<storage, {mode}> {name}{t}: array<V>;",
                first + 4 * t + k
            );
        }
    }
    s.push_str("fn update(t: u32, i: u32) {\n");
    for t in 0..count {
        let _ = write!(
            s,
            "    if (t == {t}u) {{\n\
             \x20       let xi = word({t}u, 1u) / W + i;\n\
             \x20       let mi = word({t}u, 3u) / W + i;\n\
             \x20       let vi = word({t}u, 4u) / W + i;\n\
             \x20       let r = adamw({t}u, param{t}[xi], grad{t}[word({t}u, 2u) / W + i], m{t}[mi], v{t}[vi]);\n\
             \x20       param{t}[xi] = r.x;\n\
             \x20       m{t}[mi] = r.m;\n\
             \x20       v{t}[vi] = r.v;\n\
             \x20   }}\n"
        );
    }
    s.push_str("}\n");
    s + ADAMW_WGSL
}
