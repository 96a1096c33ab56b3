//! RMSNorm and LayerNorm against f64 CPU references: forward, backward (analytic references and gradcheck),
//! strided inputs, 16-bit dtypes and bad arguments.

mod common;

use common::*;
use hierarchos::core::{DType, Tensor};

/// Forward and gradients of a normalization of `rows` rows of `c` elements, in f64.
struct Reference {
    y: Vec<f64>,
    dx: Vec<f64>,
    dw: Vec<f64>,
    db: Vec<f64>,
}

fn reference(x: &[f32], w: Option<&[f32]>, b: Option<&[f32]>, g: &[f32], c: usize, layer: bool, eps: f64) -> Reference {
    let rows = x.len().checked_div(c).unwrap_or(0);
    let wj = |j: usize| w.map_or(1.0, |w| w[j] as f64);
    let (mut y, mut dx) = (vec![0.0; x.len()], vec![0.0; x.len()]);
    let (mut dw, mut db) = (vec![0.0; c], vec![0.0; c]);
    for r in 0..rows {
        let row: Vec<f64> = x[r * c..(r + 1) * c].iter().map(|&v| v as f64).collect();
        let mean = if layer { row.iter().sum::<f64>() / c as f64 } else { 0.0 };
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / c as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        let xh: Vec<f64> = row.iter().map(|v| (v - mean) * rstd).collect();
        let gh: Vec<f64> = (0..c).map(|j| g[r * c + j] as f64 * wj(j)).collect();
        let mg = if layer { gh.iter().sum::<f64>() / c as f64 } else { 0.0 };
        let mgx = (0..c).map(|j| gh[j] * xh[j]).sum::<f64>() / c as f64;
        for j in 0..c {
            y[r * c + j] = xh[j] * wj(j) + b.map_or(0.0, |b| b[j] as f64);
            dx[r * c + j] = rstd * (gh[j] - mg - xh[j] * mgx);
            dw[j] += g[r * c + j] as f64 * xh[j];
            db[j] += g[r * c + j] as f64;
        }
    }
    Reference { y, dx, dw, db }
}

/// Rounds through the tensor's dtype (what a 16-bit input really holds).
fn rounded(v: &[f32], dtype: DType) -> Vec<f32> {
    let t = Tensor::from_slice(v, &[v.len()], &dev())
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    t.to_f32_vec().unwrap()
}

