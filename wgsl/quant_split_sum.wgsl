// The sum over the SPLIT subgroups of a matrix-vector workgroup (quant_matvec.wgsl, subgroup devices only):
// subgroup 0's lane 0 gets it; every invocation calls it.

fn split_sum(sg_lane: u32, sg_id: u32, v: f32) -> f32 {
    let s = subgroupAdd(v);
    if (SPLIT == 1u) {
        return s;
    }
    if (sg_lane == 0u) {
        partial[sg_id] = s;
    }
    workgroupBarrier();
    var total = 0.0;
    for (var i = 0u; i < SPLIT; i = i + 1u) {
        total = total + partial[i];
    }
    workgroupBarrier();
    return total;
}
