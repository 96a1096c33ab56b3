//! Fused attention for key/value-cache inference: the scores, causal (and sliding-window) mask, softmax and the
//! weighted sum of the values of one decode step in a single kernel launch, reading the cache in place instead of
//! the ~5 launches and intermediate score tensors of the composed path.

use std::sync::Arc;

use std::fmt::Write;

use hierarchos_wgpu::{COMMON_WGSL, DType, Dispatch, Gpu, Language};

use crate::autograd::grad_enabled;
use crate::error::{Error, Result};
use crate::ops::rope::RopeTables;
use crate::tensor::Tensor;

const ATTENTION_DECODE_WGSL: &str = include_str!("../../../../wgsl/attention_decode.wgsl");
const ATTENTION_STEP_WGSL: &str = include_str!("../../../../wgsl/attention_step.wgsl");
const REDUCE_TREE_WGSL: &str = include_str!("../../../../wgsl/attention_reduce_tree.wgsl");
const REDUCE_SUBGROUP_WGSL: &str = include_str!("../../../../wgsl/attention_reduce_subgroup.wgsl");

/// Largest head size (the kernel keeps a query row of up to 64 quads in workgroup memory).
pub const MAX_HEAD_DIM: usize = 256;

/// Most queries of one [`Tensor::attention_step`]: their new keys and values sit in workgroup memory.
pub const STEP_MAX_QUERIES: usize = 2;

/// Whether `x` (`[B, heads, positions, D]`) is laid out with heads varying faster than positions: a view of a
/// `[B, positions, heads, D]` projection, the order RoPE's output and attention's gradients keep so that the
/// projections' backward reshapes them without a copy.
pub(crate) fn token_major(x: &Tensor) -> bool {
    x.rank() == 4 && x.layout().strides[2] > x.layout().strides[1]
}

/// The window word of the attention kernels' parameters: 0 (none) for no window, and for one too wide to hide
/// any key from queries `q_start..q_start + t` over keys from `k_start`, so that the kernels' u32 arithmetic on
/// positions plus the window cannot overflow.
pub(crate) fn window_word(window: Option<usize>, q_start: usize, t: usize, k_start: usize) -> u32 {
    match window {
        // Some query at position q sees key k only if k + w > q: the widest gap is the last query's to the first key.
        Some(w) if w.checked_add(k_start).is_some_and(|edge| edge < q_start + t) => w as u32,
        _ => 0,
    }
}

/// Offset and the four element strides of a rank-4 view, as the kernel reads them.
pub(crate) fn view_params(t: &Tensor) -> [u32; 5] {
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
        check_shapes("cached_attention", self, k, v, q_start, k_start, window)?;
        refuse_grad("cached_attention", &[self, k, v])?;
        launch(self, k, v, [q_start, k_start], window, None, self.device())
    }
}

/// The checks of [`Tensor::cached_attention`] and [`Tensor::flash_attention`] for queries `q` `[B, H, T, D]` and
/// keys/values `[B, KVH, S, D]`: ranks, shapes, f32, one device, head size, and every query seeing a key.
pub(crate) fn check_shapes(
    op: &'static str,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    q_start: usize,
    k_start: usize,
    window: Option<usize>,
) -> Result<()> {
    for t in [q, k, v] {
        if t.rank() != 4 {
            return Err(Error::RankMismatch {
                op,
                expected: "4".into(),
                got: t.shape().to_vec(),
            });
        }
        if t.dtype() != DType::F32 {
            return Err(Error::DTypeMismatch {
                op,
                expected: "f32".into(),
                got: t.dtype(),
            });
        }
    }
    if k.shape() != v.shape() {
        return Err(Error::ShapeMismatch {
            op,
            lhs: k.shape().to_vec(),
            rhs: v.shape().to_vec(),
        });
    }
    let (b, h, t, d) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let (kvh, s) = (k.shape()[1], k.shape()[2]);
    if k.shape()[0] != b || k.shape()[3] != d {
        return Err(Error::ShapeMismatch {
            op,
            lhs: q.shape().to_vec(),
            rhs: k.shape().to_vec(),
        });
    }
    if (kvh == 0 && h > 0) || (kvh > 0 && !h.is_multiple_of(kvh)) {
        return Err(Error::Invalid {
            op,
            message: format!("{h} query heads are not a multiple of {kvh} key/value heads"),
        });
    }
    if d > MAX_HEAD_DIM {
        return Err(Error::Invalid {
            op,
            message: format!("head size {d} exceeds {MAX_HEAD_DIM}"),
        });
    }
    if !Arc::ptr_eq(k.device(), q.device()) || !Arc::ptr_eq(v.device(), q.device()) {
        return Err(Error::Invalid {
            op,
            message: "inputs live on different devices".into(),
        });
    }
    if t > 0 {
        if window == Some(0) {
            return Err(Error::Invalid {
                op,
                message: "a window of 0 hides every key".into(),
            });
        }
        let (q_end, k_end) = (q_start.saturating_add(t), k_start.saturating_add(s));
        if k_start > q_start || q_end > k_end {
            return Err(Error::Invalid {
                op,
                message: format!(
                    "queries at positions {q_start}..{q_end} do not all see a key of positions {k_start}..{k_end}"
                ),
            });
        }
        if q_end.max(k_end) > u32::MAX as usize {
            return Err(Error::Invalid {
                op,
                message: format!(
                    "positions {q_start}..{q_end} (queries) or {k_start}..{k_end} (keys) exceed the kernels' 32-bit \
                     positions"
                ),
            });
        }
    }
    Ok(())
}

