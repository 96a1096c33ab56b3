//! Matrix products with PyTorch's `matmul` rules: 1-D operands promoted and squeezed back, batched operands with
//! broadcast batch dimensions, every operand read through its strides (a transposed view costs no copy).

use std::fmt::Write;
use std::sync::Arc;

use hierarchos_wgpu::{Access, COMMON_WGSL, DType, Dispatch, Gpu, Language};

use crate::autocast::{autocast_dtype, shared_cast};
use crate::autograd::{Node, grad_enabled};
use crate::error::{Error, Result};
use crate::ops::map::vec4_load_fns;
use crate::ops::matmul_coop;
use crate::shape::{Layout, MAX_DIMS, broadcast_shapes, numel};
use crate::tensor::Tensor;

pub(crate) const MATMUL_WGSL: &str = include_str!("../../../../wgsl/matmul.wgsl");
pub(crate) const MATMUL_BATCH_WGSL: &str = include_str!("../../../../wgsl/matmul_batch.wgsl");
const MATMUL_SKINNY_WGSL: &str = include_str!("../../../../wgsl/matmul_skinny.wgsl");
const MATMUL_SPLIT_SUM_WGSL: &str = include_str!("../../../../wgsl/matmul_split_sum.wgsl");

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

/// A product whose output tiles number fewer than this is split along K (see [`launch`]) into slices run side by
/// side in one launch, until the slices give about this many workgroups in all (sixteen per multiprocessor of an
/// H200)...
const SPLIT_K_TARGET_WORKGROUPS: usize = 2112;
/// ...with slices of at least this many steps of the reduction. On an H200 the 110M Llama shape (f32) trains at
/// 35.4K tokens/s with these two settings and [`BIG_TILE_MIN_K`], 35.2K with 1056 and 512, 34.8K with 1056 and
/// 384, 33.4K with 1056 and 256 (and no `BIG_TILE_MIN_K`); slices of 256 split the `[4096, 768]` products over
/// K = 768 in two, 12% slower than whole.
const SPLIT_K_MIN_SLICE: usize = 512;
/// ...or of this many where the product has fewer tiles than [`BIG_TILE_MIN_TILES`], too few to fill a large GPU
/// even once. On an H200 the prefill of 512 tokens of the 110M Llama shape (its `[512, 768]` products over K =
/// 768 in 96 tiles of 64 x 64, cut in three) runs at 74.9-75.4K tokens/s with 256, 73.8-74.0K with 128 and
/// 70.5-70.6K with 512 (not cut).
const SPLIT_K_MIN_SLICE_FEW_TILES: usize = 256;

/// Output tiles of 128 x 128 (8 x 8 per thread) are the fastest once there are enough of them to fill a large GPU
/// (on an H200, 132 multiprocessors, 2048^3 runs faster with them than with smaller tiles, 1536^3 slower)...
pub(crate) const BIG_TILE_MIN_TILES: usize = 256;
/// ...or, for f32 products of at least half as many, once K is at least this long, where split-K slices fill the
/// GPU instead: on an H200 the `[4096, 768]` and `[3072, 768]` products over K = 3072, 4096 and 32000 of the 110M
/// Llama shape run 5% to 20% faster with them than with 64 x 128 tiles, while fewer tiles (the `[768, 768]`
/// weight gradients, 36 tiles; prefill's `[512, 768]` products) run 2% to 6% slower (BENCHMARKS.md).
const BIG_TILE_MIN_K: usize = 2048;
/// Below those, tiles of half the size while they number at least as many. For f32, 128 x 64 tiles: 8 x 8 per
/// thread like the big tiles, in workgroups of 128 threads (of which three fit a multiprocessor of an H200 by
/// their workgroup memory, where two big ones run). There the `[4096, 768]` products over K = 768 (192 big
/// tiles, filling 73% of a wave; 384 of these, 97%) run at 31.8 / 32.0 TFLOP/s (`x @ W.t()` / `g @ W`) against
/// 29.4 / 31.1 with 64 x 128 tiles of 4 x 8 per thread. Those still serve 16-bit products, where 128 x 64 tiles
/// cost bf16 training 7%. 64 x 128 tiles had run 10% to 40% faster than 64 x 64 ones (4 x 4), which take smaller
/// products.
const MID_TILE_MIN_TILES: usize = 256;

