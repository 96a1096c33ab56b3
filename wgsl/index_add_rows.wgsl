// The gradient of a row lookup (`index_select` along dim 0, embeddings): out[t] = sum of g[k] over the k with
// ids[k] == t, in ascending k, for every row t of the table (rows never looked up get 0). One workgroup per
// ROWS consecutive output rows scans the ids a block at a time, marking the matches of each of its rows in a
// bitmask (set with atomicOr, so the marks do not depend on thread order) and counting them, then adds the
// matching rows of g to each row that has any, in ascending order, each thread owning columns: no float atomics,
// the same bits on every run. A per-element scan of all the ids (the generic scatter) costs the table's size
// times the ids; this costs the table's rows over ROWS times the ids. Most rows of a large vocabulary see no id
// in a batch: walking their empty bitmasks took two thirds of the kernel's time before the counts cut the walk.
//
// Ids outside the table clamp into it as the forward's lookups do (index tensors too large to check on the host
// are only clamped): to the last row, and negative i32 ids to row 0.
//
// Parameters (u32 words): [rows of out, ids K, row width W, ids offset, ids stride, g offset, ids are i32].

@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read> g: array<f32>;

const BLOCK: u32 = 4096u;
const ROWS: u32 = 8u;
// Words of one row's bitmask over a block of ids.
const WORDS: u32 = BLOCK / 32u;
var<workgroup> hits: array<atomic<u32>, ROWS * WORDS>;
// Matches per row in the block: the walk over a row's bitmask stops after its last match (at once for most rows
// of a large vocabulary, which have none).
var<workgroup> counts: array<atomic<u32>, ROWS>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let t0 = (wid.x + wid.y * nwg.x) * ROWS;
    // Uniform across the workgroup, so the barriers below stay in uniform control flow.
    if (t0 >= p[0]) {
        return;
    }
    let k_len = p[1];
    let w = p[2];
    let rows = min(ROWS, p[0] - t0);
    // Each thread zeroes the columns it adds to below.
    for (var r = 0u; r < rows; r = r + 1u) {
        for (var c = lid; c < w; c = c + 256u) {
            out[(t0 + r) * w + c] = 0.0;
        }
    }
    for (var block = 0u; block < k_len; block = block + BLOCK) {
        for (var i = lid; i < ROWS * WORDS; i = i + 256u) {
            atomicStore(&hits[i], 0u);
        }
        if (lid < ROWS) {
            atomicStore(&counts[lid], 0u);
        }
        workgroupBarrier();
        for (var j = lid; j < BLOCK && block + j < k_len; j = j + 256u) {
            let id = ids[p[3] + (block + j) * p[4]];
            let r = select(min(id, p[0] - 1u), 0u, p[6] == 1u && i32(id) < 0) - t0;
            if (r < rows) {
                atomicOr(&hits[r * WORDS + j / 32u], 1u << (j % 32u));
                atomicAdd(&counts[r], 1u);
            }
        }
        workgroupBarrier();
        for (var r = 0u; r < rows; r = r + 1u) {
            let row = (t0 + r) * w;
            var left = atomicLoad(&counts[r]);
            for (var word = 0u; left > 0u; word = word + 1u) {
                var bits = atomicLoad(&hits[r * WORDS + word]);
                left = left - countOneBits(bits);
                while (bits != 0u) {
                    let k = block + word * 32u + firstTrailingBit(bits);
                    bits = bits & (bits - 1u);
                    let src = p[5] + k * w;
                    for (var c = lid; c < w; c = c + 256u) {
                        out[row + c] = out[row + c] + g[src + c];
                    }
                }
            }
        }
        // The next block clears the marks the loop above reads.
        workgroupBarrier();
    }
}
