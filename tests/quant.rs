//! ggml block formats: the CPU dequantizer against an element-by-element reference written from the format
//! descriptions, the GPU dequantizer bit for bit against the CPU, the quantized matmul (matrix-vector and tiled
//! kernels) against an f64 product with the dequantized weights, its gradient, and refused inputs.

mod common;

use common::*;
use half::f16;
use hierarchos::core::quant::{Fusion, GgmlType, QTensor, dequantize};
use hierarchos::core::{DType, Tensor};

const TYPES: [GgmlType; 8] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Byte offsets of the f16 fields of a block (d, and m / dmin where the format has one).
fn half_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q6_K => &[208],
        _ => &[0, 2],
    }
}

/// `blocks` random blocks of `ty`: random bytes, with finite f16 scales drawn by `scale`.
fn random_blocks(rng: &mut Rng, ty: GgmlType, blocks: usize, scale: &mut dyn FnMut(&mut Rng) -> f16) -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..blocks * ty.type_size()).map(|_| rng.next_u64() as u8).collect();
    for b in bytes.chunks_exact_mut(ty.type_size()) {
        for &o in half_fields(ty) {
            b[o..o + 2].copy_from_slice(&scale(rng).to_le_bytes());
        }
    }
    bytes
}

/// Any finite f16, subnormals included (stresses the exact f16 decoding of the kernels).
fn any_finite_half(rng: &mut Rng) -> f16 {
    loop {
        let h = f16::from_bits(rng.next_u64() as u16);
        if h.is_finite() {
            return h;
        }
    }
}

/// Scales of the size real weights have, so that products stay well conditioned.
fn small_half(rng: &mut Rng) -> f16 {
    f16::from_f32(rng.uniform(-0.05, 0.05))
}

/// Element `i` of block `b`, read straight from the ggml format description, one element at a time.
fn reference(ty: GgmlType, b: &[u8], i: usize) -> f32 {
    let h = |o: usize| f16::from_le_bytes([b[o], b[o + 1]]).to_f32();
    let nibble = |qs: usize, j: usize| (b[qs + j % 16] >> (4 * (j / 16))) & 15;
    let bit = |qh: usize, j: usize| (u32::from_le_bytes([b[qh], b[qh + 1], b[qh + 2], b[qh + 3]]) >> j) & 1;
    let k_scale_min = |j: usize| {
        let s = &b[4..16];
        if j < 4 {
            (s[j] & 63, s[j + 4] & 63)
        } else {
            (
                (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4),
                (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
            )
        }
    };
    match ty {
        GgmlType::Q4_0 => (nibble(2, i) as f32 - 8.0) * h(0),
        GgmlType::Q4_1 => nibble(4, i) as f32 * h(0) + h(2),
        GgmlType::Q5_0 => ((nibble(6, i) as u32 | bit(2, i) << 4) as f32 - 16.0) * h(0),
        GgmlType::Q5_1 => (nibble(8, i) as u32 | bit(4, i) << 4) as f32 * h(0) + h(2),
        GgmlType::Q8_0 => b[2 + i] as i8 as f32 * h(0),
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let sub = i / 32;
            let qs = if ty == GgmlType::Q4_K { 16 } else { 48 };
            let mut q = (b[qs + 32 * (i / 64) + i % 32] >> (4 * (sub % 2))) & 15;
            if ty == GgmlType::Q5_K {
                q |= ((b[16 + i % 32] >> sub) & 1) << 4;
            }
            let (sc, m) = k_scale_min(sub);
            h(0) * sc as f32 * q as f32 - h(2) * m as f32
        }
        GgmlType::Q6_K => {
            let (half, quarter, l) = (i / 128, (i % 128) / 32, i % 32);
            let low = (b[64 * half + 32 * (quarter % 2) + l] >> (4 * (quarter / 2))) & 15;
            let high = (b[128 + 32 * half + l] >> (2 * quarter)) & 3;
            let scale = b[192 + 8 * half + l / 16 + 2 * quarter] as i8;
            h(208) * scale as f32 * ((low | high << 4) as f32 - 32.0)
        }
        _ => unreachable!(),
    }
}

fn reference_all(ty: GgmlType, bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(ty.type_size())
        .flat_map(|b| (0..ty.block_size()).map(move |i| reference(ty, b, i)))
        .collect()
}

