//! Matrix products with PyTorch's `matmul` rules: 1-D operands promoted and squeezed back, batched operands with
//! broadcast batch dimensions, every operand read through its strides (a transposed view costs no copy).

use std::fmt::Write;
use std::sync::Arc;

use hierarchos_wgpu::{Access, COMMON_WGSL, DType, Dispatch, Gpu};

use crate::autograd::{Node, grad_enabled};
use crate::error::{Error, Result};
use crate::shape::{Layout, MAX_DIMS, broadcast_shapes, numel};
use crate::tensor::Tensor;

pub(crate) const MATMUL_WGSL: &str = include_str!("../../../../wgsl/matmul.wgsl");
pub(crate) const MATMUL_BATCH_WGSL: &str = include_str!("../../../../wgsl/matmul_batch.wgsl");
const MATMUL_SKINNY_WGSL: &str = include_str!("../../../../wgsl/matmul_skinny.wgsl");

/// Products with at most this many rows per batch entry whose right operand has unit stride along K (a
/// transposed weight, as in `x @ W.t()`) run the skinny kernel: at decode time a tile kernel would leave most of
/// the GPU idle, a column per 32 threads reads each weight once, coalesced.
pub(crate) const SKINNY_MAX_ROWS: usize = 8;

/// The K loop of the skinny kernel through the dtype's scalar load functions.
const SKINNY_DOT: &str = "for (var k = lane; k < K; k = k + LANES) {
            let y = f32(load_rhs(bases.y + k * p[9] + n * p[10]));
            for (var r = 0u; r < ROWS; r = r + 1u) {
                acc[r] = acc[r] + f32(load_lhs(bases.x + r * p[6] + k * p[7])) * y;
            }
        }";

/// The K loop of the skinny kernel over vec4s (f32, unit stride along K, 16-byte aligned rows).
const SKINNY_DOT_VEC4: &str = "let y0 = (bases.y + n * p[10]) / 4u;
        for (var k = lane; k < K / 4u; k = k + LANES) {
            let y = rhs[y0 + k];
            for (var r = 0u; r < ROWS; r = r + 1u) {
                acc[r] = acc[r] + dot(lhs[(bases.x + r * p[6]) / 4u + k], y);
            }
        }";

/// Batch dimensions the kernel carries (the two matrix dimensions take the rest of `MAX_DIMS`).
pub(crate) const MAX_BATCH_DIMS: usize = MAX_DIMS - 2;

/// Split a long reduction (see `split_k`) until the partial products give this many 64 x 64 output tiles in all
/// (four waves of a 132-multiprocessor GPU)...
const SPLIT_K_TARGET_TILES: usize = 528;
/// ...with slices of at least this many steps of the reduction.
const SPLIT_K_MIN_SLICE: usize = 512;

/// Output tiles of 128 x 128 (8 x 8 per thread) are about 25% faster than 64 x 64 tiles (4 x 4 per thread) once
/// there are enough of them to fill a large GPU; below this count the four times as many small tiles win (on an
/// H200, 132 multiprocessors: 1536^3 is faster with small tiles, 2048^3 with big ones).
pub(crate) const BIG_TILE_MIN_TILES: usize = 256;

impl Tensor {
    /// The matrix product `self @ rhs` as `torch.matmul` defines it: 1-D operands act as a row (left) or column
    /// (right) vector whose dimension is removed from the result, and dimensions before the last two are batch
    /// dimensions that broadcast. Both operands must have the same float dtype; accumulation is in f32.
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        if self.rank() == 0 || rhs.rank() == 0 {
            return Err(Error::RankMismatch {
                op: "matmul",
                expected: ">= 1".into(),
                got: if self.rank() == 0 {
                    self.shape().to_vec()
                } else {
                    rhs.shape().to_vec()
                },
            });
        }
        match (self.rank(), rhs.rank()) {
            (1, 1) => self.unsqueeze(0)?.matmul(&rhs.unsqueeze(1)?)?.reshape(&[]),
            (1, _) => self.unsqueeze(0)?.matmul(rhs)?.squeeze(-2),
            (_, 1) => self.matmul(&rhs.unsqueeze(1)?)?.squeeze(-1),
            _ => matmul_nd(self, rhs),
        }
    }
}

