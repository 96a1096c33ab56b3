// The sum of the partial products of a matmul split along K (see matmul.wgsl): out[i] = sum over s of
// partial[s * n + i], added in slice order so that the result does not depend on scheduling. The Rust side reads
// the partials as vec4s where n allows (V, of L floats, and OutV; `to_out` turns a V sum into an OutV: the f32 sum,
// or it rounded to f16, as f16 or as f32 for autocast's products), and defines WPT and SB. Each thread owns WPT
// values 256 apart and loads them from SB slices before it adds any, so that many loads are in flight: the sums
// are bound by memory, and a thread waiting on one slice at a time left most of its bandwidth unused.
//
// Parameters: [n, slices].

@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<OutV>;
@group(0) @binding(2) var<storage, read> partial: array<V>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let n = p[0] / L;
    let slices = p[1];
    let first = (wid.x + wid.y * nwg.x) * (256u * WPT) + lid;
    var sum: array<V, WPT>;
    for (var s0 = 0u; s0 < slices; s0 = s0 + SB) {
        var v: array<V, SB * WPT>;
        for (var b = 0u; b < SB; b = b + 1u) {
            for (var k = 0u; k < WPT; k = k + 1u) {
                let i = first + 256u * k;
                if (s0 + b < slices && i < n) {
                    v[b * WPT + k] = partial[(s0 + b) * n + i];
                }
            }
        }
        for (var b = 0u; b < SB; b = b + 1u) {
            if (s0 + b < slices) {
                for (var k = 0u; k < WPT; k = k + 1u) {
                    sum[k] = select(sum[k] + v[b * WPT + k], v[b * WPT + k], s0 + b == 0u);
                }
            }
        }
    }
    for (var k = 0u; k < WPT; k = k + 1u) {
        let i = first + 256u * k;
        if (i < n) {
            out[i] = to_out(sum[k]);
        }
    }
}
