//! Matrix products against an f64 CPU reference: odd sizes, strided views, broadcast batches, 1-D operands,
//! empty shapes, 16-bit dtypes, both tile configurations, gradients and refused inputs.

mod common;

use common::*;
use hierarchos::core::{DType, Gpu, GpuOptions, Tensor, autocast, autocast_dtype};

/// A tensor of random values in [-1, 1) with `shape`, and its values (after rounding to `dtype`) as f32.
fn random(rng: &mut Rng, shape: &[usize], dtype: DType) -> (Tensor, Vec<f32>) {
    let n = shape.iter().product();
    let t = Tensor::from_slice(&rng.vec(n, -1.0, 1.0), shape, &dev())
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let v = t.to_f32_vec().unwrap();
    (t, v)
}

/// The elements of view `t` of a tensor whose storage holds `base`, in row-major order.
fn host(t: &Tensor, base: &[f32]) -> Vec<f64> {
    let l = t.layout();
    strided_indices(&l.shape, &l.strides, l.offset)
        .into_iter()
        .map(|i| base[i] as f64)
        .collect()
}

/// `torch.matmul` on row-major host data, accumulating in f64: the values and the shape of the result.
fn reference(a: &[f64], sa: &[usize], b: &[f64], sb: &[usize]) -> (Vec<f64>, Vec<usize>) {
    let sa2 = if sa.len() == 1 { vec![1, sa[0]] } else { sa.to_vec() };
    let sb2 = if sb.len() == 1 { vec![sb[0], 1] } else { sb.to_vec() };
    let (ra, rb) = (sa2.len(), sb2.len());
    let (m, k, n) = (sa2[ra - 2], sa2[ra - 1], sb2[rb - 1]);
    assert_eq!(k, sb2[rb - 2]);
    let nb = (ra - 2).max(rb - 2);
    let dim = |s: &[usize], d: usize| {
        let lead = nb - (s.len() - 2);
        if d < lead { 1 } else { s[d - lead] }
    };
    let batch: Vec<usize> = (0..nb).map(|d| dim(&sa2, d).max(dim(&sb2, d))).collect();
    let count: usize = batch.iter().product();
    let mut out = vec![0.0; count * m * n];
    for bi in 0..count {
        let (mut rem, mut ia, mut ib, mut stride_a, mut stride_b) = (bi, 0, 0, 1, 1);
        for d in (0..nb).rev() {
            let i = rem % batch[d];
            rem /= batch[d];
            let (da, db) = (dim(&sa2, d), dim(&sb2, d));
            ia += if da == 1 { 0 } else { i * stride_a };
            ib += if db == 1 { 0 } else { i * stride_b };
            stride_a *= da;
            stride_b *= db;
        }
        for r in 0..m {
            for c in 0..n {
                out[(bi * m + r) * n + c] = (0..k).map(|j| a[(ia * m + r) * k + j] * b[(ib * k + j) * n + c]).sum();
            }
        }
    }
    let mut shape = batch;
    if sa.len() > 1 {
        shape.push(m);
    }
    if sb.len() > 1 {
        shape.push(n);
    }
    (out, shape)
}

/// Multiplies the views `a` and `b` (of storage holding `base_a`, `base_b`) and compares with the reference.
/// f32 gets 1e-5 relative plus 1e-6 per term of the sum (each |a b| <= 1); 16-bit types 1e-2 relative.
fn check(what: &str, a: &Tensor, base_a: &[f32], b: &Tensor, base_b: &[f32]) {
    let got = a.matmul(b).unwrap();
    let (want, shape) = reference(&host(a, base_a), a.shape(), &host(b, base_b), b.shape());
    assert_eq!(got.shape(), &shape[..], "{what}: shape");
    assert_eq!(got.dtype(), a.dtype(), "{what}: dtype");
    let k = a.shape()[a.rank() - 1] as f64;
    let (rtol, atol) = if a.dtype() == DType::F32 {
        (1e-5, 1e-6 * k)
    } else {
        (1e-2, 1e-3)
    };
    assert_close(what, &got.to_f32_vec().unwrap(), &want, rtol, atol);
}

/// Contiguous operands of shapes `sa` and `sb`.
fn check_shapes(rng: &mut Rng, sa: &[usize], sb: &[usize], dtype: DType) {
    let (a, va) = random(rng, sa, dtype);
    let (b, vb) = random(rng, sb, dtype);
    check(&format!("{sa:?} @ {sb:?} {dtype}"), &a, &va, &b, &vb);
}

#[test]
fn matrix_sizes() {
    let mut rng = Rng::new("matrix_sizes");
    for (m, k, n) in [
        (1, 1, 1),
        (3, 17, 5),
        (17, 257, 3),
        (64, 64, 64),
        (33, 65, 31),
        (1, 40, 70),
        (70, 3, 1),
        (5, 1, 6),
    ] {
        check_shapes(&mut rng, &[m, k], &[k, n], DType::F32);
    }
}

#[test]
fn strided_views() {
    let mut rng = Rng::new("strided_views");
    let (m, k, n) = (19, 23, 21);
    let (at, va) = random(&mut rng, &[k + 2, m + 3], DType::F32);
    let (bt, vb) = random(&mut rng, &[n + 1, k + 4], DType::F32);
    let (ar, var) = random(&mut rng, &[m + 1, k + 5], DType::F32);
    let (br, vbr) = random(&mut rng, &[k + 3, n + 2], DType::F32);
    // Transposed and narrowed on both sides: no operand is contiguous.
    let a_t = at.narrow(0, 1, k).unwrap().narrow(1, 2, m).unwrap().t().unwrap();
    let b_t = bt.narrow(0, 1, n).unwrap().narrow(1, 3, k).unwrap().t().unwrap();
    let a_r = ar.narrow(0, 1, m).unwrap().narrow(1, 4, k).unwrap();
    let b_r = br.narrow(0, 2, k).unwrap().narrow(1, 1, n).unwrap();
    check("a^T @ b^T", &a_t, &va, &b_t, &vb);
    check("a^T @ b", &a_t, &va, &b_r, &vbr);
    check("a @ b^T", &a_r, &var, &b_t, &vb);
    check("a @ b (narrowed)", &a_r, &var, &b_r, &vbr);
    // Rows of stride 2 (every other column of a wider matrix): neither dimension has unit stride.
    let (w, vw) = random(&mut rng, &[m, 2 * k], DType::F32);
    let a_s = w
        .reshape(&[m, k, 2])
        .unwrap()
        .narrow(2, 1, 1)
        .unwrap()
        .squeeze(2)
        .unwrap();
    check("a with stride 2", &a_s, &vw, &b_r, &vbr);
    // The same storage on both sides.
    let (x, vx) = random(&mut rng, &[9, 13], DType::F32);
    check("x @ x^T", &x, &vx, &x.t().unwrap(), &vx);
}

