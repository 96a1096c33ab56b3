//! Compiled kernels kept on disk (`GpuOptions::pipeline_cache`): a run that reads a result leaves a cache file
//! for its adapter, the next run starts from it and computes the same, and a damaged file (foreign, or with its
//! contents changed) is ignored, not fatal, and rewritten.

use std::path::Path;
use std::sync::Arc;

use hierarchos::core::{Gpu, GpuOptions, Tensor};
use hierarchos::runtime::wgpu;

fn open(dir: &Path) -> Arc<Gpu> {
    let options = GpuOptions {
        pipeline_cache: Some(dir.to_path_buf()),
        ..GpuOptions::from_env()
    };
    pollster::block_on(Gpu::open(&options)).unwrap()
}

/// `exp(x) * 2` on a fresh device: two kernels compiled, one readback.
fn compute(d: &Arc<Gpu>) -> Vec<f32> {
    let x = Tensor::from_slice(&[0.0f32, 1.0, -2.0, 0.5], &[4], d).unwrap();
    x.exp().unwrap().mul_scalar(2.0).unwrap().to_vec::<f32>().unwrap()
}

#[test]
fn the_pipeline_cache_is_written_reused_and_survives_damage() {
    let dir = std::env::temp_dir().join(format!("hierarchos-pipeline-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let first = open(&dir);
    let Some(path) = first.pipeline_cache_path().map(Path::to_path_buf) else {
        // Only Vulkan adapters with PIPELINE_CACHE keep one; elsewhere there is nothing to check.
        assert!(!first.features().contains(wgpu::Features::PIPELINE_CACHE));
        return;
    };
    assert!(path.starts_with(&dir), "{path:?}");
    let want = compute(&first);
    let written = std::fs::read(&path).expect("the readback wrote the cache file");
    assert!(!written.is_empty());
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 1, "no temporary files left behind: {leftovers:?}");

    let second = open(&dir);
    assert_eq!(compute(&second), want);

    // A file that is not a cache, and a cache with one byte flipped (same length: only the checksum tells), are
    // ignored and replaced.
    let mut flipped = written.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x40;
    for damaged in [b"not a pipeline cache".to_vec(), flipped] {
        std::fs::write(&path, &damaged).unwrap();
        let again = open(&dir);
        assert_eq!(compute(&again), want);
        assert_ne!(std::fs::read(&path).unwrap(), damaged, "the damaged file was replaced");
    }

    // A whole file (its checksum right) whose data another adapter wrote (the vendor id in wgpu's header
    // changed): wgpu refuses it even with `fallback`, and a cache made from it failed every kernel of every start
    // until the file was deleted. It is ignored and replaced too.
    let mut data = std::fs::read(&path).unwrap()[16..].to_vec();
    data[20] ^= 0xff;
    let mut foreign = b"HIERPC01".to_vec();
    let mut hasher = rustc_hash::FxHasher::default();
    std::hash::Hasher::write(&mut hasher, &data);
    foreign.extend(std::hash::Hasher::finish(&hasher).to_le_bytes());
    foreign.extend(&data);
    std::fs::write(&path, &foreign).unwrap();
    for _ in 0..2 {
        assert_eq!(compute(&open(&dir)), want);
    }
    assert_ne!(std::fs::read(&path).unwrap(), foreign, "the foreign file was replaced");
    std::fs::remove_dir_all(&dir).unwrap();
}
