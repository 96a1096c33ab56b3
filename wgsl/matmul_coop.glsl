// f16 matrix product on tensor cores (ops/matmul_coop.rs): out[M, N] = lhs[M, K] @ rhs[K, N], f32 accumulation in
// cooperative matrices of FRAG x FRAG x FRAG (16 on NVIDIA; 8 on lavapipe, so that CI runs this kernel too). GLSL
// for Vulkan, compiled to SPIR-V at build time (hierarchos-core's build.rs) and passed to the driver as is: WGSL
// cannot yet load a cooperative matrix from workgroup memory of vectors, and staging the operands one half at a
// time held the WGSL version of this kernel to 190 TFLOP/s on the H200 (this one: 270; BENCHMARKS.md).
//
// One workgroup of 128 threads computes a BM x BN = 128 x 128 tile; each subgroup owns a WARP x WARP block of 4 x 4
// accumulator fragments (WARP = 4 FRAG), so that each fragment loaded from workgroup memory feeds four products:
// four subgroups of 32 with fragments of 16, sixteen subgroups of 8 with fragments of 8. Subgroup w's block is at
// rows WARP * (w / WARPS_N), columns WARP * (w % WARPS_N). Slices of BK = 32 steps of the reduction are staged in
// workgroup memory as the uvec4s (eight halves) they were loaded as, rows padded by 8 halves against bank
// conflicts; while the subgroups multiply one slice, each thread already holds the next one's loads in registers
// (eight halves from each operand, LOADS times).
//
// Operands are bound as arrays of uvec4 (eight halves) and read along their unit-stride dimension: lhs along K
// (staged [m][k], loaded row-major) or along M (A_ALONG_M: a transposed operand such as a gradient in a weight
// gradient, staged [k][m], column-major); rhs along N (staged [k][n], row-major) or along K (B_ALONG_K: a
// transposed weight, staged [n][k], column-major). The Rust side launches it for offsets and row strides
// multiples of 8, on adapters whose subgroups are as wide as that split of the workgroup needs (32 for FRAG 16, 8
// for FRAG 8), and either for M a multiple of BM, N of BN and K of BK, or with EDGES: any M, N and K whose
// unit-stride dimensions (those read eight halves at a time) are multiples of 8. Then loads past an edge are
// zeros, and the tiles across the last rows or columns of the output write element by element. The build script
// writes the `#version` line and defines FRAG, EDGES, A_ALONG_M, B_ALONG_K, OUTPUT (below) and BF16 for each
// variant.
//
// bf16 operands (BF16): build.rs makes the module's one 16-bit float type bf16 after compiling (glslang 15 has no
// bfloat16_t), so float16_t below stands for bf16 there. The driver rounds f32 to bf16 toward zero (the H200's),
// where PyTorch rounds to nearest even: with BF16 the f16 and f32 outputs round in the kernel's own arithmetic,
// every tile staged through workgroup memory as f32 like an edge tile.
//
// Products with few tiles and a long reduction are split along K into slices run side by side: slice s covers
// K_SLICE steps from s * K_SLICE and writes its own f32 partial product (OUTPUT_PARTIAL), which the split-sum
// kernel adds; an unsplit product writes f16 (OUTPUT_F16) or the f16-rounded values as f32 (OUTPUT_WIDE). The
// accumulators are converted to f16 (the driver rounds to nearest even, as every kernel here) and stored straight
// to the output.
//
// Parameters (u32 words): [M, N, K, lhs offset, lhs stride along its outer dimension (K when A_ALONG_M, else M),
// rhs offset, rhs stride along its outer dimension (N when B_ALONG_K, else K), tiles along N, K_SLICE, slices].

#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 128) in;

#if OUTPUT == OUTPUT_F16
#define OUT_TYPE float16_t
#else
#define OUT_TYPE float
#endif

