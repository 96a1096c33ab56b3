// Cross-entropy forward on rows.wgsl, one workgroup per row of logits (view 0) with its target (view 1): an online
// logsumexp in one read of the row (row_logsumexp.wgsl), then loss = log Σ exp(x - max) - (logit[target] - max),
// as torch's log-softmax computes it. Writes (loss, valid, lse, max, log Σ) per row to `out`, lse = max + log Σ
// rounded to f32, from which the backward recovers what that rounding dropped. Ignored targets give (0, 0, ...),
// out-of-range targets a NaN loss. The Rust side adds up the losses and valid counts.

fn row_value(i: u32) -> f32 {
    return f32(load_logits(i));
}

fn run_row(row: u32, lid: u32, sg_lane: u32) {
    let base = row_base(0u, row);
    let cs = col_stride(0u);
    let own = row_lse_part(base, cs, lid);
    let t = lse_reduce(lid, sg_lane, own);
    if (lid == 0u) {
        let log_sum = log(t.y);
        let cls = target_class(bitcast<u32>(load_targets(row_base(1u, row))));
        var loss = 0.0;
        var valid = 1.0;
        if (cls == -1) {
            valid = 0.0;
        } else if (cls == -2) {
            loss = quiet_nan();
        } else {
            loss = log_sum - (f32(load_logits(base + u32(cls) * cs)) - t.x);
        }
        out[5u * row] = loss;
        out[5u * row + 1u] = valid;
        out[5u * row + 2u] = t.x + log_sum;
        out[5u * row + 3u] = t.x;
        out[5u * row + 4u] = log_sum;
    }
}
