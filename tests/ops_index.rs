//! index_select, gather, scatter_add, embedding, triu and tril against CPU references.

mod common;

use common::*;
use hierarchos::core::{DType, Error, Tensor, ops::index::CHECKED_INDEX_LIMIT};

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut c = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        c[d] = i % shape[d];
        i /= shape[d];
    }
    c
}

fn ravel(c: &[usize], shape: &[usize]) -> usize {
    c.iter().zip(shape).fold(0, |acc, (&x, &n)| acc * n + x)
}

/// The elements of view `t` of a tensor whose buffer holds `base`, in row-major order.
fn logical<T: Copy>(t: &Tensor, base: &[T]) -> Vec<T> {
    let l = t.layout();
    strided_indices(&l.shape, &l.strides, l.offset)
        .into_iter()
        .map(|o| base[o])
        .collect()
}

fn cpu_gather(x: &[f32], shape: &[usize], dim: usize, idx: &[usize], ishape: &[usize]) -> Vec<f64> {
    (0..idx.len())
        .map(|i| {
            let mut c = unravel(i, ishape);
            c[dim] = idx[i];
            x[ravel(&c, shape)] as f64
        })
        .collect()
}

fn cpu_scatter_add(
    base: &[f32],
    shape: &[usize],
    dim: usize,
    idx: &[usize],
    ishape: &[usize],
    src: &[f32],
    sshape: &[usize],
) -> Vec<f64> {
    let mut out: Vec<f64> = base.iter().map(|&v| v as f64).collect();
    for (i, &id) in idx.iter().enumerate() {
        let c = unravel(i, ishape);
        let s = src[ravel(&c, sshape)] as f64;
        let mut t = c;
        t[dim] = id;
        out[ravel(&t, shape)] += s;
    }
    out
}

fn ids_tensor(ids: &[usize], shape: &[usize], signed: bool) -> Tensor {
    let d = dev();
    if signed {
        let v: Vec<i32> = ids.iter().map(|&i| i as i32).collect();
        Tensor::from_slice(&v, shape, &d).unwrap()
    } else {
        let v: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
        Tensor::from_slice(&v, shape, &d).unwrap()
    }
}

#[test]
fn index_select_matches_reference() {
    let mut rng = Rng::new("index_select_matches_reference");
    let d = dev();
    for (shape, dim) in [
        (vec![5], 0),
        (vec![1, 3], 0),
        (vec![3, 17], 0),
        (vec![3, 17], 1),
        (vec![2, 3, 4], 1),
        (vec![257, 3], 0),
    ] {
        for n_ids in [1, 3, 17] {
            for signed in [false, true] {
                let numel: usize = shape.iter().product();
                let x = rng.vec(numel, -1.0, 1.0);
                let ids: Vec<usize> = (0..n_ids).map(|_| rng.below(shape[dim])).collect();
                let t = Tensor::from_slice(&x, &shape, &d).unwrap();
                let got = t
                    .index_select(dim as isize, &ids_tensor(&ids, &[n_ids], signed))
                    .unwrap();
                let mut oshape = shape.clone();
                oshape[dim] = n_ids;
                assert_eq!(got.shape(), &oshape[..]);
                let idx: Vec<usize> = (0..got.numel()).map(|i| ids[unravel(i, &oshape)[dim]]).collect();
                let want = cpu_gather(&x, &shape, dim, &idx, &oshape);
                assert_close(
                    &format!("index_select {shape:?} dim {dim}"),
                    &got.to_vec::<f32>().unwrap(),
                    &want,
                    0.0,
                    0.0,
                );
            }
        }
    }
}

