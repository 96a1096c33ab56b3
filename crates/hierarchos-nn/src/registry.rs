//! The model families Hierarchos runs, keyed by the `model_type` of `config.json`. Anything else fails closed, so a
//! model that merely looks similar is never run with the wrong architecture.

use std::path::Path;

use crate::error::{Error, Result};

/// The decoder families one generic decoder covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Llama 1-3 (incl. llama3 rope scaling, optional attention and MLP biases).
    Llama,
    /// Mistral (sliding-window attention).
    Mistral,
    /// Qwen2 / Qwen2.5 (bias on q, k and v).
    Qwen2,
    /// Qwen3 (per-head RMSNorm on queries and keys).
    Qwen3,
}

/// Every supported family, in the order errors list them.
pub const SUPPORTED: [Family; 4] = [Family::Llama, Family::Mistral, Family::Qwen2, Family::Qwen3];

impl Family {
    /// The family of `model_type`; `path` names the config file in the error listing the supported types.
    pub fn from_model_type(model_type: &str, path: &Path) -> Result<Family> {
        SUPPORTED
            .into_iter()
            .find(|family| family.model_type() == model_type)
            .ok_or_else(|| Error::UnknownModelType {
                path: path.to_path_buf(),
                found: model_type.to_string(),
                supported: supported_model_types().join(", "),
            })
    }

    /// The `model_type` string of `config.json`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Mistral => "mistral",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
        }
    }
}

/// The supported `model_type`s, for help texts and errors.
pub fn supported_model_types() -> Vec<&'static str> {
    SUPPORTED.into_iter().map(Family::model_type).collect()
}
