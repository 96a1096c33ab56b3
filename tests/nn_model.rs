//! The generic decoder (Llama, Mistral, Qwen2, Qwen3 options): rotary tables against f64 formulas, the rope and
//! in-place write ops, attention against a naive f64 reference (causal, sliding window, GQA, MQA), whole tiny
//! random models against an f64 CPU decoder, and KV-cache decoding against recomputing the full prefix.
//!
//! Parity with Hugging Face transformers itself is checked on the reference fixtures (`tests/fixtures/<family>/`,
//! made by `scripts/make_fixtures.py`); [`reference_forward`] here is the same computation written plainly, so a
//! fixture mismatch that this file does not show points at the config or the weights, not the decoder.

mod common;
use std::collections::HashMap;

use common::*;
use hierarchos::core::{DType, Tensor};
use hierarchos::nn::attention::{FUSED_ATTENTION_MAX_QUERIES, attention_mask, scaled_dot_product};
use hierarchos::nn::rope::RotaryEmbedding;
use hierarchos::nn::{Activation, CausalLm, Error, ModelConfig, RopeConfig, RopeScaling};

// ----- rotary tables -----

/// transformers' inverse frequencies, written out in f64.
fn ref_inv_freq(d: usize, rope: &RopeConfig, seq_len: usize) -> Vec<f64> {
    let dd = d as f64;
    let default = |base: f64| {
        (0..d / 2)
            .map(|i| base.powf(-((2 * i) as f64) / dd))
            .collect::<Vec<f64>>()
    };
    let theta = rope.theta;
    match &rope.scaling {
        RopeScaling::Default => default(theta),
        RopeScaling::Linear { factor } => default(theta).iter().map(|f| f / factor).collect(),
        RopeScaling::Dynamic {
            factor,
            original_max_position_embeddings: orig,
        } => {
            let seq = seq_len.max(*orig) as f64;
            default(theta * (factor * seq / *orig as f64 - (factor - 1.0)).powf(dd / (dd - 2.0)))
        }
        RopeScaling::Llama3 {
            factor,
            low_freq_factor: lo,
            high_freq_factor: hi,
            original_max_position_embeddings: orig,
        } => default(theta)
            .iter()
            .map(|&f| {
                let wavelen = 2.0 * std::f64::consts::PI / f;
                let old = *orig as f64;
                if wavelen < old / hi {
                    f
                } else if wavelen > old / lo {
                    f / factor
                } else {
                    let s = (old / wavelen - lo) / (hi - lo);
                    (1.0 - s) * f / factor + s * f
                }
            })
            .collect(),
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings: orig,
            beta_fast,
            beta_slow,
            ..
        } => {
            let corr = |r: f64| dd * (*orig as f64 / (r * 2.0 * std::f64::consts::PI)).ln() / (2.0 * theta.ln());
            let low = corr(*beta_fast).floor().max(0.0);
            let mut high = corr(*beta_slow).ceil().min(dd - 1.0);
            if low == high {
                high += 0.001;
            }
            default(theta)
                .iter()
                .enumerate()
                .map(|(i, &f)| {
                    let keep = 1.0 - ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    f / factor * (1.0 - keep) + f * keep
                })
                .collect()
        }
        RopeScaling::LongRope {
            short_factor,
            long_factor,
            original_max_position_embeddings: orig,
            ..
        } => {
            let factors = if seq_len > *orig { long_factor } else { short_factor };
            default(theta).iter().zip(factors).map(|(f, e)| f / e).collect()
        }
    }
}

fn ref_attention_scaling(rope: &RopeConfig) -> f64 {
    match &rope.scaling {
        RopeScaling::Yarn {
            factor,
            attention_factor,
            ..
        } => attention_factor.unwrap_or(0.1 * factor.ln() + 1.0),
        RopeScaling::LongRope { attention_factor, .. } => *attention_factor,
        _ => 1.0,
    }
}

fn rope_types() -> Vec<RopeConfig> {
    let rope = |scaling| RopeConfig {
        theta: 10000.0,
        scaling,
    };
    vec![
        rope(RopeScaling::Default),
        RopeConfig {
            theta: 500000.0,
            scaling: RopeScaling::Default,
        },
        rope(RopeScaling::Linear { factor: 4.0 }),
        rope(RopeScaling::Dynamic {
            factor: 2.0,
            original_max_position_embeddings: 16,
        }),
        RopeConfig {
            theta: 500000.0,
            scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 64,
            },
        },
        rope(RopeScaling::Yarn {
            factor: 4.0,
            original_max_position_embeddings: 32,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: None,
        }),
        rope(RopeScaling::Yarn {
            factor: 2.0,
            original_max_position_embeddings: 2048,
            beta_fast: 16.0,
            beta_slow: 2.0,
            attention_factor: Some(1.25),
        }),
        // Past 16 positions the long factors; enough of each for heads of 128.
        rope(RopeScaling::LongRope {
            short_factor: (0..64).map(|i| 1.0 + i as f64 / 100.0).collect(),
            long_factor: (0..64).map(|i| 1.0 + i as f64 / 4.0).collect(),
            original_max_position_embeddings: 16,
            attention_factor: 1.2,
        }),
    ]
}

#[test]
fn rope_tables_match_f64_formulas_for_every_rope_type() {
    for rope in rope_types() {
        for d in [8usize, 64, 128] {
            let r = RotaryEmbedding::new(d, &rope).unwrap();
            for (start, len) in [(0usize, 5usize), (3, 1), (14, 6), (40, 3)] {
                let seq = start + len;
                let want = ref_inv_freq(d, &rope, seq);
                let got = r.inv_freq(seq);
                assert_eq!(got.len(), d / 2);
                for (g, w) in got.iter().zip(&want) {
                    assert!((g - w).abs() <= 2e-7 * w.abs(), "{rope:?} d={d}: inv_freq {g} vs {w}");
                }
                let (cos, sin) = r.tables(start, len);
                let a = ref_attention_scaling(&rope);
                for (k, (c, s)) in cos.iter().zip(&sin).enumerate() {
                    let pos = start + k / (d / 2);
                    let angle = pos as f64 * want[k % (d / 2)];
                    // f32 angles (as transformers forms them) are off by up to an ulp of the angle.
                    let tol = 2e-7 * (1.0 + angle.abs()) * a;
                    assert!((*c as f64 - angle.cos() * a).abs() <= tol, "{rope:?} cos at {pos}");
                    assert!((*s as f64 - angle.sin() * a).abs() <= tol, "{rope:?} sin at {pos}");
                }
            }
        }
    }
}

