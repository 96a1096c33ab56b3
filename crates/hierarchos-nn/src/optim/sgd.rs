//! Plain stochastic gradient descent.

use hierarchos_core::{Result, Tensor, no_grad};

/// `p ← p − lr · ∇p` for every parameter that has a gradient.
#[derive(Clone, Debug)]
pub struct Sgd {
    /// Learning rate.
    pub lr: f64,
}

impl Sgd {
    /// SGD with learning rate `lr`.
    pub fn new(lr: f64) -> Self {
        Sgd { lr }
    }

    /// Applies one update to `params` and clears their gradients.
    pub fn step(&self, params: &[Tensor]) -> Result<()> {
        no_grad(|| {
            for p in params {
                if let Some(g) = p.grad() {
                    p.assign(&p.sub(&g.mul_scalar(self.lr)?)?)?;
                    p.zero_grad();
                }
            }
            Ok(())
        })
    }
}
