//! Dynamic loss scaling's bookkeeping on the device. An f16 run multiplies its loss by a scale that halves after
//! a step whose gradients overflowed and doubles after a run of good steps (PyTorch's `GradScaler`). Kept on the
//! device, the scale reaches the next step's backward without the host reading this step's gradient norm back
//! first, so that the GPU need not wait for the host between steps.

use std::sync::Arc;

use hierarchos_wgpu::{DType, Dispatch, Gpu, Language};

use crate::error::{Error, Result};
use crate::ops::adamw::FINITE;
use crate::tensor::Tensor;

const LOSS_SCALE_WGSL: &str = include_str!("../../../../wgsl/loss_scale.wgsl");
const OP: &str = "loss_scale_update";

/// Updates `state`, `[scale, 1 / scale, good steps]` (dense f32), in place after a step whose statistics are
/// `stats`, `[loss, squared gradient norm, ..]` (f32, unit stride), as `GradScaler.update` with a backoff of 0.5,
/// a growth factor of 2 and `growth_interval`: where the loss is finite, a non-finite norm halves the scale and
/// restarts the count of good steps, and a finite one counts a good step; the `growth_interval`-th in a row
/// doubles the scale and restarts the count. The scale stays within 2^-126..2^126, so that the inverse beside it
/// (what the AdamW gate unscales the gradients by) stays an exact normal f32. Not recorded by autograd.
pub fn loss_scale_update(state: &Tensor, stats: &Tensor, growth_interval: u32) -> Result<()> {
    let invalid = |message: String| Error::Invalid { op: OP, message };
    if state.dtype() != DType::F32 || state.shape() != [3] || state.layout().strides != [1] {
        return Err(invalid(format!(
            "the state must be a dense f32 [scale, 1 / scale, good steps], got {} {:?}",
            state.dtype(),
            state.shape()
        )));
    }
    if stats.dtype() != DType::F32 || stats.rank() != 1 || stats.shape()[0] < 2 || stats.layout().strides != [1] {
        return Err(invalid(format!(
            "the statistics must be f32 [loss, squared gradient norm, ..] with unit stride, got {} {:?}",
            stats.dtype(),
            stats.shape()
        )));
    }
    // Good steps are counted in f32, exact up to 2^24.
    if !(1..1 << 24).contains(&growth_interval) {
        return Err(invalid(format!("growth interval {growth_interval} is not in 1..2^24")));
    }
    if !Arc::ptr_eq(state.device(), stats.device()) {
        return Err(invalid("the state and the statistics live on different devices".into()));
    }
    if std::ptr::eq(state.buffer(), stats.buffer()) {
        return Err(invalid("the state and the statistics share a buffer".into()));
    }
    state.mark_written();
    state.device().dispatch(Dispatch {
        op: OP,
        runtime_checks: false,
        language: Language::Wgsl,
        key: OP,
        source: &|| format!("{FINITE}{LOSS_SCALE_WGSL}"),
        buffers: &[state.buffer(), stats.buffer()],
        params: &[
            state.layout().offset as u32,
            stats.layout().offset as u32,
            growth_interval,
        ],
        workgroups: Gpu::grid(1),
    })?;
    Ok(())
}
