//! Unary, binary, scalar, comparison, where, clamp and cast kernels against f64 CPU references.

mod common;
use common::*;
use hierarchos::core::{BinaryOp, CmpOp, DType, Tensor, UnaryOp};

const UNARY: [UnaryOp; 17] = [
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Sign,
    UnaryOp::Exp,
    UnaryOp::Log,
    UnaryOp::Sqrt,
    UnaryOp::Rsqrt,
    UnaryOp::Recip,
    UnaryOp::Sin,
    UnaryOp::Cos,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
    UnaryOp::Relu,
    UnaryOp::Silu,
    UnaryOp::Gelu,
    UnaryOp::GeluTanh,
    UnaryOp::Relu2,
];

fn erf(x: f64) -> f64 {
    // Abramowitz-Stegun 7.1.26 is too coarse for a reference; integrate the series instead.
    let mut sum = 0.0;
    let mut term = x;
    let mut n = 0.0;
    if x.abs() > 5.0 {
        return x.signum();
    }
    loop {
        let add = term / (2.0 * n + 1.0);
        sum += add;
        if add.abs() < 1e-17 {
            break;
        }
        n += 1.0;
        term *= -x * x / n;
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

fn unary_ref(op: UnaryOp, x: f64) -> f64 {
    let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Sign => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0
            }
        }
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Recip => 1.0 / x,
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => sig(x),
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::Silu => x * sig(x),
        UnaryOp::Gelu => 0.5 * x * (1.0 + erf(x / 2f64.sqrt())),
        UnaryOp::GeluTanh => {
            0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
        }
        UnaryOp::Relu2 => x.max(0.0).powi(2),
    }
}

/// Inputs in the op's domain.
fn domain(op: UnaryOp, rng: &mut Rng, n: usize) -> Vec<f32> {
    match op {
        UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt => rng.vec(n, 0.05, 4.0),
        UnaryOp::Recip => rng
            .vec(n, 0.1, 3.0)
            .into_iter()
            .map(|v| if n.is_multiple_of(2) { v } else { -v })
            .collect(),
        UnaryOp::Exp => rng.vec(n, -8.0, 8.0),
        _ => rng.vec(n, -6.0, 6.0),
    }
}

#[test]
fn unary_ops_match_reference_on_odd_and_strided_shapes() {
    let d = dev();
    let mut rng = Rng::new("unary");
    for op in UNARY {
        for shape in [vec![1], vec![3], vec![17], vec![257], vec![5, 7]] {
            let n: usize = shape.iter().product();
            let x = domain(op, &mut rng, n);
            let t = Tensor::from_slice(&x, &shape, &d).unwrap();
            let got = t.unary(op).unwrap().to_vec::<f32>().unwrap();
            let want: Vec<f64> = x.iter().map(|&v| unary_ref(op, v as f64)).collect();
            assert_close(&format!("{op:?} {shape:?}"), &got, &want, 1e-5, 1e-6);
        }
        // A transposed (non-contiguous) input is read through its strides.
        let x = domain(op, &mut rng, 12);
        let t = Tensor::from_slice(&x, &[3, 4], &d).unwrap().t().unwrap();
        assert!(!t.is_contiguous());
        let got = t.unary(op).unwrap().to_vec::<f32>().unwrap();
        let want: Vec<f64> = strided_indices(&[4, 3], &[1, 4], 0)
            .iter()
            .map(|&i| unary_ref(op, x[i] as f64))
            .collect();
        assert_close(&format!("{op:?} transposed"), &got, &want, 1e-5, 1e-6);
        // Empty in, empty out.
        let e = Tensor::from_slice::<f32>(&[], &[0, 3], &d).unwrap().unary(op).unwrap();
        assert_eq!(e.shape(), &[0, 3]);
        assert!(e.to_vec::<f32>().unwrap().is_empty());
    }
}

/// How many f32 ulps (of the correctly rounded value) `got` lies from `want`.
fn ulps(got: f32, want: f64) -> f64 {
    let w = want as f32;
    let ulp = f32::from_bits(w.abs().to_bits() + 1) - w.abs();
    (got as f64 - want).abs() / ulp as f64
}