/// Refuses inputs that would need a gradient: the inference kernels record no backward rule.
fn refuse_grad(op: &'static str, inputs: &[&Tensor]) -> Result<()> {
    if grad_enabled() && inputs.iter().any(|t| t.requires_grad()) {
        return Err(Error::Invalid {
            op,
            message: "the fused attention is for inference and has no backward; use flash_attention to train or \
                      disable grad"
                .into(),
        });
    }
    Ok(())
}

/// The new keys and values of a cached attention step with the rotary tables of its positions: what
/// [`Tensor::attention_step`] rotates, caches and attends over in the attention's own launch.
#[derive(Clone, Copy, Debug)]
pub struct NewKeys<'a> {
    /// `[B, T, KVH, D]` keys, not rotated yet (any strides).
    pub k: &'a Tensor,
    /// `[B, T, KVH, D]` values (any strides).
    pub v: &'a Tensor,
    /// Tables `[T, D/2]` of the step's positions; the query tables carry the score scale.
    pub tables: RopeTables<'a>,
}

impl Tensor {
    /// One step of cached attention in a single launch (decode is bound by launches): rotates the queries
    /// `self` (`[B, T, H, D]`, not rotated, any strides, `T <= STEP_MAX_QUERIES`) and the new keys, stores the new keys and values into
    /// `k_cache` / `v_cache` (dense `[B, KVH, L, D]`, at positions `position..position + T`) and attends over
    /// positions `0..position + T` (the last `window` of them for each query with a sliding window). Bit for bit
    /// [`Tensor::rope_into_cache`] followed by [`Tensor::cached_attention`]; returns `[B, T, H, D]`. Inference
    /// only, f32, `D <= 256`.
    pub fn attention_step(
        &self,
        new: NewKeys<'_>,
        k_cache: &Tensor,
        v_cache: &Tensor,
        position: usize,
        window: Option<usize>,
    ) -> Result<Tensor> {
        const OP: &str = "attention_step";
        let q = self;
        let bad = |message: String| Error::Invalid { op: OP, message };
        let all = [q, new.k, new.v, k_cache, v_cache];
        if let Some(t) = all.iter().find(|t| t.rank() != 4) {
            return Err(Error::RankMismatch {
                op: OP,
                expected: "4".into(),
                got: t.shape().to_vec(),
            });
        }
        let [b, t, d] = [q.shape()[0], q.shape()[1], q.shape()[3]];
        let kvh = k_cache.shape()[1];
        let cache_len = k_cache.shape()[2];
        if new.k.shape() != [b, t, kvh, d] || new.v.shape() != new.k.shape() {
            return Err(bad(format!(
                "new keys {:?} and values {:?} do not fit queries {:?} and a cache of {kvh} heads",
                new.k.shape(),
                new.v.shape(),
                q.shape()
            )));
        }
        if v_cache.shape() != k_cache.shape() || k_cache.shape()[0] != b || k_cache.shape()[3] != d {
            return Err(bad(format!(
                "caches {:?} / {:?} do not fit queries {:?}",
                k_cache.shape(),
                v_cache.shape(),
                q.shape()
            )));
        }
        if !k_cache.is_contiguous() || !v_cache.is_contiguous() || std::ptr::eq(k_cache.buffer(), v_cache.buffer()) {
            return Err(bad("the key and value caches must be dense tensors of their own".into()));
        }
        if t > STEP_MAX_QUERIES {
            return Err(bad(format!(
                "{t} queries: a fused step takes at most {STEP_MAX_QUERIES} (use rope_into_cache and cached_attention)"
            )));
        }
        if position + t > cache_len {
            return Err(bad(format!(
                "positions {position}..{} do not fit a cache of {cache_len}",
                position + t
            )));
        }
        let tabs = [new.tables.cos_q, new.tables.sin_q, new.tables.cos_k, new.tables.sin_k];
        if !d.is_multiple_of(2) || tabs.iter().any(|x| x.shape() != [t, d / 2]) {
            return Err(bad(format!(
                "rotary tables {:?} do not fit {t} positions of heads of {d} (an even size)",
                new.tables.cos_q.shape()
            )));
        }
        if let Some(x) = tabs.iter().chain(&all).find(|x| x.dtype() != DType::F32) {
            return Err(Error::DTypeMismatch {
                op: OP,
                expected: "f32".into(),
                got: x.dtype(),
            });
        }
        if tabs.iter().chain(&all).any(|x| !Arc::ptr_eq(x.device(), q.device())) {
            return Err(bad("inputs live on different devices".into()));
        }
        // The four tables as views of one tensor with common strides (copied together when they are not).
        let shared = tabs
            .iter()
            .all(|x| std::ptr::eq(x.buffer(), tabs[0].buffer()) && x.layout().strides == tabs[0].layout().strides);
        let (tables, offsets) = if shared {
            let base = tabs.iter().map(|x| x.layout().offset).min().unwrap_or(0);
            let view = tabs[0].detach();
            let offsets = tabs.map(|x| x.layout().offset - base);
            let l = view.layout().clone();
            (view.with_layout(crate::shape::Layout { offset: base, ..l }), offsets)
        } else {
            let all = Tensor::cat(&tabs.map(|x| x.detach()), 0)?;
            let n = t * (d / 2);
            (all.narrow(0, 0, t)?, [0, n, 2 * n, 3 * n])
        };
        let keys = k_cache.narrow(2, 0, position + t)?;
        let values = v_cache.narrow(2, 0, position + t)?;
        refuse_grad(OP, &[q, new.k, new.v])?;
        let q_heads = q.permute(&[0, 2, 1, 3])?;
        // Same checks as cached_attention (heads, head size, windows); the step's own went first.
        check_shapes(OP, &q_heads, &keys, &values, position, 0, window)?;
        let step = Step {
            position,
            k: new.k,
            v: new.v,
            tables,
            offsets,
        };
        launch(&q_heads, &keys, &values, [position, 0], window, Some(step), q.device())
    }
}

