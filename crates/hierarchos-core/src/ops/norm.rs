//! Row normalizations over the last dimension, RMSNorm (Llama) and LayerNorm, with dedicated forward and backward
//! kernels; also the launcher of the row kernels (`norm_loss_rows.wgsl`), which the losses share.

use std::fmt::Write;

use hierarchos_wgpu::{Access, COMMON_WGSL, DType, Dispatch, Gpu, GpuBuffer};

use crate::autograd::{Node, grad_enabled, no_grad};
use crate::error::{Error, Result};
use crate::shape::{Layout, MAX_DIMS, numel};
use crate::tensor::{Device, Tensor};

const ROWS_WGSL: &str = include_str!("../../../../wgsl/norm_loss_rows.wgsl");
/// Template of the row kernels whose output has their input's shape (see [`row_output`]).
pub(crate) const ROW_OUTPUT_WGSL: &str = include_str!("../../../../wgsl/row_output.wgsl");
const NORM_FORWARD_WGSL: &str = include_str!("../../../../wgsl/norm_forward.wgsl");
const NORM_BACKWARD_WGSL: &str = include_str!("../../../../wgsl/norm_backward.wgsl");
const NORM_WEIGHT_GRAD_WGSL: &str = include_str!("../../../../wgsl/norm_weight_grad.wgsl");

/// Rows per workgroup of the weight-gradient column reduction when there are enough columns to fill the GPU.
const WEIGHT_GRAD_ROWS: usize = 64;
/// Workgroups the weight-gradient reduction aims for, so that narrow weights still spread over many rows.
const WEIGHT_GRAD_WORKGROUPS: usize = 2048;

/// A buffer bound to a row kernel: WGSL sees `name` with `load_<name>` (read) or `store_<name>` (write).
pub(crate) struct Binding<'a> {
    /// The WGSL variable name.
    pub name: &'static str,
    /// The buffer.
    pub buffer: &'a GpuBuffer,
    /// Its element type as the kernel sees it.
    pub access: Access,
    /// Bound read-write rather than read-only.
    pub write: bool,
}

/// One launch of a kernel built on `norm_loss_rows.wgsl`: rows of the last dimension, read through strided views.
pub(crate) struct RowKernel<'a> {
    /// Op name; with `defs` it identifies the kernel, so each set of WGSL files needs its own.
    pub op: &'static str,
    /// The leading dimensions; their product is the number of rows.
    pub lead: &'a [usize],
    /// Row length.
    pub cols: usize,
    /// Kernel-specific parameters (`scalar_u32(i)`, `scalar_f32(i)`).
    pub scalars: [u32; 6],
    /// Views read by rows (`row_base(k, row)`): shape `lead` plus optionally `[cols]`.
    pub views: Vec<&'a Layout>,
    /// Buffers at bindings 1, 2, ...
    pub bindings: Vec<Binding<'a>>,
    /// WGSL constants and generated functions the kernel files need.
    pub defs: String,
    /// The kernel's WGSL, appended after `norm_loss_rows.wgsl`.
    pub files: &'a [&'static str],
    /// Workgroup grid ([`row_output`] sets it).
    pub workgroups: [u32; 3],
}

impl RowKernel<'_> {
    /// Records the launch.
    pub(crate) fn run(self, device: &Device) -> Result<()> {
        let nlead = self.lead.len();
        if nlead >= MAX_DIMS {
            return Err(Error::RankMismatch {
                op: self.op,
                expected: format!("<= {MAX_DIMS}"),
                got: self.lead.to_vec(),
            });
        }
        let mut params = vec![numel(self.lead) as u32, self.cols as u32, nlead as u32];
        params.extend((0..MAX_DIMS).map(|d| self.lead.get(d).copied().unwrap_or(1) as u32));
        params.extend(self.scalars);
        for v in &self.views {
            params.push(v.offset as u32);
            params.push(v.strides.get(nlead).copied().unwrap_or(0) as u32);
            params.extend((0..MAX_DIMS).map(|d| if d < nlead { v.strides[d] as u32 } else { 0 }));
        }
        let mut key = format!("rows:{}:{}", self.op, self.defs);
        for b in &self.bindings {
            let _ = write!(key, ":{}:{}:{}", b.name, b.access.dtype, b.access.packed);
        }
        let source = || {
            let mut s = String::new();
            if self
                .bindings
                .iter()
                .any(|b| b.access.dtype == DType::F16 && !b.access.packed)
            {
                s.push_str("enable f16;\n");
            }
            s.push_str("@group(0) @binding(0) var<storage, read> p: array<u32>;\n");
            for (k, b) in self.bindings.iter().enumerate() {
                let mode = if b.write { "read_write" } else { "read" };
                let _ = writeln!(
                    s,
                    "@group(0) @binding({}) var<storage, {mode}> {}: array<{}>;",
                    k + 1,
                    b.name,
                    b.access.storage_type()
                );
                s.push_str(&if b.write {
                    b.access.store_fn(b.name)
                } else {
                    b.access.load_fn(b.name)
                });
            }
            s.push_str(COMMON_WGSL);
            s.push_str(&self.defs);
            s.push_str(ROWS_WGSL);
            for f in self.files {
                s.push_str(f);
            }
            s
        };
        let buffers: Vec<&GpuBuffer> = self.bindings.iter().map(|b| b.buffer).collect();
        device.dispatch(Dispatch {
            op: self.op,
            key: &key,
            source: &source,
            buffers: &buffers,
            params: &params,
            workgroups: self.workgroups,
        })?;
        Ok(())
    }
}

