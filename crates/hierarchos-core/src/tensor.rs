//! The tensor type: a view (shape, strides, offset) into a GPU buffer, plus its place on the autograd tape.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hierarchos_wgpu::{DType, Gpu, GpuBuffer};

use crate::autograd::{self, Edge, GradCell, Narrow, Node};
use crate::error::{Error, Result};
use crate::shape::{Layout, MAX_DIMS, checked_numel, numel, resolve_dim};

/// A handle to the GPU that tensors live on.
pub type Device = Arc<Gpu>;

/// The process-wide default device (chosen by `HIERARCHOS_ADAPTER`, features limited by `HIERARCHOS_DISABLE`).
#[cfg(not(target_arch = "wasm32"))]
pub fn default_device() -> Result<Device> {
    Ok(Gpu::default_gpu()?)
}

/// Host types that map to a tensor dtype.
pub trait Element: bytemuck::Pod + Copy + Send + Sync + 'static {
    /// The matching dtype.
    const DTYPE: DType;
    /// The value as an index (integer types only).
    fn as_id(self) -> Option<i64> {
        None
    }
}
impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
}
impl Element for half::bf16 {
    const DTYPE: DType = DType::BF16;
}
impl Element for u32 {
    const DTYPE: DType = DType::U32;
    fn as_id(self) -> Option<i64> {
        Some(self as i64)
    }
}
impl Element for i32 {
    const DTYPE: DType = DType::I32;
    fn as_id(self) -> Option<i64> {
        Some(self as i64)
    }
}

/// An n-dimensional array on the GPU. Cloning is cheap (shared storage); views share the buffer too.
#[derive(Clone)]
pub struct Tensor {
    inner: Arc<Inner>,
}

struct Inner {
    buffer: Arc<GpuBuffer>,
    /// The smallest and largest value of integer data uploaded from the host (or made by an op whose results
    /// are bounded, like argmax), shared by every view of the buffer and forgotten when a kernel writes into it:
    /// index ops use it instead of a range check that waits for the GPU (decoding would otherwise sync on every
    /// token's embedding lookup).
    id_range: Option<Arc<IdRange>>,
    /// Writes into the storage in place, shared by every view of it: the tape checks that the inputs an op
    /// recorded were not written before its backward reads them (see [`Tensor::write_count`]).
    writes: Arc<AtomicU64>,
    layout: Layout,
    dtype: DType,
    grad_fn: Option<Arc<Node>>,
    grad_cell: Option<Arc<GradCell>>,
}

/// Elements of a tensor on their way to the host (see [`Tensor::read_later`]).
pub struct PendingVec<T> {
    read: hierarchos_wgpu::PendingRead,
    element: std::marker::PhantomData<T>,
}

impl<T: Element> PendingVec<T> {
    /// Blocks until the copy is done and returns the elements.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn wait(self) -> Result<Vec<T>> {
        Ok(bytemuck::pod_collect_to_vec(&self.read.bytes()?))
    }

    /// The elements, once the copy is done (works on the web).
    pub async fn wait_async(self) -> Result<Vec<T>> {
        Ok(bytemuck::pod_collect_to_vec(&self.read.bytes_async().await?))
    }
}

/// See `Inner::id_range`.
struct IdRange {
    lo: i64,
    hi: i64,
    valid: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({:?}, {}", self.shape(), self.dtype())?;
        if let Some(n) = &self.inner.grad_fn {
            write!(f, ", grad_fn={}", n.name)?;
        } else if self.inner.grad_cell.is_some() {
            write!(f, ", requires_grad")?;
        }
        write!(f, ")")
    }
}

impl Tensor {
    /// Wraps a buffer; `node` is the op that made it (for autograd).
    pub(crate) fn from_parts(buffer: Arc<GpuBuffer>, layout: Layout, dtype: DType, node: Option<Arc<Node>>) -> Tensor {
        Tensor {
            inner: Arc::new(Inner {
                buffer,
                id_range: None,
                writes: Arc::default(),
                layout,
                dtype,
                grad_fn: node,
                grad_cell: None,
            }),
        }
    }