/// Runs forward and backward with weight `g` on the output and compares all results with the reference.
#[allow(clippy::too_many_arguments)]
fn check(rng: &mut Rng, lead: &[usize], c: usize, layer: bool, with_w: bool, with_b: bool, dtype: DType, layout: &str) {
    let d = dev();
    let rows: usize = lead.iter().product();
    let n = rows * c;
    let offset = if layer { 3.0 } else { 0.0 };
    let x = rounded(&rng.vec(n, offset - 2.0, offset + 2.0), dtype);
    let w = rounded(&rng.vec(c, 0.5, 1.5), dtype);
    let b = rounded(&rng.vec(c, -1.0, 1.0), dtype);
    let g = rounded(&rng.vec(n, -1.0, 1.0), dtype);
    let eps = 1e-5;
    let mut shape = lead.to_vec();
    shape.push(c);
    // The same values viewed through a transposed or narrowed layout, so the last dimension is strided.
    let xt = match layout {
        "transposed" => {
            let mut tshape = shape.clone();
            tshape.swap(lead.len() - 1, lead.len());
            let r = lead.len() as isize;
            let mut host = vec![0.0f32; n];
            for (i, &o) in strided_indices(&shape, &transposed_strides(&tshape), 0)
                .iter()
                .enumerate()
            {
                host[o] = x[i];
            }
            Tensor::from_slice(&host, &tshape, &d)
                .unwrap()
                .transpose(r - 1, r)
                .unwrap()
        }
        "narrowed" => {
            let mut wide = shape.clone();
            wide[lead.len()] = c + 5;
            let mut host = rng.vec(rows * (c + 5), -9.0, 9.0);
            for r in 0..rows {
                host[r * (c + 5) + 2..r * (c + 5) + 2 + c].copy_from_slice(&x[r * c..(r + 1) * c]);
            }
            Tensor::from_slice(&host, &wide, &d).unwrap().narrow(-1, 2, c).unwrap()
        }
        _ => Tensor::from_slice(&x, &shape, &d).unwrap(),
    };
    let to = |t: Tensor| t.to_dtype(dtype).unwrap().requires_grad_();
    let xt = to(xt);
    let wt = to(Tensor::from_slice(&w, &[c], &d).unwrap());
    let bt = to(Tensor::from_slice(&b, &[c], &d).unwrap());
    let (wo, bo) = (with_w.then_some(&wt), with_b.then_some(&bt));
    let y = if layer {
        xt.layer_norm(wo, bo, eps)
    } else {
        xt.rms_norm(wo, eps)
    }
    .unwrap();
    assert_eq!(y.shape(), &shape[..]);
    assert_eq!(y.dtype(), dtype);
    let want = reference(
        &x,
        with_w.then_some(&w[..]),
        with_b.then_some(&b[..]),
        &g,
        c,
        layer,
        eps,
    );
    let what = format!(
        "{} {lead:?}x{c} {dtype} {layout} w={with_w} b={with_b}",
        if layer { "layer_norm" } else { "rms_norm" }
    );
    let (rtol, atol) = if dtype == DType::F32 {
        (1e-5, 1e-5)
    } else {
        (1e-2, 1e-2)
    };
    assert_close(&format!("{what}: y"), &y.to_f32_vec().unwrap(), &want.y, rtol, atol);
    let gt = Tensor::from_slice(&g, &shape, &d).unwrap().to_dtype(dtype).unwrap();
    y.mul(&gt)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    // Gradients sum over up to C (dx) or rows (dw) terms of magnitude ~1.
    let (rtol, atol) = if dtype == DType::F32 {
        (1e-4, 1e-5 * (c.max(rows) as f64).sqrt())
    } else {
        (3e-2, 3e-2)
    };
    assert_close(
        &format!("{what}: dx"),
        &xt.grad().unwrap().to_f32_vec().unwrap(),
        &want.dx,
        rtol,
        atol,
    );
    if with_w {
        assert_close(
            &format!("{what}: dw"),
            &wt.grad().unwrap().to_f32_vec().unwrap(),
            &want.dw,
            rtol,
            atol * 4.0,
        );
    }
    if with_b {
        assert_close(
            &format!("{what}: db"),
            &bt.grad().unwrap().to_f32_vec().unwrap(),
            &want.db,
            rtol,
            atol * 4.0,
        );
    }
}

fn transposed_strides(tshape: &[usize]) -> Vec<usize> {
    // Strides mapping an index of the untransposed shape to its position in the transposed buffer.
    let r = tshape.len();
    let mut s = vec![1; r];
    for k in (0..r - 1).rev() {
        s[k] = s[k + 1] * tshape[k + 1];
    }
    s.swap(r - 2, r - 1);
    s
}

#[test]
fn rms_norm_matches_reference() {
    let mut rng = Rng::new("rms_norm_matches_reference");
    for c in [1, 3, 17, 257, 1100] {
        check(&mut rng, &[3], c, false, true, false, DType::F32, "contiguous");
    }
    check(&mut rng, &[2, 3], 17, false, false, false, DType::F32, "contiguous");
    check(&mut rng, &[150], 5, false, true, false, DType::F32, "contiguous");
}

#[test]
fn layer_norm_matches_reference() {
    let mut rng = Rng::new("layer_norm_matches_reference");
    for c in [1, 3, 17, 257, 1100] {
        check(&mut rng, &[3], c, true, true, true, DType::F32, "contiguous");
    }
    check(&mut rng, &[2, 3], 17, true, false, false, DType::F32, "contiguous");
    check(&mut rng, &[2, 3], 17, true, true, false, DType::F32, "contiguous");
    check(&mut rng, &[2, 3], 17, true, false, true, DType::F32, "contiguous");
    check(&mut rng, &[150], 5, true, true, true, DType::F32, "contiguous");
}

#[test]
fn norms_read_strided_rows() {
    let mut rng = Rng::new("norms_read_strided_rows");
    for layer in [false, true] {
        check(&mut rng, &[4], 17, layer, true, layer, DType::F32, "transposed");
        check(&mut rng, &[2, 3], 9, layer, true, layer, DType::F32, "transposed");
        check(&mut rng, &[3], 300, layer, true, layer, DType::F32, "narrowed");
        check(&mut rng, &[2, 3], 9, layer, true, layer, DType::BF16, "narrowed");
    }
}