#[test]
fn index_select_reads_strided_inputs_and_16_bit() {
    let mut rng = Rng::new("index_select_reads_strided_inputs_and_16_bit");
    let d = dev();
    let x = rng.vec(6 * 7, -1.0, 1.0);
    let base = Tensor::from_slice(&x, &[6, 7], &d).unwrap();
    let view = base.t().unwrap().narrow(1, 1, 4).unwrap(); // [7, 4], strided
    let view_data = logical(&view, &x);
    let ids_base: Vec<u32> = (0..10).map(|_| rng.below(7) as u32).collect();
    let ids = Tensor::from_slice(&ids_base, &[5, 2], &d)
        .unwrap()
        .narrow(1, 1, 1)
        .unwrap()
        .reshape(&[5])
        .unwrap();
    let ids_data: Vec<usize> = logical(&ids, &ids_base).iter().map(|&i| i as usize).collect();
    let got = view.index_select(0, &ids).unwrap();
    let idx: Vec<usize> = (0..20).map(|i| ids_data[i / 4]).collect();
    let want = cpu_gather(&view_data, &[7, 4], 0, &idx, &[5, 4]);
    assert_close("strided index_select", &got.to_vec::<f32>().unwrap(), &want, 0.0, 0.0);
    for dtype in [DType::F16, DType::BF16] {
        let h = view.to_dtype(dtype).unwrap();
        let got = h.index_select(0, &ids).unwrap();
        assert_eq!(got.dtype(), dtype);
        assert_close(
            &format!("{dtype} index_select"),
            &got.to_f32_vec().unwrap(),
            &want,
            1e-2,
            1e-2,
        );
        let odd = h.index_select(1, &ids_tensor(&[3, 0, 3], &[3], true)).unwrap();
        let want: Vec<f64> = (0..21)
            .map(|i| view_data[(i / 3) * 4 + [3, 0, 3][i % 3]] as f64)
            .collect();
        assert_close(
            &format!("{dtype} odd index_select"),
            &odd.to_f32_vec().unwrap(),
            &want,
            1e-2,
            1e-2,
        );
    }
}

#[test]
fn gather_matches_reference() {
    let mut rng = Rng::new("gather_matches_reference");
    let d = dev();
    for (shape, ishape, dim) in [
        (vec![5], vec![3], 0),
        (vec![3, 17], vec![3, 5], 1),
        (vec![3, 17], vec![7, 2], 0),
        (vec![2, 3, 4], vec![2, 2, 6], 2),
        (vec![1, 257], vec![1, 257], 1),
    ] {
        let numel: usize = shape.iter().product();
        let x = rng.vec(numel, -1.0, 1.0);
        let n: usize = ishape.iter().product();
        let idx: Vec<usize> = (0..n).map(|_| rng.below(shape[dim])).collect();
        for signed in [false, true] {
            let t = Tensor::from_slice(&x, &shape, &d).unwrap();
            let got = t.gather(dim as isize, &ids_tensor(&idx, &ishape, signed)).unwrap();
            assert_eq!(got.shape(), &ishape[..]);
            let want = cpu_gather(&x, &shape, dim, &idx, &ishape);
            assert_close(
                &format!("gather {shape:?} {ishape:?}"),
                &got.to_vec::<f32>().unwrap(),
                &want,
                0.0,
                0.0,
            );
        }
    }
    // Transposed input and transposed index.
    let x = rng.vec(4 * 6, -1.0, 1.0);
    let t = Tensor::from_slice(&x, &[4, 6], &d).unwrap().t().unwrap(); // [6, 4]
    let xt = logical(&t, &x);
    let ib: Vec<u32> = (0..12).map(|_| rng.below(4) as u32).collect();
    let it = Tensor::from_slice(&ib, &[3, 4], &d).unwrap().t().unwrap(); // [4, 3]
    let idx: Vec<usize> = logical(&it, &ib).iter().map(|&v| v as usize).collect();
    let got = t.gather(1, &it).unwrap();
    let want = cpu_gather(&xt, &[6, 4], 1, &idx, &[4, 3]);
    assert_close("strided gather", &got.to_vec::<f32>().unwrap(), &want, 0.0, 0.0);
}

