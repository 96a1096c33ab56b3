//! How the runtime picks an adapter and which hardware features it may use.

use std::path::PathBuf;

/// Choices made when a [`crate::Gpu`] is opened. [`GpuOptions::from_env`] reads them from the environment so
/// that tests and users can switch kernels without recompiling.
#[derive(Clone, Debug)]
pub struct GpuOptions {
    /// Pick the adapter whose name contains this text (case-insensitive), or whose index in
    /// [`crate::list_adapters`] this is. `None`: prefer a discrete GPU, then integrated, then anything.
    pub adapter: Option<String>,
    /// Use subgroup operations where the adapter has them.
    pub subgroups: bool,
    /// Use native f16 storage where the adapter has `SHADER_F16`.
    pub f16: bool,
    /// Use cooperative-matrix (tensor core) kernels where the adapter has them.
    pub cooperative_matrix: bool,
    /// Also use them for bf16 products where the driver multiplies bf16 cooperative matrices.
    pub bf16_cooperative_matrix: bool,
    /// Time every kernel on the GPU with timestamp queries ([`crate::Gpu::profile`]); each batch then waits
    /// for its timings, so wall-clock throughput drops while the per-kernel times stay right.
    pub profile: bool,
    /// Most bytes of buffers the device may hold (in use and pooled for reuse). Past it an allocation trims the
    /// pool and then fails with [`crate::GpuError::OutOfMemory`]: a budget on a shared GPU, and a clean error
    /// where the driver would report running out late or not at all (browsers, software drivers).
    pub memory_limit: Option<u64>,
    /// Folder where compiled kernels are kept between runs (one file per adapter), so a warm start compiles
    /// nothing. `None` turns it off; it is always off on the web.
    pub pipeline_cache: Option<PathBuf>,
    /// Keep the checks wgpu adds to every kernel: each array index clamped, each loop bounded by a counter, each
    /// integer division checked. Off by default, since every kernel bounds its own loops and clamps or masks its
    /// own indices (and the driver's robust buffer access still guards the buffers): on the H200 the checks cost
    /// the tensor-core products 30%, flash attention's backward half its speed and decoding 45% of its tokens/s
    /// (BENCHMARKS.md). On (`HIERARCHOS_SHADER_CHECKS=1`) to rule a kernel bug out.
    pub shader_checks: bool,
    /// Ask the adapter how many multiprocessors it has ([`crate::Caps::multiprocessors`]); off, kernels size their
    /// launches as on any GPU.
    pub multiprocessors: bool,
}

/// `<user cache folder>/hierarchos/pipelines` (e.g. `~/.cache/hierarchos/pipelines` on Linux).
fn default_pipeline_cache() -> Option<PathBuf> {
    #[cfg(not(target_arch = "wasm32"))]
    return dirs::cache_dir().map(|d| d.join("hierarchos").join("pipelines"));
    #[cfg(target_arch = "wasm32")]
    None
}

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions {
            adapter: None,
            subgroups: true,
            f16: true,
            cooperative_matrix: true,
            bf16_cooperative_matrix: true,
            profile: false,
            memory_limit: None,
            pipeline_cache: default_pipeline_cache(),
            shader_checks: false,
            multiprocessors: true,
        }
    }
}

impl GpuOptions {
    /// Options from `HIERARCHOS_ADAPTER` (name part or index), `HIERARCHOS_PROFILE=1`,
    /// `HIERARCHOS_MEMORY_LIMIT_MIB`, `HIERARCHOS_PIPELINE_CACHE` (a folder), `HIERARCHOS_SHADER_CHECKS=1` and
    /// `HIERARCHOS_DISABLE`, a comma-separated list of `subgroup`, `f16`, `coopmat`, `coopmat_bf16`,
    /// `multiprocessors` (so the portable fallback kernels and launch sizes can be exercised) and `pipeline_cache`
    /// to turn off.
    pub fn from_env() -> Self {
        let memory_limit = std::env::var("HIERARCHOS_MEMORY_LIMIT_MIB").ok().and_then(|v| {
            let bytes = v.trim().parse::<u64>().ok().and_then(|mib| mib.checked_mul(1 << 20));
            if bytes.is_none() {
                tracing::warn!("HIERARCHOS_MEMORY_LIMIT_MIB={v}: not a number of MiB below 2^44, ignored");
            }
            bytes
        });
        let mut o = GpuOptions {
            adapter: std::env::var("HIERARCHOS_ADAPTER").ok(),
            profile: std::env::var("HIERARCHOS_PROFILE").is_ok_and(|v| v == "1"),
            shader_checks: std::env::var("HIERARCHOS_SHADER_CHECKS").is_ok_and(|v| v == "1"),
            memory_limit,
            pipeline_cache: std::env::var_os("HIERARCHOS_PIPELINE_CACHE")
                .map(PathBuf::from)
                .or_else(default_pipeline_cache),
            ..GpuOptions::default()
        };
        if let Ok(list) = std::env::var("HIERARCHOS_DISABLE") {
            for item in list.split(',').map(str::trim) {
                match item {
                    "subgroup" | "subgroups" => o.subgroups = false,
                    "f16" => o.f16 = false,
                    "coopmat" | "cooperative_matrix" => o.cooperative_matrix = false,
                    "coopmat_bf16" => o.bf16_cooperative_matrix = false,
                    "multiprocessors" => o.multiprocessors = false,
                    "pipeline_cache" => o.pipeline_cache = None,
                    "" => {}
                    other => {
                        tracing::warn!("HIERARCHOS_DISABLE: unknown feature '{other}' ignored")
                    }
                }
            }
        }
        o
    }
}
