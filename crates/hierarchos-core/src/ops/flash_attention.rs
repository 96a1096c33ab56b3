//! Causal attention for training in fused kernels (flash attention): the forward keeps an online softmax per
//! query row and stores only the output and each row's log-sum-exp; the backward recomputes the probabilities
//! from them. No `[T, S]` score or probability tensor is ever allocated, so memory stays linear in the sequence
//! length, and a training step saves one launch per direction instead of the matmuls, mask, softmax and their
//! gradients of the composed path. [`Tensor::rotary_flash_attention`] also applies the rotary embedding inside
//! the kernels, so that training runs no rotary launches and no copies around attention.

use std::sync::Arc;

use hierarchos_wgpu::{COMMON_WGSL, DType, Dispatch, Language};

use crate::autograd::{Node, grad_enabled};
use crate::error::{Error, Result};
use crate::ops::attention::{MAX_HEAD_DIM, check_shapes, token_major, view_params, window_word};
use crate::ops::flash_attention_coop;
use crate::ops::rope::RopeTables;
use crate::tensor::{Device, Tensor};

const COMMON: &str = include_str!("../../../../wgsl/flash_attention_common.wgsl");
const FORWARD: &str = include_str!("../../../../wgsl/flash_attention_forward.wgsl");
const FORWARD_ROWS: &str = include_str!("../../../../wgsl/flash_attention_forward_rows.wgsl");
const GRAD_Q: &str = include_str!("../../../../wgsl/flash_attention_dq.wgsl");
const GRAD_KV: &str = include_str!("../../../../wgsl/flash_attention_dkv.wgsl");
const GRAD_Q_ROWS: &str = include_str!("../../../../wgsl/flash_attention_dq_rows.wgsl");
const GRAD_KV_ROWS: &str = include_str!("../../../../wgsl/flash_attention_dkv_rows.wgsl");
const ROWS_COMMON: &str = include_str!("../../../../wgsl/flash_attention_rows_common.wgsl");
const QUERY_GRADS: &str = include_str!("../../../../wgsl/flash_attention_query_grads.wgsl");
const KEY_GRADS: &str = include_str!("../../../../wgsl/flash_attention_key_grads.wgsl");
const KEY_TILES: &str = include_str!("../../../../wgsl/flash_attention_key_tiles.wgsl");
const GRAD_TILES: &str = include_str!("../../../../wgsl/flash_attention_grad_tiles.wgsl");
const LOADS: &str = include_str!("../../../../wgsl/flash_attention_loads.wgsl");
const ROTARY: &str = include_str!("../../../../wgsl/flash_attention_rotary.wgsl");

/// Rows staged per tile at most. Measured on the H200 (8 x 12 heads of 64, 512 tokens): tiles of 16 rows took the
/// forward from 2.6 to 5.0 TFLOP/s against tiles of 64 (less workgroup memory, more workgroups resident per
/// multiprocessor), and 256 rows per workgroup instead of 64 to 8.1.
const MAX_TILE_ROWS: usize = 16;
/// Quads (of four elements) of each head row a thread of the backward's row kernels keeps at most: heads of
/// 64 take groups of two threads per row.
const ROW_QUADS: usize = 8;
/// Keys per staged tile of the forward's row kernel at most...
const FORWARD_TILE_KEYS: usize = 32;
/// ...and keys per step of its online softmax (the output rescaled at most once per step).
const FORWARD_KEY_GROUP: usize = 16;
/// `group_sum(x)` of the row kernels: the sum over a row's G threads through subgroup shuffles, or `x` itself
/// for groups of one thread (which then need no subgroups). `pair_exp(a, b, odd)`: exp of a and of b, which every
/// thread of a group holds alike; in groups of two or more, each thread of a pair takes one of them and the other
/// comes by a shuffle, so a group spends half the exps. The forward and the query kernel use it (2.41 -> 2.34 and
/// 2.84 -> 2.78 ms a step of the 110M training shape on the H200); the key/value kernel, with 8 rows a step, ran
/// slower with it (3.42 -> 3.58 ms).
const GROUP_SUM_SHUFFLED: &str = "fn group_sum(x: f32) -> f32 {
    var s = x;
    for (var w = 1u; w < G; w = w * 2u) {
        s = s + subgroupShuffleXor(s, w);
    }
    return s;
}
fn pair_exp(a: f32, b: f32, odd: bool) -> vec2<f32> {
    let own = exp_acc(select(a, b, odd));
    let other = subgroupShuffleXor(own, 1u);
    return select(vec2<f32>(own, other), vec2<f32>(other, own), odd);
}
";
const GROUP_SUM_SINGLE: &str = "fn group_sum(x: f32) -> f32 {
    return x;
}
fn pair_exp(a: f32, b: f32, odd: bool) -> vec2<f32> {
    return vec2<f32>(exp_acc(a), exp_acc(b));
}
";
/// How the forward loads query and key rows with rotary embeddings (flash_attention_rotary.wgsl; without them,
/// flash_attention_loads.wgsl)...
const ROTATED_LOADS: &str = "fn query_quad(b: u32, h: u32, t: u32, c: u32) -> vec4<f32> {
    return rotated_query(b, h, t, c);
}
fn key_quad(b: u32, kh: u32, j: u32, c: u32) -> vec4<f32> {
    return rotated_key(b, kh, j, c);
}
";
/// ...and whether it keeps them rotated, with the values, for the backward (when gradients are recorded).
const KEEP_ROTATED: &str = "fn keep_query(b: u32, h: u32, t: u32, c: u32, x: vec4<f32>) {
    store_kept(kept_row(b, h, t), c, x);
}
fn keep_key(b: u32, kh: u32, j: u32, c: u32, k: vec4<f32>, v: vec4<f32>) {
    store_kept(kept_row(b, p[1] + kh, j), c, k);
    store_kept(kept_row(b, p[1] + p[1] / p[4] + kh, j), c, v);
}
";
const KEEP_NOTHING: &str = "fn keep_query(b: u32, h: u32, t: u32, c: u32, x: vec4<f32>) {}
fn keep_key(b: u32, kh: u32, j: u32, c: u32, k: vec4<f32>, v: vec4<f32>) {}
";
/// How the backward kernels store the query and key gradients: rotated back with rotary embeddings, else as
/// computed (`partner` is quad c ± D4 / 2 of the same row).
const GRADS_ROTATED_BACK: &str = "fn query_grad(t: u32, c: u32, x: vec4<f32>, partner: vec4<f32>) -> vec4<f32> {
    return query_back(t, c, x, partner);
}
fn key_grad(j: u32, c: u32, x: vec4<f32>, partner: vec4<f32>) -> vec4<f32> {
    return key_back(j, c, x, partner);
}
";
const GRADS_AS_COMPUTED: &str = "fn query_grad(t: u32, c: u32, x: vec4<f32>, partner: vec4<f32>) -> vec4<f32> {
    return x;
}
fn key_grad(j: u32, c: u32, x: vec4<f32>, partner: vec4<f32>) -> vec4<f32> {
    return x;
}
";
/// Storage buffers the key/value gradients' kernel binds with rotary tables: parameters, eight tensors, four
/// tables.
const ROTARY_BINDINGS: u32 = 13;

