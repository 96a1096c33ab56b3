//! Quantized weights on the GPU and the kernels that read them: dequantize to f32, and `x @ W^T` with the
//! dequantization inside the matmul (a matrix-vector kernel for decode, the tiled matmul for prefill).

use std::fmt::Write;
use std::sync::Arc;

use hierarchos_wgpu::{Access, COMMON_WGSL, DType, Dispatch, Gpu, GpuBuffer, Language};

use super::{GgmlType, check_bytes};
use crate::autograd::{Node, grad_enabled, no_grad};
use crate::error::{Error, Result};
use crate::ops::math::MATH_WGSL;
use crate::ops::matmul::{
    BIG_TILE_MIN_TILES, MATMUL_BATCH_WGSL, MATMUL_WGSL, MAX_BATCH_DIMS, SKINNY_MAX_ROWS, along_k, load4_fn, unrolled,
};
use crate::ops::unary::UnaryOp;
use crate::tensor::{Device, Tensor};

const FORMATS_WGSL: &str = include_str!("../../../../wgsl/quant_formats.wgsl");
const DEQUANT_WGSL: &str = include_str!("../../../../wgsl/quant_dequant.wgsl");
const MATVEC_WGSL: &str = include_str!("../../../../wgsl/quant_matvec.wgsl");
const SPLIT_SUM_WGSL: &str = include_str!("../../../../wgsl/quant_split_sum.wgsl");

/// How the matrix-vector kernel's lanes find their group and add up: through subgroups when the device has them
/// 32 wide (a workgroup is one subgroup: on an H200 this ran 1.6x faster than four subgroups per workgroup with
/// loads unrolled by four), else through workgroup memory (two groups).
struct Reduce {
    groups: usize,
    builtins: &'static str,
    lane: &'static str,
    /// Replaces `LANE_SUM(`: a call that adds one value over the group's lanes.
    lane_sum: &'static str,
    /// WGSL the call needs.
    helper: &'static str,
}

const REDUCE_SUBGROUP: Reduce = Reduce {
    groups: 1,
    builtins: ", @builtin(subgroup_invocation_id) sg_lane: u32, @builtin(subgroup_id) sg_id: u32",
    lane: "let lane = sg_lane + sg_id * LANES;\n    let group = 0u;",
    lane_sum: "split_sum(sg_lane, sg_id, ",
    helper: SPLIT_SUM_WGSL,
};

const REDUCE_TREE: Reduce = Reduce {
    groups: 2,
    builtins: "",
    lane: "let lane = local % LANES;\n    let group = local / LANES;",
    lane_sum: "tree_sum(local, lane, ",
    helper: "",
};

/// Columns up to which the matrix-vector kernel splits a column's row between several subgroups.
const SPLIT_MAX_COLUMNS: usize = 8192;

/// A matrix `[rows, cols]` of quantized weights (a linear layer's `W`, `cols` = in-features) kept as ggml
/// blocks on the GPU, so that it takes the file's size in memory and the matmul reads 4.5 to 8.5 bits per weight.
/// Cheap to clone (the blocks are shared).
#[derive(Clone)]
pub struct QTensor {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    blocks: Arc<GpuBuffer>,
    /// Word where row 0 starts in `blocks` (a view of some rows of a larger matrix).
    offset: usize,
    device: Device,
}

impl std::fmt::Debug for QTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QTensor({}, [{}, {}])", self.ty, self.rows, self.cols)
    }
}

/// The WGSL name of a format's functions.
fn wgsl_name(ty: GgmlType) -> String {
    ty.name().to_lowercase()
}

/// Bytes of one block on the GPU: ggml's block padded to whole words.
fn gpu_block_bytes(ty: GgmlType) -> usize {
    ty.type_size().next_multiple_of(4)
}

/// Distance in elements between the two quads of a matrix-vector task (see quant_formats.wgsl).
fn task_stride(ty: GgmlType) -> u32 {
    match ty {
        GgmlType::Q8_0 => 4,
        GgmlType::Q4_K | GgmlType::Q5_K => 32,
        GgmlType::Q6_K => 64,
        _ => 16,
    }
}