/// f32 products at most this many columns wide (LoRA's rank-16 products `x @ A.t()`, `g @ B` and
/// `g.t() @ (x @ A.t())`) take tiles of 128 x 16 (8 x 4 a thread, 64 threads), where 64 columns would leave three
/// quarters of the tile idle...
const THIN_MAX_COLUMNS: usize = 16;
/// ...split along K in slices of at least this many steps where they are few. On an H200, LoRA r = 16 over the
/// 110M Llama shape (all linear layers) ran its step's kernels in 100.5 ms with 64 x 64 tiles, 98.9 / 98.5 / 98.25
/// with thin ones in slices of 256 / 64 / 128 and 100.2 with 128 x 32 tiles (BENCHMARKS.md, session 30).
const THIN_MIN_SLICE: usize = 128;

/// Workgroups of 128 x 128 tiles that one multiprocessor runs at once (their registers allow two of 256 threads on
/// NVIDIA GPUs). Where the adapter tells its multiprocessor count, f32 products over K >= [`BIG_TILE_MIN_K`] take
/// those tiles, split along K into whole waves of workgroups, whenever some split fills its last wave to
/// [`FULL_WAVES`] ([`full_wave_split`]). On an H200 (132 multiprocessors) a `[768, 768]` weight gradient over
/// K = 4096 then runs in 7 slices of 36 tiles, 252 workgroups in one wave: 32.9 TFLOP/s, against 26.2 with
/// 64 x 64 tiles in 8 slices (BENCHMARKS.md).
const BIG_TILE_RESIDENT: usize = 2;
/// How full a split's last wave of workgroups must be. Fewer slices mean fewer partial products to write and add:
/// on an H200, 0.9 rather than 0.95 cuts the `[768, 3072]` and `[6144, 768]` weight gradients of the 110M Llama
/// shape in 5 slices instead of 7, and its f32 training step from 98.8 to 98.35 ms of kernels (split sums 2.0 ->
/// 1.8 ms); 0.92 / 0.88 / 0.85 / 0.8 / 0.7 ran 98.9 / 98.35 / 98.46 / 99.96 / 108.5 (BENCHMARKS.md, session 30).
const FULL_WAVES: f64 = 0.9;
/// Products with at least this many waves of tiles are left to [`split_k`]: their last wave costs little.
const SPLIT_MAX_WAVES: usize = 4;

/// Steps of the reduction per slice staged in workgroup memory by the tiled kernel (its `BK`): a split's slice
/// length is a multiple of it, and the multiply-add loop over it is unrolled.
const BK: usize = 16;

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
        // A mismatch names the shapes as given, not the matrices a vector became.
        let as_given = |e| match e {
            Error::ShapeMismatch { op, .. } => Error::ShapeMismatch {
                op,
                lhs: self.shape().to_vec(),
                rhs: rhs.shape().to_vec(),
            },
            e => e,
        };
        match (self.rank(), rhs.rank()) {
            (1, 1) => self
                .unsqueeze(0)?
                .matmul(&rhs.unsqueeze(1)?)
                .map_err(as_given)?
                .reshape(&[]),
            (1, _) => self.unsqueeze(0)?.matmul(rhs).map_err(as_given)?.squeeze(-2),
            (_, 1) => self.matmul(&rhs.unsqueeze(1)?).map_err(as_given)?.squeeze(-1),
            _ => matmul_nd(self, rhs),
        }
    }
}

/// Both operands have rank >= 2.
fn matmul_nd(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    // Under autocast, a product with an f32 operand runs in the 16-bit dtype and comes back as f32.
    if let Some(half) = autocast_dtype().filter(|_| a.dtype() == DType::F32 || b.dtype() == DType::F32) {
        if [a, b].iter().all(|t| t.dtype().is_float()) {
            return autocast_product(a, b, half);
        }
    }
    let out = product(a, b, false)?;
    // Operands of mixed dtypes give an f32 product; each gradient takes its operand's dtype.
    Ok(with_product_node(
        out,
        a,
        b,
        (a.detach(), false),
        (b.detach(), false),
        None,
    ))
}

