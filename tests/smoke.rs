use hierarchos::core::{DType, Tensor, default_device};

#[test]
fn smoke() {
    let dev = default_device().unwrap();
    eprintln!("{:?} {:?}", dev.adapter_info().name, dev.caps());
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], &dev)
        .unwrap()
        .requires_grad_();
    let y = x.mul(&x).unwrap().sum_all().unwrap();
    assert_eq!(y.item().unwrap(), 91.0);
    y.backward().unwrap();
    assert_eq!(
        x.grad().unwrap().to_vec::<f32>().unwrap(),
        vec![2.0, 4.0, 6.0, 8.0, 10.0, 12.0]
    );
    let t = x.t().unwrap().contiguous().unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    let h = x.to_dtype(DType::BF16).unwrap().exp().unwrap().to_f32_vec().unwrap();
    eprintln!("{h:?}");
    let c = Tensor::cat(&[x.clone(), x.mul_scalar(2.0).unwrap()], 1).unwrap();
    assert_eq!(
        c.to_vec::<f32>().unwrap(),
        vec![1.0, 2.0, 3.0, 2.0, 4.0, 6.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0]
    );
    let m = x.max(&[1], false).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(m, vec![3.0, 6.0]);
    let a = x.argmax(0, false).unwrap().to_vec::<u32>().unwrap();
    assert_eq!(a, vec![1, 1, 1]);
    let l = x.logsumexp(&[1], false).unwrap().to_vec::<f32>().unwrap();
    eprintln!("{l:?}");
}
