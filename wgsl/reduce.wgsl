// Row reduction template: one workgroup reduces one row of R elements of a strided view whose reduced
// dimensions come last. The Rust side prepends bindings, `load_in0`, `Acc`, `identity`, `combine`,
// `element`, `first_pass` and `finish`; two-phase reductions (logsumexp) run `phase` 0 then 1.
//
// Parameters: [rows, R, rank, shape[8], offset, strides[8]].

var<workgroup> shared_acc: array<Acc, 256>;

fn element_offset(i: u32) -> u32 {
    return strided_index(i, p[2], 3u, 11u, 12u);
}

fn load_element(row: u32, j: u32) -> f32 {
    let i = row * p[1] + j;
    if (CONTIGUOUS) {
        return f32(load_in0(p[11] + i));
    }
    return f32(load_in0(element_offset(i)));
}

fn reduce_row(row: u32, lid: u32, pass_value: f32, phase: u32) -> Acc {
    var acc = identity(phase);
    for (var j = lid; j < p[1]; j = j + 256u) {
        acc = combine(acc, element(load_element(row, j), j, pass_value, phase), phase);
    }
    shared_acc[lid] = acc;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            shared_acc[lid] = combine(shared_acc[lid], shared_acc[lid + s], phase);
        }
        workgroupBarrier();
    }
    let total = shared_acc[0];
    workgroupBarrier();
    return total;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p[0]) {
        return;
    }
    var pass_value = 0.0;
    if (TWO_PASS) {
        pass_value = first_pass(reduce_row(row, lid, 0.0, 0u));
    }
    let total = reduce_row(row, lid, pass_value, 1u);
    if (lid == 0u) {
        out[row] = finish(total, pass_value);
    }
}