fn assert_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{what}: element {i}: got {g:e}, want {w:e}");
    }
}

#[test]
fn cpu_dequantize_matches_the_format_description() {
    let mut rng = Rng::new("cpu_dequantize_matches_the_format_description");
    for ty in TYPES {
        let bytes = random_blocks(&mut rng, ty, 40, &mut any_finite_half);
        let got = dequantize(ty, &bytes, 40 * ty.block_size()).unwrap();
        assert_bits(ty.name(), &got, &reference_all(ty, &bytes));
    }
}

#[test]
fn float_types_dequantize_exactly() {
    let v = [1.5f32, -0.0, 65504.0, 1e-7, -3.25];
    let f32_bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    assert_bits("F32", &dequantize(GgmlType::F32, &f32_bytes, 5).unwrap(), &v);
    let f16_bytes: Vec<u8> = v.iter().flat_map(|&x| f16::from_f32(x).to_le_bytes()).collect();
    let want: Vec<f32> = v.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
    assert_bits("F16", &dequantize(GgmlType::F16, &f16_bytes, 5).unwrap(), &want);
    let bf16_bytes: Vec<u8> = v.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect();
    let want: Vec<f32> = v.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect();
    assert_bits("BF16", &dequantize(GgmlType::BF16, &bf16_bytes, 5).unwrap(), &want);
}

#[test]
fn type_table() {
    for ty in TYPES {
        assert_eq!(GgmlType::from_id(ty.id()), Some(ty));
    }
    assert_eq!(GgmlType::from_id(4), None, "Q4_2 was removed from ggml");
    assert_eq!(GgmlType::from_id(1000), None);
    assert_eq!((GgmlType::Q4_K.block_size(), GgmlType::Q4_K.type_size()), (256, 144));
    assert_eq!(GgmlType::Q6_K.bytes_for(512), Some(420));
    assert_eq!(GgmlType::Q8_0.bytes_for(33), None);
    assert_eq!(GgmlType::Q2_K.name(), "Q2_K");
    assert!(!GgmlType::Q2_K.is_supported());
}

#[test]
fn gpu_dequantize_is_bit_exact() {
    let mut rng = Rng::new("gpu_dequantize_is_bit_exact");
    let d = dev();
    for ty in TYPES {
        for (rows, blocks_per_row) in [(1, 1), (3, 2), (17, 1)] {
            let cols = blocks_per_row * ty.block_size();
            let bytes = random_blocks(&mut rng, ty, rows * blocks_per_row, &mut any_finite_half);
            let q = QTensor::from_ggml(ty, &bytes, [rows, cols], &d).unwrap();
            let t = q.dequantize().unwrap();
            assert_eq!(t.shape(), &[rows, cols]);
            let want = dequantize(ty, &bytes, rows * cols).unwrap();
            assert_bits(&format!("{ty} [{rows}, {cols}]"), &t.to_vec::<f32>().unwrap(), &want);
        }
    }
}

/// `x @ W^T` with f64 accumulation, and for each output the sum of |x_k w_k| that bounds its rounding error.
fn reference_matmul(x: &[f64], w: &[f32], m: usize, n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    let mut out = vec![0.0; m * n];
    let mut mag = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            for l in 0..k {
                let p = x[i * k + l] * w[j * k + l] as f64;
                out[i * n + j] += p;
                mag[i * n + j] += p.abs();
            }
        }
    }
    (out, mag)
}

/// f32 accumulation of K products, each rounded once, in some order: the error is below K * 2^-24 of the sum of
/// magnitudes (and in practice far below); 1e-5 of it leaves a margin for K up to ~160 in the worst case and for
/// any K in the typical one (errors grow like sqrt(K)).
fn check_matmul(what: &str, got: &[f32], want: &[f64], mag: &[f64], rel: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(mag).enumerate() {
        let tol = rel * s + 1e-30;
        assert!(
            (g as f64 - w).abs() <= tol,
            "{what}: element {i}: got {g}, want {w} (tolerance {tol:e})"
        );
    }
}

