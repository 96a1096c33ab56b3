//! The fused AdamW update against an f64 CPU reference of torch.optim.AdamW's formulas, its clip gate, and the loss
//! scale the device keeps for f16 runs.

mod common;
use common::*;

use hierarchos::core::ops::adamw::{AdamWStep, AdamWUpdate, ClipGate, adamw_update_many};
use hierarchos::core::ops::loss_scale::loss_scale_update;
use hierarchos::core::{DType, Error, Tensor};

/// torch.optim.AdamW's single-tensor update in f64, in place.
fn reference_step(x: &mut [f64], g: &[f64], m: &mut [f64], v: &mut [f64], s: &AdamWStep) {
    let bc1 = 1.0 - s.beta1.powi(s.step as i32);
    let bc2 = 1.0 - s.beta2.powi(s.step as i32);
    for i in 0..x.len() {
        let g = g[i] * s.grad_scale;
        x[i] *= 1.0 - s.lr * s.weight_decay;
        m[i] += (g - m[i]) * (1.0 - s.beta1);
        v[i] = v[i] * s.beta2 + (1.0 - s.beta2) * g * g;
        x[i] -= s.lr / bc1 * m[i] / (v[i].sqrt() / bc2.sqrt() + s.eps);
    }
}

/// The settings of the reference tests at step `step` with gradient factor `grad_scale`.
fn settings(step: u64, grad_scale: f64) -> AdamWStep {
    AdamWStep {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-6,
        weight_decay: 0.1,
        step,
        grad_scale,
    }
}

#[test]
fn adamw_matches_reference_on_odd_sizes_and_views() {
    let d = dev();
    let mut rng = Rng::new("adamw");
    // Lengths and offsets that are multiples of 4 take the kernel's vec4 path (with a contiguous gradient).
    for &(n, at) in &[(1usize, 2usize), (3, 2), (17, 2), (257, 2), (256, 4), (1028, 0)] {
        // The parameter sits inside a larger buffer (as stacked projections do); the gradient is a strided view.
        let whole = rng.vec(n + 5, -1.0, 1.0);
        let holder = Tensor::from_slice(&whole, &[n + 5], &d).unwrap();
        let param = holder.narrow(0, at, n).unwrap();
        let (m, v) = (
            Tensor::zeros(&[n], DType::F32, &d).unwrap(),
            Tensor::zeros(&[n], DType::F32, &d).unwrap(),
        );
        let mut x: Vec<f64> = whole[at..at + n].iter().map(|&a| a as f64).collect();
        let (mut rm, mut rv) = (vec![0.0; n], vec![0.0; n]);
        for step in 1..=3u64 {
            let gv = rng.vec(n, -2.0, 2.0);
            let pairs: Vec<f32> = gv.iter().flat_map(|&a| [a, 7.0]).collect();
            let grad = Tensor::from_slice(&pairs, &[n, 2], &d)
                .unwrap()
                .narrow(1, 0, 1)
                .unwrap()
                .squeeze(1)
                .unwrap();
            assert!(!grad.is_contiguous() || n == 1);
            let s = settings(step, 0.5);
            param.adamw_update(&grad, &m, &v, &s).unwrap();
            let g64: Vec<f64> = gv.iter().map(|&a| a as f64).collect();
            reference_step(&mut x, &g64, &mut rm, &mut rv, &s);
        }
        let what = format!("adamw n={n}");
        assert_close(
            &format!("{what} param"),
            &param.to_vec::<f32>().unwrap(),
            &x,
            1e-6,
            1e-6,
        );
        assert_close(&format!("{what} m"), &m.to_vec::<f32>().unwrap(), &rm, 1e-6, 1e-6);
        assert_close(&format!("{what} v"), &v.to_vec::<f32>().unwrap(), &rv, 1e-6, 1e-7);
        // The rest of the buffer is untouched.
        let all = holder.to_vec::<f32>().unwrap();
        assert_eq!(
            (&all[..at], &all[at + n..]),
            (&whole[..at], &whole[at + n..]),
            "{what}: outside the view"
        );
    }
}

