// Tiled matrix product template. One workgroup of THREADS = 16 x TX threads (16 rows along M, TX = 16 or 8
// columns along N) computes a BM x BN tile of one batch entry of C = A @ B over one slice of the reduction (the
// whole of K unless the product is split: then slice s covers K_SLICE steps from s * K_SLICE and writes its own
// partial product, which the split-sum kernel adds).
// BK-deep slices of A and B are staged k-major in workgroup memory (each k row padded by one vec4 so that stores
// along k spread over the banks); each thread accumulates a TM x TN micro-tile in registers (f32) from vec4
// reads, and fetches the next slice from global memory into registers while the current one is multiplied.
// A_ALONG_K / B_ALONG_K pick which dimension consecutive fetches walk (the unit-stride one, so that reads are
// coalesced). With A_VEC4 / B_VEC4 a thread fetches four consecutive elements along it as one vec4 (`load_x4`);
// otherwise single elements, consecutive threads taking consecutive ones.
//
// The Rust side prepends bindings (out, lhs, rhs), their load/store functions, the constants BK, TX, THREADS, BM,
// BN, A_ALONG_K, B_ALONG_K, A_VEC4, B_VEC4 and PACKED_OUT, and replaces the generated blocks marked `//@NAME`
// (register declarations, fetch, stash, the multiply-add steps over the BK staged rows and the final store), which
// are unrolled over the micro-tile: each thread fetches BM BK / (4 THREADS) groups of four elements of A and
// TN / 4 of B per slice.
//
// Parameters: see matmul_batch.wgsl, then [K_SLICE, slices].

const GROUP_M: u32 = 8u;
const AS4: u32 = BM / 4u + 1u;
const BS4: u32 = BN / 4u + 1u;

// Indexed [k][column group]: the multiply-add steps index k with a constant, so that the bounds clamp of the
// remaining index (naga's default policy) does not change along the unrolled steps. On the H200 this took f32
// 4096^3 from 39.9 to 43.0 TFLOP/s, and every training product gained 3-9%, against one flat array.
var<workgroup> As: array<array<vec4<f32>, AS4>, BK>;
var<workgroup> Bs: array<array<vec4<f32>, BS4>, BK>;

var<private> lid: u32;
var<private> tile_m: u32;
var<private> tile_n: u32;
var<private> a_base: u32;
var<private> b_base: u32;
// The end of this workgroup's slice of K.
var<private> k_end: u32;

// Element `j` of this thread's share of the A slice, fetched singly: (m, k) within the tile.
fn a_slot(j: u32) -> vec2<u32> {
    let i = j * THREADS + lid;
    if (A_ALONG_K) {
        return vec2<u32>(i / BK, i % BK);
    }
    return vec2<u32>(i % BM, i / BM);
}

// Element `j` of this thread's share of the B slice, fetched singly: (k, n) within the tile.
fn b_slot(j: u32) -> vec2<u32> {
    let i = j * THREADS + lid;
    if (B_ALONG_K) {
        return vec2<u32>(i % BK, i / BK);
    }
    return vec2<u32>(i / BN, i % BN);
}

// Where group `e` of this thread's share of the A slice starts when fetched as vec4s: (m, k) within the tile,
// the four elements following along k when A_ALONG_K, else along m.
fn a_origin(e: u32) -> vec2<u32> {
    let i = e * THREADS + lid;
    if (A_ALONG_K) {
        return vec2<u32>(i / (BK / 4u), (i % (BK / 4u)) * 4u);
    }
    return vec2<u32>((i % (BM / 4u)) * 4u, i / (BM / 4u));
}

// Where group `e` of this thread's share of the B slice starts when fetched as vec4s: (k, n) within the tile.
fn b_origin(e: u32) -> vec2<u32> {
    let i = e * THREADS + lid;
    if (B_ALONG_K) {
        return vec2<u32>((i % (BK / 4u)) * 4u, i / (BK / 4u));
    }
    return vec2<u32>(i / (BN / 4u), (i % (BN / 4u)) * 4u);
}

// Out-of-range elements read as 0; addresses are clamped so that every load stays inside the operand. A vec4
// group is in or out of range as a whole (its walked dimension is a multiple of 4, as is K_SLICE).
fn fetch_a(e: u32, k0: u32) -> vec4<f32> {
    if (A_VEC4) {
        let s = a_origin(e);
        let m = tile_m + s.x;
        let k = k0 + s.y;
        let v = load_lhs4(a_base + min(m, p[0] - 1u) * p[6] + min(k, k_end - 1u) * p[7]);
        return select(vec4<f32>(), v, (m < p[0]) && (k < k_end));
    }
    return vec4<f32>(fetch_a1(4u * e, k0), fetch_a1(4u * e + 1u, k0), fetch_a1(4u * e + 2u, k0),
                     fetch_a1(4u * e + 3u, k0));
}

fn fetch_a1(j: u32, k0: u32) -> f32 {
    let s = a_slot(j);
    let m = tile_m + s.x;
    let k = k0 + s.y;
    let v = f32(load_lhs(a_base + min(m, p[0] - 1u) * p[6] + min(k, k_end - 1u) * p[7]));
    return select(0.0, v, (m < p[0]) && (k < k_end));
}

