//! Reductions over any set of dimensions against f64 CPU references.

mod common;
use common::*;
use hierarchos::core::{DType, Gpu, GpuOptions, ReduceOp, Tensor};

const OPS: [ReduceOp; 8] = [
    ReduceOp::Sum,
    ReduceOp::SumSquares,
    ReduceOp::Mean,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::ArgMax,
    ReduceOp::ArgMin,
    ReduceOp::LogSumExp,
];

/// Reduces `data` (row-major `shape`) over `dims` in f64.
fn reference(op: ReduceOp, data: &[f64], shape: &[usize], dims: &[usize]) -> Vec<f64> {
    let rank = shape.len();
    let kept: Vec<usize> = (0..rank).filter(|d| !dims.contains(d)).collect();
    let red: Vec<usize> = (0..rank).filter(|d| dims.contains(d)).collect();
    let strides = {
        let mut s = vec![1; rank];
        for d in (0..rank.saturating_sub(1)).rev() {
            s[d] = s[d + 1] * shape[d + 1];
        }
        s
    };
    let kept_shape: Vec<usize> = kept.iter().map(|&d| shape[d]).collect();
    let red_shape: Vec<usize> = red.iter().map(|&d| shape[d]).collect();
    let kept_strides: Vec<usize> = kept.iter().map(|&d| strides[d]).collect();
    let red_strides: Vec<usize> = red.iter().map(|&d| strides[d]).collect();
    strided_indices(&kept_shape, &kept_strides, 0)
        .into_iter()
        .map(|base| {
            let row: Vec<f64> = strided_indices(&red_shape, &red_strides, base)
                .iter()
                .map(|&i| data[i])
                .collect();
            let n = row.len() as f64;
            let first = |better: &dyn Fn(f64, f64) -> bool| {
                let mut best = 0;
                for (j, &v) in row.iter().enumerate() {
                    if better(v, row[best]) {
                        best = j;
                    }
                }
                best
            };
            match op {
                ReduceOp::Sum => row.iter().sum(),
                ReduceOp::SumSquares => row.iter().map(|v| v * v).sum(),
                ReduceOp::Mean => row.iter().sum::<f64>() / n,
                ReduceOp::Max => row.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
                ReduceOp::Min => row.iter().cloned().fold(f64::INFINITY, f64::min),
                ReduceOp::ArgMax => first(&|a, b| a > b) as f64,
                ReduceOp::ArgMin => first(&|a, b| a < b) as f64,
                ReduceOp::LogSumExp => {
                    let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln()
                }
            }
        })
        .collect()
}

fn read(t: &Tensor) -> Vec<f32> {
    if t.dtype() == DType::U32 {
        t.to_vec::<u32>().unwrap().iter().map(|&v| v as f32).collect()
    } else {
        t.to_f32_vec().unwrap()
    }
}

#[test]
fn reductions_over_any_dims_match_reference() {
    let d = dev();
    let mut rng = Rng::new("reduce");
    let cases: [(&[usize], &[usize]); 8] = [
        (&[1], &[0]),
        (&[3], &[0]),
        (&[257], &[0]),
        (&[17, 3], &[1]),
        (&[17, 3], &[0]),
        (&[4, 5, 6], &[0, 2]),
        (&[2, 3, 1000], &[2]),
        (&[3, 4, 5], &[0, 1, 2]),
    ];
    for op in OPS {
        for (shape, dims) in cases {
            let n: usize = shape.iter().product();
            let x = rng.vec(n, -3.0, 3.0);
            let t = Tensor::from_slice(&x, shape, &d).unwrap();
            let idims: Vec<isize> = dims.iter().map(|&v| v as isize).collect();
            let got = if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) {
                if dims.len() != 1 {
                    continue;
                }
                t.reduce(op, &idims, false).unwrap()
            } else {
                t.reduce(op, &idims, false).unwrap()
            };
            let xd: Vec<f64> = x.iter().map(|&v| v as f64).collect();
            let want = reference(op, &xd, shape, dims);
            let scale: f64 = (xd.iter().map(|v| v.abs()).sum::<f64>() / n as f64).max(1.0);
            let atol = if matches!(op, ReduceOp::Sum | ReduceOp::SumSquares) {
                1e-6 * scale * scale * (n as f64).sqrt()
            } else {
                1e-6
            };
            assert_close(&format!("{op:?} {shape:?} {dims:?}"), &read(&got), &want, 1e-5, atol);
            let keep = t.reduce(op, &idims, true).unwrap();
            assert_eq!(keep.rank(), shape.len(), "keepdim keeps the rank");
        }
    }
}

