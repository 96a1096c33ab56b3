//! Gradient clipping by global norm, as `torch.nn.utils.clip_grad_norm_`: the squared norm stays on the device,
//! where the optimizer's fused update takes the factor from it (`hierarchos_core::ops::adamw::ClipGate`) rather
//! than every gradient being rewritten; it is read back with the loss for the log line, a non-finite one stopping
//! training.

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
