// Shared by the tensor-core flash-attention kernels (ops/flash_attention_coop.rs): causal attention under
// autocast(f16) with every product on cooperative matrices (FRAG x FRAG x FRAG, f16 operands, f32 accumulators),
// in GLSL for Vulkan, compiled to SPIR-V at build time (hierarchos-core's build.rs prepends the `#version` line
// and defines FRAG and LANES: 16 and 2 for NVIDIA's subgroups of 32, 8 and 1 for lavapipe's subgroups of 8, so
// that CI runs these kernels too).
//
// The precision is flash attention's under autocast: q, k, v and the output gradient are rounded to f16 when they
// are staged; scores, softmax statistics and every sum are f32; the probabilities P (and dS = P (dP - delta) in the
// backward) are rounded to f16 to enter the products with v (and q, k); outputs and gradients are rounded to f16
// and stored as f32, as the products of autocast are.
//
// A workgroup is four subgroups of LANES * FRAG lanes; it owns a tile of TILE = 4 FRAG rows (queries for the
// forward and the query gradients, keys for the key/value gradients), FRAG per subgroup, and walks the tiles of
// TILE rows of the other side that its rows see. Tiles are staged in workgroup memory as f16 rows of D = 64 halves
// padded to HS quads; a subgroup's f32 products (FRAG x TILE scores, FRAG x D outputs) go through its FRAG rows of
// a score tile (rows of FS quads), where lane l reads row l / LANES, quads LANES i + l % LANES: with LANES = 2,
// the eight lanes of a quarter-subgroup hit distinct banks. The Rust side launches these kernels only for heads
// of 64, on adapters whose fragments and subgroups pair as above, and for views with unit stride along d and
// offsets and other strides multiples of 4 (q, k and v are read as vectors of four f32).
//
// Parameters (u32 words), as flash_attention_common.wgsl: [B, H, T, S, group (H / KVH), q_start, k_start, window
// (0: none), D, q offset, q strides (b, h, t, d), k offset and strides, v offset and strides, whether dq is stored
// token-major, whether dk and dv are].

#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 4 * LANES * FRAG) in;

layout(std430, binding = 0) readonly buffer Params { uint p[]; };

const uint D = 64;
const uint TILE = 4 * FRAG;
const uint THREADS = 4 * LANES * FRAG;
// Fragments along d and along a tile's rows, and quads each lane holds of a row of d or of a row of scores.
const uint D_FRAGS = D / FRAG;
const uint T_FRAGS = TILE / FRAG;
const uint D_QUADS = D / 4 / LANES;
const uint T_QUADS = TILE / 4 / LANES;
// Row strides of staged f16 tiles (f16vec4) and of f32 score tiles (vec4): 72 elements.
const uint HS = 18;
const uint FS = 18;

const uint Q_AT = 9;
const uint K_AT = 14;
const uint V_AT = 19;
const uint DQ_TOKEN_MAJOR = 24;
const uint DKV_TOKEN_MAJOR = 25;

#define FRAG_A coopmat<float16_t, gl_ScopeSubgroup, FRAG, FRAG, gl_MatrixUseA>
#define FRAG_B coopmat<float16_t, gl_ScopeSubgroup, FRAG, FRAG, gl_MatrixUseB>
#define FRAG_C coopmat<float, gl_ScopeSubgroup, FRAG, FRAG, gl_MatrixUseAccumulator>

#define NEG_INF uintBitsToFloat(0xff800000u)

// Element offset of row (b, head, pos) of the view whose offset and strides start at p[at].
uint view_base(uint at, uint b, uint head, uint pos) {
    return p[at] + b * p[at + 1] + head * p[at + 2] + pos * p[at + 3];
}

// Element offset of row (b, head, pos) of a dense [B, T, H, D] tensor (the output and its gradient).
uint token_base(uint b, uint head, uint pos) {
    return ((b * p[2] + pos) * p[1] + head) * D;
}

// The keys query `t` sees: [first, end).
uvec2 keys_seen(uint t) {
    uint qpos = p[5] + t;
    uint end = min(p[3], qpos + 1 - p[6]);
    uint first = 0;
    if (p[7] > 0 && qpos + 1 > p[7] + p[6]) {
        first = qpos + 1 - p[7] - p[6];
    }
    return uvec2(first, end);
}