#[test]
fn broadcast_batches() {
    let mut rng = Rng::new("broadcast_batches");
    for (sa, sb) in [
        (vec![2, 1, 5, 7], vec![3, 7, 4]),
        (vec![4, 5, 7], vec![7, 3]),
        (vec![5, 7], vec![2, 7, 3]),
        (vec![2, 3, 1, 6], vec![1, 6, 9]),
        (vec![1, 3, 4, 2], vec![2, 1, 2, 5]),
        (vec![2, 1, 2, 1, 3, 4], vec![2, 1, 3, 4, 2]),
    ] {
        check_shapes(&mut rng, &sa, &sb, DType::F32);
    }
    // Permuted batch views: `a` cannot be folded into one tall matrix, `b` is transposed per batch entry.
    let (a, va) = random(&mut rng, &[6, 3, 5], DType::F32);
    let (b, vb) = random(&mut rng, &[3, 4, 5], DType::F32);
    let a_p = a.permute(&[1, 0, 2]).unwrap();
    check("permuted a @ b^T", &a_p, &va, &b.t().unwrap(), &vb);
    let (w, vw) = random(&mut rng, &[5, 7], DType::F32);
    check("permuted a @ shared w", &a_p, &va, &w, &vw);
    // More workgroups than one grid dimension holds (65535): the grid is folded into two dimensions.
    check_shapes(&mut rng, &[70_000, 1, 2], &[70_000, 2, 1], DType::F32);
    let (e, ve) = random(&mut rng, &[4, 1, 5], DType::F32);
    let a_e = e.broadcast_to(&[4, 3, 5]).unwrap();
    check("expanded rows @ w", &a_e, &ve, &w, &vw);
}

#[test]
fn vectors() {
    let mut rng = Rng::new("vectors");
    for (sa, sb) in [
        (vec![7], vec![7, 5]),
        (vec![6, 7], vec![7]),
        (vec![33], vec![33]),
        (vec![1], vec![1]),
        (vec![2, 3, 4, 7], vec![7]),
        (vec![7], vec![2, 7, 5]),
    ] {
        check_shapes(&mut rng, &sa, &sb, DType::F32);
    }
    let (v, vv) = random(&mut rng, &[3, 11], DType::F32);
    let (m, vm) = random(&mut rng, &[5, 11], DType::F32);
    let col = v.narrow(0, 1, 1).unwrap().squeeze(0).unwrap();
    check(
        "matrix @ strided vector",
        &m,
        &vm,
        &v.t().unwrap().narrow(1, 2, 1).unwrap().squeeze(1).unwrap(),
        &vv,
    );
    check("vector @ transposed matrix", &col, &vv, &m.t().unwrap(), &vm);
}

#[test]
fn empty_shapes() {
    let d = dev();
    for (sa, sb, want) in [
        (vec![0, 4], vec![4, 3], vec![0, 3]),
        (vec![3, 4], vec![4, 0], vec![3, 0]),
        (vec![0, 3, 4], vec![4, 2], vec![0, 3, 2]),
        (vec![2, 0, 3, 4], vec![1, 4, 2], vec![2, 0, 3, 2]),
        (vec![0], vec![0, 3], vec![3]),
    ] {
        let a = Tensor::zeros(&sa, DType::F32, &d).unwrap();
        let b = Tensor::zeros(&sb, DType::F32, &d).unwrap();
        let c = a.matmul(&b).unwrap();
        assert_eq!(c.shape(), &want[..], "{sa:?} @ {sb:?}");
        assert!(c.to_f32_vec().unwrap().iter().all(|&x| x == 0.0));
    }
    // K = 0: the sum over nothing is zero, whatever was in the output buffer before.
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let a = Tensor::zeros(&[3, 0], dtype, &d).unwrap();
        let b = Tensor::zeros(&[2, 0, 5], dtype, &d).unwrap();
        let c = a.matmul(&b).unwrap();
        assert_eq!(c.shape(), &[2, 3, 5]);
        assert_eq!(c.dtype(), dtype);
        assert_eq!(c.to_f32_vec().unwrap(), vec![0.0; 30]);
    }
    // Empty results keep the operands' dtype, also where a product would go through an f32 buffer (odd N, few
    // rows against a transposed weight).
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (sa, sb, want) in [
            (vec![0, 4], vec![4, 3], vec![0, 3]),
            (vec![2, 0, 3], vec![3, 5], vec![2, 0, 5]),
            (vec![0, 4], vec![4], vec![0]),
        ] {
            let a = Tensor::zeros(&sa, dtype, &d).unwrap();
            let c = a.matmul(&Tensor::zeros(&sb, dtype, &d).unwrap()).unwrap();
            assert_eq!((c.shape(), c.dtype()), (&want[..], dtype), "{sa:?} @ {sb:?}");
        }
        let w = Tensor::zeros(&[0, 4], dtype, &d).unwrap();
        let c = Tensor::zeros(&[3, 4], dtype, &d)
            .unwrap()
            .matmul(&w.t().unwrap())
            .unwrap();
        assert_eq!((c.shape(), c.dtype()), (&[3, 0][..], dtype), "x @ W.t() with W [0, 4]");
    }
}

#[test]
fn half_precision() {
    let mut rng = Rng::new("half_precision");
    for dtype in [DType::F16, DType::BF16] {
        // Odd and even N (odd N goes through an f32 result and a cast when 16-bit values are packed).
        for (sa, sb) in [
            (vec![3, 17], vec![17, 5]),
            (vec![17, 33], vec![33, 4]),
            (vec![2, 1, 9, 8], vec![3, 8, 7]),
            (vec![5], vec![5, 6]),
        ] {
            check_shapes(&mut rng, &sa, &sb, dtype);
        }
        let (a, va) = random(&mut rng, &[10, 7], dtype);
        let (b, vb) = random(&mut rng, &[12, 10], dtype);
        check(
            &format!("a^T @ b^T {dtype}"),
            &a.t().unwrap(),
            &va,
            &b.t().unwrap(),
            &vb,
        );
    }
}

/// Outputs of at least 256 tiles of 128 x 128 switch to big tiles (fewer, but at least 256 of half that size, to
/// 128 x 64 tiles for f32, 64 x 128 for 16-bit dtypes); K stays small so that a CPU device finishes quickly, but
/// one product takes three staged slices of K (the last partial). M and N are not multiples of 128, so edge tiles
/// are partial.
#[test]
fn large_tiles() {
    let mut rng = Rng::new("large_tiles");
    check_shapes(&mut rng, &[4, 700, 3], &[3, 1500], DType::F32);
    let (a, va) = random(&mut rng, &[256, 128, 3], DType::F32);
    let (b, vb) = random(&mut rng, &[256, 128, 3], DType::F32);
    check("batched a @ b^T, large tiles", &a, &va, &b.t().unwrap(), &vb);
    check_shapes(&mut rng, &[4, 1100, 37], &[37, 1050], DType::F32);
    check_shapes(&mut rng, &[2100, 5], &[5, 2000], DType::BF16);
    check_shapes(&mut rng, &[1100, 5], &[5, 1800], DType::BF16);
    check_shapes(&mut rng, &[2000, 4], &[4, 2111], DType::F16);
}

