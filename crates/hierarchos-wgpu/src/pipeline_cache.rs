//! The driver's compiled kernels kept on disk between runs (wgpu's `PIPELINE_CACHE`, Vulkan only), so that a
//! warm start compiles nothing: the first run of a model builds a few dozen pipelines, each of which the driver
//! turns into machine code.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

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
        let data = std::fs::read(&path).ok();
        // SAFETY: the data is what `PipelineCache::get_data` wrote for an adapter with the same cache key; wgpu
        // checks its header (wgpu version, adapter, driver) and, with `fallback`, starts empty when it does not
        // match or is damaged.
        let cache = unsafe {
            device.create_pipeline_cache(&wgpu::PipelineCacheDescriptor {
                label: Some("hierarchos pipelines"),
                data: data.as_deref(),
                fallback: true,
            })
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

    /// Writes the cache to its file if pipelines were built since the last write: to a temporary file first,
    /// then renamed over the old one, so that a crash mid-write never leaves a torn file behind. A failure is
    /// logged, not returned: without the file the next start only compiles again.
    pub(crate) fn save(&self) {
        if !self.dirty.swap(false, Ordering::Relaxed) {
            return;
        }
        let Some(data) = self.cache.get_data() else {
            return;
        };
        let tmp = self.path.with_extension(format!("tmp{}", std::process::id()));
        let written = self
            .path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&tmp, &data))
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
