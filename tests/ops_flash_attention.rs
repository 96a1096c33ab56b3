//! flash_attention (fused causal attention for training, forward and backward) against f64 CPU references and
//! finite differences.

mod common;

use common::attention::*;
use common::*;
use hierarchos::core::ops::flash_attention::flash_attention_fits;
use hierarchos::core::{DType, Tensor, autocast};

/// Gradients of `Σ out · w` (`w` `[B, T, H, D]`) for the queries `[B, H, T, D]`, keys and values `[B, KVH, S, D]`,
/// in f64: with P the visible-key softmax, dv_j = Σ_i P_ij w_i, dS_ij = P_ij (w_i · v_j - Σ_j' P_ij' w_i · v_j'),
/// dq_i = Σ_j dS_ij k_j, dk_j = Σ_i dS_ij q_i.
fn reference_grads(c: Case, q: &[f32], k: &[f32], v: &[f32], w: &[f32]) -> [Vec<f64>; 3] {
    let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    for b in 0..c.b {
        for h in 0..c.h {
            for t in 0..c.t {
                let p = probabilities(c, q, k, (b, h, t));
                let (qi, kj) = rows(c, b, h, t);
                let wi = ((b * c.t + t) * c.h + h) * c.d;
                let dp: Vec<f64> = (0..c.s)
                    .map(|j| (0..c.d).map(|e| w[wi + e] as f64 * v[kj(j) + e] as f64).sum())
                    .collect();
                let mean: f64 = (0..c.s).map(|j| p[j] * dp[j]).sum();
                for j in 0..c.s {
                    let ds = p[j] * (dp[j] - mean);
                    for x in 0..c.d {
                        dv[kj(j) + x] += p[j] * w[wi + x] as f64;
                        dq[qi + x] += ds * k[kj(j) + x] as f64;
                        dk[kj(j) + x] += ds * q[qi + x] as f64;
                    }
                }
            }
        }
    }
    [dq, dk, dv]
}

/// The forward against the f64 reference and, with `backward`, the three gradients of `Σ out · w` too.
fn check(rng: &mut Rng, c: Case, backward: bool) {
    let x = inputs(rng, c);
    let grad = |t: Tensor| if backward { t.requires_grad_() } else { t };
    let (q, k, v) = (grad(x.q), grad(x.k), grad(x.v));
    let out = q.flash_attention(&k, &v, c.q_start, c.k_start, c.window).unwrap();
    assert_eq!(out.shape(), [c.b, c.t, c.h, c.d], "{c:?}");
    assert!(out.is_contiguous(), "{c:?}");
    let want = reference(c, &x.qv, &x.kv, &x.vv);
    assert_close(&format!("{c:?} forward"), &out.to_f32_vec().unwrap(), &want, 1e-5, 2e-6);
    if !backward {
        return;
    }

    let w = rng.vec(out.numel(), -1.0, 1.0);
    let wt = Tensor::from_slice(&w, out.shape(), q.device()).unwrap();
    out.mul(&wt).unwrap().sum_all().unwrap().backward().unwrap();
    let want = reference_grads(c, &x.qv, &x.kv, &x.vv, &w);
    for (name, leaf, want) in [("q", &q, &want[0]), ("k", &k, &want[1]), ("v", &v, &want[2])] {
        let grad = leaf.grad().expect("a gradient");
        assert_eq!(grad.shape(), leaf.shape(), "{c:?} d{name}");
        assert_close(&format!("{c:?} d{name}"), &grad.to_f32_vec().unwrap(), want, 1e-4, 1e-5);
    }
}

/// The kernels' last position (exclusive): positions are u32.
const TOP: usize = u32::MAX as usize;

