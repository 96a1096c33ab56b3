//! Indexing by integer tensors: `index_select`, `gather`, `embedding`, and their adjoint `scatter_add`.
//!
//! Kernels clamp ids into range so that a bad id can never read or write outside a buffer. The public ops also
//! report out-of-range ids as [`Error::IndexOutOfRange`]: index tensors of at most [`CHECKED_INDEX_LIMIT`]
//! elements are checked by a one-workgroup min/max kernel whose 8-byte result is read back (a host sync); larger
//! index tensors are only clamped, because the sync would stall the pipeline for a check the data loader can do.
//! Ids uploaded from the host whose values are known to be in range skip the check.
//!
//! The scatter kernel is deterministic: each thread owns one output element and loops over the ids that could
//! map to it (`O(ids along dim)` per element), so results never depend on thread timing. The gradient of a row
//! lookup (dim 0, f32: embeddings) has its own kernel, one workgroup per table row scanning the ids once, which
//! adds in the same order.

#[cfg(not(target_arch = "wasm32"))]
use hierarchos_wgpu::Access;
use hierarchos_wgpu::{DType, Dispatch, Gpu, Language};

use crate::autograd::{Node, grad_enabled};
use crate::error::{Error, Result};
use crate::ops::map::Map;
use crate::shape::{Layout, resolve_dim};
use crate::tensor::Tensor;

const INDEX_ADD_ROWS_WGSL: &str = include_str!("../../../../wgsl/index_add_rows.wgsl");
#[cfg(not(target_arch = "wasm32"))]
const INDEX_CHECK_WGSL: &str = include_str!("../../../../wgsl/index_check.wgsl");

/// Index tensors with at most this many elements are range-checked (with a host sync); larger ones are clamped.
pub const CHECKED_INDEX_LIMIT: usize = 1 << 16;

fn check_index_dtype(op: &'static str, index: &Tensor) -> Result<()> {
    if !matches!(index.dtype(), DType::U32 | DType::I32) {
        return Err(Error::DTypeMismatch {
            op,
            expected: "u32 or i32 indices".into(),
            got: index.dtype(),
        });
    }
    Ok(())
}

/// The smallest and largest id of a non-empty index tensor, read back from the GPU.
#[cfg(not(target_arch = "wasm32"))]
fn id_bounds(op: &'static str, index: &Tensor) -> Result<Option<(i64, i64)>> {
    let ids = crate::autograd::no_grad(|| index.contiguous())?;
    let device = ids.device().clone();
    let access = Access::new(ids.dtype(), device.caps().f16);
    let signed = ids.dtype() == DType::I32;
    let out = device.alloc(op, 8)?;
    let source = || {
        let key = if signed { "bitcast<u32>(v) ^ 0x80000000u" } else { "v" };
        format!(
            "@group(0) @binding(0) var<storage, read> p: array<u32>;\n\
             @group(0) @binding(1) var<storage, read_write> out: array<u32>;\n\
             @group(0) @binding(2) var<storage, read> in0: array<{}>;\n{}\
             fn order_key(v: {}) -> u32 {{ return {key}; }}\n{INDEX_CHECK_WGSL}",
            access.storage_type(),
            access.load_fn("in0"),
            ids.dtype().compute_type()
        )
    };
    device.dispatch(Dispatch {
        op,
        runtime_checks: false,
        language: Language::Wgsl,
        key: &format!("index_check:{}", ids.dtype()),
        source: &source,
        buffers: &[&out, ids.buffer()],
        params: &[ids.numel() as u32, ids.layout().offset as u32],
        workgroups: [1, 1, 1],
    })?;
    let words: Vec<u32> = bytemuck::pod_collect_to_vec(&device.read(&out, 0, 8)?);
    let decode = |w: u32| {
        if signed {
            (w ^ 0x8000_0000) as i32 as i64
        } else {
            w as i64
        }
    };
    Ok(Some((decode(words[1]), decode(words[0]))))
}

#[cfg(target_arch = "wasm32")]
fn id_bounds(_op: &'static str, _index: &Tensor) -> Result<Option<(i64, i64)>> {
    Ok(None)
}

