// RMSNorm backward over f32 rows read as quads, a group of rows per subgroup (ops/norm.rs): the bits of
// norm_backward.wgsl for RMSNorm, whose workgroup reduction `row_sum` (row_sum_quads.wgsl) reproduces through
// registers and subgroup shuffles instead of a tree of eight barriers a row. For each row of the group
//   dx = prior + rstd * (g * w - x̂ * mean(g * w * x̂)),  x̂ = (x - mean) * rstd,
// prior being the gradient x already had (zeros when none), while each lane adds g * x̂ of its quads over the
// group's rows, in row order, for the weight's partial sums (one row of them per group, as norm_backward.wgsl).
// g and x are read twice, before and after the row's sum; the prior once, with them, so that its latency hides
// behind theirs.
//
// The Rust side prepends the bindings (dx, stats, gs, xs, then those it uses: partial, priors, ws; all quads but
// stats), PRIOR and `prior_quad(row, q)`, `weight(q)` (or ones), `store_partial(i, v)` (or nothing), SLOTS (as for
// rms_norm_quads.wgsl) and STEPS, the most quads a lane of the smallest subgroup takes. Parameters (u32 words,
// offsets and strides in quads): [rows, quads a row, rows a group, g offset, g row stride, x offset, x row
// stride, prior offset, prior row stride, w offset].

fn g_quad(row: u32, q: u32) -> vec4<f32> {
    return gs[p[3] + row * p[4] + q];
}

fn x_quad(row: u32, q: u32) -> vec4<f32> {
    return xs[p[5] + row * p[6] + q];
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) lanes: u32,
        @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) n_sg: u32) {
    let rows = p[0];
    let width = p[1];
    let per = p[2];
    let groups = (rows + per - 1u) / per;
    // Subgroups past the last group run on its copy and store nothing, so that every lane reaches the shuffles.
    let live = (wid.x + wid.y * nwg.x) * n_sg + sg < groups;
    let group = min((wid.x + wid.y * nwg.x) * n_sg + sg, groups - 1u);
    let r1 = min(group * per + per, rows);
    var dw: array<vec4<f32>, STEPS>;
    for (var row = group * per; row < r1; row = row + 1u) {
        let mean = stats[2u * row];
        let rstd = stats[2u * row + 1u];
        var parts: array<vec4<f32>, SLOTS>;
        var prior: array<vec4<f32>, STEPS>;
        for (var k = 0u; k < STEPS; k = k + 1u) {
            let q = lane + k * lanes;
            if (q < width) {
                let g = g_quad(row, q);
                let x = (x_quad(row, q) - mean) * rstd;
                prior[k] = prior_quad(row, q);
                let gh = g * weight(q);
                let m = k % (64u / lanes);
                parts[m] = parts[m] + gh * x;
                dw[k] = dw[k] + g * x;
            }
        }
        let mean_gx = row_sum(parts, lanes) / f32(4u * width);
        if (live) {
            for (var k = 0u; k < STEPS; k = k + 1u) {
                let q = lane + k * lanes;
                if (q < width) {
                    let gh = g_quad(row, q) * weight(q);
                    let x = (x_quad(row, q) - mean) * rstd;
                    var v = rstd * (gh - 0.0 - x * mean_gx);
                    if (PRIOR) {
                        v = prior[k] + v;
                    }
                    dx[row * width + q] = v;
                }
            }
        }
    }
    if (live) {
        for (var k = 0u; k < STEPS; k = k + 1u) {
            let q = lane + k * lanes;
            if (q < width) {
                store_partial(group * width + q, dw[k]);
            }
        }
    }
}