layout(std430, binding = 0) readonly buffer Params { uint p[]; };
layout(std430, binding = 1) writeonly buffer Out { OUT_TYPE out_[]; };
layout(std430, binding = 2) readonly buffer Lhs { uvec4 lhs[]; };
layout(std430, binding = 3) readonly buffer Rhs { uvec4 rhs[]; };

const uint BM = 128;
const uint BN = 128;
const uint BK = 32;
const uint WARP = 4 * FRAG;
const uint WARPS_N = BN / WARP;
const uint SUBGROUPS = (BM / WARP) * WARPS_N;
const uint FRAG_HALVES = FRAG * FRAG;
// Loads of eight halves per thread and operand for one slice of BK steps (BM * BK / 8 / 128).
const uint LOADS = BK / 8;
// Row strides (halves) of the staged slices: [m][k] and, along K, [n][k] rows of BK; along N, [k][n] rows of BN;
// along M, [k][m] rows of BM.
const uint AS = BK + 8;
const uint AMS = 136;
const uint BS = 136;

shared uvec4 As[max(BM * AS, BK * AMS) / 8];
shared uvec4 Bs[max(BN * AS, BK * BS) / 8];
// One f16 fragment per subgroup on its way out as f32 (OUTPUT_WIDE).
shared float16_t Cs[SUBGROUPS * FRAG_HALVES];


// The staged row of the `q`-th run of LOADS uvec4s along K. Eight threads store at once (a quarter of a subgroup,
// 128 bits each): rows 4 apart land in opposite halves of the banks at a row stride of AS, where consecutive rows
// would overlap; each block of eight rows still comes from the same eight threads' loads.
uint k_row(uint q) {
    return (q & ~7u) | ((q & 7u) >> 1) | ((q & 1u) << 2);
}

// Staged position (halves) and value of load `e` of thread `lid` for the slice at k0: A as 128 rows of four loads,
// along M as 32 rows of sixteen; B along K as 128 rows of four, along N as 32 rows of sixteen. With EDGES, loads
// past the last row or column of an operand or past K are zeros, which add nothing to the products.
uint a_at(uint lid, uint e) {
    uint i = lid + 128 * e;
#if A_ALONG_M
    return (i / 16) * AMS + (i % 16) * 8;
#else
    return k_row(i / LOADS) * AS + (i % LOADS) * 8;
#endif
}

uvec4 load_a(uint lid, uint e, uint m0, uint k0) {
    uint i = lid + 128 * e;
#if A_ALONG_M
    uint k = k0 + i / 16;
    uint m = m0 + (i % 16) * 8;
#else
    uint m = m0 + k_row(i / LOADS);
    uint k = k0 + (i % LOADS) * 8;
#endif
#if EDGES
    if (m >= p[0] || k >= p[2]) {
        return uvec4(0);
    }
#endif
#if A_ALONG_M
    return lhs[(p[3] + k * p[4] + m) / 8];
#else
    return lhs[(p[3] + m * p[4] + k) / 8];
#endif
}

uint b_at(uint lid, uint e) {
    uint i = lid + 128 * e;
#if B_ALONG_K
    return k_row(i / LOADS) * AS + (i % LOADS) * 8;
#else
    return (i / 16) * BS + (i % 16) * 8;
#endif
}

uvec4 load_b(uint lid, uint e, uint n0, uint k0) {
    uint i = lid + 128 * e;
#if B_ALONG_K
    uint n = n0 + k_row(i / LOADS);
    uint k = k0 + (i % LOADS) * 8;
#else
    uint k = k0 + i / 16;
    uint n = n0 + (i % 16) * 8;
#endif
#if EDGES
    if (n >= p[1] || k >= p[2]) {
        return uvec4(0);
    }
#endif
#if B_ALONG_K
    return rhs[(p[5] + n * p[6] + k) / 8];
#else
    return rhs[(p[5] + k * p[6] + n) / 8];
#endif
}

