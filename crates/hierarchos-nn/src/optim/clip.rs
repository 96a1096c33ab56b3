//! Gradient clipping by global norm, as `torch.nn.utils.clip_grad_norm_`: the norm is read back once per step
//! (the log line shows it and a non-finite one stops training), and the factor is applied inside the optimizer's
//! fused update rather than by rewriting every gradient.

use hierarchos_core::{Tensor, no_grad};

use crate::error::Result;

/// The L2 norm of all the gradients of `params` together (parameters without a gradient count as zero).
#[cfg(not(target_arch = "wasm32"))]
pub fn grad_norm(params: &[(String, Tensor)]) -> Result<f64> {
    Ok(match grad_norm_squared(params)? {
        Some(s) => (s.to_vec::<f32>()?[0] as f64).sqrt(),
        None => 0.0,
    })
}

/// The squared global gradient norm as a one-element tensor on the device (`None` when no parameter has a
/// gradient): what [`grad_norm`] reads back, for a caller that reads it together with other values.
pub fn grad_norm_squared(params: &[(String, Tensor)]) -> Result<Option<Tensor>> {
    Ok(no_grad(|| -> hierarchos_core::Result<Option<Tensor>> {
        let mut parts = Vec::new();
        for (_, p) in params {
            if let Some(g) = p.grad() {
                // Squares summed along the last dimension first: one workgroup per row, where a sum over a whole
                // tensor would be a single workgroup walking all of it.
                let width = g.shape().last().copied().unwrap_or(1).max(1);
                let rows = g.reshape(&[g.numel() / width, width])?;
                parts.push(rows.sum_squares(&[-1], false)?);
            }
        }
        if parts.is_empty() {
            return Ok(None);
        }
        Ok(Some(Tensor::cat(&parts, 0)?.sum(&[], false)?))
    })?)
}

/// The factor `clip_grad_norm_` scales gradients by for a global norm `norm` and a limit `max_norm` (0 or less:
/// no clipping): `max_norm / (norm + 1e-6)`, at most 1.
pub fn clip_factor(norm: f64, max_norm: f64) -> f64 {
    if max_norm <= 0.0 {
        return 1.0;
    }
    (max_norm / (norm + 1e-6)).min(1.0)
}