/// Both operands have rank >= 2.
fn matmul_nd(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let out = product(a, b)?;
    if !grad_enabled() || !(a.requires_grad() || b.requires_grad()) {
        return Ok(out);
    }
    let (need_a, need_b) = (a.requires_grad(), b.requires_grad());
    let (sa, sb) = (a.detach(), b.detach());
    let node = Node::record(
        "matmul",
        &[a, b],
        Box::new(move |g| {
            let ga = if need_a {
                Some(g.matmul(&sb.t()?)?.sum_to(sa.shape())?)
            } else {
                None
            };
            let gb = if !need_b {
                None
            } else if sb.rank() == 2 {
                // Every batch entry of `a` meets the same `b`: fold the batch into the reduced dimension.
                let rows = sa.shape()[..sa.rank() - 1].iter().product();
                let (k, n) = (sa.shape()[sa.rank() - 1], g.shape()[g.rank() - 1]);
                let a2 = sa.reshape(&[rows, k])?;
                Some(a2.t()?.matmul(&g.reshape(&[rows, n])?)?)
            } else {
                Some(sa.t()?.matmul(g)?.sum_to(sb.shape())?)
            };
            Ok(vec![ga, gb])
        }),
    );
    Ok(out.with_node(node))
}

/// Checks the operands and runs the kernel; the result has no autograd history.
fn product(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch {
            op: "matmul",
            expected: a.dtype().to_string(),
            got: b.dtype(),
        });
    }
    if !a.dtype().is_float() {
        return Err(Error::DTypeMismatch {
            op: "matmul",
            expected: "a float dtype".into(),
            got: a.dtype(),
        });
    }
    if !Arc::ptr_eq(a.device(), b.device()) {
        return Err(Error::Invalid {
            op: "matmul",
            message: "operands live on different devices".into(),
        });
    }
    let (ra, rb) = (a.rank(), b.rank());
    let (m, k) = (a.shape()[ra - 2], a.shape()[ra - 1]);
    let (k2, n) = (b.shape()[rb - 2], b.shape()[rb - 1]);
    if k != k2 {
        return Err(Error::ShapeMismatch {
            op: "matmul",
            lhs: a.shape().to_vec(),
            rhs: b.shape().to_vec(),
        });
    }
    let batch =
        broadcast_shapes("matmul", &a.shape()[..ra - 2], &b.shape()[..rb - 2]).map_err(|_| Error::ShapeMismatch {
            op: "matmul",
            lhs: a.shape().to_vec(),
            rhs: b.shape().to_vec(),
        })?;
    let mut out_shape = batch.clone();
    out_shape.extend([m, n]);
    if out_shape.len() > MAX_DIMS {
        return Err(Error::RankMismatch {
            op: "matmul",
            expected: format!("<= {MAX_DIMS} (result)"),
            got: out_shape,
        });
    }
    let dtype = a.dtype();
    if k == 0 {
        return Tensor::zeros(&out_shape, dtype, a.device());
    }
    let mut la = a.layout().broadcast_to("matmul", &[&batch[..], &[m, k]].concat())?;
    let lb = b.layout().broadcast_to("matmul", &[&batch[..], &[k, n]].concat())?;
    // When `b` is shared by the whole batch and `a`'s rows line up, one tall product replaces the batch.
    let b_shared = lb.strides[..batch.len()].iter().all(|&s| s == 0);
    if b_shared && !batch.is_empty() {
        let rows = Layout {
            shape: la.shape[..=batch.len()].to_vec(),
            strides: la.strides[..=batch.len()].to_vec(),
            offset: la.offset,
        };
        if let Some(r) = rows.reshape(&[numel(&batch) * m]) {
            la = Layout {
                shape: vec![r.shape[0], k],
                strides: vec![r.strides[0], la.strides[batch.len() + 1]],
                offset: la.offset,
            };
            let lb = Layout {
                shape: vec![k, n],
                strides: lb.strides[batch.len()..].to_vec(),
                offset: lb.offset,
            };
            let flat = split_k(a, &la, b, &lb, dtype)?;
            return flat.reshape(&out_shape);
        }
    }
    split_k(a, &la, b, &lb, dtype)
}