#[test]
fn matmul_q_matches_dequantized_product() {
    let mut rng = Rng::new("matmul_q_matches_dequantized_product");
    let d = dev();
    for ty in TYPES {
        let k = if ty.block_size() == 32 { 96 } else { 512 };
        for n in [1, 3, 17, 67] {
            let bytes = random_blocks(&mut rng, ty, n * k / ty.block_size(), &mut small_half);
            let q = QTensor::from_ggml(ty, &bytes, [n, k], &d).unwrap();
            let wv = dequantize(ty, &bytes, n * k).unwrap();
            for m in [1, 3, 8, 9, 33] {
                let xv = rng.vec(m * k, -1.0, 1.0);
                let x = Tensor::from_slice(&xv, &[m, k], &d).unwrap();
                let y = x.matmul_q(&q).unwrap();
                assert_eq!(y.shape(), &[m, n]);
                let x64: Vec<f64> = xv.iter().map(|&v| v as f64).collect();
                let (want, mag) = reference_matmul(&x64, &wv, m, n, k);
                check_matmul(
                    &format!("{ty} m={m} n={n} k={k}"),
                    &y.to_vec().unwrap(),
                    &want,
                    &mag,
                    1e-5,
                );
            }
        }
    }
}

#[test]
fn matmul_q_batched_strided_and_half_inputs() {
    let mut rng = Rng::new("matmul_q_batched_strided_and_half_inputs");
    let d = dev();
    let (ty, n, k) = (GgmlType::Q4_1, 19, 64);
    let bytes = random_blocks(&mut rng, ty, n * k / 32, &mut small_half);
    let q = QTensor::from_ggml(ty, &bytes, [n, k], &d).unwrap();
    let wv = dequantize(ty, &bytes, n * k).unwrap();
    for (batch, m) in [(2, 3), (3, 7)] {
        // Batched rows [batch, m, K].
        let xv = rng.vec(batch * m * k, -1.0, 1.0);
        let x = Tensor::from_slice(&xv, &[batch, m, k], &d).unwrap();
        let y = x.matmul_q(&q).unwrap();
        assert_eq!(y.shape(), &[batch, m, n]);
        let x64: Vec<f64> = xv.iter().map(|&v| v as f64).collect();
        let (want, mag) = reference_matmul(&x64, &wv, batch * m, n, k);
        check_matmul("batched", &y.to_vec().unwrap(), &want, &mag, 1e-5);
        // A transposed view [m, K] of storage [K, m], and a narrowed one whose rows start at an odd offset.
        let tv = rng.vec(k * m, -1.0, 1.0);
        let xt = Tensor::from_slice(&tv, &[k, m], &d).unwrap().t().unwrap();
        let x64 = host(&xt, &tv);
        let (want, mag) = reference_matmul(&x64, &wv, m, n, k);
        check_matmul(
            "transposed",
            &xt.matmul_q(&q).unwrap().to_vec().unwrap(),
            &want,
            &mag,
            1e-5,
        );
        let wide = rng.vec(m * (k + 3), -1.0, 1.0);
        let xn = Tensor::from_slice(&wide, &[m, k + 3], &d)
            .unwrap()
            .narrow(1, 1, k)
            .unwrap();
        let x64 = host(&xn, &wide);
        let (want, mag) = reference_matmul(&x64, &wv, m, n, k);
        check_matmul(
            "narrowed",
            &xn.matmul_q(&q).unwrap().to_vec().unwrap(),
            &want,
            &mag,
            1e-5,
        );
        // 16-bit inputs give 16-bit results (computed in f32, rounded once).
        for dtype in [DType::F16, DType::BF16] {
            let xh = x.to_dtype(dtype).unwrap();
            let y = xh.matmul_q(&q).unwrap();
            assert_eq!(y.dtype(), dtype);
            let x64: Vec<f64> = xh.to_f32_vec().unwrap().iter().map(|&v| v as f64).collect();
            let (want, mag) = reference_matmul(&x64, &wv, batch * m, n, k);
            check_matmul(&format!("{dtype}"), &y.to_f32_vec().unwrap(), &want, &mag, 1e-2);
        }
    }
}

/// The elements of view `t` of a tensor whose storage holds `base`, in row-major order.
fn host(t: &Tensor, base: &[f32]) -> Vec<f64> {
    let l = t.layout();
    strided_indices(&l.shape, &l.strides, l.offset)
        .into_iter()
        .map(|i| base[i] as f64)
        .collect()
}

