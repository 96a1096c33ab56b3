//! softmax, log_softmax and cumsum against f64 CPU references.

mod common;

use common::*;
use hierarchos::core::{DType, Error, Tensor};

/// Applies `f` to every row of the logical data `x` (shape `shape`) along `dim`.
fn along_rows(x: &[f32], shape: &[usize], dim: usize, f: impl Fn(&[f64]) -> Vec<f64>) -> Vec<f64> {
    let n = shape[dim];
    let inner: usize = shape[dim + 1..].iter().product();
    let outer: usize = shape[..dim].iter().product();
    let mut out = vec![0.0; x.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| o * n * inner + j * inner + i;
            let row: Vec<f64> = (0..n).map(|j| x[at(j)] as f64).collect();
            for (j, v) in f(&row).into_iter().enumerate() {
                out[at(j)] = v;
            }
        }
    }
    out
}

fn cpu_softmax(row: &[f64], log: bool) -> Vec<f64> {
    let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let s: f64 = row.iter().map(|&v| (v - m).exp()).sum();
    row.iter()
        .map(|&v| if log { v - m - s.ln() } else { (v - m).exp() / s })
        .collect()
}

fn cpu_cumsum(row: &[f64]) -> Vec<f64> {
    row.iter()
        .scan(0.0, |acc, &v| {
            *acc += v;
            Some(*acc)
        })
        .collect()
}

/// The elements of view `t` of a tensor whose buffer holds `base`, in row-major order.
fn logical(t: &Tensor, base: &[f32]) -> Vec<f32> {
    let l = t.layout();
    strided_indices(&l.shape, &l.strides, l.offset)
        .into_iter()
        .map(|o| base[o])
        .collect()
}

// softmax outputs are in (0, 1]: relative 1e-5 plus 1e-7 absolute for underflowing tails. log_softmax values
// are sums of x and log Σ exp, so an absolute 1e-5 covers the f32 rounding of terms of magnitude ~10.
const SOFTMAX_TOL: (f64, f64) = (1e-5, 1e-7);
const LOG_SOFTMAX_TOL: (f64, f64) = (1e-5, 1e-5);

#[test]
fn softmax_matches_reference() {
    let mut rng = Rng::new("softmax_matches_reference");
    let d = dev();
    for (shape, dim) in [
        (vec![1], 0),
        (vec![3], 0),
        (vec![4, 17], 1),
        (vec![4, 17], 0),
        (vec![2, 257], 1),
        (vec![3, 5, 7], 1),
        (vec![2, 1000], 1),
        (vec![1, 4096], 1),
    ] {
        let n: usize = shape.iter().product();
        let x = rng.vec(n, -8.0, 8.0);
        let t = Tensor::from_slice(&x, &shape, &d).unwrap();
        for log in [false, true] {
            let got = if log {
                t.log_softmax(dim as isize)
            } else {
                t.softmax(dim as isize)
            }
            .unwrap();
            let want = along_rows(&x, &shape, dim, |r| cpu_softmax(r, log));
            let (rtol, atol) = if log { LOG_SOFTMAX_TOL } else { SOFTMAX_TOL };
            assert_close(
                &format!("softmax log={log} {shape:?} dim {dim}"),
                &got.to_f32_vec().unwrap(),
                &want,
                rtol,
                atol,
            );
        }
    }
}

#[test]
fn softmax_reads_strided_inputs_and_16_bit() {
    let mut rng = Rng::new("softmax_reads_strided_inputs_and_16_bit");
    let d = dev();
    let x = rng.vec(6 * 19, -4.0, 4.0);
    let view = Tensor::from_slice(&x, &[6, 19], &d)
        .unwrap()
        .t()
        .unwrap()
        .narrow(0, 1, 17)
        .unwrap(); // [17, 6]
    let vx = logical(&view, &x);
    for dim in [0usize, 1] {
        let want = along_rows(&vx, &[17, 6], dim, |r| cpu_softmax(r, false));
        let got = view.softmax(dim as isize).unwrap();
        assert_close(
            &format!("strided softmax dim {dim}"),
            &got.to_f32_vec().unwrap(),
            &want,
            SOFTMAX_TOL.0,
            SOFTMAX_TOL.1,
        );
        for dtype in [DType::F16, DType::BF16] {
            let h = view.to_dtype(dtype).unwrap();
            let hx = h.to_f32_vec().unwrap();
            let want = along_rows(&hx, &[17, 6], dim, |r| cpu_softmax(r, false));
            let got = h.softmax(dim as isize).unwrap();
            assert_eq!(got.dtype(), dtype);
            assert_close(
                &format!("{dtype} softmax dim {dim}"),
                &got.to_f32_vec().unwrap(),
                &want,
                1e-2,
                1e-3,
            );
            let want = along_rows(&hx, &[17, 6], dim, |r| cpu_softmax(r, true));
            let got = h.log_softmax(dim as isize).unwrap();
            assert_close(
                &format!("{dtype} log_softmax dim {dim}"),
                &got.to_f32_vec().unwrap(),
                &want,
                1e-2,
                1e-2,
            );
        }
    }
}