#[test]
fn exp_is_accurate_to_a_few_ulp_across_its_range() {
    // Attention scores and logits reach |x| of 10 to 30, where exp2 of the rounded x log2(e) (how drivers compute
    // WGSL's exp) is off by 5 to 25 ulp on the H200 and on lavapipe, 60 near 88; PyTorch's expf is within 1.
    let d = dev();
    let mut rng = Rng::new("exp range");
    let mut x: Vec<f32> = (0..=3500).map(|i| -87.0 + 0.05 * i as f32).collect();
    x.extend(rng.vec(4000, -87.0, 88.0));
    x.extend(rng.vec(3000, -0.34, 0.34));
    let got = Tensor::from_slice(&x, &[x.len()], &d)
        .unwrap()
        .exp()
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let (worst, at) = got
        .iter()
        .zip(&x)
        .map(|(&g, &v)| (ulps(g, (v as f64).exp()), v))
        .fold((0.0, 0.0), |w, e| if e.0 > w.0 { e } else { w });
    // Within ln(2) / 2 of 0, where x log2(e) rounds by less than an ulp, any exp is the device's exp2 on [-1/2, 1/2]
    // (about 1 ulp on the H200, 2-3 on lavapipe); the rest of the range must not add more than 1.5 ulp to that.
    let near_zero = got
        .iter()
        .zip(&x)
        .filter(|&(_, &v)| v.abs() <= 0.34)
        .map(|(&g, &v)| ulps(g, (v as f64).exp()))
        .fold(0.0, f64::max);
    eprintln!("exp: worst {worst:.2} ulp at x = {at}, {near_zero:.2} near 0");
    assert!(
        worst <= (near_zero + 1.5).min(5.0),
        "exp({at}) is {worst:.2} ulp from the f64 value ({near_zero:.2} near 0)"
    );
    let special = [f32::NEG_INFINITY, f32::INFINITY, f32::NAN, 0.0, 100.0, -200.0];
    let special = Tensor::from_slice(&special, &[6], &d)
        .unwrap()
        .exp()
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(&special[..2], &[0.0, f32::INFINITY]);
    assert!(special[2].is_nan());
    assert_eq!(&special[3..], &[1.0, f32::INFINITY, 0.0]);
}

/// NaN in, NaN out, in every dtype, as in torch (Sign aside: torch's sign of NaN is 0 on some paths).
#[test]
fn unary_ops_propagate_nan() {
    let d = dev();
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let x = Tensor::from_slice(&[f32::NAN, 1.0], &[2], &d)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        for op in UNARY.into_iter().filter(|&op| op != UnaryOp::Sign) {
            let y = x.unary(op).unwrap().to_f32_vec().unwrap();
            assert!(y[0].is_nan(), "{op:?}({dtype} NaN) = {}", y[0]);
        }
    }
}

#[test]
fn unary_ops_in_half_precision() {
    let d = dev();
    let mut rng = Rng::new("unary_half");
    for dtype in [DType::F16, DType::BF16] {
        for op in UNARY {
            let x = domain(op, &mut rng, 17);
            let t = Tensor::from_slice(&x, &[17], &d).unwrap().to_dtype(dtype).unwrap();
            let xr = t.to_f32_vec().unwrap();
            let got = t.unary(op).unwrap();
            assert_eq!(got.dtype(), dtype);
            let want: Vec<f64> = xr.iter().map(|&v| unary_ref(op, v as f64)).collect();
            assert_close(
                &format!("{op:?} {dtype}"),
                &got.to_f32_vec().unwrap(),
                &want,
                1e-2,
                1e-2,
            );
        }
    }
}

#[test]
fn unary_backward_passes_finite_differences() {
    let mut rng = Rng::new("unary_grad");
    for op in UNARY {
        if op == UnaryOp::Sign {
            continue;
        }
        // Central differences with step 1e-2 err by about f'''(x) * 1e-4 / 6, which near the poles of
        // log, rsqrt and recip (x < 0.1) exceeds the tolerance; keep inputs at least 0.3 from zero.
        let x = domain(op, &mut rng, 5)
            .into_iter()
            .map(|v| if v.abs() < 0.3 { v.signum() * (0.3 + v.abs()) } else { v })
            .collect();
        gradcheck(&format!("{op:?}"), &mut rng, &[(x, vec![5])], |t| t[0].unary(op));
    }
}

fn binary_ref(op: BinaryOp, a: f64, b: f64) -> f64 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Pow => a.powf(b),
        BinaryOp::Maximum => a.max(b),
        BinaryOp::Minimum => a.min(b),
    }
}

const BINARY: [BinaryOp; 7] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Pow,
    BinaryOp::Maximum,
    BinaryOp::Minimum,
];

/// Values of `data` laid out with `shape` broadcast to `out`, in row-major order of `out`.
fn broadcast_ref(data: &[f32], shape: &[usize], out: &[usize]) -> Vec<f64> {
    let lead = out.len() - shape.len();
    let mut strides = vec![0; out.len()];
    let mut s = 1;
    for d in (0..shape.len()).rev() {
        strides[d + lead] = if shape[d] == 1 { 0 } else { s };
        s *= shape[d];
    }
    strides_values(data, out, &strides)
}

fn strides_values(data: &[f32], shape: &[usize], strides: &[usize]) -> Vec<f64> {
    strided_indices(shape, strides, 0)
        .iter()
        .map(|&i| data[i] as f64)
        .collect()
}

