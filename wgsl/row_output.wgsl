// Template of the row kernels with an output shaped like their input (normalization forward and backward,
// cross-entropy backward): `row_context` reduces or loads what the row needs, then the row's output is written a
// word at a time (two elements for packed 16-bit outputs, whose rows then start on a word boundary because the
// Rust side only writes them directly for even C). The file before this one defines `row_context` and `out_value`.

struct RowCtx {
    v: vec4<f32>,
    base0: u32,
    base1: u32,
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p[0]) {
        return;
    }
    let ctx = row_context(row, lid);
    let wpr = p[1] / EPW;
    for (var w = lid; w < wpr; w = w + 256u) {
        let j = w * EPW;
        let v0 = out_value(ctx, j);
        var v1 = v0;
        if (EPW == 2u) {
            v1 = out_value(ctx, j + 1u);
        }
        store_out(row * wpr + w, v0, v1);
    }
}