/// `out` (the product `a @ b`) with its node when gradients are recorded. Each gradient reads the other operand,
/// so an operand is kept for the backward only when the other one needs a gradient (a frozen weight's product
/// does not keep its input alive for a weight gradient); `keep_a` and `keep_b` say what is kept and whether to
/// cast it to `half` again there (autocast, see [`autocast_product`]).
fn with_product_node(
    out: Tensor,
    a: &Tensor,
    b: &Tensor,
    keep_a: (Tensor, bool),
    keep_b: (Tensor, bool),
    half: Option<DType>,
) -> Tensor {
    if !grad_enabled() || !(a.requires_grad() || b.requires_grad()) {
        return out;
    }
    let (sa, sb) = (b.requires_grad().then_some(keep_a), a.requires_grad().then_some(keep_b));
    let (shape_a, dtype_a, shape_b, dtype_b) = (a.shape().to_vec(), a.dtype(), b.shape().to_vec(), b.dtype());
    let b_transposed = column_major(b);
    let node = Node::record(
        "matmul",
        &[a, b],
        Box::new(move |g| {
            let operand = |(t, recast): &(Tensor, bool)| match (half, recast) {
                (Some(h), true) => cast_in_layout(t.clone(), h),
                _ => Ok(t.clone()),
            };
            let (sa, sb) = (
                sa.as_ref().map(operand).transpose()?,
                sb.as_ref().map(operand).transpose()?,
            );
            let g = match half {
                Some(h) => g.to_dtype(h)?,
                None => g.clone(),
            };
            let widen = half.is_some();
            let (ga, gb) = product_grads(&g, sa.as_ref(), sb.as_ref(), &shape_a, &shape_b, b_transposed, widen)?;
            Ok(vec![
                ga.map(|t| t.to_dtype(dtype_a)).transpose()?,
                gb.map(|t| cast_in_layout(t, dtype_b)).transpose()?,
            ])
        }),
    );
    out.with_node(node)
}

/// The gradients of a product `a @ b` (shapes `shape_a`, `shape_b`) from the gradient `g` of its result: the
/// one of `a` when `b` is given, the one of `b` when `a` is given. With `b_transposed` (`b` is a matrix stored
/// column by column, a weight `W` seen as `W.t()`), `b`'s gradient is computed transposed and handed back as a
/// view in `b`'s layout, so that `W` receives a contiguous gradient (no copy before the optimizer reads it).
/// With `widen` (16-bit operands under autocast), products that need no further sum come back as f32 straight
/// from the kernel, rounded to the 16-bit dtype.
fn product_grads(
    g: &Tensor,
    a: Option<&Tensor>,
    b: Option<&Tensor>,
    shape_a: &[usize],
    shape_b: &[usize],
    b_transposed: bool,
    widen: bool,
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    // A product that is the gradient as it is may come back widened; one still to be summed may not (the sum
    // runs in the 16-bit dtype).
    let times = |x: &Tensor, y: &Tensor, whole: bool| match widen && whole && x.rank() >= 2 && y.rank() >= 2 {
        true => product(x, y, true),
        false => x.matmul(y),
    };
    let ga = match b {
        Some(b) => {
            let whole = g.shape()[..g.rank() - 1] == shape_a[..shape_a.len() - 1] && b.rank() == 2;
            Some(times(g, &b.t()?, whole)?.sum_to(shape_a)?)
        }
        None => None,
    };
    let gb = match a {
        None => None,
        Some(a) if shape_b.len() == 2 => {
            // Every batch entry of `a` meets the same `b`: fold the batch into the reduced dimension.
            let rows = shape_a[..shape_a.len() - 1].iter().product();
            let (k, n) = (shape_a[shape_a.len() - 1], g.shape()[g.rank() - 1]);
            let (a2, g2) = (a.reshape(&[rows, k])?, g.reshape(&[rows, n])?);
            Some(match b_transposed {
                true => times(&g2.t()?, &a2, true)?.t()?,
                false => times(&a2.t()?, &g2, true)?,
            })
        }
        Some(a) => Some(a.t()?.matmul(g)?.sum_to(shape_b)?),
    };
    Ok((ga, gb))
}

/// `t` in `dtype`, a matrix stored column by column staying so (the cast of its transpose, transposed back).
fn cast_in_layout(t: Tensor, dtype: DType) -> Result<Tensor> {
    match column_major(&t) {
        true => t.t()?.to_dtype(dtype)?.t(),
        false => t.to_dtype(dtype),
    }
}

/// Whether `t` is a matrix stored column by column (`W.t()` of a contiguous `W`).
fn column_major(t: &Tensor) -> bool {
    let l = t.layout();
    t.rank() == 2 && l.strides[0] == 1 && l.strides[1] == l.shape[0] && !t.is_contiguous()
}

