// x @ W^T for quantized W and few rows of x (decode): ROWS (at most 8) rows of x, fixed per pipeline so that the
// accumulators stay in registers. Each group of 32 lanes owns one output column n (a row of W): its lanes walk
// the row's tasks (8 values of one block each, see quant_formats.wgsl), so that consecutive lanes read
// consecutive words of the blocks, decode them once and multiply them with every row of x (vec4 loads, f32
// accumulation). The lanes then add up through subgroupAdd (a group is a 32-wide subgroup) or through workgroup
// memory. The Rust side prepends bindings (out: f32, x: vec4<f32>, w), quant_formats.wgsl, the format's QK, BW,
// TD, task(), task_off(), and ROWS, GROUPS, and replaces the LANE_BUILTINS, LANE and REDUCE markers.
// Parameters: [M, N, K, x offset in vec4s].

const LANES: u32 = 32u;
const TPB: u32 = QK / 8u;

var<workgroup> partial: array<f32, LANES * GROUPS>;

@compute @workgroup_size(LANES * GROUPS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) local: u32 /*@LANE_BUILTINS*/) {
    let N = p[1];
    let K = p[2];
    //@LANE
    let n = (wid.x + wid.y * nwg.x) * GROUPS + group;
    let K4 = K / 4u;
    var acc: array<f32, ROWS>;
    if (n < N) {
        let blocks = K / QK;
        let tasks = blocks * TPB;
        let row = n * blocks * BW;
        for (var j = lane; j < tasks; j = j + LANES) {
            let blk = j / TPB;
            let t = j % TPB;
            let v = task(row + blk * BW, t);
            let o = p[3] + (blk * QK + task_off(t)) / 4u;
            for (var r = 0u; r < ROWS; r = r + 1u) {
                let xo = o + r * K4;
                acc[r] = acc[r] + dot(x[xo], v[0]) + dot(x[xo + TD / 4u], v[1]);
            }
        }
    }
    //@REDUCE
}
