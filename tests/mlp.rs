//! A two-layer MLP trained with plain SGD on a synthetic regression problem drives its loss below a set value.

mod common;
use common::*;
use hierarchos::core::{DType, Tensor};
use hierarchos::nn::{Linear, ParamRng, optim::Sgd};

#[test]
fn mlp_learns_a_smooth_function_with_sgd() {
    let d = dev();
    let mut rng = ParamRng::new(7);
    let fc1 = Linear::new(2, 16, true, &mut rng, &d).unwrap();
    let fc2 = Linear::new(16, 1, true, &mut rng, &d).unwrap();
    let params: Vec<Tensor> = fc1
        .parameters()
        .into_iter()
        .chain(fc2.parameters())
        .map(|(_, t)| t)
        .collect();
    let x = Tensor::rand(&[128, 2], 3, 0, DType::F32, &d)
        .unwrap()
        .mul_scalar(2.0)
        .unwrap()
        .sub_scalar(1.0)
        .unwrap();
    // y = x0 * x1 + 0.5 x0: needs the hidden layer (the product term is not linear).
    let (x0, x1) = (x.narrow(1, 0, 1).unwrap(), x.narrow(1, 1, 1).unwrap());
    let y = x0.mul(&x1).unwrap().add(&x0.mul_scalar(0.5).unwrap()).unwrap();
    let mut opt = Sgd::new(0.3);
    let mut losses = Vec::new();
    for _ in 0..200 {
        let diff = fc2
            .forward(&fc1.forward(&x).unwrap().tanh().unwrap())
            .unwrap()
            .sub(&y)
            .unwrap();
        let loss = diff.mul(&diff).unwrap().mean(&[], false).unwrap();
        loss.backward().unwrap();
        opt.step(&params).unwrap();
        losses.push(loss.item().unwrap());
    }
    let (first, last) = (losses[0], *losses.last().unwrap());
    eprintln!("loss {first} -> {last}");
    assert!(last < 0.01, "loss {first} -> {last}: did not reach 0.01");
    assert!(last < first / 5.0);
}
