// Cross-entropy forward on rows.wgsl, one workgroup per row of logits (view 0) with its target (view 1): an online
// logsumexp in one read of the row (one exp per element), then loss = logsumexp - logit[target]. Writes (loss,
// valid, logsumexp) per row to `out`: ignored targets give (0, 0, lse), out-of-range targets a NaN loss. The Rust
// side adds up the losses and valid counts.

fn run_row(row: u32, lid: u32, sg_lane: u32) {
    let base = row_base(0u, row);
    let cs = col_stride(0u);
    var own = vec4<f32>(neg_inf(), 0.0, 0.0, 0.0);
    var j = lid;
    for (; j + 3u * WG < p[1]; j = j + 4u * WG) {
        let at = base + j * cs;
        let step = WG * cs;
        own = lse_push4(own, vec4<f32>(f32(load_logits(at)), f32(load_logits(at + step)), f32(load_logits(at + 2u * step)),
            f32(load_logits(at + 3u * step))));
    }
    for (; j < p[1]; j = j + WG) {
        own = lse_push(own, f32(load_logits(base + j * cs)));
    }
    let t = lse_reduce(lid, sg_lane, own);
    if (lid == 0u) {
        let lse = t.x + log(t.y);
        let cls = target_class(bitcast<u32>(load_targets(row_base(1u, row))));
        var loss = 0.0;
        var valid = 1.0;
        if (cls == -1) {
            valid = 0.0;
        } else if (cls == -2) {
            loss = quiet_nan();
        } else {
            loss = lse - f32(load_logits(base + u32(cls) * cs));
        }
        out[3u * row] = loss;
        out[3u * row + 1u] = valid;
        out[3u * row + 2u] = lse;
    }
}