#[test]
fn norms_in_16_bit() {
    let mut rng = Rng::new("norms_in_16_bit");
    for dtype in [DType::F16, DType::BF16] {
        for layer in [false, true] {
            // Even rows are written directly; odd rows share output words and go through f32.
            check(&mut rng, &[2, 3], 16, layer, true, layer, dtype, "contiguous");
            check(&mut rng, &[3], 17, layer, true, layer, dtype, "contiguous");
            check(&mut rng, &[2], 1, layer, false, false, dtype, "contiguous");
            // Several words of a row per thread, and more rows than the backward takes per workgroup.
            check(&mut rng, &[19], 1100, layer, true, layer, dtype, "contiguous");
        }
    }
}

#[test]
fn layer_norm_is_stable_for_large_means() {
    let d = dev();
    let mut rng = Rng::new("layer_norm_is_stable_for_large_means");
    let c = 600;
    let x: Vec<f32> = rng.vec(c, -1.0, 1.0).iter().map(|v| 10000.0 + v).collect();
    let y = Tensor::from_slice(&x, &[1, c], &d)
        .unwrap()
        .layer_norm(None, None, 1e-5)
        .unwrap();
    let want = reference(&x, None, None, &vec![0.0; c], c, true, 1e-5).y;
    // Near 1e4 one f32 ulp is 2^-10 ~ 1e-3, so the mean alone is uncertain by about that much, and the output
    // (divided by a standard deviation of ~0.58) by up to ~2e-3; a naive E[x^2] - E[x]^2 would be off by ~100.
    assert_close("layer_norm at mean 1e4", &y.to_f32_vec().unwrap(), &want, 1e-3, 4e-3);
}

#[test]
fn norms_of_empty_tensors() {
    let d = dev();
    for shape in [[0usize, 5], [4, 0]] {
        let c = shape[1];
        let x = Tensor::zeros(&shape, DType::F32, &d).unwrap().requires_grad_();
        let w = Tensor::ones(&[c], DType::F32, &d).unwrap().requires_grad_();
        let y = x.layer_norm(Some(&w), None, 1e-5).unwrap();
        assert_eq!(y.shape(), &shape);
        y.sum_all().unwrap().backward().unwrap();
        assert_eq!(x.grad().unwrap().shape(), &shape);
        assert_eq!(w.grad().unwrap().to_vec::<f32>().unwrap(), vec![0.0; c]);
    }
}

#[test]
fn norm_gradcheck() {
    let mut rng = Rng::new("norm_gradcheck");
    let (x, w, b) = (rng.vec(10, -2.0, 2.0), rng.vec(5, 0.5, 1.5), rng.vec(5, -1.0, 1.0));
    let inputs = [(x, vec![2, 5]), (w, vec![5]), (b, vec![5])];
    gradcheck("rms_norm", &mut rng, &inputs[..2], |t| t[0].rms_norm(Some(&t[1]), 1e-5));
    gradcheck("layer_norm", &mut rng, &inputs, |t| {
        t[0].layer_norm(Some(&t[1]), Some(&t[2]), 1e-5)
    });
    gradcheck("layer_norm without affine", &mut rng, &inputs[..1], |t| {
        t[0].layer_norm(None, None, 1e-5)
    });
}

/// The backward computes only the gradients asked for (one kernel for all of them, with fewer rows per workgroup
/// when no weight gradient is summed): each must be the same bits as when all are asked for.
#[test]
fn norm_gradients_of_frozen_inputs() {
    let mut rng = Rng::new("norm_gradients_of_frozen_inputs");
    let d = dev();
    let (rows, c) = (37, 300);
    let (x, w, b, g) = (
        rng.vec(rows * c, -2.0, 2.0),
        rng.vec(c, 0.5, 1.5),
        rng.vec(c, -1.0, 1.0),
        rng.vec(rows * c, -1.0, 1.0),
    );
    for layer in [false, true] {
        let grads = |trained: [bool; 3]| -> Vec<Option<Vec<f32>>> {
            let t = |v: &[f32], shape: &[usize], train: bool| {
                let t = Tensor::from_slice(v, shape, &d).unwrap();
                if train { t.requires_grad_() } else { t }
            };
            let (xt, wt, bt) = (
                t(&x, &[rows, c], trained[0]),
                t(&w, &[c], trained[1]),
                t(&b, &[c], trained[2]),
            );
            let y = if layer {
                xt.layer_norm(Some(&wt), Some(&bt), 1e-5)
            } else {
                xt.rms_norm(Some(&wt), 1e-5)
            }
            .unwrap();
            let gt = Tensor::from_slice(&g, &[rows, c], &d).unwrap();
            y.mul(&gt).unwrap().sum_all().unwrap().backward().unwrap();
            [xt, wt, bt]
                .iter()
                .map(|t| t.grad().map(|g| g.to_f32_vec().unwrap()))
                .collect()
        };
        let all = grads([true, true, layer]);
        for (k, want) in all.iter().enumerate().take(if layer { 3 } else { 2 }) {
            let mut trained = [false; 3];
            trained[k] = true;
            let got = grads(trained);
            assert_eq!(&got[k], want, "layer={layer}: gradient {k} alone");
            assert!(got.iter().enumerate().all(|(j, g)| j == k || g.is_none()));
        }
    }
}

