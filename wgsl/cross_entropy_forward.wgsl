// Cross-entropy forward, one workgroup per row of logits (view 0) with its target (view 1): an online logsumexp
// in one read of the row (one exp per element), then loss = logsumexp - logit[target]. Writes (loss, valid,
// logsumexp) per row to `out`: ignored targets give (0, 0, lse), out-of-range targets a NaN loss. The Rust side
// adds up the losses and valid counts.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p[0]) {
        return;
    }
    let base = row_base(0u, row);
    let cs = col_stride(0u);
    var m = neg_inf();
    var s = 0.0;
    for (var j = lid; j < p[1]; j = j + 256u) {
        let x = f32(load_logits(base + j * cs));
        if (x > m) {
            s = s * exp(m - x) + 1.0;
            m = x;
        } else if (m != neg_inf()) {
            s = s + exp(x - m);
        }
    }
    let t = workgroup_reduce(lid, vec4<f32>(m, s, 0.0, 0.0));
    if (lid == 0u) {
        let lse = t.x + log(t.y);
        let cls = target_class(bitcast<u32>(load_targets(row_base(1u, row))));
        var loss = 0.0;
        var valid = 1.0;
        if (cls == -1) {
            valid = 0.0;
        } else if (cls == -2) {
            loss = bitcast<f32>(0x7fc00000u);
        } else {
            loss = lse - f32(load_logits(base + u32(cls) * cs));
        }
        out[3u * row] = loss;
        out[3u * row + 1u] = valid;
        out[3u * row + 2u] = lse;
    }
}