#[test]
fn dynamic_rope_rescales_only_past_the_original_context() {
    let rope = RopeConfig {
        theta: 10000.0,
        scaling: RopeScaling::Dynamic {
            factor: 2.0,
            original_max_position_embeddings: 16,
        },
    };
    let plain = RotaryEmbedding::new(
        8,
        &RopeConfig {
            theta: 10000.0,
            scaling: RopeScaling::Default,
        },
    )
    .unwrap();
    let r = RotaryEmbedding::new(8, &rope).unwrap();
    assert_eq!(r.inv_freq(16), plain.inv_freq(16));
    assert_eq!(r.inv_freq(3), plain.inv_freq(3));
    let long = r.inv_freq(40);
    assert!(
        long[1] < plain.inv_freq(40)[1],
        "longer sequences slow the frequencies down"
    );
    assert_eq!(long[0], 1.0);
}

/// An odd rotary dim has a frequency for each pair from 0 with the odd dim in the exponent, and rotates one
/// dimension more (transformers' `arange(0, dim, 2) / dim` and its cos table's width); none is refused.
#[test]
fn rotary_embedding_of_an_odd_dim_rotates_one_more() {
    let rope = RopeConfig {
        theta: 10000.0,
        scaling: RopeScaling::Default,
    };
    let odd = RotaryEmbedding::new(5, &rope).unwrap();
    assert_eq!(odd.rotated_dims(), 6);
    let inv = odd.inv_freq(1);
    assert_eq!(inv.len(), 3);
    for (got, want) in inv.iter().zip([1.0, 10000f64.powf(-0.4), 10000f64.powf(-0.8)]) {
        assert!((got - want).abs() <= want * 1e-6, "{got} against {want}");
    }
    assert!(matches!(RotaryEmbedding::new(0, &rope), Err(Error::Invalid(_))));
}

// ----- the rope and write_at ops -----

/// `x * cos + rotate_half(x) * sin` over the last dimension of a row-major `[rows, d]` array; `cs` gives the
/// `(cos, sin)` row (of `d / 2` values) for each row.
fn ref_rope(x: &[f32], d: usize, cs: impl Fn(usize) -> (Vec<f64>, Vec<f64>)) -> Vec<f64> {
    let h = d / 2;
    let mut out = vec![0.0; x.len()];
    for r in 0..x.len() / d {
        let (c, s) = cs(r);
        for j in 0..h {
            let (a, b) = (x[r * d + j] as f64, x[r * d + j + h] as f64);
            out[r * d + j] = a * c[j] - b * s[j];
            out[r * d + j + h] = b * c[j] + a * s[j];
        }
    }
    out
}

#[test]
fn rope_op_matches_rotate_half_on_strided_inputs() {
    let dv = dev();
    let mut rng = Rng::new("rope_op");
    // Heads whose half is a multiple of 4 take four pairs a thread, the others (2, 6) one.
    for (b, h, t, d) in [
        (1usize, 1usize, 1usize, 2usize),
        (2, 3, 5, 8),
        (1, 2, 17, 16),
        (2, 3, 4, 6),
    ] {
        // x is stored [B, T, H, D] and viewed [B, H, T, D], as attention does.
        let xs = rng.vec(b * t * h * d, -1.0, 1.0);
        let cos = rng.vec(t * d / 2, -1.0, 1.0);
        let sin = rng.vec(t * d / 2, -1.0, 1.0);
        let x = Tensor::from_slice(&xs, &[b, t, h, d], &dv)
            .unwrap()
            .permute(&[0, 2, 1, 3])
            .unwrap();
        let ct = Tensor::from_slice(&cos, &[t, d / 2], &dv).unwrap();
        let st = Tensor::from_slice(&sin, &[t, d / 2], &dv).unwrap();
        let got = x.rope(&ct, &st).unwrap();
        assert_eq!(got.shape(), &[b, h, t, d]);
        // Rotated in the order the view was cut from, so that attention's gradients come back in it too.
        assert_eq!(got.layout().strides, x.layout().strides);
        let xp = x.contiguous().unwrap().to_vec::<f32>().unwrap();
        let want = ref_rope(&xp, d, |r| {
            let pos = r % t;
            let row = |v: &[f32]| v[pos * d / 2..(pos + 1) * d / 2].iter().map(|&x| x as f64).collect();
            (row(&cos), row(&sin))
        });
        assert_close("rope", &got.to_vec::<f32>().unwrap(), &want, 1e-6, 1e-6);
    }
    // f32 tensors of rank up to 4 take the pair kernel, the rest the elementwise form: a rank-5 tensor, a
    // 16-bit one, and tables that are views (rows from position 2 of longer tables).
    let (t, d) = (5usize, 8usize);
    let long = |rng: &mut Rng| rng.vec((t + 2) * d / 2, -1.0, 1.0);
    let (cos, sin) = (long(&mut rng), long(&mut rng));
    let table = |v: &[f32]| {
        Tensor::from_slice(v, &[t + 2, d / 2], &dv)
            .unwrap()
            .narrow(0, 2, t)
            .unwrap()
    };
    let (ct, st) = (table(&cos), table(&sin));
    let xs = rng.vec(2 * 3 * t * d, -1.0, 1.0);
    let rows = |r: usize| {
        let pos = 2 + r % t;
        let row = |v: &[f32]| v[pos * d / 2..(pos + 1) * d / 2].iter().map(|&x| x as f64).collect();
        (row(&cos), row(&sin))
    };
    let want = ref_rope(&xs, d, rows);
    for (name, shape, dtype, tol) in [
        ("rank 4, table views", vec![2, 3, t, d], DType::F32, 1e-6),
        ("rank 5", vec![2, 1, 3, t, d], DType::F32, 1e-6),
        ("f16", vec![2, 3, t, d], DType::F16, 2e-3),
    ] {
        let x = Tensor::from_slice(&xs, &shape, &dv).unwrap().to_dtype(dtype).unwrap();
        let got = x.rope(&ct, &st).unwrap();
        assert_eq!(got.shape(), &shape[..]);
        assert_eq!(got.dtype(), dtype);
        let xr: Vec<f32> = x.to_f32_vec().unwrap();
        let want = if dtype == DType::F32 {
            want.clone()
        } else {
            ref_rope(&xr, d, rows)
        };
        assert_close(name, &got.to_f32_vec().unwrap(), &want, tol, tol);
    }
}

