//! Mixed precision in the manner of `torch.autocast`: inside [`autocast`], matrix products of f32 operands run in
//! a 16-bit dtype (f16 on tensor cores where the adapter has them) and hand back f32, while every other op stays
//! in f32, except flash attention, which under f16 runs on tensor cores too where it can (heads of 64; see
//! [`Tensor::flash_attention`](crate::Tensor::flash_attention)). The casts record backward rules, so f32
//! parameters (the master weights) receive f32 gradients.

use std::cell::Cell;
use std::sync::{Arc, Mutex, Weak};
use std::thread::ThreadId;

use crate::error::{Error, Result};
use crate::shape::Layout;
use crate::tensor::Tensor;
use hierarchos_wgpu::{DType, GpuBuffer};

thread_local! {
    static AUTOCAST: Cell<Option<DType>> = const { Cell::new(None) };
}

/// The casts kept for reuse, of every thread: each thread's autocast scope reads its own, but a write on any
/// thread (tensors move between threads) must drop the casts of what it wrote wherever they are kept.
static RECENT_CASTS: Mutex<Vec<RecentCast>> = Mutex::new(Vec::new());

/// A 16-bit cast made inside `thread`'s current [`autocast`] scope, of the tensor viewing `source` through
/// `layout`. The weak reference keeps the buffer's address from being reused while the entry exists.
struct RecentCast {
    thread: ThreadId,
    source: Weak<GpuBuffer>,
    layout: Layout,
    cast: Tensor,
}

/// Casts kept for reuse per thread: the projections of one input (q, k and v; gate and up) follow each other.
const RECENT_CASTS_KEPT: usize = 2;

fn recent_casts() -> std::sync::MutexGuard<'static, Vec<RecentCast>> {
    RECENT_CASTS.lock().unwrap_or_else(|p| p.into_inner())
}

/// The 16-bit cast `cast()` makes of `t`, shared by the products of one scope that read the same activation: an op's
/// result (it has autograd history) is written once, so equal buffers and layouts mean equal values, and any write
/// into an existing tensor forgets the casts kept of its buffer ([`forget_casts_of`]). The q, k and v projections
/// then cast their input once, and keep one copy for their backward instead of three. Tensors without history
/// (weights, which optimizers update in place, caches) are cast every time.
pub(crate) fn shared_cast(t: &Tensor, dtype: DType, cast: impl FnOnce() -> Result<Tensor>) -> Result<Tensor> {
    if t.is_leaf_view() {
        return cast();
    }
    let thread = std::thread::current().id();
    let source = Arc::as_ptr(t.shared_buffer());
    let hit = recent_casts()
        .iter()
        .find(|c| {
            c.thread == thread
                && c.cast.dtype() == dtype
                && std::ptr::eq(c.source.as_ptr(), source)
                && c.layout == *t.layout()
        })
        .map(|c| c.cast.clone());
    if let Some(cast) = hit {
        return Ok(cast);
    }
    let made = cast()?;
    let mut kept = recent_casts();
    if kept.iter().filter(|c| c.thread == thread).count() == RECENT_CASTS_KEPT
        && let Some(oldest) = kept.iter().position(|c| c.thread == thread)
    {
        kept.remove(oldest);
    }
    kept.push(RecentCast {
        thread,
        source: Arc::downgrade(t.shared_buffer()),
        layout: t.layout().clone(),
        cast: made.clone(),
    });
    Ok(made)
}

/// The dtype matrix products run in on this thread inside [`autocast`] (`None` outside).
pub fn autocast_dtype() -> Option<DType> {
    AUTOCAST.with(Cell::get)
}

/// Forgets the casts kept of `buffer`, on every thread: called by every op that writes into an existing tensor.
pub(crate) fn forget_casts_of(buffer: &Arc<GpuBuffer>) {
    recent_casts().retain(|c| !std::ptr::eq(c.source.as_ptr(), Arc::as_ptr(buffer)));
}

/// Forgets this thread's kept casts: they belong to one pass over the model, one autocast scope.
fn forget_this_threads_casts() {
    let thread = std::thread::current().id();
    recent_casts().retain(|c| c.thread != thread);
}

/// Runs `f` with matrix products of f32 operands computed in `dtype` (f16 or bf16): operands are rounded to it,
/// the product accumulates in f32 and comes back as f32. Nested calls take the innermost dtype; the previous
/// one returns when `f` does. Backward may run outside or inside: the recorded products are already 16-bit ones,
/// and products of the backward itself run as their forward did.
pub fn autocast<T>(dtype: DType, f: impl FnOnce() -> T) -> Result<T> {
    if !matches!(dtype, DType::F16 | DType::BF16) {
        return Err(Error::Invalid {
            op: "autocast",
            message: format!("products run in f16 or bf16, not {dtype}"),
        });
    }
    let _scope = AutocastScope::enter(Some(dtype));
    Ok(f())
}

/// The products' dtype on this thread (`None`: autocast off) until dropped, then the previous one again. Entering
/// and leaving forget the kept casts: they belong to one pass over the model. The backward pass runs with
/// autocast off, so that its rules run in the precision their forward recorded (as torch's do), also when
/// `backward()` is called inside an [`autocast`] scope.
pub(crate) struct AutocastScope(Option<DType>);

impl AutocastScope {
    /// Sets the dtype, keeping the previous one to restore.
    pub(crate) fn enter(dtype: Option<DType>) -> AutocastScope {
        forget_this_threads_casts();
        AutocastScope(AUTOCAST.with(|a| a.replace(dtype)))
    }
}

impl Drop for AutocastScope {
    fn drop(&mut self) {
        AUTOCAST.with(|a| a.set(self.0));
        forget_this_threads_casts();
    }
}
