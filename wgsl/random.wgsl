// Counter-based random numbers: element i of the output is computed from Philox4x32-10 with key (seed_lo,
// seed_hi) and counter (e_lo, e_hi, 0, 0), where e = offset + i as a 64-bit integer. NORMAL selects randn.
//
// Parameters: [n, offset_lo, offset_hi, seed_lo, seed_hi, bits]. `bits` is the mantissa width of the uniform
// output (24 for f32, 11 for f16, 8 for bf16) so that every uniform value is exact in the output dtype.

// The 64-bit product a * b as (high word, low word), from 16-bit halves (WGSL has no widening multiply).
fn mulhilo(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p10 = a1 * b0;
    let p01 = a0 * b1;
    let cross = (p00 >> 16u) + (p10 & 0xffffu) + p01;
    let hi = a1 * b1 + (p10 >> 16u) + (cross >> 16u);
    let lo = (cross << 16u) | (p00 & 0xffffu);
    return vec2<u32>(hi, lo);
}

fn philox4x32_10(counter: vec4<u32>, key: vec2<u32>) -> vec4<u32> {
    var c = counter;
    var k = key;
    for (var r = 0u; r < 10u; r = r + 1u) {
        let m0 = mulhilo(0xD2511F53u, c.x);
        let m1 = mulhilo(0xCD9E8D57u, c.z);
        c = vec4<u32>(m1.x ^ c.y ^ k.x, m1.y, m0.x ^ c.w ^ k.y, m0.y);
        k = k + vec2<u32>(0x9E3779B9u, 0xBB67AE85u);
    }
    return c;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + lid;
    if (i >= p[0]) {
        return;
    }
    let e_lo = p[1] + i;
    let e_hi = p[2] + select(0u, 1u, (e_lo < i));
    let r = philox4x32_10(vec4<u32>(e_lo, e_hi, 0u, 0u), vec2<u32>(p[3], p[4]));
    if (NORMAL) {
        // Box-Muller: u1 in (0, 1] avoids log(0); cos(2 pi u2) is evaluated as -cos(pi (2 u2 - 1)), whose
        // argument stays in [-pi, pi] where GPU cosines are accurate.
        let u1 = (f32(r.x >> 8u) + 1.0) * 5.9604644775390625e-8;
        let u2 = f32(r.y >> 8u) * 5.9604644775390625e-8;
        out[i] = -sqrt(-2.0 * log(u1)) * cos(3.14159265358979 * (2.0 * u2 - 1.0));
    } else {
        let bits = p[5];
        out[i] = f32(r.x >> (32u - bits)) / f32(1u << bits);
    }
}
