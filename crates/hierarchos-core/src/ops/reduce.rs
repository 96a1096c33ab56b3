//! Reductions over any set of dimensions: sum, mean, max, min, argmax, argmin, logsumexp.

use std::fmt::Write;

use hierarchos_wgpu::{Access, DType, Dispatch, Gpu, Language};

use crate::autograd::{Node, grad_enabled};
use crate::error::{Error, Result};
use crate::ops::map::Map;
use crate::shape::{MAX_DIMS, resolve_dim};
use crate::tensor::Tensor;

const REDUCE_WGSL: &str = include_str!("../../../../wgsl/reduce.wgsl");
const REDUCE_COLUMNS_WGSL: &str = include_str!("../../../../wgsl/reduce_columns.wgsl");

/// A reduction function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Sum of the squares (the squared L2 norm), without materializing the squares. (Gradient clipping's norm
    /// over many tensors at once is [`Tensor::sum_squares_of`].)
    SumSquares,
    /// Arithmetic mean.
    Mean,
    /// Largest value (NaN wins).
    Max,
    /// Smallest value (NaN wins).
    Min,
    /// Index of the first largest value.
    ArgMax,
    /// Index of the first smallest value.
    ArgMin,
    /// log Σ exp, computed stably.
    LogSumExp,
}

impl ReduceOp {
    fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::SumSquares => "sum_squares",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::ArgMax => "argmax",
            ReduceOp::ArgMin => "argmin",
            ReduceOp::LogSumExp => "logsumexp",
        }
    }

    /// WGSL defining `Acc`, `identity`, `combine`, `element`, `first_pass`, `finish` and the output type.
    fn wgsl(self) -> (String, &'static str) {
        let acc = "struct Acc { v: f32, i: u32 }\nfn pick(c: bool, a: Acc, b: Acc) -> Acc { if (c) { return a; } return b; }\n";
        let (identity, combine, element, finish, out_ty) = match self {
            ReduceOp::Sum | ReduceOp::Mean => (
                "Acc(0.0, 0u)",
                "Acc(a.v + b.v, 0u)",
                "Acc(x, 0u)",
                if self == ReduceOp::Sum {
                    "a.v"
                } else {
                    "a.v / f32(p[1])"
                },
                "f32",
            ),
            ReduceOp::SumSquares => ("Acc(0.0, 0u)", "Acc(a.v + b.v, 0u)", "Acc(x * x, 0u)", "a.v", "f32"),
            ReduceOp::Max | ReduceOp::ArgMax => (
                "Acc(neg_inf(), 0xffffffffu)",
                "pick(better(a, b, true), a, b)",
                "Acc(x, j)",
                if self == ReduceOp::Max { "a.v" } else { "a.i" },
                if self == ReduceOp::Max { "f32" } else { "u32" },
            ),
            ReduceOp::Min | ReduceOp::ArgMin => (
                "Acc(pos_inf(), 0xffffffffu)",
                "pick(better(a, b, false), a, b)",
                "Acc(x, j)",
                if self == ReduceOp::Min { "a.v" } else { "a.i" },
                if self == ReduceOp::Min { "f32" } else { "u32" },
            ),
            ReduceOp::LogSumExp => (
                "pick(phase == 1u, Acc(0.0, 0u), Acc(neg_inf(), 0u))",
                "pick(phase == 1u, Acc(a.v + b.v, 0u), Acc(max_nan(a.v, b.v), 0u))",
                "pick(phase == 1u, Acc(exp_acc(x - pv), 0u), Acc(x, 0u))",
                "pv + log(a.v)",
                "f32",
            ),
        };
        let mut s = String::from(acc);
        let _ = write!(
            s,
            "fn identity(phase: u32) -> Acc {{ return {identity}; }}\n\
             fn combine(a: Acc, b: Acc, phase: u32) -> Acc {{ return {combine}; }}\n\
             fn element(x: f32, j: u32, pv: f32, phase: u32) -> Acc {{ return {element}; }}\n\
             fn finish(a: Acc, pv: f32) -> {out_ty} {{ return {finish}; }}\n"
        );
        // `better(a, b, want_max)`: a beats b; NaN beats numbers; ties go to the lower index.
        s.push_str(
            "fn better(a: Acc, b: Acc, want_max: bool) -> bool {\n\
             \x20   if (a.i == 0xffffffffu) { return false; }\n\
             \x20   if (b.i == 0xffffffffu) { return true; }\n\
             \x20   if (is_nan(a.v) || is_nan(b.v)) { return is_nan(a.v) && (!is_nan(b.v) || a.i < b.i); }\n\
             \x20   if (a.v == b.v) { return a.i < b.i; }\n\
             \x20   return select((a.v < b.v), (a.v > b.v), want_max);\n}\n",
        );
        // LogSumExp first finds the row maximum, then sums exp(x - max). An infinite maximum shifts by 0 instead,
        // as torch's does: exp(inf - inf) would make NaN of a row whose sum is +inf, or of an all -inf row's -inf.
        if self == ReduceOp::LogSumExp {
            s.push_str(
                "fn first_pass(a: Acc) -> f32 { if (abs(a.v) == pos_inf()) { return 0.0; } return a.v; }\n\
                 const TWO_PASS: bool = true;\n",
            );
        } else {
            s.push_str("fn first_pass(a: Acc) -> f32 { return a.v; }\nconst TWO_PASS: bool = false;\n");
        }
        (s, out_ty)
    }
}

