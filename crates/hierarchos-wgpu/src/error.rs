//! Errors of the GPU runtime.

/// Everything that can go wrong between Hierarchos and the GPU. Every variant names what failed so that a
/// user can tell a missing driver from a kernel bug from an out-of-memory condition.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No adapter matched (no Vulkan/Metal/DX12/WebGPU driver, or the requested one is absent).
    #[error("no GPU adapter found: {0}")]
    NoAdapter(String),
    /// The adapter refused to open a device with the features and limits we asked for.
    #[error("could not open a device on adapter '{adapter}': {message}")]
    RequestDevice {
        /// Adapter name.
        adapter: String,
        /// wgpu's message.
        message: String,
    },
    /// A buffer would exceed what the adapter can bind or allocate.
    #[error("{op}: a buffer of {bytes} bytes exceeds the adapter's limit of {limit} bytes")]
    BufferTooLarge {
        /// Operation that needed the buffer.
        op: String,
        /// Requested size.
        bytes: u64,
        /// The adapter's limit.
        limit: u64,
    },
    /// The device ran out of memory.
    #[error("{op}: out of GPU memory allocating {bytes} bytes ({live} bytes live)")]
    OutOfMemory {
        /// Operation that needed the memory.
        op: String,
        /// Requested size.
        bytes: u64,
        /// Bytes held by live tensors at the time.
        live: u64,
    },
    /// wgpu rejected a kernel, a pipeline or a command: a bug in Hierarchos, reported with the kernel's name.
    #[error("{op}: GPU validation error: {message}")]
    Validation {
        /// Kernel or operation that was rejected.
        op: String,
        /// wgpu's message.
        message: String,
    },
    /// Reading data back from the GPU failed (device lost, mapping error).
    #[error("reading back from the GPU failed: {0}")]
    Readback(String),
}

/// Result alias of the runtime.
pub type Result<T> = std::result::Result<T, GpuError>;
