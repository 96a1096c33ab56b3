//! The driver's compiled kernels kept on disk between runs (wgpu's `PIPELINE_CACHE`, Vulkan only), so that a
//! warm start compiles nothing: the first run of a model builds a few dozen pipelines, each of which the driver
//! turns into machine code.

use std::hash::Hasher;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// What a cache file starts with, before the checksum of the data.
const MAGIC: &[u8; 8] = b"HIERPC01";

/// Numbers temporary files apart when several devices of one process save at once.
static SAVES: AtomicU64 = AtomicU64::new(0);

/// A checksum of the data, so that a file damaged on disk never reaches the driver: wgpu checks the header and
/// the length of what it is given, not its contents.
fn checksum(data: &[u8]) -> u64 {
    let mut h = rustc_hash::FxHasher::default();
    h.write(data);
    h.finish()
}

/// The driver's data in a cache file, if the file is whole.
fn unwrap_file(file: &[u8]) -> Option<&[u8]> {
    let (magic, rest) = file.split_at_checked(MAGIC.len())?;
    let (sum, data) = rest.split_at_checked(8)?;
    (magic == MAGIC && u64::from_le_bytes(sum.try_into().ok()?) == checksum(data)).then_some(data)
}

/// A pipeline cache loaded from and saved to one file per adapter.
pub(crate) struct DiskCache {
    cache: wgpu::PipelineCache,
    path: PathBuf,
    /// Pipelines were built since the file was last written.
    dirty: AtomicBool,
}

impl DiskCache {
    /// The cache of this adapter in `dir`, seeded from its file when one is there. `None` when the device has no
    /// `PIPELINE_CACHE` feature or wgpu has no cache key for the backend.
    pub(crate) fn open(device: &wgpu::Device, info: &wgpu::AdapterInfo, dir: &Path) -> Option<DiskCache> {
        if !device.features().contains(wgpu::Features::PIPELINE_CACHE) {
            return None;
        }
        let path = dir.join(format!("{}.bin", wgpu::util::pipeline_cache_key(info)?));
        let file = std::fs::read(&path).ok();
        let data = file.as_deref().and_then(unwrap_file);
        if file.is_some() && data.is_none() {
            tracing::warn!(path = %path.display(), "pipeline cache file damaged: ignored, it will be rewritten");
        }
        // SAFETY: the data is what `PipelineCache::get_data` gave for an adapter with the same cache key, and its
        // checksum matches; wgpu checks its header (wgpu version, adapter, driver) and, with `fallback`, starts
        // empty when it does not match.
        let create = |data| unsafe {
            device.create_pipeline_cache(&wgpu::PipelineCacheDescriptor {
                label: Some("hierarchos pipelines"),
                data,
                fallback: true,
            })
        };
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let cache = create(data);
        // Data from another adapter or backend is refused even with `fallback` (a validation error), leaving a cache
        // that every pipeline built with it would fail on: such a file starts an empty cache, then is rewritten.
        let cache = match pollster::block_on(scope.pop()) {
            Some(e) if data.is_some() => {
                tracing::warn!(path = %path.display(), "pipeline cache file of another device ignored: {e}");
                create(None)
            }
            _ => cache,
        };
        tracing::debug!(path = %path.display(), seeded = data.is_some(), "pipeline cache");
        Some(DiskCache {
            cache,
            path,
            dirty: AtomicBool::new(false),
        })
    }

    /// The cache to build pipelines with; they count as new until the next [`DiskCache::save`].
    pub(crate) fn for_new_pipeline(&self) -> &wgpu::PipelineCache {
        self.dirty.store(true, Ordering::Relaxed);
        &self.cache
    }

    /// Writes the cache to its file (a magic tag, a checksum, the driver's data) if pipelines were built since the
    /// last write: to a temporary file first, then renamed over the old one, so that a crash mid-write never
    /// leaves a torn file behind. A failure is logged, not returned: without the file the next start only
    /// compiles again.
    pub(crate) fn save(&self) {
        if !self.dirty.swap(false, Ordering::Relaxed) {
            return;
        }
        let Some(data) = self.cache.get_data() else {
            return;
        };
        let serial = SAVES.fetch_add(1, Ordering::Relaxed);
        let tmp = self.path.with_extension(format!("tmp{}-{serial}", std::process::id()));
        let mut file = MAGIC.to_vec();
        file.extend(checksum(&data).to_le_bytes());
        file.extend(&data);
        let written = self
            .path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&tmp, &file))
            .and_then(|()| std::fs::rename(&tmp, &self.path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            tracing::warn!(path = %self.path.display(), "could not save the pipeline cache: {e}");
        }
    }

    /// Where the cache is kept.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}