/// Which normalization.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Norm {
    Rms,
    Layer,
}

impl Norm {
    fn name(self) -> &'static str {
        match self {
            Norm::Rms => "rms_norm",
            Norm::Layer => "layer_norm",
        }
    }

    fn backward_name(self) -> &'static str {
        match self {
            Norm::Rms => "rms_norm_backward",
            Norm::Layer => "layer_norm_backward",
        }
    }

    fn weight_grad_name(self) -> &'static str {
        match self {
            Norm::Rms => "rms_norm_weight_grad",
            Norm::Layer => "layer_norm_weight_grad",
        }
    }
}

/// Which direction a `norm.wgsl` kernel runs: the forward also saves (mean, rstd) per row.
#[derive(Clone, Copy)]
enum Pass {
    Forward,
    Backward,
}

/// The affine part of a normalization and its epsilon.
#[derive(Clone)]
struct Affine {
    weight: Option<Tensor>,
    bias: Option<Tensor>,
    eps: f64,
}

impl Affine {
    /// `weight(j)` and `bias(j)` in WGSL (1 and 0 when absent).
    fn defs(&self) -> String {
        format!(
            "fn weight(j: u32) -> f32 {{ return {}; }}\nfn bias(j: u32) -> f32 {{ return {}; }}\n",
            if self.weight.is_some() {
                "f32(load_w(scalar_u32(1u) + j * scalar_u32(2u)))"
            } else {
                "1.0"
            },
            if self.bias.is_some() {
                "f32(load_b(scalar_u32(3u) + j * scalar_u32(4u)))"
            } else {
                "0.0"
            }
        )
    }

    /// Scalars 0..5: eps, weight offset and stride, bias offset and stride.
    fn scalars(&self) -> [u32; 6] {
        let at = |t: &Option<Tensor>| {
            t.as_ref()
                .map_or((0, 0), |t| (t.layout().offset as u32, t.layout().strides[0] as u32))
        };
        let (wo, ws) = at(&self.weight);
        let (bo, bs) = at(&self.bias);
        [(self.eps as f32).to_bits(), wo, ws, bo, bs, 0]
    }

    fn bindings(&self, native_f16: bool) -> Vec<Binding<'_>> {
        [("w", &self.weight), ("b", &self.bias)]
            .into_iter()
            .filter_map(|(name, t)| {
                t.as_ref().map(|t| Binding {
                    name,
                    buffer: t.buffer(),
                    access: Access::new(t.dtype(), native_f16),
                    write: false,
                })
            })
            .collect()
    }
}

/// Runs `kernel` (whose files end with [`ROW_OUTPUT_WGSL`]) and returns its output, a new `lead + [cols]` tensor
/// in `dtype` bound first as `out`: written directly when no two rows share an output word, else in f32 and then
/// cast. Sets the grid (one workgroup per row) and `EPW`.
pub(crate) fn row_output(kernel: RowKernel<'_>, dtype: DType, device: &Device) -> Result<Tensor> {
    let native = device.caps().f16;
    let out_dtype = if Access::new(dtype, native).packed && kernel.cols % 2 == 1 {
        DType::F32
    } else {
        dtype
    };
    let out_access = Access::new(out_dtype, native);
    let mut shape = kernel.lead.to_vec();
    shape.push(kernel.cols);
    let n = numel(&shape);
    let out = Tensor::from_buffer(
        device.alloc(kernel.op, Tensor::bytes_for(n, out_dtype))?,
        &shape,
        out_dtype,
        None,
    );
    if n > 0 {
        let mut k = kernel;
        k.bindings.insert(
            0,
            Binding {
                name: "out",
                buffer: out.buffer(),
                access: out_access,
                write: true,
            },
        );
        let _ = writeln!(k.defs, "const EPW: u32 = {}u;", out_access.elems_per_word());
        k.workgroups = Gpu::grid(numel(k.lead) as u32);
        k.run(device)?;
    }
    if out_dtype == dtype {
        Ok(out)
    } else {
        no_grad(|| out.to_dtype(dtype))
    }
}

