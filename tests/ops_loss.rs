//! Cross-entropy against an f64 CPU reference: forward, backward (analytic reference and gradcheck), ignored and
//! out-of-range targets, strided and 16-bit logits, leading dimensions and bad arguments.

mod common;

use common::*;
use hierarchos::core::{DType, Tensor};

/// Mean loss and gradient of the logits (for an upstream gradient of 1), in f64; targets < 0 other than
/// `ignore` are invalid.
fn reference(logits: &[f32], targets: &[i64], c: usize, ignore: Option<i64>) -> (f64, Vec<f64>) {
    let valid: Vec<bool> = targets.iter().map(|&t| Some(t) != ignore).collect();
    let n_valid = valid.iter().filter(|&&v| v).count() as f64;
    let mut loss = 0.0;
    let mut grad = vec![0.0; logits.len()];
    for (r, &t) in targets.iter().enumerate() {
        if !valid[r] {
            continue;
        }
        let row: Vec<f64> = logits[r * c..(r + 1) * c].iter().map(|&v| v as f64).collect();
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        loss += lse - row[t as usize];
        for j in 0..c {
            grad[r * c + j] = ((row[j] - lse).exp() - if j == t as usize { 1.0 } else { 0.0 }) / n_valid;
        }
    }
    (loss / n_valid, grad)
}

/// Logits of `shape` whose last dimension is strided: stored transposed (last two dimensions swapped).
fn transposed(values: &[f32], shape: &[usize]) -> Tensor {
    let r = shape.len();
    let mut tshape = shape.to_vec();
    tshape.swap(r - 2, r - 1);
    let mut strides = vec![1; r];
    for k in (0..r - 1).rev() {
        strides[k] = strides[k + 1] * tshape[k + 1];
    }
    strides.swap(r - 2, r - 1);
    let mut host = vec![0.0f32; values.len()];
    for (i, &o) in strided_indices(shape, &strides, 0).iter().enumerate() {
        host[o] = values[i];
    }
    Tensor::from_slice(&host, &tshape, &dev())
        .unwrap()
        .transpose(r as isize - 2, r as isize - 1)
        .unwrap()
}

fn check(rng: &mut Rng, lead: &[usize], c: usize, dtype: DType, target_dtype: DType, strided: bool) {
    let d = dev();
    let rows: usize = lead.iter().product();
    let mut shape = lead.to_vec();
    shape.push(c);
    let logits = rng.vec(rows * c, -4.0, 4.0);
    let logits = Tensor::from_slice(&logits, &[logits.len()], &d)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
        .to_f32_vec()
        .unwrap();
    let targets: Vec<i64> = (0..rows)
        .map(|r| if r % 3 == 1 { -100 } else { rng.below(c) as i64 })
        .collect();
    let lt = if strided {
        transposed(&logits, &shape)
    } else {
        Tensor::from_slice(&logits, &shape, &d).unwrap()
    };
    let lt = lt.to_dtype(dtype).unwrap().requires_grad_();
    let tt = match target_dtype {
        DType::I32 => Tensor::from_slice(&targets.iter().map(|&t| t as i32).collect::<Vec<_>>(), lead, &d),
        _ => Tensor::from_slice(&targets.iter().map(|&t| t as u32).collect::<Vec<_>>(), lead, &d),
    }
    .unwrap();
    // u32 targets cannot hold -100: they are ignored through the equal u32 value instead.
    let ignore = if target_dtype == DType::I32 {
        -100
    } else {
        -100i32 as u32 as i64
    };
    let loss = lt.cross_entropy_with(&tt, Some(ignore)).unwrap();
    assert_eq!(loss.shape(), &[] as &[usize]);
    assert_eq!(loss.dtype(), dtype);
    let (want, want_grad) = reference(&logits, &targets, c, Some(-100));
    let what = format!("cross_entropy {lead:?}x{c} {dtype} {target_dtype} strided={strided}");
    let (rtol, atol) = if dtype == DType::F32 {
        (1e-5, 1e-5)
    } else {
        (1e-2, 1e-2)
    };
    assert_close(&format!("{what}: loss"), &[loss.item().unwrap()], &[want], rtol, atol);
    loss.backward().unwrap();
    let (rtol, atol) = if dtype == DType::F32 {
        (1e-4, 1e-6)
    } else {
        (2e-2, 2e-3)
    };
    assert_close(
        &format!("{what}: grad"),
        &lt.grad().unwrap().to_f32_vec().unwrap(),
        &want_grad,
        rtol,
        atol,
    );
}