#[test]
fn scatter_add_matches_reference() {
    let mut rng = Rng::new("scatter_add_matches_reference");
    let d = dev();
    for (shape, ishape, sshape, dim) in [
        (vec![5], vec![17], vec![17], 0),
        (vec![3, 4], vec![3, 4], vec![3, 4], 0),
        (vec![3, 17], vec![2, 5], vec![3, 6], 1),
        (vec![2, 3, 4], vec![2, 7, 3], vec![2, 7, 4], 1),
        (vec![1, 3], vec![1, 257], vec![1, 257], 1),
    ] {
        let base = rng.vec(shape.iter().product(), -1.0, 1.0);
        let src = rng.vec(sshape.iter().product(), -1.0, 1.0);
        let n: usize = ishape.iter().product();
        let idx: Vec<usize> = (0..n).map(|_| rng.below(shape[dim])).collect();
        let t = Tensor::from_slice(&base, &shape, &d).unwrap();
        let s = Tensor::from_slice(&src, &sshape, &d).unwrap();
        let got = t
            .scatter_add(dim as isize, &ids_tensor(&idx, &ishape, true), &s)
            .unwrap();
        let want = cpu_scatter_add(&base, &shape, dim, &idx, &ishape, &src, &sshape);
        let atol = 1e-6 * n as f64;
        assert_close(
            &format!("scatter_add {shape:?} {ishape:?}"),
            &got.to_vec::<f32>().unwrap(),
            &want,
            1e-5,
            atol,
        );
    }
    // Strided src (transposed).
    let src = rng.vec(12, -1.0, 1.0);
    let s = Tensor::from_slice(&src, &[4, 3], &d).unwrap().t().unwrap(); // [3, 4]
    let sd = logical(&s, &src);
    let idx: Vec<usize> = (0..12).map(|_| rng.below(2)).collect();
    let base = Tensor::zeros(&[2, 4], DType::F32, &d).unwrap();
    let got = base.scatter_add(0, &ids_tensor(&idx, &[3, 4], false), &s).unwrap();
    let want = cpu_scatter_add(&[0.0; 8], &[2, 4], 0, &idx, &[3, 4], &sd, &[3, 4]);
    assert_close("strided scatter_add", &got.to_vec::<f32>().unwrap(), &want, 1e-5, 1e-6);
    // bf16 accumulates in f32 and rounds once.
    let b = Tensor::zeros(&[2, 4], DType::BF16, &d).unwrap();
    let got = b
        .scatter_add(0, &ids_tensor(&idx, &[3, 4], false), &s.to_dtype(DType::BF16).unwrap())
        .unwrap();
    assert_close("bf16 scatter_add", &got.to_f32_vec().unwrap(), &want, 1e-2, 1e-2);
}

#[test]
fn embedding_looks_up_rows() {
    let mut rng = Rng::new("embedding_looks_up_rows");
    let d = dev();
    let w = rng.vec(7 * 5, -1.0, 1.0);
    let ids: Vec<usize> = (0..6).map(|_| rng.below(7)).collect();
    let weight = Tensor::from_slice(&w, &[7, 5], &d).unwrap();
    let got = Tensor::embedding(&weight, &ids_tensor(&ids, &[2, 3], true)).unwrap();
    assert_eq!(got.shape(), &[2, 3, 5]);
    let want: Vec<f64> = (0..30).map(|i| w[ids[i / 5] * 5 + i % 5] as f64).collect();
    assert_close("embedding", &got.to_vec::<f32>().unwrap(), &want, 0.0, 0.0);
    let empty = Tensor::embedding(&weight, &ids_tensor(&[], &[0, 4], false)).unwrap();
    assert_eq!(empty.shape(), &[0, 4, 5]);
}

#[test]
fn empty_indices_and_tensors() {
    let d = dev();
    let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[1, 3], &d).unwrap();
    let got = t.index_select(1, &ids_tensor(&[], &[0], false)).unwrap();
    assert_eq!(got.shape(), &[1, 0]);
    let e = Tensor::zeros(&[0, 3], DType::F32, &d).unwrap();
    assert_eq!(
        e.index_select(1, &ids_tensor(&[2, 0], &[2], false)).unwrap().shape(),
        &[0, 2]
    );
    let g = t.gather(1, &ids_tensor(&[], &[1, 0], false)).unwrap();
    assert_eq!(g.shape(), &[1, 0]);
    let s = t
        .scatter_add(
            1,
            &ids_tensor(&[], &[1, 0], false),
            &Tensor::zeros(&[1, 0], DType::F32, &d).unwrap(),
        )
        .unwrap();
    assert_eq!(s.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
}