impl Tensor {
    /// Causal attention of the queries `self` (`[B, H, T, D]`, already multiplied by the score scale) over keys
    /// `k` and values `v` (`[B, KVH, S, D]`), with the visibility rules of [`Tensor::cached_attention`]: query
    /// `t` at position `q_start + t`, key `j` at `k_start + j`, keys after the query or (with a `window`) `window`
    /// or more positions before it are hidden. Query head `h` reads key/value head `h / (H / KVH)`. Inputs are
    /// read through any strides. Returns a new contiguous `[B, T, H, D]` tensor and records a backward rule for
    /// all three inputs (f32 accumulation throughout, as torch). f32 only, `D <= 256`. Inside `autocast(f16)`, on
    /// GPUs with f16 cooperative matrices and for heads of 64, forward and backward run on tensor cores in torch's
    /// autocast precision: inputs and probabilities rounded to f16, outputs and gradients too (held as f32).
    pub fn flash_attention(
        &self,
        k: &Tensor,
        v: &Tensor,
        q_start: usize,
        k_start: usize,
        window: Option<usize>,
    ) -> Result<Tensor> {
        attend("flash_attention", [self, k, v], None, [q_start, k_start], window)
    }

    /// [`Tensor::flash_attention`] as self-attention (as many keys as queries, `q_start == k_start`) of queries
    /// and keys before their rotary embedding: the forward rotates each row of `self` and of `k` as it reads it,
    /// by the angles of its row of `tables` (`cos_q`, `sin_q`: `[T, D/2]`, usually carrying the score scale;
    /// `cos_k`, `sin_k`: `[T, D/2]`), as [`Tensor::rope`] does, and keeps the rotated rows with the values for
    /// the backward, which rotates the gradients back as it stores them. Training then runs no rotary kernels
    /// and holds no view of the projection; and where q, k and v are token-major views of one
    /// `[B, T, (H + 2 KVH) D]` projection, their gradients come back as views of one tensor of that shape,
    /// which the projection's backward takes without a copy. Only for inputs that
    /// [`rotary_flash_attention_fits`] accepts.
    pub fn rotary_flash_attention(
        &self,
        k: &Tensor,
        v: &Tensor,
        tables: RopeTables<'_>,
        q_start: usize,
        k_start: usize,
        window: Option<usize>,
    ) -> Result<Tensor> {
        attend(
            "rotary_flash_attention",
            [self, k, v],
            Some(tables),
            [q_start, k_start],
            window,
        )
    }
}