#[test]
fn binary_ops_broadcast_like_numpy() {
    let d = dev();
    let mut rng = Rng::new("binary");
    let cases: [(&[usize], &[usize], &[usize]); 5] = [
        (&[17], &[17], &[17]),
        (&[3, 1, 5], &[4, 1], &[3, 4, 5]),
        (&[1], &[257], &[257]),
        (&[2, 3], &[], &[2, 3]),
        (&[0, 3], &[3], &[0, 3]),
    ];
    for op in BINARY {
        for (sa, sb, so) in cases {
            let (na, nb) = (sa.iter().product::<usize>(), sb.iter().product::<usize>());
            let lo = if op == BinaryOp::Pow { 0.1 } else { -3.0 };
            let a = rng.vec(na, lo, 3.0);
            let b: Vec<f32> = rng
                .vec(nb, -3.0, 3.0)
                .into_iter()
                .map(|v| if v.abs() < 0.1 { 0.5 } else { v })
                .collect();
            let ta = Tensor::from_slice(&a, sa, &d).unwrap();
            let tb = Tensor::from_slice(&b, sb, &d).unwrap();
            let got = ta.binary(&tb, op).unwrap();
            assert_eq!(got.shape(), so);
            let (ra, rb) = (broadcast_ref(&a, sa, so), broadcast_ref(&b, sb, so));
            let want: Vec<f64> = ra.iter().zip(&rb).map(|(&x, &y)| binary_ref(op, x, y)).collect();
            assert_close(
                &format!("{op:?} {sa:?} {sb:?}"),
                &got.to_vec::<f32>().unwrap(),
                &want,
                1e-5,
                1e-6,
            );
        }
    }
}

#[test]
fn binary_ops_read_non_contiguous_views() {
    let d = dev();
    let mut rng = Rng::new("binary_views");
    let a = rng.vec(6 * 5, -2.0, 2.0);
    let b = rng.vec(5 * 8, -2.0, 2.0);
    // a: [6,5] transposed to [5,6]; b: [5,8] narrowed to columns 1..7.
    let ta = Tensor::from_slice(&a, &[6, 5], &d).unwrap().t().unwrap();
    let tb = Tensor::from_slice(&b, &[5, 8], &d).unwrap().narrow(1, 1, 6).unwrap();
    let got = ta.mul(&tb).unwrap().to_vec::<f32>().unwrap();
    let ra = strides_values(&a, &[5, 6], &[1, 5]);
    let rb: Vec<f64> = strided_indices(&[5, 6], &[8, 1], 1)
        .iter()
        .map(|&i| b[i] as f64)
        .collect();
    let want: Vec<f64> = ra.iter().zip(&rb).map(|(x, y)| x * y).collect();
    assert_close("mul of views", &got, &want, 1e-6, 0.0);
}

/// Views whose rows are contiguous and evenly spaced take the kernel's row addressing; the others, and views that
/// only look alike (a middle dimension skipping rows, a size-1 dimension with its own stride), the general one.
#[test]
fn binary_ops_read_row_blocks_and_views_that_only_look_like_them() {
    let d = dev();
    let mut rng = Rng::new("binary_rows");
    let base_shape = [4usize, 3, 9];
    let data = rng.vec(base_shape.iter().product(), -2.0, 2.0);
    let base = Tensor::from_slice(&data, &base_shape, &d).unwrap();
    // Each view of `base` (strides 27, 9, 1) with the element it starts at.
    let cases = [
        ("last dim narrowed", base.narrow(2, 2, 5).unwrap(), 2),
        ("middle dim narrowed", base.narrow(1, 1, 2).unwrap(), 9),
        (
            "both narrowed",
            base.narrow(1, 1, 1).unwrap().narrow(2, 3, 4).unwrap(),
            12,
        ),
        (
            "first narrowed",
            base.narrow(0, 1, 1).unwrap().narrow(2, 0, 8).unwrap(),
            27,
        ),
    ];
    for (name, view, offset) in cases {
        let shape = view.shape().to_vec();
        let other = rng.vec(shape.iter().product(), -2.0, 2.0);
        let dense = Tensor::from_slice(&other, &shape, &d).unwrap();
        let want: Vec<f64> = strided_indices(&shape, &[27, 9, 1], offset)
            .iter()
            .zip(&other)
            .map(|(&i, &o)| data[i] as f64 - o as f64)
            .collect();
        let got = view.sub(&dense).unwrap().to_vec::<f32>().unwrap();
        assert_close(name, &got, &want, 1e-6, 1e-7);
        let got = dense.neg().unwrap().add(&view).unwrap().to_vec::<f32>().unwrap();
        assert_close(&format!("{name}, second operand"), &got, &want, 1e-6, 1e-7);
    }
}

