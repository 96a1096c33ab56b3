// Tiled matrix product template. One workgroup of 256 threads (16 x 16) computes a BM x BN tile of one batch
// entry of C = A @ B. BK-deep slices of A and B are staged k-major in workgroup memory (each k row padded by one
// vec4 so that stores along k spread over the banks); each thread accumulates a TM x TN micro-tile in registers
// (f32) from vec4 reads, and fetches the next slice from global memory into registers while the current one is
// multiplied. Operands are read through their strides; A_ALONG_K / B_ALONG_K pick which dimension consecutive
// threads walk when fetching, so that the unit-stride dimension is read coalesced.
//
// The Rust side prepends bindings (out, lhs, rhs), their load/store functions, the constants BM, BN, TM, TN,
// A_ALONG_K, B_ALONG_K and PACKED_OUT, and replaces the generated blocks marked `//@NAME` (register declarations,
// fetch, stash, the multiply-add step of one k and the final store), which are unrolled over the micro-tile.
//
// Parameters: see matmul_batch.wgsl.

const BK: u32 = 16u;
const GROUP_M: u32 = 8u;
const AS4: u32 = BM / 4u + 1u;
const BS4: u32 = BN / 4u + 1u;

var<workgroup> As: array<vec4<f32>, BK * AS4>;
var<workgroup> Bs: array<vec4<f32>, BK * BS4>;

var<private> lid: u32;
var<private> tile_m: u32;
var<private> tile_n: u32;
var<private> a_base: u32;
var<private> b_base: u32;

// Element `e` of this thread's share of the A slice: (m, k) within the tile.
fn a_slot(e: u32) -> vec2<u32> {
    let i = e * 256u + lid;
    if (A_ALONG_K) {
        return vec2<u32>(i / BK, i % BK);
    }
    return vec2<u32>(i % BM, i / BM);
}

// Element `e` of this thread's share of the B slice: (k, n) within the tile.
fn b_slot(e: u32) -> vec2<u32> {
    let i = e * 256u + lid;
    if (B_ALONG_K) {
        return vec2<u32>(i % BK, i / BK);
    }
    return vec2<u32>(i / BN, i % BN);
}

// Out-of-range elements read as 0; their addresses are clamped so that every load stays inside the operand.
fn fetch_a(e: u32, k0: u32) -> f32 {
    let s = a_slot(e);
    let m = tile_m + s.x;
    let k = k0 + s.y;
    let v = f32(load_lhs(a_base + min(m, p[0] - 1u) * p[6] + min(k, p[2] - 1u) * p[7]));
    return select(0.0, v, (m < p[0]) && (k < p[2]));
}

fn fetch_b(e: u32, k0: u32) -> f32 {
    let s = b_slot(e);
    let k = k0 + s.x;
    let n = tile_n + s.y;
    let v = f32(load_rhs(b_base + min(k, p[2] - 1u) * p[9] + min(n, p[1] - 1u) * p[10]));
    return select(0.0, v, (k < p[2]) && (n < p[1]));
}

fn stash_a(e: u32, v: f32) {
    let s = a_slot(e);
    As[s.y * AS4 + s.x / 4u][s.x % 4u] = v;
}

fn stash_b(e: u32, v: f32) {
    let s = b_slot(e);
    Bs[s.x * BS4 + s.y / 4u][s.y % 4u] = v;
}

// Writes four consecutive columns `n..n+4` of one output row starting at element `row` (bounds-checked on N).
fn store4(row: u32, n: u32, v: vec4<f32>) {
    let N = p[1];
    if (PACKED_OUT) {
        // N is even, so the pairs (n, n + 1) never straddle a row and each thread owns whole words.
        if (n < N) {
            store_out((row + n) >> 1u, v.x, v.y);
        }
        if (n + 2u < N) {
            store_out((row + n + 2u) >> 1u, v.z, v.w);
        }
        return;
    }
    if (n < N) {
        store_out(row + n, v.x, 0.0);
    }
    if (n + 1u < N) {
        store_out(row + n + 1u, v.y, 0.0);
    }
    if (n + 2u < N) {
        store_out(row + n + 2u, v.z, 0.0);
    }
    if (n + 3u < N) {
        store_out(row + n + 3u, v.w, 0.0);
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) local: u32) {
    let M = p[0];
    let N = p[1];
    let K = p[2];
    let tiles_m = (M + BM - 1u) / BM;
    let tiles_n = (N + BN - 1u) / BN;
    let per_batch = tiles_m * tiles_n;
    let t = wid.x + wid.y * nwg.x;
    if (t >= per_batch * p[3]) {
        return;
    }
    lid = local;
    // Groups of GROUP_M tile rows are walked column by column, so that tiles running together share operands in L2.
    let batch = t / per_batch;
    let r = t % per_batch;
    let per_group = GROUP_M * tiles_n;
    let first_m = (r / per_group) * GROUP_M;
    let group_m = min(tiles_m - first_m, GROUP_M);
    tile_m = (first_m + (r % per_group) % group_m) * BM;
    tile_n = ((r % per_group) / group_m) * BN;
    let bases = batch_bases(batch);
    a_base = bases.x;
    b_base = bases.y;
    let tx = local % 16u;
    let ty = local / 16u;
    //@DECL
    let k_tiles = (K + BK - 1u) / BK;
    if (k_tiles > 0u) {
        let k0 = 0u;
        //@FETCH
    }
    for (var kt = 0u; kt < k_tiles; kt = kt + 1u) {
        //@STASH
        workgroupBarrier();
        if (kt + 1u < k_tiles) {
            let k0 = (kt + 1u) * BK;
            //@FETCH
        }
        for (var k = 0u; k < BK; k = k + 1u) {
            //@STEP
        }
        workgroupBarrier();
    }
    let out_base = batch * M * N;
    //@STORE
}