#[test]
fn softmax_special_values() {
    let d = dev();
    let ninf = f32::NEG_INFINITY;
    // Masked (causal) rows, a row of only -inf (NaN, as in PyTorch), large values that would overflow exp.
    let x = [
        0.0, ninf, ninf, 1.0, 2.0, ninf, ninf, ninf, ninf, 1000.0, 1000.0, -1000.0,
    ];
    let t = Tensor::from_slice(&x, &[4, 3], &d).unwrap();
    let got = t.softmax(1).unwrap().to_vec::<f32>().unwrap();
    let e = (-1.0f64).exp();
    let want = [
        1.0,
        0.0,
        0.0,
        e / (1.0 + e),
        1.0 / (1.0 + e),
        0.0,
        f64::NAN,
        f64::NAN,
        f64::NAN,
        0.5,
        0.5,
        0.0,
    ];
    assert_close("softmax special", &got, &want, 1e-6, 1e-7);
    let got = t.log_softmax(1).unwrap().to_vec::<f32>().unwrap();
    let (l, ln2, ninf64) = ((1.0 + e).ln(), 2f64.ln(), f64::NEG_INFINITY);
    let want = [
        0.0,
        ninf64,
        ninf64,
        -1.0 - l,
        -l,
        ninf64,
        f64::NAN,
        f64::NAN,
        f64::NAN,
        -ln2,
        -ln2,
        -2000.0 - ln2,
    ];
    assert_close("log_softmax special", &got, &want, 1e-6, 1e-6);
    let nan = Tensor::from_slice(&[1.0f32, f32::NAN, 2.0], &[3], &d).unwrap();
    assert!(
        nan.softmax(0)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .all(|v| v.is_nan())
    );
    let mut long = vec![0.5f32; 300];
    long[200] = f32::NAN;
    let long = Tensor::from_slice(&long, &[300], &d).unwrap();
    assert!(
        long.log_softmax(0)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .all(|v| v.is_nan())
    );
    // The same rows past four elements a thread (rows of 2500 take the kernels' four-at-a-time steps), padded
    // with -inf: a masked row, a row of only -inf, large values, and a NaN among finite values.
    let w = 2500;
    let mut wide = vec![ninf; 4 * w];
    wide[0] = 0.0;
    wide[2 * w..2 * w + 3].copy_from_slice(&[1000.0, 1000.0, -1000.0]);
    wide[3 * w..].fill(0.5);
    wide[3 * w + 2100] = f32::NAN;
    let got = Tensor::from_slice(&wide, &[4, w], &d)
        .unwrap()
        .softmax(1)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(got[0], 1.0);
    assert!(got[1..w].iter().all(|&v| v == 0.0));
    assert!(got[w..2 * w].iter().all(|v| v.is_nan()));
    assert_eq!(&got[2 * w..2 * w + 3], &[0.5, 0.5, 0.0]);
    assert!(got[2 * w + 3..3 * w].iter().all(|&v| v == 0.0));
    assert!(got[3 * w..].iter().all(|v| v.is_nan()));
    let scalar = Tensor::from_slice(&[3.0f32], &[], &d).unwrap();
    assert_eq!(scalar.softmax(-1).unwrap().to_vec::<f32>().unwrap(), vec![1.0]);
    assert_eq!(scalar.log_softmax(0).unwrap().to_vec::<f32>().unwrap(), vec![0.0]);
}