/// f32 rows a multiple of 4 long that start on quads run four elements a thread from 128-bit loads; a view
/// starting between quads, a broadcast input and odd widths take one element a thread. Both must agree with the
/// reference, in binary ops, preloading unary ones and `cat` (whose quads must not straddle two inputs).
#[test]
fn elementwise_ops_on_quads_and_on_views_between_them() {
    let d = dev();
    let mut rng = Rng::new("quads");
    let base_shape = [4usize, 3, 12];
    let data = rng.vec(base_shape.iter().product(), -2.0, 2.0);
    let base = Tensor::from_slice(&data, &base_shape, &d).unwrap();
    let row_bias = rng.vec(8, -1.0, 1.0);
    let bias = Tensor::from_slice(&row_bias, &[8], &d).unwrap();
    let cases = [
        ("quads of a column block", base.narrow(2, 4, 8).unwrap(), 4),
        ("column block between quads", base.narrow(2, 2, 8).unwrap(), 2),
        (
            "middle dim narrowed",
            base.narrow(1, 1, 2).unwrap().narrow(2, 0, 8).unwrap(),
            12,
        ),
    ];
    for (name, view, offset) in cases {
        let shape = view.shape().to_vec();
        let at = strided_indices(&shape, &[36, 12, 1], offset);
        let other = rng.vec(shape.iter().product(), -2.0, 2.0);
        let dense = Tensor::from_slice(&other, &shape, &d).unwrap();
        let want: Vec<f64> = at
            .iter()
            .zip(&other)
            .map(|(&i, &o)| data[i] as f64 * o as f64)
            .collect();
        let got = view.mul(&dense).unwrap().to_vec::<f32>().unwrap();
        assert_close(name, &got, &want, 1e-6, 1e-7);
        let want: Vec<f64> = at
            .iter()
            .enumerate()
            .map(|(k, &i)| data[i] as f64 + row_bias[k % 8] as f64)
            .collect();
        let got = view.add(&bias).unwrap().to_vec::<f32>().unwrap();
        assert_close(&format!("{name}, broadcast bias"), &got, &want, 1e-6, 1e-7);
        let want: Vec<f64> = at.iter().map(|&i| (data[i] as f64).exp()).collect();
        let got = view.exp().unwrap().to_vec::<f32>().unwrap();
        assert_close(&format!("{name}, exp"), &got, &want, 1e-6, 1e-7);
        let got = view.contiguous().unwrap().to_vec::<f32>().unwrap();
        let want: Vec<f32> = at.iter().map(|&i| data[i]).collect();
        assert_eq!(got, want, "{name}: copy");
    }
    // Along the last dimension: widths 4 + 8 (quads), 4 + 6 (not); along the first: any width.
    for (widths, dim) in [(&[4usize, 8][..], 2), (&[4, 6][..], 2), (&[3, 1][..], 0)] {
        let parts: Vec<Tensor> = widths
            .iter()
            .map(|&w| match dim {
                2 => base.narrow(2, 0, w).unwrap(),
                _ => base.narrow(0, 0, w).unwrap().narrow(2, 4, 8).unwrap(),
            })
            .collect();
        let got = Tensor::cat(&parts, dim as isize).unwrap();
        let mut want = Vec::new();
        for p in &parts {
            want.push(p.contiguous().unwrap().to_vec::<f32>().unwrap());
        }
        let want: Vec<f32> = match dim {
            2 => (0..12)
                .flat_map(|r| {
                    let want = &want;
                    widths
                        .iter()
                        .enumerate()
                        .flat_map(move |(k, &w)| want[k][r * w..(r + 1) * w].to_vec())
                })
                .collect(),
            _ => want.concat(),
        };
        assert_eq!(got.to_vec::<f32>().unwrap(), want, "cat {widths:?} along {dim}");
    }
}

/// Integer tensors with scalars as torch takes them: comparisons exact whatever the scalar (a fraction, one past
/// the dtype's range), arithmetic with a fraction in f32, integers wrapping into 32 bits; `full` and `arange`
/// refuse values the dtype cannot hold rather than saturating them, and count past 2^24 exactly.
#[test]
fn integer_tensors_with_any_scalar() {
    let d = dev();
    let i = Tensor::from_slice(&[0i32, 1, -1, i32::MAX], &[4], &d).unwrap();
    let u = Tensor::from_slice(&[0u32, 5, u32::MAX], &[3], &d).unwrap();
    let cmp = |t: &Tensor, s: f64, op| t.compare_scalar(s, op).unwrap().to_vec::<u32>().unwrap();
    assert_eq!(cmp(&i, 0.5, CmpOp::Lt), [1, 0, 1, 0]);
    assert_eq!(cmp(&i, -0.5, CmpOp::Gt), [1, 1, 0, 1]);
    assert_eq!(cmp(&i, 0.5, CmpOp::Le), [1, 0, 1, 0]);
    assert_eq!(cmp(&i, -0.5, CmpOp::Ge), [1, 1, 0, 1]);
    assert_eq!(cmp(&i, 1.5, CmpOp::Eq), [0, 0, 0, 0]);
    assert_eq!(cmp(&i, 1.5, CmpOp::Ne), [1, 1, 1, 1]);
    assert_eq!(cmp(&i, 3e9, CmpOp::Eq), [0, 0, 0, 0]);
    assert_eq!(cmp(&i, 3e9, CmpOp::Lt), [1, 1, 1, 1]);
    assert_eq!(cmp(&u, -1.0, CmpOp::Gt), [1, 1, 1]);
    assert_eq!(cmp(&u, -1.0, CmpOp::Le), [0, 0, 0]);
    assert_eq!(cmp(&u, f64::NAN, CmpOp::Ne), [1, 1, 1]);
    let half = i.add_scalar(0.5).unwrap();
    assert_eq!(half.dtype(), DType::F32);
    assert_eq!(half.to_vec::<f32>().unwrap(), [0.5, 1.5, -0.5, 2147483648.0]);
    assert_eq!(
        u.add_scalar(-1.0).unwrap().to_vec::<u32>().unwrap(),
        [u32::MAX, 4, u32::MAX - 1]
    );
    assert_eq!(i.mul_scalar(2.0).unwrap().to_vec::<i32>().unwrap(), [0, 2, -2, -2]);
    for (value, dtype) in [(-1.0, DType::U32), (0.5, DType::I32), (3e9, DType::I32)] {
        assert!(Tensor::full(&[2], value, dtype, &d).is_err(), "{value} as {dtype}");
    }
    assert!(Tensor::arange(-2.0, 2.0, 1.0, DType::U32, &d).is_err());
    let big = Tensor::arange(16777216.0, 16777219.0, 1.0, DType::I32, &d).unwrap();
    assert_eq!(big.to_vec::<i32>().unwrap(), [16777216, 16777217, 16777218]);
    assert!(
        Tensor::arange(0.0, 1e12, 1.0, DType::F32, &d).is_err(),
        "more elements than the kernels index"
    );
}

