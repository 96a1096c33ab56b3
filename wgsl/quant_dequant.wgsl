// Dequantizes a whole QTensor to f32, one element per thread through the format's deq(). The Rust side prepends
// the bindings (out: f32, w: the blocks), quant_formats.wgsl, and QK, BW and deq() for the format.
// Parameters: [elements, word where the blocks start].

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) local: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + local;
    if (i >= p[0]) {
        return;
    }
    out[i] = deq(p[1] + (i / QK) * BW, i % QK);
}