/// Runs the normalization kernel for `pass` over rows of `inputs` (views 0, 1, ...), giving a new tensor of
/// `inputs[0]`'s shape in `dtype`.
fn norm_rows(
    kind: Norm,
    pass: Pass,
    inputs: &[(&'static str, &Tensor)],
    affine: &Affine,
    stats: &Tensor,
    dtype: DType,
) -> Result<Tensor> {
    let (op, file, forward) = match pass {
        Pass::Forward => (kind.name(), NORM_FORWARD_WGSL, true),
        Pass::Backward => (kind.backward_name(), NORM_BACKWARD_WGSL, false),
    };
    let device = inputs[0].1.device();
    let native = device.caps().f16;
    let shape = inputs[0].1.shape();
    let mut bindings = vec![Binding {
        name: "stats",
        buffer: stats.buffer(),
        access: Access::new(DType::F32, native),
        write: forward,
    }];
    bindings.extend(inputs.iter().map(|(name, t)| Binding {
        name,
        buffer: t.buffer(),
        access: Access::new(t.dtype(), native),
        write: false,
    }));
    bindings.extend(affine.bindings(native));
    let kernel = RowKernel {
        op,
        lead: &shape[..shape.len() - 1],
        cols: shape[shape.len() - 1],
        scalars: affine.scalars(),
        views: inputs.iter().map(|(_, t)| t.layout()).collect(),
        bindings,
        defs: format!(
            "const LAYER: bool = {};\nconst COMBINE: u32 = {}u;\n{}",
            kind == Norm::Layer,
            if kind == Norm::Layer && forward { 1 } else { 0 },
            affine.defs()
        ),
        files: &[file, ROW_OUTPUT_WGSL],
        workgroups: [1, 1, 1],
    };
    row_output(kernel, dtype, device)
}

/// Σ over rows of g·x̂ and of g (f32, shape [cols] each): the weight and bias gradients before the dtype cast.
fn weight_grads(kind: Norm, g: &Tensor, x: &Tensor, stats: &Tensor) -> Result<(Tensor, Tensor)> {
    let op = kind.weight_grad_name();
    let device = x.device().clone();
    let shape = x.shape();
    let (lead, cols) = (&shape[..shape.len() - 1], shape[shape.len() - 1]);
    let rows = numel(lead);
    if rows == 0 || cols == 0 {
        let z = Tensor::zeros(&[cols], DType::F32, &device)?;
        return Ok((z.clone(), z));
    }
    let col_blocks = cols.div_ceil(256);
    if col_blocks > 65535 {
        return Err(Error::Invalid {
            op,
            message: format!("rows of {cols} elements are too long"),
        });
    }
    let chunks = rows
        .div_ceil(WEIGHT_GRAD_ROWS)
        .clamp(1, (WEIGHT_GRAD_WORKGROUPS / col_blocks).max(1));
    let per = rows.div_ceil(chunks);
    let chunks = rows.div_ceil(per);
    let native = device.caps().f16;
    let partial = Tensor::from_buffer(
        device.alloc(op, Tensor::bytes_for(chunks * 2 * cols, DType::F32))?,
        &[chunks, 2, cols],
        DType::F32,
        None,
    );
    let f32_access = Access::new(DType::F32, native);
    RowKernel {
        op,
        lead,
        cols,
        scalars: [0, 0, 0, 0, 0, per as u32],
        views: vec![g.layout(), x.layout()],
        bindings: vec![
            Binding {
                name: "partial",
                buffer: partial.buffer(),
                access: f32_access,
                write: true,
            },
            Binding {
                name: "g",
                buffer: g.buffer(),
                access: Access::new(g.dtype(), native),
                write: false,
            },
            Binding {
                name: "x",
                buffer: x.buffer(),
                access: Access::new(x.dtype(), native),
                write: false,
            },
            Binding {
                name: "stats",
                buffer: stats.buffer(),
                access: f32_access,
                write: false,
            },
        ],
        defs: "const COMBINE: u32 = 0u;\n".into(),
        files: &[NORM_WEIGHT_GRAD_WGSL],
        workgroups: [col_blocks as u32, chunks as u32, 1],
    }
    .run(&device)?;
    let sums = if chunks == 1 {
        partial.reshape(&[2, cols])?
    } else {
        partial.sum(&[0], false)?
    };
    Ok((
        sums.narrow(0, 0, 1)?.reshape(&[cols])?,
        sums.narrow(0, 1, 1)?.reshape(&[cols])?,
    ))
}

impl Tensor {
    /// Llama's RMSNorm over the last dimension, `x / sqrt(mean(x²) + eps) * weight`, as Hugging Face's
    /// `LlamaRMSNorm`: statistics in f32 whatever the dtype, weight applied after normalizing. The result is rounded
    /// once to `x`'s dtype (Hugging Face also rounds the normalized value before the weight multiply; the two differ
    /// by at most an ulp of the 16-bit type).
    pub fn rms_norm(&self, weight: Option<&Tensor>, eps: f64) -> Result<Tensor> {
        self.norm(Norm::Rms, weight, None, eps)
    }

    /// `torch.nn.functional.layer_norm` over the last dimension: `(x - mean) / sqrt(var + eps) * weight + bias`
    /// with the biased variance, computed in f32 with a Welford merge (stable when the mean dwarfs the spread).
    pub fn layer_norm(&self, weight: Option<&Tensor>, bias: Option<&Tensor>, eps: f64) -> Result<Tensor> {
        self.norm(Norm::Layer, weight, bias, eps)
    }

    fn norm(&self, kind: Norm, weight: Option<&Tensor>, bias: Option<&Tensor>, eps: f64) -> Result<Tensor> {
        let op = kind.name();
        if !self.dtype().is_float() {
            return Err(Error::DTypeMismatch {
                op,
                expected: "a float dtype".into(),
                got: self.dtype(),
            });
        }
        let Some(&cols) = self.shape().last() else {
            return Err(Error::RankMismatch {
                op,
                expected: ">= 1".into(),
                got: vec![],
            });
        };
        for p in [weight, bias].into_iter().flatten() {
            if p.shape() != [cols] {
                return Err(Error::ShapeMismatch {
                    op,
                    lhs: self.shape().to_vec(),
                    rhs: p.shape().to_vec(),
                });
            }
            if !p.dtype().is_float() {
                return Err(Error::DTypeMismatch {
                    op,
                    expected: "a float dtype".into(),
                    got: p.dtype(),
                });
            }
            if !std::sync::Arc::ptr_eq(p.device(), self.device()) {
                return Err(Error::Invalid {
                    op,
                    message: "inputs live on different devices".into(),
                });
            }
        }
        let rows = numel(&self.shape()[..self.rank() - 1]);
        let device = self.device();
        let stats = Tensor::from_buffer(
            device.alloc(op, Tensor::bytes_for(rows * 2, DType::F32))?,
            &[rows, 2],
            DType::F32,
            None,
        );
        let affine = Affine {
            weight: weight.map(Tensor::detach),
            bias: bias.map(Tensor::detach),
            eps,
        };
        let x = self.detach();
        let y = norm_rows(kind, Pass::Forward, &[("x", &x)], &affine, &stats, self.dtype())?;
        let needs = [
            self.requires_grad(),
            weight.is_some_and(Tensor::requires_grad),
            bias.is_some_and(Tensor::requires_grad),
        ];
        if !grad_enabled() || !needs.iter().any(|&n| n) {
            return Ok(y);
        }
        let mut inputs = vec![self];
        inputs.extend(weight);
        inputs.extend(bias);
        let node = Node::record(
            op,
            &inputs,
            Box::new(move |g| {
                let grad_affine = Affine {
                    bias: None,
                    ..affine.clone()
                };
                let mut grads = vec![if needs[0] {
                    Some(norm_rows(
                        kind,
                        Pass::Backward,
                        &[("g", g), ("x", &x)],
                        &grad_affine,
                        &stats,
                        x.dtype(),
                    )?)
                } else {
                    None
                }];
                if needs[1] || needs[2] {
                    let (dw, db) = weight_grads(kind, g, &x, &stats)?;
                    for (p, d, need) in [(&affine.weight, dw, needs[1]), (&affine.bias, db, needs[2])] {
                        if let Some(p) = p {
                            grads.push(if need { Some(d.to_dtype(p.dtype())?) } else { None });
                        }
                    }
                } else {
                    grads.extend(affine.weight.iter().chain(&affine.bias).map(|_| None));
                }
                Ok(grads)
            }),
        );
        Ok(y.with_node(node))
    }
}