#[test]
fn reductions_read_strided_views_and_half_types() {
    let d = dev();
    let mut rng = Rng::new("reduce_views");
    let x = rng.vec(6 * 7, -3.0, 3.0);
    let t = Tensor::from_slice(&x, &[6, 7], &d)
        .unwrap()
        .t()
        .unwrap()
        .narrow(1, 1, 4)
        .unwrap(); // [7, 4]
    let xd: Vec<f64> = strided_indices(&[7, 4], &[1, 7], 7)
        .iter()
        .map(|&i| x[i] as f64)
        .collect();
    for op in OPS {
        let got = t.reduce(op, &[1], false).unwrap();
        assert_close(
            &format!("{op:?} on a view"),
            &read(&got),
            &reference(op, &xd, &[7, 4], &[1]),
            1e-5,
            1e-6,
        );
    }
    for dtype in [DType::F16, DType::BF16] {
        let h = Tensor::from_slice(&x, &[6, 7], &d).unwrap().to_dtype(dtype).unwrap();
        let hd: Vec<f64> = h.to_f32_vec().unwrap().iter().map(|&v| v as f64).collect();
        let got = h.sum(&[1], false).unwrap();
        assert_eq!(got.dtype(), dtype);
        assert_close(
            &format!("sum {dtype}"),
            &got.to_f32_vec().unwrap(),
            &reference(ReduceOp::Sum, &hd, &[6, 7], &[1]),
            1e-2,
            2e-2,
        );
    }
}

#[test]
fn reductions_of_empty_and_special_values() {
    let d = dev();
    let e = Tensor::zeros(&[0, 3], DType::F32, &d).unwrap();
    assert_eq!(e.sum(&[0], false).unwrap().to_vec::<f32>().unwrap(), vec![0.0; 3]);
    assert_eq!(
        e.sum_squares(&[0], false).unwrap().to_vec::<f32>().unwrap(),
        vec![0.0; 3]
    );
    assert!(
        e.mean(&[0], false)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .all(|v| v.is_nan())
    );
    assert_eq!(
        e.logsumexp(&[0], false).unwrap().to_vec::<f32>().unwrap(),
        vec![f32::NEG_INFINITY; 3]
    );
    assert!(e.sum(&[1], false).unwrap().to_vec::<f32>().unwrap().is_empty());
    assert!(e.max(&[0], false).is_err(), "max over an empty dimension has no value");
    let t = Tensor::from_slice(&[1.0f32, f32::NAN, 3.0, 3.0], &[4], &d).unwrap();
    assert!(t.max(&[], false).unwrap().item().unwrap().is_nan(), "NaN propagates");
    assert_eq!(t.argmax(0, false).unwrap().to_vec::<u32>().unwrap(), vec![1]);
    let ties = Tensor::from_slice(&[1.0f32, 3.0, 3.0, 0.0], &[4], &d).unwrap();
    assert_eq!(
        ties.argmax(0, false).unwrap().to_vec::<u32>().unwrap(),
        vec![1],
        "first of tied maxima"
    );
    let inf = Tensor::from_slice(&[f32::NEG_INFINITY; 3], &[3], &d).unwrap();
    assert_eq!(inf.logsumexp(&[0], false).unwrap().item().unwrap(), f32::NEG_INFINITY);
    // A +inf element makes the sum +inf, as in torch, not NaN from exp(inf - inf).
    let pos = Tensor::from_slice(&[f32::INFINITY, 1.0, 2.0, f32::INFINITY], &[2, 2], &d).unwrap();
    assert_eq!(
        pos.logsumexp(&[1], false).unwrap().to_vec::<f32>().unwrap(),
        vec![f32::INFINITY; 2]
    );
    let big = Tensor::from_slice(&[1000.0f32, 1000.0], &[2], &d).unwrap();
    assert!((big.logsumexp(&[0], false).unwrap().item().unwrap() - (1000.0 + 2f32.ln())).abs() < 1e-3);
    assert!(t.sum(&[1], false).is_err(), "dimension out of range");
    // Integer argmax / argmin compare exactly, past 2^24 too (the f32 comparison took 2^24 + 1 for 2^24).
    let big = Tensor::from_slice(&[16777216i32, 16777217, 3, -5, 16777217, i32::MIN], &[2, 3], &d).unwrap();
    assert_eq!(big.argmax(1, false).unwrap().to_vec::<u32>().unwrap(), [1, 1]);
    assert_eq!(big.argmin(1, false).unwrap().to_vec::<u32>().unwrap(), [2, 2]);
    assert_eq!(big.argmax(0, true).unwrap().to_vec::<u32>().unwrap(), [0, 0, 0]);
    let near_top = Tensor::from_slice(&[u32::MAX, u32::MAX - 1, u32::MAX - 1, 0x8000_0000], &[4], &d).unwrap();
    assert_eq!(near_top.argmin(0, false).unwrap().to_vec::<u32>().unwrap(), [3]);
    assert_eq!(
        near_top
            .narrow(0, 0, 3)
            .unwrap()
            .argmin(0, false)
            .unwrap()
            .to_vec::<u32>()
            .unwrap(),
        [1]
    );
    assert_eq!(near_top.argmax(0, false).unwrap().to_vec::<u32>().unwrap(), [0]);
    let m = Tensor::zeros(&[2, 3], DType::F32, &d).unwrap();
    assert!(
        m.sum(&[1, 1], false).is_err() && m.sum(&[1, -1], false).is_err(),
        "a dimension twice, as torch"
    );
}

