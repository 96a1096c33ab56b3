// `lse_reduce` for devices with subgroup operations (rows.wgsl otherwise merges through `workgroup_reduce`): each
// subgroup merges its threads' logsumexp parts with subgroupMax / subgroupAdd, its first lane writes them to the
// subgroup's slot, and every thread merges the slots in subgroup order, so the result is the same bits on every
// run (training that resumes must repeat itself exactly). The entry point sets the subgroup id and count.
// Called once per kernel.

var<private> sg_id_p: u32;
var<private> n_sg_p: u32;

fn lse_reduce(lid: u32, sg_lane: u32, own: vec4<f32>) -> vec4<f32> {
    let m = subgroupMax(own.x);
    var s = own.y;
    if (m != neg_inf()) {
        s = own.y * exp_acc(own.x - m);
    }
    s = subgroupAdd(s);
    if (sg_lane == 0u) {
        partials[sg_id_p] = vec4<f32>(m, s, 0.0, 0.0);
    }
    workgroupBarrier();
    var total = partials[0];
    for (var k = 1u; k < n_sg_p; k = k + 1u) {
        total = combine(total, partials[k], LSE);
    }
    return total;
}
