// The gradient of a row lookup (`index_select` along dim 0, embeddings): out[t] = sum of g[k] over the k with
// ids[k] == t, in ascending k, for every row t of the table (rows never looked up get 0). One workgroup per output
// row scans the ids a block at a time, marking the matches in a bitmask (set with atomicOr, so the marks do not
// depend on thread order), then adds the matching rows of g in ascending order, each thread owning columns: no
// float atomics, the same bits on every run. A per-element scan of all the ids (the generic scatter) costs the
// table's size times the ids; this costs the table's rows times the ids once.
//
// Parameters (u32 words): [rows of out, ids K, row width W, ids offset, ids stride, g offset].

@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read> g: array<f32>;

const BLOCK: u32 = 4096u;
var<workgroup> hits: array<atomic<u32>, 128>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let t = wid.x + wid.y * nwg.x;
    // Uniform across the workgroup, so the barriers below stay in uniform control flow.
    if (t >= p[0]) {
        return;
    }
    let k_len = p[1];
    let w = p[2];
    let row = t * w;
    for (var c = lid; c < w; c = c + 256u) {
        out[row + c] = 0.0;
    }
    for (var block = 0u; block < k_len; block = block + BLOCK) {
        if (lid < 128u) {
            atomicStore(&hits[lid], 0u);
        }
        workgroupBarrier();
        for (var j = lid; j < BLOCK && block + j < k_len; j = j + 256u) {
            if (ids[p[3] + (block + j) * p[4]] == t) {
                atomicOr(&hits[j / 32u], 1u << (j % 32u));
            }
        }
        workgroupBarrier();
        for (var word = 0u; word < 128u; word = word + 1u) {
            var bits = atomicLoad(&hits[word]);
            while (bits != 0u) {
                let k = block + word * 32u + firstTrailingBit(bits);
                bits = bits & (bits - 1u);
                let src = p[5] + k * w;
                for (var c = lid; c < w; c = c + 256u) {
                    out[row + c] = out[row + c] + g[src + c];
                }
            }
        }
        // The next block clears the marks the loop above reads.
        workgroupBarrier();
    }
}
