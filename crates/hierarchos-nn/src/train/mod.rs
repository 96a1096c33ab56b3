//! Training, of every parameter or of a LoRA adapter: data, learning-rate schedules, the training step with
//! gradient accumulation and clipping, evaluation, and checkpoints that resume exactly.

pub mod checkpoint;
pub mod data;
pub mod schedule;
pub mod setup;
pub mod trainer;

pub use schedule::{LrScheduler, Schedule};
pub use trainer::{EvalStats, StepStats, TrainConfig, Trainer, evaluate};
