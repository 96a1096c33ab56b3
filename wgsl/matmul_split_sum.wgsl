// The sum of the partial products of a matmul split along K (see matmul.wgsl): out[i] = sum over s of
// partial[s * n + i], added in slice order so that the result does not depend on scheduling. Each thread sums
// one Part (a vec4 where n is a multiple of 4, else one f32), loading four slices' values before it adds them,
// so that several loads are in flight. The Rust side defines Part, OutType and to_out (the f32 sum, or it
// rounded to f16: as f16, or as f32 for autocast's products).
//
// Parameters: [n in Parts, slices].

@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<OutType>;
@group(0) @binding(2) var<storage, read> partial: array<Part>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let n = p[0];
    let slices = p[1];
    let i = (wid.x + wid.y * nwg.x) * 256u + lid;
    if (i >= n) {
        return;
    }
    var sum = partial[i];
    for (var s = 1u; s < slices; s = s + 4u) {
        var v: array<Part, 4>;
        for (var k = 0u; k < 4u; k = k + 1u) {
            if (s + k < slices) {
                v[k] = partial[(s + k) * n + i];
            }
        }
        for (var k = 0u; k < 4u; k = k + 1u) {
            if (s + k < slices) {
                sum = sum + v[k];
            }
        }
    }
    out[i] = to_out(sum);
}
