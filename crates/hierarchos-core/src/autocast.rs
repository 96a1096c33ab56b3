//! Mixed precision in the manner of `torch.autocast`: inside [`autocast`], matrix products of f32 operands run in
//! a 16-bit dtype (f16 on tensor cores where the adapter has them) and hand back f32, while every other op stays
//! in f32, except flash attention, which under f16 runs on tensor cores too where it can (heads of 64; see
//! [`Tensor::flash_attention`](crate::Tensor::flash_attention)). The casts record backward rules, so f32
//! parameters (the master weights) receive f32 gradients.

use std::cell::Cell;

use crate::error::{Error, Result};
use hierarchos_wgpu::DType;

thread_local! {
    static AUTOCAST: Cell<Option<DType>> = const { Cell::new(None) };
}

/// The dtype matrix products run in on this thread inside [`autocast`] (`None` outside).
pub fn autocast_dtype() -> Option<DType> {
    AUTOCAST.with(Cell::get)
}

/// Runs `f` with matrix products of f32 operands computed in `dtype` (f16 or bf16): operands are rounded to it,
/// the product accumulates in f32 and comes back as f32. Nested calls take the innermost dtype; the previous
/// one returns when `f` does. Backward may run outside: the recorded products are already 16-bit ones.
pub fn autocast<T>(dtype: DType, f: impl FnOnce() -> T) -> Result<T> {
    if !matches!(dtype, DType::F16 | DType::BF16) {
        return Err(Error::Invalid {
            op: "autocast",
            message: format!("products run in f16 or bf16, not {dtype}"),
        });
    }
    struct Restore(Option<DType>);
    impl Drop for Restore {
        fn drop(&mut self) {
            AUTOCAST.with(|a| a.set(self.0));
        }
    }
    let _restore = Restore(AUTOCAST.with(|a| a.replace(Some(dtype))));
    Ok(f())
}
