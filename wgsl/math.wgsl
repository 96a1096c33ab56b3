// Math functions with accuracy PyTorch users expect; WGSL leaves builtin precision loose (and has no erf).

// tanh with full relative accuracy near zero (Taylor series) and no overflow for large |x|.
fn tanh_acc(x: f32) -> f32 {
    let a = abs(x);
    if (a < 0.4) {
        let x2 = x * x;
        return x * (1.0 + x2 * (-0.33333333333 + x2 * (0.13333333333 + x2 * (-0.05396825397
            + x2 * (0.02186948854 + x2 * (-0.00886323552 + x2 * 0.00359212803))))));
    }
    let r = 1.0 - 2.0 / (exp_acc(min_nan(2.0 * a, 88.0)) + 1.0);
    return select(r, -r, x < 0.0);
}

fn sigmoid_acc(x: f32) -> f32 {
    return 1.0 / (1.0 + exp_acc(-x));
}

// erfc with fractional error below 1.2e-7 everywhere (Chebyshev fit of erfc(z) exp(z^2)).
fn erfc_acc(x: f32) -> f32 {
    let z = abs(x);
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t * exp_acc(-z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418
        + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587
        + t * (-0.82215223 + t * 0.17087277)))))))));
    return select(r, 2.0 - r, x < 0.0);
}

// Exact GELU written as x/2 * erfc(-x/sqrt 2), which keeps relative accuracy for negative x.
fn gelu_erf(x: f32) -> f32 {
    return 0.5 * x * erfc_acc(-x * 0.70710678118654752);
}

fn gelu_erf_grad(x: f32) -> f32 {
    return 0.5 * erfc_acc(-x * 0.70710678118654752) + x * 0.39894228040143268 * exp_acc(-0.5 * x * x);
}

// Tanh-approximated GELU as x * sigmoid(2u): 1 + tanh(u) = 2 sigmoid(2u) avoids cancellation.
fn gelu_tanh(x: f32) -> f32 {
    let u = 0.79788456080286536 * (x + 0.044715 * x * x * x);
    return x * sigmoid_acc(2.0 * u);
}

fn gelu_tanh_grad(x: f32) -> f32 {
    let u = 0.79788456080286536 * (x + 0.044715 * x * x * x);
    let t = tanh_acc(u);
    let du = 0.79788456080286536 * (1.0 + 3.0 * 0.044715 * x * x);
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
}

fn is_nan(x: f32) -> bool {
    return !(x == x);
}

// max/min that propagate NaN, as torch.maximum / torch.minimum do.
fn max_nan(a: f32, b: f32) -> f32 {
    return select(max(a, b), a + b, is_nan(a) || is_nan(b));
}

fn min_nan(a: f32, b: f32) -> f32 {
    return select(min(a, b), a + b, is_nan(a) || is_nan(b));
}

// a^b for any sign of a, as torch.pow (C's pow): negative bases with integer exponents keep their sign (-0 too), 1
// to any power and anything to the power 0 are 1, -1 to an infinite power is 1, and a negative base to a fractional
// power is NaN unless one of them is infinite.
fn pow_acc(a: f32, b: f32) -> f32 {
    if (b == 0.0 || a == 1.0) {
        return 1.0;
    }
    // Explicitly: drivers' log2 and exp2 of NaN need not be NaN (lavapipe's pow(NaN, 3) came out 0).
    if (is_nan(a) || is_nan(b)) {
        return a + b;
    }
    let finite_b = abs(b) != pos_inf();
    let integer = finite_b && floor(b) == b;
    let odd = integer && fract(b * 0.5) != 0.0;
    if (a == 0.0) {
        let r = select(0.0, pos_inf(), (b < 0.0));
        return select(r, -r, odd && (bitcast<u32>(a) >> 31u) == 1u);
    }
    if (a == -1.0 && !finite_b) {
        return 1.0;
    }
    // Whole powers up to 64 by repeated squaring: exact where the powers are (10^3 is 1000, where exp2(b log2 a)
    // gave 999.9999), within an ulp or two elsewhere.
    if (integer && abs(b) <= 64.0) {
        var e = u32(abs(b));
        var x = a;
        var r = 1.0;
        loop {
            if ((e & 1u) == 1u) {
                r = r * x;
            }
            e = e >> 1u;
            if (e == 0u) {
                break;
            }
            x = x * x;
        }
        return select(r, 1.0 / r, b < 0.0);
    }
    let r = exp2(b * log2(abs(a)));
    if (a < 0.0) {
        if (!integer && finite_b && a != neg_inf()) {
            return quiet_nan();
        }
        return select(r, -r, odd);
    }
    return r;
}
