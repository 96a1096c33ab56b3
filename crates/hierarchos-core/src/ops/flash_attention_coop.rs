//! Flash attention on tensor cores under `autocast(f16)`: the three kernels of [`Tensor::flash_attention`] with
//! every product on cooperative matrices (`wgsl/flash_attention_coop_*.glsl`, compiled to SPIR-V at build time and
//! passed through wgpu as is), in the precision of torch's flash attention under autocast: f16 operands and
//! probabilities, f32 scores, statistics and sums. They take the same launch parameters and bindings as the
//! portable kernels, so the op only chooses which to record.
//!
//! [`Tensor::flash_attention`]: crate::tensor::Tensor::flash_attention

use hierarchos_wgpu::{DType, Dispatch, Language};

use crate::autocast::autocast_dtype;
use crate::error::Result;
use crate::ops::spirv::{FLASH_ATTENTION_COOP_SPIRV, coop_variant};
use crate::tensor::{Device, Tensor};

const COMMON: &str = include_str!("../../../../wgsl/flash_attention_coop_common.glsl");
/// The GLSL of each kernel (for its bindings), in the order of each variant of `FLASH_ATTENTION_COOP_SPIRV`.
const KERNELS: [&str; 3] = [
    include_str!("../../../../wgsl/flash_attention_coop_forward.glsl"),
    include_str!("../../../../wgsl/flash_attention_coop_dq.glsl"),
    include_str!("../../../../wgsl/flash_attention_coop_dkv.glsl"),
];
/// The one head size the kernels are written for (the 110M Llama shape's, and most small models').
const HEAD: usize = 64;

/// Rows each workgroup owns (queries, or keys for the key/value gradients) with fragments of `edge`: four
/// subgroups of `edge` rows.
fn tile(edge: u32) -> usize {
    4 * edge as usize
}

/// Workgroup memory the largest of the kernels declares with fragments of `edge` (the key/value kernel: three f16
/// tiles, one f32 score tile and two rows of statistics): 46 KiB with fragments of 16, 23 with fragments of 8.
fn workgroup_bytes(edge: u32) -> usize {
    let tile = tile(edge);
    3 * tile * 72 * 2 + tile * 72 * 4 + 2 * tile * 4
}

/// Whether attention of `q` over `k`, `v` (f32, `[B, H, T, D]` and `[B, KVH, S, D]`) runs on tensor cores: inside
/// `autocast(f16)`, on an adapter with f16 cooperative matrices (of 16 or 8, which the runtime pairs with
/// subgroups of 32 or 8) and the workgroup memory the kernels take, for heads of 64 read as vectors of four (unit
/// stride along d; offsets and other strides multiples of 4).
pub(crate) fn fits(q: &Tensor, k: &Tensor, v: &Tensor) -> bool {
    let device: &Device = q.device();
    let memory = device.limits().max_compute_workgroup_storage_size as usize;
    autocast_dtype() == Some(DType::F16)
        && device
            .caps()
            .cooperative_matrix
            .is_some_and(|edge| memory >= workgroup_bytes(edge))
        && q.shape()[3] == HEAD
        && [q, k, v].iter().all(|t| t.layout().rows_of_vec4s())
}

/// Records kernel `index` (0 forward, 1 query gradients, 2 key/value gradients) with `buffers` bound as the
/// portable kernel binds them, over `rows` (query or key rows) of each of `heads` sequence heads.
pub(crate) fn launch(
    op: &str,
    index: usize,
    words: &[u32],
    buffers: &[&Tensor],
    [rows, heads]: [usize; 2],
) -> Result<()> {
    let device: &Device = buffers[0].device();
    let raw: Vec<_> = buffers.iter().map(|t| t.buffer()).collect();
    let edge = device.caps().cooperative_matrix.expect("checked by fits");
    let variant = coop_variant(edge);
    device.dispatch(Dispatch {
        op,
        runtime_checks: false,
        language: Language::Spirv(FLASH_ATTENTION_COOP_SPIRV[variant][index]),
        key: &format!("flash_attention_coop:{variant}:{index}"),
        source: &|| format!("{COMMON}{}", KERNELS[index]),
        buffers: &raw,
        params: words,
        workgroups: [rows.div_ceil(tile(edge)) as u32, heads as u32, 1],
    })?;
    Ok(())
}
