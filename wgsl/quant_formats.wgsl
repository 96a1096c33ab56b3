// ggml block formats as the GPU stores them: one block per BW words of `w` (declared by the Rust side), laid out
// as ggml's block with the f16 scale of Q4_0 / Q5_0 / Q8_0 moved behind the quants and Q6_K padded by two bytes,
// so that every block and every field starts on a word boundary. Per format:
//   deq_<type>(b, i):  element i of the block starting at word b (bit-exact to the CPU dequantizer: every
//                      scale-times-quant product is exact in f32, so fused or separate multiply-adds agree);
//   task_<type>(b, t): task t of the block for the matrix-vector kernel: the 8 values at element offsets
//                      off_<type>(t) + 0..4 and off_<type>(t) + TD + 0..4, decoded from whole-word loads.

// f16 bits (the low 16 of h) to f32, exactly; written out because unpack2x16float may flush subnormals.
fn half_at(h: u32) -> f32 {
    let s = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 0u) {
        return bitcast<f32>(s | bitcast<u32>(f32(m) * bitcast<f32>(0x33800000u)));
    }
    if (e == 31u) {
        return bitcast<f32>(s | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(s | ((e + 112u) << 23u) | (m << 13u));
}

fn byte_at(b: u32, o: u32) -> u32 {
    return (w[b + (o >> 2u)] >> ((o & 3u) * 8u)) & 0xffu;
}

fn sbyte(x: u32) -> i32 {
    return bitcast<i32>(x << 24u) >> 24u;
}

fn bytes4(x: u32) -> vec4<u32> {
    return (vec4<u32>(x) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xffu);
}

fn sbytes4(x: u32) -> vec4<f32> {
    let v = vec4<i32>(bitcast<i32>(x << 24u), bitcast<i32>(x << 16u), bitcast<i32>(x << 8u), bitcast<i32>(x));
    return vec4<f32>(v >> vec4<u32>(24u));
}

// Low and high nibbles of the four bytes of a word.
fn lo4(q: vec4<u32>) -> vec4<u32> {
    return q & vec4<u32>(0xfu);
}

fn hi4(q: vec4<u32>) -> vec4<u32> {
    return q >> vec4<u32>(4u);
}

// Bit `s` of each of the four bytes of a word, moved to bit 4.
fn bit4(qh: vec4<u32>, s: u32) -> vec4<u32> {
    return ((qh >> vec4<u32>(s)) & vec4<u32>(1u)) << vec4<u32>(4u);
}

// Q4_0: qs (words 0..4), d (word 4).
fn deq_q4_0(b: u32, i: u32) -> f32 {
    let q = (byte_at(b, i & 15u) >> ((i >> 4u) * 4u)) & 0xfu;
    return f32(i32(q) - 8) * half_at(w[b + 4u]);
}

fn task_q4_0(b: u32, t: u32) -> array<vec4<f32>, 2> {
    let d = half_at(w[b + 4u]);
    let q = bytes4(w[b + t]);
    return array<vec4<f32>, 2>(vec4<f32>(vec4<i32>(lo4(q)) - 8) * d, vec4<f32>(vec4<i32>(hi4(q)) - 8) * d);
}

fn off_q4_0(t: u32) -> u32 {
    return 4u * t;
}

// Q4_1: d | m (word 0), qs (words 1..5).
fn deq_q4_1(b: u32, i: u32) -> f32 {
    let q = (byte_at(b, 4u + (i & 15u)) >> ((i >> 4u) * 4u)) & 0xfu;
    return f32(q) * half_at(w[b]) + half_at(w[b] >> 16u);
}

fn task_q4_1(b: u32, t: u32) -> array<vec4<f32>, 2> {
    let d = half_at(w[b]);
    let m = half_at(w[b] >> 16u);
    let q = bytes4(w[b + 1u + t]);
    return array<vec4<f32>, 2>(vec4<f32>(lo4(q)) * d + m, vec4<f32>(hi4(q)) * d + m);
}

fn off_q4_1(t: u32) -> u32 {
    return 4u * t;
}

// Q5_0: qh (word 0, bit i = high bit of element i), qs (words 1..5), d (word 5).
fn deq_q5_0(b: u32, i: u32) -> f32 {
    let q = ((byte_at(b, 4u + (i & 15u)) >> ((i >> 4u) * 4u)) & 0xfu) | (((w[b] >> i) & 1u) << 4u);
    return f32(i32(q) - 16) * half_at(w[b + 5u]);
}

// The four high bits of elements 4t.. and 16 + 4t.. of a Q5 block, as bytes-shaped vectors for bit4().
fn qh5(qh: u32, t: u32) -> vec4<u32> {
    return vec4<u32>(qh >> (4u * t)) >> vec4<u32>(0u, 1u, 2u, 3u);
}

fn task_q5_0(b: u32, t: u32) -> array<vec4<f32>, 2> {
    let d = half_at(w[b + 5u]);
    let q = bytes4(w[b + 1u + t]);
    let h = qh5(w[b], t);
    return array<vec4<f32>, 2>(
        vec4<f32>(vec4<i32>(lo4(q) | bit4(h, 0u)) - 16) * d,
        vec4<f32>(vec4<i32>(hi4(q) | bit4(h, 16u)) - 16) * d,
    );
}

fn off_q5_0(t: u32) -> u32 {
    return 4u * t;
}

// Q5_1: d | m (word 0), qh (word 1), qs (words 2..6).
fn deq_q5_1(b: u32, i: u32) -> f32 {
    let q = ((byte_at(b, 8u + (i & 15u)) >> ((i >> 4u) * 4u)) & 0xfu) | (((w[b + 1u] >> i) & 1u) << 4u);
    return f32(q) * half_at(w[b]) + half_at(w[b] >> 16u);
}

fn task_q5_1(b: u32, t: u32) -> array<vec4<f32>, 2> {
    let d = half_at(w[b]);
    let m = half_at(w[b] >> 16u);
    let q = bytes4(w[b + 2u + t]);
    let h = qh5(w[b + 1u], t);
    return array<vec4<f32>, 2>(vec4<f32>(lo4(q) | bit4(h, 0u)) * d + m, vec4<f32>(hi4(q) | bit4(h, 16u)) * d + m);
}

fn off_q5_1(t: u32) -> u32 {
    return 4u * t;
}

// Q8_0: qs (words 0..8, signed bytes), d (word 8).
fn deq_q8_0(b: u32, i: u32) -> f32 {
    return f32(sbyte(byte_at(b, i))) * half_at(w[b + 8u]);
}

fn task_q8_0(b: u32, t: u32) -> array<vec4<f32>, 2> {
    let d = half_at(w[b + 8u]);
    return array<vec4<f32>, 2>(sbytes4(w[b + 2u * t]) * d, sbytes4(w[b + 2u * t + 1u]) * d);
}

fn off_q8_0(t: u32) -> u32 {
    return 8u * t;
}

// Q4_K / Q5_K: d | dmin (word 0), 12 bytes of 6-bit scales and mins (bytes 4..16), then for Q5_K qh (bytes
// 16..48), then qs (128 bytes). Element i: 64-element chunk c = i / 64, sub-block i / 32, l = i % 32.

// ggml's get_scale_min_k4 for sub-block j: (scale, min).
fn scale_min_k4(b: u32, j: u32) -> vec2<u32> {
    if (j < 4u) {
        return vec2<u32>(byte_at(b, 4u + j) & 63u, byte_at(b, 8u + j) & 63u);
    }
    let v = byte_at(b, 8u + j);
    return vec2<u32>((v & 0xfu) | ((byte_at(b, j) >> 6u) << 4u), (v >> 4u) | ((byte_at(b, 4u + j) >> 6u) << 4u));
}

// d * scale * q - dmin * min for sub-block j.
fn k_values(b: u32, j: u32, q: vec4<u32>) -> vec4<f32> {
    let sm = scale_min_k4(b, j);
    return half_at(w[b]) * f32(sm.x) * vec4<f32>(q) - half_at(w[b] >> 16u) * f32(sm.y);
}

fn k_value(b: u32, j: u32, q: u32) -> f32 {
    let sm = scale_min_k4(b, j);
    return half_at(w[b]) * f32(sm.x) * f32(q) - half_at(w[b] >> 16u) * f32(sm.y);
}

fn deq_q4_k(b: u32, i: u32) -> f32 {
    let q = (byte_at(b, 16u + 32u * (i >> 6u) + (i & 31u)) >> (4u * ((i >> 5u) & 1u))) & 0xfu;
    return k_value(b, i >> 5u, q);
}

fn task_q4_k(b: u32, t: u32) -> array<vec4<f32>, 2> {
    let c = t >> 3u;
    let q = bytes4(w[b + 4u + t]);
    return array<vec4<f32>, 2>(k_values(b, 2u * c, lo4(q)), k_values(b, 2u * c + 1u, hi4(q)));
}

fn off_q4_k(t: u32) -> u32 {
    return 64u * (t >> 3u) + 4u * (t & 7u);
}

fn deq_q5_k(b: u32, i: u32) -> f32 {
    let j = i >> 5u;
    let q = (byte_at(b, 48u + 32u * (i >> 6u) + (i & 31u)) >> (4u * (j & 1u))) & 0xfu;
    return k_value(b, j, q | (((byte_at(b, 16u + (i & 31u)) >> j) & 1u) << 4u));
}

fn task_q5_k(b: u32, t: u32) -> array<vec4<f32>, 2> {
    let c = t >> 3u;
    let q = bytes4(w[b + 12u + t]);
    let h = bytes4(w[b + 4u + (t & 7u)]);
    return array<vec4<f32>, 2>(
        k_values(b, 2u * c, lo4(q) | bit4(h, 2u * c)),
        k_values(b, 2u * c + 1u, hi4(q) | bit4(h, 2u * c + 1u)),
    );
}

fn off_q5_k(t: u32) -> u32 {
    return off_q4_k(t);
}

// Q6_K: ql (words 0..32), qh (words 32..48), 16 signed scales (words 48..52), d (word 52). Element i: half
// h = i / 128, quarter g = (i % 128) / 32, l = i % 32; low bits from ql[64h + 32(g % 2) + l] (nibble g / 2),
// high bits 2g.. of qh[32h + l], scale 8h + l / 16 + 2g.
fn deq_q6_k(b: u32, i: u32) -> f32 {
    let h = i >> 7u;
    let g = (i >> 5u) & 3u;
    let l = i & 31u;
    let lo = (byte_at(b, 64u * h + 32u * (g & 1u) + l) >> (4u * (g >> 1u))) & 0xfu;
    let hi = (byte_at(b, 128u + 32u * h + l) >> (2u * g)) & 3u;
    let sc = sbyte(byte_at(b, 192u + 8u * h + (l >> 4u) + 2u * g));
    return half_at(w[b + 52u]) * f32(sc) * f32(i32(lo | (hi << 4u)) - 32);
}

// Task t: half h = t / 16, p = (t / 8) % 2, l = 4 (t % 8).. : quarters p (low nibbles) and p + 2 (high nibbles).
fn task_q6_k(b: u32, t: u32) -> array<vec4<f32>, 2> {
    let h = t >> 4u;
    let p = (t >> 3u) & 1u;
    let ql = bytes4(w[b + t]);
    let qh = bytes4(w[b + 32u + 8u * h + (t & 7u)]);
    let q0 = vec4<i32>(lo4(ql) | (((qh >> vec4<u32>(2u * p)) & vec4<u32>(3u)) << vec4<u32>(4u))) - 32;
    let q1 = vec4<i32>(hi4(ql) | (((qh >> vec4<u32>(2u * p + 4u)) & vec4<u32>(3u)) << vec4<u32>(4u))) - 32;
    let s = 192u + 8u * h + ((t & 7u) >> 2u) + 2u * p;
    let d = half_at(w[b + 52u]);
    return array<vec4<f32>, 2>(d * f32(sbyte(byte_at(b, s))) * vec4<f32>(q0), d * f32(sbyte(byte_at(b, s + 4u))) * vec4<f32>(q1));
}

fn off_q6_k(t: u32) -> u32 {
    return 128u * (t >> 4u) + 32u * ((t >> 3u) & 1u) + 4u * (t & 7u);
}