/// ggml blocks in the GPU layout: the leading f16 scale of Q4_0 / Q5_0 / Q8_0 moved behind the quants (so that
/// these start on a word), every block padded to whole words.
fn repack(ty: GgmlType, bytes: &[u8]) -> Vec<u8> {
    let lead = matches!(ty, GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0);
    let stride = gpu_block_bytes(ty);
    let mut out = Vec::with_capacity(bytes.len() / ty.type_size() * stride);
    for block in bytes.chunks_exact(ty.type_size()) {
        let start = out.len();
        if lead {
            out.extend_from_slice(&block[2..]);
            out.extend_from_slice(&block[..2]);
        } else {
            out.extend_from_slice(block);
        }
        out.resize(start + stride, 0);
    }
    out
}

/// The format's functions under the generic names the kernels call: QK, BW, TD, deq(), task(), task_off().
fn format_wgsl(ty: GgmlType) -> String {
    let t = wgsl_name(ty);
    let mut s = String::from(FORMATS_WGSL);
    let _ = writeln!(
        s,
        "const QK: u32 = {}u;\nconst BW: u32 = {}u;\nconst TD: u32 = {}u;\n\
         fn deq(b: u32, i: u32) -> f32 {{ return deq_{t}(b, i); }}\n\
         fn task(b: u32, t: u32) -> array<vec4<f32>, 2> {{ return task_{t}(b, t); }}\n\
         fn task_off(t: u32) -> u32 {{ return off_{t}(t); }}",
        ty.block_size(),
        gpu_block_bytes(ty) / 4,
        task_stride(ty)
    );
    s
}

/// The bindings every quantized kernel starts with: params, `out` (f32), the activations (name, element type) if
/// any, the blocks `w`.
fn bindings(x: Option<(&str, &str)>) -> String {
    let mut s = String::from(
        "@group(0) @binding(0) var<storage, read> p: array<u32>;\n\
         @group(0) @binding(1) var<storage, read_write> out: array<f32>;\n",
    );
    let w = match x {
        Some((name, ty)) => {
            let _ = writeln!(s, "@group(0) @binding(2) var<storage, read> {name}: array<{ty}>;");
            3
        }
        None => 2,
    };
    let _ = writeln!(s, "@group(0) @binding({w}) var<storage, read> w: array<u32>;");
    s
}

impl QTensor {
    /// Uploads a `[rows, cols]` matrix stored as ggml blocks (`bytes`, row-major, as in a GGUF file). Rows must
    /// be whole blocks; the type must be one of the GPU formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K).
    /// Weights fused along rows (Q, K and V projections) are made by concatenating their bytes.
    pub fn from_ggml(ty: GgmlType, bytes: &[u8], shape: [usize; 2], device: &Device) -> Result<QTensor> {
        const OP: &str = "QTensor::from_ggml";
        if !ty.is_gpu_quant() {
            return Err(Error::Invalid {
                op: OP,
                message: format!(
                    "{ty} is not a GPU block format (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K); \
                     dequantize it with quant::dequantize into a Tensor"
                ),
            });
        }
        let [rows, cols] = shape;
        if !cols.is_multiple_of(ty.block_size()) {
            return Err(Error::Invalid {
                op: OP,
                message: format!(
                    "rows of {cols} elements are not whole {ty} blocks of {}",
                    ty.block_size()
                ),
            });
        }
        let n = rows.checked_mul(cols).ok_or_else(|| Error::Invalid {
            op: OP,
            message: format!("shape {shape:?} overflows"),
        })?;
        check_bytes(OP, ty, bytes.len(), n)?;
        let words = n / ty.block_size() * gpu_block_bytes(ty) / 4;
        if n > u32::MAX as usize || words > u32::MAX as usize {
            return Err(Error::Invalid {
                op: OP,
                message: format!("shape {shape:?} exceeds the 2^32 elements kernels index"),
            });
        }
        let data = repack(ty, bytes);
        let blocks = device.upload(OP, if data.is_empty() { &[0; 4] } else { &data })?;
        Ok(QTensor {
            ty,
            rows,
            cols,
            blocks: Arc::new(blocks),
            offset: 0,
            device: device.clone(),
        })
    }

    /// Rows `start..start + len` as a view sharing the blocks.
    pub fn narrow_rows(&self, start: usize, len: usize) -> Result<QTensor> {
        if start.checked_add(len).is_none_or(|end| end > self.rows) {
            return Err(Error::Invalid {
                op: "QTensor::narrow_rows",
                message: format!("{len} rows from row {start} of {} rows", self.rows),
            });
        }
        Ok(QTensor {
            rows: len,
            offset: self.offset + start * self.row_words(),
            ..self.clone()
        })
    }

