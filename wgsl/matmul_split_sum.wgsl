// The sum of the partial products of a matmul split along K (see matmul.wgsl): out[i] = sum over s of
// partial[s * n + i], added in slice order so that the result does not depend on scheduling. Each thread sums
// WPT elements 256 apart, loading all of a slice's WPT values before it adds them, so that several loads are in
// flight. The Rust side defines OutType, to_out (the f32 sum, or it rounded to f16: as f16, or as f32 for
// autocast's products) and WPT.
//
// Parameters: [n, slices].

@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<OutType>;
@group(0) @binding(2) var<storage, read> partial: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let n = p[0];
    let first = (wid.x + wid.y * nwg.x) * (256u * WPT) + lid;
    var sum: array<f32, WPT>;
    for (var s = 0u; s < p[1]; s = s + 1u) {
        var v: array<f32, WPT>;
        for (var k = 0u; k < WPT; k = k + 1u) {
            let i = first + 256u * k;
            if (i < n) {
                v[k] = partial[s * n + i];
            }
        }
        for (var k = 0u; k < WPT; k = k + 1u) {
            sum[k] = select(sum[k] + v[k], v[k], s == 0u);
        }
    }
    for (var k = 0u; k < WPT; k = k + 1u) {
        let i = first + 256u * k;
        if (i < n) {
            out[i] = to_out(sum[k]);
        }
    }
}
