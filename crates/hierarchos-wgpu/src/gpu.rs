//! The device: adapter choice, feature detection, buffer pool, pipeline cache and batched dispatch.

use rustc_hash::FxHashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::error::{GpuError, Result};
use crate::options::GpuOptions;
#[cfg(not(target_arch = "wasm32"))]
use crate::pipeline_cache::DiskCache;
use crate::profiler::{KernelTime, Profiler};

/// Size in bytes of the per-batch parameter arena; a batch is submitted when it fills.
const PARAM_ARENA_BYTES: u64 = 1 << 16;
/// Dispatches recorded before the batch is submitted even if nobody waits for it, so the GPU starts while the
/// host records the rest (at decode time the GPU would otherwise idle until the host asks for the logits).
const MAX_DISPATCHES_PER_SUBMIT: usize = 48;
/// The largest staging buffer kept for reuse after a read to the host: enough for a row of logits of a batch of
/// sequences (generation reads every token), small against what a model's weights take.
const STAGING_POOLED: u64 = 16 << 20;

/// The first batch after the host waited for the GPU (which is then idle) is this small, and each following one
/// twice as large up to [`MAX_DISPATCHES_PER_SUBMIT`]: the GPU starts on a decode step's first kernels while the
/// host is still recording the rest.
const FIRST_BATCH_AFTER_IDLE: usize = 4;
/// Largest workgroup count per grid dimension that every WebGPU device accepts.
const MAX_GRID_DIM: u32 = 65535;
/// Buffers a launch may bind besides the parameters and still have its bind group cached.
const MAX_CACHED_BINDINGS: usize = 12;
/// Cached bind groups kept before the cache starts over (each pins its buffers, which the pool holds anyway).
const MAX_CACHED_BIND_GROUPS: usize = 4096;

/// What the opened device can do and what Hierarchos chose to use.
#[derive(Clone, Debug)]
pub struct Caps {
    /// Subgroup operations are used.
    pub subgroups: bool,
    /// Smallest and largest subgroup size the adapter reports.
    pub subgroup_size: (u32, u32),
    /// f16 is stored natively (`SHADER_F16`); otherwise packed two per word.
    pub f16: bool,
    /// Timestamp queries are available for profiling.
    pub timestamps: bool,
    /// The edge of the square cooperative matrices (tensor cores) the kernels use, where the adapter multiplies
    /// f16 ones into f32 ones, takes SPIR-V (the kernels are written in GLSL), uses f16 and subgroups, and has
    /// subgroups of the one width the kernels' layout takes for that edge: 16 with subgroups of 32 (NVIDIA's
    /// tensor cores), 8 with subgroups of 8 (lavapipe's, through which CI runs the tensor-core kernels).
    pub cooperative_matrix: Option<u32>,
    /// The same cooperative matrices also multiply bf16 ones into f32 (`VK_KHR_shader_bfloat16`, enabled on the
    /// device), so bf16 products run the tensor-core kernels too.
    pub bf16_cooperative_matrix: bool,
    /// The device takes SPIR-V as is (Vulkan, natively), so kernels in [`Language::Spirv`] run.
    pub spirv_passthrough: bool,
    /// Multiprocessors (SMs, compute units), where the adapter tells (NVIDIA under Vulkan): products split along
    /// K to launch whole waves of workgroups.
    pub multiprocessors: Option<u32>,
}

impl Caps {
    /// The operand types the tensor-core kernels multiply here, as `hierarchos info` and the Studio show them.
    pub fn cooperative_matrix_types(&self) -> &'static str {
        if self.bf16_cooperative_matrix {
            "f16, bf16"
        } else {
            "f16"
        }
    }
}

/// Bytes the pool hands out and keeps.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryStats {
    /// Bytes in buffers held by live tensors.
    pub live_bytes: u64,
    /// The largest `live_bytes` seen since the device opened or [`Gpu::reset_peak`].
    pub peak_bytes: u64,
    /// Bytes in free buffers kept for reuse.
    pub pooled_bytes: u64,
    /// Bytes in host-readable buffers of reads to the host, in flight or kept for the next small read: they count
    /// against [`crate::GpuOptions::memory_limit`] too (on integrated GPUs they are the same memory).
    pub staging_bytes: u64,
}

/// A description of one adapter, for `hierarchos info` and for choosing one.
#[derive(Clone, Debug)]
pub struct AdapterSummary {
    /// Index in enumeration order (what `HIERARCHOS_ADAPTER=N` selects).
    pub index: usize,
    /// wgpu's adapter info: name, backend, driver, device type.
    pub info: wgpu::AdapterInfo,
}

/// One GPU device with everything needed to run kernels on it. Shared as `Arc<Gpu>` by all tensors on it.
pub struct Gpu {
    instance: wgpu::Instance,
    adapter: wgpu::Adapter,
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    limits: wgpu::Limits,
    features: wgpu::Features,
    caps: Caps,
    errors: Arc<Mutex<Vec<wgpu::Error>>>,
    state: Mutex<State>,
    params_buffer: wgpu::Buffer,
    dispatched: std::sync::atomic::AtomicU64,
    memory_limit: Option<u64>,
    shader_checks: bool,
    #[cfg(not(target_arch = "wasm32"))]
    pipeline_cache: Option<DiskCache>,
}

/// The maps looked up on every launch hash with FxHash: the kernel keys are long strings, and SipHash over them
/// showed in host profiles of decoding.
#[derive(Default)]
struct State {
    free: FxHashMap<u64, Vec<Pooled>>,
    released_in_batch: Vec<(u64, Pooled)>,
    pipelines: FxHashMap<String, Arc<Kernel>>,
    /// Bind groups by kernel and buffers: a decode step launches the same kernels on the same pooled buffers
    /// token after token, and creating a bind group per launch cost more host time than the launch itself.
    bind_groups: FxHashMap<BindKey, wgpu::BindGroup>,
    next_id: u64,
    staging: FxHashMap<u64, Vec<wgpu::Buffer>>,
    encoder: Option<wgpu::CommandEncoder>,
    /// The compute pass open on `encoder`: consecutive dispatches share it (a pass per dispatch costs CPU time
    /// in wgpu); copies and clears end it first.
    pass: Option<wgpu::ComputePass<'static>>,
    params: Vec<u8>,
    dispatches: usize,
    /// Dispatches the open batch may take before it is submitted (see [`FIRST_BATCH_AFTER_IDLE`]).
    batch_limit: usize,
    /// Batches submitted so far (tells a readback whether work was submitted after its copy).
    submitted: u64,
    profiler: Option<Profiler>,
    stats: MemoryStats,
}