/// Errors when an id is negative or not below `size` (see the module docs for when this is checked).
fn check_range(op: &'static str, index: &Tensor, size: usize) -> Result<()> {
    if index.numel() == 0 {
        return Ok(());
    }
    // Ids uploaded from the host are known to lie in a range covering every view of their buffer: when that
    // range fits, nothing needs checking (so a decode step does not wait for the GPU); otherwise the exact check
    // below decides, since a view may leave the bad ids out.
    if index
        .known_id_range()
        .is_some_and(|(lo, hi)| lo >= 0 && hi < size as i64)
    {
        return Ok(());
    }
    let bounds = if index.numel() <= CHECKED_INDEX_LIMIT {
        id_bounds(op, index)?
    } else {
        None
    };
    let bad = match bounds {
        Some((lo, _)) if lo < 0 => Some(lo),
        Some((_, hi)) if hi >= size as i64 => Some(hi),
        None if size == 0 => Some(0),
        _ => None,
    };
    match bad {
        Some(index) => Err(Error::IndexOutOfRange { op, index, size }),
        None => Ok(()),
    }
}

/// WGSL turning raw id `v` (of the index dtype) into a u32 clamped into `[0, n)`.
fn clamp_id(dtype: DType, v: &str, n: &str) -> String {
    match dtype {
        DType::I32 => format!("u32(clamp({v}, 0, i32({n}) - 1))"),
        _ => format!("min({v}, {n} - 1u)"),
    }
}

/// `layout` seen with `shape` and without dimension `dim` (its stride is returned), so that `strided_offset`
/// gives the offset of an element's other coordinates and the caller adds `coordinate * stride`.
fn without_dim(layout: &Layout, dim: usize, shape: &[usize]) -> (Layout, u32) {
    let mut l = layout.clone();
    l.shape = shape.to_vec();
    let stride = std::mem::replace(&mut l.strides[dim], 0);
    (l, stride as u32)
}

/// Ids of a 1-D tensor seen with `shape`, varying along `dim` only (index_select as a gather).
fn ids_along(ids: &Tensor, dim: usize, shape: &[usize]) -> Layout {
    let mut strides = vec![0; shape.len()];
    strides[dim] = ids.layout().strides[0];
    Layout {
        shape: shape.to_vec(),
        strides,
        offset: ids.layout().offset,
    }
}

/// `out[c] = src[c with c[dim] = index(c)]` over `shape`, `index` read through `index_layout` (of `shape`).
fn gather_kernel(
    op: &'static str,
    src: &Tensor,
    dim: usize,
    index: &Tensor,
    index_layout: Layout,
    shape: Vec<usize>,
) -> Result<Tensor> {
    let (src_layout, stride) = without_dim(src.layout(), dim, &shape);
    let id = clamp_id(index.dtype(), "load_in1(strided_offset(1u, i))", "extra_u32(0u)");
    let body = format!("return load_in0(strided_offset(0u, i) + {id} * extra_u32(1u));");
    Map {
        op,
        inputs: vec![(src, src_layout), (index, index_layout)],
        shape,
        dtype: src.dtype(),
        body,
        preload: false,
        extras: vec![src.shape()[dim] as u32, stride],
        quad_body: None,
    }
    .run()
}

/// `base` plus, at every position, the `src` values whose index (along `dim`) points there. `index` is read
/// through `index_layout`, whose shape (the scatter's iteration space) `src` must cover.
fn scatter_kernel(
    op: &'static str,
    base: &Tensor,
    dim: usize,
    index: &Tensor,
    index_layout: &Layout,
    src: &Tensor,
) -> Result<Tensor> {
    let shape = base.shape().to_vec();
    let space = index_layout.shape.clone();
    let (il, istride) = without_dim(index_layout, dim, &shape);
    let (sl, sstride) = without_dim(src.layout(), dim, &shape);
    let mut extras = vec![dim as u32, space[dim] as u32, istride, sstride, shape[dim] as u32];
    extras.extend(space.iter().map(|&n| n as u32));
    let id = clamp_id(index.dtype(), "load_in1(ib + k * extra_u32(2u))", "extra_u32(4u)");
    let body = format!(
        "var acc = load_in0(strided_offset(0u, i));\n\
         \x20   for (var d = 0u; d < p[1]; d = d + 1u) {{\n\
         \x20       if (d != extra_u32(0u) && out_coord(i, d) >= extra_u32(5u + d)) {{ return acc; }}\n\
         \x20   }}\n\
         \x20   let t = out_coord(i, extra_u32(0u));\n\
         \x20   let ib = strided_offset(1u, i);\n\
         \x20   let sb = strided_offset(2u, i);\n\
         \x20   for (var k = 0u; k < extra_u32(1u); k = k + 1u) {{\n\
         \x20       if ({id} == t) {{ acc = acc + load_in2(sb + k * extra_u32(3u)); }}\n\
         \x20   }}\n\
         \x20   return acc;"
    );
    let base_layout = base.layout().clone();
    Map {
        op,
        inputs: vec![(base, base_layout), (index, il), (src, sl)],
        shape,
        dtype: base.dtype(),
        body,
        preload: false,
        extras,
        quad_body: None,
    }
    .run()
}