#[test]
fn cross_entropy_matches_reference() {
    let mut rng = Rng::new("cross_entropy_matches_reference");
    for c in [1, 3, 17, 257, 1100] {
        check(&mut rng, &[5], c, DType::F32, DType::I32, false);
    }
    check(&mut rng, &[2, 3], 17, DType::F32, DType::I32, false);
    check(&mut rng, &[7], 33, DType::F32, DType::U32, false);
}

/// Rows of large logits (a shift of the whole row, which changes nothing mathematically) keep the accuracy of
/// small ones, as torch's (x - max) - log Σ does: a loss formed from max + log Σ in f32 loses the low bits of
/// the logits (5e-4 relative at 2e4).
#[test]
fn cross_entropy_of_large_logits() {
    let d = dev();
    for shift in [1000.0f32, -3000.0, 20000.0] {
        let logits: Vec<f32> = [0.0f32, -1.0, -2.0, -4.0, 0.5, 0.25, -0.75, 0.0]
            .iter()
            .map(|v| v + shift)
            .collect();
        let lt = Tensor::from_slice(&logits, &[2, 4], &d).unwrap().requires_grad_();
        let targets = [0i64, 2];
        let tt = Tensor::from_slice(&[0i32, 2], &[2], &d).unwrap();
        let loss = lt.cross_entropy(&tt).unwrap();
        let (want, want_grad) = reference(&logits, &targets, 4, None);
        assert_close(
            &format!("shift {shift}: loss"),
            &[loss.item().unwrap()],
            &[want],
            1e-6,
            1e-7,
        );
        loss.backward().unwrap();
        let grad = lt.grad().unwrap().to_f32_vec().unwrap();
        assert_close(&format!("shift {shift}: grad"), &grad, &want_grad, 1e-6, 1e-7);
    }
}

#[test]
fn cross_entropy_reads_strided_logits() {
    let mut rng = Rng::new("cross_entropy_reads_strided_logits");
    check(&mut rng, &[6], 17, DType::F32, DType::I32, true);
    check(&mut rng, &[2, 4], 300, DType::F32, DType::I32, true);
    // Targets through a non-contiguous view too.
    let d = dev();
    let logits = rng.vec(4 * 5, -2.0, 2.0);
    let lt = Tensor::from_slice(&logits, &[4, 5], &d).unwrap();
    let t2 = Tensor::from_slice(&[1i32, 0, 4, 2, 3, 3, 0, 1], &[4, 2], &d)
        .unwrap()
        .narrow(1, 1, 1)
        .unwrap()
        .reshape(&[4]);
    let t2 = t2.unwrap();
    let loss = lt.cross_entropy(&t2).unwrap().item().unwrap();
    let (want, _) = reference(&logits, &[0, 2, 3, 1], 5, None);
    assert_close("strided targets", &[loss], &[want], 1e-5, 1e-5);
}

#[test]
fn cross_entropy_in_16_bit() {
    let mut rng = Rng::new("cross_entropy_in_16_bit");
    for dtype in [DType::F16, DType::BF16] {
        check(&mut rng, &[5], 17, dtype, DType::I32, false);
        check(&mut rng, &[2, 3], 64, dtype, DType::I32, true);
    }
}

#[test]
fn cross_entropy_ignores_targets() {
    let d = dev();
    let logits = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], &d)
        .unwrap()
        .requires_grad_();
    let all_ignored = Tensor::from_slice(&[-100i32, -100], &[2], &d).unwrap();
    let loss = logits.cross_entropy(&all_ignored).unwrap();
    assert!(
        loss.item().unwrap().is_nan(),
        "mean over no targets is NaN, as in PyTorch"
    );
    loss.backward().unwrap();
    assert_eq!(logits.grad().unwrap().to_vec::<f32>().unwrap(), vec![0.0; 6]);
    // Another ignore index; -100 is then an out-of-range target.
    let t = Tensor::from_slice(&[7i32, 2], &[2], &d).unwrap();
    let (want, _) = reference(&logits.to_f32_vec().unwrap(), &[7, 2], 3, Some(7));
    assert_close(
        "ignore_index 7",
        &[logits.cross_entropy_with(&t, Some(7)).unwrap().item().unwrap()],
        &[want],
        1e-5,
        1e-5,
    );
    let t = Tensor::from_slice(&[-100i32, 2], &[2], &d).unwrap();
    assert!(logits.cross_entropy_with(&t, None).unwrap().item().unwrap().is_nan());
    let empty = Tensor::zeros(&[0, 3], DType::F32, &d).unwrap();
    let none = Tensor::zeros(&[0], DType::I32, &d).unwrap();
    assert!(empty.cross_entropy(&none).unwrap().item().unwrap().is_nan());
}

