//! Learning-rate schedules with linear warmup, as transformers' `get_scheduler` computes them (a `LambdaLR` over
//! optimizer steps counted from 0), so a run here follows the same curve as a `Trainer` run with the same flags.

use std::f64::consts::PI;

use crate::error::{Error, Result};

/// The shape of the learning-rate curve after warmup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LrScheduler {
    /// The base rate throughout (after any warmup: transformers' `constant_with_warmup`).
    Constant,
    /// Linear decay from the base rate to 0 at the last step.
    Linear,
    /// Half a cosine from the base rate to 0 at the last step.
    Cosine,
}

impl std::str::FromStr for LrScheduler {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "constant" => Ok(LrScheduler::Constant),
            "linear" => Ok(LrScheduler::Linear),
            "cosine" => Ok(LrScheduler::Cosine),
            other => Err(Error::Invalid(format!(
                "unknown learning-rate scheduler '{other}' (expected constant, linear or cosine)"
            ))),
        }
    }
}

/// When and how fast the learning rate moves.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Schedule {
    /// Peak learning rate.
    pub lr: f64,
    /// Curve after warmup.
    pub scheduler: LrScheduler,
    /// Steps of linear warmup from 0.
    pub warmup_steps: usize,
    /// Total optimizer steps (where linear and cosine reach 0).
    pub total_steps: usize,
}

impl Schedule {
    /// The learning rate of optimizer step `step` (0 for the first): `lr` times transformers' lambda. The first
    /// step of a warmup runs at rate 0, as there.
    pub fn lr_at(&self, step: usize) -> f64 {
        let (step, warmup, total) = (step as f64, self.warmup_steps as f64, self.total_steps as f64);
        if step < warmup {
            return self.lr * step / warmup.max(1.0);
        }
        let progress = (step - warmup) / (total - warmup).max(1.0);
        let factor = match self.scheduler {
            LrScheduler::Constant => 1.0,
            LrScheduler::Linear => ((total - step) / (total - warmup).max(1.0)).max(0.0),
            LrScheduler::Cosine => (0.5 * (1.0 + (PI * progress).cos())).max(0.0),
        };
        self.lr * factor
    }
}