#[test]
fn flash_attention_matches_reference() {
    let mut rng = Rng::new("flash_attention_matches_reference");
    for c in [
        // One key, one query; a head of one element.
        case((1, 1, 1), (1, 1, 3), (0, 0, None)),
        case((1, 2, 1), (3, 3, 1), (0, 0, None)),
        // Training: queries are the keys, square causal mask, more rows than one workgroup (64) and more keys than
        // one staged tile; grouped heads; odd head sizes.
        case((2, 4, 2), (70, 70, 8), (0, 0, None)),
        case((1, 3, 1), (17, 17, 17), (0, 0, None)),
        case((1, 2, 2), (130, 130, 64), (0, 0, None)),
        // Sliding windows: of 1 (only itself), shorter than a tile, longer than the sequence.
        case((2, 3, 1), (5, 5, 8), (0, 0, Some(1))),
        case((1, 4, 2), (70, 70, 12), (0, 0, Some(9))),
        case((1, 2, 1), (9, 9, 4), (0, 0, Some(100))),
        // A window past the kernels' 32-bit positions: no window.
        case((1, 2, 1), (9, 12, 4), (3, 0, Some(u32::MAX as usize))),
        // The last 32-bit positions, where a key's position plus the window passes 2^32: the key and value
        // gradients' tiles bound their queries through that sum.
        case((1, 2, 1), (3, 7, 8), (TOP - 3, TOP - 7, Some(3))),
        case((1, 2, 1), (1, 7, 8), (TOP - 1, TOP - 7, Some(6))),
        case((1, 1, 1), (2, 2, 4), (TOP - 2, TOP - 2, Some(1 << 20))),
        // Queries after a cached prefix, whose keys start later than position 0.
        case((2, 9, 3), (3, 17, 3), (14, 0, None)),
        case((1, 3, 3), (5, 17, 8), (6, 2, Some(3))),
        case((1, 4, 2), (5, 17, 64), (12, 0, Some(4))),
        // Over a hundred keys before a short window that no query sees (a whole workgroup of keys without queries).
        case((1, 2, 1), (3, 130, 8), (127, 0, Some(2))),
        // A head size filling 2 components of the last quad (17 and 3 fill 1 and 3 of them).
        case((1, 2, 1), (3, 17, 66), (14, 0, None)),
        // Query blocks of the forward (128 rows), numbered heaviest first, the last one partial.
        case((1, 2, 1), (300, 300, 4), (0, 0, None)),
        // Heads of 128: the backward's smallest tiles on lavapipe (32 KiB of workgroup memory), more query and key
        // tiles than one.
        case((1, 2, 1), (20, 20, 128), (0, 0, None)),
    ] {
        check(&mut rng, c, true);
    }
    // The largest head size, forward only: lavapipe takes ~20 s to compile the forward unrolled over 64 quads.
    check(&mut rng, case((1, 2, 2), (4, 4, 256), (0, 0, Some(3))), false);
}

/// Inside `autocast(f16)` with heads of 64, GPUs with f16 cooperative matrices run the tensor-core kernels: the
/// forward and gradients of the inputs rounded to f16 (the output gradient too), within the rounding of the
/// probabilities and score gradients to f16, and every output and gradient an f16 value. Elsewhere the f32
/// kernels run, checked as closely as everywhere else against the reference of the inputs as they are.
#[test]
fn flash_attention_under_autocast() {
    let mut rng = Rng::new("flash_attention_under_autocast");
    let halve = |x: &[f32]| -> Vec<f32> { x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect() };
    // NVIDIA's and lavapipe's cooperative matrices both come with the workgroup memory the kernels take.
    let coop = dev().caps().cooperative_matrix.is_some();
    for c in [
        // Partial tiles of queries and keys; grouped heads with a window; queries after a cached prefix, whose
        // keys start later than position 0; fewer rows than a tile, with tiles of keys no query sees.
        case((2, 4, 2), (130, 130, 64), (0, 0, None)),
        case((1, 4, 2), (100, 100, 64), (0, 0, Some(37))),
        case((1, 2, 2), (70, 150, 64), (83, 3, None)),
        case((1, 3, 3), (5, 200, 64), (195, 0, Some(4))),
    ] {
        let x = inputs(&mut rng, c);
        // What the kernels compute from: the inputs rounded to f16 on tensor cores, as they are otherwise.
        let seen = |v: &[f32]| if coop { halve(v) } else { v.to_vec() };
        let (qv, kv, vv) = (seen(&x.qv), seen(&x.kv), seen(&x.vv));
        let [(rtol, atol), (grad_rtol, grad_atol)] = match coop {
            true => [(2e-3, 1e-3), (4e-3, 2e-3)],
            false => [(1e-5, 2e-6), (1e-4, 1e-5)],
        };
        let (q, k, v) = (x.q.requires_grad_(), x.k.requires_grad_(), x.v.requires_grad_());
        let out = autocast(DType::F16, || q.flash_attention(&k, &v, c.q_start, c.k_start, c.window))
            .unwrap()
            .unwrap();
        let got = out.to_f32_vec().unwrap();
        assert_close(
            &format!("{c:?} forward"),
            &got,
            &reference(c, &qv, &kv, &vv),
            rtol,
            atol,
        );
        let w = halve(&rng.vec(out.numel(), -1.0, 1.0));
        let wt = Tensor::from_slice(&w, out.shape(), q.device()).unwrap();
        out.mul(&wt).unwrap().sum_all().unwrap().backward().unwrap();
        let want = reference_grads(c, &qv, &kv, &vv, &w);
        let mut results = vec![("out", got)];
        for (name, leaf, want) in [("q", &q, &want[0]), ("k", &k, &want[1]), ("v", &v, &want[2])] {
            let grad = leaf.grad().unwrap().to_f32_vec().unwrap();
            let scale = want.iter().fold(0.0f64, |m, w| m.max(w.abs()));
            assert_close(&format!("{c:?} d{name}"), &grad, want, grad_rtol, grad_atol * scale);
            results.push((name, grad));
        }
        for (name, values) in results.iter().filter(|_| coop) {
            let odd = values.iter().position(|&x| half::f16::from_f32(x).to_f32() != x);
            assert!(odd.is_none(), "{c:?} {name}: element {odd:?} is no f16 value");
        }
    }
}

