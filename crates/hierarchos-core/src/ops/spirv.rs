//! The SPIR-V of the GLSL kernels, compiled by build.rs (`MATMUL_COOP_SPIRV`, `FLASH_ATTENTION_COOP_SPIRV`).

include!(concat!(env!("OUT_DIR"), "/spirv.rs"));

/// The index of the variant compiled for cooperative matrices of `edge` (the first index of both SPIR-V tables):
/// build.rs compiles fragments of 16, then of 8.
pub(crate) fn coop_variant(edge: u32) -> usize {
    (edge != 16) as usize
}
