//! Softmax and log-softmax along any dimension, and the row-kernel launcher they share with cumsum.

use std::fmt::Write;
use std::sync::Arc;

use hierarchos_wgpu::{Access, COMMON_WGSL, DType, Dispatch, Gpu};

use crate::autograd::{Node, grad_enabled, no_grad};
use crate::error::{Error, Result};
use crate::shape::{Layout, MAX_DIMS, resolve_dim};
use crate::tensor::Tensor;

const ROWS_WGSL: &str = include_str!("../../../../wgsl/rows.wgsl");
const SOFTMAX_WGSL: &str = include_str!("../../../../wgsl/softmax.wgsl");
const SOFTMAX_SUBGROUP_WGSL: &str = include_str!("../../../../wgsl/softmax_subgroup.wgsl");

/// A kernel run with one workgroup per row of a tensor along one dimension, reading the tensor in place
/// (any layout) and writing f32.
pub(crate) struct RowKernel {
    /// Op name (errors, labels, cache key: one op name per `wgsl` text).
    pub op: &'static str,
    /// WGSL defining `fn run_row(row: u32, lid: u32, sg_lane: u32)` on top of rows.wgsl.
    pub wgsl: String,
    /// Pass the subgroup lane (otherwise `sg_lane` is 0). Naga 30 rejects `enable subgroups;`: the subgroup
    /// builtins are available as soon as the device has `Features::SUBGROUP`.
    pub subgroups: bool,
    /// Extra parameters (at `p[EXTRA + j]`).
    pub extras: Vec<u32>,
}

impl RowKernel {
    /// Runs over the rows of `t` along `dim`; the result is f32 with the shape of `t` and no autograd history.
    pub(crate) fn run(&self, t: &Tensor, dim: usize) -> Result<Tensor> {
        let rank = t.rank();
        let perm: Vec<usize> = (0..rank).filter(|&k| k != dim).chain([dim]).collect();
        let mut inverse = vec![0; rank];
        for (i, &k) in perm.iter().enumerate() {
            inverse[k] = i;
        }
        let view = t.layout().permute(&perm)?;
        let device = t.device().clone();
        let n = t.numel();
        let buf = device.alloc(self.op, Tensor::bytes_for(n, DType::F32))?;
        let layout = Layout::contiguous(&view.shape).permute(&inverse)?;
        let out = Tensor::from_parts(Arc::new(buf), layout, DType::F32, None);
        if n == 0 {
            return Ok(out);
        }
        let len = t.shape()[dim];
        let rows = n / len;
        let access = Access::new(t.dtype(), device.caps().f16);
        let mut params = vec![rows as u32, len as u32, rank as u32];
        params.extend((0..MAX_DIMS).map(|d| view.shape.get(d).copied().unwrap_or(1) as u32));
        params.push(view.offset as u32);
        params.extend((0..MAX_DIMS).map(|d| view.strides.get(d).copied().unwrap_or(0) as u32));
        params.extend(&self.extras);
        let key = format!("rows:{}:{}:{}:{}", self.op, t.dtype(), access.packed, self.subgroups);
        let source = || {
            let mut s = String::new();
            if access.dtype == DType::F16 && !access.packed {
                s.push_str("enable f16;\n");
            }
            s.push_str("@group(0) @binding(0) var<storage, read> p: array<u32>;\n");
            s.push_str("@group(0) @binding(1) var<storage, read_write> out: array<f32>;\n");
            let _ = writeln!(
                s,
                "@group(0) @binding(2) var<storage, read> in0: array<{}>;",
                access.storage_type()
            );
            s.push_str(&access.load_fn("in0"));
            s.push_str(COMMON_WGSL);
            s.push_str(ROWS_WGSL);
            s.push_str(&self.wgsl);
            let (lane_param, lane) = if self.subgroups {
                (", @builtin(subgroup_invocation_id) sg_lane: u32", "sg_lane")
            } else {
                ("", "0u")
            };
            let _ = write!(
                s,
                "@compute @workgroup_size(256)\n\
                 fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,\n\
                 \x20       @builtin(local_invocation_index) lid: u32{lane_param}) {{\n\
                 \x20   let row = row_index(wid, nwg);\n\
                 \x20   if (row >= p[0]) {{ return; }}\n\
                 \x20   run_row(row, lid, {lane});\n}}\n"
            );
            s
        };
        device.dispatch(Dispatch {
            op: self.op,
            key: &key,
            source: &source,
            buffers: &[out.buffer(), t.buffer()],
            params: &params,
            workgroups: Gpu::grid(rows as u32),
        })?;
        Ok(out)
    }
}

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
        let subgroups = self.device().caps().subgroups;
        let combine = if subgroups {
            "fn combine(own: Part, lid: u32, sg_lane: u32) -> Part { return combine_subgroup(own, sg_lane); }\n"
        } else {
            "fn combine(own: Part, lid: u32, sg_lane: u32) -> Part { return combine_tree(own, lid); }\n"
        };
        let mut wgsl = format!("const LOG: bool = {log};\n{SOFTMAX_WGSL}{combine}");
        if subgroups {
            wgsl.push_str(SOFTMAX_SUBGROUP_WGSL);
        }
        let y = RowKernel {
            op,
            wgsl,
            subgroups,
            extras: Vec::new(),
        }
        .run(self, d)?;
        let y = if dtype == DType::F32 {
            y
        } else {
            no_grad(|| y.to_dtype(dtype))?
        };
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
