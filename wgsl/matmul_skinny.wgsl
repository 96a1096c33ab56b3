// Skinny products, the decode shape: ROWS (at most 8) rows per batch entry, fixed per pipeline so that the
// accumulators stay in registers. A workgroup is 2 groups of 32 threads
// (small, so that even an N of a few hundred fills a large GPU); each group owns one output column n for every row, its lanes split K (consecutive lanes read consecutive k,
// so a right operand with unit stride along k -- a transposed weight -- is read coalesced, once) and add up
// through workgroup memory. The Rust side prepends bindings, load/store functions and matmul_batch.wgsl, and
// replaces the DOT marker with the K loop: scalar loads through the dtype's load functions, or vec4 loads when both
// operands are f32 with unit stride along K and 16-byte aligned rows.

const LANES: u32 = 32u;
const COLUMNS: u32 = 2u;

var<workgroup> partial: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) local: u32) {
    let M = p[0];
    let N = p[1];
    let K = p[2];
    let blocks = (N + COLUMNS - 1u) / COLUMNS;
    let t = wid.x + wid.y * nwg.x;
    if (t >= blocks * p[3]) {
        return;
    }
    let batch = t / blocks;
    let lane = local % LANES;
    let n = (t % blocks) * COLUMNS + local / LANES;
    let bases = batch_bases(batch);
    var acc: array<f32, ROWS>;
    if (n < N) {
        //@DOT
    }
    for (var r = 0u; r < M; r = r + 1u) {
        partial[local] = acc[r];
        workgroupBarrier();
        for (var s = LANES / 2u; s > 0u; s = s >> 1u) {
            if (lane < s) {
                partial[local] = partial[local] + partial[local + s];
            }
            workgroupBarrier();
        }
        if (lane == 0u && n < N) {
            store_out(batch * M * N + r * N + n, partial[local], 0.0);
        }
        workgroupBarrier();
    }
}