#[test]
fn matmul_q_empty() {
    let mut rng = Rng::new("matmul_q_empty");
    let d = dev();
    let ty = GgmlType::Q8_0;
    let q = QTensor::from_ggml(ty, &random_blocks(&mut rng, ty, 6, &mut small_half), [3, 64], &d).unwrap();
    let y = Tensor::zeros(&[0, 64], DType::F32, &d).unwrap().matmul_q(&q).unwrap();
    assert_eq!(y.shape(), &[0, 3]);
    let none = QTensor::from_ggml(ty, &[], [0, 64], &d).unwrap();
    assert_eq!(none.dequantize().unwrap().shape(), &[0, 64]);
    let x = Tensor::from_slice(&rng.vec(128, -1.0, 1.0), &[2, 64], &d).unwrap();
    assert_eq!(x.matmul_q(&none).unwrap().shape(), &[2, 0]);
}

#[test]
fn matmul_q_gradient() {
    let mut rng = Rng::new("matmul_q_gradient");
    let d = dev();
    let ty = GgmlType::Q4_K;
    let q = QTensor::from_ggml(ty, &random_blocks(&mut rng, ty, 2, &mut small_half), [2, 256], &d).unwrap();
    let x = rng.vec(256, -1.0, 1.0);
    gradcheck("matmul_q", &mut rng, &[(x, vec![1, 256])], |t| t[0].matmul_q(&q));
}

#[test]
fn refused_inputs() {
    let mut rng = Rng::new("refused_inputs");
    let d = dev();
    let ty = GgmlType::Q4_0;
    let bytes = random_blocks(&mut rng, ty, 4, &mut small_half);
    // Unsupported or float types, rows that are not whole blocks, byte counts that do not match.
    assert!(QTensor::from_ggml(GgmlType::F32, &[0; 16], [2, 2], &d).is_err());
    assert!(QTensor::from_ggml(GgmlType::Q2_K, &[0; 84], [1, 256], &d).is_err());
    assert!(QTensor::from_ggml(ty, &bytes, [4, 16], &d).is_err());
    assert!(QTensor::from_ggml(ty, &bytes, [4, 64], &d).is_err());
    assert!(QTensor::from_ggml(ty, &bytes[1..], [2, 64], &d).is_err());
    assert!(QTensor::from_ggml(ty, &bytes, [usize::MAX, 64], &d).is_err());
    assert!(dequantize(ty, &bytes, 96).is_err());
    assert!(dequantize(ty, &bytes, 100).is_err());
    assert!(dequantize(GgmlType::Q3_K, &[0; 110], 256).is_err());
    assert!(dequantize(GgmlType::F32, &[0; 7], 2).is_err());
    // Operands that do not fit.
    let q = QTensor::from_ggml(ty, &bytes, [2, 64], &d).unwrap();
    let x = Tensor::from_slice(&rng.vec(32, -1.0, 1.0), &[1, 32], &d).unwrap();
    assert!(x.matmul_q(&q).is_err());
    let s = Tensor::from_slice(&[1.0f32], &[], &d).unwrap();
    assert!(s.matmul_q(&q).is_err());
    let ints = Tensor::from_slice(&[1u32; 64], &[1, 64], &d).unwrap();
    assert!(ints.matmul_q(&q).is_err());
}