/// A compiled kernel and the layout its bind groups are made for (looked up once, not per launch).
struct Kernel {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
    id: u64,
}

/// A buffer in the pool with the identity bind groups are cached under (never reused by another buffer).
struct Pooled {
    buffer: wgpu::Buffer,
    id: u64,
}

/// What a cached bind group binds: the kernel's layout, the size of the parameter window, the buffers.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct BindKey {
    kernel: u64,
    window: u64,
    buffers: [u64; MAX_CACHED_BINDINGS],
}

/// A pooled storage buffer. Dropping it gives it back to the pool of its device.
pub struct GpuBuffer {
    buffer: Option<Pooled>,
    class: u64,
    gpu: Arc<Gpu>,
}

impl GpuBuffer {
    /// The wgpu buffer.
    pub fn raw(&self) -> &wgpu::Buffer {
        &self.pooled().buffer
    }

    fn pooled(&self) -> &Pooled {
        self.buffer.as_ref().expect("buffer present until drop")
    }

    /// Capacity in bytes (the size class, at least what was asked for).
    pub fn size(&self) -> u64 {
        self.class
    }

    /// The device that owns this buffer.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }
}

impl Drop for GpuBuffer {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            let mut st = self.gpu.lock();
            st.stats.live_bytes -= self.class;
            st.stats.pooled_bytes += self.class;
            // With no batch open nothing recorded reads it any more: any use, an upload's included, may take it.
            match st.encoder {
                Some(_) => st.released_in_batch.push((self.class, buffer)),
                None => st.free.entry(self.class).or_default().push(buffer),
            }
        }
    }
}

impl std::fmt::Debug for GpuBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuBuffer({} bytes)", self.class)
    }
}

/// One kernel launch: the compiled kernel is looked up by `key` and built from `source()` on a miss.
pub struct Dispatch<'a> {
    /// Operation name, used in labels and error messages.
    pub op: &'a str,
    /// Pipeline cache key: the kernel and all its specializations (dtypes, variants).
    pub key: &'a str,
    /// Compile the kernel with the checks wgpu inserts (clamped indices, bounded loops, checked integer
    /// division), which every other kernel goes without (see [`crate::GpuOptions::shader_checks`]). Only for
    /// the f32 tiled product, which the NVIDIA driver runs faster with them (H200 4096³: 43.0 against 39.1
    /// TFLOP/s; BENCHMARKS.md).
    pub runtime_checks: bool,
    /// What the kernel is compiled from.
    pub language: Language<'a>,
    /// Makes the kernel's source; only called when the pipeline is not cached yet.
    pub source: &'a dyn Fn() -> String,
    /// Buffers bound at bindings 1, 2, ... in order (binding 0 holds `params`).
    pub buffers: &'a [&'a GpuBuffer],
    /// Kernel parameters, bound at binding 0 as `array<u32>`.
    pub params: &'a [u32],
    /// Workgroup grid, as returned by [`Gpu::grid`].
    pub workgroups: [u32; 3],
}

/// What a kernel is compiled from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Language<'a> {
    /// The WGSL that [`Dispatch::source`] returns, which every backend runs: all kernels but the few below.
    Wgsl,
    /// SPIR-V compiled at build time from GLSL for Vulkan, for what WGSL cannot express yet, passed to the driver
    /// as is; [`Dispatch::source`] returns that GLSL, read for its bindings. Only launched where
    /// [`Caps::spirv_passthrough`] holds.
    Spirv(&'a [u32]),
}

/// A wgpu instance on the primary backends (Vulkan, Metal, DX12, WebGPU), or on those `WGPU_BACKEND` names.
/// OpenGL is left out by default: its compute support is too limited for our kernels.
fn instance() -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    desc.backends = backends();
    wgpu::Instance::new(desc)
}

fn backends() -> wgpu::Backends {
    wgpu::Backends::from_env().unwrap_or(wgpu::Backends::PRIMARY)
}

/// Every adapter wgpu can see on this machine.
#[cfg(not(target_arch = "wasm32"))]
pub fn list_adapters() -> Vec<AdapterSummary> {
    let instance = instance();
    pollster::block_on(instance.enumerate_adapters(backends()))
        .into_iter()
        .enumerate()
        .map(|(index, a)| AdapterSummary {
            index,
            info: a.get_info(),
        })
        .collect()
}

#[cfg(not(target_arch = "wasm32"))]
fn device_rank(t: wgpu::DeviceType) -> u32 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    }
}

#[cfg(not(target_arch = "wasm32"))]
fn backend_rank(b: wgpu::Backend) -> u32 {
    match b {
        wgpu::Backend::Vulkan | wgpu::Backend::Metal | wgpu::Backend::Dx12 | wgpu::Backend::BrowserWebGpu => 0,
        _ => 1,
    }
}