/// Every pairing of operand layouts (A unit-stride along K or M, B along K or N), where the f32 operands load as
/// vec4s (dimensions, offsets and strides multiples of 4) and where one of them cannot (an offset of 1, a
/// dimension of 4n + 2), in each f32 tile shape (64 x 64; 128 x 64 from 256 such tiles; 128 x 128 from 256 such
/// tiles) with partial edge tiles.
#[test]
fn every_operand_layout() {
    let mut rng = Rng::new("every_operand_layout");
    for (batch, m, k, n, shift) in [
        (1, 68, 36, 132, 4),
        (1, 4, 4, 4, 0),
        (1, 70, 38, 130, 1),
        (3, 36, 20, 12, 1),
        (1, 1100, 8, 1800, 4),
        (1, 1102, 6, 1802, 1),
        (3, 1156, 8, 1036, 4),
    ] {
        // Each operand comes as a narrowed row-major matrix and as the transpose of one.
        let (ar, var) = random(&mut rng, &[batch, m, k + shift], DType::F32);
        let (at, vat) = random(&mut rng, &[batch, k, m + shift], DType::F32);
        let (br, vbr) = random(&mut rng, &[batch, k, n + shift], DType::F32);
        let (bt, vbt) = random(&mut rng, &[batch, n, k + shift], DType::F32);
        let a_rows = ar.narrow(2, shift, k).unwrap();
        let a_cols = at.narrow(2, shift, m).unwrap().transpose(1, 2).unwrap();
        let b_rows = br.narrow(2, shift, n).unwrap();
        let b_cols = bt.narrow(2, shift, k).unwrap().transpose(1, 2).unwrap();
        for (an, a, va) in [("a", &a_rows, &var), ("a^T", &a_cols, &vat)] {
            for (bn, b, vb) in [("b", &b_rows, &vbr), ("b^T", &b_cols, &vbt)] {
                check(&format!("{an} @ {bn} {batch}x{m}x{k}x{n} shift {shift}"), a, va, b, vb);
            }
        }
    }
}

#[test]
fn gradients() {
    let mut rng = Rng::new("gradients");
    let mut data = |shape: &[usize]| (rng.vec(shape.iter().product(), -1.0, 1.0), shape.to_vec());
    let cases = [
        ("2-D", data(&[3, 4]), data(&[4, 5])),
        ("broadcast batch", data(&[2, 1, 3, 4]), data(&[3, 4, 2])),
        ("batch @ shared matrix", data(&[2, 3, 4]), data(&[4, 2])),
        ("matrix @ batch", data(&[3, 4]), data(&[2, 4, 2])),
        ("vector @ matrix", data(&[4]), data(&[4, 3])),
        ("batch @ vector", data(&[2, 3, 4]), data(&[4])),
        ("dot", data(&[5]), data(&[5])),
    ];
    let mut rng = Rng::new("gradients/weights");
    for (what, a, b) in cases {
        gradcheck(what, &mut rng, &[a, b], |t| t[0].matmul(&t[1]));
    }
    let (a, b) = (
        (rng.vec(12, -1.0, 1.0), vec![4, 3]),
        (rng.vec(10, -1.0, 1.0), vec![5, 2]),
    );
    gradcheck("transposed views", &mut rng, &[a, b], |t| {
        t[0].t()?.matmul(&t[1].narrow(0, 1, 4)?)
    });
}

#[test]
fn half_precision_gradient_dtypes() {
    let d = dev();
    let a = Tensor::ones(&[2, 3, 4], DType::BF16, &d).unwrap().requires_grad_();
    let b = Tensor::ones(&[4, 5], DType::BF16, &d).unwrap().requires_grad_();
    a.matmul(&b)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let (ga, gb) = (a.grad().unwrap(), b.grad().unwrap());
    assert_eq!((ga.dtype(), ga.shape()), (DType::BF16, &[2, 3, 4][..]));
    assert_eq!((gb.dtype(), gb.shape()), (DType::BF16, &[4, 5][..]));
    assert_eq!(ga.to_f32_vec().unwrap(), vec![5.0; 24]);
    assert_eq!(gb.to_f32_vec().unwrap(), vec![6.0; 20]);
}

#[test]
fn empty_gradients() {
    let d = dev();
    let a = Tensor::zeros(&[2, 3, 0], DType::F32, &d).unwrap().requires_grad_();
    let b = Tensor::zeros(&[0, 4], DType::F32, &d).unwrap().requires_grad_();
    let c = a.matmul(&b).unwrap();
    assert_eq!(c.shape(), &[2, 3, 4]);
    c.sum_all().unwrap().backward().unwrap();
    assert_eq!(a.grad().unwrap().shape(), &[2, 3, 0]);
    assert_eq!(b.grad().unwrap().shape(), &[0, 4]);
}

#[test]
fn refused_inputs() {
    let d = dev();
    let t = |shape: &[usize], dtype| Tensor::zeros(shape, dtype, &d).unwrap();
    let f = DType::F32;
    let scalar = Tensor::from_slice(&[1.0f32], &[], &d).unwrap();
    assert!(scalar.matmul(&t(&[3], f)).is_err(), "rank 0 left");
    assert!(t(&[3], f).matmul(&scalar).is_err(), "rank 0 right");
    assert!(t(&[2, 3], f).matmul(&t(&[4, 5], f)).is_err(), "K mismatch");
    assert!(t(&[3], f).matmul(&t(&[4], f)).is_err(), "dot length mismatch");
    assert!(
        t(&[2, 3], f).matmul(&t(&[3, 5], DType::U32)).is_err(),
        "float times integer"
    );
    assert!(
        t(&[2, 3], DType::U32).matmul(&t(&[3, 5], DType::U32)).is_err(),
        "integer dtype"
    );
    assert!(
        t(&[2, 4, 3], f).matmul(&t(&[3, 3, 5], f)).is_err(),
        "batch dims do not broadcast"
    );
    // A mismatch names the shapes as given, vectors included.
    let message = t(&[5, 3], f).matmul(&t(&[4], f)).unwrap_err().to_string();
    assert!(
        message.contains("[5, 3]") && message.contains("[4]") && !message.contains("[4, 1]"),
        "{message}"
    );
}