#[test]
fn pow_handles_negative_bases_like_torch() {
    let d = dev();
    let a = Tensor::from_slice(&[-2.0f32, -2.0, -8.0, 0.0, 0.0, 3.0], &[6], &d).unwrap();
    let b = Tensor::from_slice(&[2.0f32, 3.0, 0.5, 2.0, -1.0, 0.0], &[6], &d).unwrap();
    let got = a.pow(&b).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(&got[..2], &[4.0, -8.0]);
    assert!(got[2].is_nan());
    assert_eq!(&got[3..], &[0.0, f32::INFINITY, 1.0]);
    // C's (and torch's) special values: 1 to any power, -1 to an infinite one, infinite bases to fractional
    // powers, the sign of -0 to odd powers.
    let inf = f32::INFINITY;
    let pairs = [
        (1.0f32, f32::NAN),
        (1.0, inf),
        (-1.0, inf),
        (-1.0, -inf),
        (-inf, 2.5),
        (-inf, 3.0),
        (-inf, -2.5),
        (-inf, -3.0),
        (-2.0, inf),
        (-0.5, inf),
        (-2.0, -inf),
        (-0.0, 3.0),
        (-0.0, -1.0),
        (0.0, -2.0),
        (f32::NAN, 0.0),
        (-2.0, 0.5),
        (f32::NAN, 3.0),
        (2.0, f32::NAN),
    ];
    let (a, b): (Vec<f32>, Vec<f32>) = pairs.into_iter().unzip();
    let got = Tensor::from_slice(&a, &[a.len()], &d)
        .unwrap()
        .pow(&Tensor::from_slice(&b, &[b.len()], &d).unwrap())
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    for ((x, y), g) in pairs.iter().zip(got) {
        let want = x.powf(*y);
        let same = if want.is_nan() {
            g.is_nan()
        } else {
            g.to_bits() == want.to_bits()
        };
        assert!(same, "pow({x}, {y}) = {g}, want {want}");
    }
    // Whole powers whose values f32 holds come out exact (exp2(3 log2 10) gave 999.9999, truncated to 999).
    let a = Tensor::from_slice(&[10.0f32, 5.0, 7.0, -3.0, 2.0, 0.5], &[6], &d).unwrap();
    let got = a.pow_scalar(3.0).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(got, [1000.0, 125.0, 343.0, -27.0, 8.0, 0.125]);
    let got = a.pow_scalar(8.0).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(got, [1e8, 390625.0, 5764801.0, 6561.0, 256.0, 0.00390625]);
    let got = a.pow_scalar(-2.0).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(got, [0.01, 0.04, 1.0 / 49.0, 1.0 / 9.0, 0.25, 4.0]);
}

#[test]
fn binary_backward_reduces_over_broadcast_dims() {
    let mut rng = Rng::new("binary_grad");
    for op in BINARY {
        let lo = if op == BinaryOp::Pow { 0.5 } else { -2.0 };
        let b: Vec<f32> = rng.vec(3, 0.5, 2.0);
        // Maximum and minimum are not differentiable at ties: redraw until every pair is 0.05 apart, far beyond
        // the finite-difference step of 0.01.
        let a = loop {
            let a = rng.vec(6, lo, 2.0);
            if a.iter().enumerate().all(|(i, &v)| (v - b[i % 3]).abs() >= 0.05) {
                break a;
            }
        };
        gradcheck(&format!("{op:?}"), &mut rng, &[(a, vec![2, 3]), (b, vec![3])], |t| {
            t[0].binary(&t[1], op)
        });
    }
}

