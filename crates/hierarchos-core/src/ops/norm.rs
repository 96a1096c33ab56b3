//! Row normalizations over the last dimension, RMSNorm (Llama) and LayerNorm, with dedicated forward and backward
//! kernels.

use hierarchos_wgpu::DType;

use crate::autograd::{Node, grad_enabled};
use crate::error::{Error, Result};
use crate::ops::rows::{Binding, Entry, RowKernel, SCALARS};
use crate::shape::numel;
use crate::tensor::Tensor;

const NORM_FORWARD_WGSL: &str = include_str!("../../../../wgsl/norm_forward.wgsl");
const NORM_BACKWARD_WGSL: &str = include_str!("../../../../wgsl/norm_backward.wgsl");
const NORM_WEIGHT_GRAD_WGSL: &str = include_str!("../../../../wgsl/norm_weight_grad.wgsl");

/// Rows per workgroup of the weight-gradient column reduction when there are enough columns to fill the GPU.
const WEIGHT_GRAD_ROWS: usize = 64;
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
    let shape = inputs[0].1.shape();
    let mut bindings = vec![if forward {
        Binding::write("stats", stats)
    } else {
        Binding::read("stats", stats)
    }];
    bindings.extend(inputs.iter().map(|&(name, t)| Binding::read(name, t)));
    bindings.extend(affine.bindings());
    RowKernel {
        scalars: affine.scalars(),
        views: inputs.iter().map(|(_, t)| t.layout()).collect(),
        bindings,
        defs: format!("const LAYER: bool = {};\n{}", kind == Norm::Layer, affine.defs()),
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