/// A product recorded outside autocast keeps its precision when `backward()` runs inside an autocast scope: the
/// backward runs as its forward did, as in torch.
#[test]
fn backward_inside_autocast_runs_as_recorded() {
    let mut rng = Rng::new("backward_inside_autocast_runs_as_recorded");
    let d = dev();
    let (va, vb) = (rng.vec(24 * 300, -1.0, 1.0), rng.vec(300 * 16, -1.0, 1.0));
    let grads = |inside: Option<DType>| {
        let a = Tensor::from_slice(&va, &[24, 300], &d).unwrap().requires_grad_();
        let b = Tensor::from_slice(&vb, &[300, 16], &d).unwrap().requires_grad_();
        let y = a.matmul(&b).unwrap();
        let loss = y.mul(&y).unwrap().sum_all().unwrap();
        match inside {
            Some(half) => autocast(half, || loss.backward()).unwrap().unwrap(),
            None => loss.backward().unwrap(),
        }
        (
            a.grad().unwrap().to_f32_vec().unwrap(),
            b.grad().unwrap().to_f32_vec().unwrap(),
        )
    };
    let outside = grads(None);
    for half in [DType::F16, DType::BF16] {
        assert_eq!(grads(Some(half)), outside, "backward inside autocast({half})");
    }
}

/// f32 activations against a 16-bit weight (a frozen base held in f16 or bf16) and the other way round multiply
/// in f32 into an f32 result, in the tiled kernel (both tile sizes) and the skinny one; the gradient reaches the
/// f32 operand in f32 and a 16-bit one in its dtype.
#[test]
fn mixed_dtypes_multiply_in_f32() {
    let mut rng = Rng::new("mixed");
    for half in [DType::F16, DType::BF16] {
        for (m, k, n) in [(3, 17, 5), (70, 33, 130), (4, 64, 2500), (2300, 8, 260)] {
            let (x, vx) = random(&mut rng, &[m, k], DType::F32);
            let (w, vw) = random(&mut rng, &[n, k], half);
            let what = format!("f32 {m}x{k} @ {half} [{n}, {k}]^T");
            let got = x.matmul(&w.t().unwrap()).unwrap();
            assert_eq!(got.dtype(), DType::F32, "{what}");
            let (want, _) = reference(&host(&x, &vx), x.shape(), &host(&w.t().unwrap(), &vw), &[k, n]);
            assert_close(&what, &got.to_f32_vec().unwrap(), &want, 1e-5, 1e-6 * k as f64);
            let back = w.matmul(&x.t().unwrap()).unwrap();
            assert_eq!(back.dtype(), DType::F32, "{half} @ f32");
        }
    }
    let (x, _) = random(&mut rng, &[5, 12], DType::F32);
    let (w, _) = random(&mut rng, &[7, 12], DType::BF16);
    let x = x.requires_grad_();
    let w = w.requires_grad_();
    x.matmul(&w.t().unwrap())
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(x.grad().unwrap().dtype(), DType::F32);
    assert_eq!(w.grad().unwrap().dtype(), DType::BF16);
}

/// Few rows against a transposed weight (`x @ W.t()`, the decode shape) take the skinny kernel.
#[test]
fn skinny_products_against_transposed_weights() {
    let mut rng = Rng::new("skinny");
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (m, k, n) in [(1, 1, 1), (1, 17, 9), (3, 100, 33), (8, 64, 257), (2, 300, 8)] {
            let (a, va) = random(&mut rng, &[m, k], dtype);
            let (w, vw) = random(&mut rng, &[n, k], dtype);
            check(&format!("skinny {dtype} {m}x{k}x{n}"), &a, &va, &w.t().unwrap(), &vw);
        }
        // Batched, with the weight shared across the batch and per batch entry.
        let (a, va) = random(&mut rng, &[3, 2, 40], dtype);
        let (w, vw) = random(&mut rng, &[24, 40], dtype);
        check(&format!("skinny batch {dtype}"), &a, &va, &w.t().unwrap(), &vw);
        let (wb, vwb) = random(&mut rng, &[3, 24, 40], dtype);
        check(
            &format!("skinny batched weight {dtype}"),
            &a,
            &va,
            &wb.transpose(1, 2).unwrap(),
            &vwb,
        );
    }
    gradcheck(
        "skinny gradient",
        &mut rng,
        &[(rng_vec(3 * 5), vec![3, 5]), (rng_vec(4 * 5), vec![4, 5])],
        |t| t[0].matmul(&t[1].t()?),
    );
}

fn rng_vec(n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 37 % 11) as f32 - 5.0) / 4.0).collect()
}

#[test]
fn long_reductions_split_into_slices() {
    // Few output tiles and a long K: the product runs over slices of K side by side (the last one shorter than the
    // others), then adds them; as a weight gradient (a^T @ g) and batched.
    let mut rng = Rng::new("split_k");
    check_shapes(&mut rng, &[3, 2050], &[2050, 5], DType::F32);
    let (a, va) = random(&mut rng, &[1537, 17], DType::F32);
    let (g, vg) = random(&mut rng, &[1537, 9], DType::F32);
    check("a^T @ g over 1537 rows", &a.t().unwrap(), &va, &g, &vg);
    check_shapes(&mut rng, &[2, 4, 1100], &[2, 1100, 3], DType::F32);
    check_shapes(&mut rng, &[3, 2050], &[2050, 5], DType::F16);
    // Under one wave of tiles, reductions from 512 steps are cut into slices of 256 and more: two of 304 and 296
    // steps, and three of 256 in a batch.
    check_shapes(&mut rng, &[70, 600], &[600, 130], DType::F32);
    check_shapes(&mut rng, &[2, 70, 768], &[768, 33], DType::F32);
}

/// f32 products at most 16 columns wide (LoRA's rank-16 products) take thin tiles of 128 x 16, split along K
/// where they are few: `x @ A.t()`, `x @ B` and `g.t() @ B`, at odd sizes, a single column and long reductions.
#[test]
fn thin_products() {
    let mut rng = Rng::new("thin_products");
    for (m, k, n) in [
        (300, 200, 16),
        (129, 1100, 16),
        (257, 17, 3),
        (5, 300, 1),
        (1024, 768, 16),
        (1, 1, 7),
    ] {
        let (x, vx) = random(&mut rng, &[m, k], DType::F32);
        let (a, va) = random(&mut rng, &[n, k], DType::F32);
        check(&format!("x @ A^T {m}x{k}x{n}"), &x, &vx, &a.t().unwrap(), &va);
        let (b, vb) = random(&mut rng, &[k, n], DType::F32);
        check(&format!("x @ B {m}x{k}x{n}"), &x, &vx, &b, &vb);
        let (g, vg) = random(&mut rng, &[k, m], DType::F32);
        check(&format!("g^T @ B {m}x{k}x{n}"), &g.t().unwrap(), &vg, &b, &vb);
    }
}