// The bf16 bits of the f32 with bits `b`, rounded to nearest even; NaN stays a quiet NaN.
uint bf16_bits(uint b) {
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        return (b >> 16) | 0x40u;
    }
    return (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
}

#define FRAG_A coopmat<float16_t, gl_ScopeSubgroup, FRAG, FRAG, gl_MatrixUseA>
#define FRAG_B coopmat<float16_t, gl_ScopeSubgroup, FRAG, FRAG, gl_MatrixUseB>
#define FRAG_C coopmat<float, gl_ScopeSubgroup, FRAG, FRAG, gl_MatrixUseAccumulator>
#define FRAG_H coopmat<float16_t, gl_ScopeSubgroup, FRAG, FRAG, gl_MatrixUseAccumulator>

void main() {
    uint lid = gl_LocalInvocationIndex;
    uint N = p[1];
    uint tiles = ((p[0] + BM - 1) / BM) * p[7];
    uint t = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (t >= tiles * p[9]) {
        return;
    }
    uint slice = t / tiles;
    uint tile = t % tiles;
    uint k_begin = slice * p[8];
    uint K = min(p[2], k_begin + p[8]);
    uint m0 = (tile / p[7]) * BM;
    uint n0 = (tile % p[7]) * BN;
    uint wm = (gl_SubgroupID / WARPS_N) * WARP;
    uint wn = (gl_SubgroupID % WARPS_N) * WARP;
    FRAG_C c[4][4];
    [[unroll]] for (uint i = 0; i < 4; i++) {
        [[unroll]] for (uint j = 0; j < 4; j++) {
            c[i][j] = FRAG_C(0.0);
        }
    }
    uvec4 ra[LOADS];
    uvec4 rb[LOADS];
    [[unroll]] for (uint e = 0; e < LOADS; e++) {
        ra[e] = load_a(lid, e, m0, k_begin);
        rb[e] = load_b(lid, e, n0, k_begin);
    }
    for (uint k0 = k_begin; k0 < K; k0 += BK) {
        barrier();
        [[unroll]] for (uint e = 0; e < LOADS; e++) {
            As[a_at(lid, e) / 8] = ra[e];
            Bs[b_at(lid, e) / 8] = rb[e];
        }
        barrier();
        // Unconditional (the last slice loads itself again, unused; with EDGES, zeros or the next slice's steps),
        // so that no branch holds these loads back.
#if EDGES
        uint kn = k0 + BK;
#else
        uint kn = min(k0 + BK, K - BK);
#endif
        [[unroll]] for (uint e = 0; e < LOADS; e++) {
            ra[e] = load_a(lid, e, m0, kn);
            rb[e] = load_b(lid, e, n0, kn);
        }
        [[unroll]] for (uint kk = 0; kk < BK; kk += FRAG) {
            FRAG_B b[4];
            [[unroll]] for (uint j = 0; j < 4; j++) {
#if B_ALONG_K
                coopMatLoad(b[j], Bs, ((wn + FRAG * j) * AS + kk) / 8, AS / 8, gl_CooperativeMatrixLayoutColumnMajor);
#else
                coopMatLoad(b[j], Bs, (kk * BS + wn + FRAG * j) / 8, BS / 8, gl_CooperativeMatrixLayoutRowMajor);
#endif
            }
            [[unroll]] for (uint i = 0; i < 4; i++) {
                FRAG_A a;
#if A_ALONG_M
                coopMatLoad(a, As, (kk * AMS + wm + FRAG * i) / 8, AMS / 8, gl_CooperativeMatrixLayoutColumnMajor);
#else
                coopMatLoad(a, As, ((wm + FRAG * i) * AS + kk) / 8, AS / 8, gl_CooperativeMatrixLayoutRowMajor);
#endif
                [[unroll]] for (uint j = 0; j < 4; j++) {
                    c[i][j] = coopMatMulAdd(a, b[j], c[i][j]);
                }
            }
        }
    }
    uint out_base = slice * p[0] * N;
#if EDGES || (BF16 && OUTPUT != OUTPUT_PARTIAL)
    // A tile across the last row or column of the output, or any tile of rows that a fragment store could not
    // start at (a cooperative matrix is stored at 16-byte aligned rows), or any bf16 output: each fragment goes
    // through workgroup memory (the staged slices', free once every subgroup is past its last product) as f32
    // (OUTPUT_PARTIAL, BF16) or f16 rows, and each lane writes its elements that lie inside.
    if (BF16 != 0 || N % 8 != 0 || m0 + BM > p[0] || n0 + BN > N) {
        barrier();
        uint base = gl_SubgroupID * FRAG_HALVES / 4;
        [[unroll]] for (uint i = 0; i < 4; i++) {
            [[unroll]] for (uint j = 0; j < 4; j++) {
                uint r0 = m0 + wm + FRAG * i;
                uint c0 = n0 + wn + FRAG * j;
                // Every subgroup, fragments outside the output too: lavapipe runs a subgroup barrier only where
                // all subgroups of the workgroup reach it.
                subgroupBarrier();
#if OUTPUT == OUTPUT_PARTIAL || BF16
                const uint ROW = FRAG / 4;
                coopMatStore(c[i][j], As, base, ROW, gl_CooperativeMatrixLayoutRowMajor);
#else
                const uint ROW = FRAG / 8;
                coopMatStore(FRAG_H(c[i][j]), As, base, ROW, gl_CooperativeMatrixLayoutRowMajor);
#endif
                subgroupBarrier();
                for (uint q = gl_SubgroupInvocationID; q < FRAG * ROW; q += gl_SubgroupSize) {
                    uvec4 v = As[base + q];
                    uint row = r0 + q / ROW;
                    uint col = c0 + (q % ROW) * (FRAG / ROW);
                    [[unroll]] for (uint x = 0; x < FRAG / ROW; x++) {
                        if (row < p[0] && col + x < N) {
#if OUTPUT == OUTPUT_PARTIAL
                            out_[out_base + row * N + col + x] = uintBitsToFloat(v[x]);
#elif BF16 && OUTPUT == OUTPUT_WIDE
                            out_[out_base + row * N + col + x] = uintBitsToFloat(bf16_bits(v[x]) << 16);
#elif BF16
                            out_[out_base + row * N + col + x] = unpackFloat2x16(bf16_bits(v[x])).x;
#else
                            out_[out_base + row * N + col + x] = OUT_TYPE(unpackFloat2x16(v[x / 2])[x % 2]);
#endif
                        }
                    }
                }
            }
        }
        return;
    }
#endif
    [[unroll]] for (uint i = 0; i < 4; i++) {
        [[unroll]] for (uint j = 0; j < 4; j++) {
            uint at = out_base + (m0 + wm + FRAG * i) * N + n0 + wn + FRAG * j;
#if OUTPUT == OUTPUT_PARTIAL
            coopMatStore(c[i][j], out_, at, N, gl_CooperativeMatrixLayoutRowMajor);
#else
            FRAG_H h = FRAG_H(c[i][j]);
#if OUTPUT == OUTPUT_F16
            coopMatStore(h, out_, at, N, gl_CooperativeMatrixLayoutRowMajor);
#else
            // Through workgroup memory: the driver folds a conversion to f16 and straight back into nothing.
            subgroupBarrier();
            coopMatStore(h, Cs, gl_SubgroupID * FRAG_HALVES, FRAG, gl_CooperativeMatrixLayoutRowMajor);
            subgroupBarrier();
            coopMatLoad(h, Cs, gl_SubgroupID * FRAG_HALVES, FRAG, gl_CooperativeMatrixLayoutRowMajor);
            coopMatStore(FRAG_C(h), out_, at, N, gl_CooperativeMatrixLayoutRowMajor);
#endif
#endif
        }
    }
}