/// [`Tensor::flash_attention`], with `rotary` [`Tensor::rotary_flash_attention`].
fn attend(
    op: &'static str,
    [q, k, v]: [&Tensor; 3],
    rotary: Option<RopeTables<'_>>,
    starts: [usize; 2],
    window: Option<usize>,
) -> Result<Tensor> {
    check_shapes(op, q, k, v, starts[0], starts[1], window)?;
    let device = q.device();
    let [b, h, t, d] = [q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]];
    if !within_grid(q) {
        return Err(Error::Invalid {
            op,
            message: format!("{b} sequences of {h} heads exceed the launch grid"),
        });
    }
    let with_grads = records_grads([q, k, v]);
    if !tiles_fit(q, with_grads) {
        return Err(Error::Invalid {
            op,
            message: format!(
                "heads of {d} elements need more workgroup memory than the device's {} bytes{}",
                workgroup_memory(device),
                if with_grads { " (for the backward)" } else { "" }
            ),
        });
    }
    let tables = rotary.map(|r| rotary_tables(op, [q, k, v], starts, r)).transpose()?;
    let coop = tables.is_none() && flash_attention_coop::fits(q, k, v);
    let params = Params::new([q, k, v], starts, window, coop, tables.clone());
    let out = output(op, &[b, t, h, d], device)?;
    let lse = output(op, &[b, h, t], device)?;
    // With rotary embeddings the forward keeps the rotated queries and keys, with the values, for the backward.
    let kvh = k.shape()[1];
    let kept = match tables.is_some() && with_grads {
        true => Some(output(op, &[b, t, h + 2 * kvh, d], device)?),
        false => None,
    };
    if b * h * t > 0 && d > 0 {
        let mut buffers = vec![&out, &lse, q, k, v];
        buffers.extend(kept.as_ref());
        // The row kernel where it fits (not on the tensor-core path, which has its own).
        let forward = match !coop && Kernel::ForwardRows.fits(d, device) {
            true => Kernel::ForwardRows,
            false => Kernel::Forward,
        };
        params.launch(op, forward, &buffers, [t, b * h])?;
    }
    let layout = GradLayout::of([q, k, v], coop);
    let (saved, params) = match kept {
        Some(kept) => {
            let part = |from: usize, heads: usize| kept.narrow(2, from, heads)?.permute(&[0, 2, 1, 3]);
            let saved = [part(0, h)?, part(h, kvh)?, part(h + kvh, kvh)?];
            let params = Params::new([&saved[0], &saved[1], &saved[2]], starts, window, false, tables);
            (saved, params)
        }
        None => ([q.detach(), k.detach(), v.detach()], params),
    };
    let node = Node::record(op, &[q, k, v], {
        let out = out.detach();
        Box::new(move |g| {
            let grads = backward(&params, [&saved[0], &saved[1], &saved[2]], layout, &out, &lse, g)?;
            Ok(grads.into_iter().map(Some).collect())
        })
    });
    Ok(out.with_node(node))
}

/// The four tables of `rotary` as the kernels bind them (f32, dense rows of D/2 starting on a quad: copied when
/// they are not), after checking that the inputs take rotary kernels and that the tables cover their rows.
fn rotary_tables(
    op: &'static str,
    [q, k, v]: [&Tensor; 3],
    [q_start, k_start]: [usize; 2],
    rotary: RopeTables<'_>,
) -> Result<[Tensor; 4]> {
    if q_start != k_start {
        return Err(Error::Invalid {
            op,
            message: format!("queries from position {q_start} over keys from {k_start}: self-attention only"),
        });
    }
    if !rotary_flash_attention_fits(q, k, v) {
        return Err(Error::Invalid {
            op,
            message: format!(
                "no rotary kernels for queries {:?} ({}) over keys {:?} on this device: as many keys as queries, \
                 heads a multiple of 8 long whose two rotary halves split evenly among the threads that share a \
                 row (64 or 128 do, 40 does not), rows starting on a vec4, f32 kernels outside autocast(f16)",
                q.shape(),
                q.dtype(),
                k.shape()
            ),
        });
    }
    let half = q.shape()[3] / 2;
    let rows = [q.shape()[2], q.shape()[2], k.shape()[2], k.shape()[2]];
    let named = [
        ("cos_q", rotary.cos_q),
        ("sin_q", rotary.sin_q),
        ("cos_k", rotary.cos_k),
        ("sin_k", rotary.sin_k),
    ];
    let mut tables = Vec::with_capacity(4);
    for ((name, table), rows) in named.into_iter().zip(rows) {
        if table.dtype() != DType::F32 || table.shape() != [rows, half] {
            return Err(Error::Invalid {
                op,
                message: format!(
                    "{name} must be f32 [{rows}, {half}], got {} {:?}",
                    table.dtype(),
                    table.shape()
                ),
            });
        }
        if grad_enabled() && table.requires_grad() {
            return Err(Error::Invalid {
                op,
                message: format!("{name} is not differentiated; detach it"),
            });
        }
        tables.push(match table.is_contiguous() && table.layout().offset.is_multiple_of(4) {
            true => table.clone(),
            false => table.copy()?,
        });
    }
    Ok(tables.try_into().expect("four tables"))
}

/// Whether [`Tensor::flash_attention`] takes queries `q` `[B, H, T, D]` with keys and values `k`, `v`: f32
/// throughout, heads of at most [`MAX_HEAD_DIM`] whose tiles fit the device's workgroup memory (the backward's
/// too when gradients will be recorded), and sequences times heads within one dimension of the launch grid.
/// Shapes that do not fit each other are errors of the op, not refusals here.
pub fn flash_attention_fits(q: &Tensor, k: &Tensor, v: &Tensor) -> bool {
    [q, k, v].iter().all(|x| x.dtype() == DType::F32)
        && q.rank() == 4
        && q.shape()[3] <= MAX_HEAD_DIM
        && within_grid(q)
        && tiles_fit(q, records_grads([q, k, v]))
}

/// Whether [`Tensor::rotary_flash_attention`] takes queries `q` with keys and values `k`, `v`: as
/// [`flash_attention_fits`], as many keys as queries, on the f32 kernels (not autocast's tensor-core ones), which
/// then keep each head row in whole rotary pairs of quads: heads a multiple of 8 long, rows starting on a vec4 at
/// unit stride, and the backward's row kernels with each quad's partner in the same thread. The device must also
/// bind [`ROTARY_BINDINGS`] storage buffers per kernel (browsers offer 8 to 10).
pub fn rotary_flash_attention_fits(q: &Tensor, k: &Tensor, v: &Tensor) -> bool {
    let device = q.device();
    flash_attention_fits(q, k, v)
        && q.shape()[2] == k.shape()[2]
        && !flash_attention_coop::fits(q, k, v)
        && q.shape()[3].is_multiple_of(8)
        && [q, k, v].iter().all(|x| x.layout().rows_of_vec4s())
        && device.limits().max_storage_buffers_per_shader_stage >= ROTARY_BINDINGS
        && [Kernel::GradQRows, Kernel::GradKvRows].iter().all(|kernel| {
            let d4 = q.shape()[3] / 4;
            let tiling = kernel.tiling(d4, workgroup_memory(device), device);
            // Quad m of a thread pairs with its quad m + QM / 2: G must divide D4 / 2.
            tiling.is_some_and(|(_, constants)| {
                constants
                    .iter()
                    .any(|&(name, g)| name == "G" && (d4 / 2).is_multiple_of(g))
            })
        })
}