    /// The matrices `parts` (same format, device and columns) stacked along rows into new blocks: how linear
    /// layers that read the same input (Q, K and V) become one matmul.
    pub fn cat_rows(parts: &[&QTensor]) -> Result<QTensor> {
        const OP: &str = "QTensor::cat_rows";
        let Some(first) = parts.first() else {
            return Err(Error::Invalid {
                op: OP,
                message: "nothing to concatenate".into(),
            });
        };
        let fits = |q: &&&QTensor| q.ty == first.ty && q.cols == first.cols && Arc::ptr_eq(&q.device, &first.device);
        if !parts.iter().all(|q| fits(&q)) {
            return Err(Error::Invalid {
                op: OP,
                message: format!("the parts {parts:?} differ in format, columns or device"),
            });
        }
        let rows: usize = parts.iter().map(|q| q.rows).sum();
        let words = rows * first.row_words();
        let blocks = first.device.alloc(OP, (words.max(1) * 4) as u64)?;
        let mut at = 0;
        for q in parts {
            let n = (q.rows * q.row_words()) as u64 * 4;
            first.device.copy(&q.blocks, q.offset as u64 * 4, &blocks, at, n)?;
            at += n;
        }
        Ok(QTensor {
            rows,
            blocks: Arc::new(blocks),
            offset: 0,
            ..(*first).clone()
        })
    }

    /// Whether both are views of the same blocks (see [`QTensor::narrow_rows`]).
    pub fn shares_blocks(&self, other: &QTensor) -> bool {
        Arc::ptr_eq(&self.blocks, &other.blocks)
    }

    /// Words of one row of blocks.
    fn row_words(&self) -> usize {
        self.cols / self.ty.block_size() * gpu_block_bytes(self.ty) / 4
    }

    /// The block format.
    pub fn ggml_type(&self) -> GgmlType {
        self.ty
    }

    /// `[rows, cols]`: output and input features of the linear layer it holds.
    pub fn shape(&self) -> [usize; 2] {
        [self.rows, self.cols]
    }

    /// The device holding the blocks.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Bytes the blocks take on the GPU (ggml's size plus the padding of blocks to whole words).
    pub fn gpu_bytes(&self) -> usize {
        self.rows * self.cols / self.ty.block_size() * gpu_block_bytes(self.ty)
    }

    /// The weights as an f32 tensor `[rows, cols]`, bit for bit what [`super::dequantize`] gives: for loading a
    /// model dequantized, or fine-tuning it.
    pub fn dequantize(&self) -> Result<Tensor> {
        let n = self.rows * self.cols;
        if n == 0 {
            return Tensor::zeros(&[self.rows, self.cols], DType::F32, &self.device);
        }
        let out = self.device.alloc("dequantize", Tensor::bytes_for(n, DType::F32))?;
        let ty = self.ty;
        let source = || format!("{}{}{}", bindings(None), format_wgsl(ty), DEQUANT_WGSL);
        self.device.dispatch(Dispatch {
            op: "dequantize",
            runtime_checks: false,
            language: Language::Wgsl,
            key: &format!("dequantize:{ty}"),
            source: &source,
            buffers: &[&out, &self.blocks],
            params: &[n as u32, self.offset as u32],
            workgroups: Gpu::grid(n.div_ceil(256) as u32),
        })?;
        Ok(Tensor::from_buffer(out, &[self.rows, self.cols], DType::F32, None))
    }
}

impl Tensor {
    /// `self @ w^T` for quantized weights `w` `[N, K]` and `self` `[.., K]` of a float dtype: a linear layer
    /// whose weights stay quantized. The result has `self`'s dtype; accumulation is in f32. Up to 8 rows run a
    /// matrix-vector kernel reading each block once, more the tiled matmul dequantizing as it loads tiles. The
    /// gradient flows to `self` (through the dequantized weights); the weights themselves are frozen.
    pub fn matmul_q(&self, w: &QTensor) -> Result<Tensor> {
        const OP: &str = "matmul_q";
        if !self.dtype().is_float() {
            return Err(Error::DTypeMismatch {
                op: OP,
                expected: "a float dtype".into(),
                got: self.dtype(),
            });
        }
        let [n, k] = w.shape();
        if self.rank() == 0 || self.shape()[self.rank() - 1] != k {
            return Err(Error::ShapeMismatch {
                op: OP,
                lhs: self.shape().to_vec(),
                rhs: vec![n, k],
            });
        }
        if !Arc::ptr_eq(self.device(), w.device()) {
            return Err(Error::Invalid {
                op: OP,
                message: "operands live on different devices".into(),
            });
        }
        let mut out_shape = self.shape().to_vec();
        *out_shape.last_mut().expect("rank >= 1") = n;
        let dtype = self.dtype();
        let out = no_grad(|| -> Result<Tensor> {
            let m = self.numel() / k.max(1);
            if m == 0 || n == 0 || k == 0 {
                return Tensor::zeros(&out_shape, dtype, self.device());
            }
            let x = self.reshape(&[m, k])?;
            let y = if m <= SKINNY_MAX_ROWS {
                matvec(&x, w, Fusion::default())?
            } else {
                tiled(&x, w)?
            };
            y.reshape(&out_shape)?.to_dtype(dtype)
        })?;
        if !grad_enabled() || !self.requires_grad() {
            return Ok(out);
        }
        let w = w.clone();
        let node = Node::record(
            OP,
            &[self],
            Box::new(move |g| Ok(vec![Some(g.matmul(&w.dequantize()?.to_dtype(dtype)?)?)])),
        );
        Ok(out.with_node(node))
    }
}