#[test]
fn scalar_ops_and_their_gradients() {
    let d = dev();
    let mut rng = Rng::new("scalar");
    let x = rng.vec(17, 0.2, 3.0);
    let t = Tensor::from_slice(&x, &[17], &d).unwrap();
    for (op, s) in [
        (BinaryOp::Add, 1.5),
        (BinaryOp::Sub, -0.25),
        (BinaryOp::Mul, 3.0),
        (BinaryOp::Div, 7.0),
        (BinaryOp::Pow, 1.7),
    ] {
        for scalar_first in [false, true] {
            let got = t.binary_scalar(s, op, scalar_first).unwrap().to_vec::<f32>().unwrap();
            let want: Vec<f64> = x
                .iter()
                .map(|&v| {
                    if scalar_first {
                        binary_ref(op, s, v as f64)
                    } else {
                        binary_ref(op, v as f64, s)
                    }
                })
                .collect();
            assert_close(&format!("{op:?} scalar_first={scalar_first}"), &got, &want, 2e-6, 1e-6);
            let small = rng.vec(4, 0.5, 2.0);
            gradcheck(&format!("{op:?} scalar"), &mut rng, &[(small, vec![4])], |t| {
                t[0].binary_scalar(s, op, scalar_first)
            });
        }
    }
    // Integer tensors use integer arithmetic.
    let ids = Tensor::from_slice(&[1i32, -2, 7], &[3], &d).unwrap();
    assert_eq!(ids.add_scalar(10.0).unwrap().to_vec::<i32>().unwrap(), vec![11, 8, 17]);
    assert_eq!(ids.mul(&ids).unwrap().to_vec::<i32>().unwrap(), vec![1, 4, 49]);
}

#[test]
fn comparisons_where_and_clamp() {
    let d = dev();
    let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0, f32::NAN], &[4], &d).unwrap();
    let b = Tensor::from_slice(&[2.0f32], &[1], &d).unwrap();
    let cases = [
        (CmpOp::Eq, vec![0, 1, 0, 0]),
        (CmpOp::Ne, vec![1, 0, 1, 1]),
        (CmpOp::Lt, vec![1, 0, 0, 0]),
        (CmpOp::Le, vec![1, 1, 0, 0]),
        (CmpOp::Gt, vec![0, 0, 1, 0]),
        (CmpOp::Ge, vec![0, 1, 1, 0]),
    ];
    for (op, want) in cases {
        assert_eq!(a.compare(&b, op).unwrap().to_vec::<u32>().unwrap(), want, "{op:?}");
        assert_eq!(
            a.compare_scalar(2.0, op).unwrap().to_vec::<u32>().unwrap(),
            want,
            "{op:?} scalar"
        );
    }
    let cond = a.compare_scalar(2.0, CmpOp::Gt).unwrap();
    let w = cond
        .where_cond(&a, &b.broadcast_to(&[4]).unwrap())
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(w, vec![2.0, 2.0, 3.0, 2.0]);
    let c = a.clamp(1.5, 2.5).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(&c[..3], &[1.5, 2.0, 2.5]);
    assert!(c[3].is_nan(), "clamp keeps NaN");
    let m = a.maximum(&b).unwrap().to_vec::<f32>().unwrap();
    assert!(m[3].is_nan(), "maximum propagates NaN");

    let mut rng = Rng::new("where_clamp_grad");
    let x = vec![-1.5f32, -0.3, 0.4, 1.7, 2.9];
    gradcheck("clamp", &mut rng, &[(x.clone(), vec![5])], |t| t[0].clamp(-1.0, 2.0));
    gradcheck("where", &mut rng, &[(x.clone(), vec![5]), (vec![0.5], vec![1])], |t| {
        t[0].compare_scalar(0.0, CmpOp::Gt)?
            .where_cond(&t[0], &t[1].broadcast_to(&[5])?)
    });
}

/// `got` (f16 or bf16) holds exactly `want` rounded as torch rounds it (`half`'s round to nearest even), bit for
/// bit, NaN for NaN.
fn assert_rounded_like_torch(what: &str, got: &Tensor, want: &[f32]) {
    let dtype = got.dtype();
    let bits: Vec<u16> = match dtype {
        DType::F16 => got.to_vec::<half::f16>().unwrap().iter().map(|v| v.to_bits()).collect(),
        _ => got
            .to_vec::<half::bf16>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect(),
    };
    assert_eq!(bits.len(), want.len(), "{what} {dtype}");
    for (i, (&g, &w)) in bits.iter().zip(want).enumerate() {
        let (w, nans) = match dtype {
            DType::F16 => {
                let (g, w) = (half::f16::from_bits(g), half::f16::from_f32(w));
                (w.to_bits(), g.is_nan() && w.is_nan())
            }
            _ => {
                let (g, w) = (half::bf16::from_bits(g), half::bf16::from_f32(w));
                (w.to_bits(), g.is_nan() && w.is_nan())
            }
        };
        assert!(g == w || nans, "{what} {dtype} [{i}]: {g:#06x} vs {w:#06x}");
    }
}

