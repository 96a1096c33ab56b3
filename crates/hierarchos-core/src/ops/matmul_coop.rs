//! The f16 matrix product on tensor cores through cooperative matrices: 16 x 16 x 16 products of f16 fragments
//! accumulated in f32, in a GLSL kernel for Vulkan (`wgsl/matmul_coop.glsl`, compiled to SPIR-V at build time and
//! passed through wgpu as is). It takes the products whose shapes fill its 128 x 128 tiles; everything else runs
//! the portable tiled kernel.

use hierarchos_wgpu::{DType, Dispatch, Gpu, Language};

use crate::error::Result;
use crate::ops::matmul::{SumOutput, split_k, split_sum};
use crate::ops::spirv::MATMUL_COOP_SPIRV;
use crate::shape::Layout;
use crate::tensor::Tensor;

const MATMUL_COOP_GLSL: &str = include_str!("../../../../wgsl/matmul_coop.glsl");

/// Output tile of one workgroup (rows and columns) and the reduction steps staged at a time.
const TILE_M: usize = 128;
const TILE_N: usize = 128;
const STEP: usize = 32;
/// A product of fewer tiles than this is split along K until it has about this many workgroups (two per
/// multiprocessor of an H200, which holds two of these workgroups at a time). Measured there (with the WGSL
/// version of the kernel): the 768 x 768 weight gradients of the 110M shape (36 tiles over K = 4096) ran at 96
/// TFLOP/s in 7 slices against 75 in 3 (a target of 132); the `[4096, 768]` products (192 tiles) stay whole...
const SPLIT_K_TARGET_WORKGROUPS: usize = 264;
/// ...with slices of at least this many steps of the reduction.
const SPLIT_K_MIN_SLICE: usize = 256;

/// Whether `la` `[batch.., M, K]` @ `lb` `[batch.., K, N]` of f16 operands on `device` runs on cooperative matrices:
/// the adapter has them (16 x 16 f16 into f32), native f16 storage, subgroups of exactly 32 (the kernel's layout
/// of four subgroups), one batch entry, dimensions that fill whole tiles, and operands that load eight halves at
/// a time (unit stride along either dimension; offsets and other strides multiples of 8).
pub(crate) fn fits(device: &Gpu, dtypes: [DType; 2], la: &Layout, lb: &Layout) -> bool {
    let caps = device.caps();
    let r = la.rank();
    let (m, k, n) = (la.shape[r - 2], la.shape[r - 1], lb.shape[r - 1]);
    let eights = |l: &Layout, unit: usize, other: usize| {
        l.strides[unit] == 1 && l.strides[other].is_multiple_of(8) && l.offset.is_multiple_of(8)
    };
    caps.cooperative_matrix
        && caps.f16
        && caps.subgroups
        && caps.subgroup_size == (32, 32)
        && dtypes == [DType::F16, DType::F16]
        && la.shape[..r - 2].iter().all(|&d| d == 1)
        && m.is_multiple_of(TILE_M)
        && n.is_multiple_of(TILE_N)
        && k.is_multiple_of(STEP)
        && k > 0
        && (eights(la, r - 1, r - 2) || eights(la, r - 2, r - 1))
        && (eights(lb, r - 1, r - 2) || eights(lb, r - 2, r - 1))
}

/// Launches the kernel for `la` `[M, K]` and `lb` `[K, N]` of f16 operands that [`fits`] allowed; returns the
/// dense f16 `[M, N]` product, or with `widen` the same values as f32.
pub(crate) fn launch(a: &Tensor, la: &Layout, b: &Tensor, lb: &Layout, widen: bool) -> Result<Tensor> {
    let r = la.rank();
    let (m, k, n) = (la.shape[r - 2], la.shape[r - 1], lb.shape[r - 1]);
    let device = a.device();
    let tiles = (m / TILE_M) * (n / TILE_N);
    // Few tiles over a long reduction (the weight gradients of small layers) leave most of a large GPU idle:
    // split K into slices whose f32 partial products are added afterwards.
    let (slices, slice_len) = split_k(tiles, k, SPLIT_K_TARGET_WORKGROUPS, SPLIT_K_MIN_SLICE, STEP);
    let out_dtype = if slices > 1 || widen { DType::F32 } else { DType::F16 };
    let out = device.alloc("matmul", Tensor::bytes_for(slices * m * n, out_dtype))?;
    let out = Tensor::from_buffer(out, &[slices, m, n], out_dtype, None);
    // A transposed weight (`x @ W.t()`) has unit stride along K: staged as [n][k] rows; a transposed left
    // operand (`g.t() @ x`) along M: staged as [k][m] rows.
    let b_along_k = lb.strides[r - 2] == 1 && lb.strides[r - 1] != 1;
    let a_along_m = la.strides[r - 2] == 1 && la.strides[r - 1] != 1;
    let params = [
        m as u32,
        n as u32,
        k as u32,
        la.offset as u32,
        la.strides[if a_along_m { r - 1 } else { r - 2 }] as u32,
        lb.offset as u32,
        lb.strides[if b_along_k { r - 1 } else { r - 2 }] as u32,
        (n / TILE_N) as u32,
        slice_len as u32,
        slices as u32,
    ];
    let partial = slices > 1;
    // The kernel's OUTPUT, as build.rs orders the compiled variants: OUTPUT_F16, OUTPUT_WIDE, OUTPUT_PARTIAL.
    let output = match (partial, widen) {
        (true, _) => 2,
        (false, true) => 1,
        (false, false) => 0,
    };
    device.dispatch(Dispatch {
        op: "matmul",
        runtime_checks: false,
        language: Language::Spirv(MATMUL_COOP_SPIRV[a_along_m as usize][b_along_k as usize][output]),
        key: &format!("matmul_coop:{a_along_m}:{b_along_k}:{output}"),
        source: &|| MATMUL_COOP_GLSL.to_string(),
        buffers: &[out.buffer(), a.buffer(), b.buffer()],
        params: &params,
        workgroups: Gpu::grid((tiles * slices) as u32),
    })?;
    match (partial, widen) {
        (true, true) => split_sum(&out, &[m, n], SumOutput::F16AsF32),
        (true, false) => split_sum(&out, &[m, n], SumOutput::F16),
        (false, _) => out.reshape(&[m, n]),
    }
}