#[test]
fn reduction_gradients_pass_finite_differences() {
    let mut rng = Rng::new("reduce_grad");
    for op in [
        ReduceOp::Sum,
        ReduceOp::SumSquares,
        ReduceOp::Mean,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::LogSumExp,
    ] {
        // Max and min are not differentiable at ties: keep every pair of values at least 0.25 apart (a random
        // order of evenly spaced values), far beyond the finite-difference step of 0.01.
        let mut x: Vec<f32> = (0..12).map(|i| i as f32 * 0.3 - 1.8 + rng.uniform(0.0, 0.05)).collect();
        for i in (1..x.len()).rev() {
            x.swap(i, rng.below(i + 1));
        }
        gradcheck(&format!("{op:?} dim 1"), &mut rng, &[(x.clone(), vec![3, 4])], |t| {
            t[0].reduce(op, &[1], false)
        });
        gradcheck(
            &format!("{op:?} dims 0,2"),
            &mut rng,
            &[(x.clone(), vec![2, 3, 2])],
            |t| t[0].reduce(op, &[0, 2], true),
        );
        gradcheck(&format!("{op:?} all"), &mut rng, &[(x, vec![12])], |t| {
            t[0].reduce(op, &[], false)
        });
    }
}

/// `Tensor::sum_squares_of`: one Σ x² over many tensors (gradient clipping's norm) against f64, across the
/// kernel's chunks of 4096 elements and its groups of six tensors, with a strided view, 16-bit tensors and an
/// empty one; in a launch per group plus the final sum for dense f32 tensors; refused inputs.
#[test]
fn sum_squares_of_many_tensors() {
    let mut rng = Rng::new("sum_squares_of_many_tensors");
    // A device of its own: the launch count below must not include other tests' launches.
    let d = pollster::block_on(Gpu::open(&GpuOptions::from_env())).unwrap();
    let shapes: [&[usize]; 10] = [
        &[1],
        &[3],
        &[17],
        &[257],
        &[0],
        &[4097],
        &[3, 4100],
        &[64, 65],
        &[9000],
        &[5, 7],
    ];
    let mut tensors = Vec::new();
    let mut want = 0f64;
    for shape in shapes {
        let n: usize = shape.iter().product();
        let v = rng.vec(n, -2.0, 2.0);
        want += v.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>();
        tensors.push(Tensor::from_slice(&v, shape, &d).unwrap());
    }
    let refs: Vec<&Tensor> = tensors.iter().collect();
    let before = d.dispatch_count();
    let got = Tensor::sum_squares_of(&refs).unwrap();
    let launches = d.dispatch_count() - before;
    assert_close("dense f32", &read(&got), &[want], 1e-5, 0.0);
    assert!(launches <= 2 + 2, "{launches} launches for two groups of tensors");
    // A transposed view and 16-bit tensors (their values after rounding).
    let base = Tensor::from_slice(&rng.vec(6 * 9, -1.0, 1.0), &[6, 9], &d).unwrap();
    let view = base.t().unwrap();
    let half = base.to_dtype(DType::F16).unwrap();
    let brain = base.to_dtype(DType::BF16).unwrap();
    let sq = |t: &Tensor| {
        t.to_f32_vec()
            .unwrap()
            .iter()
            .map(|&x| (x as f64) * (x as f64))
            .sum::<f64>()
    };
    let got = Tensor::sum_squares_of(&[&view, &half, &brain, &tensors[4]]).unwrap();
    assert_close(
        "views and 16-bit",
        &read(&got),
        &[sq(&view) + sq(&half) + sq(&brain)],
        1e-5,
        0.0,
    );
    let got = Tensor::sum_squares_of(&[&tensors[4]]).unwrap();
    assert_eq!(read(&got), [0.0]);
    assert!(Tensor::sum_squares_of(&[]).is_err());
    let ids = Tensor::from_slice(&[1u32, 2], &[2], &d).unwrap();
    assert!(Tensor::sum_squares_of(&[&tensors[0], &ids]).is_err());
    let no_ids = Tensor::zeros(&[0], DType::U32, &d).unwrap();
    assert!(
        Tensor::sum_squares_of(&[&tensors[0], &no_ids]).is_err(),
        "empty, but of ids"
    );
}

