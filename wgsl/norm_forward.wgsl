// Normalization forward over rows of x (view 0), an output kernel of rows.wgsl: y = (x - mean) * rstd * w + b,
// where RMSNorm has mean 0 and rstd = 1 / sqrt(mean(x²) + eps), LayerNorm the mean and biased variance (Welford).
// Saves (mean, rstd) per row. The Rust side defines the row element `norm_input(base0, base1, j)`: x itself, or
// with RESIDUAL the sum x + r (r is view 1), which `save_input` also writes out word by word (row-major, contiguous).

fn row_context(row: u32, lid: u32, sg_lane: u32) -> RowCtx {
    let base = row_base(0u, row);
    var base1 = 0u;
    if (RESIDUAL) {
        base1 = row_base(1u, row);
    }
    let c = p[1];
    var acc = vec4<f32>(0.0);
    for (var j = lid; j < c; j = j + WG) {
        let x = norm_input(base, base1, j);
        if (RESIDUAL && EPW == 1u) {
            save_input(row * c + j, x, x);
        }
        if (LAYER) {
            acc = combine(acc, vec4<f32>(1.0, x, 0.0, 0.0), WELFORD);
        } else {
            acc.x = acc.x + x * x;
        }
    }
    // Packed 16-bit sums go out a word (two elements) at a time, so no two threads share a word.
    if (RESIDUAL && EPW == 2u) {
        let wpr = c / 2u;
        for (var w = lid; w < wpr; w = w + WG) {
            save_input(row * wpr + w, norm_input(base, base1, 2u * w), norm_input(base, base1, 2u * w + 1u));
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
    return RowCtx(vec4<f32>(mean, rstd, 0.0, 0.0), base, base1);
}

fn out_value(ctx: RowCtx, j: u32) -> f32 {
    let x = norm_input(ctx.base0, ctx.base1, j);
    return (x - ctx.v.x) * ctx.v.y * weight(j) + bias(j);
}
