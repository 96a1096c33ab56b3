//! AdamW with decoupled weight decay, `torch.optim.AdamW`'s math, fused launches over many parameter tensors.

use std::collections::HashMap;

use hierarchos_core::ops::adamw::{AdamWStep, AdamWUpdate, ClipGate, adamw_update_many};
use hierarchos_core::{DType, Tensor, no_grad};

use crate::error::{Error, Result};

/// AdamW's settings; the defaults are PyTorch's.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdamWConfig {
    /// Decay rate of the first moment.
    pub beta1: f64,
    /// Decay rate of the second moment.
    pub beta2: f64,
    /// Added to the denominator.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Leave biases and norm weights undecayed, as transformers' `Trainer` does (see [`trainer_leaves_undecayed`]);
    /// PyTorch's default (off) decays every parameter.
    pub no_decay_1d: bool,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            no_decay_1d: false,
        }
    }
}

/// Whether transformers' `Trainer` leaves the parameter called `name` out of weight decay by its name: `bias`,
/// `layernorm`, `rmsnorm`, a `norm` module or one ending in `_norm`. Its other rule, every parameter of an
/// `nn.LayerNorm`, covers 1-D parameters only, which are left undecayed anyway; the names catch the 2-D norm
/// weights of Cohere's per-head query and key norms.
pub fn trainer_leaves_undecayed(name: &str) -> bool {
    let name = name.to_lowercase();
    ["bias", "layernorm", "rmsnorm"].iter().any(|w| name.contains(w))
        || name
            .split('.')
            .any(|module| module == "norm" || module.ends_with("_norm"))
}

/// The state AdamW keeps for one parameter.
#[derive(Clone, Debug)]
pub struct Moments {
    /// First moment (running mean of the gradient).
    pub m: Tensor,
    /// Second moment (running mean of its square).
    pub v: Tensor,
    /// Steps this parameter has taken (a parameter without a gradient in a step does not advance, as in PyTorch).
    pub step: u64,
}

/// The optimizer: settings plus per-parameter moments, keyed by parameter name so that a checkpoint can save and
/// restore them.
#[derive(Clone, Debug)]
pub struct AdamW {
    /// Settings.
    pub config: AdamWConfig,
    moments: HashMap<String, Moments>,
    /// The parameters the last step counted, so that a step the device skipped can be taken back.
    last_stepped: Vec<String>,
}

impl AdamW {
    /// An optimizer with no state yet (moments start at zero on each parameter's first step).
    pub fn new(config: AdamWConfig) -> Result<AdamW> {
        let c = &config;
        let ok = (0.0..1.0).contains(&c.beta1)
            && (0.0..1.0).contains(&c.beta2)
            && c.eps.is_finite()
            && c.eps > 0.0
            && c.weight_decay.is_finite()
            && c.weight_decay >= 0.0;
        if !ok {
            return Err(Error::Invalid(format!(
                "AdamW: betas must lie in [0, 1), eps be positive and weight decay non-negative, got {c:?}"
            )));
        }
        Ok(AdamW {
            config,
            moments: HashMap::new(),
            last_stepped: Vec::new(),
        })
    }

    /// One step at learning rate `lr` over the named parameters that have a gradient, each gradient first
    /// multiplied by `grad_scale` (1 for none); clears the gradients.
    pub fn step(&mut self, params: &[(String, Tensor)], lr: f64, grad_scale: f64) -> Result<()> {
        self.step_clipped(params, lr, grad_scale, None)
    }

    /// [`AdamW::step`], with the gradients also clipped by `gate` on the device, which skips the update where the
    /// step's loss or gradient norm is not finite; [`AdamW::retract_last_step`] then takes its counts back.
    pub fn step_clipped(
        &mut self,
        params: &[(String, Tensor)],
        lr: f64,
        grad_scale: f64,
        gate: Option<&ClipGate<'_>>,
    ) -> Result<()> {
        if !(lr.is_finite() && lr >= 0.0) {
            return Err(Error::Invalid(format!(
                "AdamW: learning rate {lr} is not a finite non-negative number"
            )));
        }
        no_grad(|| {
            let mut steps = Vec::new();
            for (name, p) in params {
                let Some(g) = p.grad() else { continue };
                let state = match self.moments.entry(name.clone()) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => e.insert(Moments {
                        m: Tensor::zeros(p.shape(), DType::F32, p.device())?,
                        v: Tensor::zeros(p.shape(), DType::F32, p.device())?,
                        step: 0,
                    }),
                };
                let decay = if self.config.no_decay_1d && (p.rank() <= 1 || trainer_leaves_undecayed(name)) {
                    0.0
                } else {
                    self.config.weight_decay
                };
                let s = AdamWStep {
                    lr,
                    beta1: self.config.beta1,
                    beta2: self.config.beta2,
                    eps: self.config.eps,
                    weight_decay: decay,
                    step: state.step + 1,
                    grad_scale,
                };
                steps.push((name, p, g, s));
            }
            let updates: Vec<AdamWUpdate<'_>> = steps
                .iter()
                .map(|(name, p, g, s)| {
                    let state = &self.moments[name.as_str()];
                    let u = AdamWUpdate {
                        param: p,
                        grad: g,
                        m: &state.m,
                        v: &state.v,
                        step: *s,
                    };
                    u.check().map(|()| u).map_err(|source| Error::Param {
                        name: name.to_string(),
                        source,
                    })
                })
                .collect::<Result<_>>()?;
            adamw_update_many(&updates, gate)?;
            self.last_stepped.clear();
            for (name, p, _, _) in &steps {
                if let Some(state) = self.moments.get_mut(name.as_str()) {
                    state.step += 1;
                    self.last_stepped.push(name.to_string());
                }
                p.zero_grad();
            }
            Ok(())
        })
    }

    /// Takes back the step counts of the last step, which the device skipped (its gate saw a non-finite loss or
    /// norm, so the parameters and moments are as they were): the bias corrections resume where they were.
    pub fn retract_last_step(&mut self) {
        for name in self.last_stepped.drain(..) {
            if let Some(state) = self.moments.get_mut(&name) {
                state.step -= 1;
            }
        }
    }

    /// The moments of each parameter that has taken a step, by name (what a checkpoint saves).
    pub fn moments(&self) -> &HashMap<String, Moments> {
        &self.moments
    }

    /// Replaces the state with `moments` (from a checkpoint).
    pub fn set_moments(&mut self, moments: HashMap<String, Moments>) {
        self.moments = moments;
        self.last_stepped.clear();
    }
}