/// Sums over the leading dimensions of contiguous f32 tensors whose kept extent is a multiple of 4 (the weight
/// gradients' partial sums) take a kernel reading rows of vec4s: the f64 reference, and the bits of the strided
/// kernel that a transposed copy of the same values takes. Also from an offset view, and past 1024 rows.
#[test]
fn sums_over_leading_dims_read_rows_of_quads() {
    let d = dev();
    let mut rng = Rng::new("sums_over_leading_dims");
    let cases: [(&[usize], &[usize]); 7] = [
        (&[1, 4], &[0]),
        (&[3, 8], &[0]),
        (&[17, 12], &[0]),
        (&[257, 4], &[0]),
        (&[1030, 64], &[0]),
        (&[2, 3, 8], &[0, 1]),
        (&[5, 2, 4], &[0]),
    ];
    for (shape, dims) in cases {
        let n: usize = shape.iter().product();
        let x = rng.vec(n + 8, -3.0, 3.0);
        // Rows from the second of the buffer's rows of 4 on: an offset the kernel reads through.
        let t = Tensor::from_slice(&x, &[n + 8], &d)
            .unwrap()
            .narrow(0, 8, n)
            .unwrap()
            .reshape(shape)
            .unwrap();
        let idims: Vec<isize> = dims.iter().map(|&v| v as isize).collect();
        let got = t.sum(&idims, false).unwrap();
        let xd: Vec<f64> = x[8..].iter().map(|&v| v as f64).collect();
        let want = reference(ReduceOp::Sum, &xd, shape, dims);
        let what = format!("{shape:?} over {dims:?}");
        assert_close(&what, &got.to_f32_vec().unwrap(), &want, 1e-5, 1e-5 * (n as f64).sqrt());
        // The same values as the transpose of a [kept, reduced] tensor: the strided kernel's bits.
        let reduced: usize = dims.iter().map(|&k| shape[k]).product();
        let kept = n / reduced;
        let mut transposed = vec![0.0; n];
        for r in 0..reduced {
            for c in 0..kept {
                transposed[c * reduced + r] = x[8 + r * kept + c];
            }
        }
        let strided = Tensor::from_slice(&transposed, &[kept, reduced], &d)
            .unwrap()
            .t()
            .unwrap();
        let bits = |t: &Tensor| t.to_f32_vec().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&strided.sum(&[0], false).unwrap()), "{what}: bits");
    }
}
