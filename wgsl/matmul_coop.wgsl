// f16 matrix product on tensor cores (ops/matmul_coop.rs): out[M, N] = lhs[M, K] @ rhs[K, N], f32 accumulation in
// cooperative matrices (16 x 16 x 16), f16 result. One workgroup of four subgroups of 32 computes a BM x BN =
// 128 x 128 tile; subgroup w owns the 64 x 64 block at rows 64 * (w / 2), columns 64 * (w % 2): 4 x 4 accumulator
// fragments, so that each fragment loaded from workgroup memory feeds four products (the Rust side writes out
// the blocks marked `//@NAME` over the sixteen accumulators `c{i}{j}`). Slices of BK = 32 steps of the reduction
// are staged in workgroup memory (rows padded by 8 halves against bank conflicts); while the subgroups multiply
// one slice, each thread already holds the next one's loads in registers (eight halves from each operand, four times).
//
// Operands are bound as arrays of vec4<f16> and read eight halves at a time (two vec4s), each along its
// unit-stride dimension: lhs along K (staged [m][k], loaded row-major) or along M (A_ALONG_M: a transposed
// operand such as a gradient in a weight gradient, staged [k][m] and loaded column-major); rhs along N (staged
// [k][n], row-major) or along K (B_ALONG_K: a transposed weight, staged [n][k], column-major). The Rust side
// launches it only for M a multiple of BM, N of BN, K of BK, offsets and row strides multiples of 8, on adapters
// with subgroups of 32, and defines A_ALONG_M and B_ALONG_K.
//
// Products with few tiles and a long reduction are split along K into slices run side by side (as the tiled
// kernel does): slice s covers K_SLICE steps from s * K_SLICE and writes its own f32 partial product, which the
// split-sum kernel adds; an unsplit product writes f16. The Rust side defines OutType and to_out for the two.
//
// Parameters (u32 words): [M, N, K, lhs offset, lhs stride along its outer dimension (K when A_ALONG_M, else
// M), rhs offset, rhs stride along its outer dimension (N when B_ALONG_K, else K), tiles along N, K_SLICE,
// slices].

enable f16;
enable wgpu_cooperative_matrix;

@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<OutType>;
@group(0) @binding(2) var<storage, read> lhs: array<vec4<f16>>;
@group(0) @binding(3) var<storage, read> rhs: array<vec4<f16>>;

const BM: u32 = 128u;
const BN: u32 = 128u;
const BK: u32 = 32u;
// Row strides (halves) of the staged slices: [m][k] and, along K, [n][k] rows of BK; along N, [k][n] rows of BN;
// along M, [k][m] rows of BM.
const AS: u32 = 40u;
const AMS: u32 = 136u;
const BS: u32 = 136u;

var<workgroup> As: array<f16, 5120>;
var<workgroup> Bs: array<f16, 5120>;
// One 16 x 16 f32 fragment per subgroup on its way out.
var<workgroup> Cs: array<f32, 1024>;

// Eight halves (two vec4<f16>) into `As` / `Bs` at element `at`.
fn stash_a(at: u32, v: array<vec4<f16>, 2>) {
    As[at + 0u] = v[0].x;
    As[at + 1u] = v[0].y;
    As[at + 2u] = v[0].z;
    As[at + 3u] = v[0].w;
    As[at + 4u] = v[1].x;
    As[at + 5u] = v[1].y;
    As[at + 6u] = v[1].z;
    As[at + 7u] = v[1].w;
}

fn stash_b(at: u32, v: array<vec4<f16>, 2>) {
    Bs[at + 0u] = v[0].x;
    Bs[at + 1u] = v[0].y;
    Bs[at + 2u] = v[0].z;
    Bs[at + 3u] = v[0].w;
    Bs[at + 4u] = v[1].x;
    Bs[at + 5u] = v[1].y;
    Bs[at + 6u] = v[1].z;
    Bs[at + 7u] = v[1].w;
}

fn fetch_a(i: u32) -> array<vec4<f16>, 2> {
    return array<vec4<f16>, 2>(lhs[2u * i], lhs[2u * i + 1u]);
}

fn fetch_b(i: u32) -> array<vec4<f16>, 2> {
    return array<vec4<f16>, 2>(rhs[2u * i], rhs[2u * i + 1u]);
}

// Staged position and global vec4 index of load `e` of thread `lid` for the slice at k0 (eight halves each): A as
// 128 rows of four, along M as 32 rows of sixteen; B along K as 128 rows of four, along N as 32 rows of sixteen
// (loads 0..3 each).
fn a_at(lid: u32, e: u32) -> u32 {
    let i = lid + 128u * e;
    if (A_ALONG_M) {
        return (i / 16u) * AMS + (i % 16u) * 8u;
    }
    return (i / 4u) * AS + (i % 4u) * 8u;
}

fn a_src(lid: u32, e: u32, m0: u32, k0: u32) -> u32 {
    let i = lid + 128u * e;
    if (A_ALONG_M) {
        return (p[3] + (k0 + i / 16u) * p[4] + m0 + (i % 16u) * 8u) / 8u;
    }
    return (p[3] + (m0 + i / 4u) * p[4] + k0 + (i % 4u) * 8u) / 8u;
}

