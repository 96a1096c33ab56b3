// RMSNorm backward over f32 rows read as quads, PER rows per subgroup one after another (ops/norm.rs): the
// input gradient dx = rstd * (ĝ - x̂ * mean(ĝ * x̂)) with ĝ = g * w and x̂ = x * rstd, the row's sum through
// registers and subgroup shuffles (rows_quads_sum.wgsl, the row kernel's bits), and the weight's gradient Σ g * x̂ over the subgroup's rows, written per subgroup as the partial
// sums [C, groups] that the Rust side adds along their rows (norm_backward.wgsl's layout, PARTS = 1). The row
// kernel gives each row a workgroup and a tree of barriers.
//
// The Rust side prepends the bindings (dx, partial, stats, gs, xs, ws: quads but partial and stats; dx, partial
// and ws only where used), `weight(q)` (quad q of w, or ones), `store_dx(i, v)` and `store_partial(i, v)`
// (nothing where not needed), PER and QUADS (the most quads a lane holds: a row's quads over the smallest
// subgroup). Parameters (u32 words, offsets and strides in quads): [rows, quads a row, g offset, g row stride,
// x offset, x row stride, w offset].

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) lanes: u32,
        @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) n_sg: u32) {
    let rows = p[0];
    let width = p[1];
    let group = (wid.x + wid.y * nwg.x) * n_sg + sg;
    let groups = (rows + PER - 1u) / PER;
    let steps = (width + lanes - 1u) / lanes;
    var dw: array<vec4<f32>, QUADS>;
    for (var i = 0u; i < PER; i = i + 1u) {
        // Rows past the last run on its copy and store nothing, so that every lane reaches subgroupAdd.
        let live = group < groups && group * PER + i < rows;
        let row = min(group * PER + i, rows - 1u);
        let rstd = stats[2u * row + 1u];
        var gh: array<vec4<f32>, QUADS>;
        var xh: array<vec4<f32>, QUADS>;
        var parts: array<vec4<f32>, SLOTS>;
        for (var k = 0u; k < steps; k = k + 1u) {
            let q = lane + k * lanes;
            if (q < width) {
                let g = gs[p[2] + row * p[3] + q];
                let x = xs[p[4] + row * p[5] + q] * rstd;
                gh[k] = g * weight(q);
                xh[k] = x;
                let m = k % (64u / lanes);
                parts[m] = parts[m] + gh[k] * x;
                if (live) {
                    dw[k] = dw[k] + g * x;
                }
            }
        }
        let mean_gx = row_sum(parts, lanes) / f32(4u * width);
        if (live) {
            for (var k = 0u; k < steps; k = k + 1u) {
                let q = lane + k * lanes;
                if (q < width) {
                    store_dx(row * width + q, rstd * (gh[k] - xh[k] * mean_gx));
                }
            }
        }
    }
    if (group < groups) {
        for (var k = 0u; k < steps; k = k + 1u) {
            let q = lane + k * lanes;
            if (q < width) {
                store_partial((4u * q) * groups + group, dw[k]);
            }
        }
    }
}
