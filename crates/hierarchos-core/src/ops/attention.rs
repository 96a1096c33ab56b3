//! Fused attention for key/value-cache inference: the scores, causal (and sliding-window) mask, softmax and the
//! weighted sum of the values of one decode step in a single kernel launch, reading the cache in place instead of
//! the ~5 launches and intermediate score tensors of the composed path.

use std::sync::Arc;

use hierarchos_wgpu::{COMMON_WGSL, DType, Dispatch, Gpu};

use crate::autograd::grad_enabled;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

const ATTENTION_DECODE_WGSL: &str = include_str!("../../../../wgsl/attention_decode.wgsl");

/// Largest head size: each of the kernel's 64 threads owns at most 4 output components.
const MAX_HEAD_DIM: usize = 256;

/// Offset and the four element strides of a rank-4 view, as the kernel reads them.
fn view_params(t: &Tensor) -> [u32; 5] {
    let l = t.layout();
    [
        l.offset as u32,
        l.strides[0] as u32,
        l.strides[1] as u32,
        l.strides[2] as u32,
        l.strides[3] as u32,
    ]
}

impl Tensor {
    /// Attention of the queries `self` (`[B, H, T, D]`, already multiplied by the score scale) over the keys `k`
    /// and values `v` (`[B, KVH, S, D]`, typically `narrow` views of a preallocated cache, read in place through
    /// any strides): `out[b, t, h] = Σ_j softmax_j(q · k_j) v_j`, with the max subtracted and f32 accumulation
    /// like torch. Query head `h` reads key/value head `h / (H / KVH)` (grouped-query attention, transformers'
    /// `repeat_kv`). Query `t` sits at position `q_start + t` and key `j` at `k_start + j`; a key is visible when
    /// its position is not after the query's and, with `window = Some(w)`, less than `w` positions before it.
    /// Every query must see at least one key, so `k_start <= q_start`, `q_start + T <= k_start + S` and
    /// `w >= 1` are required. The result is a new contiguous `[B, T, H, D]` tensor, so that reshaping it to
    /// `[B, T, H * D]` is free. Inference only: it records no backward rule, and refuses inputs that require
    /// grad while grad is enabled (use the composed ops to train). f32 only, `D <= 256`.
    pub fn cached_attention(
        &self,
        k: &Tensor,
        v: &Tensor,
        q_start: usize,
        k_start: usize,
        window: Option<usize>,
    ) -> Result<Tensor> {
        const OP: &str = "cached_attention";
        let q = self;
        for t in [q, k, v] {
            if t.rank() != 4 {
                return Err(Error::RankMismatch {
                    op: OP,
                    expected: "4".into(),
                    got: t.shape().to_vec(),
                });
            }
            if t.dtype() != DType::F32 {
                return Err(Error::DTypeMismatch {
                    op: OP,
                    expected: "f32".into(),
                    got: t.dtype(),
                });
            }
        }
        if k.shape() != v.shape() {
            return Err(Error::ShapeMismatch {
                op: OP,
                lhs: k.shape().to_vec(),
                rhs: v.shape().to_vec(),
            });
        }
        let (b, h, t, d) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
        let (kvh, s) = (k.shape()[1], k.shape()[2]);
        if k.shape()[0] != b || k.shape()[3] != d {
            return Err(Error::ShapeMismatch {
                op: OP,
                lhs: q.shape().to_vec(),
                rhs: k.shape().to_vec(),
            });
        }
        if (kvh == 0 && h > 0) || (kvh > 0 && !h.is_multiple_of(kvh)) {
            return Err(Error::Invalid {
                op: OP,
                message: format!("{h} query heads are not a multiple of {kvh} key/value heads"),
            });
        }
        if d > MAX_HEAD_DIM {
            return Err(Error::Invalid {
                op: OP,
                message: format!("head size {d} exceeds {MAX_HEAD_DIM}"),
            });
        }
        if grad_enabled() && [q, k, v].iter().any(|t| t.requires_grad()) {
            return Err(Error::Invalid {
                op: OP,
                message: "the fused attention is for inference and has no backward; use the composed path to \
                          train or disable grad"
                    .into(),
            });
        }
        if !Arc::ptr_eq(k.device(), q.device()) || !Arc::ptr_eq(v.device(), q.device()) {
            return Err(Error::Invalid {
                op: OP,
                message: "inputs live on different devices".into(),
            });
        }
        if t > 0 {
            if window == Some(0) {
                return Err(Error::Invalid {
                    op: OP,
                    message: "a window of 0 hides every key".into(),
                });
            }
            let (q_end, k_end) = (q_start.saturating_add(t), k_start.saturating_add(s));
            if k_start > q_start || q_end > k_end {
                return Err(Error::Invalid {
                    op: OP,
                    message: format!(
                        "queries at positions {q_start}..{q_end} do not all see a key of positions {k_start}..{k_end}"
                    ),
                });
            }
            if q_end > u32::MAX as usize {
                return Err(Error::Invalid {
                    op: OP,
                    message: format!("position {q_end} exceeds the kernel's 32-bit positions"),
                });
            }
        }
        let device = q.device();
        let shape = [b, t, h, d];
        let rows = b * t * h;
        if rows == 0 || d == 0 {
            return Tensor::zeros(&shape, DType::F32, device);
        }
        let out = Tensor::from_buffer(
            device.alloc(OP, Tensor::bytes_for(rows * d, DType::F32))?,
            &shape,
            DType::F32,
            None,
        );
        let mut params = vec![
            rows as u32,
            h as u32,
            t as u32,
            d as u32,
            s as u32,
            (h / kvh) as u32,
            q_start as u32,
            k_start as u32,
            window.map_or(0, |w| w.min(u32::MAX as usize) as u32),
        ];
        for view in [q, k, v] {
            params.extend(view_params(view));
        }
        device.dispatch(Dispatch {
            op: OP,
            key: OP,
            source: &|| format!("{COMMON_WGSL}{ATTENTION_DECODE_WGSL}"),
            buffers: &[out.buffer(), q.buffer(), k.buffer(), v.buffer()],
            params: &params,
            workgroups: Gpu::grid(rows as u32),
        })?;
        Ok(out)
    }
}