/// Whether the op records a backward rule for these inputs.
fn records_grads(inputs: [&Tensor; 3]) -> bool {
    grad_enabled() && inputs.iter().any(|x| x.requires_grad())
}

/// Whether the forward kernel, and with `with_grads` the backward ones, have tiles for heads of `q`'s size
/// within the device's workgroup memory.
fn tiles_fit(q: &Tensor, with_grads: bool) -> bool {
    let kernels: &[Kernel] = if with_grads { &Kernel::ALL } else { &[Kernel::Forward] };
    kernels.iter().all(|k| k.fits(q.shape()[3], q.device()))
}

fn workgroup_memory(device: &Device) -> usize {
    device.limits().max_compute_workgroup_storage_size as usize
}

/// Each kernel launches one workgroup per sequence and (query or key/value) head along x of its grid; the query
/// heads are the more numerous.
fn within_grid(q: &Tensor) -> bool {
    q.shape()[0] * q.shape()[1] <= u16::MAX as usize
}

/// Gradients of the inputs read as `q`, `k`, `v` (the op's inputs, or the rows its rotary forward kept), laid out
/// as `layout` says, from the output gradient `g` (`[B, T, H, D]`, any strides).
fn backward(
    params: &Params,
    [q, k, v]: [&Tensor; 3],
    layout: GradLayout,
    out: &Tensor,
    lse: &Tensor,
    g: &Tensor,
) -> Result<Vec<Tensor>> {
    const OP: &str = "flash_attention_backward";
    let device = q.device();
    let [b, h, t, d] = [q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]];
    let (kvh, s) = (k.shape()[1], k.shape()[2]);
    // The kernels read the output gradient as a dense array from the start of its buffer.
    let g = match g.is_contiguous() && g.layout().offset == 0 {
        true => g.clone(),
        false => g.copy()?,
    };
    if b * h * t == 0 || d == 0 {
        // Nothing attends: zero gradients (keys and values may still have elements).
        return [q, k, v]
            .iter()
            .map(|x| Tensor::zeros(x.shape(), DType::F32, device))
            .collect();
    }
    let (dq, dk, dv) = match layout {
        GradLayout::OneProjection => {
            let all = output(OP, &[b, t, h + 2 * kvh, d], device)?;
            let part = |from: usize, heads: usize| all.narrow(2, from, heads)?.permute(&[0, 2, 1, 3]);
            (part(0, h)?, part(h, kvh)?, part(h + kvh, kvh)?)
        }
        GradLayout::Separate {
            q_token_major,
            kv_token_major,
        } => {
            let gradient = |shape: &[usize], token_major: bool| -> Result<Tensor> {
                match token_major {
                    true => output(OP, &[shape[0], shape[2], shape[1], shape[3]], device)?.permute(&[0, 2, 1, 3]),
                    false => output(OP, shape, device),
                }
            };
            (
                gradient(q.shape(), q_token_major)?,
                gradient(k.shape(), kv_token_major)?,
                gradient(v.shape(), kv_token_major)?,
            )
        }
    };
    let params = params.storing([&dq, &dk, &dv]);
    {
        let delta = output(OP, &[b, h, t], device)?;
        // The kernels that keep rows in registers where they fit (not on the tensor-core path, which has its own).
        let (grad_q, grad_kv) = match !params.coop && Kernel::GradQRows.fits(d, device) {
            true => (Kernel::GradQRows, Kernel::GradKvRows),
            false => (Kernel::GradQ, Kernel::GradKv),
        };
        params.launch(OP, grad_q, &[&dq, &delta, q, k, v, out, &g, lse], [t, b * h])?;
        if s > 0 {
            params.launch(OP, grad_kv, &[&dk, &dv, q, k, v, &g, lse, &delta], [s, b * kvh])?;
        }
    }
    Ok(vec![dq, dk, dv])
}

/// How the backward lays out the gradients of the queries, keys and values, decided from the inputs by the
/// forward (the backward may not keep them). Inputs are usually views of `[B, T, H, D]` projections: their
/// gradients are written in that order and handed back as the same views, so that the projections' backward
/// reshapes them without a copy; views side by side in one `[B, T, (H + 2 KVH) D]` projection get theirs side
/// by side in one tensor, which that projection's backward then takes whole.
#[derive(Clone, Copy)]
enum GradLayout {
    OneProjection,
    Separate { q_token_major: bool, kv_token_major: bool },
}