/// f32 products of at least 128 output tiles of 128 x 128 over K >= 2048 take those tiles and split K into slices
/// (as the 110M shape's `[4096, 768]` products over K = 3072 do); as `a @ b` and as a weight gradient `g.t() @ x`.
/// Where the adapter tells its multiprocessor count, fewer tiles take them too when whole waves of slices fill
/// the GPU: the `[768, 768]` weight gradient over K = 4096 runs in 7 slices on an H200, the last one shorter.
/// Checked on a sample of entries: the whole f64 reference would take minutes on a CPU device.
#[test]
fn long_reductions_over_many_big_tiles() {
    let mut rng = Rng::new("long_reductions_over_many_big_tiles");
    eprintln!("multiprocessors: {:?}", dev().caps().multiprocessors);
    for (m, k, n) in [(1024, 2048, 2048), (768, 4096, 768)] {
        let (a, va) = random(&mut rng, &[m, k], DType::F32);
        let (g, vg) = random(&mut rng, &[k, m], DType::F32);
        let (b, vb) = random(&mut rng, &[k, n], DType::F32);
        for (what, lhs, base) in [("a @ b", a, &va), ("g^T @ b", g.t().unwrap(), &vg)] {
            let ha = host(&lhs, base);
            let got = lhs.matmul(&b).unwrap().to_f32_vec().unwrap();
            for _ in 0..128 {
                let (r, c) = (rng.below(m), rng.below(n));
                let want: f64 = (0..k).map(|j| ha[r * k + j] * vb[j * n + c] as f64).sum();
                let err = (got[r * n + c] as f64 - want).abs();
                assert!(
                    err <= 1e-5 * want.abs() + 1e-6 * k as f64,
                    "{what} {m}x{k}x{n} [{r}, {c}]: {} vs {want}",
                    got[r * n + c]
                );
            }
        }
    }
}

/// Where the adapter has cooperative matrices for `dtype` (and timestamps inside passes), a product of shapes `sa`
/// and `sb` runs on them: the kernel profile names the tensor-core kernel.
fn assert_ran_on_tensor_cores(sa: &[usize], sb: &[usize], dtype: DType) {
    let inside_passes = hierarchos::runtime::wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
    let d = dev();
    let caps = d.caps();
    let coop = caps.cooperative_matrix.is_some() && (dtype == DType::F16 || caps.bf16_cooperative_matrix);
    if !coop || !d.wgpu_parts().1.features().contains(inside_passes) {
        return;
    }
    let options = GpuOptions {
        profile: true,
        ..GpuOptions::from_env()
    };
    let p = pollster::block_on(Gpu::open(&options)).unwrap();
    let a = Tensor::zeros(sa, dtype, &p).unwrap();
    let b = Tensor::zeros(sb, dtype, &p).unwrap();
    a.matmul(&b).unwrap().to_f32_vec().unwrap();
    let kernels: Vec<String> = p.profile().into_iter().map(|k| k.kernel).collect();
    assert!(
        kernels.iter().any(|k| k.starts_with("matmul_coop")),
        "{sa:?} @ {sb:?} {dtype}: {kernels:?}"
    );
}

/// The 16-bit types the tensor-core kernel multiplies where the adapter has cooperative matrices for them (f16;
/// bf16 where the driver has `VK_KHR_shader_bfloat16`); elsewhere their products run the tiled kernel.
const HALVES: [DType; 2] = [DType::F16, DType::BF16];

/// f16 and bf16 products of whole 128 x 128 tiles and K a multiple of 32: on adapters with cooperative matrices
/// (16-bit into f32: fragments of 16 with subgroups of 32, as on NVIDIA, or of 8 with subgroups of 8, as on
/// lavapipe since Mesa 25.1) they run on tensor cores; elsewhere the tiled kernel. Every pairing of operand
/// layouts, an offset view, several tiles along M and N, a batch of one (batched products stay on the tiled
/// kernel), and single tiles over a long reduction (split along K).
#[test]
fn half_products_of_whole_tiles() {
    let mut rng = Rng::new("half_products_of_whole_tiles");
    let d = dev();
    let caps = d.caps();
    eprintln!(
        "cooperative matrices: {:?} ({}), subgroups {:?}",
        caps.cooperative_matrix,
        caps.cooperative_matrix_types(),
        caps.subgroup_size
    );
    for dtype in HALVES {
        check_shapes(&mut rng, &[256, 32], &[32, 128], dtype);
        check_shapes(&mut rng, &[128, 64], &[64, 256], dtype);
        check_shapes(&mut rng, &[512, 96], &[96, 384], dtype);
        check_shapes(&mut rng, &[1, 256, 64], &[64, 256], dtype);
        // x @ W.t() with W [N, K], x a view starting past the start of its storage.
        let (x, vx) = random(&mut rng, &[258, 64], dtype);
        let (w, vw) = random(&mut rng, &[256, 64], dtype);
        let x = x.narrow(0, 2, 256).unwrap();
        check(&format!("x[2..] @ W^T {dtype}"), &x, &vx, &w.t().unwrap(), &vw);
        // A weight gradient g.t() @ x: the left operand has unit stride along M; and both operands transposed.
        let (g, vg) = random(&mut rng, &[64, 256], dtype);
        let (x, vx) = random(&mut rng, &[64, 128], dtype);
        check(&format!("g^T @ x {dtype}"), &g.t().unwrap(), &vg, &x, &vx);
        let (w, vw) = random(&mut rng, &[128, 64], dtype);
        check(
            &format!("g^T @ W^T {dtype}"),
            &g.t().unwrap(),
            &vg,
            &w.t().unwrap(),
            &vw,
        );
        // One tile over a long reduction: split along K into slices whose f32 partial products are added.
        check_shapes(&mut rng, &[256, 1024], &[1024, 128], dtype);
        let (g, vg) = random(&mut rng, &[1024, 256], dtype);
        let (x, vx) = random(&mut rng, &[1024, 128], dtype);
        check(
            &format!("g^T @ x {dtype}, split along K"),
            &g.t().unwrap(),
            &vg,
            &x,
            &vx,
        );
        // Where the adapter has them, these products did run on cooperative matrices.
        assert_ran_on_tensor_cores(&[256, 32], &[32, 128], dtype);
    }
}

/// A `[rows, cols]` view of random `dtype` values at the start of a `[rows + 8, cols + 8]` tensor of NaN, and the
/// values of that tensor.
fn nan_padded(rng: &mut Rng, rows: usize, cols: usize, dtype: DType) -> (Tensor, Vec<f32>) {
    let width = cols + 8;
    let values: Vec<f32> = (0..(rows + 8) * width)
        .map(|i| {
            if i / width < rows && i % width < cols {
                rng.below(2001) as f32 / 1000.0 - 1.0
            } else {
                f32::NAN
            }
        })
        .collect();
    let t = Tensor::from_slice(&values, &[rows + 8, width], &dev()).unwrap();
    let t = t.to_dtype(dtype).unwrap();
    let values = t.to_f32_vec().unwrap();
    (t.narrow(0, 0, rows).unwrap().narrow(1, 0, cols).unwrap(), values)
}

