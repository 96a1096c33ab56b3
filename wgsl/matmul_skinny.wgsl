// Skinny products, the decode shape: at most MAX_ROWS rows per batch entry. A workgroup is 2 groups of 32 threads
// (small, so that even an N of a few hundred fills a large GPU); each group owns one output column n for every row, its lanes split K (consecutive lanes read consecutive k,
// so a right operand with unit stride along k -- a transposed weight -- is read coalesced, once) and add up
// through workgroup memory. The Rust side prepends bindings, load/store functions and matmul_batch.wgsl.

const LANES: u32 = 32u;
const COLUMNS: u32 = 2u;
const MAX_ROWS: u32 = 8u;

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
    var acc: array<f32, MAX_ROWS>;
    if (n < N) {
        for (var k = lane; k < K; k = k + LANES) {
            let y = f32(load_rhs(bases.y + k * p[9] + n * p[10]));
            for (var r = 0u; r < MAX_ROWS; r = r + 1u) {
                if (r < M) {
                    acc[r] = acc[r] + f32(load_lhs(bases.x + r * p[6] + k * p[7])) * y;
                }
            }
        }
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