/// Under autocast: the product of the operands' 16-bit casts, handed back as f32, with the gradients the casts
/// and the 16-bit product give. For the backward an operand with no history but views (a weight, `W.t()`) is
/// kept as it is, alive anyway, and cast again there; keeping its cast instead would hold a 16-bit copy of every
/// weight from the forward to the backward, most of mixed precision's extra peak memory. Other operands
/// (activations) keep their cast, half their size.
fn autocast_product(a: &Tensor, b: &Tensor, half: DType) -> Result<Tensor> {
    // (`W.t()` is cast as `W`, whose elements are contiguous, and read transposed by the product.)
    let cast = |t: &Tensor| shared_cast(t, half, || cast_in_layout(t.detach(), half));
    let (ah, bh) = (cast(a)?, cast(b)?);
    let out = product(&ah, &bh, true)?;
    let keep = |t: &Tensor, cast: Tensor| match t.is_leaf_view() {
        true => (t.detach(), true),
        false => (cast, false),
    };
    Ok(with_product_node(out, a, b, keep(a, ah), keep(b, bh), Some(half)))
}

/// Checks the operands and runs the kernel; the result has no autograd history. With `widen`, a product of
/// 16-bit operands comes back as f32 holding the 16-bit result (what autocast hands on), written so by the
/// tensor-core kernel instead of a separate cast.
fn product(a: &Tensor, b: &Tensor, widen: bool) -> Result<Tensor> {
    if let Some(t) = [a, b].into_iter().find(|t| !t.dtype().is_float()) {
        return Err(Error::DTypeMismatch {
            op: "matmul",
            expected: "a float dtype".into(),
            got: t.dtype(),
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
    // Mixed dtypes (f32 activations times a frozen 16-bit weight, say) multiply in f32 into an f32 result.
    let dtype = if a.dtype() == b.dtype() { a.dtype() } else { DType::F32 };
    if k == 0 {
        let dtype = if widen { DType::F32 } else { dtype };
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
            let flat = launch(a, &la, b, &lb, dtype, widen)?;
            return flat.reshape(&out_shape);
        }
    }
    launch(a, &la, b, &lb, dtype, widen)
}

/// Which dimension consecutive threads walk when fetching an operand slice: the reduced one when it has the
/// smaller stride (so that a unit-stride dimension is read coalesced).
pub(crate) fn along_k(k: usize, stride_k: usize, other: usize, stride_other: usize) -> bool {
    k > 1 && (other == 1 || stride_k <= stride_other)
}

/// Runs the kernel on operand layouts `la` = [batch.., M, K] and `lb` = [batch.., K, N] with equal batch shapes.
///
/// Products with few output tiles and a long reduction (weight gradients: `[hidden, hidden]` summed over thousands
/// of tokens) would leave most of a large GPU idle. Their reduction is cut into slices that run side by side in
/// the same launch, each writing its own partial product, which the split-sum kernel then adds in slice order
/// (deterministic, but not the bits of the unsplit sum).
fn launch(a: &Tensor, la: &Layout, b: &Tensor, lb: &Layout, dtype: DType, widen: bool) -> Result<Tensor> {
    let r = la.rank();
    let batch = &la.shape[..r - 2];
    let (m, k, n) = (la.shape[r - 2], la.shape[r - 1], lb.shape[r - 1]);
    let mut out_shape = batch.to_vec();
    out_shape.extend([m, n]);
    let device = a.device().clone();
    if numel(&out_shape) == 0 {
        let out_dtype = if widen { DType::F32 } else { dtype };
        return Tensor::zeros(&out_shape, out_dtype, &device);
    }
    if matmul_coop::fits(&device, [a.dtype(), b.dtype()], la, lb) {
        return matmul_coop::launch(a, la, b, lb, widen)?.reshape(&out_shape);
    }
    // Under autocast the kernel itself rounds each sum to the 16-bit dtype and stores it as f32.
    let widened = widen && dtype != DType::F32;
    let native_f16 = device.caps().f16;
    let (a_access, b_access) = (Access::new(a.dtype(), native_f16), Access::new(b.dtype(), native_f16));
    let skinny = m <= SKINNY_MAX_ROWS && lb.strides[r - 2] == 1;
    let a_k = along_k(k, la.strides[r - 1], m, la.strides[r - 2]);
    let b_k = along_k(k, lb.strides[r - 2], n, lb.strides[r - 1]);
    let aligned = |t: &Tensor, l: &Layout, unit: usize, len: usize| {
        t.dtype() == DType::F32
            && len.is_multiple_of(4)
            && l.strides[unit] == 1
            && l.offset.is_multiple_of(4)
            && l.strides
                .iter()
                .enumerate()
                .all(|(d, s)| d == unit || s.is_multiple_of(4))
    };
    // Whether an operand loads as vec4s along its unit-stride dimension (f32, that dimension, the offset and all
    // other strides multiples of 4, so that every group of four starts a vec4). The skinny kernel reads both
    // operands along K; the tiled one each along the dimension its fetch walks.
    let (vec4_a, vec4_b) = if skinny {
        let both = aligned(a, la, r - 1, k) && aligned(b, lb, r - 2, k);
        (both, both)
    } else {
        (
            if a_k {
                aligned(a, la, r - 1, k)
            } else {
                aligned(a, la, r - 2, m)
            },
            if b_k {
                aligned(b, lb, r - 2, k)
            } else {
                aligned(b, lb, r - 1, n)
            },
        )
    };
    // Packed 16-bit outputs are written in place when every thread owns whole words (N even, tile kernel);
    // otherwise in f32, then cast.
    let direct = widened || !Access::new(dtype, native_f16).packed || (n % 2 == 0 && !skinny);
    let out_dtype = if direct && !widened { dtype } else { DType::F32 };
    let out_access = Access::new(out_dtype, native_f16);
    let batch_count = numel(batch);
    let tiles_of = |bm: usize, bn: usize| m.div_ceil(bm) * n.div_ceil(bn) * batch_count;
    let splits = !skinny && dtype == DType::F32;
    let big_tiles = tiles_of(128, 128);
    let long_k = splits && k >= BIG_TILE_MIN_K && 2 * big_tiles >= BIG_TILE_MIN_TILES;
    let wave_split = match device.caps().multiprocessors {
        Some(sms) if splits && k >= BIG_TILE_MIN_K => {
            full_wave_split(big_tiles, k, sms as usize * BIG_TILE_RESIDENT, SPLIT_K_MIN_SLICE, BK)
        }
        _ => None,
    };
    let thin = splits && n <= THIN_MAX_COLUMNS;
    let wave_split = wave_split.filter(|_| !thin);
    // (rows, columns) per thread and threads along N: 16 x 4 threads for 128 x 16 tiles, 16 x 8 for 128 x 64,
    // else 16 x 16.
    let (tm, tn, tx) = if thin {
        (8, 4, 4)
    } else if big_tiles >= BIG_TILE_MIN_TILES || long_k || wave_split.is_some() {
        (8, 8, 16)
    } else if splits && tiles_of(128, 64) >= MID_TILE_MIN_TILES {
        (8, 8, 8)
    } else if tiles_of(64, 128) >= MID_TILE_MIN_TILES {
        (4, 8, 16)
    } else {
        (4, 4, 16)
    };
    let (bm, bn) = (16 * tm, tx * tn);
    let tiles = if skinny {
        n.div_ceil(2) * batch_count
    } else {
        tiles_of(bm, bn)
    };
    // Skinny and 16-bit products are never split (a target of no workgroups gives one slice).
    let target = if splits { SPLIT_K_TARGET_WORKGROUPS } else { 0 };
    let min_slice = match tiles < BIG_TILE_MIN_TILES {
        true if thin => THIN_MIN_SLICE,
        true => SPLIT_K_MIN_SLICE_FEW_TILES,
        false => SPLIT_K_MIN_SLICE,
    };
    let (slices, slice_len) = wave_split.unwrap_or_else(|| split_k(tiles, k, target, min_slice, BK));
    let mut partial_shape = out_shape.clone();
    if slices > 1 {
        partial_shape.insert(0, slices);
    }
    let buf = device.alloc("matmul", Tensor::bytes_for(numel(&partial_shape), out_dtype))?;
    let out = Tensor::from_buffer(buf, &partial_shape, out_dtype, None);
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
    params.extend([slice_len as u32, slices as u32]);
    let key = format!(
        "matmul:{}:{}:{}:{}:{}:{tm}x{tn}x{tx}:{a_k}:{b_k}:{}:{vec4_a}:{vec4_b}:{widened}",
        a.dtype(),
        a_access.packed,
        b.dtype(),
        b_access.packed,
        out_dtype,
        if skinny { m } else { 0 }
    );
    let source = || {
        let mut s = String::new();
        if native_f16 && [a.dtype(), b.dtype()].contains(&DType::F16) {
            s.push_str("enable f16;\n");
        }
        s.push_str("@group(0) @binding(0) var<storage, read> p: array<u32>;\n");
        let _ = writeln!(
            s,
            "@group(0) @binding(1) var<storage, read_write> out: array<{}>;",
            out_access.storage_type()
        );
        let operands = [("lhs", vec4_a, a_access), ("rhs", vec4_b, b_access)];
        for (i, (name, vec4, access)) in operands.into_iter().enumerate() {
            let ty = if vec4 { "vec4<f32>" } else { access.storage_type() };
            let _ = writeln!(
                s,
                "@group(0) @binding({}) var<storage, read> {name}: array<{ty}>;",
                i + 2
            );
            s.push_str(&if vec4 {
                vec4_load_fns(name)
            } else {
                access.load_fn(name) + &load4_fn(name)
            });
        }
        s.push_str(&if widened {
            widened_store_fn(dtype)
        } else {
            out_access.store_fn("out")
        });
        s.push_str(COMMON_WGSL);
        let _ = writeln!(
            s,
            "const BM: u32 = {bm}u;\nconst BN: u32 = {bn}u;\nconst A_ALONG_K: bool = {a_k};\n\
             const B_ALONG_K: bool = {b_k};\nconst A_VEC4: bool = {vec4_a};\nconst B_VEC4: bool = {vec4_b};\n\
             const PACKED_OUT: bool = {};",
            out_access.packed
        );
        s.push_str(MATMUL_BATCH_WGSL);
        if skinny {
            let _ = writeln!(s, "const ROWS: u32 = {m}u;");
            s.push_str(&MATMUL_SKINNY_WGSL.replace("//@DOT", if vec4_a { SKINNY_DOT_VEC4 } else { SKINNY_DOT }));
        } else {
            s.push_str(&unrolled(MATMUL_WGSL, tm, tn, tx));
        }
        s
    };
    device.dispatch(Dispatch {
        op: "matmul",
        runtime_checks: !skinny && a.dtype() == DType::F32 && b.dtype() == DType::F32,
        language: Language::Wgsl,
        key: &key,
        source: &source,
        buffers: &[out.buffer(), a.buffer(), b.buffer()],
        params: &params,
        workgroups: Gpu::grid((tiles * slices) as u32),
    })?;
    let out = if slices > 1 {
        split_sum(&out, &out_shape, SumOutput::F32)?
    } else {
        out
    };
    if direct { Ok(out) } else { out.to_dtype(dtype) }
}

/// `store_out` of an f32 output holding each value rounded to `half` (f16 or bf16, to nearest even): the product
/// autocast hands back, written by the product kernel itself rather than by a cast after it.
fn widened_store_fn(half: DType) -> String {
    let rounded = match half {
        DType::BF16 => "bitcast<f32>(f32_to_bf16(v0) << 16u)",
        _ => "unpack2x16float(f32_to_f16(v0)).x",
    };
    format!("fn store_out(w: u32, v0: f32, v1: f32) {{ out[w] = {rounded}; }}\n")
}

/// How a reduction of `k` (> 0) steps over `tiles` output tiles is cut into slices run side by side: about `target`
/// workgroups in all, slices of at least `min_slice` steps and a multiple of `step`. Returns the number of slices
/// and their length (the last one may be shorter).
pub(crate) fn split_k(tiles: usize, k: usize, target: usize, min_slice: usize, step: usize) -> (usize, usize) {
    let slices = (target / tiles.max(1)).min(k / min_slice).max(1);
    let slice_len = k.div_ceil(slices).next_multiple_of(step);
    (k.div_ceil(slice_len).max(1), slice_len)
}

/// The fewest slices (of at least `min_slice` steps, a multiple of `step`) that cut a reduction of `k` (> 0)
/// steps over `tiles` output tiles into workgroups filling their last wave to [`FULL_WAVES`] on a GPU that runs
/// `slots` at once, as (slices, slice length); `None` if no such split exists or if the tiles alone make
/// [`SPLIT_MAX_WAVES`] waves.
pub(crate) fn full_wave_split(
    tiles: usize,
    k: usize,
    slots: usize,
    min_slice: usize,
    step: usize,
) -> Option<(usize, usize)> {
    if tiles == 0 || slots == 0 || tiles >= SPLIT_MAX_WAVES * slots {
        return None;
    }
    (1..=(k / min_slice).max(1)).find_map(|wanted| {
        let len = k.div_ceil(wanted).next_multiple_of(step);
        let workgroups = tiles * k.div_ceil(len);
        let fullness = workgroups as f64 / (workgroups.div_ceil(slots) * slots) as f64;
        (fullness >= FULL_WAVES).then_some((k.div_ceil(len), len))
    })
}

/// What [`split_sum`] writes: the f32 sum, or it rounded to f16 or bf16 (to nearest even), in that type or widened
/// back to f32 (the products of autocast), so that no cast follows in launches of their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SumOutput {
    F32,
    /// In that type: f16 as such; bf16, stored two to a word, through the widened sum and a cast.
    Half(DType),
    HalfAsF32(DType),
}

/// The sum over the leading dimension of the partial products `partial` `[slices, ..shape]` (f32), in slice order.
pub(crate) fn split_sum(partial: &Tensor, shape: &[usize], output: SumOutput) -> Result<Tensor> {
    if output == SumOutput::Half(DType::BF16) {
        // Exact: the widened values are bf16 values already.
        return split_sum(partial, shape, SumOutput::HalfAsF32(DType::BF16))?.to_dtype(DType::BF16);
    }
    let device = partial.device();
    let n = numel(shape);
    let dtype = match output {
        SumOutput::Half(half) => half,
        _ => DType::F32,
    };
    let out = device.alloc("matmul_split_sum", Tensor::bytes_for(n, dtype))?;
    // A thread sums four outputs as one vec4 where they tile the rows: a quarter of the threads and loads.
    let lanes = if n.is_multiple_of(4) { 4 } else { 1 };
    device.dispatch(Dispatch {
        op: "matmul_split_sum",
        runtime_checks: false,
        language: Language::Wgsl,
        key: &format!("matmul_split_sum:{output:?}:{lanes}"),
        source: &|| {
            let (part, rounded) = match lanes {
                4 => (
                    "vec4<f32>",
                    "fn rounded(x: vec4<f32>) -> vec4<f32> {\n    \
                     return vec4<f32>(round16(x.x), round16(x.y), round16(x.z), round16(x.w));\n}\n",
                ),
                _ => ("f32", "fn rounded(x: f32) -> f32 { return round16(x); }\n"),
            };
            let (out, half) = match output {
                SumOutput::F32 => (
                    "alias OutType = Part;\nfn to_out(x: Part) -> OutType { return x; }\n".to_string(),
                    DType::F16,
                ),
                SumOutput::Half(half) => (
                    format!(
                        "enable f16;\nalias OutType = {};\nfn to_out(x: Part) -> OutType {{ return OutType(rounded(x)); }}\n",
                        part.replace("f32", "f16")
                    ),
                    half,
                ),
                SumOutput::HalfAsF32(half) => (
                    "alias OutType = Part;\nfn to_out(x: Part) -> OutType { return rounded(x); }\n".to_string(),
                    half,
                ),
            };
            let round16 = match half {
                DType::BF16 => "bitcast<f32>(f32_to_bf16(x) << 16u)",
                _ => "unpack2x16float(f32_to_f16(x)).x",
            };
            format!(
                "{out}alias Part = {part};\nfn round16(x: f32) -> f32 {{ return {round16}; }}\n{rounded}\
                 {MATMUL_SPLIT_SUM_WGSL}{COMMON_WGSL}"
            )
        },
        buffers: &[&out, partial.buffer()],
        params: &[(n / lanes) as u32, partial.shape()[0] as u32],
        workgroups: Gpu::grid((n / lanes).div_ceil(256) as u32),
    })?;
    Ok(Tensor::from_buffer(out, shape, dtype, None))
}

/// `load_{name}4(i)` through the scalar `load_{name}`: the tiled kernel calls it only with vec4 loads, but it must
/// exist for the kernel to compile.
pub(crate) fn load4_fn(name: &str) -> String {
    format!(
        "fn load_{name}4(i: u32) -> vec4<f32> {{\n    \
         return vec4<f32>(f32(load_{name}(i)), f32(load_{name}(i + 1u)), f32(load_{name}(i + 2u)), \
         f32(load_{name}(i + 3u)));\n}}\n"
    )
}

/// The kernel template with its `//@` blocks unrolled over a `tm` x `tn` micro-tile per thread, in workgroups of
/// 16 x `tx` threads: accumulators `c{row}_{column group}` (vec4 over four columns), fetch registers `ra{e}` /
/// `rb{e}` (vec4 groups). Rows of a thread are `ty * 4 + r` plus multiples of 64, columns `tx * 4 + c` plus
/// multiples of `4 tx`, so that the vec4 reads of workgroup memory by a warp hit consecutive addresses. The
/// multiply-add steps over the `BK` rows of a staged slice are unrolled too, with constant row offsets: the NVIDIA
/// driver leaves the loop rolled, and unrolling it took the H200 from 24 to 36 TFLOP/s on f32 4096^3.
pub(crate) fn unrolled(template: &str, tm: usize, tn: usize, tx: usize) -> String {
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
    for (name, count) in [("a", 4 * tm / tx), ("b", tn / 4)] {
        for e in 0..count {
            let _ = writeln!(decl, "    var r{name}{e} = vec4<f32>();");
            let _ = writeln!(fetch, "        r{name}{e} = fetch_{name}({e}u, k0);");
            let _ = writeln!(stash, "        stash_{name}({e}u, r{name}{e});");
        }
    }
    for g in 0..tm / 4 {
        let _ = writeln!(step, "            let a{g} = As[k][{}u + ty];", 16 * g);
    }
    for j in 0..tn / 4 {
        let _ = writeln!(step, "            let b{j} = Bs[k][{}u + tx];", tx * j);
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
                4 * tx * j
            );
        }
        store.push_str("    }\n");
    }
    let steps: String = (0..BK)
        .map(|k| format!("        {{\n            let k = {k}u;\n{step}        }}\n"))
        .collect();
    let mut s = format!(
        "const BK: u32 = {BK}u;\nconst TX: u32 = {tx}u;\nconst THREADS: u32 = {}u;\n",
        16 * tx
    );
    for line in template.lines() {
        let block = match line.trim() {
            "//@DECL" => decl.as_str(),
            "//@FETCH" => fetch.as_str(),
            "//@STASH" => stash.as_str(),
            "//@STEPS" => steps.as_str(),
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

#[cfg(test)]
mod tests {
    use super::{SumOutput, full_wave_split, split_sum};
    use crate::tensor::{Tensor, default_device};
    use hierarchos_wgpu::DType;

    /// Every output kind against the sum in slice order, bit for bit (on lavapipe too, where no product takes the
    /// 16-bit outputs: they serve the tensor-core kernel).
    #[test]
    fn split_sums_add_slices_in_order() {
        let d = default_device().unwrap();
        for (slices, n) in [
            (1, 8),
            (3, 12),
            (7, 1028),
            (5, 7),
            (6, 1030),
            (2, 4),
            (4, 3),
            (9, 2052),
            (8, 1),
        ] {
            let values: Vec<f32> = (0..slices * n)
                .map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 0.37 + (i % 3) as f32 * 1e-4)
                .collect();
            let partial = Tensor::from_slice(&values, &[slices, n], &d).unwrap();
            let want: Vec<f32> = (0..n)
                .map(|i| (1..slices).fold(values[i], |acc, s| acc + values[s * n + i]))
                .collect();
            let rounded: Vec<f32> = want.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect();
            let rounded_bf16: Vec<f32> = want.iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect();
            let outputs = [
                (SumOutput::F32, &want, DType::F32),
                (SumOutput::HalfAsF32(DType::F16), &rounded, DType::F32),
                (SumOutput::Half(DType::F16), &rounded, DType::F16),
                (SumOutput::HalfAsF32(DType::BF16), &rounded_bf16, DType::F32),
                (SumOutput::Half(DType::BF16), &rounded_bf16, DType::BF16),
            ];
            // f16 storage needs the adapter's f16 support (`HIERARCHOS_DISABLE=f16` takes it away).
            for (output, expected, dtype) in outputs.into_iter().filter(|o| d.caps().f16 || o.2 != DType::F16) {
                let got = split_sum(&partial, &[n], output).unwrap();
                assert_eq!(got.dtype(), dtype);
                let got = got.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
                assert_eq!(&got, expected, "{output:?}, {slices} slices of {n}");
            }
        }
    }

    /// The 110M Llama shape's long products on an H200 (132 multiprocessors, 264 resident workgroups).
    #[test]
    fn splits_fill_whole_waves() {
        let split = |tiles, k| full_wave_split(tiles, k, 264, 512, 16);
        // [768, 768] weight gradients: 36 tiles x 7 slices = 252 workgroups, one wave (8 would spill into a second).
        assert_eq!(split(36, 4096), Some((7, 592)));
        // [768, 3072] weight gradients: 144 x 5 = 720 of 3 waves' 792 (91%; 7 slices would fill 95% of 4 waves).
        assert_eq!(split(144, 4096), Some((5, 832)));
        // [4096, 768] input gradients over K = 3072 and 32000: 192 x 4 = 768 of 792.
        assert_eq!(split(192, 3072), Some((4, 768)));
        assert_eq!(split(192, 32000), Some((4, 8000)));
        // A full wave already.
        assert_eq!(split(256, 4096), Some((1, 4096)));
        // Many waves of tiles, or no split that fills a wave (prefill's [512, 768] products, 24 tiles).
        assert_eq!(split(1500, 4096), None);
        assert_eq!(split(24, 3072), None);
    }
}
