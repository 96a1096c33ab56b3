//! The token embedding table.

use hierarchos_core::{CmpOp, DType, Result, Tensor, grad_enabled};

/// Maps token ids to rows of `weight` (`[vocab, hidden]`); with tied embeddings the same matrix is the output
/// projection.
#[derive(Clone, Debug)]
pub struct Embedding {
    /// `[vocab, hidden]`.
    pub weight: Tensor,
    /// A row the lookup passes no gradient to (transformers' `padding_idx`, the padding token's): training
    /// leaves it as it is wherever that id occurs in the data, as PyTorch's `nn.Embedding` does.
    pub padding_idx: Option<usize>,
}

impl Embedding {
    /// Rows of `weight` for `ids` (u32 or i32, any shape): `ids.shape + [hidden]`, in f32, the dtype the model
    /// computes in (a 16-bit table is a frozen base held in less memory).
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let rows = Tensor::embedding(&self.weight, ids)?;
        let rows = match self.padding_idx {
            Some(pad) if grad_enabled() && self.weight.requires_grad() => {
                // The same values either way; the padding positions' are taken detached.
                let trained = ids.compare_scalar(pad as f64, CmpOp::Ne)?.unsqueeze(-1)?;
                trained.where_cond(&rows, &rows.detach())?
            }
            _ => rows,
        };
        rows.to_dtype(DType::F32)
    }

    /// The parameters with their Hugging Face names.
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        vec![("weight".to_string(), self.weight.clone())]
    }
}