#[test]
fn adamw_empty_and_errors() {
    let d = dev();
    let z = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &d).unwrap();
    let s = AdamWStep {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        step: 1,
        grad_scale: 1.0,
    };
    let e = z(&[0, 3]);
    e.adamw_update(&z(&[0, 3]), &z(&[0, 3]), &z(&[0, 3]), &s).unwrap();
    let (p, g, m, v) = (z(&[4]), z(&[4]), z(&[4]), z(&[4]));
    assert!(matches!(
        p.adamw_update(&z(&[5]), &m, &v, &s),
        Err(Error::ShapeMismatch { .. })
    ));
    let half = Tensor::zeros(&[4], DType::F16, &d).unwrap();
    assert!(matches!(
        p.adamw_update(&g, &half, &v, &s),
        Err(Error::DTypeMismatch { .. })
    ));
    assert!(p.adamw_update(&g, &m, &m, &s).is_err(), "moments sharing a buffer");
    let strided = z(&[4, 2]).narrow(1, 0, 1).unwrap().squeeze(1).unwrap();
    assert!(strided.adamw_update(&g, &m, &v, &s).is_err(), "a strided parameter");
    for bad in [
        AdamWStep { step: 0, ..s },
        AdamWStep { beta1: 1.0, ..s },
        AdamWStep { eps: 0.0, ..s },
        AdamWStep { lr: f64::NAN, ..s },
        AdamWStep {
            weight_decay: -1.0,
            ..s
        },
    ] {
        assert!(p.adamw_update(&g, &m, &v, &bad).is_err(), "{bad:?}");
    }
}

/// Many parameters in as few launches as the bindings allow (more than one launch's worth, vec4 and scalar ones,
/// two views of one buffer and a gradient in that buffer too, which WebGPU lets no launch bind together, an empty
/// one) give the same bits as one update each.
#[test]
fn many_updates_match_one_at_a_time() {
    let d = dev();
    let mut rng = Rng::new("adamw_many");
    let holder_values = rng.vec(40, -1.0, 1.0);
    let mut sizes: Vec<usize> = (0..40).map(|i| [1, 3, 4, 17, 64, 257, 1028][i % 7]).collect();
    assert_eq!(sizes[2], 4);
    sizes.push(0);
    let make = |values: &[f32]| -> (Vec<Tensor>, Tensor) {
        let holder = Tensor::from_slice(&holder_values, &[40], &d).unwrap();
        let mut params: Vec<Tensor> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| Tensor::from_slice(&values[i * 1100..i * 1100 + n], &[n], &d).unwrap())
            .collect();
        params.push(holder.narrow(0, 0, 12).unwrap());
        params.push(holder.narrow(0, 12, 20).unwrap());
        (params, holder)
    };
    let values = rng.vec(sizes.len() * 1100, -1.0, 1.0);
    let grads: Vec<Vec<f32>> = sizes.iter().chain(&[12, 20]).map(|&n| rng.vec(n, -2.0, 2.0)).collect();
    let step = |k: usize| AdamWStep {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-6,
        weight_decay: if k.is_multiple_of(2) { 0.1 } else { 0.0 },
        step: 1 + (k % 3) as u64,
        grad_scale: 0.5,
    };
    let run = |together: bool| -> (Vec<Vec<f32>>, Vec<f32>) {
        let (params, holder) = make(&values);
        let mut g: Vec<Tensor> = grads
            .iter()
            .map(|g| Tensor::from_slice(g, &[g.len()], &d).unwrap())
            .collect();
        // The third parameter's gradient (vec4 updates, like the holder's views): holder elements no update writes.
        g[2] = holder.narrow(0, 32, 4).unwrap();
        let moments: Vec<(Tensor, Tensor)> = params
            .iter()
            .map(|p| {
                let ones = Tensor::ones(p.shape(), DType::F32, &d).unwrap();
                (ones.mul_scalar(0.25).unwrap(), ones.mul_scalar(0.5).unwrap())
            })
            .collect();
        let updates: Vec<AdamWUpdate<'_>> = (0..params.len())
            .map(|k| AdamWUpdate {
                param: &params[k],
                grad: &g[k],
                m: &moments[k].0,
                v: &moments[k].1,
                step: step(k),
            })
            .collect();
        if together {
            adamw_update_many(&updates, None).unwrap();
        } else {
            for u in &updates {
                u.param.adamw_update(u.grad, u.m, u.v, &u.step).unwrap();
            }
        }
        let mut out: Vec<Vec<f32>> = params.iter().map(|p| p.to_vec::<f32>().unwrap()).collect();
        out.extend(
            moments
                .iter()
                .flat_map(|(m, v)| [m.to_vec::<f32>().unwrap(), v.to_vec::<f32>().unwrap()]),
        );
        (out, holder.to_vec::<f32>().unwrap())
    };
    let (one, one_holder) = run(false);
    let (many, many_holder) = run(true);
    assert_eq!(one, many);
    assert_eq!(one_holder, many_holder);
    assert_ne!(one_holder[..32], holder_values[..32], "the views were updated");
    assert_eq!(one_holder[32..], holder_values[32..], "outside the views");
}