fn fetch_b(e: u32, k0: u32) -> vec4<f32> {
    if (B_VEC4) {
        let s = b_origin(e);
        let k = k0 + s.x;
        let n = tile_n + s.y;
        let v = load_rhs4(b_base + min(k, k_end - 1u) * p[9] + min(n, p[1] - 1u) * p[10]);
        return select(vec4<f32>(), v, (k < k_end) && (n < p[1]));
    }
    return vec4<f32>(fetch_b1(4u * e, k0), fetch_b1(4u * e + 1u, k0), fetch_b1(4u * e + 2u, k0),
                     fetch_b1(4u * e + 3u, k0));
}

fn fetch_b1(j: u32, k0: u32) -> f32 {
    let s = b_slot(j);
    let k = k0 + s.x;
    let n = tile_n + s.y;
    let v = f32(load_rhs(b_base + min(k, k_end - 1u) * p[9] + min(n, p[1] - 1u) * p[10]));
    return select(0.0, v, (k < k_end) && (n < p[1]));
}

// Vector components are named, not indexed, so that the compiler keeps them in registers.
fn stash_a(e: u32, v: vec4<f32>) {
    if (A_VEC4) {
        let s = a_origin(e);
        let col = s.x / 4u;
        if (A_ALONG_K) {
            let c = s.x % 4u;
            As[s.y][col][c] = v.x;
            As[s.y + 1u][col][c] = v.y;
            As[s.y + 2u][col][c] = v.z;
            As[s.y + 3u][col][c] = v.w;
        } else {
            As[s.y][col] = v;
        }
        return;
    }
    stash_a1(4u * e, v.x);
    stash_a1(4u * e + 1u, v.y);
    stash_a1(4u * e + 2u, v.z);
    stash_a1(4u * e + 3u, v.w);
}

fn stash_a1(j: u32, v: f32) {
    let s = a_slot(j);
    As[s.y][s.x / 4u][s.x % 4u] = v;
}

fn stash_b(e: u32, v: vec4<f32>) {
    if (B_VEC4) {
        let s = b_origin(e);
        let col = s.y / 4u;
        if (B_ALONG_K) {
            let c = s.y % 4u;
            Bs[s.x][col][c] = v.x;
            Bs[s.x + 1u][col][c] = v.y;
            Bs[s.x + 2u][col][c] = v.z;
            Bs[s.x + 3u][col][c] = v.w;
        } else {
            Bs[s.x][col] = v;
        }
        return;
    }
    stash_b1(4u * e, v.x);
    stash_b1(4u * e + 1u, v.y);
    stash_b1(4u * e + 2u, v.z);
    stash_b1(4u * e + 3u, v.w);
}

fn stash_b1(j: u32, v: f32) {
    let s = b_slot(j);
    Bs[s.x][s.y / 4u][s.y % 4u] = v;
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

@compute @workgroup_size(THREADS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) local: u32) {
    let M = p[0];
    let N = p[1];
    let K = p[2];
    let tiles_m = (M + BM - 1u) / BM;
    let tiles_n = (N + BN - 1u) / BN;
    let per_batch = tiles_m * tiles_n;
    let per_slice = per_batch * p[3];
    let t = wid.x + wid.y * nwg.x;
    if (t >= per_slice * p[30]) {
        return;
    }
    lid = local;
    let slice = t / per_slice;
    let k_begin = slice * p[29];
    // The loop bound comes from this `let`, not the private copy the loaders read: WGSL's uniformity analysis
    // (enforced by Chrome's compiler) takes private variables as non-uniform, and the loop holds barriers.
    let k_stop = min(K, k_begin + p[29]);
    k_end = k_stop;
    // Groups of GROUP_M tile rows are walked column by column, so that tiles running together share operands in L2.
    let batch = (t % per_slice) / per_batch;
    let r = t % per_batch;
    let per_group = GROUP_M * tiles_n;
    let first_m = (r / per_group) * GROUP_M;
    let group_m = min(tiles_m - first_m, GROUP_M);
    tile_m = (first_m + (r % per_group) % group_m) * BM;
    tile_n = ((r % per_group) / group_m) * BN;
    let bases = batch_bases(batch);
    a_base = bases.x;
    b_base = bases.y;
    let tx = local % TX;
    let ty = local / TX;
    //@DECL
    let k_tiles = (k_stop - k_begin + BK - 1u) / BK;
    if (k_tiles > 0u) {
        let k0 = k_begin;
        //@FETCH
    }
    for (var kt = 0u; kt < k_tiles; kt = kt + 1u) {
        //@STASH
        workgroupBarrier();
        // Unconditional (past the slice, the clamped loads read zeros that are never staged): no branch keeps
        // the compiler from scheduling these loads among the multiply-adds.
        {
            let k0 = k_begin + (kt + 1u) * BK;
            //@FETCH
        }
        //@STEPS
        workgroupBarrier();
    }
    let out_base = (slice * p[3] + batch) * M * N;
    //@STORE
}
