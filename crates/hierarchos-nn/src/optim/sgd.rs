//! Stochastic gradient descent with momentum, Nesterov momentum and weight decay, as `torch.optim.SGD`.

use hierarchos_core::{Error, Result, Tensor, no_grad};

/// SGD's settings and its momentum buffers (one per parameter, by position in the list given to `step`).
#[derive(Clone, Debug)]
pub struct Sgd {
    /// Learning rate.
    pub lr: f64,
    /// Momentum factor (0: plain SGD).
    pub momentum: f64,
    /// Dampening of the gradient added to the momentum buffer.
    pub dampening: f64,
    /// L2 penalty added to the gradient (`g + weight_decay * p`, coupled, as in `torch.optim.SGD`).
    pub weight_decay: f64,
    /// Nesterov momentum: step along `g + momentum * buffer`.
    pub nesterov: bool,
    buffers: Vec<Option<Tensor>>,
}

impl Sgd {
    /// Plain SGD with learning rate `lr`: `p <- p - lr * g`.
    pub fn new(lr: f64) -> Self {
        Sgd {
            lr,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            buffers: Vec::new(),
        }
    }

    /// SGD with momentum `momentum` (PyTorch's update: the buffer starts as the first gradient, then
    /// `b <- momentum * b + (1 - dampening) * g`, and the step is `lr * b`).
    pub fn with_momentum(lr: f64, momentum: f64) -> Self {
        Sgd {
            momentum,
            ..Sgd::new(lr)
        }
    }

    /// Refuses the settings `torch.optim.SGD` refuses: a negative (or non-finite) learning rate, momentum or
    /// weight decay, and Nesterov momentum without momentum or with dampening.
    fn check(&self) -> Result<()> {
        let valid = |v: f64| v.is_finite() && v >= 0.0;
        let message = if !(valid(self.lr) && valid(self.momentum) && valid(self.weight_decay)) {
            "the learning rate, momentum and weight decay must be finite and not negative"
        } else if !self.dampening.is_finite() {
            "the dampening must be finite"
        } else if self.nesterov && (self.momentum == 0.0 || self.dampening != 0.0) {
            "Nesterov momentum needs a momentum and no dampening"
        } else {
            return Ok(());
        };
        Err(Error::Invalid {
            op: "Sgd::step",
            message: format!(
                "{message}: lr {}, momentum {}, dampening {}, weight decay {}, nesterov {}",
                self.lr, self.momentum, self.dampening, self.weight_decay, self.nesterov
            ),
        })
    }

    /// Applies one update to every parameter that has a gradient and clears the gradients. `params` must list the
    /// same parameters in the same order at every step (the momentum buffers follow the positions).
    pub fn step(&mut self, params: &[Tensor]) -> Result<()> {
        self.check()?;
        if self.buffers.len() < params.len() {
            self.buffers.resize(params.len(), None);
        }
        no_grad(|| {
            for (p, buffer) in params.iter().zip(self.buffers.iter_mut()) {
                let Some(mut g) = p.grad() else { continue };
                if self.weight_decay != 0.0 {
                    g = g.add(&p.mul_scalar(self.weight_decay)?)?;
                }
                if self.momentum != 0.0 {
                    let b = match buffer.take() {
                        None => g.contiguous()?,
                        Some(b) => b.mul_scalar(self.momentum)?.add(&g.mul_scalar(1.0 - self.dampening)?)?,
                    };
                    g = if self.nesterov {
                        g.add(&b.mul_scalar(self.momentum)?)?
                    } else {
                        b.clone()
                    };
                    *buffer = Some(b);
                }
                p.assign(&p.sub(&g.mul_scalar(self.lr)?)?)?;
                p.zero_grad();
            }
            Ok(())
        })
    }
}
