//! Causal attention for training in fused kernels (flash attention): the forward keeps an online softmax per
//! query row and stores only the output and each row's log-sum-exp; the backward recomputes the probabilities
//! from them. No `[T, S]` score or probability tensor is ever allocated, so memory stays linear in the sequence
//! length, and a training step saves one launch per direction instead of the matmuls, mask, softmax and their
//! gradients of the composed path.

use hierarchos_wgpu::{COMMON_WGSL, DType, Dispatch};

use crate::autograd::Node;
use crate::error::{Error, Result};
use crate::ops::attention::{MAX_HEAD_DIM, check_shapes, view_params};
use crate::tensor::{Device, Tensor};

const COMMON: &str = include_str!("../../../../wgsl/flash_attention_common.wgsl");
const FORWARD: &str = include_str!("../../../../wgsl/flash_attention_forward.wgsl");
const GRAD_Q: &str = include_str!("../../../../wgsl/flash_attention_dq.wgsl");
const GRAD_KV: &str = include_str!("../../../../wgsl/flash_attention_dkv.wgsl");
const KEY_TILES: &str = include_str!("../../../../wgsl/flash_attention_key_tiles.wgsl");

/// Rows staged per tile at most. Measured on the H200 (8 x 12 heads of 64, 512 tokens): tiles of 16 rows took the
/// forward from 2.6 to 5.0 TFLOP/s against tiles of 64 (less workgroup memory, more workgroups resident per
/// multiprocessor), and 256 rows per workgroup instead of 64 to 8.1.
const MAX_TILE_ROWS: usize = 16;

impl Tensor {
    /// Causal attention of the queries `self` (`[B, H, T, D]`, already multiplied by the score scale) over keys
    /// `k` and values `v` (`[B, KVH, S, D]`), with the visibility rules of [`Tensor::cached_attention`]: query
    /// `t` at position `q_start + t`, key `j` at `k_start + j`, keys after the query or (with a `window`) `window`
    /// or more positions before it are hidden. Query head `h` reads key/value head `h / (H / KVH)`. Inputs are
    /// read through any strides. Returns a new contiguous `[B, T, H, D]` tensor and records a backward rule for
    /// all three inputs (f32 accumulation throughout, as torch). f32 only, `D <= 256`.
    pub fn flash_attention(
        &self,
        k: &Tensor,
        v: &Tensor,
        q_start: usize,
        k_start: usize,
        window: Option<usize>,
    ) -> Result<Tensor> {
        const OP: &str = "flash_attention";
        check_shapes(OP, self, k, v, q_start, k_start, window)?;
        let (q, device) = (self, self.device());
        let [b, h, t, d] = [q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]];
        if !within_grid(q) {
            return Err(Error::Invalid {
                op: OP,
                message: format!("{b} sequences of {h} heads exceed the launch grid"),
            });
        }
        let params = Params::new(q, k, v, [q_start, k_start], window);
        let out = output(OP, &[b, t, h, d], device)?;
        let lse = output(OP, &[b, h, t], device)?;
        if b * h * t > 0 && d > 0 {
            params.launch(
                OP,
                Kernel::Forward,
                &[&out, &lse, q, k, v],
                [t.div_ceil(Kernel::Forward.rows()), b * h],
            )?;
        }
        let node = Node::record(OP, &[q, k, v], {
            let (q, k, v) = (q.detach(), k.detach(), v.detach());
            let out = out.detach();
            Box::new(move |g| {
                let grads = backward(&params, [&q, &k, &v], &out, &lse, g)?;
                Ok(grads.into_iter().map(Some).collect())
            })
        });
        Ok(out.with_node(node))
    }
}

/// Whether [`Tensor::flash_attention`] takes queries `q` `[B, H, T, D]` with keys and values `k`, `v`: f32
/// throughout, heads of at most [`MAX_HEAD_DIM`], and sequences times heads within one dimension of the launch
/// grid. Shapes that do not fit each other are errors of the op, not refusals here.
pub fn flash_attention_fits(q: &Tensor, k: &Tensor, v: &Tensor) -> bool {
    [q, k, v].iter().all(|x| x.dtype() == DType::F32) && q.rank() == 4 && q.shape()[3] <= MAX_HEAD_DIM && within_grid(q)
}

