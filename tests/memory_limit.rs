//! A memory budget (`GpuOptions::memory_limit`, `HIERARCHOS_MEMORY_LIMIT_MIB`): past it an allocation fails with
//! an out-of-memory error naming the operation, after the pool of free buffers is given back; freeing tensors
//! makes room again, and what was computed stays right.

use hierarchos::core::{DType, Gpu, GpuOptions, Tensor};

#[test]
fn a_memory_limit_fails_allocations_past_it_and_recovers() {
    let limit = 1u64 << 20;
    let options = GpuOptions {
        memory_limit: Some(limit),
        ..GpuOptions::from_env()
    };
    let d = pollster::block_on(Gpu::open(&options)).unwrap();
    assert_eq!(d.memory_limit(), Some(limit));
    // A quarter of the budget each.
    let n = (limit / 4 / 4) as usize;
    let a = Tensor::full(&[n], 0.5, DType::F32, &d).unwrap();
    let b = Tensor::zeros(&[n], DType::F32, &d).unwrap();
    let c = Tensor::zeros(&[n], DType::F32, &d).unwrap();
    let e = a.exp().unwrap();
    assert_eq!(d.memory().live_bytes, limit);
    let err = Tensor::zeros(&[n], DType::F32, &d).unwrap_err().to_string();
    assert!(err.contains("out of GPU memory"), "{err}");
    assert!(err.contains("zeros"), "the error names the operation: {err}");
    assert_eq!(d.memory().live_bytes, limit, "a failed allocation holds nothing");
    // Freed buffers wait in the pool; a new allocation past the budget gives them back first.
    drop((b, c));
    let f = Tensor::zeros(&[n], DType::F32, &d).unwrap();
    let g = Tensor::zeros(&[n], DType::F32, &d).unwrap();
    assert_eq!(d.memory().live_bytes, limit);
    assert_eq!(d.memory().pooled_bytes, 0);
    // A read to the host needs a staging buffer, which counts too: none fits at the full budget.
    let err = e.to_vec::<f32>().unwrap_err().to_string();
    assert!(err.contains("out of GPU memory") && err.contains("readback"), "{err}");
    drop(a);
    let want = 0.5f32.exp();
    assert!(e.to_vec::<f32>().unwrap().iter().all(|&x| x == want));
    assert!(
        f.to_vec::<f32>()
            .unwrap()
            .iter()
            .chain(&g.to_vec::<f32>().unwrap())
            .all(|&x| x == 0.0)
    );
}

/// Buffers freed with no batch open go back to the pool that uploads take from: 32 uploads of 1 MiB, each
/// dropped, kept 32 MiB pooled before, and uploads after a readback went past the memory limit.
#[test]
fn uploads_reuse_buffers_freed_between_batches_and_keep_the_limit() {
    let q = 1usize << 18;
    let data = vec![1.0f32; q];
    let options = GpuOptions {
        memory_limit: Some(4 * q as u64 * 4),
        pipeline_cache: None,
        ..GpuOptions::from_env()
    };
    let d = pollster::block_on(Gpu::open(&options)).unwrap();
    for _ in 0..32 {
        drop(Tensor::from_slice(&data, &[q], &d).unwrap());
    }
    assert!(d.memory().pooled_bytes <= 4 * q as u64, "{:?}", d.memory());
    // Three, so that the read's staging buffer fits beside them.
    let held: Vec<Tensor> = (0..3).map(|_| Tensor::from_slice(&data, &[q], &d).unwrap()).collect();
    held[0].to_vec::<f32>().unwrap();
    drop(held);
    let again: Vec<Tensor> = (0..4).map(|_| Tensor::from_slice(&data, &[q], &d).unwrap()).collect();
    let m = d.memory();
    assert!(
        m.live_bytes + m.pooled_bytes + m.staging_bytes <= 4 * q as u64 * 4,
        "{m:?}"
    );
    drop(again);
    // A read past a buffer's end is an error, not a panic.
    let buf = d.upload("read", &[0u8; 16]).unwrap();
    assert!(d.read(&buf, 0, buf.size() + 8).is_err());
}

/// Staging buffers of reads to the host are counted; small ones are kept for the next read (generation reads every
/// token), large ones freed once read (a checkpoint reads every weight once).
#[test]
fn staging_buffers_are_counted_and_large_ones_freed() {
    let d = pollster::block_on(Gpu::open(&GpuOptions::from_env())).unwrap();
    let small = Tensor::full(&[1000], 2.0, DType::F32, &d).unwrap();
    assert_eq!(small.to_vec::<f32>().unwrap(), vec![2.0; 1000]);
    let kept = d.memory().staging_bytes;
    assert!(kept >= 4000, "{:?}", d.memory());
    small.to_vec::<f32>().unwrap();
    assert_eq!(d.memory().staging_bytes, kept, "the second read reuses the buffer");
    let n = 5 << 20;
    let large = Tensor::full(&[n], 3.0, DType::F32, &d).unwrap();
    let pending = large.read_later::<f32>().unwrap();
    assert!(d.memory().staging_bytes >= kept + 4 * n as u64, "{:?}", d.memory());
    assert!(pending.wait().unwrap().iter().all(|&x| x == 3.0));
    assert_eq!(d.memory().staging_bytes, kept);
    d.trim_pool();
    assert_eq!(d.memory().staging_bytes, 0);
}