// The queries key `j` is seen by: [first, end).
uvec2 queries_seeing(uint j) {
    uint kpos = p[6] + j;
    uint first = 0;
    if (kpos > p[5]) {
        first = min(p[2], kpos - p[5]);
    }
    uint end = p[2];
    if (p[7] > 0) {
        // The window's end saturates at the last position: no query lies there (checked on the Rust side).
        end = min(p[2], max(kpos + min(p[7], 0xffffffffu - kpos), p[5]) - p[5]);
    }
    return uvec2(first, max(first, end));
}

// The lane's row within its workgroup's tile: subgroup sg owns rows FRAG sg.., LANES lanes each.
uint lane_row() {
    return gl_SubgroupID * FRAG + gl_SubgroupInvocationID / LANES;
}

// x summed over the LANES lanes of the lane's row.
float row_sum(float x) {
#if LANES == 2
    x += subgroupShuffleXor(x, 1);
#endif
    return x;
}

// The largest x of the LANES lanes of the lane's row.
float row_max(float x) {
#if LANES == 2
    x = max(x, subgroupShuffleXor(x, 1));
#endif
    return x;
}

// The query tile of a forward or query-gradient workgroup: batch b, query head and the key/value head kh it
// reads, first row t0, the lane's query t, and the keys any row of the tile sees, [first, end).
struct QueryTile {
    uint b;
    uint head;
    uint kh;
    uint t0;
    uint t;
    uint first;
    uint end;
};

QueryTile query_tile() {
    QueryTile q;
    q.b = gl_WorkGroupID.y / p[1];
    q.head = gl_WorkGroupID.y % p[1];
    q.kh = q.head / p[4];
    q.t0 = gl_WorkGroupID.x * TILE;
    q.t = q.t0 + lane_row();
    q.first = keys_seen(q.t0).x;
    q.end = keys_seen(min(q.t0 + TILE, p[2]) - 1).y;
    return q;
}

// Quads of a tile each thread stages (TILE rows of D / 4 quads over THREADS threads).
const uint STAGED = TILE * D / 4 / THREADS;

// Fetches into `regs` (vec4[STAGED]) the quads of TILE rows from `row0` of `src` (an array of vec4) that this
// thread stages, rows at or past `end` (> row0) as zeros; BASE is the element offset of row `row` (an expression
// in `row`). Addresses are clamped into the rows and every load is issued, so that none waits on a branch: the
// loops fetch the next tile this way before they multiply the current one, whose loads are then in flight.
#define FETCH(regs, src, row0, end, BASE)                                                                       \
    [[unroll]] for (uint e_ = 0; e_ < STAGED; e_++) {                                                           \
        uint i_ = gl_LocalInvocationIndex + THREADS * e_;                                                       \
        uint row = min((row0) + i_ / (D / 4), (end) - 1);                                                       \
        vec4 x_ = src[((BASE) + 4 * (i_ % (D / 4))) / 4];                                                       \
        regs[e_] = (row0) + i_ / (D / 4) < (end) ? x_ : vec4(0.0);                                              \
    }

// Stores fetched quads into the f16 tile `dst`, rounded to f16. Every thread of the workgroup runs it.
#define PUT(dst, regs)                                                                                          \
    [[unroll]] for (uint e_ = 0; e_ < STAGED; e_++) {                                                           \
        uint i_ = gl_LocalInvocationIndex + THREADS * e_;                                                       \
        dst[(i_ / (D / 4)) * HS + i_ % (D / 4)] = f16vec4(regs[e_]);                                            \
    }

// For the kernels that walk key tiles (forward, query gradients): fetches the key and value tile from key j0 of
// the query tile's key/value head into `kr` and `vr`, from the kernel's bindings `k` and `v`.
#define FETCH_KEYS(tile, j0)                                                                                    \
    FETCH(kr, k, j0, tile.end, view_base(K_AT, tile.b, tile.kh, row));                                          \
    FETCH(vr, v, j0, tile.end, view_base(V_AT, tile.b, tile.kh, row));

// FETCH then PUT, for the tiles staged once.
#define STAGE(dst, src, row0, end, BASE)                                                                        \
    {                                                                                                           \
        vec4 staged_[STAGED];                                                                                   \
        FETCH(staged_, src, row0, end, BASE);                                                                   \
        PUT(dst, staged_);                                                                                      \
    }

// The D_FRAGS fragments of rows FRAG * sg.. of the f16 tile `src`, as left operands (D = 64 along k).
#define LOAD_ROWS(frags, src, sg)                                                                               \
    [[unroll]] for (uint kk_ = 0; kk_ < D_FRAGS; kk_++) {                                                       \
        coopMatLoad(frags[kk_], src, (sg) * FRAG * HS + kk_ * (FRAG / 4), HS, gl_CooperativeMatrixLayoutRowMajor); \
    }