    /// Another tensor over the same storage (and what is known of its values).
    fn derive(&self, layout: Layout, node: Option<Arc<Node>>, grad_cell: Option<Arc<GradCell>>) -> Tensor {
        Tensor {
            inner: Arc::new(Inner {
                buffer: self.inner.buffer.clone(),
                id_range: self.inner.id_range.clone(),
                writes: self.inner.writes.clone(),
                layout,
                dtype: self.inner.dtype,
                grad_fn: node,
                grad_cell,
            }),
        }
    }

    /// A view of the same storage with another layout, cut off from the tape (for kernels that address a
    /// buffer region themselves).
    pub(crate) fn with_layout(&self, layout: Layout) -> Tensor {
        self.derive(layout, None, None)
    }

    /// The smallest and largest id of an integer tensor whose values the host uploaded (or a bounded op made)
    /// and no kernel has overwritten since (bounds of the whole buffer, so valid for any view of it).
    pub(crate) fn known_id_range(&self) -> Option<(i64, i64)> {
        let r = self.inner.id_range.as_ref()?;
        r.valid
            .load(std::sync::atomic::Ordering::Acquire)
            .then_some((r.lo, r.hi))
    }

    /// A freshly made integer tensor whose values are known to lie in `lo..=hi`.
    pub(crate) fn with_id_range(mut self, lo: i64, hi: i64) -> Tensor {
        Arc::get_mut(&mut self.inner).expect("a fresh tensor").id_range = Some(Arc::new(IdRange {
            lo,
            hi,
            valid: true.into(),
        }));
        self
    }

    /// Called by ops that write into an existing tensor: what the host knew of its values no longer holds, nor
    /// the 16-bit casts autocast keeps of it, and the write counts against the ops recorded with it.
    pub(crate) fn mark_written(&self) {
        if let Some(r) = &self.inner.id_range {
            r.valid.store(false, std::sync::atomic::Ordering::Release);
        }
        self.inner.writes.fetch_add(1, Ordering::AcqRel);
        crate::autocast::forget_casts_of(self.shared_buffer());
    }

    /// The storage's count of in-place writes, and the count now: a node keeps them for the inputs it recorded.
    pub(crate) fn write_count(&self) -> (Arc<AtomicU64>, u64) {
        let count = self.inner.writes.clone();
        let now = count.load(Ordering::Acquire);
        (count, now)
    }

    /// A fresh contiguous tensor around a newly written buffer.
    pub(crate) fn from_buffer(buffer: GpuBuffer, shape: &[usize], dtype: DType, node: Option<Arc<Node>>) -> Tensor {
        Tensor::from_parts(Arc::new(buffer), Layout::contiguous(shape), dtype, node)
    }

    /// The same tensor with `node` as its autograd history (for ops that compute first, record after).
    pub(crate) fn with_node(self, node: Option<Arc<Node>>) -> Tensor {
        match node {
            None => self,
            Some(n) => self.derive(self.inner.layout.clone(), Some(n), None),
        }
    }

    /// A view of the same storage with another layout, recorded with `backward` for autograd.
    pub(crate) fn view(&self, name: &'static str, layout: Layout, backward: autograd::BackwardFn) -> Tensor {
        let node = Node::record_view(name, self, backward);
        self.derive(layout, node, None)
    }

    /// Whether the tensor has no history but views: a leaf (a parameter, an input) or a view of one, whose
    /// storage its owner keeps alive anyway.
    pub(crate) fn is_leaf_view(&self) -> bool {
        self.inner.grad_fn.as_ref().is_none_or(|n| n.views_a_leaf())
    }

    /// Refuses shapes the kernels cannot take: more dimensions than they index, or more elements.
    pub(crate) fn check_shape(op: &'static str, shape: &[usize]) -> Result<()> {
        if shape.len() > MAX_DIMS {
            return Err(Error::RankMismatch {
                op,
                expected: format!("<= {MAX_DIMS}"),
                got: shape.to_vec(),
            });
        }
        // Kernels index elements with 32-bit words, and their loops step past the last index without wrapping
        // only below 2^31. A buffer never holds more elements than that (Vulkan binds at most 4 GiB), but a
        // broadcast view can: summed or multiplied over, it would come out wrong or loop forever.
        if checked_numel(shape).is_none_or(|n| n > i32::MAX as usize) {
            return Err(Error::Invalid {
                op,
                message: format!("shape {shape:?} has more elements than the kernels' 32-bit indices reach"),
            });
        }
        Ok(())
    }