#[cfg(not(target_arch = "wasm32"))]
async fn choose_adapter(instance: &wgpu::Instance, wanted: Option<&str>) -> Result<wgpu::Adapter> {
    let adapters = instance.enumerate_adapters(backends()).await;
    let names = || {
        adapters
            .iter()
            .map(|a| a.get_info().name)
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(w) = wanted {
        let found = match w.parse::<usize>() {
            Ok(i) => adapters.get(i),
            Err(_) => {
                let w = w.to_lowercase();
                adapters
                    .iter()
                    .filter(|a| a.get_info().name.to_lowercase().contains(&w))
                    .min_by_key(|a| backend_rank(a.get_info().backend))
            }
        };
        return found
            .cloned()
            .ok_or_else(|| GpuError::NoAdapter(format!("HIERARCHOS_ADAPTER={w} matches none of: {}", names())));
    }
    adapters
        .iter()
        .filter(|a| a.get_info().backend != wgpu::Backend::Noop)
        .min_by_key(|a| {
            let i = a.get_info();
            (backend_rank(i.backend), device_rank(i.device_type))
        })
        .cloned()
        .ok_or_else(|| {
            GpuError::NoAdapter(
                "wgpu found no Vulkan, Metal, DX12 or WebGPU adapter; install a GPU driver or Mesa's lavapipe \
                 (Debian: apt-get install mesa-vulkan-drivers), or name other backends with WGPU_BACKEND"
                    .into(),
            )
        })
}

#[cfg(target_arch = "wasm32")]
async fn choose_adapter(instance: &wgpu::Instance, _wanted: Option<&str>) -> Result<wgpu::Adapter> {
    instance
        .request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            ..Default::default()
        })
        .await
        .map_err(|e| GpuError::NoAdapter(e.to_string()))
}

static DEFAULT_GPU: OnceLock<std::result::Result<Arc<Gpu>, String>> = OnceLock::new();

/// The default device's opening error as kept for every later caller, who gets it back as
/// [`GpuError::NoAdapter`] (whose own message is not repeated).
fn stored_error(e: GpuError) -> String {
    match e {
        GpuError::NoAdapter(message) => message,
        other => other.to_string(),
    }
}