#[test]
fn bad_arguments_are_errors() {
    let d = dev();
    let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], &d).unwrap();
    let ids = ids_tensor(&[0, 1], &[2], false);
    assert!(matches!(t.index_select(2, &ids), Err(Error::IndexOutOfRange { .. })));
    assert!(matches!(t.index_select(-3, &ids), Err(Error::IndexOutOfRange { .. })));
    assert!(matches!(
        t.index_select(0, &ids_tensor(&[0, 2], &[2], false)),
        Err(Error::IndexOutOfRange { index: 2, size: 2, .. })
    ));
    let neg = Tensor::from_slice(&[0i32, -1], &[2], &d).unwrap();
    assert!(matches!(
        t.index_select(1, &neg),
        Err(Error::IndexOutOfRange { index: -1, size: 3, .. })
    ));
    let fl = Tensor::from_slice(&[0.0f32], &[1], &d).unwrap();
    assert!(matches!(t.index_select(0, &fl), Err(Error::DTypeMismatch { .. })));
    assert!(matches!(
        t.index_select(0, &ids_tensor(&[0, 1], &[1, 2], false)),
        Err(Error::RankMismatch { .. })
    ));
    assert!(matches!(t.gather(0, &ids), Err(Error::ShapeMismatch { .. })));
    assert!(matches!(
        t.gather(1, &ids_tensor(&[0; 3], &[3, 1], false)),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        t.gather(1, &ids_tensor(&[0, 3], &[2, 1], false)),
        Err(Error::IndexOutOfRange { index: 3, .. })
    ));
    let idx = ids_tensor(&[0, 1], &[1, 2], false);
    let src16 = Tensor::zeros(&[1, 2], DType::F16, &d).unwrap();
    assert!(matches!(
        t.scatter_add(1, &idx, &src16),
        Err(Error::DTypeMismatch { .. })
    ));
    let small = Tensor::zeros(&[1, 1], DType::F32, &d).unwrap();
    assert!(matches!(
        t.scatter_add(1, &idx, &small),
        Err(Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        t.scatter_add(0, &ids_tensor(&[0, 5], &[1, 2], false), &t),
        Err(Error::IndexOutOfRange { index: 5, .. })
    ));
    assert!(matches!(
        Tensor::embedding(&t.flatten().unwrap(), &ids),
        Err(Error::RankMismatch { .. })
    ));
    assert!(matches!(
        Tensor::embedding(&t, &ids_tensor(&[9], &[1], true)),
        Err(Error::IndexOutOfRange { .. })
    ));
    let empty = Tensor::zeros(&[0, 3], DType::F32, &d).unwrap();
    assert!(matches!(
        empty.index_select(0, &ids_tensor(&[0], &[1], false)),
        Err(Error::IndexOutOfRange { .. })
    ));
}

#[test]
fn large_index_tensors_are_clamped_not_checked() {
    let d = dev();
    let t = Tensor::from_slice(&[10.0f32, 20.0, 30.0], &[3], &d).unwrap();
    let mut ids = vec![1u32; CHECKED_INDEX_LIMIT + 1];
    ids[5] = 1000;
    let idt = Tensor::from_slice(&ids, &[ids.len()], &d).unwrap();
    let got = t
        .index_select(0, &idt)
        .unwrap()
        .narrow(0, 4, 3)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(got, vec![20.0, 30.0, 20.0]);
    let mut signed = vec![0i32; CHECKED_INDEX_LIMIT + 1];
    signed[0] = -7;
    let idt = Tensor::from_slice(&signed, &[signed.len()], &d).unwrap();
    assert_eq!(
        t.index_select(0, &idt)
            .unwrap()
            .narrow(0, 0, 1)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![10.0]
    );
    // The row-lookup gradient goes to the rows the clamped ids read. The bulk of the ids name a row in another
    // workgroup's rows (8 rows each) than the row checked, whose count is then exact.
    let n = CHECKED_INDEX_LIMIT + 5;
    let grad_rows = |ids: Tensor| {
        let table = Tensor::zeros(&[9, 2], DType::F32, &d).unwrap().requires_grad_();
        table
            .index_select(0, &ids)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        table.grad().unwrap().to_vec::<f32>().unwrap()
    };
    let mut signed = vec![8i32; n];
    signed[9] = -3;
    let g = grad_rows(Tensor::from_slice(&signed, &[n], &d).unwrap());
    assert_eq!(
        &g[..16],
        &[
            1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
        ]
    );
    let mut ids = vec![0u32; n];
    ids[7] = 1000;
    let g = grad_rows(Tensor::from_slice(&ids, &[n], &d).unwrap());
    assert_eq!(&g[16..], &[1.0, 1.0], "id 1000 clamped to the last row");
}