#[test]
fn stacked_rows_and_row_views() {
    let mut rng = Rng::new("stacked_rows_and_row_views");
    let d = dev();
    for ty in TYPES {
        let k = 2 * ty.block_size();
        let sizes = [3, 1, 5];
        let parts: Vec<(Vec<u8>, QTensor)> = sizes
            .iter()
            .map(|&n| {
                let bytes = random_blocks(&mut rng, ty, n * 2, &mut small_half);
                let q = QTensor::from_ggml(ty, &bytes, [n, k], &d).unwrap();
                (bytes, q)
            })
            .collect();
        let refs: Vec<&QTensor> = parts.iter().map(|(_, q)| q).collect();
        let stacked = QTensor::cat_rows(&refs).unwrap();
        assert_eq!(stacked.shape(), [9, k]);
        let all: Vec<u8> = parts.iter().flat_map(|(b, _)| b.clone()).collect();
        let want = dequantize(ty, &all, 9 * k).unwrap();
        assert_bits(
            &format!("{ty} cat_rows"),
            &stacked.dequantize().unwrap().to_vec().unwrap(),
            &want,
        );
        // Each row view dequantizes and multiplies (matrix-vector and tiled kernels) as its own matrix does.
        let mut start = 0;
        for (n, (bytes, own)) in sizes.iter().zip(&parts) {
            let view = stacked.narrow_rows(start, *n).unwrap();
            let want = dequantize(ty, bytes, n * k).unwrap();
            assert_bits(
                &format!("{ty} view at {start}"),
                &view.dequantize().unwrap().to_vec().unwrap(),
                &want,
            );
            for m in [1, 9] {
                let x = Tensor::from_slice(&rng.vec(m * k, -1.0, 1.0), &[m, k], &d).unwrap();
                let got = x.matmul_q(&view).unwrap().to_vec::<f32>().unwrap();
                let expect = x.matmul_q(own).unwrap().to_vec::<f32>().unwrap();
                assert_bits(&format!("{ty} view at {start} m={m}"), &got, &expect);
            }
            start += n;
        }
        assert!(stacked.narrow_rows(7, 3).is_err());
        assert!(stacked.narrow_rows(usize::MAX, 2).is_err(), "an end past usize");
    }
    let a = QTensor::from_ggml(GgmlType::Q8_0, &[0; 34], [1, 32], &d).unwrap();
    let b = QTensor::from_ggml(GgmlType::Q4_0, &[0; 18], [1, 32], &d).unwrap();
    assert!(QTensor::cat_rows(&[&a, &b]).is_err(), "formats differ");
    assert!(QTensor::cat_rows(&[]).is_err());
}

fn gated(op: hierarchos::core::UnaryOp) -> Fusion<'static> {
    Fusion {
        gate: Some(op),
        ..Fusion::default()
    }
}

#[test]
fn gated_matvec_equals_matmul_then_gated() {
    use hierarchos::core::UnaryOp;
    let mut rng = Rng::new("gated_matvec_equals_matmul_then_gated");
    let d = dev();
    for ty in TYPES {
        let k = 2 * ty.block_size();
        for n in [1, 3, 17] {
            let gate = random_blocks(&mut rng, ty, n * 2, &mut small_half);
            let up = random_blocks(&mut rng, ty, n * 2, &mut small_half);
            let wg = QTensor::from_ggml(ty, &gate, [n, k], &d).unwrap();
            let wu = QTensor::from_ggml(ty, &up, [n, k], &d).unwrap();
            let stacked = QTensor::cat_rows(&[&wg, &wu]).unwrap();
            for (m, op) in [
                (1, UnaryOp::Silu),
                (3, UnaryOp::Gelu),
                (8, UnaryOp::GeluTanh),
                (9, UnaryOp::Silu),
            ] {
                let x = Tensor::from_slice(&rng.vec(m * k, -1.0, 1.0), &[m, k], &d).unwrap();
                let got = x.matmul_q_fused(&stacked, gated(op)).unwrap();
                assert_eq!(got.shape(), [m, n]);
                let want = x.matmul_q(&wg).unwrap().gated(&x.matmul_q(&wu).unwrap(), op).unwrap();
                assert_bits(
                    &format!("{ty} m={m} n={n} {op:?}"),
                    &got.to_vec::<f32>().unwrap(),
                    &want.to_vec::<f32>().unwrap(),
                );
            }
        }
    }
    let odd = QTensor::from_ggml(GgmlType::Q8_0, &[0; 3 * 34], [3, 32], &d).unwrap();
    let x = Tensor::zeros(&[1, 32], DType::F32, &d).unwrap();
    assert!(
        x.matmul_q_fused(&odd, gated(UnaryOp::Silu)).is_err(),
        "odd number of rows"
    );
    // One launch for decode rows (on a device of its own, so other tests' launches do not count).
    let own = own_dev();
    let w = QTensor::from_ggml(GgmlType::Q8_0, &[0; 2 * 34], [2, 32], &own).unwrap();
    let x = Tensor::zeros(&[1, 32], DType::F32, &own).unwrap();
    let before = own.dispatch_count();
    x.matmul_q_fused(&w, gated(UnaryOp::Silu)).unwrap();
    assert_eq!(own.dispatch_count() - before, 1);
}