/// Work fused into a quantized projection of decode rows (see [`Tensor::matmul_q_fused`]): a decode step is
/// bound by launches, and the norm before a projection, the gate after it and the residual add fit in its
/// launch.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fusion<'a> {
    /// RMSNorm of the input rows first: its weight (`[K]`) and eps.
    pub norm: Option<(&'a Tensor, f64)>,
    /// The weights stack a gate projection over an up projection (`[2N, K]`, gate rows first, see
    /// [`QTensor::cat_rows`]); the result is `op(gate) * up`.
    pub gate: Option<UnaryOp>,
    /// Added to the result (shape of the result): the residual stream.
    pub residual: Option<&'a Tensor>,
}

impl Tensor {
    /// `residual + gate(norm(self) Wᵀ)` with each part optional (see [`Fusion`]): one launch for up to 8 f32
    /// rows without gradients, else the same computation from separate ops ([`Tensor::rms_norm`],
    /// [`Tensor::matmul_q`], [`Tensor::gated`], [`Tensor::add`]). The gate and the residual add are bit for bit
    /// the separate ops; the fused norm scales the dot product instead of each input, which moves results by a
    /// few f32 roundings.
    pub fn matmul_q_fused(&self, w: &QTensor, fusion: Fusion<'_>) -> Result<Tensor> {
        const OP: &str = "matmul_q_fused";
        let [rows, k] = w.shape();
        if fusion.gate.is_some() && !rows.is_multiple_of(2) {
            return Err(Error::Invalid {
                op: OP,
                message: format!("{w:?}: gate and up projections stacked have an even number of rows"),
            });
        }
        let n = if fusion.gate.is_some() { rows / 2 } else { rows };
        let m = self.numel() / k.max(1);
        let mut out_shape = self.shape().to_vec();
        if let Some(last) = out_shape.last_mut() {
            *last = n;
        }
        for (what, t) in [
            ("residual", fusion.residual),
            ("norm weight", fusion.norm.map(|(g, _)| g)),
        ] {
            if let Some(t) = t.filter(|t| t.dtype() != DType::F32) {
                return Err(Error::DTypeMismatch {
                    op: OP,
                    expected: format!("an f32 {what}"),
                    got: t.dtype(),
                });
            }
        }
        if let Some(r) = fusion.residual
            && r.shape() != out_shape.as_slice()
        {
            return Err(Error::ShapeMismatch {
                op: OP,
                lhs: out_shape,
                rhs: r.shape().to_vec(),
            });
        }
        if let Some((g, _)) = fusion.norm
            && g.shape() != [k]
        {
            return Err(Error::ShapeMismatch {
                op: OP,
                lhs: vec![k],
                rhs: g.shape().to_vec(),
            });
        }
        let needs_grad = grad_enabled()
            && (self.requires_grad()
                || fusion.norm.is_some_and(|(g, _)| g.requires_grad())
                || fusion.residual.is_some_and(Tensor::requires_grad));
        let fused = self.rank() > 0
            && self.shape()[self.rank() - 1] == k
            && self.dtype() == DType::F32
            && (1..=SKINNY_MAX_ROWS).contains(&m)
            && n > 0
            && !needs_grad
            && Arc::ptr_eq(self.device(), w.device())
            && fusion.norm.is_none_or(|(g, _)| Arc::ptr_eq(g.device(), w.device()))
            && fusion.residual.is_none_or(|r| Arc::ptr_eq(r.device(), w.device()));
        if !fused {
            let x = match fusion.norm {
                Some((g, eps)) => self.rms_norm(Some(g), eps)?,
                None => self.clone(),
            };
            let y = x.matmul_q(w)?;
            let y = match fusion.gate {
                Some(op) => y.narrow(-1, 0, n)?.gated(&y.narrow(-1, n, n)?, op)?,
                None => y,
            };
            return match fusion.residual {
                Some(r) => r.add(&y),
                None => Ok(y),
            };
        }
        matvec(&self.reshape(&[m, k])?, w, fusion)?.reshape(&out_shape)
    }
}