fn b_at(lid: u32, e: u32) -> u32 {
    let i = lid + 128u * e;
    if (B_ALONG_K) {
        return (i / 4u) * AS + (i % 4u) * 8u;
    }
    return (i / 16u) * BS + (i % 16u) * 8u;
}

fn b_src(lid: u32, e: u32, n0: u32, k0: u32) -> u32 {
    let i = lid + 128u * e;
    if (B_ALONG_K) {
        return (p[5] + (n0 + i / 4u) * p[6] + k0 + (i % 4u) * 8u) / 8u;
    }
    return (p[5] + (k0 + i / 16u) * p[6] + n0 + (i % 16u) * 8u) / 8u;
}

fn load_a(kk: u32, row: u32) -> coop_mat16x16<f16, A> {
    if (A_ALONG_M) {
        return coopLoad<coop_mat16x16<f16, A>>(&As[kk * AMS + row], AMS);
    }
    return coopLoadT<coop_mat16x16<f16, A>>(&As[row * AS + kk], AS);
}

fn load_b(kk: u32, col: u32) -> coop_mat16x16<f16, B> {
    if (B_ALONG_K) {
        return coopLoad<coop_mat16x16<f16, B>>(&Bs[col * AS + kk], AS);
    }
    return coopLoadT<coop_mat16x16<f16, B>>(&Bs[kk * BS + col], BS);
}

// Where this workgroup's slice of the reduction writes its product (past the partial products of the slices
// before it).
var<private> out_base: u32;

// Lane `lane` of subgroup `sg` writes its eight elements of the fragment staged in Cs to the tile at (row, col),
// through `to_out` (f16 rounded as every kernel rounds, round to nearest even; or the f32 partial product).
fn emit(sg: u32, lane: u32, row: u32, col: u32, N: u32) {
    for (var e = 0u; e < 8u; e = e + 1u) {
        let i = lane + 32u * e;
        out[out_base + (row + i / 16u) * N + col + i % 16u] = to_out(Cs[sg * 256u + i]);
    }
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32, @builtin(subgroup_id) sg: u32,
        @builtin(subgroup_invocation_id) lane: u32) {
    let N = p[1];
    let tiles = (p[0] / BM) * p[7];
    let t = wg.x + wg.y * nwg.x;
    if (t >= tiles * p[9]) {
        return;
    }
    let slice = t / tiles;
    let tile = t % tiles;
    let k_begin = slice * p[8];
    let K = min(p[2], k_begin + p[8]);
    out_base = slice * p[0] * N;
    let m0 = (tile / p[7]) * BM;
    let n0 = (tile % p[7]) * BN;
    let wm = (sg / 2u) * 64u;
    let wn = (sg % 2u) * 64u;
    //@ACCUMULATORS
    var ra0 = fetch_a(a_src(lid, 0u, m0, k_begin));
    var ra1 = fetch_a(a_src(lid, 1u, m0, k_begin));
    var ra2 = fetch_a(a_src(lid, 2u, m0, k_begin));
    var ra3 = fetch_a(a_src(lid, 3u, m0, k_begin));
    var rb0 = fetch_b(b_src(lid, 0u, n0, k_begin));
    var rb1 = fetch_b(b_src(lid, 1u, n0, k_begin));
    var rb2 = fetch_b(b_src(lid, 2u, n0, k_begin));
    var rb3 = fetch_b(b_src(lid, 3u, n0, k_begin));
    for (var k0 = k_begin; k0 < K; k0 = k0 + BK) {
        workgroupBarrier();
        stash_a(a_at(lid, 0u), ra0);
        stash_a(a_at(lid, 1u), ra1);
        stash_a(a_at(lid, 2u), ra2);
        stash_a(a_at(lid, 3u), ra3);
        stash_b(b_at(lid, 0u), rb0);
        stash_b(b_at(lid, 1u), rb1);
        stash_b(b_at(lid, 2u), rb2);
        stash_b(b_at(lid, 3u), rb3);
        workgroupBarrier();
        // Unconditional (the last slice loads itself again, unused), so that no branch holds these loads back.
        {
            let kn = min(k0 + BK, K - BK);
            ra0 = fetch_a(a_src(lid, 0u, m0, kn));
            ra1 = fetch_a(a_src(lid, 1u, m0, kn));
            ra2 = fetch_a(a_src(lid, 2u, m0, kn));
            ra3 = fetch_a(a_src(lid, 3u, m0, kn));
            rb0 = fetch_b(b_src(lid, 0u, n0, kn));
            rb1 = fetch_b(b_src(lid, 1u, n0, kn));
            rb2 = fetch_b(b_src(lid, 2u, n0, kn));
            rb3 = fetch_b(b_src(lid, 3u, n0, kn));
        }
        for (var kk = 0u; kk < BK; kk = kk + 16u) {
            //@PRODUCTS
        }
    }
    //@STORE
}
