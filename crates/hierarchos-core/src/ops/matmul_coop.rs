//! The f16 and bf16 matrix product on tensor cores through cooperative matrices: products of square 16-bit
//! fragments (16 x 16 on NVIDIA, 8 x 8 on lavapipe) accumulated in f32, in a GLSL kernel for Vulkan
//! (`wgsl/matmul_coop.glsl`, compiled to SPIR-V at build time and passed through wgpu as is; bf16 where the driver
//! multiplies bf16 fragments). It takes products of any shape past the skinny kernel's whose operands it reads
//! eight halves at a time; everything else runs the portable kernels.

use hierarchos_wgpu::{DType, Dispatch, Gpu, Language};

use crate::error::Result;
use crate::ops::matmul::{SKINNY_MAX_ROWS, SumOutput, split_k, split_sum};
use crate::ops::spirv::{MATMUL_COOP_SPIRV, coop_variant};
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

/// Whether `la` `[batch.., M, K]` @ `lb` `[batch.., K, N]` of f16 or bf16 operands on `device` runs on cooperative
/// matrices: the adapter has them for that type (the runtime pairs fragments of 16 with subgroups of 32 and of 8
/// with subgroups of 8, as the kernel's split of a workgroup into blocks of 4 x 4 fragments needs), one batch
/// entry, more rows than the skinny kernel takes, and operands that load eight halves at a time
/// ([`loads_eights`]).
pub(crate) fn fits(device: &Gpu, dtypes: [DType; 2], la: &Layout, lb: &Layout) -> bool {
    let caps = device.caps();
    let r = la.rank();
    caps.cooperative_matrix.is_some()
        && (dtypes == [DType::F16, DType::F16]
            || (dtypes == [DType::BF16, DType::BF16] && caps.bf16_cooperative_matrix))
        && la.shape[..r - 2].iter().all(|&d| d == 1)
        && la.shape[r - 2] > SKINNY_MAX_ROWS
        && lb.shape[r - 1] > 0
        && la.shape[r - 1] > 0
        && loads_eights(la)
        && loads_eights(lb)
}

/// Whether the kernel stages `l` (the last two dimensions) transposed: unit stride along its outer dimension, as
/// in a transposed weight (`x @ W.t()`, read along K) or a transposed left operand (`g.t() @ x`, read along M).
fn along_outer(l: &Layout) -> bool {
    let r = l.rank();
    l.strides[r - 2] == 1 && l.strides[r - 1] != 1
}

/// Whether the kernel reads `l` eight halves at a time: unit stride along the dimension it reads along
/// ([`along_outer`]), whose length is a multiple of 8, and an offset and other stride that are too.
fn loads_eights(l: &Layout) -> bool {
    let r = l.rank();
    let (unit, other) = if along_outer(l) { (r - 2, r - 1) } else { (r - 1, r - 2) };
    l.strides[unit] == 1
        && l.shape[unit].is_multiple_of(8)
        && l.strides[other].is_multiple_of(8)
        && l.offset.is_multiple_of(8)
}

/// Launches the kernel for `la` `[M, K]` and `lb` `[K, N]` of f16 or bf16 operands that [`fits`] allowed; returns
/// the dense `[M, N]` product in their type, or with `widen` the same values as f32. Shapes that do not fill whole
/// tiles take the kernel's EDGES variant, which checks every load and the stores of the tiles on the edges.
pub(crate) fn launch(a: &Tensor, la: &Layout, b: &Tensor, lb: &Layout, widen: bool) -> Result<Tensor> {
    let r = la.rank();
    let (m, k, n) = (la.shape[r - 2], la.shape[r - 1], lb.shape[r - 1]);
    let device = a.device();
    let edges = !(m.is_multiple_of(TILE_M) && n.is_multiple_of(TILE_N) && k.is_multiple_of(STEP));
    let tiles = m.div_ceil(TILE_M) * n.div_ceil(TILE_N);
    // Few tiles over a long reduction (the weight gradients of small layers) leave most of a large GPU idle:
    // split K into slices whose f32 partial products are added afterwards.
    let (slices, slice_len) = split_k(tiles, k, SPLIT_K_TARGET_WORKGROUPS, SPLIT_K_MIN_SLICE, STEP);
    let half = a.dtype();
    let out_dtype = if slices > 1 || widen { DType::F32 } else { half };
    let out = device.alloc("matmul", Tensor::bytes_for(slices * m * n, out_dtype))?;
    let out = Tensor::from_buffer(out, &[slices, m, n], out_dtype, None);
    // A transposed weight (`x @ W.t()`) has unit stride along K: staged as [n][k] rows; a transposed left
    // operand (`g.t() @ x`) along M: staged as [k][m] rows.
    let (a_along_m, b_along_k) = (along_outer(la), along_outer(lb));
    let params = [
        m as u32,
        n as u32,
        k as u32,
        la.offset as u32,
        la.strides[if a_along_m { r - 1 } else { r - 2 }] as u32,
        lb.offset as u32,
        lb.strides[if b_along_k { r - 1 } else { r - 2 }] as u32,
        n.div_ceil(TILE_N) as u32,
        slice_len as u32,
        slices as u32,
    ];
    let partial = slices > 1;
    // The variants as build.rs orders them: f16, bf16; then the kernel's defines FRAG 16, 8; EDGES; A_ALONG_M;
    // B_ALONG_K; OUTPUT_F16 (the operands' type), OUTPUT_WIDE, OUTPUT_PARTIAL.
    let bf16 = half == DType::BF16;
    let frag = coop_variant(device.caps().cooperative_matrix.expect("checked by fits"));
    let output = match (partial, widen) {
        (true, _) => 2,
        (false, true) => 1,
        (false, false) => 0,
    };
    device.dispatch(Dispatch {
        op: "matmul",
        runtime_checks: false,
        language: Language::Spirv(
            MATMUL_COOP_SPIRV[bf16 as usize][frag][edges as usize][a_along_m as usize][b_along_k as usize][output],
        ),
        key: &format!("matmul_coop:{half}:{frag}:{edges}:{a_along_m}:{b_along_k}:{output}"),
        source: &|| MATMUL_COOP_GLSL.to_string(),
        buffers: &[out.buffer(), a.buffer(), b.buffer()],
        params: &params,
        workgroups: Gpu::grid((tiles * slices) as u32),
    })?;
    match (partial, widen) {
        (true, true) => split_sum(&out, &[m, n], SumOutput::HalfAsF32(half)),
        (true, false) => split_sum(&out, &[m, n], SumOutput::Half(half)),
        (false, _) => out.reshape(&[m, n]),
    }
}