impl GradLayout {
    /// The layout for inputs `q`, `k`, `v`; never one tensor on the tensor-core path (`coop`), whose kernels
    /// write each gradient densely.
    fn of([q, k, v]: [&Tensor; 3], coop: bool) -> GradLayout {
        let (lq, lk, lv) = (q.layout(), k.layout(), v.layout());
        let (h, kvh, d) = (q.shape()[1], k.shape()[1], q.shape()[3]);
        let one = [q, k, v]
            .iter()
            .all(|x| token_major(x) && Arc::ptr_eq(x.shared_buffer(), q.shared_buffer()))
            && q.shape()[2] == k.shape()[2]
            && lk.strides == lq.strides
            && lv.strides == lq.strides
            && lq.strides[1] == d
            && lq.strides[3] == 1
            && lq.strides[2] == (h + 2 * kvh) * d
            && lq.strides[0] == q.shape()[2] * lq.strides[2]
            && lk.offset == lq.offset + h * d
            && lv.offset == lk.offset + kvh * d;
        match one && !coop {
            true => GradLayout::OneProjection,
            false => GradLayout::Separate {
                q_token_major: token_major(q),
                kv_token_major: token_major(k) && token_major(v),
            },
        }
    }
}

/// A dense f32 tensor of `shape` that a kernel fills completely (not cleared first); zeros when it is empty.
fn output(op: &str, shape: &[usize], device: &Device) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    if n == 0 {
        return Tensor::zeros(shape, DType::F32, device);
    }
    let buffer = device.alloc(op, Tensor::bytes_for(n, DType::F32))?;
    Ok(Tensor::from_buffer(buffer, shape, DType::F32, None))
}

/// The kernels of the op (the first three numbered as the tensor-core ones). The forward runs `ForwardRows` and
/// the backward `GradQRows` and `GradKvRows` where they fit, else `Forward` and the tiled `GradQ` and `GradKv`,
/// which every device takes.
#[derive(Clone, Copy, Debug)]
enum Kernel {
    Forward,
    GradQ,
    GradKv,
    GradQRows,
    GradKvRows,
    ForwardRows,
}

impl Kernel {
    /// The kernels every launch of the op needs.
    const ALL: [Kernel; 3] = [Kernel::Forward, Kernel::GradQ, Kernel::GradKv];

