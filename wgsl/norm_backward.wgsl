// Normalization backward for x, an output kernel of rows.wgsl, from g (view 0), x (view 1) and the saved
// (mean, rstd): with ĝ = g * w and x̂ = (x - mean) * rstd, dx = rstd * (ĝ - mean(ĝ) - x̂ * mean(ĝ * x̂)); RMSNorm
// drops the mean(ĝ) term.

fn row_context(row: u32, lid: u32, sg_lane: u32) -> RowCtx {
    let bg = row_base(0u, row);
    let bx = row_base(1u, row);
    let sg = col_stride(0u);
    let sx = col_stride(1u);
    let mean = stats[2u * row];
    let rstd = stats[2u * row + 1u];
    let c = p[1];
    var acc = vec4<f32>(0.0);
    for (var j = lid; j < c; j = j + WG) {
        let gh = f32(load_g(bg + j * sg)) * weight(j);
        let xh = (f32(load_x(bx + j * sx)) - mean) * rstd;
        acc = acc + vec4<f32>(gh, gh * xh, 0.0, 0.0);
    }
    let t = workgroup_reduce(lid, acc, SUM);
    var mean_g = 0.0;
    if (LAYER) {
        mean_g = t.x / f32(c);
    }
    return RowCtx(vec4<f32>(mean, rstd, mean_g, t.y / f32(c)), bg, bx);
}

fn out_value(ctx: RowCtx, j: u32) -> f32 {
    let gh = f32(load_g(ctx.base0 + j * col_stride(0u))) * weight(j);
    let xh = (f32(load_x(ctx.base1 + j * col_stride(1u))) - ctx.v.x) * ctx.v.y;
    return ctx.v.y * (gh - ctx.v.z - xh * ctx.v.w);
}
