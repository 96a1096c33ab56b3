//! rand and randn: bit-identical to a CPU Philox4x32-10 with the documented mapping.

mod common;

use common::*;
use hierarchos::core::{DType, Error, Tensor};

fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = a as u64 * b as u64;
    ((p >> 32) as u32, p as u32)
}

/// Philox4x32-10 as in Random123.
fn philox(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for _ in 0..10 {
        let (hi0, lo0) = mulhilo(0xD251_1F53, c[0]);
        let (hi1, lo1) = mulhilo(0xCD9E_8D57, c[2]);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
        k = [k[0].wrapping_add(0x9E37_79B9), k[1].wrapping_add(0xBB67_AE85)];
    }
    c
}

fn words(seed: u64, e: u64) -> [u32; 4] {
    philox([e as u32, (e >> 32) as u32, 0, 0], [seed as u32, (seed >> 32) as u32])
}

fn cpu_uniform(seed: u64, e: u64, bits: u32) -> f32 {
    (words(seed, e)[0] >> (32 - bits)) as f32 / (1u64 << bits) as f32
}

fn cpu_normal(seed: u64, e: u64) -> f64 {
    let r = words(seed, e);
    let u1 = ((r[0] >> 8) as f64 + 1.0) / (1u64 << 24) as f64;
    let u2 = (r[1] >> 8) as f64 / (1u64 << 24) as f64;
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

#[test]
fn reference_philox_matches_random123_known_answers() {
    assert_eq!(philox([0; 4], [0; 2]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
    assert_eq!(
        philox([u32::MAX; 4], [u32::MAX; 2]),
        [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
    );
    assert_eq!(
        philox(
            [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
            [0xa4093822, 0x299f31d0]
        ),
        [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
    );
}

#[test]
fn rand_is_bit_identical_to_the_cpu_philox() {
    let mut rng = Rng::new("rand_is_bit_identical_to_the_cpu_philox");
    let d = dev();
    let seed = rng.next_u64();
    // The last offset makes the 64-bit counter carry from the low word into the high one.
    for (shape, offset) in [
        (vec![1], 0u64),
        (vec![3, 17], 5),
        (vec![257, 3], 1 << 40),
        (vec![1000], u32::MAX as u64 - 300),
    ] {
        let n: usize = shape.iter().product();
        let got = Tensor::rand(&shape, seed, offset, DType::F32, &d).unwrap();
        assert_eq!(got.shape(), &shape[..]);
        let got = got.to_vec::<f32>().unwrap();
        for (i, &g) in got.iter().enumerate() {
            let want = cpu_uniform(seed, offset.wrapping_add(i as u64), 24);
            assert_eq!(
                g.to_bits(),
                want.to_bits(),
                "rand {shape:?} offset {offset}: element {i}"
            );
            assert!((0.0..1.0).contains(&g));
        }
        assert_eq!(got.len(), n);
    }
    for (dtype, bits) in [(DType::F16, 11), (DType::BF16, 8)] {
        let got = Tensor::rand(&[17], seed, 3, dtype, &d).unwrap();
        assert_eq!(got.dtype(), dtype);
        let got = got.to_f32_vec().unwrap();
        for (i, &g) in got.iter().enumerate() {
            assert_eq!(g, cpu_uniform(seed, 3 + i as u64, bits), "{dtype} rand element {i}");
            assert!(g < 1.0);
        }
    }
}

#[test]
fn streams_are_reproducible_and_sliceable() {
    let d = dev();
    let a = Tensor::rand(&[64], 7, 0, DType::F32, &d)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let b = Tensor::rand(&[64], 7, 0, DType::F32, &d)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(a, b);
    let tail = Tensor::rand(&[8, 3], 7, 40, DType::F32, &d)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(&a[40..64], &tail[..]);
    let other = Tensor::rand(&[64], 8, 0, DType::F32, &d)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_ne!(a, other);
}

#[test]
fn randn_matches_box_muller_and_is_standard_normal() {
    let mut rng = Rng::new("randn_matches_box_muller_and_is_standard_normal");
    let d = dev();
    let seed = rng.next_u64();
    let n = 20_000;
    let got = Tensor::randn(&[n], seed, 11, DType::F32, &d)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    // f32 log/cos on the device against f64: about 1e-6 relative, larger only where u1 is near 1 (z near 0).
    let want: Vec<f64> = (0..n).map(|i| cpu_normal(seed, 11 + i as u64)).collect();
    assert_close("randn", &got, &want, 1e-4, 1e-4);
    let mean = got.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
    let var = got.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
    assert!(mean.abs() < 0.05, "mean {mean}");
    assert!((var - 1.0).abs() < 0.05, "variance {var}");
    let h = Tensor::randn(&[5], seed, 11, DType::BF16, &d).unwrap();
    assert_eq!(h.dtype(), DType::BF16);
    assert_close("bf16 randn", &h.to_f32_vec().unwrap(), &want[..5], 1e-2, 1e-2);
}

#[test]
fn random_edge_cases() {
    let d = dev();
    assert_eq!(Tensor::rand(&[0, 3], 1, 0, DType::F32, &d).unwrap().shape(), &[0, 3]);
    assert_eq!(Tensor::randn(&[], 1, 0, DType::F32, &d).unwrap().numel(), 1);
    assert!(matches!(
        Tensor::rand(&[3], 1, 0, DType::U32, &d),
        Err(Error::DTypeMismatch { .. })
    ));
    assert!(matches!(
        Tensor::randn(&[3], 1, 0, DType::I32, &d),
        Err(Error::DTypeMismatch { .. })
    ));
    assert!(matches!(
        Tensor::rand(&[1; 9], 1, 0, DType::F32, &d),
        Err(Error::RankMismatch { .. })
    ));
    // An element count past the kernels' indices, even one past usize, is an error rather than a panic.
    for shape in [[1 << 16, 1 << 16], [1 << 40, 1 << 40]] {
        assert!(matches!(
            Tensor::randn(&shape, 1, 0, DType::F32, &d),
            Err(Error::Invalid { .. })
        ));
    }
}
