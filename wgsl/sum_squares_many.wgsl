// The sum of the squares of every element of several dense f32 tensors (ops/sum_squares_many.rs), as partial
// sums: gradient clipping's norm over a model's parameters in a few launches instead of one or two per
// parameter. One launch takes up to TENSORS tensors, bound as t0, t1, ...; workgroup w sums CHUNK consecutive
// elements of the tensor whose range of workgroups holds w (f32, in a fixed order) and writes partial[base + w].
// The Rust side writes the bindings and `square_sum`, which reads the chosen tensor, and defines TENSORS.
//
// Parameters (u32 words): [base, tensors, then for tensor i at 2 + 3 i: elements, offset, first workgroup].

const CHUNK: u32 = 4096u;

var<workgroup> sums: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let w = wid.x + wid.y * nwg.x;
    var t = 0u;
    for (var i = 1u; i < p[1]; i = i + 1u) {
        if (w >= p[4u + 3u * i]) {
            t = i;
        }
    }
    let n = p[2u + 3u * t];
    let begin = (w - p[4u + 3u * t]) * CHUNK;
    let end = min(begin + CHUNK, n);
    sums[lid] = square_sum(t, p[3u + 3u * t] + begin, end - min(begin, end), lid);
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            sums[lid] = sums[lid] + sums[lid + s];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        partial[p[0] + w] = sums[0];
    }
}