#[test]
fn rope_op_gradient_and_errors() {
    let dv = dev();
    let mut rng = Rng::new("rope_grad");
    let (t, d) = (3usize, 4usize);
    let cos = Tensor::from_slice(&rng.vec(t * d / 2, -1.0, 1.0), &[t, d / 2], &dv).unwrap();
    let sin = Tensor::from_slice(&rng.vec(t * d / 2, -1.0, 1.0), &[t, d / 2], &dv).unwrap();
    let x = rng.vec(2 * t * d, -1.0, 1.0);
    gradcheck("rope", &mut rng, &[(x, vec![2, t, d])], |v| v[0].rope(&cos, &sin));
    // Four pairs a thread (heads of 8), forward and backward.
    let table = |rng: &mut Rng| Tensor::from_slice(&rng.vec(t * 4, -1.0, 1.0), &[t, 4], &dv).unwrap();
    let (cos8, sin8) = (table(&mut rng), table(&mut rng));
    let x = rng.vec(2 * t * 8, -1.0, 1.0);
    gradcheck("rope, heads of 8", &mut rng, &[(x, vec![2, t, 8])], |v| {
        v[0].rope(&cos8, &sin8)
    });
    // Rank 5 takes the elementwise form, forward and backward.
    let (cos5, sin5) = (
        cos.reshape(&[t, 1, d / 2]).unwrap(),
        sin.reshape(&[t, 1, d / 2]).unwrap(),
    );
    let x = rng.vec(2 * t * d, -1.0, 1.0);
    gradcheck("rope rank 5", &mut rng, &[(x, vec![1, 2, t, 1, d])], |v| {
        v[0].rope(&cos5, &sin5)
    });
    let x = Tensor::zeros(&[2, 3, 5], DType::F32, &dv).unwrap();
    let c = Tensor::zeros(&[3, 2], DType::F32, &dv).unwrap();
    assert!(x.rope(&c, &c).is_err(), "odd head size");
    let x = Tensor::zeros(&[2, 3, 4], DType::F32, &dv).unwrap();
    let wrong = Tensor::zeros(&[3, 3], DType::F32, &dv).unwrap();
    assert!(x.rope(&wrong, &wrong).is_err(), "tables of the wrong width");
    let ids = Tensor::zeros(&[2, 3, 4], DType::U32, &dv).unwrap();
    assert!(ids.rope(&c, &c).is_err(), "integer input");
    let trainable = c.requires_grad_();
    assert!(x.rope(&trainable, &c).is_err(), "tables that require grad");
}

#[test]
fn write_at_fills_a_region_in_place() {
    let dv = dev();
    let mut rng = Rng::new("write_at");
    let (b, h, n, d) = (2usize, 3usize, 9usize, 4usize);
    let init = rng.vec(b * h * n * d, -1.0, 1.0);
    let dst = Tensor::from_slice(&init, &[b, h, n, d], &dv).unwrap();
    // The source is a permuted view ([B, T, H, D] storage), written at positions 4..7.
    let t = 3;
    let src_data = rng.vec(b * t * h * d, -1.0, 1.0);
    let src = Tensor::from_slice(&src_data, &[b, t, h, d], &dv)
        .unwrap()
        .permute(&[0, 2, 1, 3])
        .unwrap();
    dst.write_at(2, 4, &src).unwrap();
    let got = dst.to_vec::<f32>().unwrap();
    for (i, g) in got.iter().enumerate() {
        let (bi, hi, ni, di) = (i / (h * n * d), i / (n * d) % h, i / d % n, i % d);
        let want = if (4..7).contains(&ni) {
            src_data[((bi * t + ni - 4) * h + hi) * d + di]
        } else {
            init[i]
        };
        assert_eq!(*g, want, "element {i}");
    }
    dst.write_at(2, 0, &Tensor::zeros(&[b, h, 0, d], DType::F32, &dv).unwrap())
        .unwrap();
    let too_long = Tensor::zeros(&[b, h, 6, d], DType::F32, &dv).unwrap();
    assert!(dst.write_at(2, 4, &too_long).is_err(), "past the end");
    let wrong = Tensor::zeros(&[b, h, 1, d + 1], DType::F32, &dv).unwrap();
    assert!(dst.write_at(2, 0, &wrong).is_err(), "other dims differ");
    let ints = Tensor::zeros(&[b, h, 1, d], DType::U32, &dv).unwrap();
    assert!(dst.write_at(2, 0, &ints).is_err(), "dtype differs");
    assert!(dst.write_at(5, 0, &src).is_err(), "bad dim");
    assert!(dst.write_at(2, 0, &dst.narrow(2, 0, 1).unwrap()).is_err(), "aliasing");
    let bf = Tensor::zeros(&[4, 4], DType::BF16, &dv).unwrap();
    let bsrc = Tensor::zeros(&[1, 4], DType::BF16, &dv).unwrap();
    assert!(bf.write_at(0, 0, &bsrc).is_err(), "packed destination");
    assert!(
        dst.permute(&[0, 2, 1, 3]).unwrap().write_at(1, 0, &src).is_err(),
        "non-dense destination"
    );
}

// ----- attention -----

