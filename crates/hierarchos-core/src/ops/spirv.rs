//! The SPIR-V of the GLSL kernels, compiled by build.rs (`MATMUL_COOP_SPIRV`, `FLASH_ATTENTION_COOP_SPIRV`).

include!(concat!(env!("OUT_DIR"), "/spirv.rs"));