impl Tensor {
    /// Reduces over `dims` (empty: over all dimensions); `keepdim` keeps them as size 1.
    pub fn reduce(&self, op: ReduceOp, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        let rank = self.rank();
        let mut reduced = vec![false; rank];
        if dims.is_empty() {
            reduced.iter_mut().for_each(|r| *r = true);
        }
        for &d in dims {
            let d = resolve_dim(op.name(), d, rank)?;
            if std::mem::replace(&mut reduced[d], true) {
                return Err(Error::Invalid {
                    op: op.name(),
                    message: format!("dimension {d} appears twice in {dims:?}"),
                });
            }
        }
        let kept: Vec<usize> = (0..rank).filter(|&d| !reduced[d]).collect();
        let red: Vec<usize> = (0..rank).filter(|&d| reduced[d]).collect();
        let r: usize = red.iter().map(|&d| self.shape()[d]).product();
        let is_arg = matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin);
        if r == 0
            && !matches!(
                op,
                ReduceOp::Sum | ReduceOp::SumSquares | ReduceOp::Mean | ReduceOp::LogSumExp
            )
        {
            return Err(Error::Invalid {
                op: op.name(),
                message: format!("reduction over an empty dimension of {:?}", self.shape()),
            });
        }
        let out_shape: Vec<usize> = if keepdim {
            (0..rank)
                .map(|d| if reduced[d] { 1 } else { self.shape()[d] })
                .collect()
        } else {
            kept.iter().map(|&d| self.shape()[d]).collect()
        };
        let src_dtype = self.dtype();
        if is_arg && !src_dtype.is_float() {
            return crate::autograd::no_grad(|| self.integer_arg(op, dims, keepdim));
        }
        if !src_dtype.is_float() && !is_arg {
            return Err(Error::DTypeMismatch {
                op: op.name(),
                expected: "a float dtype".into(),
                got: src_dtype,
            });
        }
        let perm: Vec<usize> = kept.iter().chain(&red).copied().collect();
        let view = self.layout().permute(&perm)?;
        let rows: usize = kept.iter().map(|&d| self.shape()[d]).product();
        let device = self.device().clone();
        let (defs, out_ty) = op.wgsl();
        let out_dtype = if out_ty == "u32" { DType::U32 } else { DType::F32 };
        let buf = device.alloc(op.name(), Tensor::bytes_for(rows, out_dtype))?;
        let out = Tensor::from_buffer(buf, &out_shape, out_dtype, None);
        // f32 sums over the leading dimensions of a contiguous tensor (weight gradients' partial sums, biases'
        // gradients) read rows of vec4s, coalesced, where the kept extent is a multiple of 4.
        let columns = op == ReduceOp::Sum
            && src_dtype == DType::F32
            && r > 0
            && red.iter().enumerate().all(|(i, &d)| i == d)
            && rows.is_multiple_of(4)
            && self.layout().is_contiguous()
            && self.layout().offset.is_multiple_of(4);
        if rows > 0 && columns {
            device.dispatch(Dispatch {
                op: op.name(),
                runtime_checks: false,
                language: Language::Wgsl,
                key: "reduce_columns",
                source: &|| REDUCE_COLUMNS_WGSL.to_string(),
                buffers: &[out.buffer(), self.buffer()],
                params: &[(rows / 4) as u32, r as u32, (self.layout().offset / 4) as u32],
                workgroups: Gpu::grid((rows / 4) as u32),
            })?;
        } else if rows > 0 {
            let access = Access::new(src_dtype, device.caps().f16);
            let contiguous = view.is_contiguous();
            let mut params = vec![rows as u32, r as u32, rank as u32];
            params.extend((0..MAX_DIMS).map(|d| view.shape.get(d).copied().unwrap_or(1) as u32));
            params.push(view.offset as u32);
            params.extend((0..MAX_DIMS).map(|d| view.strides.get(d).copied().unwrap_or(0) as u32));
            let key = format!("reduce:{}:{}:{}:{}", op.name(), src_dtype, access.packed, contiguous);
            let source = || {
                let mut s = String::new();
                if access.dtype == DType::F16 && !access.packed {
                    s.push_str("enable f16;\n");
                }
                s.push_str("@group(0) @binding(0) var<storage, read> p: array<u32>;\n");
                let _ = writeln!(
                    s,
                    "@group(0) @binding(1) var<storage, read_write> out: array<{out_ty}>;"
                );
                let _ = writeln!(
                    s,
                    "@group(0) @binding(2) var<storage, read> in0: array<{}>;",
                    access.storage_type()
                );
                s.push_str(&access.load_fn("in0"));
                let _ = writeln!(s, "const CONTIGUOUS: bool = {contiguous};");
                s.push_str(&defs);
                s.push_str(hierarchos_wgpu::COMMON_WGSL);
                s.push_str(crate::ops::math::MATH_WGSL);
                s.push_str(REDUCE_WGSL);
                s
            };
            device.dispatch(Dispatch {
                op: op.name(),
                runtime_checks: false,
                language: Language::Wgsl,
                key: &key,
                source: &source,
                buffers: &[out.buffer(), self.buffer()],
                params: &params,
                workgroups: Gpu::grid(rows as u32),
            })?;
        }
        let out = if out_dtype == DType::F32 && src_dtype != DType::F32 {
            crate::autograd::no_grad(|| out.to_dtype(src_dtype))?
        } else {
            out
        };
        if is_arg {
            // Every result is an index into the reduced extent, so index ops that take it need no range check
            // (which would wait for the GPU): greedy decoding feeds argmax straight into the embedding.
            return Ok(out.with_id_range(0, r as i64 - 1));
        }
        if !grad_enabled() || !self.requires_grad() {
            return Ok(out);
        }
        let keep_shape: Vec<usize> = (0..rank)
            .map(|d| if reduced[d] { 1 } else { self.shape()[d] })
            .collect();
        let in_shape = self.shape().to_vec();
        let x = self.detach();
        let y = out.detach();
        let node = Node::record(
            op.name(),
            &[self],
            Box::new(move |g| {
                let g = g.reshape(&keep_shape)?;
                let gx = match op {
                    ReduceOp::Sum => g.broadcast_to(&in_shape)?.contiguous()?,
                    ReduceOp::SumSquares => x.mul(&g.broadcast_to(&in_shape)?)?.mul_scalar(2.0)?,
                    ReduceOp::Mean => g.div_scalar(r as f64)?.broadcast_to(&in_shape)?.contiguous()?,
                    ReduceOp::Max | ReduceOp::Min => {
                        let y = y.reshape(&keep_shape)?;
                        let mask = x
                            .compare(&y.broadcast_to(&in_shape)?, crate::ops::binary::CmpOp::Eq)?
                            .to_dtype(x.dtype())?;
                        let count = mask.sum(&dims_of(&reduced), true)?;
                        mask.mul(&g.div(&count)?)?
                    }
                    ReduceOp::LogSumExp => x.sub(&y.reshape(&keep_shape)?)?.exp()?.mul(&g)?,
                    ReduceOp::ArgMax | ReduceOp::ArgMin => unreachable!("no gradient"),
                };
                Ok(vec![Some(gx)])
            }),
        );
        Ok(out.with_node(node))
    }

    /// Sum over `dims` (empty: all).
    pub fn sum(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, dims, keepdim)
    }
    /// Sum of all elements (a scalar tensor).
    pub fn sum_all(&self) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, &[], false)
    }
    /// Sum of the squares over `dims` (empty: all), in one pass.
    pub fn sum_squares(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::SumSquares, dims, keepdim)
    }

    /// Mean over `dims` (empty: all).
    pub fn mean(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Mean, dims, keepdim)
    }
    /// Maximum over `dims` (empty: all); the gradient is shared among tied maxima.
    pub fn max(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Max, dims, keepdim)
    }
    /// Minimum over `dims` (empty: all).
    pub fn min(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Min, dims, keepdim)
    }

    /// argmax / argmin of i32 or u32 values, exactly: the reduction kernel compares in f32, which holds integers
    /// only up to 2^24, so each value splits into its high and low 16 bits, which f32 holds. The result is the
    /// first index among those whose high half is the extreme one whose low half is.
    fn integer_arg(&self, op: ReduceOp, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        let half = |body: &str| Map::elementwise(op.name(), &[self], DType::F32, body.into())?.run();
        let (high, low) = (half("return f32(x0 >> 16u);")?, half("return f32(x0 & 0xffff);")?);
        let (extreme, never) = match op {
            ReduceOp::ArgMax => (ReduceOp::Max, -1.0),
            _ => (ReduceOp::Min, 65536.0),
        };
        let top = high.reduce(extreme, dims, true)?;
        let body = format!("return select({never:.1}, x2, x0 == x1);");
        let key = Map::elementwise(op.name(), &[&high, &top, &low], DType::F32, body)?.run()?;
        key.reduce(op, dims, keepdim)
    }

    /// Index (u32) of the first maximum along `dim`.
    pub fn argmax(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::ArgMax, &[dim], keepdim)
    }
    /// Index (u32) of the first minimum along `dim`.
    pub fn argmin(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::ArgMin, &[dim], keepdim)
    }
    /// log Σ exp over `dims`, without overflow.
    pub fn logsumexp(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::LogSumExp, dims, keepdim)
    }

    /// Sums a broadcast gradient back to `shape` (the reverse of [`Tensor::broadcast_to`]).
    pub fn sum_to(&self, shape: &[usize]) -> Result<Tensor> {
        if self.shape() == shape {
            return Ok(self.clone());
        }
        let lead = self
            .rank()
            .checked_sub(shape.len())
            .ok_or_else(|| Error::ShapeMismatch {
                op: "sum_to",
                lhs: self.shape().to_vec(),
                rhs: shape.to_vec(),
            })?;
        let dims: Vec<isize> = (0..self.rank())
            .filter(|&d| d < lead || (shape[d - lead] == 1 && self.shape()[d] != 1))
            .map(|d| d as isize)
            .collect();
        if dims.is_empty() {
            return self.reshape(shape);
        }
        self.sum(&dims, true)?.reshape(shape)
    }
}

fn dims_of(reduced: &[bool]) -> Vec<isize> {
    (0..reduced.len()).filter(|&d| reduced[d]).map(|d| d as isize).collect()
}