    /// Bindings after the parameters at 0 (name, written, what its rows are) and the kernel body.
    fn parts(self) -> (&'static [(&'static str, bool, Rows)], &'static str) {
        use Rows::{Dense, Scalars, View};
        match self {
            Kernel::Forward | Kernel::ForwardRows => (
                &[
                    ("out", true, Dense),
                    ("lse", true, Scalars),
                    ("q", false, View("Q_AT")),
                    ("k", false, View("K_AT")),
                    ("v", false, View("V_AT")),
                ],
                if matches!(self, Kernel::Forward) {
                    FORWARD
                } else {
                    FORWARD_ROWS
                },
            ),
            Kernel::GradQ | Kernel::GradQRows => (
                &[
                    ("dq", true, Dense),
                    ("delta_out", true, Scalars),
                    ("q", false, View("Q_AT")),
                    ("k", false, View("K_AT")),
                    ("v", false, View("V_AT")),
                    ("out", false, Dense),
                    ("dout", false, Dense),
                    ("lse", false, Scalars),
                ],
                if matches!(self, Kernel::GradQ) {
                    GRAD_Q
                } else {
                    GRAD_Q_ROWS
                },
            ),
            Kernel::GradKv | Kernel::GradKvRows => (
                &[
                    ("dk", true, Dense),
                    ("dv", true, Dense),
                    ("q", false, View("Q_AT")),
                    ("k", false, View("K_AT")),
                    ("v", false, View("V_AT")),
                    ("dout", false, Dense),
                    ("lse", false, Scalars),
                    ("delta", false, Scalars),
                ],
                if matches!(self, Kernel::GradKv) {
                    GRAD_KV
                } else {
                    GRAD_KV_ROWS
                },
            ),
        }
    }

    /// Whether the kernel has tiles for heads of `d` elements on `device`.
    fn fits(self, d: usize, device: &Device) -> bool {
        self.tiling(d.div_ceil(4), workgroup_memory(device), device).is_some()
    }

    /// Rows per workgroup and the tile constants of the source (besides D4), for heads of `d4` quads and `budget`
    /// bytes of workgroup memory; `None` when even the smallest tiles do not fit.
    ///
    /// The forward takes 128 query rows per workgroup, one thread each, and stages up to [`MAX_TILE_ROWS`] keys
    /// and values at a time (a power of two that fits). Its row kernel takes 64 rows (32 for groups of 8) in
    /// groups of G threads as the backward's row kernels, tiles of up to [`FORWARD_TILE_KEYS`] keys, and steps of
    /// [`FORWARD_KEY_GROUP`]. On the H200 (the 12 layers of the 110M training shape): 2.26 ms against 2.49 for the
    /// single-row kernel, whose 212 registers a thread let 8 warps run on a multiprocessor; groups of 2 threads
    /// take 125 registers each. Other row counts, tiles, steps and group shapes ran slower (BENCHMARKS.md,
    /// session 28), two rows a group too (each staged quad serving both).
    ///
    /// The backward kernels take tiles of `8R` query and key rows (flash_attention_grad_tiles.wgsl) with R = 2
    /// where it fits, else 1. Measured on the H200 (the 12 layers of the 110M training shape, query and key/value
    /// kernels together): 19.8 ms with R = 2, 20.7 with R = 1 and 31.4 with R = 4, whose larger register tiles
    /// and tile fetched ahead crowd the registers.
    ///
    /// The row kernels keep each of their 64 rows (32 for groups of 8) in a group of G threads, at most
    /// [`ROW_QUADS`] quads each, and stream tiles of 16 rows (8 where 16 do not fit). On the H200, the same 12
    /// layers: 8.9 ms (query gradients 3.8, keys and values 5.0) against 13.7 for the tiled kernels; 11.1 with
    /// 4 quads per thread (groups of 4), key/value gradients 6.4 ms with tiles of 32 rows, 7.1 with 32 keys per
    /// workgroup and 6.1 with 128. Each round's streamed rows are taken UNROLL at a time (their products
    /// interleaved, the gradient updates in row order, so the sums are the same): 2 for the query kernel and 4
    /// for the key/value kernel took them from 3.64 / 3.89 ms to 3.32 / 3.75 (unrolling by 4 / 2: 3.39 / 3.78);
    /// since, 4 and 8 took them from 2.73 / 3.17 ms to 2.56 / 3.14.
    fn tiling(self, d4: usize, budget: usize, device: &Device) -> Option<(usize, Vec<(&'static str, usize)>)> {
        match self {
            Kernel::GradQRows | Kernel::GradKvRows => {
                let (g, rows) = row_groups(d4, device, false)?;
                let qm = d4.div_ceil(g);
                // Two buffers of two rows (k and v, or q and dout) per streamed row, and lse with delta.
                let bytes = |stream: usize| 2 * stream * g * qm * 16 * 2 + 2 * stream * 4 * 2;
                let stream = [16, 8].into_iter().find(|&stream| bytes(stream) <= budget)?;
                let query = matches!(self, Kernel::GradQRows);
                let unroll = if query { 4 } else { 8 };
                // The kernels step through a tile UNROLL rows at a time: another divisor would skip rows. The query
                // kernel takes their exps two by two (pair_exp).
                assert!(
                    stream.is_multiple_of(unroll) && (!query || unroll.is_multiple_of(2)),
                    "UNROLL {unroll} must divide STREAM {stream} (and be even for the query kernel)"
                );
                let mut constants = vec![
                    ("G", g),
                    ("QM", qm),
                    ("QS", g * qm),
                    ("ROWS", rows),
                    ("STREAM", stream),
                    ("STAGED", (stream * qm).div_ceil(rows)),
                    ("UNROLL", unroll),
                ];
                if query {
                    constants.push(("PAIRS", unroll / 2));
                }
                Some((rows, constants))
            }
            Kernel::Forward => {
                let bc = (budget / (2 * 16 * d4.max(1))).min(MAX_TILE_ROWS);
                // 256 rows ran training's forward faster while each head's blocks started in order (10.5 against
                // 9.7 TFLOP/s, H200); with the heaviest first, 128 take it from 2.87 to 2.41 ms a step. A prompt's
                // prefill (few sequences) took 128 rows either way: 75.5K against 69.7K tokens/s over 512 tokens.
                (bc > 0).then(|| (128, vec![("BR", 128), ("THREADS", 128), ("BC", 1 << bc.ilog2())]))
            }
            Kernel::ForwardRows => {
                // Its loops take their bounds from subgroup operations, whatever G.
                let (g, rows) = row_groups(d4, device, true)?;
                // Tiles of a power of two keys that fits, at least one group of four.
                let fit = (budget / (2 * 16 * d4.max(1))).min(FORWARD_TILE_KEYS);
                if fit < 4 {
                    return None;
                }
                let bc = 1 << fit.ilog2();
                let kb = bc.min(FORWARD_KEY_GROUP);
                Some((
                    rows,
                    vec![
                        ("G", g),
                        ("QM", d4.div_ceil(g)),
                        ("ROWS", rows),
                        ("THREADS", rows * g),
                        ("BC", bc),
                        ("KQ", kb / 4),
                    ],
                ))
            }
            Kernel::GradQ | Kernel::GradKv => {
                let bytes = |r: usize| {
                    let tile = 8 * r;
                    4 * tile * (d4 + 1) * 16 + 2 * tile * (tile + 1) * 4 + 2 * tile * 4
                };
                let r = [2, 1].into_iter().find(|&r| bytes(r) <= budget)?;
                Some((
                    8 * r,
                    vec![
                        ("R", r),
                        ("TILE", 8 * r),
                        ("M", d4.div_ceil(8)),
                        ("STAGED", (8 * r * d4).div_ceil(64)),
                    ],
                ))
            }
        }
    }
}

/// The groups of the row kernels for heads of `d4` quads, as (G, rows a workgroup): G threads a row, each holding
/// up to [`ROW_QUADS`] quads of every row it keeps, 64 rows (fewer for groups past 4, so that a workgroup stays
/// within 256 threads). The forward's and the backward's row kernels take the same G, so that the backward
/// recomputes the forward's scores. `None` where the groups need subgroups (G > 1, or `subgroups`) that the
/// device does not have at that size.
fn row_groups(d4: usize, device: &Device, subgroups: bool) -> Option<(usize, usize)> {
    let g = d4.div_ceil(ROW_QUADS).next_power_of_two();
    let caps = device.caps();
    if (g > 1 || subgroups) && !(caps.subgroups && caps.subgroup_size.0 as usize >= g) {
        return None;
    }
    Some((g, (256 / g).min(64)))
}

