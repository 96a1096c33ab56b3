// Rotary position embedding for f32 tensors of rank up to 4 (ops/rope.rs): one thread per W consecutive rotated
// pairs (j, j + D/2) of a head row, which reads both elements and the pairs' cosines and sines once and writes both
// outputs, its coordinates computed once. Same arithmetic as the elementwise form: out_j = x_j cos_j - x_{j+D/2}
// sin_j, out_{j+D/2} = x_{j+D/2} cos_j + x_j sin_j, with the sines times a sign: -1 rotates back (the backward),
// exactly as the negated table would. The Rust side defines W and the bound element type Word: 4 and vec4<f32>
// where every row of x and of the tables starts on a vec4 with its pairs at unit stride and D/2 is a multiple of
// 4 (the coordinates' divisions, not memory, bounded the one-pair kernel), else 1 and f32.
//
// Parameters (u32 words): [threads, D/2, leading sizes s1, s2 (the shape is [s0, s1, s2, D]), then for x, cos and
// sin each: offset and strides along the four dimensions (cos and sin seen as [s0, s1, s2, D/2], broadcast
// dimensions with stride 0), then the output's strides along the three leading dimensions (its last is 1), then the
// sign (f32 bits)].

@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<Word>;
@group(0) @binding(2) var<storage, read> x: array<Word>;
@group(0) @binding(3) var<storage, read> cosines: array<Word>;
@group(0) @binding(4) var<storage, read> sines: array<Word>;

const X_AT: u32 = 4u;
const COS_AT: u32 = 9u;
const SIN_AT: u32 = 14u;
const OUT_AT: u32 = 19u;
const SIGN_AT: u32 = 22u;

// Element offset of (d0, d1, d2, j) in the view whose offset and strides start at p[v].
fn at(v: u32, d0: u32, d1: u32, d2: u32, j: u32) -> u32 {
    return p[v] + d0 * p[v + 1u] + d1 * p[v + 2u] + d2 * p[v + 3u] + j * p[v + 4u];
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = (wid.x + wid.y * nwg.x) * 256u + lid;
    if (g >= p[0]) {
        return;
    }
    let half = p[1];
    let per_row = half / W;
    let j = (g % per_row) * W;
    let row = g / per_row;
    let d2 = row % p[3];
    let d1 = (row / p[3]) % p[2];
    let d0 = row / (p[3] * p[2]);
    let lo_at = at(X_AT, d0, d1, d2, j);
    let lo = x[lo_at / W];
    let hi = x[(lo_at + half * p[X_AT + 4u]) / W];
    let c = cosines[at(COS_AT, d0, d1, d2, j) / W];
    let s = sines[at(SIN_AT, d0, d1, d2, j) / W] * bitcast<f32>(p[SIGN_AT]);
    let o = d0 * p[OUT_AT] + d1 * p[OUT_AT + 1u] + d2 * p[OUT_AT + 2u] + j;
    out[o / W] = lo * c - hi * s;
    out[(o + half) / W] = hi * c + lo * s;
}
