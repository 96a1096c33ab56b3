//! Row normalizations over the last dimension, RMSNorm (Llama) and LayerNorm, with dedicated forward and backward
//! kernels.

use hierarchos_wgpu::{Access, DType};

use crate::autograd::{Node, grad_enabled, no_grad};
use crate::error::{Error, Result};
use crate::ops::rows::{Binding, Entry, RowKernel, SCALARS};
use crate::shape::numel;
use crate::tensor::Tensor;

const NORM_FORWARD_WGSL: &str = include_str!("../../../../wgsl/norm_forward.wgsl");
const NORM_BACKWARD_WGSL: &str = include_str!("../../../../wgsl/norm_backward.wgsl");
const NORM_WEIGHT_GRAD_WGSL: &str = include_str!("../../../../wgsl/norm_weight_grad.wgsl");

/// Rows per workgroup of the weight-gradient column reduction when there are enough columns to fill the GPU. On
/// the H200 (110M shape, 4096 rows of 768) 16 took the 25 reductions of a training step from 1.51 to 0.82 ms
/// against 64: more workgroups, shorter dependent loops.
const WEIGHT_GRAD_ROWS: usize = 16;
/// Workgroups the weight-gradient reduction aims for, so that narrow weights still spread over many rows.
const WEIGHT_GRAD_WORKGROUPS: usize = 2048;

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

    fn add_name(self) -> &'static str {
        match self {
            Norm::Rms => "add_rms_norm",
            Norm::Layer => "add_layer_norm",
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
enum Pass<'a> {
    Forward,
    /// The forward of `x + r` (inputs x, r), also writing that sum to a contiguous tensor.
    AddForward {
        sum: &'a Tensor,
    },
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
    fn scalars(&self) -> [u32; SCALARS] {
        let at = |t: &Option<Tensor>| {
            t.as_ref()
                .map_or((0, 0), |t| (t.layout().offset as u32, t.layout().strides[0] as u32))
        };
        let (wo, ws) = at(&self.weight);
        let (bo, bs) = at(&self.bias);
        [(self.eps as f32).to_bits(), wo, ws, bo, bs, 0]
    }

    fn bindings(&self) -> impl Iterator<Item = Binding<'_>> {
        [("w", &self.weight), ("b", &self.bias)]
            .into_iter()
            .filter_map(|(name, t)| t.as_ref().map(|t| Binding::read(name, t)))
    }

    /// Checks the arguments of normalizing `x` and returns the affine part, detached (the node saves it).
    fn checked(
        op: &'static str,
        x: &Tensor,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Affine> {
        if !x.dtype().is_float() {
            return Err(Error::DTypeMismatch {
                op,
                expected: "a float dtype".into(),
                got: x.dtype(),
            });
        }
        let Some(&cols) = x.shape().last() else {
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
                    lhs: x.shape().to_vec(),
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
            if !std::sync::Arc::ptr_eq(p.device(), x.device()) {
                return Err(Error::Invalid {
                    op,
                    message: "inputs live on different devices".into(),
                });
            }
        }
        Ok(Affine {
            weight: weight.map(Tensor::detach),
            bias: bias.map(Tensor::detach),
            eps,
        })
    }
}

/// `norm_input(base0, base1, j)`, the element the forward kernel normalizes, and `save_input(word, v0, v1)`: x
/// (view 0) and nothing to save, or with `add` the sum x + r (view 1) rounded to `dtype` exactly as `Tensor::add`
/// stores it (so the statistics see the same values as `sum.rms_norm(..)`), saved to `sum`.
fn input_defs(dtype: DType, add: bool) -> String {
    let x = "f32(load_x(b0 + j * col_stride(0u)))";
    if !add {
        return format!(
            "const RESIDUAL: bool = false;\n\
             fn norm_input(b0: u32, b1: u32, j: u32) -> f32 {{ return {x}; }}\n\
             fn save_input(w: u32, v0: f32, v1: f32) {{}}\n"
        );
    }
    let rounded = match dtype {
        DType::F16 => "unpack2x16float(f32_to_f16(s)).x",
        DType::BF16 => "bitcast<f32>(f32_to_bf16(s) << 16u)",
        _ => "s",
    };
    format!(
        "const RESIDUAL: bool = true;\n\
         fn norm_input(b0: u32, b1: u32, j: u32) -> f32 {{\n\
         \x20   let s = {x} + f32(load_r(b1 + j * col_stride(1u)));\n\
         \x20   return {rounded};\n}}\n\
         fn save_input(w: u32, v0: f32, v1: f32) {{ store_sum(w, v0, v1); }}\n"
    )
}