/// Clipping read on the device: each gradient scaled by `clip_grad_norm_`'s factor for the gate's norm (unscaled by
/// the host factor, which then scales the gradient too), none for a norm within the limit or a limit of 0; no
/// change at all for a non-finite loss or norm; a malformed gate refused. An inverse loss scale among the
/// statistics unscales as the same host factor does, bit for bit.
#[test]
fn the_clip_gate_scales_gradients_on_the_device_and_skips_non_finite_steps() {
    let d = dev();
    let mut rng = Rng::new("adamw gate");
    let n = 257;
    let (x0, g0) = (rng.vec(n, -1.0, 1.0), rng.vec(n, -2.0, 2.0));
    let (m0, v0) = (rng.vec(n, -0.1, 0.1), rng.vec(n, 0.0, 0.2));
    let s = settings(2, 0.25);
    // (loss, squared norm of the gradients as they are, largest norm) and the factor each gradient takes: the
    // norm is sqrt(64) * 0.25 = 2.
    let clipped = 0.25 / (2.0 + 1e-6);
    let cases = [
        (2.0, 64.0, 1.0, Some(clipped)),
        (2.0, 64.0, 4.0, Some(0.25)),
        (2.0, 64.0, 0.0, Some(0.25)),
        (f32::NAN, 64.0, 1.0, None),
        (f32::INFINITY, 64.0, 1.0, None),
        (2.0, f32::INFINITY, 1.0, None),
        (2.0, f32::NAN, 1.0, None),
    ];
    for (loss, norm_sq, max_norm, factor) in cases {
        let run = |inverse_scale: Option<f32>| {
            let t = |v: &[f32]| Tensor::from_slice(v, &[n], &d).unwrap();
            let (param, grad, m, v) = (t(&x0), t(&g0), t(&m0), t(&v0));
            // A view of the statistics: the NaN before them must not be read.
            let mut held = vec![f32::NAN, loss, norm_sq];
            held.extend(inverse_scale);
            let held = Tensor::from_slice(&held, &[held.len()], &d).unwrap();
            let stats = held.narrow(0, 1, held.shape()[0] - 1).unwrap();
            let gate = ClipGate {
                stats: &stats,
                max_norm,
            };
            let update = AdamWUpdate {
                param: &param,
                grad: &grad,
                m: &m,
                v: &v,
                step: inverse_scale.map_or(s, |_| settings(2, 1.0)),
            };
            adamw_update_many(&[update], Some(&gate)).unwrap();
            [&param, &m, &v].map(|t| t.to_vec::<f32>().unwrap())
        };
        let what = format!("loss {loss}, squared norm {norm_sq}, max norm {max_norm}");
        let got = run(None);
        let scaled = run(Some(s.grad_scale as f32));
        let bits = |v: &[Vec<f32>; 3]| v.clone().map(|t| t.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        assert_eq!(bits(&scaled), bits(&got), "{what}: the device's inverse loss scale");
        let Some(factor) = factor else {
            assert_eq!(got, [x0.clone(), m0.clone(), v0.clone()], "{what}: skipped");
            continue;
        };
        let f64s = |v: &[f32]| v.iter().map(|&a| a as f64).collect::<Vec<f64>>();
        let (mut x, mut rm, mut rv) = (f64s(&x0), f64s(&m0), f64s(&v0));
        let reference = AdamWStep {
            grad_scale: factor,
            ..s
        };
        reference_step(&mut x, &f64s(&g0), &mut rm, &mut rv, &reference);
        assert_close(&format!("{what} param"), &got[0], &x, 1e-6, 1e-6);
        assert_close(&format!("{what} m"), &got[1], &rm, 1e-6, 1e-7);
        assert_close(&format!("{what} v"), &got[2], &rv, 1e-6, 1e-8);
    }
    let (p, g, m, v) = (
        Tensor::zeros(&[4], DType::F32, &d).unwrap(),
        Tensor::zeros(&[4], DType::F32, &d).unwrap(),
        Tensor::zeros(&[4], DType::F32, &d).unwrap(),
        Tensor::zeros(&[4], DType::F32, &d).unwrap(),
    );
    let update = AdamWUpdate {
        param: &p,
        grad: &g,
        m: &m,
        v: &v,
        step: s,
    };
    let four = Tensor::zeros(&[4], DType::F32, &d).unwrap();
    let two = Tensor::zeros(&[2], DType::F32, &d).unwrap();
    // Statistics in a buffer the update writes are refused too.
    let in_param = p.narrow(0, 0, 2).unwrap();
    for (stats, max_norm) in [(&four, 1.0), (&two, f64::NAN), (&two, -1.0), (&in_param, 1.0)] {
        let gate = ClipGate { stats, max_norm };
        assert!(
            matches!(adamw_update_many(&[update], Some(&gate)), Err(Error::Invalid { .. })),
            "{:?} {max_norm}",
            stats.shape()
        );
    }
}

/// Dynamic loss scaling's bookkeeping on the device follows `GradScaler`: a finite norm counts a good step and the
/// growth interval's one in a row doubles the scale; a non-finite norm halves it and restarts the count; a
/// non-finite loss changes nothing. The inverse beside the scale stays exact; the state and the statistics are
/// read through views; malformed inputs are refused.
#[test]
fn the_loss_scale_halves_on_overflow_and_doubles_after_a_run_of_good_steps() {
    let d = dev();
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    let held = Tensor::from_slice(&[nan, 1024.0, 1.0 / 1024.0, 0.0], &[4], &d).unwrap();
    let state = held.narrow(0, 1, 3).unwrap();
    // (loss, squared norm) of each step, and (scale, good steps) after it, with a growth interval of 3.
    let steps = [
        ((2.0, 5.0), (1024.0, 1.0)),
        ((2.0, 5.0), (1024.0, 2.0)),
        ((2.0, 5.0), (2048.0, 0.0)),
        ((2.0, inf), (1024.0, 0.0)),
        ((2.0, 5.0), (1024.0, 1.0)),
        ((2.0, nan), (512.0, 0.0)),
        ((nan, 5.0), (512.0, 0.0)),
        ((inf, inf), (512.0, 0.0)),
        ((2.0, 5.0), (512.0, 1.0)),
    ];
    for (i, ((loss, norm_sq), (scale, good))) in steps.into_iter().enumerate() {
        let stats = Tensor::from_slice(&[nan, loss, norm_sq, 0.5], &[4], &d).unwrap();
        loss_scale_update(&state, &stats.narrow(0, 1, 3).unwrap(), 3).unwrap();
        let got = held.to_vec::<f32>().unwrap();
        assert!(got[0].is_nan(), "step {i}: the element before the view");
        assert_eq!(got[1..], [scale, 1.0 / scale, good], "step {i}");
    }
    // The scale stays within 2^-126..2^126, where its inverse is a normal f32 too (doubled, 2^127 would have a
    // subnormal inverse, which a GPU may flush to 0; 2^128 is infinite): the count restarts all the same.
    for (scale, norm_sq, good) in [(2f32.powi(126), 4.0, 2.0), (2f32.powi(-126), inf, 1.0)] {
        let at_edge = Tensor::from_slice(&[scale, 1.0 / scale, good], &[3], &d).unwrap();
        loss_scale_update(&at_edge, &Tensor::from_slice(&[1.0f32, norm_sq], &[2], &d).unwrap(), 3).unwrap();
        assert_eq!(
            at_edge.to_vec::<f32>().unwrap(),
            [scale, 1.0 / scale, 0.0],
            "scale {scale}"
        );
    }
    let stats = Tensor::zeros(&[2], DType::F32, &d).unwrap();
    let malformed = [
        (
            Tensor::zeros(&[2], DType::F32, &d).unwrap(),
            stats.clone(),
            3,
            "short state",
        ),
        (
            Tensor::zeros(&[3], DType::F16, &d).unwrap(),
            stats.clone(),
            3,
            "f16 state",
        ),
        (
            state.clone(),
            Tensor::zeros(&[1], DType::F32, &d).unwrap(),
            3,
            "short statistics",
        ),
        (state.clone(), stats.clone(), 0, "no growth interval"),
        (state.clone(), held.narrow(0, 0, 2).unwrap(), 3, "one buffer"),
    ];
    for (state, stats, interval, what) in malformed {
        let got = loss_scale_update(&state, &stats, interval);
        assert!(matches!(got, Err(Error::Invalid { .. })), "{what}: {got:?}");
    }
}
