//! Trains a two-layer MLP with plain SGD to fit y = sin(3·x₀)·cos(2·x₁) on random points, using only the public
//! Hierarchos API. Run with `cargo run --example mlp`.

use hierarchos::core::{DType, Result, Tensor, default_device};
use hierarchos::nn::{Linear, ParamRng, optim::Sgd};

/// Input → hidden (tanh) → output.
struct Mlp {
    fc1: Linear,
    fc2: Linear,
}

impl Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.fc2.forward(&self.fc1.forward(x)?.tanh()?)
    }

    fn parameters(&self) -> Vec<Tensor> {
        self.fc1
            .parameters()
            .into_iter()
            .chain(self.fc2.parameters())
            .map(|(_, t)| t)
            .collect()
    }
}

fn main() -> Result<()> {
    let device = default_device()?;
    println!("device: {}", device.adapter_info().name);
    let mut rng = ParamRng::new(0);
    let model = Mlp {
        fc1: Linear::new(2, 32, true, &mut rng, &device)?,
        fc2: Linear::new(32, 1, true, &mut rng, &device)?,
    };

    // 256 points in [-1, 1)^2 and their targets.
    let x = Tensor::rand(&[256, 2], 42, 0, DType::F32, &device)?
        .mul_scalar(2.0)?
        .sub_scalar(1.0)?;
    let x0 = x.narrow(1, 0, 1)?;
    let x1 = x.narrow(1, 1, 1)?;
    let y = x0.mul_scalar(3.0)?.sin()?.mul(&x1.mul_scalar(2.0)?.cos()?)?;

    let mut opt = Sgd::new(0.2);
    for step in 0..=300 {
        let diff = model.forward(&x)?.sub(&y)?;
        let loss = diff.mul(&diff)?.mean(&[], false)?;
        loss.backward()?;
        opt.step(&model.parameters())?;
        if step % 50 == 0 {
            println!("step {step:3}  loss {:.5}", loss.item()?);
        }
    }
    Ok(())
}