#[test]
fn norm_rejects_bad_arguments() {
    let d = dev();
    let x = Tensor::zeros(&[2, 4], DType::F32, &d).unwrap();
    let w3 = Tensor::ones(&[3], DType::F32, &d).unwrap();
    let w2d = Tensor::ones(&[1, 4], DType::F32, &d).unwrap();
    let wi = Tensor::zeros(&[4], DType::I32, &d).unwrap();
    assert!(x.rms_norm(Some(&w3), 1e-5).is_err());
    assert!(x.rms_norm(Some(&w2d), 1e-5).is_err());
    assert!(x.rms_norm(Some(&wi), 1e-5).is_err());
    assert!(x.layer_norm(None, Some(&w3), 1e-5).is_err());
    assert!(
        Tensor::zeros(&[2, 4], DType::I32, &d)
            .unwrap()
            .rms_norm(None, 1e-5)
            .is_err()
    );
    assert!(
        Tensor::zeros(&[], DType::F32, &d)
            .unwrap()
            .layer_norm(None, None, 1e-5)
            .is_err()
    );
    // The longest rows the backward takes, then longer ones: the forward runs, the backward names the limit.
    let c = 1 << 16;
    let (x, w) = (
        Tensor::ones(&[1, c], DType::F32, &d).unwrap().requires_grad_(),
        Tensor::ones(&[c], DType::F32, &d).unwrap().requires_grad_(),
    );
    x.rms_norm(Some(&w), 1e-5)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert!(
        w.grad()
            .unwrap()
            .to_f32_vec()
            .unwrap()
            .iter()
            .all(|&v| (v - 1.0).abs() < 1e-5)
    );
    let long = Tensor::zeros(&[1, (1 << 16) + 1], DType::F32, &d)
        .unwrap()
        .requires_grad_();
    let y = long.rms_norm(None, 1e-5).unwrap();
    let err = y.sum_all().unwrap().backward().unwrap_err();
    assert!(err.to_string().contains("longer than the backward takes"), "{err}");
}

/// A `rows x c` tensor of `dtype` holding `vals` (row-major), viewed through `layout`: contiguous, transposed
/// (column stride `rows`) or narrowed out of rows of `c + 5` elements (filled around with garbage).
fn view(rng: &mut Rng, vals: &[f32], rows: usize, c: usize, dtype: DType, layout: &str) -> Tensor {
    let d = dev();
    let base = |host: &[f32], shape: &[usize]| Tensor::from_slice(host, shape, &d).unwrap().to_dtype(dtype).unwrap();
    let t = match layout {
        "transposed" => {
            let host: Vec<f32> = (0..c * rows).map(|i| vals[(i % rows) * c + i / rows]).collect();
            base(&host, &[c, rows]).t().unwrap()
        }
        "narrowed" => {
            let mut host = rng.vec(rows * (c + 5), -9.0, 9.0);
            for r in 0..rows {
                host[r * (c + 5) + 2..r * (c + 5) + 2 + c].copy_from_slice(&vals[r * c..(r + 1) * c]);
            }
            base(&host, &[rows, c + 5]).narrow(-1, 2, c).unwrap()
        }
        _ => base(vals, &[rows, c]),
    };
    assert_eq!(t.is_contiguous(), layout == "contiguous", "{layout} view");
    t
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_f32_vec().unwrap().iter().map(|v| v.to_bits()).collect()
}

