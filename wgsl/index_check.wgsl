// Range check of an index tensor: one workgroup finds the largest and smallest `order_key` of the ids (the Rust
// side prepends bindings, `load_in0` and `order_key`, which maps ids to u32 so that unsigned order is id order).
//
// Parameters: [n, offset]. Writes out[0] = max key, out[1] = min key.

var<workgroup> sh_hi: array<u32, 256>;
var<workgroup> sh_lo: array<u32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32) {
    var hi = 0u;
    var lo = 0xffffffffu;
    for (var j = lid; j < p[0]; j = j + 256u) {
        let k = order_key(load_in0(p[1] + j));
        hi = max(hi, k);
        lo = min(lo, k);
    }
    sh_hi[lid] = hi;
    sh_lo[lid] = lo;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            sh_hi[lid] = max(sh_hi[lid], sh_hi[lid + s]);
            sh_lo[lid] = min(sh_lo[lid], sh_lo[lid + s]);
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        out[0] = sh_hi[0];
        out[1] = sh_lo[0];
    }
}