/// Zeros of `shape` with `g` scattered into them: the gradient of every gather-like op.
fn scatter_into_zeros(
    op: &'static str,
    shape: &[usize],
    dim: usize,
    index: &Tensor,
    index_layout: &Layout,
    g: &Tensor,
) -> Result<Tensor> {
    let zeros = Tensor::zeros(shape, g.dtype(), g.device())?;
    scatter_kernel(op, &zeros, dim, index, index_layout, g)
}

/// A table of `shape` whose row `t` is the sum of the rows `k` of `g` (`[ids.len(), shape[1..]]`, f32) with
/// `ids[k] == t`, in ascending `k`: the gradient of a row lookup, one workgroup per [`INDEX_ADD_ROWS`] table rows
/// (see index_add_rows.wgsl). Bit for bit what the generic scatter gives.
fn index_add_rows(shape: &[usize], ids: &Tensor, g: &Tensor) -> Result<Tensor> {
    let device = g.device().clone();
    let g = g.contiguous()?;
    let (rows, width) = (shape[0], shape[1..].iter().product::<usize>());
    let out = Tensor::from_buffer(
        device.alloc("index_add_rows", Tensor::bytes_for(rows * width, DType::F32))?,
        shape,
        DType::F32,
        None,
    );
    if rows == 0 || width == 0 {
        return Ok(out);
    }
    let params = [
        rows as u32,
        ids.numel() as u32,
        width as u32,
        ids.layout().offset as u32,
        ids.layout().strides.first().copied().unwrap_or(1) as u32,
        g.layout().offset as u32,
        (ids.dtype() == DType::I32) as u32,
    ];
    device.dispatch(Dispatch {
        op: "index_select backward",
        runtime_checks: false,
        language: Language::Wgsl,
        key: "index_add_rows",
        source: &|| INDEX_ADD_ROWS_WGSL.to_string(),
        buffers: &[out.buffer(), ids.buffer(), g.buffer()],
        params: &params,
        workgroups: Gpu::grid(rows.div_ceil(INDEX_ADD_ROWS) as u32),
    })?;
    Ok(out)
}

/// Table rows per workgroup of index_add_rows.wgsl (its `ROWS`).
const INDEX_ADD_ROWS: usize = 8;

/// `t` padded with trailing zeros along every dimension up to `shape`.
fn pad_to(t: Tensor, shape: &[usize]) -> Result<Tensor> {
    let mut t = t;
    for (d, &n) in shape.iter().enumerate() {
        let have = t.shape()[d];
        if have < n {
            let mut zshape = t.shape().to_vec();
            zshape[d] = n - have;
            let zeros = Tensor::zeros(&zshape, t.dtype(), t.device())?;
            t = Tensor::cat(&[t, zeros], d as isize)?;
        }
    }
    Ok(t)
}

impl Tensor {
    /// The slices `ids[0], ids[1], ...` of `dim` (ids: a 1-D u32 or i32 tensor), like `torch.index_select`:
    /// row lookups with repeats, reordering, sampling.
    pub fn index_select(&self, dim: isize, ids: &Tensor) -> Result<Tensor> {
        const OP: &str = "index_select";
        let d = resolve_dim(OP, dim, self.rank())?;
        check_index_dtype(OP, ids)?;
        if ids.rank() != 1 {
            return Err(Error::RankMismatch {
                op: OP,
                expected: "1".into(),
                got: ids.shape().to_vec(),
            });
        }
        check_range(OP, ids, self.shape()[d])?;
        let mut shape = self.shape().to_vec();
        shape[d] = ids.numel();
        let layout = ids_along(ids, d, &shape);
        let out = gather_kernel(OP, self, d, ids, layout, shape)?;
        if !grad_enabled() || !self.requires_grad() {
            return Ok(out);
        }
        let (ids, in_shape) = (ids.detach(), self.shape().to_vec());
        let node = Node::record(
            OP,
            &[self],
            Box::new(move |g| {
                if d == 0 && g.dtype() == DType::F32 {
                    return Ok(vec![Some(index_add_rows(&in_shape, &ids, g)?)]);
                }
                let layout = ids_along(&ids, d, g.shape());
                Ok(vec![Some(scatter_into_zeros(OP, &in_shape, d, &ids, &layout, g)?)])
            }),
        );
        Ok(out.with_node(node))
    }