/// `v`, an f32 value, rounded to `half` (f16 or bf16, to nearest even). Through f32: the `half` crate's
/// conversions from f64 drop the low 32 bits of the mantissa before rounding, so they can miss that a value lies
/// just past a tie and round it the wrong way.
fn round_to(half: DType, v: f64) -> f64 {
    let x = v as f32;
    assert_eq!(x as f64, v, "an f32 value");
    match half {
        DType::BF16 => half::bf16::from_f32(x).to_f64(),
        _ => half::f16::from_f32(x).to_f64(),
    }
}

/// f16 and bf16 products that fill no whole tiles, where the tensor-core kernel checks its loads and the stores of
/// its edge tiles (any M past the skinny kernel's rows, any N and K whose unit-stride dimensions are multiples of
/// 8): M, N and K from one row or column past a tile edge to a fraction of one tile, every pairing of operand
/// layouts, a transposed weight of odd N, a weight gradient over a ragged number of tokens, and long ragged
/// reductions split along K; with 16-bit results, under autocast (f32 results) and split. Where the adapter has
/// cooperative matrices for the type, they ran there.
#[test]
fn half_products_with_partial_tiles() {
    let mut rng = Rng::new("half_products_with_partial_tiles");
    for dtype in HALVES {
        for (m, k, n) in [(9, 8, 8), (37, 40, 24), (129, 72, 136), (200, 264, 120), (257, 16, 392)] {
            check_shapes(&mut rng, &[m, k], &[k, n], dtype);
            // Read along M, the left operand needs M a multiple of 8.
            let m8 = m.next_multiple_of(8);
            let (a, va) = random(&mut rng, &[k, m8], dtype);
            let (b, vb) = random(&mut rng, &[n, k], dtype);
            check(
                &format!("A^T @ B^T {dtype} {m8}x{k}x{n}"),
                &a.t().unwrap(),
                &va,
                &b.t().unwrap(),
                &vb,
            );
        }
        // Operands inside storage full of NaN: nothing past the edge of a view may enter a product (it would add
        // NaN).
        let (a, va) = nan_padded(&mut rng, 37, 40, dtype);
        let (b, vb) = nan_padded(&mut rng, 40, 24, dtype);
        check(&format!("NaN-padded a @ b {dtype}"), &a, &va, &b, &vb);
        let (a, va) = nan_padded(&mut rng, 40, 24, dtype);
        let (b, vb) = nan_padded(&mut rng, 17, 40, dtype);
        check(
            &format!("NaN-padded a^T @ b^T {dtype}"),
            &a.t().unwrap(),
            &va,
            &b.t().unwrap(),
            &vb,
        );
        // x @ W.t() for a W of 17 rows (N need not be a multiple of 8 when B is read along K), x a view with an
        // offset; and of 130 rows, where even whole tiles write element by element (rows of N = 130 halves cannot
        // all start at the 16-byte boundaries a fragment store needs).
        let (x, vx) = random(&mut rng, &[203, 48], dtype);
        for rows in [17, 130] {
            let (w, vw) = random(&mut rng, &[rows, 48], dtype);
            let what = format!("x[8..] @ W^T {dtype}, {rows} rows of W");
            check(&what, &x.narrow(0, 8, 195).unwrap(), &vx, &w.t().unwrap(), &vw);
        }
        // The weight gradient g.t() @ x over 37 tokens: A read along M, a reduction of 37 steps.
        let (g, vg) = random(&mut rng, &[37, 24], dtype);
        let (x, vx) = random(&mut rng, &[37, 40], dtype);
        check(
            &format!("g^T @ x {dtype} over 37 tokens"),
            &g.t().unwrap(),
            &vg,
            &x,
            &vx,
        );
        // Few tiles over long ragged reductions: split along K, the last slice partial.
        check_shapes(&mut rng, &[136, 1000], &[1000, 24], dtype);
        let (g, vg) = random(&mut rng, &[1001, 136], dtype);
        let (x, vx) = random(&mut rng, &[1001, 16], dtype);
        let what = format!("g^T @ x {dtype}, 1001 tokens, split along K");
        check(&what, &g.t().unwrap(), &vg, &x, &vx);
        // Under autocast: f32 operands, 16-bit products, f32 results.
        let (a, va) = random(&mut rng, &[129, 40], DType::F32);
        let (b, vb) = random(&mut rng, &[40, 136], DType::F32);
        let got = autocast(dtype, || a.matmul(&b)).unwrap().unwrap();
        assert_eq!(got.dtype(), DType::F32);
        let rounded = |v: &[f32]| -> Vec<f64> { v.iter().map(|&x| round_to(dtype, x as f64)).collect() };
        let (want, _) = reference(&rounded(&va), &[129, 40], &rounded(&vb), &[40, 136]);
        let what = format!("autocast {dtype} 129x40x136");
        assert_close(&what, &got.to_f32_vec().unwrap(), &want, 1e-2, 1e-3);
        assert_ran_on_tensor_cores(&[37, 40], &[40, 24], dtype);
    }
}