// acc[n] (T_FRAGS of them) = a (FRAG x 64, D_FRAGS fragments along k) times the transpose of rows FRAG n.. of the
// f16 tile `tile`: the products of the subgroup's rows with every row of the tile (scores, or output-gradient
// products).
#define TIMES_ROWS(acc, a, tile)                                                                                \
    [[unroll]] for (uint n_ = 0; n_ < T_FRAGS; n_++) {                                                          \
        acc[n_] = FRAG_C(0.0);                                                                                  \
    }                                                                                                           \
    [[unroll]] for (uint kk_ = 0; kk_ < D_FRAGS; kk_++) {                                                       \
        [[unroll]] for (uint n_ = 0; n_ < T_FRAGS; n_++) {                                                      \
            FRAG_B b_;                                                                                          \
            coopMatLoad(b_, tile, n_ * FRAG * HS + kk_ * (FRAG / 4), HS, gl_CooperativeMatrixLayoutColumnMajor); \
            acc[n_] = coopMatMulAdd(a[kk_], b_, acc[n_]);                                                       \
        }                                                                                                       \
    }

// acc[n] (D_FRAGS of them) += rows FRAG * sg.. of the f16 tile `lhs` (FRAG x TILE) times the f16 tile `rhs` (TILE
// x 64): probabilities or score gradients into the rows they weigh.
#define ACCUMULATE(acc, lhs, sg, rhs)                                                                           \
    [[unroll]] for (uint kk_ = 0; kk_ < T_FRAGS; kk_++) {                                                       \
        FRAG_A a_;                                                                                              \
        coopMatLoad(a_, lhs, (sg) * FRAG * HS + kk_ * (FRAG / 4), HS, gl_CooperativeMatrixLayoutRowMajor);      \
        [[unroll]] for (uint n_ = 0; n_ < D_FRAGS; n_++) {                                                      \
            FRAG_B b_;                                                                                          \
            coopMatLoad(b_, rhs, kk_ * FRAG * HS + n_ * (FRAG / 4), HS, gl_CooperativeMatrixLayoutRowMajor);    \
            acc[n_] = coopMatMulAdd(a_, b_, acc[n_]);                                                           \
        }                                                                                                       \
    }

// The subgroup's `count` f32 fragments (a row of FRAG x FRAG blocks) into its rows of the score tile `Ss`,
// visible to all its lanes after.
#define SPILL(acc, count, sg)                                                                                   \
    [[unroll]] for (uint n_ = 0; n_ < (count); n_++) {                                                          \
        coopMatStore(acc[n_], Ss, (sg) * FRAG * FS + n_ * (FRAG / 4), FS, gl_CooperativeMatrixLayoutRowMajor);  \
    }                                                                                                           \
    subgroupBarrier();

// The column quad (within a row of the tile) of the lane's quad i (see the layout above).
uint lane_column_quad(uint i) {
    return LANES * i + gl_SubgroupInvocationID % LANES;
}

// Quad i of the lane's row r of a tile, as an index into a tile of stride `stride`.
uint lane_quad(uint r, uint i, uint stride) {
    return r * stride + lane_column_quad(i);
}

// The column (within the tile) of element e of the lane's quad i.
uint lane_column(uint i, uint e) {
    return 4 * lane_column_quad(i) + e;
}

// x rounded to the nearest f16 value (ties to even), as f32, in arithmetic on its bits: the driver folds a
// conversion to f16 and straight back into nothing, packing through packHalf2x16 too.
float round16(float x) {
    float a = abs(x);
    if (isnan(x)) {
        return x;
    }
    if (a >= 65520.0) {
        return uintBitsToFloat((floatBitsToUint(x) & 0x80000000u) | 0x7f800000u);
    }
    if (a < 6.103515625e-05) {
        // Subnormal f16 values: multiples of 2^-24, exact in f32.
        return roundEven(x * 16777216.0) / 16777216.0;
    }
    uint u = floatBitsToUint(x);
    u += 0xfffu + ((u >> 13) & 1u);
    return uintBitsToFloat(u & 0xffffe000u);
}

vec4 round16(vec4 x) {
    return vec4(round16(x.x), round16(x.y), round16(x.z), round16(x.w));
}