impl Gpu {
    /// Opens a device on the adapter the options select.
    pub async fn open(options: &GpuOptions) -> Result<Arc<Gpu>> {
        let instance = instance();
        let adapter = choose_adapter(&instance, options.adapter.as_deref()).await?;
        let info = adapter.get_info();
        let available = adapter.features();
        let mut wanted = wgpu::Features::empty();
        let subgroups = options.subgroups && available.contains(wgpu::Features::SUBGROUP);
        let f16 = options.f16 && available.contains(wgpu::Features::SHADER_F16);
        let timestamps = available.contains(wgpu::Features::TIMESTAMP_QUERY);
        let profile =
            options.profile && timestamps && available.contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES);
        // SPIR-V goes to Vulkan drivers as is; the GLSL kernels target Vulkan alone.
        let passthrough = !cfg!(target_arch = "wasm32")
            && info.backend == wgpu::Backend::Vulkan
            && available.contains(wgpu::Features::PASSTHROUGH_SHADERS);
        // The configurations the kernels are written for: f16 operands, f32 accumulators, square fragments of 16
        // with subgroups of 32 or of 8 with subgroups of 8; the kernels are SPIR-V.
        let offered = if options.cooperative_matrix
            && passthrough
            && subgroups
            && f16
            && available.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
        {
            adapter.cooperative_matrix_properties()
        } else {
            Vec::new()
        };
        let width = (info.subgroup_min_size, info.subgroup_max_size);
        let fragment = [(16, 32), (8, 8)].into_iter().find_map(|(edge, lanes)| {
            let shape = offered.iter().any(|c| {
                (c.m_size, c.n_size, c.k_size) == (edge, edge, edge)
                    && c.ab_type == wgpu::CooperativeScalarType::F16
                    && c.cr_type == wgpu::CooperativeScalarType::F32
            });
            (shape && width == (lanes, lanes)).then_some(edge)
        });
        let coop = fragment.is_some();
        let cache = options.pipeline_cache.is_some()
            && !cfg!(target_arch = "wasm32")
            && available.contains(wgpu::Features::PIPELINE_CACHE);
        for (on, f) in [
            (subgroups, wgpu::Features::SUBGROUP),
            (f16, wgpu::Features::SHADER_F16),
            (timestamps, wgpu::Features::TIMESTAMP_QUERY),
            (coop, wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX),
            (profile, wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES),
            (cache, wgpu::Features::PIPELINE_CACHE),
            (passthrough, wgpu::Features::PASSTHROUGH_SHADERS),
        ] {
            if on {
                wanted |= f;
            }
        }
        let limits = adapter.limits();
        let desc = wgpu::DeviceDescriptor {
            label: Some("hierarchos"),
            required_features: wanted,
            required_limits: limits.clone(),
            experimental_features: if coop {
                // SAFETY: cooperative-matrix kernels are only built for shapes the adapter reports.
                unsafe { wgpu::ExperimentalFeatures::enabled() }
            } else {
                wgpu::ExperimentalFeatures::disabled()
            },
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        let mut bf16_coop = options.bf16_cooperative_matrix
            && fragment.is_some_and(|edge| crate::hardware::bf16_cooperative_matrix(&adapter, edge));
        let mut opened = crate::hardware::request_device(&adapter, &desc, bf16_coop).await;
        if let (true, Err(message)) = (bf16_coop, &opened) {
            tracing::warn!("opening the device with bf16 cooperative matrices failed ({message}); opening it without");
            bf16_coop = false;
            opened = crate::hardware::request_device(&adapter, &desc, false).await;
        }
        let (device, queue) = opened.map_err(|message| GpuError::RequestDevice {
            adapter: info.name.clone(),
            message,
        })?;
        let errors = Arc::new(Mutex::new(Vec::new()));
        let sink = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e| {
            sink.lock().unwrap_or_else(|p| p.into_inner()).push(e)
        }));
        let caps = Caps {
            subgroups,
            subgroup_size: (info.subgroup_min_size, info.subgroup_max_size),
            f16,
            timestamps,
            cooperative_matrix: fragment,
            bf16_cooperative_matrix: bf16_coop,
            spirv_passthrough: passthrough,
            multiprocessors: options
                .multiprocessors
                .then(|| crate::hardware::multiprocessors(&adapter))
                .flatten(),
        };
        tracing::info!(adapter = %info.name, backend = ?info.backend, ?caps, "opened GPU");
        let params_buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("hierarchos params"),
            size: PARAM_ARENA_BYTES,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        #[cfg(not(target_arch = "wasm32"))]
        let pipeline_cache = options
            .pipeline_cache
            .as_deref()
            .and_then(|dir| DiskCache::open(&device, &info, dir));
        let profiler = if profile {
            Profiler::new(&device, &queue, MAX_DISPATCHES_PER_SUBMIT)
        } else {
            None
        };
        Ok(Arc::new(Gpu {
            instance,
            adapter,
            device,
            queue,
            info,
            limits,
            features: wanted,
            caps,
            errors,
            state: Mutex::new(State {
                profiler,
                ..State::default()
            }),
            params_buffer,
            dispatched: Default::default(),
            memory_limit: options.memory_limit,
            shader_checks: options.shader_checks,
            #[cfg(not(target_arch = "wasm32"))]
            pipeline_cache,
        }))
    }

    /// The process-wide default device, opened on first use with [`GpuOptions::from_env`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn default_gpu() -> Result<Arc<Gpu>> {
        DEFAULT_GPU
            .get_or_init(|| pollster::block_on(Gpu::open(&GpuOptions::from_env())).map_err(stored_error))
            .clone()
            .map_err(GpuError::NoAdapter)
    }

    /// The process-wide default device; on the web it must first be opened with [`Gpu::init_default`].
    #[cfg(target_arch = "wasm32")]
    pub fn default_gpu() -> Result<Arc<Gpu>> {
        DEFAULT_GPU
            .get()
            .cloned()
            .unwrap_or_else(|| Err("call Gpu::init_default().await first on the web".into()))
            .map_err(GpuError::NoAdapter)
    }

    /// Opens the default device asynchronously (needed on the web, where nothing may block).
    pub async fn init_default() -> Result<Arc<Gpu>> {
        if let Some(g) = DEFAULT_GPU.get() {
            return g.clone().map_err(GpuError::NoAdapter);
        }
        let g = Gpu::open(&GpuOptions::from_env()).await.map_err(stored_error);
        DEFAULT_GPU.get_or_init(|| g).clone().map_err(GpuError::NoAdapter)
    }

    /// The wgpu instance, adapter, device and queue, for a renderer that shares the device with the kernels (the
    /// Studio's egui-wgpu painter draws on the same device that trains).
    pub fn wgpu_parts(&self) -> (&wgpu::Instance, &wgpu::Adapter, &wgpu::Device, &wgpu::Queue) {
        (&self.instance, &self.adapter, &self.device, &self.queue)
    }

    fn cache_for_new_pipeline(&self) -> Option<&wgpu::PipelineCache> {
        #[cfg(not(target_arch = "wasm32"))]
        return self.pipeline_cache.as_ref().map(DiskCache::for_new_pipeline);
        #[cfg(target_arch = "wasm32")]
        None
    }

    /// Writes the kernels compiled so far to the pipeline cache file ([`GpuOptions::pipeline_cache`]), if any were
    /// compiled since the last write. Every readback and [`Gpu::synchronize`] does this, so a run that reads a
    /// result leaves its kernels for the next one.
    pub fn save_pipeline_cache(&self) {
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(c) = &self.pipeline_cache {
            c.save();
        }
    }

    /// The file the compiled kernels are kept in between runs, when the device has one.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn pipeline_cache_path(&self) -> Option<&std::path::Path> {
        self.pipeline_cache.as_ref().map(DiskCache::path)
    }

    /// Adapter name, backend, driver.
    pub fn adapter_info(&self) -> &wgpu::AdapterInfo {
        &self.info
    }

    /// The budget of bytes the device may hold ([`GpuOptions::memory_limit`]).
    pub fn memory_limit(&self) -> Option<u64> {
        self.memory_limit
    }

    /// The device limits (the adapter's full limits are requested).
    pub fn limits(&self) -> &wgpu::Limits {
        &self.limits
    }

    /// The wgpu features enabled on the device.
    pub fn features(&self) -> wgpu::Features {
        self.features
    }

    /// What the kernels may use.
    pub fn caps(&self) -> &Caps {
        &self.caps
    }

    /// The wgpu device, for code that shares it (the Studio's renderer).
    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }

    /// Live, peak and pooled bytes.
    pub fn memory(&self) -> MemoryStats {
        self.lock().stats
    }

    /// Kernel launches recorded since the device opened: per-step counts show where launch overhead goes.
    pub fn dispatch_count(&self) -> u64 {
        self.dispatched.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// GPU time per kernel since the device opened or [`Gpu::reset_profile`], longest first; empty unless the
    /// device was opened with [`GpuOptions::profile`] on an adapter with timestamps inside passes.
    pub fn profile(&self) -> Vec<KernelTime> {
        self.lock().profiler.as_ref().map_or_else(Vec::new, Profiler::report)
    }

    /// Clears the kernel times of [`Gpu::profile`].
    pub fn reset_profile(&self) {
        if let Some(p) = &mut self.lock().profiler {
            p.reset();
        }
    }

    /// Starts a new peak measurement from the current live bytes.
    pub fn reset_peak(&self) {
        let mut st = self.lock();
        st.stats.peak_bytes = st.stats.live_bytes;
    }

    /// Frees every pooled (unused) buffer.
    pub fn trim_pool(&self) {
        let mut st = self.lock();
        let freed = pool_bytes(&st.free);
        st.free.clear();
        let staged = pool_bytes(&st.staging);
        st.staging.clear();
        st.stats.staging_bytes -= staged;
        // Cached bind groups would keep the freed buffers alive.
        st.bind_groups.clear();
        st.stats.pooled_bytes -= freed;
    }

    /// Keeps a staging buffer of at most [`STAGING_POOLED`] bytes for the next read and frees a larger one: a read
    /// of a whole model's weights (a checkpoint) would otherwise hold host memory the size of its largest tensors.
    fn return_staging(&self, class: u64, staging: wgpu::Buffer) {
        let mut st = self.lock();
        if class <= STAGING_POOLED {
            st.staging.entry(class).or_default().push(staging);
        } else {
            st.stats.staging_bytes -= class;
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take_errors(&self) -> Vec<wgpu::Error> {
        std::mem::take(&mut *self.errors.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn check_errors(&self, op: &str) -> Result<()> {
        match self.take_errors().into_iter().next() {
            None => Ok(()),
            Some(wgpu::Error::OutOfMemory { .. }) => Err(GpuError::OutOfMemory {
                op: op.into(),
                bytes: 0,
                live: self.memory().live_bytes,
            }),
            Some(e) => Err(GpuError::Validation {
                op: op.into(),
                message: e.to_string(),
            }),
        }
    }

    /// Checks that `class` more bytes fit under the memory limit, giving back everything pooled first if they do
    /// not: what is in use then must leave room.
    fn make_room<'a>(&'a self, st: MutexGuard<'a, State>, op: &str, class: u64) -> Result<MutexGuard<'a, State>> {
        let held = |s: &MemoryStats| s.live_bytes + s.pooled_bytes + s.staging_bytes;
        let Some(max) = self.memory_limit else {
            return Ok(st);
        };
        if held(&st.stats) + class <= max {
            return Ok(st);
        }
        drop(st);
        self.flush()?;
        self.trim_pool();
        let st = self.lock();
        if held(&st.stats) + class > max {
            return Err(GpuError::OutOfMemory {
                op: op.into(),
                bytes: class,
                live: st.stats.live_bytes + st.stats.staging_bytes,
            });
        }
        Ok(st)
    }

    /// The grid of workgroups covering `n` workgroups, folded into two dimensions past the per-dimension limit.
    /// Kernels recover the linear workgroup index as `wid.x + wid.y * num_workgroups.x`.
    pub fn grid(n: u32) -> [u32; 3] {
        if n <= MAX_GRID_DIM {
            [n.max(1), 1, 1]
        } else {
            let y = n.div_ceil(MAX_GRID_DIM);
            [n.div_ceil(y), y, 1]
        }
    }

    /// A buffer of at least `bytes` bytes (contents undefined) from the pool, or a new one, for a kernel or
    /// copy recorded in the open batch to write.
    pub fn alloc(self: &Arc<Self>, op: &str, bytes: u64) -> Result<GpuBuffer> {
        self.take_buffer(op, bytes, true)
    }

    /// Buffers freed while the batch is open may still be read by its commands. A kernel writing them later in
    /// the same batch is ordered after those reads, so `alloc` reuses them at once; `queue.write_buffer` runs
    /// before the whole batch, so an upload (`in_batch_ok = false`) only takes buffers freed before the last
    /// submission.
    fn take_buffer(self: &Arc<Self>, op: &str, bytes: u64, in_batch_ok: bool) -> Result<GpuBuffer> {
        let limit = self
            .limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size);
        if bytes.max(4).next_multiple_of(4) > limit {
            return Err(GpuError::BufferTooLarge {
                op: op.into(),
                bytes,
                limit,
            });
        }
        let class = size_class(bytes.max(4)).min(limit);
        let mut st = self.lock();
        let recent = if in_batch_ok {
            st.released_in_batch
                .iter()
                .rposition(|(c, _)| *c == class)
                .map(|i| st.released_in_batch.swap_remove(i).1)
        } else {
            None
        };
        let reused = recent.or_else(|| st.free.get_mut(&class).and_then(Vec::pop));
        let buffer = match reused {
            Some(b) => {
                st.stats.pooled_bytes -= class;
                st.stats.live_bytes += class;
                b
            }
            None => {
                st = self.make_room(st, op, class)?;
                // Counted before the buffer exists, under the same lock as the check: allocations on other
                // threads then see it against the limit.
                st.stats.live_bytes += class;
                drop(st);
                let created = self.create_buffer(op, class);
                st = self.lock();
                match created {
                    Ok(buffer) => {
                        st.next_id += 1;
                        Pooled { buffer, id: st.next_id }
                    }
                    Err(e) => {
                        st.stats.live_bytes -= class;
                        return Err(e);
                    }
                }
            }
        };
        st.stats.peak_bytes = st.stats.peak_bytes.max(st.stats.live_bytes);
        Ok(GpuBuffer {
            buffer: Some(buffer),
            class,
            gpu: self.clone(),
        })
    }

    fn create_buffer(&self, op: &str, size: u64) -> Result<wgpu::Buffer> {
        let desc = wgpu::BufferDescriptor {
            label: Some(op),
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        };
        let b = self.device.create_buffer(&desc);
        match self.check_errors(op) {
            Ok(()) => return Ok(b),
            Err(GpuError::OutOfMemory { .. }) => {}
            // An error of earlier work, waiting in the device's error sink: reported as it is, not as memory.
            Err(e) => return Err(e),
        }
        // Out of memory: give back everything pooled and try once more.
        self.flush()?;
        self.trim_pool();
        let b = self.device.create_buffer(&desc);
        self.check_errors(op).map_err(|_| GpuError::OutOfMemory {
            op: op.into(),
            bytes: size,
            live: self.memory().live_bytes,
        })?;
        Ok(b)
    }

    /// A buffer holding `data` (padded with zeros to a multiple of 4 bytes).
    pub fn upload(self: &Arc<Self>, op: &str, data: &[u8]) -> Result<GpuBuffer> {
        let buf = self.take_buffer(op, data.len() as u64, false)?;
        if data.len().is_multiple_of(4) {
            self.queue.write_buffer(buf.raw(), 0, data);
        } else {
            let mut padded = data.to_vec();
            padded.resize(data.len().next_multiple_of(4), 0);
            self.queue.write_buffer(buf.raw(), 0, &padded);
        }
        Ok(buf)
    }

    /// A buffer of at least `bytes` bytes, all zero.
    pub fn zeros(self: &Arc<Self>, op: &str, bytes: u64) -> Result<GpuBuffer> {
        let buf = self.alloc(op, bytes)?;
        let mut st = self.lock();
        self.encoder(&mut st).clear_buffer(buf.raw(), 0, None);
        Ok(buf)
    }

    /// The open encoder for a command outside compute passes (ends the open pass).
    fn encoder<'s>(&self, st: &'s mut State) -> &'s mut wgpu::CommandEncoder {
        st.pass = None;
        st.encoder.get_or_insert_with(|| {
            self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("hierarchos batch"),
            })
        })
    }

    fn pipeline(&self, d: &Dispatch<'_>) -> Result<Arc<Kernel>> {
        if let Some(p) = self.lock().pipelines.get(d.key) {
            return Ok(p.clone());
        }
        let source = (d.source)();
        let what = || format!("{} (compiling kernel {})", d.op, d.key);
        let bindings = match d.language {
            Language::Wgsl => binding_layout(&source),
            Language::Spirv(_) => crate::glsl::storage_bindings(&source),
        };
        let entries = bindings
            .and_then(|b| layout_entries(&b))
            .map_err(|message| GpuError::Validation { op: what(), message })?;
        let layout = self.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some(d.key),
            entries: &entries,
        });
        let pipeline_layout = self.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(d.key),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let module = match d.language {
            Language::Wgsl => self.wgsl_module(d, source),
            Language::Spirv(words) => self
                .spirv_module(d.key, words)
                .map_err(|message| GpuError::Validation { op: what(), message })?,
        };
        let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(d.key),
            layout: Some(&pipeline_layout),
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: self.cache_for_new_pipeline(),
        });
        self.check_errors(&what())?;
        let mut st = self.lock();
        st.next_id += 1;
        let p = Arc::new(Kernel {
            pipeline,
            layout,
            id: st.next_id,
        });
        st.pipelines.insert(d.key.to_string(), p.clone());
        Ok(p)
    }

    fn wgsl_module(&self, d: &Dispatch<'_>, source: String) -> wgpu::ShaderModule {
        let descriptor = wgpu::ShaderModuleDescriptor {
            label: Some(d.key),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        };
        match self.shader_checks || d.runtime_checks {
            true => self.device.create_shader_module(descriptor),
            // SAFETY: every kernel here bounds its loops by its parameters and clamps or masks the indices it
            // computes (each is tested against a CPU reference at odd sizes, on every path); buffers stay guarded
            // by the driver's robust buffer access where wgpu relies on it.
            false => unsafe {
                self.device
                    .create_shader_module_trusted(descriptor, wgpu::ShaderRuntimeChecks::unchecked())
            },
        }
    }

    fn spirv_module(&self, key: &str, words: &[u32]) -> std::result::Result<wgpu::ShaderModule, String> {
        if !self.caps.spirv_passthrough {
            return Err("this adapter takes no SPIR-V (a Vulkan-only kernel)".into());
        }
        let descriptor = wgpu::ShaderModuleDescriptorPassthrough {
            label: Some(key),
            entry_points: std::borrow::Cow::Borrowed(&[wgpu::PassthroughShaderEntryPoint {
                name: std::borrow::Cow::Borrowed("main"),
                workgroup_size: (0, 0, 0),
            }]),
            spirv: Some(std::borrow::Cow::Borrowed(words)),
            ..Default::default()
        };
        // SAFETY: the SPIR-V comes from glslang, which validated the GLSL at build time; like the WGSL kernels,
        // these bound their loops by their parameters and are launched only for the shapes their callers check.
        Ok(unsafe { self.device.create_shader_module_passthrough(descriptor) })
    }

    /// Records one kernel launch into the open batch. The GPU runs it when the batch is submitted: when the host
    /// reads data back, when the batch is full, or on [`Gpu::flush`].
    pub fn dispatch(&self, d: Dispatch<'_>) -> Result<()> {
        let kernel = self.pipeline(&d)?;
        let align = self.limits.min_storage_buffer_offset_alignment as usize;
        // The parameters are bound as a window at a dynamic offset of the arena, so the bind group does not
        // depend on where they land and can be reused.
        let window = (d.params.len().max(1) * 4).next_multiple_of(16) as u64;
        let needs_flush = {
            let st = self.lock();
            st.params.len().next_multiple_of(align) as u64 + window > PARAM_ARENA_BYTES
                || st.profiler.as_ref().is_some_and(|p| !p.has_room())
        };
        if needs_flush {
            self.flush()?;
        }
        let mut st = self.lock();
        let offset = st.params.len().next_multiple_of(align);
        st.params.resize(offset, 0);
        for p in d.params {
            st.params.extend_from_slice(&p.to_le_bytes());
        }
        st.params.resize(offset + window as usize, 0);
        let key = (d.buffers.len() <= MAX_CACHED_BINDINGS).then(|| {
            let mut buffers = [0; MAX_CACHED_BINDINGS];
            for (slot, b) in buffers.iter_mut().zip(d.buffers) {
                *slot = b.pooled().id;
            }
            BindKey {
                kernel: kernel.id,
                window,
                buffers,
            }
        });
        let cached = key.and_then(|k| st.bind_groups.get(&k).cloned());
        let bind_group = match cached {
            Some(bg) => bg,
            None => {
                let mut entries = vec![wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &self.params_buffer,
                        offset: 0,
                        size: std::num::NonZeroU64::new(window),
                    }),
                }];
                for (i, b) in d.buffers.iter().enumerate() {
                    entries.push(wgpu::BindGroupEntry {
                        binding: i as u32 + 1,
                        resource: b.raw().as_entire_binding(),
                    });
                }
                let bg = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some(d.op),
                    layout: &kernel.layout,
                    entries: &entries,
                });
                if let Some(k) = key {
                    if st.bind_groups.len() >= MAX_CACHED_BIND_GROUPS {
                        st.bind_groups.clear();
                    }
                    st.bind_groups.insert(k, bg.clone());
                }
                bg
            }
        };
        if st.pass.is_none() {
            let pass = self
                .encoder(&mut st)
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("hierarchos"),
                    timestamp_writes: None,
                })
                .forget_lifetime();
            st.pass = Some(pass);
        }
        let State { pass, profiler, .. } = &mut *st;
        let pass = pass.as_mut().expect("pass opened above");
        let timestamp = profiler.as_mut().map(|p| (p.begin(d.key), p.queries()));
        if let Some((at, queries)) = timestamp {
            pass.write_timestamp(queries, at);
        }
        pass.set_pipeline(&kernel.pipeline);
        pass.set_bind_group(0, &bind_group, &[offset as u32]);
        pass.dispatch_workgroups(d.workgroups[0], d.workgroups[1], d.workgroups[2]);
        if let Some((at, queries)) = timestamp {
            pass.write_timestamp(queries, at + 1);
        }
        st.dispatches += 1;
        self.dispatched.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let full = st.dispatches >= st.batch_limit.clamp(1, MAX_DISPATCHES_PER_SUBMIT);
        drop(st);
        self.check_errors(d.op)?;
        if full {
            self.flush()?;
        }
        Ok(())
    }

    /// Submits the open batch to the GPU (without waiting for it).
    pub fn flush(&self) -> Result<()> {
        let mut st = self.lock();
        self.submit_locked(&mut st);
        drop(st);
        self.check_errors("submit")
    }

    fn submit_locked(&self, st: &mut State) -> Option<wgpu::SubmissionIndex> {
        st.pass = None;
        let mut encoder = st.encoder.take()?;
        if let Some(p) = &st.profiler {
            p.resolve(&mut encoder);
        }
        if !st.params.is_empty() {
            self.queue.write_buffer(&self.params_buffer, 0, &st.params);
            st.params.clear();
        }
        let index = self.queue.submit([encoder.finish()]);
        st.submitted += 1;
        if let Some(p) = &mut st.profiler {
            p.collect(&self.device);
        }
        st.dispatches = 0;
        st.batch_limit = (st.batch_limit * 2).clamp(FIRST_BATCH_AFTER_IDLE, MAX_DISPATCHES_PER_SUBMIT);
        for (class, b) in std::mem::take(&mut st.released_in_batch) {
            st.free.entry(class).or_default().push(b);
        }
        Some(index)
    }

    /// Copies `bytes` bytes (a multiple of 4) from `src` at `src_offset` to `dst` at `dst_offset`, in order with
    /// the launches recorded before it.
    pub fn copy(&self, src: &GpuBuffer, src_offset: u64, dst: &GpuBuffer, dst_offset: u64, bytes: u64) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let mut st = self.lock();
        self.encoder(&mut st)
            .copy_buffer_to_buffer(src.raw(), src_offset, dst.raw(), dst_offset, bytes);
        drop(st);
        self.check_errors("copy")
    }

    /// Waits until the GPU has finished all submitted work.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn synchronize(&self) -> Result<()> {
        self.flush()?;
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| GpuError::Readback(e.to_string()))?;
        self.lock().batch_limit = FIRST_BATCH_AFTER_IDLE;
        self.save_pipeline_cache();
        Ok(())
    }

    /// Copies bytes `[start, end)` of `buf` to the host, blocking until the GPU is done.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read(self: &Arc<Self>, buf: &GpuBuffer, start: u64, end: u64) -> Result<Vec<u8>> {
        self.read_later(buf, start, end)?.bytes()
    }

    /// Copies bytes `[start, end)` of `buf` to the host; the future resolves when the GPU is done (works on the web).
    pub async fn read_async(self: &Arc<Self>, buf: &GpuBuffer, start: u64, end: u64) -> Result<Vec<u8>> {
        self.read_later(buf, start, end)?.bytes_async().await
    }

    /// Records a copy of bytes `[start, end)` of `buf` to the host and submits it with the work before it, without
    /// waiting: the host goes on recording while the GPU works, and collects the bytes later with
    /// [`PendingRead::bytes`]. Generation reads each token this way one step behind, so the GPU never idles
    /// between tokens.
    pub fn read_later(self: &Arc<Self>, buf: &GpuBuffer, start: u64, end: u64) -> Result<PendingRead> {
        if start > end || end > buf.size() {
            return Err(GpuError::Readback(format!(
                "bytes {start}..{end} of a buffer of {} bytes",
                buf.size()
            )));
        }
        let lo = start / 4 * 4;
        let hi = end.next_multiple_of(4).min(buf.size()).max(lo);
        let mut read = PendingRead {
            gpu: self.clone(),
            staging: None,
            class: 0,
            len: hi - lo,
            skip: (start - lo) as usize,
            take: end.saturating_sub(start) as usize,
            submission: None,
            serial: 0,
        };
        if read.take == 0 {
            return Ok(read);
        }
        // Small staging buffers are pooled too: generation reads a little every token.
        read.class = size_class(read.len);
        let mut st = self.lock();
        let staging = match st.staging.get_mut(&read.class).and_then(Vec::pop) {
            Some(pooled) => pooled,
            None => {
                st = self.make_room(st, "readback", read.class)?;
                st.stats.staging_bytes += read.class;
                self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("hierarchos readback"),
                    size: read.class,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            }
        };
        self.encoder(&mut st)
            .copy_buffer_to_buffer(buf.raw(), lo, &staging, 0, read.len);
        read.submission = self.submit_locked(&mut st);
        read.serial = st.submitted;
        drop(st);
        read.staging = Some(staging);
        self.check_errors("readback")?;
        self.save_pipeline_cache();
        Ok(read)
    }
}

