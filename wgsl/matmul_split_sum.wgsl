// The sum of the partial products of a matmul split along K (see matmul.wgsl): out[i] = sum over s of
// partial[s * n + i], added in slice order so that the result does not depend on scheduling. The Rust side
// defines OutType and to_out: the f32 sum, or it rounded to f16 (as f16, or as f32 for autocast's products).
//
// Parameters: [n, slices].

@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<OutType>;
@group(0) @binding(2) var<storage, read> partial: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let n = p[0];
    let i = (wid.x + wid.y * nwg.x) * 256u + lid;
    if (i >= n) {
        return;
    }
    var sum = partial[i];
    for (var s = 1u; s < p[1]; s = s + 1u) {
        sum = sum + partial[s * n + i];
    }
    out[i] = to_out(sum);
}