/// Each kernel launches one row of workgroups per sequence and (query or key/value) head; the query heads are the
/// more numerous.
fn within_grid(q: &Tensor) -> bool {
    q.shape()[0] * q.shape()[1] <= u16::MAX as usize
}

/// Gradients of the queries, keys and values from the output gradient `g` (`[B, T, H, D]`, any strides).
fn backward(params: &Params, [q, k, v]: [&Tensor; 3], out: &Tensor, lse: &Tensor, g: &Tensor) -> Result<Vec<Tensor>> {
    const OP: &str = "flash_attention_backward";
    let device = q.device();
    let [b, h, t, d] = [q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]];
    let (kvh, s) = (k.shape()[1], k.shape()[2]);
    let g = g.contiguous()?;
    if b * h * t == 0 || d == 0 {
        // Nothing attends: zero gradients (keys and values may still have elements).
        return [q, k, v]
            .iter()
            .map(|x| Tensor::zeros(x.shape(), DType::F32, device))
            .collect();
    }
    let dq = output(OP, q.shape(), device)?;
    let dk = output(OP, k.shape(), device)?;
    let dv = output(OP, v.shape(), device)?;
    {
        let delta = output(OP, &[b, h, t], device)?;
        params.launch(
            OP,
            Kernel::GradQ,
            &[&dq, &delta, q, k, v, out, &g, lse],
            [t.div_ceil(Kernel::GradQ.rows()), b * h],
        )?;
        if s > 0 {
            params.launch(
                OP,
                Kernel::GradKv,
                &[&dk, &dv, q, k, v, &g, lse, &delta],
                [s.div_ceil(Kernel::GradKv.rows()), b * kvh],
            )?;
        }
    }
    Ok(vec![dq, dk, dv])
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

/// The three kernels of the op.
#[derive(Clone, Copy, Debug)]
enum Kernel {
    Forward,
    GradQ,
    GradKv,
}

impl Kernel {
    /// Bindings after the parameters at 0 (name, written, what its rows are) and the kernel body.
    fn parts(self) -> (&'static [(&'static str, bool, Rows)], &'static str) {
        use Rows::{Dense, Scalars, View};
        match self {
            Kernel::Forward => (
                &[
                    ("out", true, Dense),
                    ("lse", true, Scalars),
                    ("q", false, View("Q_AT")),
                    ("k", false, View("K_AT")),
                    ("v", false, View("V_AT")),
                ],
                FORWARD,
            ),
            Kernel::GradQ => (
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
                GRAD_Q,
            ),
            Kernel::GradKv => (
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
                GRAD_KV,
            ),
        }
    }

    /// Rows per workgroup, one thread each (the backward kernels hold more per thread: 128 measured best there,
    /// 5.8 against 9.0 ms for forward and backward of the shape of [`MAX_TILE_ROWS`]).
    fn rows(self) -> usize {
        match self {
            Kernel::Forward => 256,
            Kernel::GradQ | Kernel::GradKv => 128,
        }
    }

    /// Workgroup memory per staged row: the forward and query kernels stage keys and values, the key/value kernel
    /// queries and output gradients with their log-sum-exp and delta.
    fn staged_bytes_per_row(self, d4: usize) -> usize {
        match self {
            Kernel::Forward | Kernel::GradQ => 2 * 16 * d4,
            Kernel::GradKv => 2 * 16 * d4 + 8,
        }
    }
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
/// `base`, zeros past D) when it is read or `store_NAME(base, c, x)` when it is written.
fn binding(index: usize, name: &str, written: bool, rows: Rows) -> String {
    let access = if written { "read_write" } else { "read" };
    let mut s = format!("@group(0) @binding({index}) var<storage, {access}> {name}: array<f32>;\n");
    let stride = match rows {
        Rows::Scalars => return s,
        Rows::View(at) => format!(" * p[{at} + 4u]"),
        Rows::Dense => String::new(),
    };
    let (signature, body) = if written {
        (
            format!("fn store_{name}(base: u32, c: u32, x: vec4<f32>)"),
            format!("{name}[base + 4u * c + e] = x[e];"),
        )
    } else {
        (
            format!("fn load_{name}(base: u32, c: u32) -> vec4<f32>"),
            format!("r[e] = {name}[base + (4u * c + e){stride}];"),
        )
    };
    let (init, ret) = if written {
        ("", "")
    } else {
        ("    var r = vec4<f32>(0.0);\n", "    return r;\n")
    };
    s.push_str(&format!(
        "{signature} {{\n{init}    for (var e = 0u; e < 4u; e = e + 1u) {{\n        if (4u * c + e < p[8]) {{ {body} }}\n    }}\n{ret}}}\n"
    ));
    s
}

