//! cached_attention (fused decode attention over a key/value cache) against an f64 CPU reference.

mod common;

use common::attention::*;
use common::*;
use hierarchos::core::{DType, Error, Tensor, no_grad};

fn check(rng: &mut Rng, c: Case) {
    let x = inputs(rng, c);
    assert!(x.k.layout().offset > 0, "{c:?}: k should be a view into the cache");
    let got =
        x.q.cached_attention(&x.k, &x.v, c.q_start, c.k_start, c.window)
            .unwrap();
    assert_eq!(got.shape(), [c.b, c.t, c.h, c.d], "{c:?}");
    assert!(got.is_contiguous(), "{c:?}");
    let want = reference(c, &x.qv, &x.kv, &x.vv);
    assert_close(&format!("{c:?}"), &got.to_f32_vec().unwrap(), &want, 1e-5, 2e-6);
}

#[test]
fn cached_attention_matches_reference() {
    let mut rng = Rng::new("cached_attention_matches_reference");
    for c in [
        // One key, one query.
        case((1, 1, 1), (1, 1, 3), (0, 0, None)),
        case((1, 1, 1), (1, 1, 1), (5, 5, Some(1))),
        // Decode: the last positions of the cache.
        case((2, 3, 1), (3, 17, 8), (14, 0, None)),
        case((1, 4, 2), (5, 17, 64), (12, 0, Some(4))),
        case((2, 9, 3), (1, 17, 3), (20, 4, Some(6))),
        case((2, 4, 2), (1, 17, 8), (20, 4, Some(100))),
        // A window past the kernel's 32-bit positions: no window.
        case((1, 2, 1), (2, 17, 8), (19, 4, Some(u32::MAX as usize))),
        // Prefill: the queries are the keys (square causal mask), with and without a window of 1 (only itself).
        case((1, 4, 2), (17, 17, 8), (0, 0, None)),
        case((2, 3, 1), (5, 5, 8), (9, 9, Some(1))),
        case((1, 3, 3), (5, 17, 8), (6, 2, Some(3))),
        // Head sizes filling 2, 3 and all 4 of each thread's output components.
        case((1, 2, 1), (3, 17, 130), (14, 0, None)),
        case((1, 2, 2), (1, 17, 256), (16, 0, Some(9))),
        // More keys than one chunk (1024): the online softmax across chunks, and a window starting past the
        // first chunk's start.
        case((1, 4, 2), (3, 1100, 8), (1097, 0, None)),
        case((1, 3, 1), (3, 1100, 64), (1105, 8, Some(1050))),
        case((2, 1, 1), (1, 1100, 3), (1099, 0, Some(70))),
    ] {
        check(&mut rng, c);
    }
}

/// Scores far apart: the max subtraction keeps exp finite, and far-below-max keys underflow to weight 0.
#[test]
fn cached_attention_large_scores() {
    let mut rng = Rng::new("cached_attention_large_scores");
    let d = dev();
    let c = case((1, 2, 1), (3, 1100, 8), (1097, 0, None));
    let q: Vec<f32> = rng.vec(c.h * c.t * c.d, -1.0, 1.0).iter().map(|x| x * 40.0).collect();
    let k = rng.vec(c.s * c.d, -1.0, 1.0);
    let v = rng.vec(c.s * c.d, -1.0, 1.0);
    let t = |x: &[f32], shape: &[usize]| Tensor::from_slice(x, shape, &d).unwrap();
    let got = t(&q, &[1, c.h, c.t, c.d])
        .cached_attention(
            &t(&k, &[1, 1, c.s, c.d]),
            &t(&v, &[1, 1, c.s, c.d]),
            c.q_start,
            c.k_start,
            None,
        )
        .unwrap();
    let out = got.to_f32_vec().unwrap();
    assert!(out.iter().all(|x| x.is_finite()), "{out:?}");
    assert_close("large scores", &out, &reference(c, &q, &k, &v), 1e-4, 1e-5);
}

