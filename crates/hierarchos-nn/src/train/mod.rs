//! Full-parameter training: data, learning-rate schedules, gradient clipping, the training loop and checkpoints
//! that resume exactly.

pub mod data;
