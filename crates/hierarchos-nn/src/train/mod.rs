//! Training, of every parameter or of a LoRA adapter: data, learning-rate schedules, the training step with
//! gradient accumulation and clipping, evaluation, and checkpoints that resume exactly.

#[cfg(not(target_arch = "wasm32"))]
pub mod checkpoint;
pub mod data;
#[cfg(not(target_arch = "wasm32"))]
mod files;
pub mod precision;
mod rows;
pub mod schedule;
#[cfg(not(target_arch = "wasm32"))]
pub mod setup;
pub mod state;
pub mod trainer;

pub use precision::{LossScale, Precision};
pub use schedule::{LrScheduler, Schedule};
#[cfg(not(target_arch = "wasm32"))]
pub use trainer::evaluate;
pub use trainer::{EvalStats, StepStats, TrainConfig, Trainer};