/// The launch parameters shared by the forward and backward kernels (see flash_attention_common.wgsl).
struct Params {
    words: Vec<u32>,
    d: usize,
}

impl Params {
    fn new(q: &Tensor, k: &Tensor, v: &Tensor, [q_start, k_start]: [usize; 2], window: Option<usize>) -> Self {
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
            window.map_or(0, |w| w.min(u32::MAX as usize) as u32),
            d as u32,
        ];
        for view in [q, k, v] {
            words.extend(view_params(view));
        }
        Params { words, d }
    }

    /// Records `kernel` with `buffers` bound in the order of [`Kernel::parts`] over `grid` workgroups.
    fn launch(&self, op: &str, kernel: Kernel, buffers: &[&Tensor], grid: [usize; 2]) -> Result<()> {
        let device: &Device = buffers[0].device();
        let d4 = self.d.div_ceil(4);
        let budget = device.limits().max_compute_workgroup_storage_size as usize;
        let br = kernel.rows();
        // Rows per staged tile: a power of two that fits the workgroup memory.
        let bc = (budget / kernel.staged_bytes_per_row(d4)).clamp(1, MAX_TILE_ROWS);
        let bc = 1 << bc.ilog2();
        let key = format!("flash_attention:{kernel:?}:{d4}:{br}:{bc}");
        let source = || {
            let (bindings, body) = kernel.parts();
            let mut s = String::from("@group(0) @binding(0) var<storage, read> p: array<u32>;\n");
            for (i, &(name, written, rows)) in bindings.iter().enumerate() {
                s.push_str(&binding(i + 1, name, written, rows));
            }
            s.push_str(&format!(
                "const D4: u32 = {d4}u;\nconst BR: u32 = {br}u;\nconst BC: u32 = {bc}u;\n"
            ));
            s.push_str(COMMON_WGSL);
            s.push_str(COMMON);
            if matches!(kernel, Kernel::Forward | Kernel::GradQ) {
                s.push_str(KEY_TILES);
            }
            s.push_str(&unroll(body, d4));
            s
        };
        let raw: Vec<_> = buffers.iter().map(|t| t.buffer()).collect();
        device.dispatch(Dispatch {
            op,
            key: &key,
            source: &source,
            buffers: &raw,
            params: &self.words,
            workgroups: [grid[0] as u32, grid[1] as u32, 1],
        })?;
        Ok(())
    }
}

/// `template` with each block between `//@UNROLL` and `//@END` repeated `count` times, `@c` set to `0u`,
/// `1u`, ... and `@i` to `0`, `1`, ... in each copy: the per-thread head rows are separate variables (`acc0`,
/// `acc1`, ...), which drivers keep in registers, where arrays may land in slower local memory.
fn unroll(template: &str, count: usize) -> String {
    let mut out = String::new();
    let mut block: Option<Vec<&str>> = None;
    for line in template.lines() {
        match (line.trim(), &mut block) {
            ("//@UNROLL", None) => block = Some(Vec::new()),
            ("//@END", Some(lines)) => {
                for c in 0..count {
                    for l in lines.iter() {
                        out.push_str(&l.replace("@c", &format!("{c}u")).replace("@i", &c.to_string()));
                        out.push('\n');
                    }
                }
                block = None;
            }
            (_, Some(lines)) => lines.push(line),
            (_, None) => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}