/// `add_rms_norm` of `rows x c` inputs laid out as `layouts` against `x.add(r)?.rms_norm(w, eps)` (bit for bit) and
/// against the f64 reference.
fn check_add(rng: &mut Rng, rows: usize, c: usize, with_w: bool, dtype: DType, layouts: [&str; 2]) {
    let d = dev();
    let x = rounded(&rng.vec(rows * c, -2.0, 2.0), dtype);
    let r = rounded(&rng.vec(rows * c, -2.0, 2.0), dtype);
    let w = rounded(&rng.vec(c, 0.5, 1.5), dtype);
    let eps = 1e-5;
    let (xt, rt) = (
        view(rng, &x, rows, c, dtype, layouts[0]),
        view(rng, &r, rows, c, dtype, layouts[1]),
    );
    let wt = Tensor::from_slice(&w, &[c], &d).unwrap().to_dtype(dtype).unwrap();
    let wo = with_w.then_some(&wt);
    let (sum, normed) = xt.add_rms_norm(&rt, wo, eps).unwrap();
    let what = format!("add_rms_norm {rows}x{c} {dtype} {layouts:?} w={with_w}");
    for t in [&sum, &normed] {
        assert_eq!(t.shape(), &[rows, c], "{what}");
        assert_eq!(t.dtype(), dtype, "{what}");
        assert!(t.is_contiguous(), "{what}");
    }
    let want_sum = xt.add(&rt).unwrap();
    let want_normed = want_sum.rms_norm(wo, eps).unwrap();
    assert_eq!(bits(&sum), bits(&want_sum), "{what}: sum differs from add");
    assert_eq!(
        bits(&normed),
        bits(&want_normed),
        "{what}: normed differs from add + rms_norm"
    );
    let exact: Vec<f64> = x.iter().zip(&r).map(|(&a, &b)| a as f64 + b as f64).collect();
    let rtol = if dtype == DType::F32 { 1e-6 } else { 1e-2 };
    assert_close(&format!("{what}: sum"), &sum.to_f32_vec().unwrap(), &exact, rtol, 0.0);
    let s = sum.to_f32_vec().unwrap();
    let want = reference(&s, wo.map(|_| &w[..]), None, &vec![0.0; s.len()], c, false, eps);
    let (rtol, atol) = if dtype == DType::F32 {
        (1e-5, 1e-5)
    } else {
        (1e-2, 1e-2)
    };
    assert_close(
        &format!("{what}: normed"),
        &normed.to_f32_vec().unwrap(),
        &want.y,
        rtol,
        atol,
    );
}

#[test]
fn add_rms_norm_matches_unfused_bitwise() {
    let mut rng = Rng::new("add_rms_norm_matches_unfused_bitwise");
    for c in [1, 3, 17, 257, 1000] {
        check_add(&mut rng, 3, c, true, DType::F32, ["contiguous"; 2]);
    }
    check_add(&mut rng, 5, 17, false, DType::F32, ["contiguous"; 2]);
    check_add(&mut rng, 150, 5, true, DType::F32, ["contiguous"; 2]);
}

#[test]
fn add_rms_norm_in_16_bit() {
    let mut rng = Rng::new("add_rms_norm_in_16_bit");
    for dtype in [DType::F16, DType::BF16] {
        // Even rows are written directly; odd rows share output words and go through f32.
        check_add(&mut rng, 3, 16, true, dtype, ["contiguous"; 2]);
        check_add(&mut rng, 3, 17, true, dtype, ["contiguous"; 2]);
        check_add(&mut rng, 2, 1, false, dtype, ["contiguous"; 2]);
        check_add(&mut rng, 2, 300, true, dtype, ["contiguous"; 2]);
    }
}

#[test]
fn add_rms_norm_reads_strided_rows() {
    let mut rng = Rng::new("add_rms_norm_reads_strided_rows");
    check_add(&mut rng, 4, 17, true, DType::F32, ["transposed", "contiguous"]);
    check_add(&mut rng, 3, 300, true, DType::F32, ["contiguous", "narrowed"]);
    check_add(&mut rng, 5, 9, false, DType::F32, ["narrowed", "transposed"]);
    check_add(&mut rng, 3, 10, true, DType::BF16, ["transposed", "narrowed"]);
    check_add(&mut rng, 3, 9, true, DType::F16, ["narrowed", "transposed"]);
}

#[test]
fn add_rms_norm_of_empty_tensors() {
    let d = dev();
    for shape in [[0usize, 5], [4, 0]] {
        let c = shape[1];
        let x = Tensor::zeros(&shape, DType::F32, &d).unwrap().requires_grad_();
        let r = Tensor::zeros(&shape, DType::F32, &d).unwrap().requires_grad_();
        let w = Tensor::ones(&[c], DType::F32, &d).unwrap().requires_grad_();
        let (sum, normed) = x.add_rms_norm(&r, Some(&w), 1e-5).unwrap();
        assert_eq!(sum.shape(), &shape);
        assert_eq!(normed.shape(), &shape);
        let loss = sum.sum_all().unwrap().add(&normed.sum_all().unwrap()).unwrap();
        loss.backward().unwrap();
        assert_eq!(x.grad().unwrap().shape(), &shape);
        assert_eq!(r.grad().unwrap().shape(), &shape);
        assert_eq!(w.grad().unwrap().to_vec::<f32>().unwrap(), vec![0.0; c]);
    }
}