/// Only relative positions matter: the same inputs at the last 32-bit positions (where a key's position plus
/// the window passes 2^32) give the bits they give at small positions, forward and gradients, in f32 and inside
/// `autocast(f16)` (the tensor-core kernels where the device has them).
#[test]
fn positions_at_the_top_give_the_bits_of_small_ones() {
    let mut rng = Rng::new("positions_at_the_top_give_the_bits_of_small_ones");
    let low = case((1, 2, 1), (3, 7, 64), (4, 0, Some(3)));
    let x = inputs(&mut rng, low);
    let w = rng.vec(low.b * low.t * low.h * low.d, -1.0, 1.0);
    let run = |q_start: usize, k_start: usize, half: Option<DType>| {
        let (q, k, v) = (x.q.requires_grad_(), x.k.requires_grad_(), x.v.requires_grad_());
        let attend = || q.flash_attention(&k, &v, q_start, k_start, low.window);
        let out = match half {
            Some(h) => autocast(h, attend).unwrap(),
            None => attend(),
        }
        .unwrap();
        let wt = Tensor::from_slice(&w, out.shape(), q.device()).unwrap();
        out.mul(&wt).unwrap().sum_all().unwrap().backward().unwrap();
        let grads = [&q, &k, &v].map(|t| t.grad().unwrap().to_f32_vec().unwrap());
        (out.to_f32_vec().unwrap(), grads)
    };
    for half in [None, Some(DType::F16)] {
        assert_eq!(run(TOP - 3, TOP - 7, half), run(4, 0, half), "{half:?}");
    }
}

/// Heads of 256 with gradients: exact where the backward's tiles fit the workgroup memory (48 KiB on the H200),
/// otherwise a clear error, which is also why attention layers ask `flash_attention_fits` first (which answers
/// for the forward alone when nothing records gradients).
/// Queries, keys and values cut from `[B, T, H, D]` projections get their gradients as the same views (no copy
/// when the projections' backward reshapes them), with the values of dense `[B, H, T, D]` inputs, bit for bit.
#[test]
fn flash_attention_gradients_keep_the_inputs_layout() {
    let mut rng = Rng::new("flash_attention_gradients_keep_the_inputs_layout");
    let d = dev();
    // The f32 kernels, and under autocast(f16) the tensor-core ones where the GPU has them (heads of 64).
    for (hd, half) in [(8, false), (64, true)] {
        let (b, h, kvh, t) = (2, 4, 2, 19);
        let token_major = |rng: &mut Rng, heads: usize| {
            let data = rng.vec(b * t * heads * hd, -1.0, 1.0);
            Tensor::from_slice(&data, &[b, t, heads, hd], &d)
                .unwrap()
                .permute(&[0, 2, 1, 3])
                .unwrap()
        };
        let (q, k, v) = (
            token_major(&mut rng, h),
            token_major(&mut rng, kvh),
            token_major(&mut rng, kvh),
        );
        let w = Tensor::from_slice(&rng.vec(b * t * h * hd, -1.0, 1.0), &[b, t, h, hd], &d).unwrap();
        let grads = |inputs: [&Tensor; 3]| -> Vec<Tensor> {
            let leaves: Vec<Tensor> = inputs.iter().map(|x| x.detach().requires_grad_()).collect();
            let attend = || leaves[0].flash_attention(&leaves[1], &leaves[2], 0, 0, None);
            let out = match half {
                true => autocast(DType::F16, attend).unwrap(),
                false => attend(),
            };
            out.unwrap().mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
            leaves.iter().map(|x| x.grad().unwrap()).collect()
        };
        let views = grads([&q, &k, &v]);
        let dense: Vec<Tensor> = [&q, &k, &v].iter().map(|x| x.contiguous().unwrap()).collect();
        let dense = grads([&dense[0], &dense[1], &dense[2]]);
        for (name, (x, (got, want))) in ["q", "k", "v"]
            .iter()
            .zip([&q, &k, &v].iter().zip(views.iter().zip(&dense)))
        {
            assert_eq!(
                got.layout().strides,
                x.layout().strides,
                "d{name} keeps the view's layout"
            );
            assert!(want.is_contiguous(), "d{name} of a dense input is dense");
            assert_eq!(got.to_f32_vec().unwrap(), want.to_f32_vec().unwrap(), "d{name} ({hd})");
        }
    }
}

