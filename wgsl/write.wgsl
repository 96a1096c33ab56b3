// Copy of a strided source into a strided region of a destination (the Rust side prepends the bindings
// `out` and `in0` with `load_in0` / `store_out`). Each thread copies one element; destinations are unpacked, so
// no two threads share a word.
//
// Parameters (u32 words): [numel, rank, shape[8], src offset, src strides[8], dst offset, dst strides[8]].

fn offset_of(base: u32, i: u32) -> u32 {
    return strided_index(i, p[1], 2u, base, base + 1u);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + lid;
    if (i >= p[0]) {
        return;
    }
    let v = load_in0(offset_of(10u, i));
    store_out(offset_of(19u, i), v, v);
}
