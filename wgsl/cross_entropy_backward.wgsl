// Cross-entropy backward, an output kernel of rows.wgsl: d logits = (softmax - onehot(target)) * g / n_valid for
// logits (view 0) and targets (view 1), from the forward's per-row (loss, valid, lse, max, log Σ) in `rowstats`
// and its sums (Σ loss, n_valid) in `sums` at offset scalar 3; `g` is read at offset scalar 2. Ignored rows get
// zeros, out-of-range targets NaN. softmax = exp((x - lse) - lse_err), lse_err = log Σ - (lse - max) being what
// the rounding of lse dropped (exactly, as Fast2Sum, where |max| >= log Σ): exp(x - lse) alone loses the low bits
// of large logits (5e-4 relative at 2e4). From values loaded, so that no compiler folds lse_err to 0.

fn row_context(row: u32, lid: u32, sg_lane: u32) -> RowCtx {
    let cls = target_class(bitcast<u32>(load_targets(row_base(1u, row))));
    var scale = f32(load_g(scalar_u32(2u))) / sums[scalar_u32(3u) + 1u];
    if (cls == -2) {
        scale = quiet_nan();
    }
    let ignored = select(0.0, 1.0, (cls == -1));
    let stats = 5u * row;
    let lse = rowstats[stats + 2u];
    let lse_err = rowstats[stats + 4u] - (lse - rowstats[stats + 3u]);
    return RowCtx(vec4<f32>(lse, scale, ignored, lse_err), row_base(0u, row), bitcast<u32>(cls));
}

fn out_value(ctx: RowCtx, j: u32) -> f32 {
    if (ctx.v.z == 1.0) {
        return 0.0;
    }
    let x = f32(load_logits(ctx.base0 + j * col_stride(0u)));
    return (exp_acc((x - ctx.v.x) - ctx.v.w) - select(0.0, 1.0, (j == ctx.base1))) * ctx.v.y;
}