/// Products with few output tiles and a long reduction (weight gradients: `[hidden, hidden]` summed over thousands
/// of tokens) would leave most of a large GPU idle in one launch. Their reduction is cut into slices, one launch
/// each: the launches write separate buffers, so they run side by side, and the partial products are then added in
/// slice order (deterministic, but not the bits of the unsplit sum). Other products run as one launch.
fn split_k(a: &Tensor, la: &Layout, b: &Tensor, lb: &Layout, dtype: DType) -> Result<Tensor> {
    let r = la.rank();
    let (m, k, n) = (la.shape[r - 2], la.shape[r - 1], lb.shape[r - 1]);
    let tiles = m.div_ceil(64) * n.div_ceil(64) * numel(&la.shape[..r - 2]);
    let slices = (SPLIT_K_TARGET_TILES / tiles.max(1)).min(k / SPLIT_K_MIN_SLICE);
    if dtype != DType::F32 || slices < 2 {
        return launch(a, la, b, lb, dtype);
    }
    let len = k.div_ceil(slices).next_multiple_of(4);
    let mut partials = Vec::with_capacity(slices);
    let mut start = 0;
    while start < k {
        let n_k = len.min(k - start);
        partials.push(launch(
            a,
            &la.narrow(r - 1, start, n_k)?,
            b,
            &lb.narrow(r - 2, start, n_k)?,
            dtype,
        )?);
        start += n_k;
    }
    crate::autograd::no_grad(|| {
        let mut sum = partials[0].clone();
        for p in &partials[1..] {
            sum = sum.add(p)?;
        }
        Ok(sum)
    })
}

/// Which dimension consecutive threads walk when fetching an operand slice: the reduced one when it has the
/// smaller stride (so that a unit-stride dimension is read coalesced).
pub(crate) fn along_k(k: usize, stride_k: usize, other: usize, stride_other: usize) -> bool {
    k > 1 && (other == 1 || stride_k <= stride_other)
}

/// Runs the kernel on operand layouts `la` = [batch.., M, K] and `lb` = [batch.., K, N] with equal batch shapes.
fn launch(a: &Tensor, la: &Layout, b: &Tensor, lb: &Layout, dtype: DType) -> Result<Tensor> {
    let r = la.rank();
    let batch = &la.shape[..r - 2];
    let (m, k, n) = (la.shape[r - 2], la.shape[r - 1], lb.shape[r - 1]);
    let mut out_shape = batch.to_vec();
    out_shape.extend([m, n]);
    let device = a.device().clone();
    let native_f16 = device.caps().f16;
    let in_access = Access::new(dtype, native_f16);
    let skinny = m <= SKINNY_MAX_ROWS && lb.strides[r - 2] == 1;
    let aligned = |l: &Layout, unit: usize| {
        l.strides[unit] == 1
            && l.offset.is_multiple_of(4)
            && l.strides
                .iter()
                .enumerate()
                .all(|(d, s)| d == unit || s.is_multiple_of(4))
    };
    let vec4 = skinny && dtype == DType::F32 && k.is_multiple_of(4) && aligned(la, r - 1) && aligned(lb, r - 2);
    // Packed 16-bit outputs are written in place when every thread owns whole words (N even, tile kernel);
    // otherwise in f32, then cast.
    let direct = !in_access.packed || (n % 2 == 0 && !skinny);
    let out_dtype = if direct { dtype } else { DType::F32 };
    let out_access = Access::new(out_dtype, native_f16);
    let batch_count = numel(batch);
    let buf = device.alloc("matmul", Tensor::bytes_for(numel(&out_shape), out_dtype))?;
    let out = Tensor::from_buffer(buf, &out_shape, out_dtype, None);
    if out.numel() == 0 {
        return Ok(out);
    }
    let big = m.div_ceil(128) * n.div_ceil(128) * batch_count >= BIG_TILE_MIN_TILES;
    let (tm, tn) = if big { (8, 8) } else { (4, 4) };
    let (bm, bn) = (16 * tm, 16 * tn);
    let a_k = along_k(k, la.strides[r - 1], m, la.strides[r - 2]);
    let b_k = along_k(k, lb.strides[r - 2], n, lb.strides[r - 1]);
    let mut params = vec![
        m as u32,
        n as u32,
        k as u32,
        batch_count as u32,
        batch.len() as u32,
        la.offset as u32,
        la.strides[r - 2] as u32,
        la.strides[r - 1] as u32,
        lb.offset as u32,
        lb.strides[r - 2] as u32,
        lb.strides[r - 1] as u32,
    ];
    for (v, fill) in [(batch, 1), (&la.strides[..r - 2], 0), (&lb.strides[..r - 2], 0)] {
        params.extend((0..MAX_BATCH_DIMS).map(|d| v.get(d).copied().unwrap_or(fill) as u32));
    }
    let key = format!(
        "matmul:{dtype}:{}:{}:{tm}x{tn}:{a_k}:{b_k}:{}:{vec4}",
        in_access.packed,
        out_dtype,
        if skinny { m } else { 0 }
    );
    let source = || {
        let mut s = String::new();
        if native_f16 && dtype == DType::F16 {
            s.push_str("enable f16;\n");
        }
        s.push_str("@group(0) @binding(0) var<storage, read> p: array<u32>;\n");
        let _ = writeln!(
            s,
            "@group(0) @binding(1) var<storage, read_write> out: array<{}>;",
            out_access.storage_type()
        );
        for (i, name) in ["lhs", "rhs"].iter().enumerate() {
            let ty = if vec4 { "vec4<f32>" } else { in_access.storage_type() };
            let _ = writeln!(
                s,
                "@group(0) @binding({}) var<storage, read> {name}: array<{ty}>;",
                i + 2
            );
            if !vec4 {
                s.push_str(&in_access.load_fn(name));
            }
        }
        s.push_str(&out_access.store_fn("out"));
        s.push_str(COMMON_WGSL);
        let _ = writeln!(
            s,
            "const BM: u32 = {bm}u;\nconst BN: u32 = {bn}u;\nconst A_ALONG_K: bool = {a_k};\n\
             const B_ALONG_K: bool = {b_k};\nconst PACKED_OUT: bool = {};",
            out_access.packed
        );
        s.push_str(MATMUL_BATCH_WGSL);
        if skinny {
            let _ = writeln!(s, "const ROWS: u32 = {m}u;");
            s.push_str(&MATMUL_SKINNY_WGSL.replace("//@DOT", if vec4 { SKINNY_DOT_VEC4 } else { SKINNY_DOT }));
        } else {
            s.push_str(&unrolled(MATMUL_WGSL, tm, tn));
        }
        s
    };
    let tiles = if skinny {
        n.div_ceil(2) * batch_count
    } else {
        m.div_ceil(bm) * n.div_ceil(bn) * batch_count
    };
    device.dispatch(Dispatch {
        op: "matmul",
        key: &key,
        source: &source,
        buffers: &[out.buffer(), a.buffer(), b.buffer()],
        params: &params,
        workgroups: Gpu::grid(tiles as u32),
    })?;
    if direct { Ok(out) } else { out.to_dtype(dtype) }
}

