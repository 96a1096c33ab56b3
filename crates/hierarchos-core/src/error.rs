//! Errors of tensor operations.

use hierarchos_wgpu::{DType, GpuError};

/// What a tensor operation can refuse. Each variant names the op so that an error deep inside a model points at
/// the call that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Shapes that must agree (or broadcast) do not.
    #[error("{op}: shape mismatch: {lhs:?} vs {rhs:?}")]
    ShapeMismatch {
        /// Operation.
        op: &'static str,
        /// First shape.
        lhs: Vec<usize>,
        /// Second shape.
        rhs: Vec<usize>,
    },
    /// A tensor has the wrong number of dimensions.
    #[error("{op}: expected rank {expected}, got shape {got:?}")]
    RankMismatch {
        /// Operation.
        op: &'static str,
        /// What the op needs (e.g. "2", ">= 1").
        expected: String,
        /// The shape given.
        got: Vec<usize>,
    },
    /// A dtype the op does not accept, or two dtypes that must agree.
    #[error("{op}: dtype mismatch: expected {expected}, got {got}")]
    DTypeMismatch {
        /// Operation.
        op: &'static str,
        /// What the op needs.
        expected: String,
        /// What it got.
        got: DType,
    },
    /// A dimension or index outside its range.
    #[error("{op}: index {index} out of range for size {size}")]
    IndexOutOfRange {
        /// Operation.
        op: &'static str,
        /// The offending index.
        index: i64,
        /// The valid size.
        size: usize,
    },
    /// Any other invalid argument (element count for a reshape, empty list for cat, ...).
    #[error("{op}: {message}")]
    Invalid {
        /// Operation.
        op: &'static str,
        /// What is wrong.
        message: String,
    },
    /// Autograd misuse: backward from a non-scalar, twice through a freed graph, on a tensor without grad.
    #[error("autograd: {0}")]
    Autograd(String),
    /// The GPU runtime failed.
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

/// Result alias of tensor operations.
pub type Result<T> = std::result::Result<T, Error>;
