//! Test support shared by the op tests: the device, seeded random data, comparison against f64 CPU references,
//! and a finite-difference gradient check.
#![allow(dead_code)]

pub mod attention;
pub mod fixtures;
pub mod hub;
pub mod smollm;

use hierarchos::core::{Device, Tensor, default_device};

/// A fresh empty folder under the system temp dir for the files a test writes.
pub fn tmpdir(name: &str) -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    // The serial keeps two tests of one process apart when the clock gives them the same reading.
    static DIRS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let serial = DIRS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("hierarchos-{name}-{}-{nanos}-{serial}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The default device (lavapipe in CI; `HIERARCHOS_DISABLE=subgroup,f16` exercises the fallback kernels).
pub fn dev() -> Device {
    default_device().expect("a GPU adapter (install mesa-vulkan-drivers for lavapipe)")
}

/// A device of the test's own (the default one is shared by the tests running in parallel), for counting the
/// launches an op records.
pub fn own_dev() -> Device {
    pollster::block_on(hierarchos::core::Gpu::open(&hierarchos::core::GpuOptions::from_env()))
        .expect("a GPU adapter (install mesa-vulkan-drivers for lavapipe)")
}

/// Rotary tables that are all `t` (for argument checks, where the values do not matter).
pub fn same_tables(t: &Tensor) -> hierarchos::core::ops::rope::RopeTables<'_> {
    hierarchos::core::ops::rope::RopeTables {
        cos_q: t,
        sin_q: t,
        cos_k: t,
        sin_k: t,
    }
}

/// A small seeded generator (SplitMix64). Each test takes a fresh seed unless `HIERARCHOS_TEST_SEED` fixes it;
/// the seed is printed so a failure can be replayed.
pub struct Rng(u64);

impl Rng {
    /// A generator for the named test, printing its seed.
    pub fn new(test: &str) -> Rng {
        let seed = std::env::var("HIERARCHOS_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        eprintln!("{test}: HIERARCHOS_TEST_SEED={seed}");
        Rng(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }

    /// `n` values uniform in [lo, hi).
    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }

    /// Uniform integer in [0, n).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Asserts `|got - want| <= atol + rtol * |want|` elementwise (NaN must match NaN, infinities must match).
pub fn assert_close(what: &str, got: &[f32], want: &[f64], rtol: f64, atol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g = g as f64;
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            g == w
        } else {
            (g - w).abs() <= atol + rtol * w.abs()
        };
        assert!(ok, "{what}: element {i}: got {g}, want {w} (rtol {rtol}, atol {atol})");
    }
}

/// Row-major element offsets of a view with `shape` and `strides` (for CPU references reading strided data).
pub fn strided_indices(shape: &[usize], strides: &[usize], offset: usize) -> Vec<usize> {
    let n: usize = shape.iter().product();
    (0..n)
        .map(|i| {
            let mut rem = i;
            let mut off = offset;
            for d in (0..shape.len()).rev() {
                off += (rem % shape[d]) * strides[d];
                rem /= shape[d];
            }
            off
        })
        .collect()
}

/// Checks the analytic gradients of `f` at `inputs` (f32 data with shapes) against central finite differences
/// of `sum(f(x) * w)` for fixed random weights `w`, perturbing every input element by `eps`.
pub fn gradcheck(
    what: &str,
    rng: &mut Rng,
    inputs: &[(Vec<f32>, Vec<usize>)],
    f: impl Fn(&[Tensor]) -> hierarchos::core::Result<Tensor>,
) {
    let d = dev();
    let leaves: Vec<Tensor> = inputs
        .iter()
        .map(|(v, s)| Tensor::from_slice(v, s, &d).unwrap().requires_grad_())
        .collect();
    let out = f(&leaves).unwrap();
    let w: Vec<f32> = rng.vec(out.numel(), -1.0, 1.0);
    let wt = Tensor::from_slice(&w, out.shape(), &d).unwrap();
    out.to_dtype(hierarchos::core::DType::F32)
        .unwrap()
        .mul(&wt)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let eps = 1e-2f64;
    let loss_at = |k: usize, j: usize, delta: f64| -> f64 {
        let ts: Vec<Tensor> = inputs
            .iter()
            .enumerate()
            .map(|(i, (v, s))| {
                let mut v = v.clone();
                if i == k {
                    v[j] = (v[j] as f64 + delta) as f32;
                }
                Tensor::from_slice(&v, s, &d).unwrap()
            })
            .collect();
        let y = f(&ts).unwrap().to_f32_vec().unwrap();
        y.iter().zip(&w).map(|(&a, &b)| a as f64 * b as f64).sum()
    };
    for (k, leaf) in leaves.iter().enumerate() {
        let analytic = leaf
            .grad()
            .map(|g| g.to_f32_vec().unwrap())
            .unwrap_or_else(|| vec![0.0; leaf.numel()]);
        let numeric: Vec<f64> = (0..leaf.numel())
            .map(|j| (loss_at(k, j, eps) - loss_at(k, j, -eps)) / (2.0 * eps))
            .collect();
        assert_close(
            &format!("{what}: gradient of input {k}"),
            &analytic,
            &numeric,
            2e-2,
            2e-3,
        );
    }
}