/// Bytes on their way to the host (see [`Gpu::read_later`]); dropping it unread is fine.
pub struct PendingRead {
    gpu: Arc<Gpu>,
    staging: Option<wgpu::Buffer>,
    class: u64,
    len: u64,
    skip: usize,
    take: usize,
    submission: Option<wgpu::SubmissionIndex>,
    /// The value of `State::submitted` once the copy was submitted.
    serial: u64,
}

impl PendingRead {
    /// Waits for the submission that holds the copy (not for work submitted after it) and returns the bytes.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn bytes(self) -> Result<Vec<u8>> {
        pollster::block_on(self.bytes_async())
    }

    /// The bytes, once the GPU has made the copy (works on the web).
    pub async fn bytes_async(mut self) -> Result<Vec<u8>> {
        let Some(staging) = self.staging.take() else {
            return Ok(Vec::new());
        };
        let gpu = self.gpu.clone();
        let (tx, rx) = futures_channel::oneshot::channel();
        staging.map_async(wgpu::MapMode::Read, 0..self.len, move |r| {
            let _ = tx.send(r);
        });
        #[cfg(not(target_arch = "wasm32"))]
        gpu.device
            .poll(wgpu::PollType::Wait {
                submission_index: self.submission.take(),
                timeout: None,
            })
            .map_err(|e| GpuError::Readback(e.to_string()))?;
        rx.await
            .map_err(|_| GpuError::Readback("device dropped the mapping request".into()))?
            .map_err(|e| GpuError::Readback(e.to_string()))?;
        // When nothing was submitted or recorded after the copy, the GPU now idles until the next batch arrives.
        {
            let mut st = gpu.lock();
            if st.submitted == self.serial && st.encoder.is_none() {
                st.batch_limit = FIRST_BATCH_AFTER_IDLE;
            }
        }
        let view = staging
            .get_mapped_range(0..self.len)
            .map_err(|e| GpuError::Readback(e.to_string()))?;
        let out = view[self.skip..self.skip + self.take].to_vec();
        drop(view);
        staging.unmap();
        gpu.return_staging(self.class, staging);
        Ok(out)
    }
}