/// The kernel template with its `//@` blocks unrolled over a `tm` x `tn` micro-tile per thread: accumulators
/// `c{row}_{column group}` (vec4 over four columns), fetch registers `ra{e}` / `rb{e}`. Rows of a thread are
/// `ty * 4 + r` plus multiples of 64, columns `tx * 4 + c` plus multiples of 64, so that the vec4 reads of
/// workgroup memory by a warp hit consecutive addresses.
pub(crate) fn unrolled(template: &str, tm: usize, tn: usize) -> String {
    let comps = ["x", "y", "z", "w"];
    let (mut decl, mut fetch, mut stash, mut step, mut store) = (
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
    );
    for i in 0..tm {
        for j in 0..tn / 4 {
            let _ = writeln!(decl, "    var c{i}_{j} = vec4<f32>();");
        }
    }
    for (name, count) in [("a", tm), ("b", tn)] {
        for e in 0..count {
            let _ = writeln!(decl, "    var r{name}{e} = 0.0;");
            let _ = writeln!(fetch, "        r{name}{e} = fetch_{name}({e}u, k0);");
            let _ = writeln!(stash, "        stash_{name}({e}u, r{name}{e});");
        }
    }
    for g in 0..tm / 4 {
        let _ = writeln!(step, "            let a{g} = As[k * AS4 + {}u + ty];", 16 * g);
    }
    for j in 0..tn / 4 {
        let _ = writeln!(step, "            let b{j} = Bs[k * BS4 + {}u + tx];", 16 * j);
    }
    for i in 0..tm {
        let (g, c) = (i / 4, comps[i % 4]);
        for j in 0..tn / 4 {
            let _ = writeln!(step, "            c{i}_{j} = fma(vec4<f32>(a{g}.{c}), b{j}, c{i}_{j});");
        }
        let _ = writeln!(
            store,
            "    let m{i} = tile_m + {}u + ty * 4u;\n    if (m{i} < M) {{",
            64 * (i / 4) + i % 4
        );
        for j in 0..tn / 4 {
            let _ = writeln!(
                store,
                "        store4(out_base + m{i} * N, tile_n + {}u + tx * 4u, c{i}_{j});",
                64 * j
            );
        }
        store.push_str("    }\n");
    }
    let mut s = String::new();
    for line in template.lines() {
        let block = match line.trim() {
            "//@DECL" => decl.as_str(),
            "//@FETCH" => fetch.as_str(),
            "//@STASH" => stash.as_str(),
            "//@STEP" => step.as_str(),
            "//@STORE" => store.as_str(),
            _ => line,
        };
        s.push_str(block);
        if !block.ends_with('\n') {
            s.push('\n');
        }
    }
    s
}
