// x @ W^T for quantized W and few rows of x (decode): ROWS (at most 8) rows of x, fixed per pipeline so that the
// accumulators stay in registers. Each group of 32 lanes owns one output column n (a row of W): its lanes walk
// the row's tasks (8 values of one block each, see quant_formats.wgsl), so that consecutive lanes read
// consecutive words of the blocks, decode them once and multiply them with every row of x (vec4 loads, f32
// accumulation). The lanes then add up through subgroupAdd (a group is a 32-wide subgroup) or through workgroup
// memory. Fused around the product, so that a decode step needs fewer launches:
// - NORM: the input rows are RMS-normalized first (weight `g`, eps): the group sums the squares of the row as it
//   loads it (its tasks cover the row once) and multiplies x by g; lane 0 scales the dot product by
//   1 / sqrt(mean(x²) + eps) at the end.
// - GATED: the group also owns row n + N (the up projection stacked under the gate) and the result is
//   act(gate) * up: the gated MLP's two projections and activation.
// - RESIDUAL: `res` (dense [M, N]) is added to the result: the residual stream.
// The Rust side prepends bindings (out: f32, x: vec4<f32>, w, g: vec4<f32> with NORM, res: f32 with RESIDUAL),
// quant_formats.wgsl, the format's QK, BW, TD, task(), task_off(), ROWS, GROUPS, NORM, GATED, RESIDUAL,
// epilogue(), load_g(), load_res(), with subgroups split_sum(), and replaces the LANE_BUILTINS, LANE and
// LANE_SUM markers.
// Parameters: [M, N, K, x offset in vec4s, word where the blocks start, eps (f32 bits), g offset in vec4s,
// res offset].

const LANES: u32 = 32u;
const TPB: u32 = QK / 8u;
// Lanes that share one output column: SPLIT subgroups of a workgroup split a long row between them (decode is
// latency-bound: fewer rounds of loads per lane), and add their subgroup sums through workgroup memory.
const STRIDE: u32 = LANES * SPLIT;

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

@compute @workgroup_size(LANES * GROUPS * SPLIT)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) local: u32 /*@LANE_BUILTINS*/) {
    let N = p[1];
    let K = p[2];
    //@LANE
    let n = (wid.x + wid.y * nwg.x) * GROUPS + group;
    let K4 = K / 4u;
    var acc: array<f32, ROWS>;
    var acc2: array<f32, ROWS>;
    // With NORM, the squares of each input row: the tasks of a group cover every element of the row once.
    var squares: array<f32, ROWS>;
    if (n < N) {
        let blocks = K / QK;
        let tasks = blocks * TPB;
        let row = p[4] + n * blocks * BW;
        let row2 = p[4] + (n + N) * blocks * BW;
        for (var j = lane; j < tasks; j = j + STRIDE) {
            let blk = j / TPB;
            let t = j % TPB;
            let v = task(row + blk * BW, t);
            let e = (blk * QK + task_off(t)) / 4u;
            let o = p[3] + e;
            var v2 = v;
            if (GATED) {
                v2 = task(row2 + blk * BW, t);
            }
            let g0 = load_g(e);
            let g1 = load_g(e + TD / 4u);
            for (var r = 0u; r < ROWS; r = r + 1u) {
                let xo = o + r * K4;
                let xa = x[xo];
                let xb = x[xo + TD / 4u];
                if (NORM) {
                    squares[r] = squares[r] + dot(xa, xa) + dot(xb, xb);
                }
                let x0 = xa * g0;
                let x1 = xb * g1;
                acc[r] = acc[r] + dot(x0, v[0]) + dot(x1, v[1]);
                if (GATED) {
                    acc2[r] = acc2[r] + dot(x0, v2[0]) + dot(x1, v2[1]);
                }
            }
        }
    }
    for (var r = 0u; r < ROWS; r = r + 1u) {
        var s = LANE_SUM(acc[r]);
        var s2 = 0.0;
        if (GATED) {
            s2 = LANE_SUM(acc2[r]);
        }
        if (NORM) {
            let rstd = 1.0 / sqrt(LANE_SUM(squares[r]) / f32(K) + bitcast<f32>(p[5]));
            s = s * rstd;
            s2 = s2 * rstd;
        }
        if (lane == 0u && n < N) {
            var y = epilogue(s, s2);
            if (RESIDUAL) {
                y = load_res(r * N + n) + y;
            }
            out[r * N + n] = y;
        }
    }
}