impl Drop for PendingRead {
    fn drop(&mut self) {
        // Unread: the buffer is not mapped, so it can serve the next readback.
        if let Some(staging) = self.staging.take() {
            self.gpu.return_staging(self.class, staging);
        }
    }
}

/// Bytes of the buffers a pool keeps, by size class.
fn pool_bytes<T>(pool: &FxHashMap<u64, Vec<T>>) -> u64 {
    pool.iter().map(|(class, list)| class * list.len() as u64).sum()
}

/// The storage buffers a kernel's WGSL declares (group 0), as (binding, read-only) pairs: read-only unless
/// declared `read_write`. The layout is explicit rather than derived by wgpu, because derived layouts cannot take
/// dynamic offsets (binding 0, the parameter window, has one).
fn binding_layout(source: &str) -> std::result::Result<Vec<(u32, bool)>, String> {
    let mut bindings = Vec::new();
    for (at, _) in source.match_indices("@binding(") {
        let rest = &source[at + "@binding(".len()..];
        let decl = &rest[..rest.find(';').ok_or("a @binding declaration without `;`")?];
        let close = decl.find(')').ok_or("an unterminated @binding(")?;
        let binding: u32 = decl[..close]
            .trim()
            .parse()
            .map_err(|_| format!("@binding({}) is not a number", &decl[..close]))?;
        let spec = decl
            .find("var<")
            .and_then(|s| decl[s + 4..].split_once('>').map(|(spec, _)| spec))
            .ok_or_else(|| format!("binding {binding}: no var<...> declaration"))?;
        let mut parts = spec.split(',').map(str::trim);
        if parts.next() != Some("storage") {
            return Err(format!(
                "binding {binding}: only storage buffers are bound, got var<{spec}>"
            ));
        }
        bindings.push((binding, parts.next() != Some("read_write")));
    }
    Ok(bindings)
}