/// What a binding's elements are: head rows of D read through a view (whose parameters start at the named
/// constant), dense head rows, or one value per row.
#[derive(Clone, Copy, Debug)]
enum Rows {
    View(&'static str),
    Dense,
    Scalars,
}

/// The binding's declaration and, for head rows, `load_NAME(base, c)` (quad c of the row at element offset
/// `base`, zeros past D) when it is read or `store_NAME(base, c, x)` when it is written. With `quads` (see
/// [`Params::quads`]) head rows are bound as arrays of vec4s and each quad moves as one 128-bit access.
fn binding(index: usize, name: &str, written: bool, rows: Rows, quads: bool) -> String {
    let access = if written { "read_write" } else { "read" };
    let element = if quads && !matches!(rows, Rows::Scalars) {
        "vec4<f32>"
    } else {
        "f32"
    };
    let mut s = format!("@group(0) @binding({index}) var<storage, {access}> {name}: array<{element}>;\n");
    let stride = match rows {
        Rows::Scalars => return s,
        Rows::View(at) => format!(" * p[{at} + 4u]"),
        Rows::Dense => String::new(),
    };
    if quads {
        let body = match written {
            true => {
                format!("fn store_{name}(base: u32, c: u32, x: vec4<f32>) {{\n    {name}[base / 4u + c] = x;\n}}\n")
            }
            false => {
                format!("fn load_{name}(base: u32, c: u32) -> vec4<f32> {{\n    return {name}[base / 4u + c];\n}}\n")
            }
        };
        s.push_str(&body);
        return s;
    }
    if written {
        s.push_str(&format!(
            "fn store_{name}(base: u32, c: u32, x: vec4<f32>) {{
    for (var e = 0u; e < 4u; e = e + 1u) {{
        if (4u * c + e < p[8]) {{ {name}[base + 4u * c + e] = x[e]; }}
    }}
}}
"
        ));
    } else {
        // Straight-line code, four independent loads (clamped to the row, zeros past D): the compiler keeps them
        // in flight together.
        s.push_str(&format!(
            "fn load_{name}(base: u32, c: u32) -> vec4<f32> {{
    let e = vec4<u32>(4u * c) + vec4<u32>(0u, 1u, 2u, 3u);
    let at = vec4<u32>(base) + min(e, vec4<u32>(p[8] - 1u)){stride};
    return select(vec4<f32>(0.0), vec4<f32>({name}[at.x], {name}[at.y], {name}[at.z], {name}[at.w]), e < vec4<u32>(p[8]));
}}
"
        ));
    }
    s
}

/// The launch parameters shared by the forward and backward kernels (see flash_attention_common.wgsl).
#[derive(Clone)]
struct Params {
    words: Vec<u32>,
    d: usize,
    /// Whether every head row starts on a quad and runs along unit strides (D a multiple of 4, the views'
    /// offsets and strides too), so that the kernels move quads as vec4s instead of four scalars each.
    quads: bool,
    /// Whether the tensor-core kernels run (chosen with the forward, kept by its backward).
    coop: bool,
    /// The rotary tables cos_q, sin_q, cos_k, sin_k, bound after the kernel's other tensors when the kernels
    /// rotate queries and keys (flash_attention_rotary.wgsl).
    tables: Option<[Tensor; 4]>,
}