/// Heads whose rows do not start on a quad (cut from wider rows at an odd offset) take the kernels' scalar loads;
/// they give the values, bit for bit, that dense inputs give through vec4 loads.
#[test]
fn flash_attention_unaligned_rows() {
    let mut rng = Rng::new("flash_attention_unaligned_rows");
    let d = dev();
    let (b, h, t, hd) = (1, 2, 21, 8);
    let unaligned = |rng: &mut Rng| {
        let data = rng.vec(b * t * h * (hd + 3), -1.0, 1.0);
        Tensor::from_slice(&data, &[b, t, h, hd + 3], &d)
            .unwrap()
            .narrow(3, 1, hd)
            .unwrap()
            .permute(&[0, 2, 1, 3])
            .unwrap()
    };
    let (q, k, v) = (unaligned(&mut rng), unaligned(&mut rng), unaligned(&mut rng));
    let w = Tensor::from_slice(&rng.vec(b * t * h * hd, -1.0, 1.0), &[b, t, h, hd], &d).unwrap();
    let run = |inputs: [&Tensor; 3]| -> Vec<Vec<f32>> {
        let leaves: Vec<Tensor> = inputs.iter().map(|x| x.detach().requires_grad_()).collect();
        let out = leaves[0].flash_attention(&leaves[1], &leaves[2], 0, 0, None).unwrap();
        out.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
        let mut values = vec![out.to_f32_vec().unwrap()];
        values.extend(leaves.iter().map(|x| x.grad().unwrap().to_f32_vec().unwrap()));
        values
    };
    let dense: Vec<Tensor> = [&q, &k, &v].iter().map(|x| x.contiguous().unwrap()).collect();
    let want = run([&dense[0], &dense[1], &dense[2]]);
    for (name, (got, want)) in ["out", "dq", "dk", "dv"]
        .iter()
        .zip(run([&q, &k, &v]).iter().zip(&want))
    {
        assert_eq!(got, want, "{name}");
    }
}

/// An output gradient that starts part-way into its buffer (the backward of a concatenation hands on such views)
/// reaches the kernels as its own values.
#[test]
fn flash_attention_output_gradient_with_an_offset() {
    let mut rng = Rng::new("flash_attention_output_gradient_with_an_offset");
    let c = case((1, 2, 1), (6, 6, 8), (0, 0, None));
    let x = inputs(&mut rng, c);
    let q = x.q.requires_grad_();
    let out = q.flash_attention(&x.k, &x.v, 0, 0, None).unwrap();
    let before = Tensor::zeros(out.shape(), DType::F32, q.device()).unwrap();
    let both = Tensor::cat(&[before, out.clone()], 0).unwrap();
    let w = rng.vec(both.numel(), -1.0, 1.0);
    let wt = Tensor::from_slice(&w, both.shape(), q.device()).unwrap();
    both.mul(&wt).unwrap().sum_all().unwrap().backward().unwrap();
    let want = reference_grads(c, &x.qv, &x.kv, &x.vv, &w[out.numel()..]);
    assert_close("dq", &q.grad().unwrap().to_f32_vec().unwrap(), &want[0], 1e-4, 1e-5);
}