#[test]
fn cross_entropy_out_of_range_targets_give_nan() {
    let d = dev();
    let logits = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], &d)
        .unwrap()
        .requires_grad_();
    for t in [[3i32, 0], [0, -1], [0, i32::MAX]] {
        let t = Tensor::from_slice(&t, &[2], &d).unwrap();
        let loss = logits.cross_entropy(&t).unwrap();
        assert!(loss.item().unwrap().is_nan());
    }
    let t = Tensor::from_slice(&[1u32, 3], &[2], &d).unwrap();
    let loss = logits.cross_entropy(&t).unwrap();
    assert!(loss.item().unwrap().is_nan());
    loss.backward().unwrap();
    let g = logits.grad().unwrap().to_vec::<f32>().unwrap();
    assert!(
        g[3..].iter().all(|v| v.is_nan()),
        "the bad row's gradient is NaN: {g:?}"
    );
}

#[test]
fn cross_entropy_of_extreme_logits() {
    let d = dev();
    let logits = Tensor::from_slice(&[1000.0f32, -1000.0, 0.0, -1e30, 0.0, 5.0], &[2, 3], &d).unwrap();
    let t = Tensor::from_slice(&[1i32, 0], &[2], &d).unwrap();
    let (want, _) = reference(&logits.to_f32_vec().unwrap(), &[1, 0], 3, None);
    assert_close(
        "extreme logits",
        &[logits.cross_entropy(&t).unwrap().item().unwrap()],
        &[want],
        1e-5,
        1e-3,
    );
}

#[test]
fn cross_entropy_gradcheck() {
    let mut rng = Rng::new("cross_entropy_gradcheck");
    let d = dev();
    let t = Tensor::from_slice(&[2i32, -100, 0, 4], &[4], &d).unwrap();
    let x = rng.vec(20, -2.0, 2.0);
    gradcheck("cross_entropy", &mut rng, &[(x, vec![4, 5])], |x| {
        x[0].cross_entropy(&t)
    });
    let t = Tensor::from_slice(&[1i32, 2, 0, 2, 1, 1], &[2, 3], &d).unwrap();
    let x = rng.vec(18, -2.0, 2.0);
    gradcheck("cross_entropy [B, T, C]", &mut rng, &[(x, vec![2, 3, 3])], |x| {
        x[0].cross_entropy(&t)
    });
}

#[test]
fn cross_entropy_rejects_bad_arguments() {
    let d = dev();
    let logits = Tensor::zeros(&[2, 3], DType::F32, &d).unwrap();
    let t = |v: &[i32], s: &[usize]| Tensor::from_slice(v, s, &d).unwrap();
    assert!(logits.cross_entropy(&t(&[0, 1, 2], &[3])).is_err(), "targets shape");
    assert!(logits.cross_entropy(&t(&[0, 1], &[1, 2])).is_err(), "targets shape");
    let ft = Tensor::from_slice(&[0.0f32, 1.0], &[2], &d).unwrap();
    assert!(logits.cross_entropy(&ft).is_err(), "float targets");
    let il = Tensor::zeros(&[2, 3], DType::I32, &d).unwrap();
    assert!(il.cross_entropy(&t(&[0, 1], &[2])).is_err(), "integer logits");
    let no_classes = Tensor::zeros(&[2, 0], DType::F32, &d).unwrap();
    assert!(no_classes.cross_entropy(&t(&[0, 1], &[2])).is_err(), "no classes");
    let scalar = Tensor::zeros(&[], DType::F32, &d).unwrap();
    assert!(scalar.cross_entropy(&t(&[0], &[])).is_err(), "scalar logits");
}
