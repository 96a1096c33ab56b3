// Flash-attention backward to the queries on tensor cores (after flash_attention_coop_common.glsl), as
// flash_attention_dq.wgsl: delta = Σ_d dout · out (stored for the key/value kernel) and dq = Σ_j p_j (dout · v_j -
// delta) k_j with p_j = exp(q · k_j - lse). A workgroup takes TILE query rows of one head; each subgroup keeps
// its FRAG rows of q and dout in registers as fragments and, for each tile of TILE keys and values, computes its
// scores and output-gradient products on tensor cores; the LANES lanes of a row turn it into f16 score gradients
// dS = p (dp - delta), which multiply the keys on tensor cores into the subgroup's dq fragments.

layout(std430, binding = 1) writeonly buffer Dq { vec4 dq[]; };
layout(std430, binding = 2) writeonly buffer DeltaOut { float delta_out[]; };
layout(std430, binding = 3) readonly buffer Q { vec4 q[]; };
layout(std430, binding = 4) readonly buffer K { vec4 k[]; };
layout(std430, binding = 5) readonly buffer V { vec4 v[]; };
layout(std430, binding = 6) readonly buffer Out { vec4 out_[]; };
layout(std430, binding = 7) readonly buffer Dout { vec4 dout[]; };
layout(std430, binding = 8) readonly buffer Lse { float lse[]; };

// The keys (first the output gradients of the workgroup's rows), the values, and the queries then each
// subgroup's score gradients in its own rows.
shared f16vec4 Ks[TILE * HS];
shared f16vec4 Vs[TILE * HS];
shared f16vec4 DSs[TILE * HS];
shared vec4 Ss[TILE * FS];

void main() {
    uint sg = gl_SubgroupID;
    uint H = p[1];
    uint T = p[2];
    uint r = lane_row();
    QueryTile tile = query_tile();
    STAGE(DSs, q, tile.t0, T, view_base(Q_AT, tile.b, tile.head, row));
    STAGE(Ks, dout, tile.t0, T, token_base(tile.b, tile.head, row));
    barrier();
    FRAG_A qa[D_FRAGS];
    FRAG_A ga[D_FRAGS];
    LOAD_ROWS(qa, DSs, sg);
    LOAD_ROWS(ga, Ks, sg);
    // delta of the lane's row, in f32 from the stored output and the staged (f16) output gradient.
    uint tc = min(tile.t, T - 1);
    float delta = 0.0;
    [[unroll]] for (uint i = 0; i < D_QUADS; i++) {
        uint at = token_base(tile.b, tile.head, tc) / 4 + lane_column_quad(i);
        delta += dot(vec4(Ks[lane_quad(r, i, HS)]), out_[at]);
    }
    delta = row_sum(delta);
    if (tile.t < T && gl_SubgroupInvocationID % LANES == 0) {
        delta_out[(tile.b * H + tile.head) * T + tile.t] = delta;
    }
    float row_lse = lse[(tile.b * H + tile.head) * T + tc];
    uvec2 seen = keys_seen(tc);
    FRAG_C dqc[D_FRAGS];
    [[unroll]] for (uint n = 0; n < D_FRAGS; n++) {
        dqc[n] = FRAG_C(0.0);
    }
    // Key and value tiles, each fetched a round ahead.
    vec4 kr[STAGED];
    vec4 vr[STAGED];
    FETCH_KEYS(tile, tile.first);
    for (uint j0 = tile.first; j0 < tile.end; j0 += TILE) {
        barrier();
        PUT(Ks, kr);
        PUT(Vs, vr);
        barrier();
        if (j0 + TILE < tile.end) {
            FETCH_KEYS(tile, j0 + TILE);
        }
        FRAG_C acc[T_FRAGS];
        TIMES_ROWS(acc, qa, Ks);
        SPILL(acc, T_FRAGS, sg);
        vec4 pr[T_QUADS];
        [[unroll]] for (uint i = 0; i < T_QUADS; i++) {
            vec4 s = Ss[lane_quad(r, i, FS)];
            [[unroll]] for (uint e = 0; e < 4; e++) {
                uint j = j0 + lane_column(i, e);
                pr[i][e] = (j >= seen.x && j < seen.y) ? exp(s[e] - row_lse) : 0.0;
            }
        }
        subgroupBarrier();
        TIMES_ROWS(acc, ga, Vs);
        SPILL(acc, T_FRAGS, sg);
        [[unroll]] for (uint i = 0; i < T_QUADS; i++) {
            DSs[lane_quad(r, i, HS)] = f16vec4(pr[i] * (Ss[lane_quad(r, i, FS)] - delta));
        }
        subgroupBarrier();
        ACCUMULATE(dqc, DSs, sg, Ks);
    }
    SPILL(dqc, D_FRAGS, sg);
    if (tile.t < T) {
        uint row = (tile.b * H + tile.head) * T + tile.t;
        if (p[DQ_TOKEN_MAJOR] != 0) {
            row = (tile.b * T + tile.t) * H + tile.head;
        }
        [[unroll]] for (uint i = 0; i < D_QUADS; i++) {
            dq[row * (D / 4) + lane_column_quad(i)] = round16(Ss[lane_quad(r, i, FS)]);
        }
    }
}