#[test]
fn flash_attention_largest_heads_backward() {
    let mut rng = Rng::new("flash_attention_largest_heads_backward");
    let c = case((1, 1, 1), (9, 9, 256), (0, 0, None));
    let x = inputs(&mut rng, c);
    assert!(
        flash_attention_fits(&x.q, &x.k, &x.v),
        "the forward's tiles fit everywhere"
    );
    let q = x.q.requires_grad_();
    if flash_attention_fits(&q, &x.k, &x.v) {
        check(&mut rng, c, true);
        return;
    }
    let err = q.flash_attention(&x.k, &x.v, 0, 0, None).unwrap_err().to_string();
    assert!(err.contains("workgroup memory") && err.contains("backward"), "{err}");
    let out = hierarchos::core::no_grad(|| q.flash_attention(&x.k, &x.v, 0, 0, None)).unwrap();
    assert_close(
        "forward without gradients",
        &out.to_f32_vec().unwrap(),
        &reference(c, &x.qv, &x.kv, &x.vv),
        1e-5,
        2e-6,
    );
}

/// Scores far apart: the running max keeps exp finite, in the forward and in the recomputed backward.
#[test]
fn flash_attention_large_scores() {
    let mut rng = Rng::new("flash_attention_large_scores");
    let d = dev();
    let c = case((1, 2, 1), (40, 40, 8), (0, 0, None));
    let q: Vec<f32> = rng.vec(c.h * c.t * c.d, -1.0, 1.0).iter().map(|x| x * 40.0).collect();
    let k = rng.vec(c.s * c.d, -1.0, 1.0);
    let v = rng.vec(c.s * c.d, -1.0, 1.0);
    let t = |x: &[f32], shape: &[usize]| Tensor::from_slice(x, shape, &d).unwrap().requires_grad_();
    let (qt, kt, vt) = (
        t(&q, &[1, c.h, c.t, c.d]),
        t(&k, &[1, 1, c.s, c.d]),
        t(&v, &[1, 1, c.s, c.d]),
    );
    let out = qt.flash_attention(&kt, &vt, 0, 0, None).unwrap();
    let got = out.to_f32_vec().unwrap();
    assert_close("large scores", &got, &reference(c, &q, &k, &v), 1e-4, 1e-5);
    let w = vec![1.0f32; got.len()];
    out.sum_all().unwrap().backward().unwrap();
    let want = reference_grads(c, &q, &k, &v, &w);
    let grad = qt.grad().unwrap().to_f32_vec().unwrap();
    assert!(grad.iter().all(|g| g.is_finite()));
    assert_close("large scores dq", &grad, &want[0], 1e-3, 1e-4);
}

/// Finite differences through the whole op, with grouped heads and a window.
#[test]
fn flash_attention_gradcheck() {
    let mut rng = Rng::new("flash_attention_gradcheck");
    let (b, h, kvh, t, d) = (1, 4, 2, 5, 3);
    let q = rng.vec(b * h * t * d, -1.0, 1.0);
    let k = rng.vec(b * kvh * t * d, -1.0, 1.0);
    let v = rng.vec(b * kvh * t * d, -1.0, 1.0);
    gradcheck(
        "flash_attention",
        &mut rng,
        &[(q, vec![b, h, t, d]), (k, vec![b, kvh, t, d]), (v, vec![b, kvh, t, d])],
        |x| x[0].flash_attention(&x[1], &x[2], 0, 0, Some(3)),
    );
}

