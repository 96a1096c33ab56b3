// RMSNorm forward over f32 rows read as quads, one row per subgroup (ops/norm.rs): the row's sum of squares goes
// through registers and subgroup shuffles (`row_sum` of row_sum_quads.wgsl, the same bits), where the row kernel
// (norm_forward.wgsl) gives each row a workgroup and a tree of barriers.
// y = x * rstd * w with rstd = 1 / sqrt(mean(x²) + eps), as norm_forward.wgsl computes it (mean 0, no bias); for
// add_rms_norm the row is the sum x + r, also written out. Saves (0, rstd) per row.
//
// The Rust side prepends the bindings (out, stats, then those it uses: sums, xs, rs, ws; all quads but stats),
// `row_quad(row, q)` (quad q of x or x + r), `save_sum(i, v)` (writes quad i of the sum, or nothing) and
// `weight(q)` (quad q of w, or ones) and SLOTS, the slots of `row_sum` for the smallest subgroup (64 / its
// lanes). Parameters (u32 words, offsets and strides in quads): [rows, quads a row, x offset, x row stride,
// r offset, r row stride, w offset, eps (f32 bits)].

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) lanes: u32,
        @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) n_sg: u32) {
    let rows = p[0];
    let width = p[1];
    // Subgroups past the last row run on its copy and store nothing, so that every lane reaches subgroupAdd.
    let live = (wid.x + wid.y * nwg.x) * n_sg + sg < rows;
    let row = min((wid.x + wid.y * nwg.x) * n_sg + sg, rows - 1u);
    let steps = (width + lanes - 1u) / lanes;
    var parts: array<vec4<f32>, SLOTS>;
    for (var k = 0u; k < steps; k = k + 1u) {
        let q = lane + k * lanes;
        if (q < width) {
            let v = row_quad(row, q);
            if (live) {
                save_sum(row * width + q, v);
            }
            let m = k % (64u / lanes);
            parts[m] = parts[m] + v * v;
        }
    }
    let total = row_sum(parts, lanes);
    let rstd = 1.0 / sqrt(total / f32(4u * width) + bitcast<f32>(p[7]));
    if (!live) {
        return;
    }
    if (lane == 0u) {
        stats[2u * row] = 0.0;
        stats[2u * row + 1u] = rstd;
    }
    for (var k = 0u; k < steps; k = k + 1u) {
        let q = lane + k * lanes;
        if (q < width) {
            out[row * width + q] = row_quad(row, q) * rstd * weight(q);
        }
    }
}
