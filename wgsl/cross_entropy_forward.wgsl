// Cross-entropy forward on rows.wgsl, one workgroup per row of logits (view 0) with its target (view 1): an online
// logsumexp in one read of the row (row_logsumexp.wgsl), then loss = logsumexp - logit[target]. Writes (loss,
// valid, logsumexp) per row to `out`: ignored targets give (0, 0, lse), out-of-range targets a NaN loss. The Rust
// side adds up the losses and valid counts.

fn row_value(i: u32) -> f32 {
    return f32(load_logits(i));
}

fn run_row(row: u32, lid: u32, sg_lane: u32) {
    let base = row_base(0u, row);
    let cs = col_stride(0u);
    let own = row_lse_part(base, cs, lid);
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