    /// Bytes needed to store `n` elements of `dtype`, rounded up to whole 32-bit words.
    pub(crate) fn bytes_for(n: usize, dtype: DType) -> u64 {
        ((n * dtype.size()).next_multiple_of(4)) as u64
    }

    /// A tensor holding `data` with `shape`.
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize], device: &Device) -> Result<Tensor> {
        Tensor::check_shape("from_slice", shape)?;
        if data.len() != numel(shape) {
            return Err(Error::Invalid {
                op: "from_slice",
                message: format!("{} elements cannot fill shape {shape:?}", data.len()),
            });
        }
        let buf = device.upload("from_slice", bytemuck::cast_slice(data))?;
        let t = Tensor::from_buffer(buf, shape, T::DTYPE, None);
        let ids = data.iter().filter_map(|&v| v.as_id());
        Ok(
            match ids.fold(None, |r: Option<(i64, i64)>, v| {
                Some(r.map_or((v, v), |(lo, hi)| (lo.min(v), hi.max(v))))
            }) {
                Some((lo, hi)) => t.with_id_range(lo, hi),
                None => t,
            },
        )
    }

    /// A tensor of zeros.
    pub fn zeros(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::check_shape("zeros", shape)?;
        let buf = device.zeros("zeros", Tensor::bytes_for(numel(shape), dtype))?;
        Ok(Tensor::from_buffer(buf, shape, dtype, None))
    }

    /// A tensor of zeros like `self` (same shape, dtype and device).
    pub fn zeros_like(&self) -> Result<Tensor> {
        Tensor::zeros(self.shape(), self.dtype(), self.device())
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.inner.layout.shape
    }

    /// Size of dimension `dim` (negative counts from the end).
    pub fn dim(&self, dim: isize) -> Result<usize> {
        Ok(self.shape()[resolve_dim("dim", dim, self.rank())?])
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape().len()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.inner.layout.numel()
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.inner.dtype
    }

    /// Shape, strides and offset into the buffer.
    pub fn layout(&self) -> &Layout {
        &self.inner.layout
    }

    /// The device holding the data.
    pub fn device(&self) -> &Device {
        self.inner.buffer.gpu()
    }

    /// The storage buffer (shared by all views of it).
    pub fn buffer(&self) -> &GpuBuffer {
        &self.inner.buffer
    }

    /// The buffer as shared, to tell whether two tensors view the same one.
    pub(crate) fn shared_buffer(&self) -> &Arc<GpuBuffer> {
        &self.inner.buffer
    }

    /// True when the elements are dense and row-major.
    pub fn is_contiguous(&self) -> bool {
        self.inner.layout.is_contiguous()
    }

    /// Whether gradients flow to or through this tensor.
    pub fn requires_grad(&self) -> bool {
        self.inner.grad_fn.is_some() || self.inner.grad_cell.is_some()
    }

    /// A leaf tensor sharing this data that collects gradients in [`Tensor::grad`] (a trainable parameter).
    /// Integer tensors have no gradients (torch refuses them): for them this is [`Tensor::detach`], so that a
    /// cast to float does not hand a truncated gradient back.
    pub fn requires_grad_(&self) -> Tensor {
        let cell = self.dtype().is_float().then(|| Arc::new(GradCell::default()));
        self.derive(self.inner.layout.clone(), None, cell)
    }

    /// The same data cut off from the tape: no gradient flows through the result.
    pub fn detach(&self) -> Tensor {
        self.derive(self.inner.layout.clone(), None, None)
    }

    /// The gradient accumulated in a leaf by [`Tensor::backward`] calls.
    pub fn grad(&self) -> Option<Tensor> {
        self.inner
            .grad_cell
            .as_ref()
            .and_then(|c| c.grad.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }

    /// Clears the accumulated gradient of a leaf.
    pub fn zero_grad(&self) {
        if let Some(c) = &self.inner.grad_cell {
            *c.grad.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }

    /// Whether a clone of this tensor is held elsewhere (views of other parts of its buffer do not count: the
    /// q, k and v weights' gradients are slices of one).
    pub(crate) fn is_cloned(&self) -> bool {
        Arc::strong_count(&self.inner) > 1
    }

    pub(crate) fn edge(&self) -> Option<Edge> {
        if let Some(n) = &self.inner.grad_fn {
            Some(Edge::Node(n.clone()))
        } else {
            self.inner.grad_cell.as_ref().map(|c| Edge::Leaf(c.clone()))
        }
    }

    /// Back-propagates from this scalar (one-element) tensor, adding gradients to every leaf that requires them.
    /// The tape behind it is freed as it goes; a second backward through the same ops is an error.
    pub fn backward(&self) -> Result<()> {
        if self.numel() != 1 {
            return Err(Error::Autograd(format!(
                "backward needs a one-element tensor (a loss), got shape {:?}",
                self.shape()
            )));
        }
        if !self.dtype().is_float() {
            return Err(Error::Autograd(format!("backward from a {} tensor", self.dtype())));
        }
        let seed = autograd::no_grad(|| self.ones_like())?;
        match self.edge() {
            Some(Edge::Node(n)) => autograd::run_backward(&n, seed),
            Some(Edge::Leaf(cell)) => {
                let mut g = cell.grad.lock().unwrap_or_else(|p| p.into_inner());
                *g = Some(match g.take() {
                    Some(prev) => autograd::no_grad(|| prev.add(&seed))?,
                    None => seed,
                });
                Ok(())
            }
            None => Err(Error::Autograd(
                "backward on a tensor that does not require grad".into(),
            )),
        }
    }

    /// Copies the elements to the host in row-major order. The dtype must match `T`.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.read_later::<T>()?.wait()
    }

    /// Copies the elements to the host (async: works on the web).
    pub async fn to_vec_async<T: Element>(&self) -> Result<Vec<T>> {
        self.read_later::<T>()?.wait_async().await
    }

    /// Starts copying the elements to the host and returns at once: the GPU runs the work recorded so far while
    /// the host records more, and [`PendingVec::wait`] collects the copy without waiting for that later work.
    pub fn read_later<T: Element>(&self) -> Result<PendingVec<T>> {
        let (t, start, end) = self.readback_range::<T>()?;
        Ok(PendingVec {
            read: t.device().read_later(t.buffer(), start, end)?,
            element: std::marker::PhantomData,
        })
    }

    fn readback_range<T: Element>(&self) -> Result<(Tensor, u64, u64)> {
        if self.dtype() != T::DTYPE {
            return Err(Error::DTypeMismatch {
                op: "to_vec",
                expected: T::DTYPE.to_string(),
                got: self.dtype(),
            });
        }
        let t = autograd::no_grad(|| self.contiguous())?;
        let size = self.dtype().size() as u64;
        let start = t.layout().offset as u64 * size;
        Ok((t, start, start + self.numel() as u64 * size))
    }

    /// Copies the elements to the host as f32, converting from any dtype (for tests, printing and losses).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        autograd::no_grad(|| self.to_dtype(DType::F32))?.to_vec::<f32>()
    }

    /// The single value of a one-element tensor, as f32.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn item(&self) -> Result<f32> {
        if self.numel() != 1 {
            return Err(Error::Invalid {
                op: "item",
                message: format!("shape {:?} has not one element", self.shape()),
            });
        }
        Ok(self.to_f32_vec()?[0])
    }

    // ----- views -----

    /// The same elements with another shape; one dimension may be `usize::MAX` to infer it. A view when the
    /// strides allow it, a copy otherwise.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        let shape = self.infer_shape(shape)?;
        Tensor::check_shape("reshape", &shape)?;
        let src_shape = self.shape().to_vec();
        let layout = match self.layout().reshape(&shape) {
            Some(l) => l,
            None => return self.contiguous()?.reshape(&shape),
        };
        Ok(self.view(
            "reshape",
            layout,
            Box::new(move |g| Ok(vec![Some(g.reshape(&src_shape)?)])),
        ))
    }

    fn infer_shape(&self, shape: &[usize]) -> Result<Vec<usize>> {
        let mut shape = shape.to_vec();
        let holes = shape.iter().filter(|&&d| d == usize::MAX).count();
        let known = shape
            .iter()
            .filter(|&&d| d != usize::MAX)
            .try_fold(1usize, |n, &d| n.checked_mul(d));
        let requested = shape.clone();
        let bad = || Error::Invalid {
            op: "reshape",
            message: format!(
                "cannot view {} elements of {:?} as {requested:?}",
                self.numel(),
                self.shape()
            ),
        };
        let Some(known) = known else {
            return Err(bad());
        };
        match holes {
            0 => {}
            1 if known != 0 && self.numel().is_multiple_of(known) => {
                let d = shape.iter().position(|&d| d == usize::MAX).expect("one hole");
                shape[d] = self.numel() / known;
            }
            _ => return Err(bad()),
        }
        if checked_numel(&shape) != Some(self.numel()) {
            return Err(bad());
        }
        Ok(shape)
    }

    /// All elements in one dimension.
    pub fn flatten(&self) -> Result<Tensor> {
        self.reshape(&[self.numel()])
    }

    /// Reorders the dimensions (a view).
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        let layout = self.layout().permute(perm)?;
        let mut inverse = vec![0; perm.len()];
        for (i, &p) in perm.iter().enumerate() {
            inverse[p] = i;
        }
        Ok(self.view(
            "permute",
            layout,
            Box::new(move |g| Ok(vec![Some(g.permute(&inverse)?)])),
        ))
    }

    /// Swaps two dimensions (a view).
    pub fn transpose(&self, d0: isize, d1: isize) -> Result<Tensor> {
        let (a, b) = (
            resolve_dim("transpose", d0, self.rank())?,
            resolve_dim("transpose", d1, self.rank())?,
        );
        let mut perm: Vec<usize> = (0..self.rank()).collect();
        perm.swap(a, b);
        self.permute(&perm)
    }

    /// Transpose of the last two dimensions (a view).
    pub fn t(&self) -> Result<Tensor> {
        if self.rank() < 2 {
            return Err(Error::RankMismatch {
                op: "t",
                expected: ">= 2".into(),
                got: self.shape().to_vec(),
            });
        }
        self.transpose(-2, -1)
    }

    /// Elements `start..start + len` along `dim` (a view).
    pub fn narrow(&self, dim: isize, start: usize, len: usize) -> Result<Tensor> {
        let d = resolve_dim("narrow", dim, self.rank())?;
        let layout = self.layout().narrow(d, start, len)?;
        let narrow = Narrow {
            dim: d,
            start,
            full: self.shape()[d],
        };
        let node = Node::record_narrow(self, narrow);
        Ok(self.derive(layout, node, None))
    }

    /// Broadcasts to `shape` without copying (size-1 and missing leading dimensions repeat).
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        if shape == self.shape() {
            return Ok(self.clone());
        }
        Tensor::check_shape("broadcast_to", shape)?;
        let layout = self.layout().broadcast_to("broadcast_to", shape)?;
        let src_shape = self.shape().to_vec();
        Ok(self.view(
            "broadcast_to",
            layout,
            Box::new(move |g| Ok(vec![Some(g.sum_to(&src_shape)?)])),
        ))
    }

    /// Inserts a size-1 dimension at `dim` (a view).
    pub fn unsqueeze(&self, dim: isize) -> Result<Tensor> {
        let d = resolve_dim("unsqueeze", dim, self.rank() + 1)?;
        let mut shape = self.shape().to_vec();
        shape.insert(d, 1);
        self.reshape(&shape)
    }

    /// Removes dimension `dim`, which must have size 1 (a view).
    pub fn squeeze(&self, dim: isize) -> Result<Tensor> {
        let d = resolve_dim("squeeze", dim, self.rank())?;
        if self.shape()[d] != 1 {
            return Err(Error::Invalid {
                op: "squeeze",
                message: format!("dimension {d} of {:?} is not 1", self.shape()),
            });
        }
        let mut shape = self.shape().to_vec();
        shape.remove(d);
        self.reshape(&shape)
    }

    /// A dense row-major copy, or `self` when already dense.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        self.copy()
    }
}