#[test]
fn add_rms_norm_gradcheck() {
    let mut rng = Rng::new("add_rms_norm_gradcheck");
    let (x, r, w) = (rng.vec(10, -2.0, 2.0), rng.vec(10, -2.0, 2.0), rng.vec(5, 0.5, 1.5));
    let inputs = [(x, vec![2, 5]), (r, vec![2, 5]), (w, vec![5])];
    // Both outputs at once, with independent random weights on each.
    gradcheck("add_rms_norm (sum, normed)", &mut rng, &inputs, |t| {
        let (sum, normed) = t[0].add_rms_norm(&t[1], Some(&t[2]), 1e-5)?;
        Tensor::cat(&[normed, sum], 0)
    });
    gradcheck("add_rms_norm normed only", &mut rng, &inputs, |t| {
        Ok(t[0].add_rms_norm(&t[1], Some(&t[2]), 1e-5)?.1)
    });
    gradcheck("add_rms_norm sum only", &mut rng, &inputs, |t| {
        Ok(t[0].add_rms_norm(&t[1], Some(&t[2]), 1e-5)?.0)
    });
    gradcheck("add_rms_norm without weight", &mut rng, &inputs[..2], |t| {
        let (sum, normed) = t[0].add_rms_norm(&t[1], None, 1e-5)?;
        Tensor::cat(&[normed, sum], 0)
    });
}

#[test]
fn add_rms_norm_gradients_match_unfused() {
    let d = dev();
    let mut rng = Rng::new("add_rms_norm_gradients_match_unfused");
    let (rows, c) = (3, 33);
    let leaf = |v: &[f32], shape: &[usize]| Tensor::from_slice(v, shape, &d).unwrap().requires_grad_();
    let (x, r, w) = (
        rng.vec(rows * c, -2.0, 2.0),
        rng.vec(rows * c, -2.0, 2.0),
        rng.vec(c, 0.5, 1.5),
    );
    let g1 = Tensor::from_slice(&rng.vec(rows * c, -1.0, 1.0), &[rows, c], &d).unwrap();
    let g2 = Tensor::from_slice(&rng.vec(rows * c, -1.0, 1.0), &[rows, c], &d).unwrap();
    // Only x requires a gradient on the fused side of the second case: the residual is a plain tensor.
    for r_trains in [true, false] {
        let grads = |fused: bool| -> Vec<Vec<u32>> {
            let (xt, wt) = (leaf(&x, &[rows, c]), leaf(&w, &[c]));
            let rt = Tensor::from_slice(&r, &[rows, c], &d).unwrap();
            let rt = if r_trains { rt.requires_grad_() } else { rt };
            let (sum, normed) = if fused {
                xt.add_rms_norm(&rt, Some(&wt), 1e-5).unwrap()
            } else {
                let sum = xt.add(&rt).unwrap();
                let normed = sum.rms_norm(Some(&wt), 1e-5).unwrap();
                (sum, normed)
            };
            let loss = normed.mul(&g1).unwrap().sum_all().unwrap();
            let loss = loss.add(&sum.mul(&g2).unwrap().sum_all().unwrap()).unwrap();
            loss.backward().unwrap();
            let mut out = vec![bits(&xt.grad().unwrap()), bits(&wt.grad().unwrap())];
            out.extend(rt.grad().map(|g| bits(&g)));
            out
        };
        let (fused, unfused) = (grads(true), grads(false));
        assert_eq!(fused.len(), if r_trains { 3 } else { 2 });
        for (k, (a, b)) in fused.iter().zip(&unfused).enumerate() {
            assert_eq!(a, b, "gradient {k} (x, w, r) with r_trains={r_trains}");
        }
    }
}

