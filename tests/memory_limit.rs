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
