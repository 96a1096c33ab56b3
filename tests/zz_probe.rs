mod common;
use common::*;
use hierarchos::core::{DType, Tensor};
#[test]
fn probe() {
    let d = dev();
    for (n, w) in [
        (30000usize, 1usize),
        (30000, 64),
        (30000, 300),
        (12000, 300),
        (20000, 1000),
        (50000, 1),
    ] {
        let table = Tensor::zeros(&[4, w], DType::F32, &d).unwrap().requires_grad_();
        let it = Tensor::from_slice(&vec![0u32; n], &[n], &d).unwrap();
        let y = table.index_select(0, &it).unwrap();
        let t0 = std::time::Instant::now();
        y.sum_all().unwrap().backward().unwrap();
        let g = table.grad().unwrap().to_vec::<f32>().unwrap();
        eprintln!("n={n} w={w}: g[0] {} g[w-1] {} ({:?})", g[0], g[w - 1], t0.elapsed());
    }
}