#[test]
fn add_rms_norm_rejects_bad_arguments() {
    let d = dev();
    let x = Tensor::zeros(&[2, 4], DType::F32, &d).unwrap();
    let zeros = |shape: &[usize], dtype: DType| Tensor::zeros(shape, dtype, &d).unwrap();
    // No broadcasting: the residual must have x's shape exactly.
    for shape in [&[2, 3][..], &[4], &[1, 4], &[4, 2]] {
        assert!(
            x.add_rms_norm(&zeros(shape, DType::F32), None, 1e-5).is_err(),
            "{shape:?}"
        );
    }
    assert!(x.add_rms_norm(&zeros(&[2, 4], DType::BF16), None, 1e-5).is_err());
    assert!(x.add_rms_norm(&x, Some(&zeros(&[3], DType::F32)), 1e-5).is_err());
    assert!(x.add_rms_norm(&x, Some(&zeros(&[4], DType::I32)), 1e-5).is_err());
    let xi = zeros(&[2, 4], DType::I32);
    assert!(xi.add_rms_norm(&xi, None, 1e-5).is_err());
    let s = zeros(&[], DType::F32);
    assert!(s.add_rms_norm(&s, None, 1e-5).is_err());
    assert!(x.add_rms_norm(&x, None, 1e-5).is_ok());
}

/// The add, the statistics and the normalization are one kernel launch, with or without autograd recording
/// (counted on a private device, so that tests running in parallel do not interfere).
#[test]
fn add_rms_norm_is_one_launch() {
    let d = own_dev();
    for dtype in [DType::F32, DType::BF16] {
        let x = Tensor::from_slice(&[0.5f32; 2 * 64], &[2, 64], &d)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let r = Tensor::from_slice(&[1.5f32; 64 * 2], &[64, 2], &d)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
            .t()
            .unwrap();
        let w = Tensor::from_slice(&[3.0f32; 64], &[64], &d)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        for x in [x.clone(), x.requires_grad_()] {
            let before = d.dispatch_count();
            let (sum, normed) = x.add_rms_norm(&r, Some(&w), 1e-5).unwrap();
            assert_eq!(d.dispatch_count() - before, 1, "{dtype}");
            assert_eq!(sum.to_f32_vec().unwrap(), vec![2.0; 2 * 64]);
            assert_close(
                &format!("{dtype} normed"),
                &normed.to_f32_vec().unwrap(),
                &[3.0; 2 * 64],
                1e-5,
                0.0,
            );
        }
    }
}

/// RMSNorm over f32 rows that start on quads runs a row per subgroup (where the device has subgroups) and must
/// give the row kernel's bits, which a view starting between quads still takes: forward, the sum of
/// `add_rms_norm`, and the gradients of the input, the residual and the weight (from the statistics it saved).
#[test]
fn rms_norm_on_quads_gives_the_row_kernels_bits() {
    let d = dev();
    let mut rng = Rng::new("rms_norm_on_quads");
    for (rows, c, with_w) in [
        (37, 64, true),
        (5, 1024, true),
        (3, 300, false),
        (2, 4, true),
        (9, 20, true),
    ] {
        let vals = rng.vec(rows * c, -3.0, 3.0);
        let res = rng.vec(rows * c, -3.0, 3.0);
        let coef = Tensor::from_slice(&rng.vec(rows * c, -1.0, 1.0), &[rows, c], &d).unwrap();
        let w = Tensor::from_slice(&rng.vec(c, 0.5, 1.5), &[c], &d).unwrap();
        let run = |layout: &str| {
            let mut rng = Rng::new("rms_norm_on_quads_padding");
            let leaves = [
                view(&mut rng, &vals, rows, c, DType::F32, layout),
                view(&mut rng, &res, rows, c, DType::F32, layout),
            ];
            let (xl, rl) = (leaves[0].detach().requires_grad_(), leaves[1].detach().requires_grad_());
            let wl = w.detach().requires_grad_();
            let (x, r) = (&xl, &rl);
            let weight = with_w.then_some(&wl);
            let y = x.rms_norm(weight, 1e-5).unwrap();
            let (sum, z) = x.add_rms_norm(r, weight, 1e-5).unwrap();
            y.add(&z)
                .unwrap()
                .mul(&coef)
                .unwrap()
                .sum(&[0, 1], false)
                .unwrap()
                .backward()
                .unwrap();
            let mut out = vec![
                bits(&y),
                bits(&sum),
                bits(&z),
                bits(&xl.grad().unwrap()),
                bits(&rl.grad().unwrap()),
            ];
            if with_w {
                out.push(bits(&wl.grad().unwrap()));
            }
            out
        };
        let (quads, rows_kernel) = (run("contiguous"), run("narrowed"));
        for (k, name) in ["y", "sum", "normed sum", "x grad", "residual grad", "weight grad"]
            .iter()
            .enumerate()
            .take(quads.len())
        {
            assert_eq!(quads[k], rows_kernel[k], "{rows} x {c}: {name}");
        }
    }
}

