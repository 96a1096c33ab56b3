// x @ W^T for quantized W and few rows of x (decode): ROWS (at most 8) rows of x, fixed per pipeline so that the
// accumulators stay in registers. Each group of 32 lanes owns one output column n (a row of W): its lanes walk
// the row's tasks (8 values of one block each, see quant_formats.wgsl), so that consecutive lanes read
// consecutive words of the blocks, decode them once and multiply them with every row of x (vec4 loads, f32
// accumulation). The lanes then add up through subgroupAdd (a group is a 32-wide subgroup) or through workgroup
// memory. With GATED, the group also owns row n + N (the up projection stacked under the gate) and writes
// epilogue(gate, up) = act(gate) * up: the gated MLP's two projections and activation in one launch.
// The Rust side prepends bindings (out: f32, x: vec4<f32>, w), quant_formats.wgsl, the format's QK, BW, TD,
// task(), task_off(), ROWS, GROUPS, GATED, epilogue(), and replaces the LANE_BUILTINS, LANE and LANE_SUM markers.
// Parameters: [M, N, K, x offset in vec4s, word where the blocks start].

const LANES: u32 = 32u;
const TPB: u32 = QK / 8u;

var<workgroup> partial: array<f32, LANES * GROUPS>;

// The sum over a group's lanes through workgroup memory (lane 0 gets it); every invocation calls it.
fn tree_sum(local: u32, lane: u32, v: f32) -> f32 {
    partial[local] = v;
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s = s >> 1u) {
        if (lane < s) {
            partial[local] = partial[local] + partial[local + s];
        }
        workgroupBarrier();
    }
    let total = partial[local];
    workgroupBarrier();
    return total;
}

@compute @workgroup_size(LANES * GROUPS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) local: u32 /*@LANE_BUILTINS*/) {
    let N = p[1];
    let K = p[2];
    //@LANE
    let n = (wid.x + wid.y * nwg.x) * GROUPS + group;
    let K4 = K / 4u;
    var acc: array<f32, ROWS>;
    var acc2: array<f32, ROWS>;
    if (n < N) {
        let blocks = K / QK;
        let tasks = blocks * TPB;
        let row = p[4] + n * blocks * BW;
        let row2 = p[4] + (n + N) * blocks * BW;
        for (var j = lane; j < tasks; j = j + LANES) {
            let blk = j / TPB;
            let t = j % TPB;
            let v = task(row + blk * BW, t);
            let o = p[3] + (blk * QK + task_off(t)) / 4u;
            for (var r = 0u; r < ROWS; r = r + 1u) {
                let xo = o + r * K4;
                acc[r] = acc[r] + dot(x[xo], v[0]) + dot(x[xo + TD / 4u], v[1]);
            }
            if (GATED) {
                let v2 = task(row2 + blk * BW, t);
                for (var r = 0u; r < ROWS; r = r + 1u) {
                    let xo = o + r * K4;
                    acc2[r] = acc2[r] + dot(x[xo], v2[0]) + dot(x[xo + TD / 4u], v2[1]);
                }
            }
        }
    }
    for (var r = 0u; r < ROWS; r = r + 1u) {
        let s = LANE_SUM(acc[r]);
        var s2 = 0.0;
        if (GATED) {
            s2 = LANE_SUM(acc2[r]);
        }
        if (lane == 0u && n < N) {
            out[r * N + n] = epilogue(s, s2);
        }
    }
}