/// A new (mean, rstd) buffer for `rows` rows.
fn new_stats(op: &'static str, x: &Tensor, rows: usize) -> Result<Tensor> {
    Ok(Tensor::from_buffer(
        x.device().alloc(op, Tensor::bytes_for(rows * 2, DType::F32))?,
        &[rows, 2],
        DType::F32,
        None,
    ))
}

/// Runs the normalization kernel for `pass` over rows of `inputs` (views 0, 1, ...), giving a new tensor of
/// `inputs[0]`'s shape in `dtype`.
fn norm_rows(
    kind: Norm,
    pass: Pass<'_>,
    inputs: &[(&'static str, &Tensor)],
    affine: &Affine,
    stats: &Tensor,
    dtype: DType,
) -> Result<Tensor> {
    let (op, file) = match pass {
        Pass::Forward => (kind.name(), NORM_FORWARD_WGSL),
        Pass::AddForward { .. } => (kind.add_name(), NORM_FORWARD_WGSL),
        Pass::Backward => (kind.backward_name(), NORM_BACKWARD_WGSL),
    };
    let shape = inputs[0].1.shape();
    let mut defs = format!("const LAYER: bool = {};\n{}", kind == Norm::Layer, affine.defs());
    let mut bindings = Vec::new();
    match pass {
        Pass::Forward => {
            bindings.push(Binding::write("stats", stats));
            defs.push_str(&input_defs(dtype, false));
        }
        Pass::AddForward { sum } => {
            bindings.push(Binding::write("stats", stats));
            bindings.push(Binding::write("sum", sum));
            defs.push_str(&input_defs(dtype, true));
        }
        Pass::Backward => bindings.push(Binding::read("stats", stats)),
    }
    bindings.extend(inputs.iter().map(|&(name, t)| Binding::read(name, t)));
    bindings.extend(affine.bindings());
    RowKernel {
        scalars: affine.scalars(),
        views: inputs.iter().map(|(_, t)| t.layout()).collect(),
        bindings,
        defs,
        ..RowKernel::new(op, &shape[..shape.len() - 1], shape[shape.len() - 1], &[file])
    }
    .output(dtype, inputs[0].1.device())
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
    let partial = Tensor::from_buffer(
        device.alloc(op, Tensor::bytes_for(chunks * 2 * cols, DType::F32))?,
        &[chunks, 2, cols],
        DType::F32,
        None,
    );
    RowKernel {
        scalars: [0, 0, 0, 0, 0, per as u32],
        views: vec![g.layout(), x.layout()],
        bindings: vec![
            Binding::write("partial", &partial),
            Binding::read("g", g),
            Binding::read("x", x),
            Binding::read("stats", stats),
        ],
        entry: Entry::Grid([col_blocks as u32, chunks as u32, 1]),
        ..RowKernel::new(op, lead, cols, &[NORM_WEIGHT_GRAD_WGSL])
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

    /// The residual add and RMSNorm of a transformer layer in one kernel launch: `(sum, normed)` with
    /// `sum = self + residual` (same shape and dtype, no broadcasting) and `normed = sum.rms_norm(weight, eps)`,
    /// bit for bit what the two ops give separately. Decoding runs one token at a time, where launches rather than
    /// memory traffic set the speed. Both outputs are contiguous and differentiable.
    pub fn add_rms_norm(&self, residual: &Tensor, weight: Option<&Tensor>, eps: f64) -> Result<(Tensor, Tensor)> {
        self.add_norm(Norm::Rms, residual, weight, None, eps)
    }

    /// [`Tensor::add_rms_norm`] with a LayerNorm: `(self + residual, (self + residual).layer_norm(..))` in one launch.
    pub fn add_layer_norm(
        &self,
        residual: &Tensor,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<(Tensor, Tensor)> {
        self.add_norm(Norm::Layer, residual, weight, bias, eps)
    }

    fn norm(&self, kind: Norm, weight: Option<&Tensor>, bias: Option<&Tensor>, eps: f64) -> Result<Tensor> {
        let affine = Affine::checked(kind.name(), self, weight, bias, eps)?;
        let stats = new_stats(kind.name(), self, numel(&self.shape()[..self.rank() - 1]))?;
        let y = norm_rows(
            kind,
            Pass::Forward,
            &[("x", &self.detach())],
            &affine,
            &stats,
            self.dtype(),
        )?;
        self.record_norm(kind, y, stats, affine, [weight, bias])
    }

    /// `(self + residual, norm(self + residual))` from one launch; the norm's node takes the sum as its input, so
    /// its gradient goes through the same backward as [`Tensor::rms_norm`] and adds to the sum's own.
    fn add_norm(
        &self,
        kind: Norm,
        residual: &Tensor,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<(Tensor, Tensor)> {
        let op = kind.add_name();
        let affine = Affine::checked(op, self, weight, bias, eps)?;
        if residual.shape() != self.shape() {
            return Err(Error::ShapeMismatch {
                op,
                lhs: self.shape().to_vec(),
                rhs: residual.shape().to_vec(),
            });
        }
        if residual.dtype() != self.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                expected: self.dtype().to_string(),
                got: residual.dtype(),
            });
        }
        if !std::sync::Arc::ptr_eq(residual.device(), self.device()) {
            return Err(Error::Invalid {
                op,
                message: "inputs live on different devices".into(),
            });
        }
        let (dtype, device) = (self.dtype(), self.device());
        let shape = self.shape();
        let stats = new_stats(op, self, numel(&shape[..shape.len() - 1]))?;
        // The sum is stored like the normalized output (`RowKernel::output`): in f32 when packed 16-bit rows of odd
        // length would share words, holding values already rounded to `dtype`, so the cast back is exact.
        let sum_dtype = if Access::new(dtype, device.caps().f16).packed && shape[shape.len() - 1] % 2 == 1 {
            DType::F32
        } else {
            dtype
        };
        let sum = Tensor::from_buffer(
            device.alloc(op, Tensor::bytes_for(self.numel(), sum_dtype))?,
            shape,
            sum_dtype,
            None,
        );
        let (x, r) = (self.detach(), residual.detach());
        let y = norm_rows(
            kind,
            Pass::AddForward { sum: &sum },
            &[("x", &x), ("r", &r)],
            &affine,
            &stats,
            dtype,
        )?;
        let sum = no_grad(|| sum.to_dtype(dtype))?;
        let needs = [self.requires_grad(), residual.requires_grad()];
        let sum = sum.with_node(Node::record(
            op,
            &[self, residual],
            Box::new(move |g| Ok(needs.iter().map(|&n| n.then(|| g.clone())).collect())),
        ));
        let normed = sum.record_norm(kind, y, stats, affine, [weight, bias])?;
        Ok((sum, normed))
    }

    /// Attaches to `y`, the normalization of `self` with `stats` saved by the forward, the node of its backward.
    fn record_norm(
        &self,
        kind: Norm,
        y: Tensor,
        stats: Tensor,
        affine: Affine,
        [weight, bias]: [Option<&Tensor>; 2],
    ) -> Result<Tensor> {
        let needs = [
            self.requires_grad(),
            weight.is_some_and(Tensor::requires_grad),
            bias.is_some_and(Tensor::requires_grad),
        ];
        if !grad_enabled() || !needs.iter().any(|&n| n) {
            return Ok(y);
        }
        let x = self.detach();
        let mut inputs = vec![self];
        inputs.extend(weight);
        inputs.extend(bias);
        let node = Node::record(
            kind.name(),
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
