//! The fused rotary + cache update of one inference step against the unfused ops and a CPU reference.

mod common;

use common::{Rng, assert_close, dev, same_tables};
use hierarchos::core::ops::rope::RopeTables;
use hierarchos::core::{DType, Tensor, no_grad};

/// `x * cos + rotate_half(x) * sin` on the last dimension of a row-major `[.., D]` buffer, with `[D/2]` tables
/// per row chosen by `row_pos`.
fn rope_ref(x: &[f32], d: usize, cos: &[f32], sin: &[f32], table_row: impl Fn(usize) -> usize) -> Vec<f64> {
    let half = d / 2;
    let mut out = vec![0.0; x.len()];
    for (row, chunk) in x.chunks(d).enumerate() {
        let tr = table_row(row) * half;
        for j in 0..d {
            let jj = j % half;
            let (c, s) = (cos[tr + jj] as f64, sin[tr + jj] as f64);
            let partner = if j < half {
                -(chunk[j + half] as f64)
            } else {
                chunk[j - half] as f64
            };
            out[row * d + j] = chunk[j] as f64 * c + partner * s;
        }
    }
    out
}

#[test]
fn rope_into_cache_matches_rope_and_write_at() {
    let mut rng = Rng::new("rope_into_cache_matches_rope_and_write_at");
    let dev = dev();
    for &(b, t, h, kvh, d, len, max_len) in &[
        (1, 1, 1, 1, 2, 0, 1),
        (1, 1, 9, 3, 64, 5, 8),
        (2, 3, 4, 2, 6, 1, 5),
        (1, 17, 3, 1, 8, 0, 20),
    ] {
        // q, k, v as views of one fused projection output [B, T, (H + 2 KVH) * D], the layout attention gets.
        let width = (h + 2 * kvh) * d;
        let qkv_host = rng.vec(b * t * width, -1.0, 1.0);
        let qkv = Tensor::from_slice(&qkv_host, &[b, t, width], &dev).unwrap();
        let part = |start: usize, heads: usize| {
            qkv.narrow(2, start * d, heads * d)
                .unwrap()
                .reshape(&[b, t, heads, d])
                .unwrap()
        };
        let (q, k, v) = (part(0, h), part(h, kvh), part(h + kvh, kvh));
        let tab_host: Vec<Vec<f32>> = (0..4).map(|_| rng.vec(t * d / 2, -1.0, 1.0)).collect();
        let tabs: Vec<Tensor> = tab_host
            .iter()
            .map(|v| Tensor::from_slice(v, &[t, d / 2], &dev).unwrap())
            .collect();
        let tables = RopeTables {
            cos_q: &tabs[0],
            sin_q: &tabs[1],
            cos_k: &tabs[2],
            sin_k: &tabs[3],
        };
        let cache_host = rng.vec(b * kvh * max_len * d, -1.0, 1.0);
        let kc = Tensor::from_slice(&cache_host, &[b, kvh, max_len, d], &dev).unwrap();
        let vc = Tensor::from_slice(&cache_host, &[b, kvh, max_len, d], &dev).unwrap();
        let region = |c: &Tensor| c.narrow(2, len, t).unwrap();
        let got_q = no_grad(|| q.rope_into_cache(&k, &v, tables, &region(&kc), &region(&vc))).unwrap();
        assert_eq!(got_q.shape(), [b, h, t, d]);

        // Unfused: rope then transpose, and write_at into fresh copies of the caches.
        let want_q = q.permute(&[0, 2, 1, 3]).unwrap().rope(&tabs[0], &tabs[1]).unwrap();
        let kc2 = Tensor::from_slice(&cache_host, &[b, kvh, max_len, d], &dev).unwrap();
        let vc2 = Tensor::from_slice(&cache_host, &[b, kvh, max_len, d], &dev).unwrap();
        let k_rot = k.permute(&[0, 2, 1, 3]).unwrap().rope(&tabs[2], &tabs[3]).unwrap();
        kc2.write_at(2, len, &k_rot).unwrap();
        vc2.write_at(2, len, &v.permute(&[0, 2, 1, 3]).unwrap()).unwrap();
        let bits = |x: &Tensor| {
            x.to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(bits(&got_q), bits(&want_q), "queries {b} {t} {h} {kvh} {d}");
        assert_eq!(bits(&kc), bits(&kc2), "key cache {b} {t} {h} {kvh} {d}");
        assert_eq!(bits(&vc), bits(&vc2), "value cache {b} {t} {h} {kvh} {d}");

        // And against the CPU: queries [B, H, T, D] from the host buffer.
        let mut q_host = Vec::new();
        for bi in 0..b {
            for hi in 0..h {
                for ti in 0..t {
                    let at = (bi * t + ti) * width + hi * d;
                    q_host.extend_from_slice(&qkv_host[at..at + d]);
                }
            }
        }
        let want = rope_ref(&q_host, d, &tab_host[0], &tab_host[1], |row| row % t);
        assert_close("rope_into_cache q", &got_q.to_vec::<f32>().unwrap(), &want, 1e-6, 1e-6);
        let kc_host = kc.to_vec::<f32>().unwrap();
        let untouched: Vec<f64> = (0..kc_host.len())
            .filter(|i| !(len..len + t).contains(&(i / d % max_len)))
            .map(|i| cache_host[i] as f64)
            .collect();
        let kept: Vec<f32> = (0..kc_host.len())
            .filter(|i| !(len..len + t).contains(&(i / d % max_len)))
            .map(|i| kc_host[i])
            .collect();
        assert_close("rope_into_cache leaves other positions", &kept, &untouched, 0.0, 0.0);
    }
}

#[test]
fn rope_into_cache_rejects_bad_arguments() {
    let dev = dev();
    let z = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &dev).unwrap();
    let (q, k) = (z(&[1, 2, 4, 8]), z(&[1, 2, 2, 8]));
    let tab = z(&[2, 4]);
    let tables = same_tables(&tab);
    let (kc, vc) = (z(&[1, 2, 2, 8]), z(&[1, 2, 2, 8]));
    assert!(q.rope_into_cache(&k, &k, tables, &kc, &vc).is_ok());
    // Wrong cache region length, odd head size, shared cache buffer, dtype, head mismatch.
    assert!(q.rope_into_cache(&k, &k, tables, &z(&[1, 2, 3, 8]), &vc).is_err());
    let odd = z(&[1, 2, 4, 7]);
    assert!(
        odd.rope_into_cache(&z(&[1, 2, 2, 7]), &z(&[1, 2, 2, 7]), tables, &kc, &vc)
            .is_err()
    );
    assert!(q.rope_into_cache(&k, &k, tables, &kc, &kc).is_err());
    let k16 = Tensor::zeros(&[1, 2, 2, 8], DType::F16, &dev).unwrap();
    assert!(q.rope_into_cache(&k16, &k, tables, &kc, &vc).is_err());
    assert!(
        q.rope_into_cache(&z(&[1, 2, 2, 6]), &z(&[1, 2, 2, 6]), tables, &kc, &vc)
            .is_err()
    );
    let trainable = q.requires_grad_();
    assert!(trainable.rope_into_cache(&k, &k, tables, &kc, &vc).is_err());
}
