// Sums over the leading dimensions of a contiguous f32 tensor seen as [R, C] (ops/reduce.rs): out[c] = Σ_r
// in[r, c], four columns a workgroup read as one vec4. Each column is added in reduce.wgsl's order (thread t adds
// rows t, t + 256, ... in order, then a tree halving the threads), so the sums are its bits; reduce.wgsl gives a
// column a workgroup and walks it through strided indices. A thread issues four rows' loads before adding them.
//
// Parameters: [C / 4, R, offset / 4].

@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> in0: array<vec4<f32>>;

var<workgroup> partials: array<vec4<f32>, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let width = p[0];
    let rows = p[1];
    // The same for the whole workgroup, so returning keeps the barriers uniform.
    let q = wid.x + wid.y * nwg.x;
    if (q >= width) {
        return;
    }
    var acc = vec4<f32>(0.0);
    for (var r0 = lid; r0 < rows; r0 = r0 + 1024u) {
        var v: array<vec4<f32>, 4>;
        for (var k = 0u; k < 4u; k = k + 1u) {
            let r = r0 + 256u * k;
            if (r < rows) {
                v[k] = in0[p[2] + r * width + q];
            }
        }
        for (var k = 0u; k < 4u; k = k + 1u) {
            if (r0 + 256u * k < rows) {
                acc = acc + v[k];
            }
        }
    }
    partials[lid] = acc;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            partials[lid] = partials[lid] + partials[lid + s];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        out[q] = partials[0];
    }
}
