//! Gradient clipping by global norm, as `torch.nn.utils.clip_grad_norm_`: the norm is read back once per step
//! (the log line shows it and a non-finite one stops training), and the factor is applied inside the optimizer's
//! fused update rather than by rewriting every gradient.

use hierarchos_core::Tensor;

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
    let grads: Vec<Tensor> = params.iter().filter_map(|(_, p)| p.grad()).collect();
    if grads.is_empty() {
        return Ok(None);
    }
    Ok(Some(Tensor::sum_squares_of(&grads.iter().collect::<Vec<_>>())?))
}

/// The factor `clip_grad_norm_` scales gradients by for a global norm `norm` and a limit `max_norm` (0 or less:
/// no clipping): `max_norm / (norm + 1e-6)`, at most 1.
pub fn clip_factor(norm: f64, max_norm: f64) -> f64 {
    if max_norm <= 0.0 {
        return 1.0;
    }
    (max_norm / (norm + 1e-6)).min(1.0)
}
