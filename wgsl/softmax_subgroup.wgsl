// Subgroup merge for softmax.wgsl: each subgroup reduces its parts with subgroupMax / subgroupAdd, its first
// lane claims a slot (no assumption about how invocations map to subgroups), and every thread merges the slots.
fn combine_subgroup(own: Part, sg_lane: u32) -> Part {
    let m = subgroupMax(own.m);
    var s = own.s;
    if (m != neg_inf()) {
        s = own.s * exp(own.m - m);
    }
    s = subgroupAdd(s);
    if (sg_lane == 0u) {
        let slot = atomicAdd(&n_parts, 1u);
        sh_m[slot] = m;
        sh_s[slot] = s;
    }
    workgroupBarrier();
    let n = atomicLoad(&n_parts);
    var total = Part(sh_m[0], sh_s[0]);
    for (var k = 1u; k < n; k = k + 1u) {
        total = merge(total, Part(sh_m[k], sh_s[k]));
    }
    return total;
}