/// What the kernel needs for a fused step (see [`Tensor::attention_step`]): the cache position of the first new
/// key, the raw new keys and values, the four rotary tables in one tensor and their offsets in it.
struct Step<'a> {
    position: usize,
    k: &'a Tensor,
    v: &'a Tensor,
    tables: Tensor,
    offsets: [usize; 4],
}

/// Records the kernel for validated inputs (q `[B, H, T, D]`, k/v `[B, KVH, S, D]`).
fn launch(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    [q_start, k_start]: [usize; 2],
    window: Option<usize>,
    step: Option<Step<'_>>,
    device: &crate::tensor::Device,
) -> Result<Tensor> {
    const OP: &str = "cached_attention";
    let (b, h, t, d) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let (kvh, s) = (k.shape()[1], k.shape()[2]);
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
        window_word(window, q_start, t, k_start),
    ];
    for view in [q, k, v] {
        params.extend(view_params(view));
    }
    if let Some(st) = &step {
        params.push(st.position as u32);
        params.extend(view_params(st.k));
        params.extend(view_params(st.v));
        let l = st.tables.layout();
        params.extend(st.offsets.iter().map(|&o| (l.offset + o) as u32));
        params.extend([l.strides[0] as u32, l.strides[1] as u32]);
    }
    // Keys and values as vec4s when every row starts on 16 bytes and is dense.
    let vec4 = d.is_multiple_of(4) && [k, v].iter().all(|t| t.layout().rows_of_vec4s());
    let fused = step.is_some();
    let subgroups = device.caps().subgroups;
    let key = format!("cached_attention:{vec4}:{fused}:{subgroups}:{d}");
    let source = || {
        let access = if fused { "read_write" } else { "read" };
        let kt = if vec4 { "vec4<f32>" } else { "f32" };
        let mut s = format!(
            "@group(0) @binding(0) var<storage, read> p: array<u32>;\n\
             @group(0) @binding(1) var<storage, read_write> out: array<f32>;\n\
             @group(0) @binding(2) var<storage, read> q: array<f32>;\n\
             @group(0) @binding(3) var<storage, {access}> k: array<{kt}>;\n\
             @group(0) @binding(4) var<storage, {access}> v: array<{kt}>;\n\
             const STEP: bool = {fused};\n"
        );
        if fused {
            s.push_str(
                "@group(0) @binding(5) var<storage, read> k_new: array<f32>;\n\
                 @group(0) @binding(6) var<storage, read> v_new: array<f32>;\n\
                 @group(0) @binding(7) var<storage, read> tab: array<f32>;\n",
            );
        } else {
            // Never called: the raw-key paths sit behind `STEP`.
            s.push_str(
                "fn new_element(kv: u32, b: u32, head: u32, t: u32, d: u32) -> f32 { return 0.0; }\n\
                 fn rotated_q(qb: u32, t: u32, d: u32) -> f32 { return 0.0; }\n\
                 fn store_k(base: u32, d4: u32, x: vec4<f32>) {}\nfn store_v(base: u32, d4: u32, x: vec4<f32>) {}\n",
            );
        }
        for (name, at) in [("k", 14), ("v", 19)] {
            if vec4 {
                let _ = writeln!(
                    s,
                    "fn load_{name}(base: u32, d4: u32) -> vec4<f32> {{ return {name}[base / 4u + d4]; }}"
                );
                if fused {
                    let _ = writeln!(
                        s,
                        "fn store_{name}(base: u32, d4: u32, x: vec4<f32>) {{ {name}[base / 4u + d4] = x; }}"
                    );
                }
            } else {
                let _ = writeln!(
                    s,
                    "fn load_{name}(base: u32, d4: u32) -> vec4<f32> {{\n\
                     \x20   var r = vec4<f32>(0.0);\n\
                     \x20   for (var c = 0u; c < 4u; c = c + 1u) {{\n\
                     \x20       let d = 4u * d4 + c;\n\
                     \x20       if (d < p[3]) {{ r[c] = {name}[base + d * p[{at}u + 4u]]; }}\n\
                     \x20   }}\n\
                     \x20   return r;\n}}"
                );
                if fused {
                    let _ = writeln!(
                        s,
                        "fn store_{name}(base: u32, d4: u32, x: vec4<f32>) {{\n\
                         \x20   for (var c = 0u; c < 4u; c = c + 1u) {{\n\
                         \x20       let d = 4u * d4 + c;\n\
                         \x20       if (d < p[3]) {{ {name}[base + d * p[{at}u + 4u]] = x[c]; }}\n\
                         \x20   }}\n}}"
                    );
                }
            }
        }
        if fused {
            s.push_str(ATTENTION_STEP_WGSL);
        }
        let (reduce, builtins, init) = if subgroups {
            (
                REDUCE_SUBGROUP_WGSL,
                ", @builtin(subgroup_invocation_id) sg_lane: u32, @builtin(subgroup_id) sg_id: u32, \
                 @builtin(subgroup_size) sg_size: u32",
                "sg_lane_p = sg_lane;\n    sg_id_p = sg_id;\n    sg_size_p = sg_size;",
            )
        } else {
            (REDUCE_TREE_WGSL, "", "")
        };
        let kernel = ATTENTION_DECODE_WGSL
            .replace("/*@SG_BUILTINS*/", builtins)
            .replace("//@SG_INIT", init);
        format!("const HEAD_DIM: u32 = {d}u;\n{s}{COMMON_WGSL}{reduce}{kernel}")
    };
    let mut buffers = vec![out.buffer(), q.buffer(), k.buffer(), v.buffer()];
    if let Some(st) = &step {
        buffers.extend([st.k.buffer(), st.v.buffer(), st.tables.buffer()]);
    }
    device.dispatch(Dispatch {
        op: OP,
        runtime_checks: false,
        language: Language::Wgsl,
        key: &key,
        source: &source,
        buffers: &buffers,
        params: &params,
        workgroups: Gpu::grid(rows as u32),
    })?;
    Ok(out)
}
