//! Per-kernel GPU times from timestamp queries (`HIERARCHOS_PROFILE=1`, `Gpu::profile`).

#[test]
fn profiling_times_each_kernel() {
    let options = hierarchos::core::GpuOptions {
        profile: true,
        ..hierarchos::core::GpuOptions::from_env()
    };
    let d = pollster::block_on(hierarchos::core::Gpu::open(&options)).unwrap();
    if !d
        .features()
        .contains(hierarchos::runtime::wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES)
    {
        eprintln!("skipped: the adapter has no timestamps inside passes");
        return;
    }
    let x = hierarchos::core::Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], &d).unwrap();
    for _ in 0..3 {
        x.exp().unwrap().to_vec::<f32>().unwrap();
    }
    let profile = d.profile();
    let exp = profile
        .iter()
        .find(|k| k.kernel.contains("exp"))
        .expect("the exp kernel was timed");
    assert_eq!(exp.launches, 3);
    assert!(exp.total_ns > 0.0);
    d.reset_profile();
    assert!(d.profile().is_empty());
}