/// The whole step is one kernel launch, whatever the views (counted on a private device, so that tests running
/// in parallel do not interfere).
#[test]
fn cached_attention_is_one_launch() {
    let d = own_dev();
    let q = Tensor::from_slice(&[0.5f32; 2 * 4 * 8], &[1, 2, 4, 8], &d)
        .unwrap()
        .transpose(1, 2)
        .unwrap();
    let cache = Tensor::from_slice(&[0.25f32; 2 * 20 * 8], &[1, 2, 20, 8], &d).unwrap();
    let kv = cache.narrow(2, 0, 9).unwrap();
    let before = d.dispatch_count();
    let out = q.cached_attention(&kv, &kv, 5, 0, None).unwrap();
    assert_eq!(d.dispatch_count() - before, 1);
    assert_eq!(out.to_f32_vec().unwrap(), vec![0.25; 4 * 2 * 8]);
}

#[test]
fn cached_attention_empty() {
    let d = dev();
    let z = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &d).unwrap();
    for (q, kv, q_start, k_start, want) in [
        // No queries: no key needed, even with none at all.
        (vec![2, 3, 0, 8], vec![2, 3, 0, 8], 0, 0, vec![2, 0, 3, 8]),
        (vec![2, 3, 0, 8], vec![2, 1, 5, 8], 9, 0, vec![2, 0, 3, 8]),
        (vec![0, 2, 3, 8], vec![0, 1, 5, 8], 2, 0, vec![0, 3, 2, 8]),
        (vec![1, 0, 3, 8], vec![1, 2, 5, 8], 2, 0, vec![1, 3, 0, 8]),
        (vec![1, 0, 3, 8], vec![1, 0, 5, 8], 2, 0, vec![1, 3, 0, 8]),
        (vec![1, 2, 3, 0], vec![1, 1, 5, 0], 2, 0, vec![1, 3, 2, 0]),
    ] {
        let out = z(&q)
            .cached_attention(&z(&kv), &z(&kv), q_start, k_start, None)
            .unwrap();
        assert_eq!(out.shape(), want, "{q:?} {kv:?}");
        assert!(out.to_f32_vec().unwrap().is_empty());
    }
}

#[test]
fn cached_attention_errors() {
    let d = dev();
    let z = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &d).unwrap();
    let attend = |q: &[usize], k: &[usize], v: &[usize], q_start, k_start, window| {
        z(q).cached_attention(&z(k), &z(v), q_start, k_start, window)
            .unwrap_err()
    };
    let named = |e: Error| {
        assert!(e.to_string().contains("cached_attention"), "{e}");
        e
    };
    let (q, kv) = ([1, 4, 1, 8], [1, 2, 6, 8]);
    // Ranks and shapes.
    assert!(matches!(
        named(attend(&[4, 1, 8], &kv, &kv, 5, 0, None)),
        Error::RankMismatch { .. }
    ));
    assert!(matches!(
        named(attend(&q, &[2, 6, 8], &[2, 6, 8], 5, 0, None)),
        Error::RankMismatch { .. }
    ));
    assert!(matches!(
        named(attend(&q, &kv, &[1, 2, 7, 8], 5, 0, None)),
        Error::ShapeMismatch { .. }
    ));
    assert!(matches!(
        named(attend(&q, &[2, 2, 6, 8], &[2, 2, 6, 8], 5, 0, None)),
        Error::ShapeMismatch { .. }
    ));
    assert!(matches!(
        named(attend(&q, &[1, 2, 6, 4], &[1, 2, 6, 4], 5, 0, None)),
        Error::ShapeMismatch { .. }
    ));
    // Head ratio.
    assert!(matches!(
        named(attend(&[1, 3, 1, 8], &kv, &kv, 5, 0, None)),
        Error::Invalid { .. }
    ));
    assert!(matches!(
        named(attend(&[1, 2, 1, 8], &[1, 4, 6, 8], &[1, 4, 6, 8], 5, 0, None)),
        Error::Invalid { .. }
    ));
    assert!(matches!(
        named(attend(&q, &[1, 0, 6, 8], &[1, 0, 6, 8], 5, 0, None)),
        Error::Invalid { .. }
    ));
    // Head size.
    assert!(matches!(
        named(attend(&[1, 2, 1, 257], &[1, 2, 6, 257], &[1, 2, 6, 257], 5, 0, None)),
        Error::Invalid { .. }
    ));
    // Visibility: a key after the query's start, a query past the last key, a window of 0, no keys.
    assert!(matches!(named(attend(&q, &kv, &kv, 5, 6, None)), Error::Invalid { .. }));
    assert!(matches!(named(attend(&q, &kv, &kv, 6, 0, None)), Error::Invalid { .. }));
    assert!(matches!(
        named(attend(&[1, 4, 3, 8], &kv, &kv, 4, 0, None)),
        Error::Invalid { .. }
    ));
    assert!(matches!(
        named(attend(&q, &kv, &kv, 5, 0, Some(0))),
        Error::Invalid { .. }
    ));
    assert!(matches!(
        named(attend(&q, &[1, 2, 0, 8], &[1, 2, 0, 8], 0, 0, None)),
        Error::Invalid { .. }
    ));
    let top = u32::MAX as usize;
    assert!(matches!(
        named(attend(&q, &kv, &kv, top, top - 2, None)),
        Error::Invalid { .. }
    ));
    // The boundaries of the same checks pass.
    z(&q).cached_attention(&z(&kv), &z(&kv), 5, 0, Some(1)).unwrap();
    z(&[1, 4, 6, 8]).cached_attention(&z(&kv), &z(&kv), 3, 3, None).unwrap();
    // Dtype of each input.
    let h = |shape: &[usize]| z(shape).to_dtype(DType::F16).unwrap();
    for (a, b, c) in [
        (h(&q), z(&kv), z(&kv)),
        (z(&q), h(&kv), z(&kv)),
        (z(&q), z(&kv), h(&kv)),
    ] {
        let e = named(a.cached_attention(&b, &c, 5, 0, None).unwrap_err());
        assert!(matches!(e, Error::DTypeMismatch { got: DType::F16, .. }), "{e}");
    }
}