#[test]
fn casts_round_like_torch() {
    let d = dev();
    // 1 + 2^-11 is a tie between two f16 values: round to even gives 1.0; 1 + 3*2^-11 rounds up.
    let x = [
        1.0f32 + 2f32.powi(-11),
        1.0 + 3.0 * 2f32.powi(-11),
        65519.0,
        65520.0,
        1e-8,
        -0.0,
        f32::NAN,
    ];
    let t = Tensor::from_slice(&x, &[x.len()], &d).unwrap();
    for half in [DType::F16, DType::BF16] {
        assert_rounded_like_torch("7 elements", &t.to_dtype(half).unwrap(), &x);
    }
    let i = Tensor::from_slice(&[-2.7f32, 2.7, 0.2], &[3], &d)
        .unwrap()
        .to_dtype(DType::I32)
        .unwrap();
    assert_eq!(i.to_vec::<i32>().unwrap(), vec![-2, 2, 0]);
    let back = i.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(back, vec![-2.0, 2.0, 0.0]);
    // Odd element counts of packed types, and a packed strided read.
    let odd = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3], &d)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    assert_eq!(odd.narrow(0, 1, 2).unwrap().to_f32_vec().unwrap(), vec![2.0, 3.0]);
    // The gradient of a cast is the incoming gradient cast back (finite differences are useless across f16
    // rounding steps, so check it directly).
    let x = Tensor::from_slice(&[0.5f32, 1.25], &[2], &d).unwrap().requires_grad_();
    let w = Tensor::from_slice(&[3.0f32, -2.0], &[2], &d).unwrap();
    x.to_dtype(DType::F16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .mul(&w)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let g = x.grad().unwrap();
    assert_eq!(g.dtype(), DType::F32);
    assert_eq!(g.to_vec::<f32>().unwrap(), vec![3.0, -2.0]);
}

/// Dense f32 tensors of a multiple of 8 elements take the cast kernel that converts eight at a time (mixed
/// precision's operand casts); others the elementwise map. Both round every value as torch does: ties, the f16
/// overflow edge, f16 subnormals and underflow, infinities, NaN, across magnitudes; views whose offset is not a
/// multiple of 4, or whose count is not a multiple of 8, fall back to the map.
#[test]
fn dense_casts_to_16_bits_round_like_torch() {
    let d = dev();
    let mut rng = Rng::new("dense_casts_to_16_bits");
    let specials = [
        1.0f32 + 2f32.powi(-11),
        1.0 + 3.0 * 2f32.powi(-11),
        1.0 + 2f32.powi(-8),
        65519.0,
        65520.0,
        -70000.0,
        3e-5,
        6.1e-5,
        2.98e-8,
        1e-8,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        3.4e38,
        1e-40,
    ];
    let mut x: Vec<f32> = rng.vec(1032, -1.0, 1.0);
    for (i, v) in x.iter_mut().enumerate() {
        *v *= 10f32.powi((i % 13) as i32 - 8);
    }
    x[..specials.len()].copy_from_slice(&specials);
    x[500..500 + specials.len()].copy_from_slice(&specials);
    let t = Tensor::from_slice(&x, &[8, 129], &d).unwrap();
    let flat = t.reshape(&[1032]).unwrap();
    let views = [
        ("whole", t.clone(), 0),
        ("offset 4", flat.narrow(0, 4, 1024).unwrap(), 4),
        ("offset 2", flat.narrow(0, 2, 1024).unwrap(), 2),
        ("1031 elements", flat.narrow(0, 0, 1031).unwrap(), 0),
    ];
    for (name, v, start) in views {
        let want = &x[start..start + v.shape().iter().product::<usize>()];
        for half in [DType::F16, DType::BF16] {
            assert_rounded_like_torch(name, &v.to_dtype(half).unwrap(), want);
        }
    }
    assert_eq!(t.to_dtype(DType::F16).unwrap().shape(), &[8, 129]);
}

#[test]
fn bad_input_is_an_error() {
    let d = dev();
    let a = Tensor::zeros(&[2, 3], DType::F32, &d).unwrap();
    let b = Tensor::zeros(&[4], DType::F32, &d).unwrap();
    assert!(matches!(a.add(&b), Err(hierarchos::core::Error::ShapeMismatch { .. })));
    let i = Tensor::zeros(&[2, 3], DType::I32, &d).unwrap();
    assert!(matches!(a.add(&i), Err(hierarchos::core::Error::DTypeMismatch { .. })));
    assert!(matches!(i.exp(), Err(hierarchos::core::Error::DTypeMismatch { .. })));
    assert!(Tensor::from_slice(&[1.0f32, 2.0], &[3], &d).is_err());
    assert!(a.reshape(&[4, 2]).is_err());
    assert!(a.narrow(1, 2, 2).is_err());
    assert!(a.permute(&[0, 0]).is_err());
    assert!(
        Tensor::zeros(&[1; 9], DType::F32, &d).is_err(),
        "rank above the kernel limit"
    );
    let huge = d.limits().max_storage_buffer_binding_size / 4 + 1;
    assert!(matches!(
        Tensor::zeros(&[huge as usize], DType::F32, &d),
        Err(hierarchos::core::Error::Gpu(
            hierarchos::runtime::GpuError::BufferTooLarge { .. }
        ))
    ));
}

