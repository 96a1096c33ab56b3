//! What a training run is besides its weights and moments: the step, the data position and the settings, which
//! checkpoints save so that a resumed run continues exactly (on the web too, where there are no checkpoint files).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::train::data::BatcherState;
use crate::train::precision::LossScale;
use crate::train::trainer::TrainConfig;

/// The format tag of [`TrainingState`].
pub(crate) const STATE_FORMAT: &str = "hierarchos-train-1";

/// Everything besides weights and moments that a resumed run needs to continue exactly.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainingState {
    /// Always `hierarchos-train-1`.
    pub format: String,
    /// Optimizer steps completed.
    pub step: usize,
    /// Where the batch order stands.
    pub batcher: BatcherState,
    /// Steps each parameter has taken (AdamW's bias corrections).
    pub param_steps: BTreeMap<String, u64>,
    /// The settings of the run.
    pub config: TrainConfig,
    /// The `--data` argument.
    pub data: String,
    /// The dtype a frozen base is held in while an adapter trains (`f16`, `bf16`; f32 when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_dtype: Option<String>,
    /// The loss scale of an f16 run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<LossScale>,
}

/// The state of a new run, before its first step.
pub fn initial_state(config: &TrainConfig, data: &str, batcher: BatcherState) -> TrainingState {
    TrainingState {
        format: STATE_FORMAT.into(),
        step: 0,
        batcher,
        param_steps: BTreeMap::new(),
        config: config.clone(),
        data: data.into(),
        base_dtype: None,
        loss_scale: None,
    }
}