/// `x @ w^T` for `x` `[M, K]` with M <= 8, as f32 `[M, N]`, with the work of `fusion` around it (the caller
/// checked its shapes).
fn matvec(x: &Tensor, w: &QTensor, fusion: Fusion<'_>) -> Result<Tensor> {
    let mut x = x.to_dtype(DType::F32)?.contiguous()?;
    if !x.layout().offset.is_multiple_of(4) {
        x = x.copy()?;
    }
    let (m, k) = (x.shape()[0], x.shape()[1]);
    let n = if fusion.gate.is_some() { w.rows / 2 } else { w.rows };
    let norm = match fusion.norm {
        Some((g, eps)) => {
            let g = g.contiguous()?;
            let g = if g.layout().offset.is_multiple_of(4) {
                g
            } else {
                g.copy()?
            };
            Some((g, eps))
        }
        None => None,
    };
    let residual = fusion.residual.map(|r| r.contiguous()).transpose()?;
    let device = x.device().clone();
    let caps = device.caps();
    let subgroup = caps.subgroups && caps.subgroup_size == (32, 32);
    let plan = if subgroup { &REDUCE_SUBGROUP } else { &REDUCE_TREE };
    let groups = plan.groups;
    // Subgroups per output column: about one round of loads per lane for rows of a few hundred features, at
    // most four, when there are few columns to spread over the GPU (a decode step's projections are
    // latency-bound; an output head of tens of thousands of columns is bandwidth-bound and fills it anyway:
    // on an H200 splitting its columns made it slower).
    let tasks = k / w.ty.block_size() * (w.ty.block_size() / 8);
    let split = if subgroup && n < SPLIT_MAX_COLUMNS {
        tasks.div_ceil(32).next_power_of_two().clamp(1, 4)
    } else {
        1
    };
    let out = device.alloc("matmul_q", Tensor::bytes_for(m * n, DType::F32))?;
    let ty = w.ty;
    let gate = fusion.gate;
    let source = || {
        let mut s = bindings(Some(("x", "vec4<f32>")));
        let mut next = 4;
        if norm.is_some() {
            let _ = writeln!(s, "@group(0) @binding({next}) var<storage, read> g: array<vec4<f32>>;");
            next += 1;
        }
        if residual.is_some() {
            let _ = writeln!(s, "@group(0) @binding({next}) var<storage, read> res: array<f32>;");
        }
        s.push_str(&format_wgsl(ty));
        let epilogue = match gate {
            Some(op) => format!("let x = g; return ({}) * u;", op.forward()),
            None => "return g;".into(),
        };
        let load_g = if norm.is_some() {
            "g[p[6] + i]"
        } else {
            "vec4<f32>(1.0)"
        };
        let load_res = if residual.is_some() { "res[p[7] + i]" } else { "0.0" };
        let _ = writeln!(
            s,
            "const ROWS: u32 = {m}u;\nconst GROUPS: u32 = {groups}u;\nconst SPLIT: u32 = {split}u;\n\
             const NORM: bool = {};\n\
             const GATED: bool = {};\nconst RESIDUAL: bool = {};\n\
             fn epilogue(g: f32, u: f32) -> f32 {{ {epilogue} }}\n\
             fn load_g(i: u32) -> vec4<f32> {{ return {load_g}; }}\n\
             fn load_res(i: u32) -> f32 {{ return {load_res}; }}",
            norm.is_some(),
            gate.is_some(),
            residual.is_some(),
        );
        s.push_str(COMMON_WGSL);
        s.push_str(MATH_WGSL);
        s.push_str(plan.helper);
        s.push_str(
            &MATVEC_WGSL
                .replace("/*@LANE_BUILTINS*/", plan.builtins)
                .replace("//@LANE", plan.lane)
                .replace("LANE_SUM(", plan.lane_sum),
        );
        s
    };
    let gate_key = gate.map_or("", |op| op.forward());
    let key = format!(
        "matmul_q:vec:{ty}:{m}:{subgroup}x{split}:{gate_key}:{}:{}",
        norm.is_some(),
        residual.is_some()
    );
    let eps = norm.as_ref().map_or(0.0, |(_, eps)| *eps as f32);
    let params = [
        m as u32,
        n as u32,
        k as u32,
        (x.layout().offset / 4) as u32,
        w.offset as u32,
        eps.to_bits(),
        norm.as_ref().map_or(0, |(g, _)| (g.layout().offset / 4) as u32),
        residual.as_ref().map_or(0, |r| r.layout().offset as u32),
    ];
    let mut buffers = vec![&out, x.buffer(), &*w.blocks];
    if let Some((g, _)) = &norm {
        buffers.push(g.buffer());
    }
    if let Some(r) = &residual {
        buffers.push(r.buffer());
    }
    device.dispatch(Dispatch {
        op: "matmul_q",
        runtime_checks: false,
        language: Language::Wgsl,
        key: &key,
        source: &source,
        buffers: &buffers,
        params: &params,
        workgroups: Gpu::grid(n.div_ceil(groups) as u32),
    })?;
    Ok(Tensor::from_buffer(out, &[m, n], DType::F32, None))
}