/// The bind group layout of storage buffers given as (binding, read-only) pairs; binding 0 (the parameters) is
/// bound at a dynamic offset.
fn layout_entries(bindings: &[(u32, bool)]) -> std::result::Result<Vec<wgpu::BindGroupLayoutEntry>, String> {
    let mut entries: Vec<wgpu::BindGroupLayoutEntry> = Vec::new();
    for &(binding, read_only) in bindings {
        if entries.iter().any(|e| e.binding == binding) {
            return Err(format!("binding {binding} is declared twice"));
        }
        entries.push(wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only },
                has_dynamic_offset: binding == 0,
                min_binding_size: None,
            },
            count: None,
        });
    }
    entries.sort_by_key(|e| e.binding);
    Ok(entries)
}

/// Pool size classes: powers of two and the midpoints between them, so at most a third is wasted.
fn size_class(bytes: u64) -> u64 {
    let bytes = bytes.next_multiple_of(256);
    let p = bytes.next_power_of_two();
    let mid = p / 4 * 3;
    if bytes <= mid && mid.is_multiple_of(256) {
        mid
    } else {
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_cover_the_request() {
        for b in [1u64, 4, 255, 256, 257, 700, 1000, 1 << 20, (1 << 20) + 1, 3 << 20] {
            let c = size_class(b);
            assert!(c >= b, "{b} -> {c}");
            assert!(c <= (b.next_multiple_of(256) * 3 / 2).max(256), "{b} -> {c}");
        }
    }

    #[test]
    fn binding_layout_reads_access_modes() {
        let src = "@group(0) @binding(0) var<storage, read> p: array<u32>;\n\
                   @group(0) @binding(2) var<storage, read_write> out: array<f32>;\n\
                   @group(0) @binding(1) var<storage> x: array<f32>;\nfn main() {}";
        let e = layout_entries(&binding_layout(src).unwrap()).unwrap();
        let read_only = |i: usize| match e[i].ty {
            wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only },
                ..
            } => read_only,
            _ => panic!("not a storage buffer"),
        };
        assert_eq!(e.iter().map(|e| e.binding).collect::<Vec<_>>(), [0, 1, 2]);
        assert!(read_only(0) && read_only(1) && !read_only(2));
        assert!(e[0].ty.has_dynamic_offset() && !e[1].ty.has_dynamic_offset());
        assert!(binding_layout("@group(0) @binding(0) var<uniform> u: vec4<f32>;").is_err());
        assert!(binding_layout("@group(0) @binding(x) var<storage> u: array<u32>;").is_err());
        assert!(layout_entries(&[(1, true), (1, false)]).is_err());
    }

    #[test]
    fn grid_folds_past_the_limit() {
        assert_eq!(Gpu::grid(0), [1, 1, 1]);
        assert_eq!(Gpu::grid(70_000), [35_000, 2, 1]);
        let g = Gpu::grid(10_000_000);
        assert!(g[0] <= MAX_GRID_DIM && g[0] as u64 * g[1] as u64 >= 10_000_000);
    }
}
