// `lse_reduce` for devices with subgroup operations (rows.wgsl otherwise merges through `workgroup_reduce`): each
// subgroup merges its threads' logsumexp parts with subgroupMax / subgroupAdd, its first lane claims a slot (no
// assumption about how invocations map to subgroups), and every thread merges the slots. Called once per kernel.

var<workgroup> n_parts: atomic<u32>;

fn lse_reduce(lid: u32, sg_lane: u32, own: vec4<f32>) -> vec4<f32> {
    let m = subgroupMax(own.x);
    var s = own.y;
    if (m != neg_inf()) {
        s = own.y * exp(own.x - m);
    }
    s = subgroupAdd(s);
    if (sg_lane == 0u) {
        let slot = atomicAdd(&n_parts, 1u);
        partials[slot] = vec4<f32>(m, s, 0.0, 0.0);
    }
    workgroupBarrier();
    let n = atomicLoad(&n_parts);
    var total = partials[0];
    for (var k = 1u; k < n; k = k + 1u) {
        total = combine(total, partials[k], LSE);
    }
    return total;
}