    /// `out[c] = self[c with c[dim] = index[c]]` (like `torch.gather`): picks one element per position, e.g.
    /// the log-probability of each target token. `index` has the rank of `self` and is no larger than it
    /// outside `dim`; the output has the shape of `index`.
    pub fn gather(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        const OP: &str = "gather";
        let d = resolve_dim(OP, dim, self.rank())?;
        check_index_dtype(OP, index)?;
        check_index_shape(OP, self, d, index)?;
        check_range(OP, index, self.shape()[d])?;
        let layout = index.layout().clone();
        let out = gather_kernel(OP, self, d, index, layout, index.shape().to_vec())?;
        if !grad_enabled() || !self.requires_grad() {
            return Ok(out);
        }
        let (index, in_shape) = (index.detach(), self.shape().to_vec());
        let node = Node::record(
            OP,
            &[self],
            Box::new(move |g| {
                let layout = index.layout().clone();
                Ok(vec![Some(scatter_into_zeros(OP, &in_shape, d, &index, &layout, g)?)])
            }),
        );
        Ok(out.with_node(node))
    }

    /// `self` plus `src` added at the positions `index` names along `dim` (like `torch.scatter_add`): sums
    /// contributions per bucket, deterministically. `index` has the rank of `self`, is no larger than `src`
    /// anywhere and no larger than `self` outside `dim`; only the part of `src` that `index` covers is used.
    pub fn scatter_add(&self, dim: isize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        const OP: &str = "scatter_add";
        let d = resolve_dim(OP, dim, self.rank())?;
        check_index_dtype(OP, index)?;
        if src.dtype() != self.dtype() {
            return Err(Error::DTypeMismatch {
                op: OP,
                expected: self.dtype().to_string(),
                got: src.dtype(),
            });
        }
        check_index_shape(OP, self, d, index)?;
        let covered = src.rank() == index.rank() && index.shape().iter().zip(src.shape()).all(|(i, s)| i <= s);
        if !covered {
            return Err(Error::ShapeMismatch {
                op: OP,
                lhs: index.shape().to_vec(),
                rhs: src.shape().to_vec(),
            });
        }
        check_range(OP, index, self.shape()[d])?;
        let out = scatter_kernel(OP, self, d, index, index.layout(), src)?;
        if !grad_enabled() || !(self.requires_grad() || src.requires_grad()) {
            return Ok(out);
        }
        let (index, src_shape) = (index.detach(), src.shape().to_vec());
        let node = Node::record(
            OP,
            &[self, src],
            Box::new(move |g| {
                let layout = index.layout().clone();
                let picked = gather_kernel(OP, g, d, &index, layout, index.shape().to_vec())?;
                Ok(vec![Some(g.clone()), Some(pad_to(picked, &src_shape)?)])
            }),
        );
        Ok(out.with_node(node))
    }

    /// Rows of `weight` ([vocab, dim]) for every id of `ids` (u32 or i32, any shape); the result has shape
    /// `ids.shape + [dim]`. The token-embedding lookup; its gradient sums the rows of repeated ids.
    pub fn embedding(weight: &Tensor, ids: &Tensor) -> Result<Tensor> {
        const OP: &str = "embedding";
        if weight.rank() != 2 {
            return Err(Error::RankMismatch {
                op: OP,
                expected: "2".into(),
                got: weight.shape().to_vec(),
            });
        }
        check_index_dtype(OP, ids)?;
        let rows = weight.index_select(0, &ids.flatten()?)?;
        let mut shape = ids.shape().to_vec();
        shape.push(weight.shape()[1]);
        rows.reshape(&shape)
    }
}

/// `index` must have the rank of `t` and be no larger than it outside `dim`.
fn check_index_shape(op: &'static str, t: &Tensor, dim: usize, index: &Tensor) -> Result<()> {
    let fits = index.rank() == t.rank() && (0..t.rank()).all(|k| k == dim || index.shape()[k] <= t.shape()[k]);
    if !fits {
        return Err(Error::ShapeMismatch {
            op,
            lhs: t.shape().to_vec(),
            rhs: index.shape().to_vec(),
        });
    }
    Ok(())
}
