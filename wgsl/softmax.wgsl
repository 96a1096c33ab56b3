// Softmax / log-softmax over rows of x (view 0), an output kernel of rows.wgsl: one read pass keeps a running
// logsumexp part per thread (online softmax, row_logsumexp.wgsl), `lse_reduce` merges them, then one read +
// write pass normalizes. `LOG` selects log-softmax.

fn row_value(i: u32) -> f32 {
    return f32(load_x(i));
}

fn row_context(row: u32, lid: u32, sg_lane: u32) -> RowCtx {
    let base = row_base(0u, row);
    let cs = col_stride(0u);
    let own = row_lse_part(base, cs, lid);
    let total = lse_reduce(lid, sg_lane, own);
    var scale = 1.0 / total.y;
    if (LOG) {
        scale = log(total.y);
    }
    return RowCtx(vec4<f32>(total.x, scale, 0.0, 0.0), base, 0u);
}

fn out_value(ctx: RowCtx, j: u32) -> f32 {
    let x = f32(load_x(ctx.base0 + j * col_stride(0u)));
    if (LOG) {
        // (x - max) - log(sum) keeps full precision for large x, unlike x - (max + log(sum)).
        return (x - ctx.v.x) - ctx.v.y;
    }
    return exp_acc(x - ctx.v.x) * ctx.v.y;
}