/// Devices with subgroups run the forward's row kernel (a group of threads per query row, their partial scores
/// added through subgroup shuffles), others the single-row kernel: both give the reference's output, on a device
/// of each kind, and the profile names the kernel that ran.
#[test]
fn flash_attention_forward_row_and_single_row_kernels() {
    let mut rng = Rng::new("flash_attention_forward_kernels");
    let options = hierarchos::core::GpuOptions {
        profile: true,
        ..hierarchos::core::GpuOptions::from_env()
    };
    for c in [
        // Groups of two threads a row on the H200 and lavapipe (16 quads); grouped heads, several tiles of keys.
        case((2, 4, 2), (70, 70, 64), (0, 0, None)),
        // One thread a row (two quads); a window, so rows see different first keys within a subgroup.
        case((1, 2, 1), (40, 40, 8), (0, 0, Some(5))),
    ] {
        let x = inputs(&mut rng, c);
        let want = reference(c, &x.qv, &x.kv, &x.vv);
        for subgroups in [true, false] {
            let options = hierarchos::core::GpuOptions {
                subgroups,
                ..options.clone()
            };
            let d = pollster::block_on(hierarchos::core::Gpu::open(&options)).unwrap();
            let on = |values: &[f32], shape: &[usize]| Tensor::from_slice(values, shape, &d).unwrap();
            let out = on(&x.qv, &[c.b, c.h, c.t, c.d])
                .flash_attention(
                    &on(&x.kv, &[c.b, c.kvh, c.s, c.d]),
                    &on(&x.vv, &[c.b, c.kvh, c.s, c.d]),
                    c.q_start,
                    c.k_start,
                    c.window,
                )
                .unwrap();
            let name = format!("{c:?}, subgroups {}", d.caps().subgroups);
            assert_close(&name, &out.to_f32_vec().unwrap(), &want, 1e-5, 2e-6);
            let timed = d
                .features()
                .contains(hierarchos::runtime::wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES);
            if timed {
                let ran = d
                    .profile()
                    .iter()
                    .any(|k| k.kernel.starts_with("flash_attention:ForwardRows"));
                assert_eq!(ran, d.caps().subgroups, "{name}: the row kernel ran");
            }
        }
    }
}

/// One launch forward, two backward (queries, then keys and values), whatever the views.
#[test]
fn flash_attention_launches() {
    let d = own_dev();
    let q = Tensor::from_slice(&[0.5f32; 2 * 4 * 8], &[1, 4, 2, 8], &d)
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .requires_grad_();
    let kv = Tensor::from_slice(&[0.25f32; 2 * 4 * 8], &[1, 2, 4, 8], &d)
        .unwrap()
        .requires_grad_();
    let before = d.dispatch_count();
    let out = q.flash_attention(&kv, &kv, 0, 0, None).unwrap();
    assert_eq!(d.dispatch_count() - before, 1);
    assert_eq!(out.to_f32_vec().unwrap(), vec![0.25; 4 * 2 * 8]);
    let loss = out.sum_all().unwrap();
    let before = d.dispatch_count();
    loss.backward().unwrap();
    let launches = d.dispatch_count() - before;
    // The sum's gradient, made dense, the two kernels, and adding the key and value gradients (one tensor).
    assert!(launches <= 5, "{launches} launches");
}

#[test]
fn flash_attention_empty_and_bad_input() {
    let d = dev();
    let z = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &d).unwrap().requires_grad_();
    for (q, kv) in [
        ([0, 2, 3, 4], [0, 1, 3, 4]),
        ([1, 2, 0, 4], [1, 1, 0, 4]),
        ([1, 2, 3, 0], [1, 1, 3, 0]),
    ] {
        let (q, k, v) = (z(&q), z(&kv), z(&kv));
        let out = q.flash_attention(&k, &v, 0, 0, None).unwrap();
        assert_eq!(out.shape(), [q.shape()[0], q.shape()[2], q.shape()[1], q.shape()[3]]);
        out.sum_all().unwrap().backward().unwrap();
        for x in [&q, &k, &v] {
            let g = x.grad().unwrap();
            assert_eq!(g.shape(), x.shape());
            assert!(g.to_f32_vec().unwrap().iter().all(|&e| e == 0.0));
        }
    }
    let err = |q: &[usize], kv: &[usize], start: usize| {
        z(q).flash_attention(&z(kv), &z(kv), start, 0, None)
            .unwrap_err()
            .to_string()
    };
    assert!(err(&[1, 3, 4, 8], &[1, 2, 4, 8], 0).contains("not a multiple"));
    assert!(err(&[1, 2, 4, 8], &[1, 1, 4, 16], 0).contains("flash_attention"));
    assert!(err(&[1, 2, 4, 300], &[1, 1, 4, 300], 0).contains("head size"));
    assert!(err(&[1, 2, 4, 8], &[1, 1, 4, 8], 3).contains("do not all see a key"));
    // Keys past the last 32-bit position, after the queries: refused, not wrapped around to position 0.
    let q = z(&[1, 2, 3, 8]);
    let kv = z(&[1, 1, 9, 8]);
    let err = q
        .flash_attention(&kv, &kv, TOP - 3, TOP - 7, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("32-bit"), "{err}");
}