#[test]
fn softmax_empty_and_errors() {
    let d = dev();
    let e = Tensor::zeros(&[0, 5], DType::F32, &d).unwrap();
    assert_eq!(e.softmax(1).unwrap().shape(), &[0, 5]);
    let e = Tensor::zeros(&[3, 0], DType::F16, &d).unwrap();
    assert_eq!(e.log_softmax(1).unwrap().shape(), &[3, 0]);
    assert_eq!(e.cumsum(1).unwrap().shape(), &[3, 0]);
    let t = Tensor::zeros(&[2, 3], DType::F32, &d).unwrap();
    assert!(matches!(t.softmax(2), Err(Error::IndexOutOfRange { .. })));
    assert!(matches!(t.log_softmax(-3), Err(Error::IndexOutOfRange { .. })));
    assert!(matches!(t.cumsum(5), Err(Error::IndexOutOfRange { .. })));
    let i = Tensor::from_slice(&[1u32, 2], &[2], &d).unwrap();
    assert!(matches!(i.softmax(0), Err(Error::DTypeMismatch { .. })));
    assert!(matches!(i.cumsum(0), Err(Error::DTypeMismatch { .. })));
}

#[test]
fn softmax_gradients() {
    let mut rng = Rng::new("softmax_gradients");
    let x = rng.vec(12, -2.0, 2.0);
    gradcheck("softmax", &mut rng, &[(x.clone(), vec![3, 4])], |t| t[0].softmax(1));
    gradcheck("softmax dim 0", &mut rng, &[(x.clone(), vec![3, 4])], |t| {
        t[0].softmax(0)
    });
    gradcheck("log_softmax", &mut rng, &[(x.clone(), vec![3, 4])], |t| {
        t[0].log_softmax(-1)
    });
    gradcheck("log_softmax strided", &mut rng, &[(x.clone(), vec![2, 2, 3])], |t| {
        t[0].transpose(0, 2)?.log_softmax(1)
    });
}

#[test]
fn cumsum_matches_reference() {
    let mut rng = Rng::new("cumsum_matches_reference");
    let d = dev();
    for (shape, dim) in [
        (vec![1], 0),
        (vec![3], 0),
        (vec![4, 17], 1),
        (vec![4, 17], 0),
        (vec![2, 257], 1),
        (vec![3, 5, 7], 1),
        (vec![1, 1000], 1),
    ] {
        let n: usize = shape.iter().product();
        let x = rng.vec(n, -1.0, 1.0);
        let t = Tensor::from_slice(&x, &shape, &d).unwrap();
        let got = t.cumsum(dim as isize).unwrap();
        let want = along_rows(&x, &shape, dim, cpu_cumsum);
        // Partial sums of up to L values in [-1, 1] carry f32 rounding of about L * 2^-24 * |partial|.
        let atol = 1e-6 * (shape[dim] as f64).sqrt();
        assert_close(
            &format!("cumsum {shape:?} dim {dim}"),
            &got.to_f32_vec().unwrap(),
            &want,
            1e-5,
            atol,
        );
    }
    let x = rng.vec(5 * 9, -1.0, 1.0);
    let view = Tensor::from_slice(&x, &[5, 9], &d)
        .unwrap()
        .t()
        .unwrap()
        .narrow(0, 2, 6)
        .unwrap(); // [6, 5]
    let vx = logical(&view, &x);
    for dim in [0usize, 1] {
        let want = along_rows(&vx, &[6, 5], dim, cpu_cumsum);
        assert_close(
            &format!("strided cumsum {dim}"),
            &view.cumsum(dim as isize).unwrap().to_f32_vec().unwrap(),
            &want,
            1e-5,
            1e-6,
        );
        let h = view.to_dtype(DType::BF16).unwrap();
        let want = along_rows(&h.to_f32_vec().unwrap(), &[6, 5], dim, cpu_cumsum);
        let got = h.cumsum(dim as isize).unwrap();
        assert_eq!(got.dtype(), DType::BF16);
        assert_close(
            &format!("bf16 cumsum {dim}"),
            &got.to_f32_vec().unwrap(),
            &want,
            1e-2,
            1e-2,
        );
    }
    let scalar = Tensor::from_slice(&[3.0f32], &[], &d).unwrap();
    assert_eq!(scalar.cumsum(0).unwrap().to_vec::<f32>().unwrap(), vec![3.0]);
}

#[test]
fn cumsum_gradients() {
    let mut rng = Rng::new("cumsum_gradients");
    let x = rng.vec(15, -1.0, 1.0);
    gradcheck("cumsum", &mut rng, &[(x.clone(), vec![3, 5])], |t| t[0].cumsum(1));
    gradcheck("cumsum dim 0", &mut rng, &[(x.clone(), vec![3, 5])], |t| t[0].cumsum(0));
    gradcheck("cumsum twice", &mut rng, &[(x, vec![15])], |t| {
        t[0].cumsum(0)?.cumsum(0)
    });
}
