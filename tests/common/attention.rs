//! Attention problems with strided inputs and their f64 CPU reference, shared by the fused attention tests.

use hierarchos::core::Tensor;

use super::{Rng, dev, strided_indices};

/// One attention problem: batch, query heads, key/value heads, queries, keys, head size, positions, window.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub b: usize,
    pub h: usize,
    pub kvh: usize,
    pub t: usize,
    pub s: usize,
    pub d: usize,
    pub q_start: usize,
    pub k_start: usize,
    pub window: Option<usize>,
}

/// Inputs as the kernel sees them: `q` a permuted view of `[B, T, H, D]` data, `k` and `v` narrow views of
/// `[B, KVH, S + 7, D]` caches starting at key 3, with the logical (row-major) values of each view.
pub struct Inputs {
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    pub qv: Vec<f32>,
    pub kv: Vec<f32>,
    pub vv: Vec<f32>,
}

/// The elements of view `t` of a tensor whose buffer holds `base`, in row-major order.
pub fn logical(t: &Tensor, base: &[f32]) -> Vec<f32> {
    let l = t.layout();
    strided_indices(&l.shape, &l.strides, l.offset)
        .into_iter()
        .map(|o| base[o])
        .collect()
}

pub fn inputs(rng: &mut Rng, c: Case) -> Inputs {
    let d = dev();
    let qdata = rng.vec(c.b * c.t * c.h * c.d, -1.0, 1.0);
    let q = Tensor::from_slice(&qdata, &[c.b, c.t, c.h, c.d], &d)
        .unwrap()
        .permute(&[0, 2, 1, 3])
        .unwrap();
    let len = c.s + 7;
    let cache = |rng: &mut Rng| {
        let data = rng.vec(c.b * c.kvh * len * c.d, -1.0, 1.0);
        let full = Tensor::from_slice(&data, &[c.b, c.kvh, len, c.d], &d).unwrap();
        let view = full.narrow(2, 3, c.s).unwrap();
        let vals = logical(&view, &data);
        (view, vals)
    };
    let (k, kv) = cache(rng);
    let (v, vv) = cache(rng);
    let qv = logical(&q, &qdata);
    Inputs { q, k, v, qv, kv, vv }
}

/// Row-major offsets into `[B, H, T, D]` queries and `[B, KVH, S, D]` keys/values of query row (b, h, t) and of
/// key row j of the key/value head that query head reads.
pub fn rows(c: Case, b: usize, h: usize, t: usize) -> (usize, impl Fn(usize) -> usize) {
    let kh = h / (c.h / c.kvh);
    (((b * c.h + h) * c.t + t) * c.d, move |j| {
        ((b * c.kvh + kh) * c.s + j) * c.d
    })
}

/// softmax_j(q·k_j) of query row (b, h, t) over all S keys (zero where a key is hidden), in f64.
pub fn probabilities(c: Case, q: &[f32], k: &[f32], (b, h, t): (usize, usize, usize)) -> Vec<f64> {
    let (qi, kj) = rows(c, b, h, t);
    let qpos = c.q_start + t;
    let scores: Vec<f64> = (0..c.s)
        .map(|j| {
            let kpos = c.k_start + j;
            if kpos <= qpos && c.window.is_none_or(|w| kpos + w > qpos) {
                (0..c.d).map(|e| q[qi + e] as f64 * k[kj(j) + e] as f64).sum()
            } else {
                f64::NEG_INFINITY
            }
        })
        .collect();
    let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = scores.iter().map(|&s| (s - m).exp()).collect();
    let total: f64 = w.iter().sum();
    w.iter().map(|x| x / total).collect()
}

/// out[b, t, h, :] = Σ_j softmax_j(q·k_j) v_j over the visible keys, in f64, as a `[B, T, H, D]` array.
pub fn reference(c: Case, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f64> {
    let mut out = vec![0.0; c.b * c.t * c.h * c.d];
    for b in 0..c.b {
        for h in 0..c.h {
            for t in 0..c.t {
                let p = probabilities(c, q, k, (b, h, t));
                let (_, kj) = rows(c, b, h, t);
                for e in 0..c.d {
                    out[((b * c.t + t) * c.h + h) * c.d + e] = (0..c.s).map(|j| p[j] * v[kj(j) + e] as f64).sum();
                }
            }
        }
    }
    out
}

pub fn case(
    (b, h, kvh): (usize, usize, usize),
    (t, s, d): (usize, usize, usize),
    (q_start, k_start, window): (usize, usize, Option<usize>),
) -> Case {
    Case {
        b,
        h,
        kvh,
        t,
        s,
        d,
        q_start,
        k_start,
        window,
    }
}