/// Inputs requiring grad are refused while grad is on (the kernel has no backward) and accepted under no_grad.
#[test]
fn cached_attention_refuses_grad() {
    let d = dev();
    let z = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &d).unwrap();
    let (q, kv) = (z(&[1, 2, 1, 4]), z(&[1, 1, 3, 4]));
    for which in 0..3 {
        let mut ts = [q.clone(), kv.clone(), kv.clone()];
        ts[which] = ts[which].requires_grad_();
        let e = ts[0].cached_attention(&ts[1], &ts[2], 2, 0, None).unwrap_err();
        assert!(
            matches!(&e, Error::Invalid { op: "cached_attention", message } if message.contains("inference")),
            "{e}"
        );
        let out = no_grad(|| ts[0].cached_attention(&ts[1], &ts[2], 2, 0, None)).unwrap();
        assert!(!out.requires_grad());
        assert_eq!(out.to_f32_vec().unwrap(), vec![0.0; 8]);
    }
}

#[test]
fn attention_step_equals_rope_into_cache_then_cached_attention() {
    use hierarchos::core::ops::attention::NewKeys;
    use hierarchos::core::ops::rope::RopeTables;
    let mut rng = Rng::new("attention_step");
    let dev = dev();
    for &(b, t, h, kvh, d, position, len, window, shared) in &[
        (1, 1, 9, 3, 64, 5, 8, None, true),
        (2, 2, 4, 2, 6, 1, 5, Some(2), false),
        (1, 2, 2, 1, 130, 0, 6, None, true),
        (1, 2, 4, 4, 8, 3, 9, Some(3), false),
        (1, 1, 3, 1, 16, 0, 1, None, true),
    ] {
        let width = (h + 2 * kvh) * d;
        let qkv = Tensor::from_slice(&rng.vec(b * t * width, -1.0, 1.0), &[b, t, width], &dev).unwrap();
        let part = |start: usize, heads: usize| {
            qkv.narrow(2, start * d, heads * d)
                .unwrap()
                .reshape(&[b, t, heads, d])
                .unwrap()
        };
        let (q, k, v) = (part(0, h), part(h, kvh), part(h + kvh, kvh));
        let half = d / 2;
        let all = Tensor::from_slice(&rng.vec(4 * t * half, -1.0, 1.0), &[4, t, half], &dev).unwrap();
        let own: Vec<Tensor> = (0..4)
            .map(|i| {
                Tensor::from_slice(&all.narrow(0, i, 1).unwrap().to_vec::<f32>().unwrap(), &[t, half], &dev).unwrap()
            })
            .collect();
        let tab = |i: usize| {
            if shared {
                all.narrow(0, i, 1).unwrap().squeeze(0).unwrap()
            } else {
                own[i].clone()
            }
        };
        let tabs: Vec<Tensor> = (0..4).map(tab).collect();
        let tables = RopeTables {
            cos_q: &tabs[0],
            sin_q: &tabs[1],
            cos_k: &tabs[2],
            sin_k: &tabs[3],
        };
        let history = rng.vec(b * kvh * len * d, -1.0, 1.0);
        let cache = || Tensor::from_slice(&history, &[b, kvh, len, d], &dev).unwrap();
        let (kc, vc, kc2, vc2) = (cache(), cache(), cache(), cache());

        let got = no_grad(|| q.attention_step(NewKeys { k: &k, v: &v, tables }, &kc, &vc, position, window)).unwrap();
        let region = |c: &Tensor| c.narrow(2, position, t).unwrap();
        let want = no_grad(|| {
            let q_rot = q.rope_into_cache(&k, &v, tables, &region(&kc2), &region(&vc2))?;
            let keys = kc2.narrow(2, 0, position + t)?;
            let values = vc2.narrow(2, 0, position + t)?;
            q_rot.cached_attention(&keys, &values, position, 0, window)
        })
        .unwrap();
        // The same arithmetic, but a GPU may contract a multiply-add differently in the two kernels: a rotated
        // element moves by an ulp, a score (a sum of D <= 130 products of values below 1) by up to D ulps of 1,
        // about 8e-6 at worst, and an output (a weighted mean of values below 1) by as much. A wrong rotation,
        // position or cache row moves them by O(1).
        let near = |what: &str, got: &Tensor, want: &Tensor| {
            let want: Vec<f64> = want.to_vec::<f32>().unwrap().iter().map(|&v| v as f64).collect();
            assert_close(what, &got.to_vec::<f32>().unwrap(), &want, 1e-6, 1e-5);
        };
        let case = format!("b{b} t{t} h{h} kvh{kvh} d{d} at {position} window {window:?} shared {shared}");
        assert_eq!(got.shape(), [b, t, h, d], "{case}");
        near(&format!("{case}: output"), &got, &want);
        near(&format!("{case}: key cache"), &kc, &kc2);
        near(&format!("{case}: value cache"), &vc, &vc2);
    }
    // Errors: the step past the cache, caches sharing a buffer, tables of the wrong length, too many queries.
    let z = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &dev).unwrap();
    let (q, k) = (z(&[1, 2, 2, 4]), z(&[1, 2, 1, 4]));
    let tab = z(&[2, 2]);
    let tables = same_tables(&tab);
    let new = NewKeys { k: &k, v: &k, tables };
    let (kc, vc) = (z(&[1, 1, 4, 4]), z(&[1, 1, 4, 4]));
    assert!(no_grad(|| q.attention_step(new, &kc, &vc, 2, None)).is_ok());
    assert!(
        no_grad(|| q.attention_step(new, &kc, &vc, 3, None)).is_err(),
        "past the cache"
    );
    assert!(
        no_grad(|| q.attention_step(new, &kc, &kc, 0, None)).is_err(),
        "one buffer for both caches"
    );
    let short = z(&[1, 2]);
    let tables = same_tables(&short);
    assert!(no_grad(|| q.attention_step(NewKeys { k: &k, v: &k, tables }, &kc, &vc, 0, None)).is_err());
    let (q3, k3, tab3) = (z(&[1, 3, 2, 4]), z(&[1, 3, 1, 4]), z(&[3, 2]));
    let tables = same_tables(&tab3);
    let new = NewKeys { k: &k3, v: &k3, tables };
    assert!(
        no_grad(|| q3.attention_step(new, &kc, &vc, 0, None)).is_err(),
        "more queries than a step takes"
    );
}
