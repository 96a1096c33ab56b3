//! Errors of model loading, tokenization and generation: each names the file, tensor or step at fault.

use std::path::PathBuf;

/// What can go wrong between a model folder and generated text.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `config.json` is missing, malformed or inconsistent.
    #[error("{path}: {message}")]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The `model_type` is not one Hierarchos runs.
    #[error("{path}: unknown model_type '{found}'; supported: {supported}")]
    UnknownModelType {
        /// The config file.
        path: PathBuf,
        /// The type found.
        found: String,
        /// Comma-separated supported types.
        supported: String,
    },
    /// A weights file is corrupt, or a tensor is missing or misshapen.
    #[error("{path}: {message}")]
    Weights {
        /// The safetensors (or index) file.
        path: PathBuf,
        /// What is wrong, naming the tensor.
        message: String,
    },
    /// The tokenizer files are missing or malformed.
    #[error("{path}: {message}")]
    Tokenizer {
        /// The tokenizer file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Fetching from the Hugging Face Hub failed (or offline and not cached).
    #[error("hub: {0}")]
    Hub(String),
    /// Bad arguments to generation or a model call.
    #[error("{0}")]
    Invalid(String),
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A tensor op on a named parameter failed (in an optimizer step, say).
    #[error("parameter {name}: {source}")]
    Param {
        /// The parameter, by its Hugging Face name.
        name: String,
        /// What failed.
        source: hierarchos_core::Error,
    },
    /// Training met a NaN or infinite value; the step's update was not applied.
    #[error("step {step}: the {what} is {value}; training stopped (checkpoints saved before it are intact)")]
    NonFinite {
        /// The step (1-based) that failed.
        step: usize,
        /// `loss` or `gradient norm`.
        what: &'static str,
        /// The value found.
        value: f64,
    },
    /// A tensor op failed.
    #[error(transparent)]
    Tensor(#[from] hierarchos_core::Error),
}

/// Result alias of `hierarchos-nn`.
pub type Result<T> = std::result::Result<T, Error>;