#[test]
fn gated_activation_is_act_times_up_in_one_kernel() {
    let d = dev();
    let mut rng = Rng::new("gated");
    for op in [
        UnaryOp::Silu,
        UnaryOp::Gelu,
        UnaryOp::GeluTanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu2,
    ] {
        let (x, u) = (rng.vec(34, -4.0, 4.0), rng.vec(17, -2.0, 2.0));
        let tx = Tensor::from_slice(&x, &[2, 17], &d).unwrap();
        let tu = Tensor::from_slice(&u, &[17], &d).unwrap();
        let got = tx.gated(&tu, op).unwrap().to_vec::<f32>().unwrap();
        let want: Vec<f64> = x
            .iter()
            .enumerate()
            .map(|(i, &v)| unary_ref(op, v as f64) * u[i % 17] as f64)
            .collect();
        assert_close(&format!("gated {op:?}"), &got, &want, 1e-5, 1e-6);
        // Rows of a multiple of 4 columns, read as quads: x a column block of a wider tensor, u dense.
        let (w, u) = (rng.vec(3 * 12, -4.0, 4.0), rng.vec(3 * 8, -2.0, 2.0));
        let tw = Tensor::from_slice(&w, &[3, 12], &d).unwrap();
        let tu = Tensor::from_slice(&u, &[3, 8], &d).unwrap();
        let got = tw
            .narrow(1, 4, 8)
            .unwrap()
            .gated(&tu, op)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let want: Vec<f64> = (0..24)
            .map(|i| unary_ref(op, w[(i / 8) * 12 + 4 + i % 8] as f64) * u[i] as f64)
            .collect();
        assert_close(&format!("gated {op:?} quads"), &got, &want, 1e-5, 1e-6);
        gradcheck(
            &format!("gated {op:?}"),
            &mut rng,
            &[(rng_small(6), vec![2, 3]), (rng_small(3), vec![3])],
            |t| t[0].gated(&t[1], op),
        );
    }
    let i = Tensor::zeros(&[3], DType::I32, &d).unwrap();
    assert!(i.gated(&i, UnaryOp::Silu).is_err());
}

/// A stacked gate/up product's output gated against itself: its halves' gradients come from one launch, side by
/// side in one tensor, the same values as for separate tensors, in f32 and in packed f16 with an odd half width,
/// and in f32 halves read as quads.
#[test]
fn gated_halves_of_one_tensor_get_their_gradients_side_by_side() {
    let d = dev();
    let mut rng = Rng::new("gated_halves");
    for op in [UnaryOp::Silu, UnaryOp::Gelu, UnaryOp::Relu2] {
        gradcheck(
            &format!("gated halves {op:?}"),
            &mut rng,
            // Shifted off zero, where Relu2's derivative has a kink that finite differences straddle.
            &[(rng_small(12).iter().map(|v| v + 0.3).collect(), vec![2, 6])],
            |t| t[0].narrow(1, 0, 3)?.gated(&t[0].narrow(1, 3, 3)?, op),
        );
        // Halves of a view that starts inside a wider buffer, against copies of them.
        for (dtype, n) in [(DType::F32, 5), (DType::F16, 5), (DType::F32, 8)] {
            // Starting on a quad where the halves can be read as quads, else inside a packed f16 word.
            let start = if n % 4 == 0 { 4 } else { 1 };
            let wide = Tensor::from_slice(&rng.vec(3 * (2 * n + 4), -3.0, 3.0), &[3, 2 * n + 4], &d)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let weights = Tensor::from_slice(&rng.vec(3 * n, -1.0, 1.0), &[3, n], &d)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let gradients = |split: bool| {
                let leaf = wide.detach().requires_grad_();
                let y = leaf.narrow(1, start, 2 * n).unwrap();
                let (gate, up) = (y.narrow(1, 0, n).unwrap(), y.narrow(1, n, n).unwrap());
                let (gate, up) = match split {
                    true => (gate.contiguous().unwrap(), up.contiguous().unwrap()),
                    false => (gate, up),
                };
                let out = gate.gated(&up, op).unwrap().mul(&weights).unwrap();
                out.to_dtype(DType::F32)
                    .unwrap()
                    .sum(&[0, 1], false)
                    .unwrap()
                    .backward()
                    .unwrap();
                leaf.grad()
                    .unwrap()
                    .to_dtype(DType::F32)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap()
            };
            let (together, apart) = (gradients(false), gradients(true));
            assert_eq!(together, apart, "{op:?} {dtype}: side by side against separate tensors");
        }
    }
}

fn rng_small(n: usize) -> Vec<f32> {
    (0..n).map(|i| (i as f32 * 0.7).sin() * 1.5).collect()
}
