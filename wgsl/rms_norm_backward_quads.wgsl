// RMSNorm backward over f32 rows read as quads, a group of rows per subgroup (ops/norm.rs): the bits of
// norm_backward.wgsl for RMSNorm, whose workgroup reduction `row_sum` (row_sum_quads.wgsl) reproduces through
// registers and subgroup shuffles instead of a tree of eight barriers a row. For each row of the group
//   dx = prior + rstd * (g * w - x̂ * mean(g * w * x̂)),  x̂ = (x - mean) * rstd,
// prior being the gradient x already had (zeros when none), while each lane adds g * x̂ of its quads over the
// group's rows, in row order, for the weight's partial sums (one row of them per group, as norm_backward.wgsl).
// A row's g, x and prior are loaded all at once and kept in registers until its dx is stored. The products that
// meet a sum are fma, as in norm_backward.wgsl.
//
// The Rust side prepends the bindings (dx, stats, gs, xs, then those it uses: partial, priors, ws; all quads but
// stats), PRIOR and `prior_quad(row, q)`, `weight(q)` (or ones), `store_partial(i, v)` (or nothing), SLOTS (as for
// rms_norm_quads.wgsl), STEPS, the most quads a lane of the smallest subgroup takes, and LANES, the lanes of
// every subgroup where all have as many (else 0). Parameters (u32 words, offsets and strides in quads): [rows,
// quads a row, rows a group, g offset, g row stride, x offset, x row stride, prior offset, prior row stride,
// w offset].

fn g_quad(row: u32, q: u32) -> vec4<f32> {
    return gs[p[3] + row * p[4] + q];
}

fn x_quad(row: u32, q: u32) -> vec4<f32> {
    return xs[p[5] + row * p[6] + q];
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) subgroup_lanes: u32,
        @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) n_sg: u32) {
    // A constant where every subgroup has LANES lanes, so that the slot of each unrolled step is one too.
    let lanes = select(subgroup_lanes, LANES, LANES != 0u);
    let rows = p[0];
    let width = p[1];
    let per = p[2];
    let groups = (rows + per - 1u) / per;
    // Subgroups past the last group run on its copy and store nothing, so that every lane reaches the shuffles.
    let live = (wid.x + wid.y * nwg.x) * n_sg + sg < groups;
    let group = min((wid.x + wid.y * nwg.x) * n_sg + sg, groups - 1u);
    let r1 = min(group * per + per, rows);
    // A 1 the compiler cannot see: the prior is added to dx rounded, as an add of its own would.
    let one = select(0.0, 1.0, rows != 0u);
    var dw: array<vec4<f32>, STEPS>;
    for (var row = group * per; row < r1; row = row + 1u) {
        let mean = stats[2u * row];
        let rstd = stats[2u * row + 1u];
        // Every load of the row is issued before any is used (quads past the row reread its last one).
        var g: array<vec4<f32>, STEPS>;
        var x: array<vec4<f32>, STEPS>;
        var prior: array<vec4<f32>, STEPS>;
        var w: array<vec4<f32>, STEPS>;
        for (var k = 0u; k < STEPS; k = k + 1u) {
            let q = min(lane + k * lanes, width - 1u);
            g[k] = g_quad(row, q);
            x[k] = x_quad(row, q);
            prior[k] = prior_quad(row, q);
            w[k] = weight(q);
        }
        var parts: array<vec4<f32>, SLOTS>;
        for (var k = 0u; k < STEPS; k = k + 1u) {
            if (lane + k * lanes < width) {
                x[k] = (x[k] - mean) * rstd;
                let m = k % (64u / lanes);
                parts[m] = fma(g[k] * w[k], x[k], parts[m]);
                dw[k] = fma(g[k], x[k], dw[k]);
            }
        }
        let mean_gx = row_sum(parts, lanes) / f32(4u * width);
        if (live) {
            for (var k = 0u; k < STEPS; k = k + 1u) {
                let q = lane + k * lanes;
                if (q < width) {
                    var v = rstd * fma(-x[k], vec4<f32>(mean_gx), g[k] * w[k]);
                    if (PRIOR) {
                        v = fma(v, vec4<f32>(one), prior[k]);
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