/// Naive attention in f64: q `[B, H, T, D]`, k and v `[B, KVH, S, D]`, row-major; queries at positions
/// `q_start..`, keys at `k_start..`.
#[allow(clippy::too_many_arguments)]
fn ref_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    (b, h, t, d): (usize, usize, usize, usize),
    (kvh, s): (usize, usize),
    q_start: usize,
    k_start: usize,
    window: Option<usize>,
) -> Vec<f64> {
    let g = h / kvh;
    let mut out = vec![0.0; b * h * t * d];
    for bi in 0..b {
        for hi in 0..h {
            let kv = hi / g;
            for ti in 0..t {
                let i = q_start + ti;
                let qrow = &q[((bi * h + hi) * t + ti) * d..][..d];
                let scores: Vec<f64> = (0..s)
                    .map(|si| {
                        let j = k_start + si;
                        if j > i || window.is_some_and(|w| j + w <= i) {
                            return f64::NEG_INFINITY;
                        }
                        let krow = &k[((bi * kvh + kv) * s + si) * d..][..d];
                        qrow.iter().zip(krow).map(|(&a, &b)| a as f64 * b as f64).sum()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for si in 0..s {
                    let vrow = &v[((bi * kvh + kv) * s + si) * d..][..d];
                    for di in 0..d {
                        out[((bi * h + hi) * t + ti) * d + di] += e[si] / z * vrow[di] as f64;
                    }
                }
            }
        }
    }
    out
}

#[test]
fn attention_matches_naive_reference() {
    let dv = dev();
    let mut rng = Rng::new("attention");
    // (B, H, KVH, T, D, S, q_start, k_start, window): MHA, GQA, MQA; prefill, decode with a cache, windows.
    type Case = (usize, usize, usize, usize, usize, usize, usize, usize, Option<usize>);
    let cases: [Case; 8] = [
        (1, 2, 2, 5, 8, 5, 0, 0, None),
        (2, 4, 2, 7, 8, 7, 0, 0, None),
        (1, 4, 1, 3, 4, 3, 0, 0, None),
        (1, 3, 1, 1, 8, 9, 8, 0, None),
        (2, 4, 2, 4, 8, 10, 6, 0, None),
        (1, 2, 1, 9, 8, 9, 0, 0, Some(3)),
        (1, 4, 2, 3, 8, 5, 7, 5, Some(3)),
        (1, 2, 2, 1, 8, 4, 12, 9, Some(4)),
    ];
    for (b, h, kvh, t, d, s, q_start, k_start, window) in cases {
        let what = format!("B{b} H{h} KVH{kvh} T{t} D{d} S{s} q{q_start} k{k_start} w{window:?}");
        let qd = rng.vec(b * h * t * d, -1.0, 1.0);
        let kd = rng.vec(b * kvh * s * d, -1.0, 1.0);
        let vd = rng.vec(b * kvh * s * d, -1.0, 1.0);
        let q = Tensor::from_slice(&qd, &[b, h, t, d], &dv).unwrap();
        // Keys and values sit inside a longer cache-like buffer, read through a narrowed view.
        let pad = 3;
        let embed = |data: &[f32]| {
            let big = Tensor::zeros(&[b, kvh, s + pad, d], DType::F32, &dv).unwrap();
            big.write_at(2, 1, &Tensor::from_slice(data, &[b, kvh, s, d], &dv).unwrap())
                .unwrap();
            big.narrow(2, 1, s).unwrap()
        };
        let (k, v) = (embed(&kd), embed(&vd));
        let mask =
            attention_mask(q_start, t, k_start, s, window).map(|m| Tensor::from_slice(&m, &[t, s], &dv).unwrap());
        let got = scaled_dot_product(&q, &k, &v, mask.as_ref()).unwrap();
        assert_eq!(got.shape(), &[b, h, t, d], "{what}");
        let want = ref_attention(&qd, &kd, &vd, (b, h, t, d), (kvh, s), q_start, k_start, window);
        assert_close(&what, &got.to_vec::<f32>().unwrap(), &want, 1e-5, 1e-6);
    }
}

#[test]
fn attention_mask_follows_the_causal_and_window_rules() {
    assert_eq!(
        attention_mask(5, 1, 0, 6, None),
        None,
        "one new token sees everything before it"
    );
    assert_eq!(
        attention_mask(5, 1, 3, 3, Some(3)),
        None,
        "window already applied by the key start"
    );
    let inf = f32::NEG_INFINITY;
    assert_eq!(
        attention_mask(0, 3, 0, 3, None),
        Some(vec![0.0, inf, inf, 0.0, 0.0, inf, 0.0, 0.0, 0.0])
    );
    // Window 2: query i sees keys i-1 and i.
    assert_eq!(
        attention_mask(0, 3, 0, 3, Some(2)),
        Some(vec![0.0, inf, inf, 0.0, 0.0, inf, inf, 0.0, 0.0])
    );
}

#[test]
fn attention_rejects_mismatched_shapes() {
    let dv = dev();
    let z = |s: &[usize]| Tensor::zeros(s, DType::F32, &dv).unwrap();
    let (q, k) = (z(&[1, 3, 2, 4]), z(&[1, 2, 2, 4]));
    assert!(
        scaled_dot_product(&q, &k, &k, None).is_err(),
        "heads not a multiple of kv heads"
    );
    let k = z(&[1, 1, 2, 4]);
    assert!(
        scaled_dot_product(&q, &k, &z(&[1, 1, 3, 4]), None).is_err(),
        "values differ from keys"
    );
    assert!(
        scaled_dot_product(&q, &z(&[1, 1, 2, 5]), &z(&[1, 1, 2, 5]), None).is_err(),
        "head size"
    );
    assert!(scaled_dot_product(&q, &k, &k, Some(&z(&[2, 3]))).is_err(), "mask shape");
    assert!(scaled_dot_product(&z(&[3, 2, 4]), &k, &k, None).is_err(), "rank");
}

// ----- tiny random models -----

fn tiny_config(family: &str) -> ModelConfig {
    let mut c = ModelConfig {
        model_type: family.to_string(),
        head_dim: 8,
        rotary_dim: 8,
        max_position_embeddings: 64,
        rms_norm_eps: 1e-6,
        rope: RopeConfig {
            theta: 10000.0,
            scaling: RopeScaling::Default,
        },
        bos_token_id: Some(1),
        eos_token_ids: vec![2],
        ..ModelConfig::llama(37, 32, 48, 2, 4, 2)
    };
    match family {
        "llama" => {
            c.tie_word_embeddings = true;
            c.rope = RopeConfig {
                theta: 500000.0,
                scaling: RopeScaling::Llama3 {
                    factor: 8.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_max_position_embeddings: 8,
                },
            };
        }
        "llama-mha-bias" => {
            c.num_key_value_heads = 4;
            c.attention_bias = true;
            c.o_proj_bias = true;
            c.mlp_bias = true;
            c.hidden_act = Activation::GeluTanh;
        }
        "mistral" => {
            c.sliding_window = Some(3);
            c.hidden_act = Activation::Relu;
        }
        // Gemma 2's soft-capping, small enough to bend these models' scores and logits.
        "softcap" => {
            c.attention_softcap = Some(0.2);
            c.final_logit_softcap = Some(0.5);
            c.sliding_window = Some(4);
        }
        "qwen2" => {
            c.attention_bias = true;
            c.num_key_value_heads = 1;
            c.rope.scaling = RopeScaling::Yarn {
                factor: 4.0,
                original_max_position_embeddings: 16,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attention_factor: None,
            };
        }
        "qwen3" => {
            c.qk_norm = true;
            c.head_dim = 16;
            c.rotary_dim = 16;
            c.tie_word_embeddings = true;
        }
        _ => {}
    }
    c
}

const FAMILIES: [&str; 6] = ["llama", "llama-mha-bias", "mistral", "qwen2", "qwen3", "softcap"];

/// Random host weights for every tensor the model asks for, and the model built from them.
fn random_model(config: &ModelConfig, rng: &mut Rng) -> (CausalLm, HashMap<String, Vec<f32>>) {
    let dv = dev();
    let mut host = HashMap::new();
    let lm = CausalLm::build(config, &mut |name, shape| {
        let n: usize = shape.iter().product();
        let v = if name.ends_with("norm.weight") {
            rng.vec(n, 0.5, 1.5)
        } else {
            rng.vec(n, -0.3, 0.3)
        };
        host.insert(name.to_string(), v.clone());
        Ok(Tensor::from_slice(&v, shape, &dv)?)
    })
    .unwrap();
    (lm, host)
}

/// The decoder written plainly in f64 on the CPU: logits `[T, vocab]` for one sequence.
fn reference_forward(c: &ModelConfig, w: &HashMap<String, Vec<f32>>, ids: &[u32]) -> Vec<f64> {
    let (hid, d, nh, nkv) = (c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads);
    let t = ids.len();
    let get = |n: &str| -> Vec<f64> { w[n].iter().map(|&x| x as f64).collect() };
    // y[r] = x[r] @ W^T + b for rows of width `inp`.
    let linear = |x: &[f64], name: &str, inp: usize, bias: bool| -> Vec<f64> {
        let wt = get(&format!("{name}.weight"));
        let out = wt.len() / inp;
        let b = if bias {
            get(&format!("{name}.bias"))
        } else {
            vec![0.0; out]
        };
        x.chunks(inp)
            .flat_map(|row| {
                (0..out)
                    .map(|o| b[o] + (0..inp).map(|i| row[i] * wt[o * inp + i]).sum::<f64>())
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let rms = |x: &[f64], name: &str, width: usize| -> Vec<f64> {
        let wt = get(name);
        x.chunks(width)
            .flat_map(|row| {
                let ms = row.iter().map(|v| v * v).sum::<f64>() / width as f64;
                let r = 1.0 / (ms + c.rms_norm_eps).sqrt();
                row.iter().zip(&wt).map(|(v, g)| v * r * g).collect::<Vec<_>>()
            })
            .collect()
    };
    let inv = ref_inv_freq(d, &c.rope, t);
    let a = ref_attention_scaling(&c.rope);
    let rope = |x: &mut [f64], heads: usize| {
        for ti in 0..t {
            for hi in 0..heads {
                let row = &mut x[(ti * heads + hi) * d..][..d];
                for j in 0..d / 2 {
                    let ang = ti as f64 * inv[j];
                    let (cs, sn) = (ang.cos() * a, ang.sin() * a);
                    let (x1, x2) = (row[j], row[j + d / 2]);
                    row[j] = x1 * cs - x2 * sn;
                    row[j + d / 2] = x2 * cs + x1 * sn;
                }
            }
        }
    };
    let emb = get("model.embed_tokens.weight");
    let mut x: Vec<f64> = ids
        .iter()
        .flat_map(|&i| emb[i as usize * hid..][..hid].to_vec())
        .collect();
    for l in 0..c.num_hidden_layers {
        let p = format!("model.layers.{l}");
        let hn = rms(&x, &format!("{p}.input_layernorm.weight"), hid);
        let mut q = linear(&hn, &format!("{p}.self_attn.q_proj"), hid, c.attention_bias);
        let mut k = linear(&hn, &format!("{p}.self_attn.k_proj"), hid, c.attention_bias);
        let v = linear(&hn, &format!("{p}.self_attn.v_proj"), hid, c.attention_bias);
        if c.qk_norm {
            q = rms(&q, &format!("{p}.self_attn.q_norm.weight"), d);
            k = rms(&k, &format!("{p}.self_attn.k_norm.weight"), d);
        }
        rope(&mut q, nh);
        rope(&mut k, nkv);
        let mut attn = vec![0.0; t * nh * d];
        for hi in 0..nh {
            let kv = hi / (nh / nkv);
            for i in 0..t {
                let s: Vec<f64> = (0..t)
                    .map(|j| {
                        if j > i || c.sliding_window.is_some_and(|wdw| j + wdw <= i) {
                            return f64::NEG_INFINITY;
                        }
                        let score = (0..d)
                            .map(|e| q[(i * nh + hi) * d + e] * k[(j * nkv + kv) * d + e])
                            .sum::<f64>()
                            / (d as f64).sqrt();
                        c.attention_softcap.map_or(score, |cap| cap * (score / cap).tanh())
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for j in 0..t {
                    for di in 0..d {
                        attn[(i * nh + hi) * d + di] += e[j] / z * v[(j * nkv + kv) * d + di];
                    }
                }
            }
        }
        let o = linear(&attn, &format!("{p}.self_attn.o_proj"), nh * d, c.o_proj_bias);
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        let hn = rms(&x, &format!("{p}.post_attention_layernorm.weight"), hid);
        let g = linear(&hn, &format!("{p}.mlp.gate_proj"), hid, c.mlp_bias);
        let u = linear(&hn, &format!("{p}.mlp.up_proj"), hid, c.mlp_bias);
        let act = |z: f64| match c.hidden_act {
            Activation::Silu => z / (1.0 + (-z).exp()),
            Activation::GeluTanh => {
                0.5 * z * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (z + 0.044715 * z * z * z)).tanh())
            }
            Activation::Relu => z.max(0.0),
            Activation::Gelu | Activation::Relu2 => unreachable!("not in these tests"),
        };
        let gu: Vec<f64> = g.iter().zip(&u).map(|(&a, &b)| act(a) * b).collect();
        let dn = linear(&gu, &format!("{p}.mlp.down_proj"), c.intermediate_size, c.mlp_bias);
        x.iter_mut().zip(&dn).for_each(|(a, b)| *a += b);
    }
    let x = rms(&x, "model.norm.weight", hid);
    let head = if c.tie_word_embeddings {
        "model.embed_tokens"
    } else {
        "lm_head"
    };
    let logits = linear(&x, head, hid, false);
    match c.final_logit_softcap {
        Some(cap) => logits.iter().map(|z| cap * (z / cap).tanh()).collect(),
        None => logits,
    }
}

fn ids_tensor(ids: &[Vec<u32>]) -> Tensor {
    let flat: Vec<u32> = ids.concat();
    Tensor::from_slice(&flat, &[ids.len(), ids[0].len()], &dev()).unwrap()
}

#[test]
fn tiny_models_match_the_f64_reference_decoder() {
    let mut rng = Rng::new("tiny_models");
    for family in FAMILIES {
        let c = tiny_config(family);
        let (lm, host) = random_model(&c, &mut rng);
        let (b, t) = (2, 7);
        let ids: Vec<Vec<u32>> = (0..b)
            .map(|_| (0..t).map(|_| rng.below(c.vocab_size) as u32).collect())
            .collect();
        let logits = lm.forward(&ids_tensor(&ids), None).unwrap();
        assert_eq!(logits.shape(), &[b, t, c.vocab_size], "{family}");
        assert_eq!(logits.dtype(), DType::F32);
        let want: Vec<f64> = ids.iter().flat_map(|s| reference_forward(&c, &host, s)).collect();
        assert_close(family, &logits.to_vec::<f32>().unwrap(), &want, 1e-4, 2e-5);
        let last = lm.forward_last(&ids_tensor(&ids), None).unwrap();
        assert_eq!(last.shape(), &[b, c.vocab_size]);
        let want_last: Vec<f64> = (0..b)
            .flat_map(|bi| want[(bi * t + t - 1) * c.vocab_size..][..c.vocab_size].to_vec())
            .collect();
        assert_close(family, &last.to_vec::<f32>().unwrap(), &want_last, 1e-4, 2e-5);
    }
}

#[test]
fn kv_cache_decoding_equals_the_full_forward() {
    let mut rng = Rng::new("kv_cache");
    for family in FAMILIES {
        let c = tiny_config(family);
        let (lm, _) = random_model(&c, &mut rng);
        let (b, t, prefill) = (2, 9, 4);
        let ids: Vec<Vec<u32>> = (0..b)
            .map(|_| (0..t).map(|_| rng.below(c.vocab_size) as u32).collect())
            .collect();
        let full = lm.forward(&ids_tensor(&ids), None).unwrap().to_vec::<f32>().unwrap();
        let mut cache = lm.new_cache(b, 12).unwrap();
        let mut steps = vec![
            lm.forward(
                &ids_tensor(&ids.iter().map(|s| s[..prefill].to_vec()).collect::<Vec<_>>()),
                Some(&mut cache),
            )
            .unwrap(),
        ];
        assert_eq!(cache.len(), prefill);
        for i in prefill..t {
            let step: Vec<Vec<u32>> = ids.iter().map(|s| vec![s[i]]).collect();
            steps.push(lm.forward(&ids_tensor(&step), Some(&mut cache)).unwrap());
        }
        assert_eq!(cache.len(), t);
        let stepped = Tensor::cat(&steps, 1).unwrap().to_vec::<f32>().unwrap();
        let want: Vec<f64> = full.iter().map(|&x| x as f64).collect();
        assert_close(&format!("{family} cached"), &stepped, &want, 0.0, 1e-5);
        // Rewinding and replaying the tail in one chunk gives the same logits again.
        cache.truncate(5);
        let tail: Vec<Vec<u32>> = ids.iter().map(|s| s[5..].to_vec()).collect();
        let again = lm
            .forward(&ids_tensor(&tail), Some(&mut cache))
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let want_tail: Vec<f64> = (0..b)
            .flat_map(|bi| full[(bi * t + 5) * c.vocab_size..(bi * t + t) * c.vocab_size].to_vec())
            .map(|x| x as f64)
            .collect();
        assert_close(&format!("{family} replay"), &again, &want_tail, 0.0, 1e-5);
    }
}

/// A chunk of more queries than the fused cached kernel takes (flash attention's forward, after a cached prefix)
/// gives the logits of the full forward.
#[test]
fn long_chunks_through_the_cache_equal_the_full_forward() {
    let mut rng = Rng::new("long_chunks");
    for family in FAMILIES {
        let c = tiny_config(family);
        let (lm, _) = random_model(&c, &mut rng);
        let (t, prefix) = (3 + FUSED_ATTENTION_MAX_QUERIES + 6, 3);
        let ids: Vec<u32> = (0..t).map(|_| rng.below(c.vocab_size) as u32).collect();
        let full = lm
            .forward(&ids_tensor(std::slice::from_ref(&ids)), None)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let mut cache = lm.new_cache(1, t).unwrap();
        lm.forward(&ids_tensor(&[ids[..prefix].to_vec()]), Some(&mut cache))
            .unwrap();
        let chunk = lm
            .forward(&ids_tensor(&[ids[prefix..].to_vec()]), Some(&mut cache))
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let want: Vec<f64> = full[prefix * c.vocab_size..].iter().map(|&x| x as f64).collect();
        assert_close(&format!("{family} chunk"), &chunk, &want, 0.0, 1e-5);
    }
}

#[test]
fn parameters_carry_hugging_face_names_and_shapes() {
    let mut rng = Rng::new("parameters");
    let c = tiny_config("qwen2");
    let (lm, host) = random_model(&c, &mut rng);
    let params = lm.parameters();
    let names: Vec<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.len(), host.len(), "every loaded tensor is a parameter, once");
    for n in [
        "model.embed_tokens.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.q_proj.bias",
        "model.layers.1.self_attn.v_proj.bias",
        "model.layers.1.self_attn.o_proj.weight",
        "model.layers.1.post_attention_layernorm.weight",
        "model.layers.1.mlp.down_proj.weight",
        "model.norm.weight",
        "lm_head.weight",
    ] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
    assert!(!names.contains(&"model.layers.0.self_attn.o_proj.bias"));
    let shape_of = |n: &str| params.iter().find(|(m, _)| m == n).unwrap().1.shape().to_vec();
    assert_eq!(
        shape_of("model.layers.0.self_attn.k_proj.weight"),
        vec![8, 32],
        "one kv head of 8"
    );
    assert_eq!(shape_of("model.layers.0.mlp.gate_proj.weight"), vec![48, 32]);

    let q3 = tiny_config("qwen3");
    let (lm, _) = random_model(&q3, &mut rng);
    let names: Vec<String> = lm.parameters().into_iter().map(|(n, _)| n).collect();
    assert!(names.contains(&"model.layers.1.self_attn.k_norm.weight".to_string()));
    assert!(
        !names.contains(&"lm_head.weight".to_string()),
        "tied head is the embedding"
    );
    assert_eq!(lm.config().head_dim, 16);
}

/// transformers' token embedding has `padding_idx`: the padding token's row takes no gradient from the lookup
/// (a tied head still reaches it) and starts at zero when a model is trained from scratch.
#[test]
fn the_padding_row_takes_no_lookup_gradient_and_starts_at_zero() {
    let dv = dev();
    let mut rng = Rng::new("padding");
    for tied in [false, true] {
        let mut c = tiny_config("qwen2");
        c.tie_word_embeddings = tied;
        c.padding_idx = Some(3);
        let lm = CausalLm::build(&c, &mut |_, shape| {
            let n = shape.iter().product();
            Ok(Tensor::from_slice(&rng.vec(n, -0.3, 0.3), shape, &dv)?.requires_grad_())
        })
        .unwrap();
        let ids = ids_tensor(&[vec![5, 3, 7, 3, 9]]);
        let weight = &lm.embed_tokens.weight;
        let plain = Tensor::embedding(&weight.detach(), &ids).unwrap();
        let rows = lm.embed_tokens.forward(&ids).unwrap();
        assert_eq!(rows.to_f32_vec().unwrap(), plain.to_f32_vec().unwrap());
        lm.forward(&ids, None).unwrap().sum_all().unwrap().backward().unwrap();
        let grad = weight.grad().unwrap().to_f32_vec().unwrap();
        let row = |r: usize| grad[r * 32..(r + 1) * 32].iter().any(|&g| g != 0.0);
        assert!(row(5) && row(7) && row(9), "looked-up rows are trained");
        assert_eq!(row(3), tied, "the padding row only through a tied head (tied: {tied})");
    }
    let mut c = tiny_config("qwen2");
    c.padding_idx = Some(3);
    let lm = CausalLm::init_random(&c, 7, &dv).unwrap();
    let table = lm.embed_tokens.weight.to_f32_vec().unwrap();
    assert!(
        table[3 * 32..4 * 32].iter().all(|&w| w == 0.0),
        "the padding row starts at zero"
    );
    assert!(table[4 * 32..5 * 32].iter().all(|&w| w != 0.0));
    let head = lm
        .parameters()
        .into_iter()
        .find(|(n, _)| n == "lm_head.weight")
        .unwrap()
        .1;
    assert!(
        head.to_f32_vec().unwrap()[3 * 32..4 * 32].iter().all(|&w| w != 0.0),
        "the head is not an embedding"
    );
}

#[test]
fn bad_inputs_are_errors() {
    let mut rng = Rng::new("errors");
    let c = tiny_config("llama");
    let (lm, _) = random_model(&c, &mut rng);
    let dv = dev();
    let flat = Tensor::from_slice(&[1u32, 2, 3], &[3], &dv).unwrap();
    assert!(lm.forward(&flat, None).is_err(), "ids must be [B, T]");
    let empty = Tensor::zeros(&[1, 0], DType::U32, &dv).unwrap();
    assert!(lm.forward(&empty, None).is_err(), "no tokens");
    let out_of_vocab = Tensor::from_slice(&[1u32, 99], &[1, 2], &dv).unwrap();
    assert!(lm.forward(&out_of_vocab, None).is_err(), "id past the vocabulary");
    let mut cache = lm.new_cache(1, 4).unwrap();
    let three = Tensor::from_slice(&[1u32, 2, 3], &[1, 3], &dv).unwrap();
    lm.forward(&three, Some(&mut cache)).unwrap();
    assert!(lm.forward(&three, Some(&mut cache)).is_err(), "cache overflow");
    assert_eq!(cache.len(), 3, "a refused step leaves the cache as it was");
    let two_seqs = Tensor::from_slice(&[1u32, 2], &[2, 1], &dv).unwrap();
    assert!(
        lm.forward(&two_seqs, Some(&mut cache)).is_err(),
        "batch differs from the cache"
    );
    assert!(lm.new_cache(0, 4).is_err());
    assert!(lm.new_cache(1, 0).is_err());

    let mut bad = tiny_config("llama");
    bad.num_key_value_heads = 3;
    let r = CausalLm::build(&bad, &mut |_, s| Ok(Tensor::zeros(s, DType::F32, &dv)?));
    assert!(matches!(r, Err(Error::Invalid(_))), "kv heads must divide heads");
    // A source that lacks a tensor: its error comes back unchanged.
    let r = CausalLm::build(&c, &mut |name, s| {
        if name == "model.layers.1.mlp.up_proj.weight" {
            Err(Error::Invalid(format!("missing {name}")))
        } else {
            Ok(Tensor::zeros(s, DType::F32, &dv)?)
        }
    });
    match r {
        Err(Error::Invalid(m)) => assert!(m.contains("model.layers.1.mlp.up_proj.weight")),
        other => panic!("expected the source's error, got {other:?}"),
    }
}

#[test]
fn stacked_projections_share_the_trainable_weights() {
    use hierarchos::core::no_grad;
    use hierarchos::nn::optim::Sgd;
    use hierarchos::nn::{FeedForward, LinearWeight};
    let to_f64 = |t: &Tensor| -> Vec<f64> { t.to_vec::<f32>().unwrap().iter().map(|&v| v as f64).collect() };
    for family in ["llama", "qwen2"] {
        let c = tiny_config(family);
        // A device of its own: the tests running beside this one add no launches to its count.
        let dv = own_dev();
        let mut rng = Rng::new("stacked_projections");
        let mut values = std::collections::HashMap::new();
        let mut build = || {
            CausalLm::build(&c, &mut |name, shape| {
                let n: usize = shape.iter().product();
                let v = values.entry(name.to_string()).or_insert_with(|| rng.vec(n, -0.3, 0.3));
                Ok(Tensor::from_slice(v, shape, &dv)?.requires_grad_())
            })
            .unwrap()
        };
        let lm = build();
        let attn = lm.layers[0].self_attn.standard().unwrap();
        assert!(
            attn.qkv.is_some() && lm.layers[0].mlp.mlp().is_some_and(|m| m.gate_up.is_some()),
            "{family}: stacked"
        );
        // The same model with every projection's weights copied out of the stacks, so that each runs alone.
        let mut apart = build();
        for layer in &mut apart.layers {
            let attn = layer.self_attn.standard_mut().unwrap();
            let FeedForward::Mlp(mlp, _) = &mut layer.mlp else {
                panic!("{family}: a dense MLP")
            };
            let gate = mlp.gate_proj.as_mut().unwrap();
            for l in [
                &mut attn.q_proj,
                &mut attn.k_proj,
                &mut attn.v_proj,
                gate,
                &mut mlp.up_proj,
            ] {
                let LinearWeight::Dense(w) = &l.weight else {
                    panic!("{family}: dense weights")
                };
                l.weight = LinearWeight::Dense(w.detach().copy().unwrap().requires_grad_());
                l.bias = l.bias.as_ref().map(|b| b.detach().copy().unwrap().requires_grad_());
            }
        }
        let ids = Tensor::from_slice(&[1u32, 5, 2, 7], &[1, 4], &dv).unwrap();
        let stacked = |lm: &CausalLm| no_grad(|| lm.forward(&ids, None)).unwrap().to_vec::<f32>().unwrap();
        // Training runs the stacks too, each projection's gradient cut from the stacked product's.
        let (mut logits, mut launches) = (Vec::new(), Vec::new());
        for model in [&lm, &apart] {
            let before = dv.dispatch_count();
            let y = model.forward(&ids, None).unwrap();
            y.sum(&[0, 1, 2], false).unwrap().backward().unwrap();
            launches.push(dv.dispatch_count() - before);
            logits.push(y.to_vec::<f32>().unwrap());
        }
        assert!(
            launches[0] < launches[1],
            "{family}: launches stacked / apart {launches:?}"
        );
        let separate: Vec<f64> = logits[1].iter().map(|&v| v as f64).collect();
        assert_close(&format!("{family} stacked"), &logits[0], &separate, 1e-5, 1e-6);
        assert_close(
            &format!("{family} stacked, no grad"),
            &stacked(&lm),
            &separate,
            1e-5,
            1e-6,
        );
        for ((name, p), (_, q)) in lm.parameters().into_iter().zip(apart.parameters()) {
            let g = p.grad().unwrap_or_else(|| panic!("{family}: no gradient for {name}"));
            assert_eq!(g.shape(), p.shape(), "{family} {name}");
            let want = to_f64(&q.grad().unwrap());
            assert_close(
                &format!("{family} {name} gradient"),
                &g.to_vec::<f32>().unwrap(),
                &want,
                1e-4,
                1e-5,
            );
        }
        // An in-place update of the layers' weights is what the stacked weights see.
        let params: Vec<Tensor> = lm.parameters().into_iter().map(|(_, p)| p).collect();
        Sgd::new(0.1).step(&params).unwrap();
        let after = to_f64(&lm.forward(&ids, None).unwrap());
        assert!(
            after.iter().zip(&separate).any(|(a, b)| (a - b).abs() > 1e-3),
            "{family}: the step changed nothing"
        );
        assert_close(
            &format!("{family} stacked after a step"),
            &stacked(&lm),
            &after,
            1e-5,
            1e-6,
        );
    }
}

/// Q8_0 blocks of `n` random weights (small scales, random quants).
fn random_q8_0(rng: &mut Rng, n: usize) -> Vec<u8> {
    (0..n / 32)
        .flat_map(|_| {
            let scale = half::f16::from_f32(rng.uniform(0.002, 0.01)).to_le_bytes();
            let quants: Vec<u8> = (0..32).map(|_| rng.next_u64() as u8).collect();
            [scale.to_vec(), quants].concat()
        })
        .collect()
}

#[test]
fn fused_quantized_decoding_equals_the_full_forward() {
    use hierarchos::core::quant::{GgmlType, QTensor};
    let mut rng = Rng::new("fused_quantized_decoding");
    let dv = dev();
    for family in ["llama", "mistral", "qwen3", "qwen2"] {
        let mut c = tiny_config(family);
        c.intermediate_size = 64;
        let dense = |shape: &[usize]| -> Vec<f32> {
            (0..shape.iter().product::<usize>())
                .map(|i| 0.5 + (i % 7) as f32 * 0.1)
                .collect()
        };
        let lm = CausalLm::build_with(
            &c,
            &mut |_, shape| Ok(Tensor::from_slice(&dense(shape), shape, &dv)?),
            &mut |_, [rows, cols]| {
                Ok(Some(QTensor::from_ggml(
                    GgmlType::Q8_0,
                    &random_q8_0(&mut rng, rows * cols),
                    [rows, cols],
                    &dv,
                )?))
            },
        )
        .unwrap();
        // Qwen2's projection biases keep it on the unfused path; the others decode fused.
        assert_eq!(lm.layers.iter().all(|l| l.fuses()), family != "qwen2", "{family}");
        let (b, t, prefill) = (2, 9, 4);
        let ids: Vec<Vec<u32>> = (0..b)
            .map(|_| (0..t).map(|_| rng.below(c.vocab_size) as u32).collect())
            .collect();
        let full = lm.forward(&ids_tensor(&ids), None).unwrap().to_vec::<f32>().unwrap();
        let mut cache = lm.new_cache(b, t).unwrap();
        let mut steps = vec![
            lm.forward(
                &ids_tensor(&ids.iter().map(|s| s[..prefill].to_vec()).collect::<Vec<_>>()),
                Some(&mut cache),
            )
            .unwrap(),
        ];
        for i in prefill..t {
            let step: Vec<Vec<u32>> = ids.iter().map(|s| vec![s[i]]).collect();
            steps.push(lm.forward(&ids_tensor(&step), Some(&mut cache)).unwrap());
        }
        let stepped = Tensor::cat(&steps, 1).unwrap().to_vec::<f32>().unwrap();
        let want: Vec<f64> = full.iter().map(|&x| x as f64).collect();
        // The fused norm and the cached attention round differently from the full forward: some f32 ulps of the
        // largest logits, which a small logit inherits: over 30 random seeds at most 1.8e-6 of the largest |logit|
        // (16 ulps), and 400 more stayed within this bound. A wrong position, cache slot or weight moves logits by
        // far more.
        let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        assert_close(&format!("{family} fused decode"), &stepped, &want, 1e-5, 5e-6 * scale);
    }
}

#[test]
fn replaced_projection_weights_are_not_read_from_the_stacked_copy() {
    use hierarchos::core::no_grad;
    use hierarchos::nn::LinearWeight;
    let mut rng = Rng::new("replaced_projection_weights");
    let c = tiny_config("llama");
    let (mut lm, mut host) = random_model(&c, &mut rng);
    let name = "model.layers.0.self_attn.q_proj.weight";
    let fresh = rng.vec(host[name].len(), -0.3, 0.3);
    let q = &mut lm.layers[0].self_attn.standard_mut().unwrap().q_proj;
    let shape = q.weight_shape();
    q.weight = LinearWeight::Dense(Tensor::from_slice(&fresh, &shape, &dev()).unwrap());
    host.insert(name.to_string(), fresh);
    let ids = [3u32, 1, 4, 1, 5];
    let got = no_grad(|| lm.forward(&ids_tensor(&[ids.to_vec()]), None)).unwrap();
    let want = reference_forward(&c, &host, &ids);
    assert_close("replaced q_proj", &got.to_vec::<f32>().unwrap(), &want, 1e-4, 2e-5);
}

#[test]
fn cached_decoding_of_heads_larger_than_the_fused_kernels_take() {
    let mut rng = Rng::new("large_heads");
    let mut c = tiny_config("mistral");
    c.num_attention_heads = 2;
    c.num_key_value_heads = 1;
    c.head_dim = 260;
    c.rotary_dim = 260;
    let (lm, _) = random_model(&c, &mut rng);
    let ids: Vec<u32> = (0..6).map(|_| rng.below(c.vocab_size) as u32).collect();
    let full = lm
        .forward(&ids_tensor(std::slice::from_ref(&ids)), None)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let mut cache = lm.new_cache(1, 6).unwrap();
    let mut steps = vec![lm.forward(&ids_tensor(&[ids[..3].to_vec()]), Some(&mut cache)).unwrap()];
    for &id in &ids[3..] {
        steps.push(lm.forward(&ids_tensor(&[vec![id]]), Some(&mut cache)).unwrap());
    }
    let stepped = Tensor::cat(&steps, 1).unwrap().to_vec::<f32>().unwrap();
    let want: Vec<f64> = full.iter().map(|&x| x as f64).collect();
    assert_close("head_dim 260 cached", &stepped, &want, 0.0, 1e-5);
}

#[test]
fn a_quantized_tied_head_follows_the_embedding_once_it_trains() {
    use hierarchos::core::no_grad;
    use hierarchos::core::quant::{GgmlType, QTensor};
    let mut rng = Rng::new("quantized_tied_head");
    let dv = dev();
    let c = tiny_config("llama");
    assert!(c.tie_word_embeddings);
    let shape = [c.vocab_size, c.hidden_size];
    let table = random_q8_0(&mut rng, shape[0] * shape[1]);
    // As a GGUF file gives it: the embedding dequantized for lookups, the same blocks for the head.
    let embedding = QTensor::from_ggml(GgmlType::Q8_0, &table, shape, &dv).unwrap();
    let lm = CausalLm::build_with(
        &c,
        &mut |name, s| {
            if name == "model.embed_tokens.weight" {
                return Ok(embedding.dequantize()?);
            }
            Ok(Tensor::ones(s, DType::F32, &dv)?)
        },
        &mut |name, s| {
            Ok((name == "model.embed_tokens.weight")
                .then(|| QTensor::from_ggml(GgmlType::Q8_0, &table, s, &dv).unwrap()))
        },
    )
    .unwrap();
    let mut lm = lm;
    assert!(lm.lm_head.is_some(), "the tied head is held quantized");
    let ids = ids_tensor(&[vec![3, 1, 4, 1, 5]]);
    let tied = |lm: &CausalLm| -> Vec<f64> {
        let h = lm.hidden_states(&ids, None).unwrap();
        let last = h.narrow(1, 4, 1).unwrap().squeeze(1).unwrap();
        let logits = last.matmul(&lm.embed_tokens.weight.t().unwrap()).unwrap();
        logits.to_vec::<f32>().unwrap().iter().map(|&v| v as f64).collect()
    };
    let head = no_grad(|| lm.forward_last(&ids, None))
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_close("quantized head", &head, &tied(&lm), 1e-5, 1e-6);
    // Once the embedding trains, the logits come from it, not from the frozen copy.
    lm.embed_tokens.weight = lm.embed_tokens.weight.requires_grad_();
    no_grad(|| lm.embed_tokens.weight.assign(&lm.embed_tokens.weight.mul_scalar(-2.0)?)).unwrap();
    let after = lm.forward_last(&ids, None).unwrap().to_vec::<f32>().unwrap();
    assert_close("head after the embedding changed", &after, &tied(&lm), 1e-5, 1e-6);
    assert!(
        after.iter().zip(&head).any(|(a, b)| (a - b).abs() > 1e-3),
        "the update shows"
    );
}