/// `x` (`[B, heads, rows, D]` row-major values) with each row r's pairs (j, j + D/2) rotated by `cos`, `sin`
/// (`[rows, D/2]`) as `Tensor::rope` does, or with `back` by the adjoint (the sines negated), in f64.
fn rotated(x: &[f64], rows: usize, d: usize, cos: &[f32], sin: &[f32], back: bool) -> Vec<f64> {
    let half = d / 2;
    let sign = if back { -1.0 } else { 1.0 };
    let mut out = vec![0.0; x.len()];
    for (row, (o, x)) in out.chunks_mut(d).zip(x.chunks(d)).enumerate() {
        let r = row % rows;
        for j in 0..half {
            let (c, s) = (cos[r * half + j] as f64, sign * sin[r * half + j] as f64);
            o[j] = x[j] * c - x[j + half] * s;
            o[j + half] = x[j + half] * c + x[j] * s;
        }
    }
    out
}

/// Rotary flash attention (self-attention) against the f64 reference of attention over rotated queries and keys
/// (rotated in f64, rounded to f32 as the kernels hold them), its gradients rotated back. Queries, keys and values
/// come either as views of one `[B, T, (H + 2 KVH) D]` projection (training's: their gradients then come back
/// side by side in one tensor, which reaches the projection without a copy) or as separate views; the tables as
/// four views of one tensor (the models') or as strided views, which the op copies. More keys than queries, and
/// heads whose quads do not pair within a thread, are refused.
#[test]
fn rotary_flash_attention_matches_reference() {
    use hierarchos::core::ops::flash_attention::rotary_flash_attention_fits;
    use hierarchos::core::ops::rope::RopeTables;
    let mut rng = Rng::new("rotary_flash_attention_matches_reference");
    let d = dev();
    for (c, projection) in [
        (case((2, 4, 2), (70, 70, 8), (0, 0, None)), true),
        (case((1, 2, 2), (130, 130, 64), (0, 0, Some(40))), true),
        (case((1, 3, 1), (17, 17, 24), (0, 0, None)), true),
        (case((1, 2, 1), (20, 20, 128), (0, 0, None)), true),
        (case((1, 4, 2), (17, 17, 64), (0, 0, Some(4))), false),
        (case((2, 2, 1), (9, 9, 16), (5, 5, Some(3))), false),
    ] {
        let (width, half) = ((c.h + 2 * c.kvh) * c.d, c.d / 2);
        let y = Tensor::from_slice(&rng.vec(c.b * c.t * width, -1.0, 1.0), &[c.b, c.t, width], &d)
            .unwrap()
            .requires_grad_();
        let separate = inputs(&mut rng, c);
        let (q, k, v) = match projection {
            true => {
                let heads = |from: usize, n: usize| {
                    y.narrow(-1, from * c.d, n * c.d)
                        .unwrap()
                        .reshape(&[c.b, c.t, n, c.d])
                        .unwrap()
                        .permute(&[0, 2, 1, 3])
                        .unwrap()
                };
                (heads(0, c.h), heads(c.h, c.kvh), heads(c.h + c.kvh, c.kvh))
            }
            false => (
                separate.q.requires_grad_(),
                separate.k.requires_grad_(),
                separate.v.requires_grad_(),
            ),
        };
        // Heads of more than 32 keep each row in several threads of a subgroup: without subgroups, no rotary kernels.
        if !rotary_flash_attention_fits(&q, &k, &v) {
            assert!(c.d > 32 && !d.caps().subgroups, "{c:?}");
            continue;
        }
        let values = |x: &Tensor| x.contiguous().unwrap().to_f32_vec().unwrap();
        let (qv, kv, vv) = (values(&q), values(&k), values(&v));
        // Query tables with T rows, key tables with S; the second layout takes every other column of wider ones.
        let tables: Vec<Tensor> = match projection {
            true => {
                let all = rng.vec(2 * (c.t + c.s) * half, -1.0, 1.0);
                let all = Tensor::from_slice(&all, &[2 * (c.t + c.s), half], &d).unwrap();
                [(0, c.t), (c.t, c.t), (2 * c.t, c.s), (2 * c.t + c.s, c.s)]
                    .iter()
                    .map(|&(from, rows)| all.narrow(0, from, rows).unwrap())
                    .collect()
            }
            false => [c.t, c.t, c.s, c.s]
                .iter()
                .map(|&rows| {
                    let wide = rng.vec(rows * half * 2, -1.0, 1.0);
                    let wide = Tensor::from_slice(&wide, &[rows, half, 2], &d).unwrap();
                    wide.narrow(2, 1, 1).unwrap().reshape(&[rows, half]).unwrap()
                })
                .collect(),
        };
        let t: Vec<Vec<f32>> = tables.iter().map(values).collect();
        let rope = RopeTables {
            cos_q: &tables[0],
            sin_q: &tables[1],
            cos_k: &tables[2],
            sin_k: &tables[3],
        };
        let out = q
            .rotary_flash_attention(&k, &v, rope, c.q_start, c.k_start, c.window)
            .unwrap();
        let wide = |x: &[f32]| x.iter().map(|&e| e as f64).collect::<Vec<f64>>();
        let narrow = |x: Vec<f64>| x.iter().map(|&e| e as f32).collect::<Vec<f32>>();
        let qr = narrow(rotated(&wide(&qv), c.t, c.d, &t[0], &t[1], false));
        let kr = narrow(rotated(&wide(&kv), c.s, c.d, &t[2], &t[3], false));
        let want = reference(c, &qr, &kr, &vv);
        assert_close(&format!("{c:?} forward"), &out.to_f32_vec().unwrap(), &want, 1e-5, 2e-6);
        // Without gradients the forward keeps nothing, and gives the same bits.
        let inference =
            hierarchos::core::no_grad(|| q.rotary_flash_attention(&k, &v, rope, c.q_start, c.k_start, c.window));
        assert_eq!(
            inference.unwrap().to_f32_vec().unwrap(),
            out.to_f32_vec().unwrap(),
            "{c:?}"
        );

        let w = rng.vec(out.numel(), -1.0, 1.0);
        let wt = Tensor::from_slice(&w, out.shape(), &d).unwrap();
        out.mul(&wt).unwrap().sum_all().unwrap().backward().unwrap();
        let [dq, dk, dv] = reference_grads(c, &qr, &kr, &vv, &w);
        let dq = rotated(&dq, c.t, c.d, &t[0], &t[1], true);
        let dk = rotated(&dk, c.s, c.d, &t[2], &t[3], true);
        let got: Vec<Vec<f32>> = match projection {
            true => {
                // The projection's gradient, [B, T, (q heads, k heads, v heads), D], cut back into heads.
                let g = y.grad().unwrap().reshape(&[c.b, c.t, c.h + 2 * c.kvh, c.d]).unwrap();
                let part =
                    |from: usize, n: usize| values(&g.narrow(2, from, n).unwrap().permute(&[0, 2, 1, 3]).unwrap());
                vec![part(0, c.h), part(c.h, c.kvh), part(c.h + c.kvh, c.kvh)]
            }
            false => [&q, &k, &v].iter().map(|x| values(&x.grad().unwrap())).collect(),
        };
        for (name, got, want) in [("q", &got[0], &dq), ("k", &got[1], &dk), ("v", &got[2], &dv)] {
            assert_close(&format!("{c:?} d{name}"), got, want, 1e-4, 1e-5);
        }
    }
    // Refused: heads whose quads do not pair within a thread (12: not a multiple of 8), and queries after a
    // prefix of keys.
    let refused = |head: usize, [t, s]: [usize; 2], q_start: usize| -> String {
        let x = |heads: usize, rows: usize| Tensor::zeros(&[1, heads, rows, head], DType::F32, &d).unwrap();
        let (q, kv) = (x(2, t), x(1, s));
        assert!(!rotary_flash_attention_fits(&q, &kv, &kv));
        let table = |rows: usize| Tensor::zeros(&[rows, head / 2], DType::F32, &d).unwrap();
        let (qt, kt) = (table(t), table(s));
        let rope = RopeTables {
            cos_q: &qt,
            sin_q: &qt,
            cos_k: &kt,
            sin_k: &kt,
        };
        q.rotary_flash_attention(&kv, &kv, rope, q_start, 0, None)
            .unwrap_err()
            .to_string()
    };
    let err = refused(12, [4, 4], 0);
    assert!(err.contains("no rotary kernels"), "{err}");
    let err = refused(8, [4, 6], 2);
    assert!(err.contains("self-attention only"), "{err}");
}