#[test]
fn index_gradients() {
    let mut rng = Rng::new("index_gradients");
    let x = rng.vec(12, -1.0, 1.0);
    gradcheck("index_select", &mut rng, &[(x.clone(), vec![4, 3])], |t| {
        t[0].index_select(0, &ids_tensor(&[2, 0, 2, 3, 2], &[5], false))
    });
    gradcheck("index_select dim 1", &mut rng, &[(x.clone(), vec![4, 3])], |t| {
        t[0].t()?.index_select(0, &ids_tensor(&[1, 1, 0], &[3], true))
    });
    gradcheck("gather", &mut rng, &[(x.clone(), vec![4, 3])], |t| {
        t[0].gather(1, &ids_tensor(&[0, 0, 2, 1, 2, 2], &[3, 2], false))
    });
    let src = rng.vec(6, -1.0, 1.0);
    gradcheck(
        "scatter_add",
        &mut rng,
        &[(x.clone(), vec![4, 3]), (src, vec![2, 3])],
        |t| t[0].scatter_add(0, &ids_tensor(&[3, 0, 3, 3, 1, 1], &[2, 3], false), &t[1]),
    );
    let src = rng.vec(6, -1.0, 1.0);
    gradcheck(
        "scatter_add with a larger src",
        &mut rng,
        &[(x.clone(), vec![4, 3]), (src, vec![2, 3])],
        |t| t[0].scatter_add(0, &ids_tensor(&[3, 0, 3, 3], &[2, 2], false), &t[1]),
    );
    let w = rng.vec(10, -1.0, 1.0);
    gradcheck("embedding", &mut rng, &[(w, vec![5, 2])], |t| {
        Tensor::embedding(&t[0], &ids_tensor(&[4, 1, 4, 0], &[2, 2], true))
    });
}

#[test]
fn triu_tril_match_reference() {
    let mut rng = Rng::new("triu_tril_match_reference");
    let d = dev();
    for shape in [vec![1, 1], vec![3, 4], vec![2, 5, 3], vec![17, 3]] {
        let n: usize = shape.iter().product();
        let x = rng.vec(n, -1.0, 1.0);
        let (rows, cols) = (shape[shape.len() - 2], shape[shape.len() - 1]);
        for k in [-2i64, -1, 0, 1, 5] {
            let t = Tensor::from_slice(&x, &shape, &d).unwrap();
            for upper in [true, false] {
                let got = if upper { t.triu(k) } else { t.tril(k) }.unwrap();
                let want: Vec<f64> = (0..n)
                    .map(|i| {
                        let (r, c) = (((i / cols) % rows) as i64, (i % cols) as i64);
                        let keep = if upper { c - r >= k } else { c - r <= k };
                        if keep { x[i] as f64 } else { 0.0 }
                    })
                    .collect();
                assert_close(
                    &format!("tri {upper} {shape:?} k {k}"),
                    &got.to_vec::<f32>().unwrap(),
                    &want,
                    0.0,
                    0.0,
                );
            }
        }
    }
    // Strided input, integer and 16-bit dtypes.
    let x = rng.vec(12, -1.0, 1.0);
    let t = Tensor::from_slice(&x, &[3, 4], &d).unwrap().t().unwrap(); // [4, 3]
    let xt = logical(&t, &x);
    let want: Vec<f64> = (0..12)
        .map(|i| if i % 3 <= i / 3 { xt[i] as f64 } else { 0.0 })
        .collect();
    assert_close(
        "strided tril",
        &t.tril(0).unwrap().to_vec::<f32>().unwrap(),
        &want,
        0.0,
        0.0,
    );
    assert_close(
        "bf16 tril",
        &t.to_dtype(DType::BF16).unwrap().tril(0).unwrap().to_f32_vec().unwrap(),
        &want,
        1e-2,
        1e-2,
    );
    let ones = Tensor::from_slice(&[1i32; 9], &[3, 3], &d).unwrap();
    assert_eq!(
        ones.triu(1).unwrap().to_vec::<i32>().unwrap(),
        vec![0, 1, 1, 0, 0, 1, 0, 0, 0]
    );
    let ones = Tensor::from_slice(&[1u32; 4], &[2, 2], &d).unwrap();
    assert_eq!(ones.tril(-1).unwrap().to_vec::<u32>().unwrap(), vec![0, 0, 1, 0]);
    let e = Tensor::zeros(&[0, 3], DType::F32, &d).unwrap();
    assert_eq!(e.triu(0).unwrap().shape(), &[0, 3]);
    assert!(matches!(
        Tensor::from_slice(&[1.0f32], &[1], &d).unwrap().triu(0),
        Err(Error::RankMismatch { .. })
    ));
    let (a, b) = (rng.vec(12, -1.0, 1.0), rng.vec(12, -1.0, 1.0));
    gradcheck("triu", &mut rng, &[(a, vec![3, 4])], |t| t[0].triu(1));
    gradcheck("tril", &mut rng, &[(b, vec![2, 2, 3])], |t| t[0].tril(-1));
}

