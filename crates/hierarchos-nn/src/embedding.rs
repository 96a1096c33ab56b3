//! The token embedding table.

use hierarchos_core::{DType, Result, Tensor};

/// Maps token ids to rows of `weight` (`[vocab, hidden]`); with tied embeddings the same matrix is the output
/// projection.
#[derive(Clone, Debug)]
pub struct Embedding {
    /// `[vocab, hidden]`.
    pub weight: Tensor,
}

impl Embedding {
    /// Rows of `weight` for `ids` (u32 or i32, any shape): `ids.shape + [hidden]`, in f32, the dtype the model
    /// computes in (a 16-bit table is a frozen base held in less memory).
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        Tensor::embedding(&self.weight, ids)?.to_dtype(DType::F32)
    }

    /// The parameters with their Hugging Face names.
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        vec![("weight".to_string(), self.weight.clone())]
    }
}