/// The gradient a norm's input already has from its other reader (the residual stream, in a transformer) is
/// added by the norm's backward kernel as it stores an f32 dx: the bits of that gradient plus the norm's own,
/// added apart, with one launch fewer than when the input is a leaf (whose gradient is added to after). 16-bit
/// inputs add after the kernel. Also when that gradient is a transposed view.
#[test]
fn norm_backward_adds_the_gradient_gathered_for_its_input() {
    let d = own_dev();
    let mut rng = Rng::new("norm_backward_adds_the_gradient_gathered_for_its_input");
    // Rows of 64 take the RMSNorm kernel on quads where the device has subgroups, and rows of 33 the row kernel.
    for (layer, dtype, transposed, c) in [
        (false, DType::F32, false, 33),
        (false, DType::F32, true, 33),
        (true, DType::F32, false, 33),
        (false, DType::BF16, false, 33),
        (false, DType::F32, false, 64),
        (false, DType::F32, true, 64),
        (true, DType::F32, false, 64),
    ] {
        let rows = 5;
        let what = format!("layer={layer} {dtype} transposed={transposed} c={c}");
        let tensor = |v: &[f32], shape: &[usize]| Tensor::from_slice(v, shape, &d).unwrap().to_dtype(dtype).unwrap();
        let (x, r, w) = (
            rng.vec(rows * c, -2.0, 2.0),
            rng.vec(rows * c, -2.0, 2.0),
            rng.vec(c, 0.5, 1.5),
        );
        let (g1, g2) = (
            tensor(&rng.vec(rows * c, -1.0, 1.0), &[rows, c]),
            rng.vec(rows * c, -1.0, 1.0),
        );
        // The other reader's gradient: g2, as a [rows, c] tensor or the transpose of a [c, rows] one.
        let g2 = if transposed {
            tensor(&g2, &[c, rows])
        } else {
            tensor(&g2, &[rows, c])
        };
        let norm = |h: &Tensor, w: &Tensor| match layer {
            true => h.layer_norm(Some(w), None, 1e-5),
            false => h.rms_norm(Some(w), 1e-5),
        };
        // `h` read by the norm and by the loss directly; its gradient as computed and the launches of backward.
        let run = |h: &Tensor, w: &Tensor| -> u64 {
            let other = match transposed {
                true => h.t().unwrap().mul(&g2).unwrap(),
                false => h.mul(&g2).unwrap(),
            };
            let loss = norm(h, w).unwrap().mul(&g1).unwrap().sum_all().unwrap();
            let loss = loss.add(&other.sum_all().unwrap()).unwrap();
            let before = d.dispatch_count();
            loss.backward().unwrap();
            d.dispatch_count() - before
        };
        let (xt, wt) = (
            tensor(&x, &[rows, c]).requires_grad_(),
            tensor(&w, &[c]).requires_grad_(),
        );
        let h = xt.add(&tensor(&r, &[rows, c])).unwrap();
        let fused_launches = run(&h, &wt);
        let got = xt.grad().unwrap();
        // The same graph on a leaf holding h's values: backward adds the two gradients in a launch of its own.
        let (leaf, wt2) = (h.detach().requires_grad_(), tensor(&w, &[c]).requires_grad_());
        let leaf_launches = run(&leaf, &wt2);
        let want_launches = if dtype == DType::F32 {
            leaf_launches - 1
        } else {
            leaf_launches
        };
        assert_eq!(fused_launches, want_launches, "{what}: launches of backward");
        // The norm's own gradient apart, plus the other reader's.
        let alone = h.detach().requires_grad_();
        norm(&alone, &tensor(&w, &[c]))
            .unwrap()
            .mul(&g1)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let other = if transposed { g2.t().unwrap() } else { g2.clone() };
        let want = other.add(&alone.grad().unwrap()).unwrap();
        assert_eq!(bits(&got), bits(&want), "{what}: gradient of the input");
        assert_eq!(bits(&leaf.grad().unwrap()), bits(&want), "{what}: gradient of the leaf");
        assert_eq!(
            bits(&wt.grad().unwrap()),
            bits(&wt2.grad().unwrap()),
            "{what}: gradient of the weight"
        );
    }
}