#[test]
fn host_ids_known_in_range_skip_the_gpu_check() {
    let d = own_dev();
    let table = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2], &d).unwrap();
    let launches = |f: &dyn Fn() -> Tensor| {
        let before = d.dispatch_count();
        let out = f();
        (d.dispatch_count() - before, out.to_vec::<f32>().unwrap())
    };
    // Uploaded ids in range: the lookup alone, no check kernel (and no wait for the GPU).
    let ids = Tensor::from_slice(&[2u32, 0], &[2], &d).unwrap();
    let (n, v) = launches(&|| Tensor::embedding(&table, &ids).unwrap());
    assert_eq!((n, v), (1, vec![5.0, 6.0, 1.0, 2.0]));
    // A view that leaves the bad id out is still fine; the whole tensor is not.
    let with_bad = Tensor::from_slice(&[1u32, 7], &[2], &d).unwrap();
    let (_, v) = launches(&|| Tensor::embedding(&table, &with_bad.narrow(0, 0, 1).unwrap()).unwrap());
    assert_eq!(v, vec![3.0, 4.0]);
    assert!(matches!(
        Tensor::embedding(&table, &with_bad),
        Err(Error::IndexOutOfRange { index: 7, .. })
    ));
    // Argmax results index the reduced extent by construction: the argmax and the lookup, no check kernel
    // (greedy decoding's next token).
    let scores = Tensor::from_slice(&[0.5f32, -1.0, 3.0, 2.0, 7.0, 1.0], &[2, 3], &d).unwrap();
    let (n, v) = launches(&|| Tensor::embedding(&table, &scores.argmax(-1, false).unwrap()).unwrap());
    assert_eq!((n, v), (2, vec![5.0, 6.0, 3.0, 4.0]));
    let wide = Tensor::from_slice(&[0.0f32, 0.0, 0.0, 1.0], &[1, 4], &d).unwrap();
    assert!(matches!(
        Tensor::embedding(&table, &wide.argmax(-1, false).unwrap()),
        Err(Error::IndexOutOfRange { index: 3, .. })
    ));
    // Ids written by a kernel are checked on the GPU, including after an in-place write.
    ids.narrow(0, 1, 1)
        .unwrap()
        .assign(&Tensor::from_slice(&[9u32], &[1], &d).unwrap())
        .unwrap();
    assert!(matches!(
        Tensor::embedding(&table, &ids),
        Err(Error::IndexOutOfRange { index: 9, .. })
    ));
}

#[test]
fn row_lookup_gradient_over_many_strided_ids() {
    // More ids than one block of the row-gradient kernel (4096), read through a stride, with a row never looked up;
    // tables of fewer rows than one workgroup takes (8) and of several workgroups, the last one partial.
    let d = dev();
    let mut rng = Rng::new("row_lookup_gradient");
    for (rows, width, k) in [(7, 5, 5000), (19, 300, 4500)] {
        let all: Vec<u32> = (0..2 * k).map(|_| rng.below(rows - 1) as u32).collect();
        let ids = Tensor::from_slice(&all, &[k, 2], &d)
            .unwrap()
            .narrow(1, 0, 1)
            .unwrap()
            .squeeze(1)
            .unwrap();
        assert!(!ids.is_contiguous());
        let x = Tensor::from_slice(&rng.vec(rows * width, -1.0, 1.0), &[rows, width], &d)
            .unwrap()
            .requires_grad_();
        let c = rng.vec(k * width, -1.0, 1.0);
        let weights = Tensor::from_slice(&c, &[k, width], &d).unwrap();
        x.index_select(0, &ids)
            .unwrap()
            .mul(&weights)
            .unwrap()
            .sum(&[], false)
            .unwrap()
            .backward()
            .unwrap();
        let mut want = vec![0.0f64; rows * width];
        for j in 0..k {
            let t = all[2 * j] as usize;
            for col in 0..width {
                want[t * width + col] += c[j * width + col] as f64;
            }
        }
        let got = x.grad().unwrap().to_vec::<f32>().unwrap();
        assert_close(&format!("row lookup gradient, {rows} rows"), &got, &want, 1e-5, 1e-4);
        assert!(got[(rows - 1) * width..].iter().all(|&v| v == 0.0));
        // The same sums in the same order as the generic scatter: bit for bit.
        let scattered = Tensor::zeros(&[rows, width], DType::F32, &d)
            .unwrap()
            .scatter_add(
                0,
                &ids.unsqueeze(1).unwrap().broadcast_to(&[k, width]).unwrap(),
                &weights,
            )
            .unwrap();
        assert_eq!(
            got,
            scattered.to_vec::<f32>().unwrap(),
            "{rows} rows: as the generic scatter"
        );
    }
}
