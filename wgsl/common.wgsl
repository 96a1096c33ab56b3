// Helpers shared by every generated kernel.

// f32 -> bf16 bits with round-to-nearest-even, as PyTorch converts; NaN stays a quiet NaN.
fn f32_to_bf16(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        return (b >> 16u) | 0x40u;
    }
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}

// f32 -> f16 bits with round-to-nearest-even; overflow gives infinity, NaN stays NaN, subnormals are kept.
// Written out because WGSL leaves the rounding and overflow of f16 conversions to the implementation.
fn f32_to_f16(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    let sign = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    if (a > 0x7f800000u) {
        return sign | 0x7e00u;
    }
    if (a >= 0x477ff000u) {
        return sign | 0x7c00u;
    }
    if (a >= 0x38800000u) {
        let r = a - 0x38000000u;
        return sign | ((r + 0xfffu + ((r >> 13u) & 1u)) >> 13u);
    }
    let e = a >> 23u;
    if (e < 102u) {
        return sign;
    }
    let m = (a & 0x7fffffu) | 0x800000u;
    let shift = 126u - e;
    let q = m >> shift;
    let rem = m & ((1u << shift) - 1u);
    let half = 1u << (shift - 1u);
    var res = q;
    if (rem > half || (rem == half && (q & 1u) == 1u)) {
        res = res + 1u;
    }
    return sign | res;
}

// Infinities and NaN from bit patterns. WGSL rejects constant expressions that overflow, such as 1.0 / 0.0, and
// Chrome's compiler (Tint) rejects even `bitcast<f32>(0x7f800000u)`: the bits come from a private variable, which
// is not a constant expression.
var<private> INF_BITS: u32 = 0x7f800000u;

fn pos_inf() -> f32 {
    return bitcast<f32>(INF_BITS);
}

fn neg_inf() -> f32 {
    return bitcast<f32>(INF_BITS | 0x80000000u);
}

fn quiet_nan() -> f32 {
    return bitcast<f32>(INF_BITS | 0x00400000u);
}

// Buffer offset of element `i` (row-major order) of a strided view: its rank, its shape at p[shape_at..], the
// offset of its first element at p[offset_at] and its strides at p[strides_at..] (every kernel binds its
// parameters as `p`).
fn strided_index(i: u32, rank: u32, shape_at: u32, offset_at: u32, strides_at: u32) -> u32 {
    var rem = i;
    var off = p[offset_at];
    for (var d = i32(rank) - 1; d >= 0; d = d - 1) {
        let n = p[shape_at + u32(d)];
        off = off + (rem % n) * p[strides_at + u32(d)];
        rem = rem / n;
    }
    return off;
}

// exp(x) as accurate at every x as the device's exp2 is near 0 (within 2 ulp on the H200 and 3 on lavapipe; PyTorch's
// expf: 1). Drivers compute WGSL's exp as exp2(x log2(e)) with the product rounded, which adds about |x| / 4 ulp
// (2-4 at the |x| of 8-16 of attention scores and logits, 20 near 88). Here x = n ln2 + r with n an integer:
// n ln2's high part has 15 significant bits, so that product and the difference are exact without fma (lavapipe's
// fma rounds twice), and 2^n scales exp2(r log2(e)) exactly. n is x log2(e) rounded by adding 1.5 2^23 (its
// bits then hold n; a float round trip there, (a + c) - c, is folded away by Mesa), at most 127, so that 2^n is
// an f32 (|r log2(e)| <= 1 then). Outside the range of normal results x gives 0, infinity or NaN, chosen by
// comparisons that no compiler can turn into a max or min (which drop NaN).
fn exp_acc(x: f32) -> f32 {
    let k = min(bitcast<i32>(bitcast<u32>(x * 1.44269502 + 12582912.0) - 0x4b400000u), 127);
    let n = f32(k);
    let r = (x - n * 0.693145751953125) - n * 1.4286068e-6;
    let y = exp2(r * 1.44269502) * bitcast<f32>(u32(k + 127) << 23u);
    let outside = select(select(x, 0.0, x < -1.0), pos_inf(), x > 1.0);
    return select(y, outside, !(x >= -87.3 && x <= 88.72283));
}