#[test]
fn fused_norm_and_residual_match_the_separate_ops() {
    use hierarchos::core::UnaryOp;
    let mut rng = Rng::new("fused_norm_and_residual_match_the_separate_ops");
    let d = dev();
    let host = |t: &Tensor| t.to_vec::<f32>().unwrap();
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q6_K] {
        let k = 2 * ty.block_size();
        let n = 5;
        let w = QTensor::from_ggml(
            ty,
            &random_blocks(&mut rng, ty, 2 * n * 2, &mut small_half),
            [2 * n, k],
            &d,
        )
        .unwrap();
        let w_abs = w.dequantize().unwrap().abs().unwrap();
        let g = Tensor::from_slice(&rng.vec(k, 0.5, 1.5), &[k], &d).unwrap();
        for m in [1, 3, 8, 11] {
            // Rows of x far from unit scale, so that a missing or wrong norm shows.
            let x = Tensor::from_slice(&rng.vec(m * k, -4.0, 4.0), &[m, k], &d).unwrap();
            let res = Tensor::from_slice(&rng.vec(m * n, -1.0, 1.0), &[m, n], &d).unwrap();
            let res2 = Tensor::from_slice(&rng.vec(m * 2 * n, -1.0, 1.0), &[m, 2 * n], &d).unwrap();
            let normed = x.rms_norm(Some(&g), 1e-5).unwrap();
            // Per output, the sum of |input| |weight| that bounds the rounding of a K-term dot product.
            let mag = host(&normed.abs().unwrap().matmul(&w_abs.t().unwrap()).unwrap());
            let y = normed.matmul_q(&w).unwrap();
            let yv = host(&y);

            let norm = Fusion {
                norm: Some((&g, 1e-5)),
                ..Fusion::default()
            };
            let got = host(&x.matmul_q_fused(&w, norm).unwrap());
            let want: Vec<f64> = yv.iter().map(|&v| v as f64).collect();
            check_matmul(
                &format!("{ty} norm m={m}"),
                &got,
                &want,
                &mag.iter().map(|&v| v as f64).collect::<Vec<_>>(),
                1e-5,
            );

            let residual = Fusion {
                residual: Some(&res2),
                ..Fusion::default()
            };
            let got = host(&x.matmul_q_fused(&w, residual).unwrap());
            let half_res = res2.to_dtype(DType::F16).unwrap();
            let wrong = Fusion {
                residual: Some(&half_res),
                ..Fusion::default()
            };
            let message = x.matmul_q_fused(&w, wrong).unwrap_err().to_string();
            assert!(message.contains("f32 residual"), "an f16 residual: {message}");
            assert_bits(
                &format!("{ty} residual m={m}"),
                &got,
                &host(&res2.add(&x.matmul_q(&w).unwrap()).unwrap()),
            );

            let all = Fusion {
                norm: Some((&g, 1e-5)),
                gate: Some(UnaryOp::Silu),
                residual: Some(&res),
            };
            let got = x.matmul_q_fused(&w, all).unwrap();
            assert_eq!(got.shape(), [m, n]);
            let got = host(&got);
            let rv = host(&res);
            let silu = |v: f64| v / (1.0 + (-v).exp());
            for r in 0..m {
                for j in 0..n {
                    let (gate, up) = (yv[r * 2 * n + j] as f64, yv[r * 2 * n + n + j] as f64);
                    let (mg, mu) = (mag[r * 2 * n + j] as f64, mag[r * 2 * n + n + j] as f64);
                    let want = rv[r * n + j] as f64 + silu(gate) * up;
                    // Each projection is off by up to 1e-5 of its magnitude; silu' is at most 1.1.
                    let tol = 1e-5 * (1.1 * mg * up.abs() + silu(gate).abs() * mu + mg * mu) + 1e-6;
                    let g = got[r * n + j] as f64;
                    assert!(
                        (g - want).abs() <= tol,
                        "{ty} all m={m} [{r}, {j}]: got {g}, want {want} ({tol:e})"
                    );
                }
            }
        }
        let x = Tensor::zeros(&[1, k], DType::F32, &d).unwrap();
        let bad = Tensor::zeros(&[1, 3], DType::F32, &d).unwrap();
        let residual = Fusion {
            residual: Some(&bad),
            ..Fusion::default()
        };
        assert!(x.matmul_q_fused(&w, residual).is_err(), "residual of the wrong shape");
        let norm = Fusion {
            norm: Some((&bad, 1e-5)),
            ..Fusion::default()
        };
        assert!(x.matmul_q_fused(&w, norm).is_err(), "norm weight of the wrong shape");
    }
}
