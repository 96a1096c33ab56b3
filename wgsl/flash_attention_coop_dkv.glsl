// Flash-attention backward to the keys and values on tensor cores (after flash_attention_coop_common.glsl), as
// flash_attention_dkv.wgsl, after the query kernel stored delta: dv_j = Σ_i p_ij dout_i and dk_j = Σ_i p_ij (dout_i
// · v_j - delta_i) q_i over the queries of every query head reading this key/value head (GQA without repeats). A
// workgroup takes TILE keys of one key/value head; each subgroup keeps its FRAG rows of k and v in registers as
// fragments and, for each tile of TILE queries (of each head of the group in turn), computes the transposed
// scores and output-gradient products on tensor cores; the LANES lanes of a key's row turn it into f16
// probabilities, then score gradients, which multiply the output gradients and the queries on tensor cores into
// the subgroup's dv and dk fragments.

layout(std430, binding = 1) writeonly buffer Dk { vec4 dk[]; };
layout(std430, binding = 2) writeonly buffer Dv { vec4 dv[]; };
layout(std430, binding = 3) readonly buffer Q { vec4 q[]; };
layout(std430, binding = 4) readonly buffer K { vec4 k[]; };
layout(std430, binding = 5) readonly buffer V { vec4 v[]; };
layout(std430, binding = 6) readonly buffer Dout { vec4 dout[]; };
layout(std430, binding = 7) readonly buffer Lse { float lse[]; };
layout(std430, binding = 8) readonly buffer Delta { float delta[]; };

// The queries and their output gradients (first the workgroup's keys and values), and each subgroup's
// probabilities, then score gradients, in its own rows.
shared f16vec4 Qs[TILE * HS];
shared f16vec4 Gs[TILE * HS];
shared f16vec4 Ps[TILE * HS];
shared vec4 Ss[TILE * FS];
// The staged queries' lse and delta, four to a vector (read as the lanes' quads of columns).
shared vec4 lse_s[TILE / 4];
shared vec4 delta_s[TILE / 4];

// Stores the subgroup's FRAG x 64 gradient fragments `frags` (f16-rounded) to `dst`, rows of keys before S only.
#define STORE_KEYS(dst, frags)                                                                                  \
    SPILL(frags, D_FRAGS, sg);                                                                                  \
    if (j < S) {                                                                                                \
        [[unroll]] for (uint i = 0; i < D_QUADS; i++) {                                                         \
            dst[row * (D / 4) + lane_column_quad(i)] = round16(Ss[lane_quad(r, i, FS)]);                        \
        }                                                                                                       \
    }                                                                                                           \
    subgroupBarrier();

// Fetches the query tile from row i0 of query head `head`: q and dout into qr and gr, lse and delta into lse_r and
// delta_r.
#define FETCH_QUERIES(head, i0)                                                                                 \
    {                                                                                                           \
        FETCH(qr, q, i0, tile_end, view_base(Q_AT, b, head, row));                                              \
        FETCH(gr, dout, i0, tile_end, token_base(b, head, row));                                                \
        uint at_ = (b * H + (head)) * T + min((i0) + gl_LocalInvocationIndex % TILE, T - 1);                    \
        lse_r = lse[at_];                                                                                       \
        delta_r = delta[at_];                                                                                   \
    }

void main() {
    uint sg = gl_SubgroupID;
    uint H = p[1];
    uint T = p[2];
    uint S = p[3];
    uint group = p[4];
    uint kvh = H / group;
    uint b = gl_WorkGroupID.y / kvh;
    uint kh = gl_WorkGroupID.y % kvh;
    uint j0 = gl_WorkGroupID.x * TILE;
    uint r = lane_row();
    uint j = j0 + r;
    STAGE(Qs, k, j0, S, view_base(K_AT, b, kh, row));
    STAGE(Gs, v, j0, S, view_base(V_AT, b, kh, row));
    barrier();
    FRAG_A ka[D_FRAGS];
    FRAG_A va[D_FRAGS];
    LOAD_ROWS(ka, Qs, sg);
    LOAD_ROWS(va, Gs, sg);
    uint tile_first = queries_seeing(j0).x;
    uint tile_end = queries_seeing(min(j0 + TILE, S) - 1).y;
    uint tiles = (tile_end - tile_first + TILE - 1) / TILE;
    // The queries that see the lane's key (none past the keys).
    uvec2 seeing = j < S ? queries_seeing(j) : uvec2(0);
    FRAG_C dkc[D_FRAGS];
    FRAG_C dvc[D_FRAGS];
    [[unroll]] for (uint n = 0; n < D_FRAGS; n++) {
        dkc[n] = FRAG_C(0.0);
        dvc[n] = FRAG_C(0.0);
    }
    // Rounds over the query tiles of every head of the group, each tile fetched a round ahead (with its
    // statistics, which threads lid < TILE stage).
    vec4 qr[STAGED];
    vec4 gr[STAGED];
    float lse_r = 0.0;
    float delta_r = 0.0;
    if (tiles > 0) {
        FETCH_QUERIES(kh * group, tile_first);
    }
    for (uint round_ = 0; round_ < group * tiles; round_++) {
        uint i0 = tile_first + (round_ % tiles) * TILE;
        barrier();
        PUT(Qs, qr);
        PUT(Gs, gr);
        if (gl_LocalInvocationIndex < TILE) {
            lse_s[gl_LocalInvocationIndex / 4][gl_LocalInvocationIndex % 4] = lse_r;
            delta_s[gl_LocalInvocationIndex / 4][gl_LocalInvocationIndex % 4] = delta_r;
        }
        barrier();
        if (round_ + 1 < group * tiles) {
            FETCH_QUERIES(kh * group + (round_ + 1) / tiles, tile_first + ((round_ + 1) % tiles) * TILE);
        }
        FRAG_C acc[T_FRAGS];
        TIMES_ROWS(acc, ka, Qs);
        SPILL(acc, T_FRAGS, sg);
        vec4 pr[T_QUADS];
        [[unroll]] for (uint i = 0; i < T_QUADS; i++) {
            vec4 s = Ss[lane_quad(r, i, FS)];
            vec4 e4 = exp(s - lse_s[lane_column_quad(i)]);
            [[unroll]] for (uint e = 0; e < 4; e++) {
                uint c = i0 + lane_column(i, e);
                pr[i][e] = c >= seeing.x && c < seeing.y ? e4[e] : 0.0;
            }
            Ps[lane_quad(r, i, HS)] = f16vec4(pr[i]);
        }
        subgroupBarrier();
        ACCUMULATE(dvc, Ps, sg, Gs);
        TIMES_ROWS(acc, va, Gs);
        SPILL(acc, T_FRAGS, sg);
        [[unroll]] for (uint i = 0; i < T_QUADS; i++) {
            vec4 dp = Ss[lane_quad(r, i, FS)];
            Ps[lane_quad(r, i, HS)] = f16vec4(pr[i] * (dp - delta_s[lane_column_quad(i)]));
        }
        subgroupBarrier();
        ACCUMULATE(dkc, Ps, sg, Qs);
    }
    uint row = p[DKV_TOKEN_MAJOR] != 0 ? (b * S + j) * kvh + kh : (b * kvh + kh) * S + j;
    STORE_KEYS(dk, dkc);
    STORE_KEYS(dv, dvc);
}
