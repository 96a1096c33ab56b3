// reduce(lid, x, is_max) for attention_decode.wgsl with subgroups: each subgroup reduces its lanes, then every
// thread combines the subgroups' results from workgroup memory (two barriers instead of a tree's nine).

var<private> sg_lane_p: u32;
var<private> sg_id_p: u32;
var<private> sg_size_p: u32;

fn reduce(lid: u32, x: f32, is_max: bool) -> f32 {
    var s: f32;
    if (is_max) {
        s = subgroupMax(x);
    } else {
        s = subgroupAdd(x);
    }
    if (sg_lane_p == 0u) {
        red[sg_id_p] = s;
    }
    workgroupBarrier();
    var r = red[0];
    for (var i = 1u; i < WG / sg_size_p; i = i + 1u) {
        r = select(r + red[i], max(r, red[i]), is_max);
    }
    workgroupBarrier();
    return r;
}
