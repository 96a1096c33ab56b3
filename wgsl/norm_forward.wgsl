// Normalization forward over rows of x (view 0), an output kernel of rows.wgsl: y = (x - mean) * rstd * w + b,
// where RMSNorm has mean 0 and rstd = 1 / sqrt(mean(x²) + eps), LayerNorm the mean and biased variance (Welford).
// Saves (mean, rstd) per row.

fn row_context(row: u32, lid: u32, sg_lane: u32) -> RowCtx {
    let base = row_base(0u, row);
    let cs = col_stride(0u);
    let c = p[1];
    var acc = vec4<f32>(0.0);
    for (var j = lid; j < c; j = j + WG) {
        let x = f32(load_x(base + j * cs));
        if (LAYER) {
            acc = combine(acc, vec4<f32>(1.0, x, 0.0, 0.0), WELFORD);
        } else {
            acc.x = acc.x + x * x;
        }
    }
    let t = workgroup_reduce(lid, acc, select(SUM, WELFORD, LAYER));
    var mean = 0.0;
    var variance = t.x / f32(c);
    if (LAYER) {
        mean = t.y;
        variance = t.z / f32(c);
    }
    let rstd = 1.0 / sqrt(variance + scalar_f32(0u));
    if (lid == 0u) {
        stats[2u * row] = mean;
        stats[2u * row + 1u] = rstd;
    }
    return RowCtx(vec4<f32>(mean, rstd, 0.0, 0.0), base, 0u);
}

fn out_value(ctx: RowCtx, j: u32) -> f32 {
    let x = f32(load_x(ctx.base0 + j * col_stride(0u)));
    return (x - ctx.v.x) * ctx.v.y * weight(j) + bias(j);
}
