//! Mixed-precision training: the matrix products of the forward (and so of the backward) in a 16-bit dtype under
//! [`hierarchos_core::autocast`], with f32 master weights, optimizer moments and every other op; f16 adds dynamic
//! loss scaling, as PyTorch's `GradScaler`, so that small gradients do not vanish below its range.

use std::fmt;
use std::str::FromStr;

use hierarchos_core::DType;
use serde::{Deserialize, Serialize};

use crate::error::Error;

/// The dtype a run's matrix products compute in (`--dtype`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Everything in f32.
    #[default]
    F32,
    /// Products in f16 (tensor cores where the adapter has cooperative matrices), with loss scaling.
    F16,
    /// Products in bf16 (f32's range: no loss scaling).
    Bf16,
}

impl Precision {
    /// The autocast dtype of the products (`None` for f32).
    pub fn autocast(self) -> Option<DType> {
        match self {
            Precision::F32 => None,
            Precision::F16 => Some(DType::F16),
            Precision::Bf16 => Some(DType::BF16),
        }
    }
}

impl FromStr for Precision {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(Precision::F32),
            "f16" | "float16" | "fp16" => Ok(Precision::F16),
            "bf16" | "bfloat16" => Ok(Precision::Bf16),
            other => Err(Error::Invalid(format!(
                "precision '{other}': expected f32, f16 or bf16"
            ))),
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Precision::F32 => "f32",
            Precision::F16 => "f16",
            Precision::Bf16 => "bf16",
        })
    }
}

/// Whether `x` is a positive power of two (a normal f64 with no fraction bits): multiplying by one is exact
/// wherever the result stays normal, which both the loss scale and LoRA's folded scaling rely on.
pub(crate) fn is_power_of_two(x: f64) -> bool {
    x.is_normal() && x > 0.0 && x.to_bits() & ((1 << 52) - 1) == 0
}

/// The dynamic loss scale of an f16 run (`GradScaler`'s defaults): the loss is multiplied by `scale` before the
/// backward and the gradients divided by it before the update; a step whose gradients overflow is skipped and
/// halves the scale, and every [`LossScale::GROWTH_INTERVAL`] steps in a row without overflow double it. The
/// trainer keeps this on the host as of the last step read back, and the same on the device for the steps it
/// records ahead (`hierarchos_core::ops::loss_scale::loss_scale_update`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LossScale {
    /// The current factor.
    pub scale: f64,
    /// Steps without overflow since the scale last changed.
    pub good_steps: usize,
}

impl Default for LossScale {
    fn default() -> Self {
        LossScale {
            scale: LossScale::INITIAL,
            good_steps: 0,
        }
    }
}

impl LossScale {
    /// The first scale, 2^16.
    pub const INITIAL: f64 = 65536.0;
    /// Steps without overflow before the scale doubles.
    pub const GROWTH_INTERVAL: usize = 2000;
    /// The smallest and largest scales: their inverses, which unscale the gradients, are normal f32 values too
    /// (the device kernel, `wgsl/loss_scale.wgsl`, keeps the same bounds).
    pub const RANGE: std::ops::RangeInclusive<f64> = 1.0 / (1u128 << 126) as f64..=(1u128 << 126) as f64;

    /// Records a step whose scaled gradients were `finite` (or overflowed) and returns whether the optimizer
    /// should take it.
    pub fn update(&mut self, finite: bool) -> bool {
        if !finite {
            if self.scale > *Self::RANGE.start() {
                self.scale *= 0.5;
            }
            self.good_steps = 0;
            return false;
        }
        self.good_steps += 1;
        if self.good_steps == Self::GROWTH_INTERVAL {
            if self.scale < *Self::RANGE.end() {
                self.scale *= 2.0;
            }
            self.good_steps = 0;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_halves_and_a_run_of_good_steps_doubles() {
        let mut s = LossScale::default();
        assert!(!s.update(false));
        assert_eq!((s.scale, s.good_steps), (32768.0, 0));
        for _ in 0..LossScale::GROWTH_INTERVAL - 1 {
            assert!(s.update(true));
        }
        assert_eq!(s.scale, 32768.0);
        assert!(s.update(true));
        assert_eq!((s.scale, s.good_steps), (65536.0, 0));
    }

    #[test]
    fn the_scale_stays_where_its_inverse_is_normal() {
        let (low, high) = (*LossScale::RANGE.start(), *LossScale::RANGE.end());
        let mut s = LossScale {
            scale: low,
            good_steps: 5,
        };
        assert!(!s.update(false));
        assert_eq!((s.scale, s.good_steps), (low, 0));
        s.scale = high;
        for _ in 0..LossScale::GROWTH_INTERVAL {
            assert!(s.update(true));
        }
        assert_eq!((s.scale, s.good_steps), (high, 0));
    }

    #[test]
    fn precisions_parse_and_print() {
        for p in [Precision::F32, Precision::F16, Precision::Bf16] {
            assert_eq!(p.to_string().parse::<Precision>().unwrap(), p);
        }
        assert_eq!("FP16".parse::<Precision>().unwrap(), Precision::F16);
        assert!(
            "f64"
                .parse::<Precision>()
                .unwrap_err()
                .to_string()
                .contains("f32, f16 or bf16")
        );
    }
}