/// f16 and bf16 products whose f32 sums are exact (integers times powers of two), so that every kernel, tensor
/// cores or not, must give the f64 sum rounded to the 16-bit type bit for bit: rounded to nearest even, ties
/// included, and for f16 in its subnormal range and overflowing to infinity. Unsplit with 16-bit output, under
/// autocast with f32 output, and split along K.
#[test]
fn half_products_of_exact_sums_round_like_torch() {
    let mut rng = Rng::new("half_products_of_exact_sums_round_like_torch");
    let d = dev();
    // Row r of A is scaled by 2^EXPONENTS[r % len]: results from f16 subnormals to past f16's largest value.
    const EXPONENTS: [i32; 10] = [-20, -18, -16, -12, -8, -4, 0, 2, 4, 6];
    for dtype in HALVES {
        // The last two fill no whole tiles (the tensor-core kernel's edge tiles) and the last is split along K.
        for (m, k, n, bound) in [
            (128, 32, 128, 512),
            (256, 64, 128, 256),
            (128, 1024, 128, 64),
            (130, 40, 136, 512),
            (136, 1000, 24, 64),
        ] {
            // bf16 holds integers up to 256 exactly: its operands stay within that.
            let bound = if dtype == DType::BF16 { bound.min(128) } else { bound };
            let mut ints = |count: usize| -> Vec<f64> {
                (0..count)
                    .map(|_| rng.below(2 * bound + 1) as f64 - bound as f64)
                    .collect()
            };
            let a: Vec<f64> = ints(m * k)
                .iter()
                .enumerate()
                .map(|(i, v)| v * 2f64.powi(EXPONENTS[(i / k) % EXPONENTS.len()]))
                .collect();
            let b: Vec<f64> = ints(k * n).iter().map(|v| v / bound as f64).collect();
            let (exact, _) = reference(&a, &[m, k], &b, &[k, n]);
            let want: Vec<f32> = exact.iter().map(|&v| round_to(dtype, v) as f32).collect();
            // Sums that round in both types; f16's range is crossed at both ends.
            assert!(exact.iter().zip(&want).any(|(e, w)| *e != *w as f64));
            if dtype == DType::F16 {
                assert!(want.iter().any(|v| v.is_infinite()) && want.iter().any(|v| *v != 0.0 && v.abs() < 6.2e-5));
            }
            let f32s = |v: &[f64], shape: &[usize]| {
                let v: Vec<f32> = v.iter().map(|&x| x as f32).collect();
                Tensor::from_slice(&v, shape, &d).unwrap()
            };
            let (a32, b32) = (f32s(&a, &[m, k]), f32s(&b, &[k, n]));
            let (a16, b16) = (a32.to_dtype(dtype).unwrap(), b32.to_dtype(dtype).unwrap());
            assert_eq!(
                a16.to_f32_vec().unwrap(),
                a32.to_f32_vec().unwrap(),
                "{dtype} holds the operands exactly"
            );
            assert_eq!(
                b16.to_f32_vec().unwrap(),
                b32.to_f32_vec().unwrap(),
                "{dtype} holds the operands exactly"
            );
            let plain = a16.matmul(&b16).unwrap().to_f32_vec().unwrap();
            let wide = autocast(dtype, || a32.matmul(&b32)).unwrap().unwrap();
            assert_eq!(wide.dtype(), DType::F32);
            for (what, got) in [(dtype.name(), plain), ("autocast", wide.to_f32_vec().unwrap())] {
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        g.to_bits() == w.to_bits(),
                        "{what} {dtype} {m}x{k}x{n} [{i}]: {g:e} vs {w:e}"
                    );
                }
            }
        }
    }
}

/// A write into an activation on another thread (tensors are Send) makes the casts kept for it stale on this one:
/// the next product under the same autocast scope reads the new values.
#[test]
fn autocast_sees_a_write_made_on_another_thread() {
    let d = dev();
    let x = Tensor::from_slice(&[1.0f32, 1.0], &[1, 2], &d)
        .unwrap()
        .requires_grad_();
    let w = Tensor::from_slice(&[2.0f32, 2.0], &[2, 1], &d).unwrap();
    autocast(DType::F16, || {
        let y = x.mul_scalar(1.0).unwrap();
        assert_eq!(y.matmul(&w).unwrap().to_vec::<f32>().unwrap(), [4.0]);
        std::thread::scope(|s| {
            s.spawn(|| {
                y.assign(&Tensor::zeros(&[1, 2], DType::F32, y.device()).unwrap())
                    .unwrap()
            });
        });
        assert_eq!(y.matmul(&w).unwrap().to_vec::<f32>().unwrap(), [0.0]);
    })
    .unwrap();
}

/// Inside one autocast scope, products that read the same activation (the q, k and v projections of one input)
/// share its 16-bit cast: one cast launch fewer for each further product, with the values and gradients of
/// separate casts, bit for bit. Weights (no autograd history) are cast every time.
#[test]
fn autocast_products_share_an_activation_cast() {
    let mut rng = Rng::new("autocast_products_share_an_activation_cast");
    let d = own_dev();
    let leaf = |rng: &mut Rng, shape: &[usize]| {
        let n = shape.iter().product();
        Tensor::from_slice(&rng.vec(n, -1.0, 1.0), shape, &d)
            .unwrap()
            .requires_grad_()
    };
    let (x, w1, w2) = (
        leaf(&mut rng, &[64, 32]),
        leaf(&mut rng, &[32, 48]),
        leaf(&mut rng, &[32, 48]),
    );
    let run = |shared: bool| {
        let h = x.mul_scalar(0.5).unwrap();
        let before = d.dispatch_count();
        let (y1, y2) = match shared {
            true => autocast(DType::F16, || (h.matmul(&w1).unwrap(), h.matmul(&w2).unwrap())).unwrap(),
            false => (
                autocast(DType::F16, || h.matmul(&w1)).unwrap().unwrap(),
                autocast(DType::F16, || h.matmul(&w2)).unwrap().unwrap(),
            ),
        };
        let launches = d.dispatch_count() - before;
        y1.add(&y2).unwrap().sum_all().unwrap().backward().unwrap();
        let grads: Vec<Vec<f32>> = [&x, &w1, &w2]
            .iter()
            .map(|t| t.grad().unwrap().to_f32_vec().unwrap())
            .collect();
        for t in [&x, &w1, &w2] {
            t.zero_grad();
        }
        (launches, [y1.to_f32_vec().unwrap(), y2.to_f32_vec().unwrap()], grads)
    };
    let (shared, values, grads) = run(true);
    let (separate, want_values, want_grads) = run(false);
    assert_eq!(shared + 1, separate, "one cast of the activation for both products");
    assert_eq!(values, want_values);
    assert_eq!(grads, want_grads);
    // A write into the activation forgets its cast: the next product reads the new values.
    let zeros = Tensor::zeros(&[1, 32], DType::F32, &d).unwrap();
    let (before, after) = autocast(DType::F16, || {
        let h = x.mul_scalar(0.5).unwrap();
        let before = h.matmul(&w1).unwrap().to_f32_vec().unwrap();
        h.write_at(0, 0, &zeros).unwrap();
        (before, h.matmul(&w1).unwrap().to_f32_vec().unwrap())
    })
    .unwrap();
    assert!(before[..48].iter().any(|&v| v != 0.0));
    assert!(after[..48].iter().all(|&v| v == 0.0));
    assert_eq!(before[48..], after[48..]);
}