/// `x @ w^T` for `x` `[M, K]` (any float dtype and strides) through the tiled matmul, whose right operand loads
/// dequantize: as f32 `[M, N]`.
fn tiled(x: &Tensor, w: &QTensor) -> Result<Tensor> {
    let la = x.layout();
    let (m, k, n) = (la.shape[0], la.shape[1], w.rows);
    let device = x.device().clone();
    let native_f16 = device.caps().f16;
    let dtype = x.dtype();
    let access = Access::new(dtype, native_f16);
    let big = m.div_ceil(128) * n.div_ceil(128) >= BIG_TILE_MIN_TILES;
    let (tm, tn) = if big { (8, 8) } else { (4, 4) };
    let (bm, bn) = (16 * tm, 16 * tn);
    let a_k = along_k(k, la.strides[1], m, la.strides[0]);
    let mut params = vec![
        m as u32,
        n as u32,
        k as u32,
        1,
        0,
        la.offset as u32,
        la.strides[0] as u32,
        la.strides[1] as u32,
        0,
        1,
        k as u32,
    ];
    params.extend((0..3 * MAX_BATCH_DIMS).map(|i| u32::from(i < MAX_BATCH_DIMS)));
    // One slice of K: the whole reduction.
    params.extend([k as u32, 1]);
    let w_offset_at = params.len();
    params.push(w.offset as u32);
    let out = device.alloc("matmul_q", Tensor::bytes_for(m * n, DType::F32))?;
    let ty = w.ty;
    let source = || {
        let mut s = String::new();
        if native_f16 && dtype == DType::F16 {
            s.push_str("enable f16;\n");
        }
        s.push_str(&bindings(Some(("lhs", access.storage_type()))));
        s.push_str(&access.load_fn("lhs"));
        s.push_str(&load4_fn("lhs"));
        s.push_str(&Access::new(DType::F32, native_f16).store_fn("out"));
        s.push_str(COMMON_WGSL);
        s.push_str(&format_wgsl(ty));
        let _ = writeln!(
            s,
            "fn load_rhs(i: u32) -> f32 {{ return deq(p[{w_offset_at}u] + (i / QK) * BW, i % QK); }}\n{}\
             const BM: u32 = {bm}u;\nconst BN: u32 = {bn}u;\nconst A_ALONG_K: bool = {a_k};\n\
             const B_ALONG_K: bool = true;\nconst A_VEC4: bool = false;\nconst B_VEC4: bool = false;\n\
             const PACKED_OUT: bool = false;",
            load4_fn("rhs")
        );
        s.push_str(MATMUL_BATCH_WGSL);
        s.push_str(&unrolled(MATMUL_WGSL, tm, tn, 16));
        s
    };
    device.dispatch(Dispatch {
        op: "matmul_q",
        runtime_checks: false,
        language: Language::Wgsl,
        key: &format!("matmul_q:tile:{ty}:{dtype}:{}:{tm}x{tn}:{a_k}", access.packed),
        source: &source,
        buffers: &[&out, x.buffer(), &w.blocks],
        params: &params,
        workgroups: Gpu::grid((m.div_ceil(bm) * n.div_ceil(bn)) as u32),
    })?;
    Ok(Tensor::from_buffer(out, &[m, n], DType::F32, None))
}