impl Params {
    fn new(
        [q, k, v]: [&Tensor; 3],
        [q_start, k_start]: [usize; 2],
        window: Option<usize>,
        coop: bool,
        tables: Option<[Tensor; 4]>,
    ) -> Self {
        let [b, h, t, d] = [q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]];
        let (kvh, s) = (k.shape()[1], k.shape()[2]);
        let mut words = vec![
            b as u32,
            h as u32,
            t as u32,
            s as u32,
            (h / kvh.max(1)) as u32,
            q_start as u32,
            k_start as u32,
            window_word(window, q_start, t, k_start),
            d as u32,
        ];
        for view in [q, k, v] {
            words.extend(view_params(view));
        }
        // The tensor-core backward writes each gradient in the order its input's view was cut from (see
        // `GradLayout`; the portable kernels take views of the gradients, see `storing`).
        words.push(token_major(q) as u32);
        words.push((token_major(k) && token_major(v)) as u32);
        words.extend((0..4).map(|i| tables.as_ref().map_or(0, |t| t[i].layout().offset as u32)));
        let quads = d.is_multiple_of(4) && [q, k, v].into_iter().all(|x| x.layout().rows_of_vec4s());
        Params {
            words,
            d,
            quads,
            coop,
            tables,
        }
    }

    /// The parameters of the backward kernels, which store the gradients through the views `dq`, `dk` and `dv`
    /// (`[B, heads, rows, D]`, dense along D).
    fn storing(&self, gradients: [&Tensor; 3]) -> Params {
        let mut params = self.clone();
        for x in gradients {
            params.words.extend(view_params(x));
        }
        params
    }

    /// Records `kernel` with `buffers` bound in the order of [`Kernel::parts`] over `rows` (query or key rows)
    /// of each of `heads` sequence heads. In the portable kernels heads run along x and blocks of rows along y:
    /// workgroups start in that order, and the kernels number the blocks so that those with the most causal work
    /// (late queries, early keys) start first, leaving light ones, not a heavy straggler, for the end of the
    /// launch. The tensor-core kernels take blocks of rows along x and heads along y, in plain order.
    fn launch(&self, op: &str, kernel: Kernel, buffers: &[&Tensor], [rows, heads]: [usize; 2]) -> Result<()> {
        if self.coop {
            return flash_attention_coop::launch(op, kernel as usize, &self.words, buffers, [rows, heads]);
        }
        let device: &Device = buffers[0].device();
        let d4 = self.d.div_ceil(4);
        let (per_workgroup, mut constants) = kernel
            .tiling(d4, workgroup_memory(device), device)
            .expect("checked by flash_attention");
        constants.push(("D4", d4));
        let shape: Vec<String> = constants.iter().map(|(_, value)| value.to_string()).collect();
        let rotary = self.tables.is_some();
        // A rotary forward given one buffer past its fixed bindings keeps the rotated rows there (see `attend`).
        let forward = matches!(kernel, Kernel::Forward | Kernel::ForwardRows);
        let keeps = rotary && forward && buffers.len() > kernel.parts().0.len();
        let key = format!(
            "flash_attention:{kernel:?}:{}:{}:{rotary}:{keeps}",
            shape.join(":"),
            self.quads
        );
        let source = || {
            let (bindings, body) = kernel.parts();
            let mut bindings = bindings.to_vec();
            if keeps {
                bindings.push(("kept", true, Rows::Dense));
            }
            let mut s = String::from("@group(0) @binding(0) var<storage, read> p: array<u32>;\n");
            for (i, &(name, written, rows)) in bindings.iter().enumerate() {
                s.push_str(&binding(i + 1, name, written, rows, self.quads));
            }
            if rotary {
                for (i, name) in ["cos_q", "sin_q", "cos_k", "sin_k"].iter().enumerate() {
                    let index = bindings.len() + 1 + i;
                    s.push_str(&format!(
                        "@group(0) @binding({index}) var<storage, read> {name}: array<vec4<f32>>;\n"
                    ));
                }
            }
            for (name, value) in &constants {
                s.push_str(&format!("const {name}: u32 = {value}u;\n"));
            }
            s.push_str(COMMON_WGSL);
            s.push_str(COMMON);
            s.push_str(&match (forward, rotary) {
                (true, true) => [ROTARY, ROTATED_LOADS, if keeps { KEEP_ROTATED } else { KEEP_NOTHING }].concat(),
                (true, false) => [LOADS, KEEP_NOTHING].concat(),
                (false, true) => [LOADS, ROTARY, GRADS_ROTATED_BACK].concat(),
                (false, false) => [LOADS, GRADS_AS_COMPUTED].concat(),
            });
            match kernel {
                Kernel::Forward | Kernel::ForwardRows => s.push_str(KEY_TILES),
                Kernel::GradQ => s.push_str(&[GRAD_TILES, QUERY_GRADS].concat()),
                Kernel::GradKv => s.push_str(&[GRAD_TILES, KEY_GRADS].concat()),
                Kernel::GradQRows => s.push_str(QUERY_GRADS),
                Kernel::GradKvRows => s.push_str(KEY_GRADS),
            }
            if matches!(kernel, Kernel::GradQRows | Kernel::GradKvRows) {
                s.push_str(ROWS_COMMON);
            }
            if matches!(kernel, Kernel::ForwardRows | Kernel::GradQRows | Kernel::GradKvRows) {
                let grouped = constants.iter().any(|&(name, value)| name == "G" && value > 1);
                s.push_str(if grouped { GROUP_SUM_SHUFFLED } else { GROUP_SUM_SINGLE });
            }
            s.push_str(body);
            expand(&s, &constants)
        };
        let tables = self.tables.iter().flatten();
        let raw: Vec<_> = buffers.iter().copied().chain(tables).map(|t| t.buffer()).collect();
        device.dispatch(Dispatch {
            op,
            runtime_checks: false,
            language: Language::Wgsl,
            key: &key,
            source: &source,
            buffers: &raw,
            params: &self.words,
            workgroups: [heads as u32, rows.div_ceil(per_workgroup) as u32, 1],
        })?;
        Ok(())
    }
}

/// `template` with every block between `//@FOR x N` and its `//@END` repeated `counts[N]` times, `@x` set to
/// 0, 1, ... in each copy (blocks nest): per-thread rows and tiles become separate variables (`acc0`, `s_1_0`,
/// ...), which drivers keep in registers, where arrays indexed in loops may land in slow local memory.
fn expand(template: &str, counts: &[(&str, usize)]) -> String {
    let mut out = String::new();
    let mut lines = template.lines();
    while let Some(line) = lines.next() {
        let Some(header) = line.trim().strip_prefix("//@FOR ") else {
            out.push_str(line);
            out.push('\n');
            continue;
        };
        let (var, count) = header.split_once(' ').expect("//@FOR x N");
        let count = counts.iter().find(|(name, _)| *name == count).expect("a known count").1;
        let mut block = String::new();
        let mut depth = 0;
        let mut closed = false;
        for line in lines.by_ref() {
            match line.trim() {
                "//@END" if depth == 0 => {
                    closed = true;
                    break;
                }
                "//@END" => depth -= 1,
                l if l.starts_with("//@FOR ") => depth += 1,
                _ => {}
            }
            block.push_str(line);
            block.push('\n');
        }
        assert!(closed, "//@FOR {var} without its //@END");
        let block = expand(&block, counts);
        for i in 0..count {
            out.push_str(&substitute(&block, var, i));
        }
    }
    out
}

/// `text` with each `@var` that is a whole name (followed by a character that cannot continue one, or by `u` and
/// then such a character: `@xu` is the u32 literal) replaced by `value`: `@builtin` stays when `var` is `b`.
fn substitute(text: &str, var: &str, value: usize) -> String {
    let pattern = format!("@{var}");
    let continues = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(&pattern) {
        let after = &rest[at + pattern.len()..];
        let mut chars = after.chars();
        let next = chars.next();
        let whole = !continues(next) || (next == Some('u') && !continues(chars.next()));
        out.push_str(&rest[..at]);
        if whole {
            out.push_str(&value.to_string());
        } else {
            out.push_str(&pattern);
        }
        rest = after;
    }
    out.push_str(rest);
    out
}