/// Inside `autocast(f16 | bf16)` a product of f32 operands is the 16-bit product of the rounded operands, handed
/// back as f32 by the product's own launch, and its gradients reach the f32 leaves as f32; outside, products are
/// f32 again.
#[test]
fn autocast_runs_products_in_16_bits() {
    let mut rng = Rng::new("autocast_runs_products_in_16_bits");
    // Launches are counted on a device of the test's own: the shared one also runs the other tests' launches.
    let d = own_dev();
    let (va, vb) = (rng.vec(2 * 17 * 33, -1.0, 1.0), rng.vec(33 * 9, -1.0, 1.0));
    let a = Tensor::from_slice(&va, &[2, 17, 33], &d).unwrap();
    let b = Tensor::from_slice(&vb, &[33, 9], &d).unwrap();
    for half in [DType::F16, DType::BF16] {
        let (a, b) = (a.detach().requires_grad_(), b.detach().requires_grad_());
        let launches = d.dispatch_count();
        let got = autocast(half, || a.matmul(&b)).unwrap().unwrap();
        assert_eq!(
            d.dispatch_count() - launches,
            3,
            "{half}: the operands' casts and the product, which rounds and widens its own output"
        );
        assert_eq!(got.dtype(), DType::F32);
        assert_eq!(autocast_dtype(), None, "the dtype is restored");
        let want = a
            .to_dtype(half)
            .unwrap()
            .matmul(&b.to_dtype(half).unwrap())
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        assert_eq!(got.to_f32_vec().unwrap(), want.to_f32_vec().unwrap(), "{half}");
        got.sum_all().unwrap().backward().unwrap();
        // d(sum)/da = ones @ b^T, in 16-bit precision.
        let ga = a.grad().unwrap();
        assert_eq!(ga.dtype(), DType::F32);
        let rows = 2 * 17;
        let want: Vec<f64> = (0..rows * 33)
            .map(|i| (0..9).map(|c| vb[(i % 33) * 9 + c] as f64).sum())
            .collect();
        assert_close(
            &format!("autocast {half} grad"),
            &ga.to_f32_vec().unwrap(),
            &want,
            2e-2,
            2e-2,
        );
    }
    assert_eq!(a.matmul(&b).unwrap().dtype(), DType::F32);
    let plain = a.matmul(&b).unwrap().to_f32_vec().unwrap();
    let (want, _) = reference(&host(&a, &va), a.shape(), &host(&b, &vb), b.shape());
    assert_close("after autocast", &plain, &want, 1e-5, 1e-4);
    assert!(autocast(DType::F32, || ()).is_err());
}

/// The gradients of an autocast product are those of the composed casts and 16-bit product (bit for bit, but for
/// the weight's, which is computed transposed), whether an operand is a weight seen through a view (`x @ W.t()`: kept as f32 and cast again for the backward) or an
/// activation (its 16-bit cast kept); and the weight's 16-bit cast does not stay alive until the backward. The
/// second shape fills whole tensor-core tiles in the product and both gradients, where an adapter has them (the
/// products then come back as f32 from the kernel itself).
#[test]
fn autocast_gradients_match_the_composed_casts_and_keep_no_weight_copy() {
    let mut rng = Rng::new("autocast_gradients_match_the_composed_casts");
    let d = pollster::block_on(Gpu::open(&GpuOptions::from_env())).unwrap();
    for (xs, ws) in [([3, 40, 24], [32, 24]), ([2, 128, 128], [256, 128])] {
        let (vx, vw) = (
            rng.vec(xs.iter().product(), -1.0, 1.0),
            rng.vec(ws.iter().product(), -1.0, 1.0),
        );
        let leaves = || {
            let x = Tensor::from_slice(&vx, &xs, &d).unwrap().requires_grad_();
            let w = Tensor::from_slice(&vw, &ws, &d).unwrap().requires_grad_();
            (x, w)
        };
        for half in [DType::F16, DType::BF16] {
            let grads = |fused: bool| {
                let (x, w) = leaves();
                // An activation (x * 1.5 has history) times a weight's view.
                let act = x.mul_scalar(1.5).unwrap();
                let y = if fused {
                    autocast(half, || act.matmul(&w.t().unwrap())).unwrap().unwrap()
                } else {
                    let (ah, wh) = (act.to_dtype(half).unwrap(), w.t().unwrap().to_dtype(half).unwrap());
                    ah.matmul(&wh).unwrap().to_dtype(DType::F32).unwrap()
                };
                let live = d.memory().live_bytes;
                y.mul(&y).unwrap().sum_all().unwrap().backward().unwrap();
                if fused {
                    assert!(
                        w.grad().unwrap().is_contiguous(),
                        "{half}: the weight's gradient is stored as the weight"
                    );
                }
                let g = |t: &Tensor| t.grad().unwrap().to_f32_vec().unwrap();
                (y.to_f32_vec().unwrap(), g(&x), g(&w), live)
            };
            let (fused, composed) = (grads(true), grads(false));
            assert_eq!(fused.0, composed.0, "{half} {xs:?}: product");
            assert_eq!(fused.1, composed.1, "{half} {xs:?}: gradient of the activation's leaf");
            // The weight's gradient runs as `g.t() @ x` (in the weight's layout) where the composed graph runs
            // `x.t() @ g`: the same sums in another kernel (tensor cores or not), so within a unit in the last
            // place of the 16-bit result, plus the f32 rounding of sums that cancel (an eighth of the largest
            // entry's unit).
            let ulp = if half == DType::F16 {
                2f32.powi(-10)
            } else {
                2f32.powi(-7)
            };
            let largest = composed.2.iter().fold(0f32, |m, c| m.max(c.abs()));
            for (i, (f, c)) in fused.2.iter().zip(&composed.2).enumerate() {
                let bound = ulp * (c.abs() + largest / 8.0);
                assert!((f - c).abs() <= bound, "{half} {xs:?}: weight gradient {i}: {f} vs {c}");
            }
            // Alive between forward and backward: the composed graph also holds the weight's 16-bit cast.
            assert_eq!(
                composed.3 - fused.3,
                (ws[0] * ws[1] * 2) as u64,
                "{half}: bytes of the weight's 16-bit copy"
            );
        }
    }
}

/// The gradient of a weight used as `x @ W.t()` comes out in `W`'s own layout (computed as `g.t() @ x`), equal to
/// the transpose of `x.t() @ g`: the optimizer reads it without a copy.
#[test]
fn weight_gradients_come_out_in_the_weights_layout() {
    let mut rng = Rng::new("weight_gradients_come_out_in_the_weights_layout");
    let (x, vx) = random(&mut rng, &[2, 19, 33], DType::F32);
    let (w, _) = random(&mut rng, &[17, 33], DType::F32);
    let w = w.requires_grad_();
    let (y, _) = random(&mut rng, &[2, 19, 17], DType::F32);
    x.matmul(&w.t().unwrap())
        .unwrap()
        .mul(&y)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let g = w.grad().unwrap();
    assert!(g.is_contiguous());
    assert_eq!(g.shape(), &[17, 33]);
    // d/dW sum(y * (x @ W^T)) = y^T x over all rows.
    let vy = y.to_f32_vec().unwrap();
    let want: Vec<f64> = (0..17 * 33)
        .map(|i| {
            let (o, c) = (i / 33, i % 33);
            (0..38).map(|r| vy[r * 17 + o] as f64 * vx[r * 33 + c] as f64).sum()
        })
        .collect();
    assert_close("dW", &g.to_f32_vec().unwrap(), &want, 1e-4, 1e-5);
}
