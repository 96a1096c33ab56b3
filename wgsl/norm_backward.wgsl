// Normalization backward, one pass for the input and the weight and bias gradients (an `Entry::Groups` kernel
// of rows.wgsl): workgroup `group` takes rows group * PER .. (group + 1) * PER (PER = scalar 5) of g (view 0) and x
// (view 1), with the (mean, rstd) the forward saved. Each thread owns the output words lid + WG * k of a row
// (k < WPT, EPW elements each) and keeps ĝ = g * w and x̂ = (x - mean) * rstd of their elements in registers
// between the row's reduction and its output
//   dx = rstd * (ĝ - mean(ĝ) - x̂ * mean(ĝ * x̂))      (RMSNorm drops the mean(ĝ) term),
// while it adds g * x̂ (the weight's gradient) and g (the bias's) of its elements over the rows. Those sums go out
// per workgroup as [groups, PARTS, C], weight part first; the Rust side adds them. With PRIOR, dx is stored as
// prior_grad(row, j) + dx: the gradient x already had (view 2), added here instead of by a launch of its own. The
// Rust side defines WPT, DX, DW, DB, PARTS and PRIOR, `prior_grad` and `store_dx` / `store_partial` (empty when not
// written). Products that meet a sum are written as fma: a compiler may fuse a multiply and an add or not, and
// rms_norm_backward_quads.wgsl must give these bits.

const EPT: u32 = WPT * EPW;

fn run_group(group: u32, lid: u32, sg_lane: u32) {
    let per = scalar_u32(5u);
    let r0 = group * per;
    if (r0 >= p[0]) {
        return;
    }
    let r1 = min(r0 + per, p[0]);
    let c = p[1];
    let wpr = c / EPW;
    let sg = col_stride(0u);
    let sx = col_stride(1u);
    var dw: array<f32, EPT>;
    var db: array<f32, EPT>;
    for (var row = r0; row < r1; row = row + 1u) {
        let bg = row_base(0u, row);
        let bx = row_base(1u, row);
        let mean = stats[2u * row];
        let rstd = stats[2u * row + 1u];
        var gh: array<f32, EPT>;
        var xh: array<f32, EPT>;
        var prior: array<f32, EPT>;
        var acc = vec4<f32>(0.0);
        for (var k = 0u; k < EPT; k = k + 1u) {
            let j = (lid + WG * (k / EPW)) * EPW + k % EPW;
            if (j < c) {
                let g = f32(load_g(bg + j * sg));
                let x = (f32(load_x(bx + j * sx)) - mean) * rstd;
                // Loaded with the row, not after its reduction, so that its latency hides behind theirs.
                prior[k] = prior_grad(row, j);
                gh[k] = g * weight(j);
                xh[k] = x;
                acc = vec4<f32>(acc.x + gh[k], fma(gh[k], x, acc.y), acc.z, acc.w);
                dw[k] = fma(g, x, dw[k]);
                db[k] = db[k] + g;
            }
        }
        let t = workgroup_reduce(lid, acc, SUM);
        // A 1 the compiler cannot see: the prior is added to dx rounded, as an add of its own would.
        let one = select(0.0, 1.0, p[0] != 0u);
        if (DX) {
            let mean_g = select(0.0, t.x / f32(c), LAYER);
            let mean_gx = t.y / f32(c);
            for (var k = 0u; k < WPT; k = k + 1u) {
                let w = lid + WG * k;
                if (w < wpr) {
                    let e = k * EPW;
                    // Only an f32 dx (EPW 1) adds the gradient gathered for x.
                    var v0 = rstd * fma(-xh[e], mean_gx, gh[e] - mean_g);
                    if (PRIOR) {
                        v0 = fma(v0, one, prior[e]);
                    }
                    var v1 = v0;
                    if (EPW == 2u) {
                        v1 = rstd * fma(-xh[e + 1u], mean_gx, gh[e + 1u] - mean_g);
                    }
                    store_dx(row * wpr + w, v0, v1);
                }
            }
        }
    }
    for (var k = 0u; k < EPT; k = k + 1u) {
        let j = (lid + WG * (k / EPW)) * EPW + k % EPW;
        if (j < c) {
            if (DW) {
                store_partial(group * PARTS * c + j, dw[k], 0.0);
            }
            if (DB) {
                store_partial((group * PARTS + PARTS - 1u) * c + j, db[k], 0.0);
            }
        }
    }
}
