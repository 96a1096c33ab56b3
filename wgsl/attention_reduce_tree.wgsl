// reduce(lid, x, is_max) for attention_decode.wgsl without subgroups: the max or the sum over the workgroup's
// values through a shared-memory tree; every thread gets it.

fn reduce(lid: u32, x: f32, is_max: bool) -> f32 {
    red[lid] = x;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            let a = red[lid];
            let b = red[lid + s];
            red[lid] = select(a + b, max(a, b), is_max);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}
