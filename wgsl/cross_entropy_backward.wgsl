// Cross-entropy backward, an output kernel of rows.wgsl: d logits = (softmax - onehot(target)) * g / n_valid for
// logits (view 0) and targets (view 1), from the forward's per-row (loss, valid, logsumexp) in `rowstats` and its
// sums (Σ loss, n_valid) in `sums` at offset scalar 3; `g` is read at offset scalar 2. Ignored rows get zeros,
// out-of-range targets NaN.

fn row_context(row: u32, lid: u32, sg_lane: u32) -> RowCtx {
    let cls = target_class(bitcast<u32>(load_targets(row_base(1u, row))));
    var scale = f32(load_g(scalar_u32(2u))) / sums[scalar_u32(3u) + 1u];
    if (cls == -2) {
        scale = quiet_nan();
    }
    let ignored = select(0.0, 1.0, (cls == -1));
    return RowCtx(vec4<f32>(rowstats[3u * row + 2u], scale, ignored, 0.0), row_base(0u, row), bitcast<u32>(cls));
}

fn out_value(ctx: RowCtx, j: u32) -> f32 {
    if (ctx.v.z == 1.0) {
        return 0.0;
    }
    let x = f32(load_logits(ctx.base0 + j * col_stride(0u)));
    return (exp_acc(x - ctx.v.x) - select(0.0, 1.0, (j == ctx.base1))) * ctx.v.y;
}
