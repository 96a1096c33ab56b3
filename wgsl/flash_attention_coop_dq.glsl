// Flash-attention backward to the queries on tensor cores (after flash_attention_coop_common.glsl), as
// flash_attention_dq.wgsl: delta = Σ_d dout · out (stored for the key/value kernel) and dq = Σ_j p_j (dout · v_j -
// delta) k_j with p_j = exp(q · k_j - lse). A workgroup takes 64 query rows of one head; each subgroup keeps its
// 16 rows of q and dout in registers as fragments and, for each tile of 64 keys and values, computes its scores
// and output-gradient products on tensor cores; each lane pair turns one row of them into f16 score gradients
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
    uint b = gl_WorkGroupID.y / H;
    uint head = gl_WorkGroupID.y % H;
    uint kh = head / p[4];
    uint t0 = gl_WorkGroupID.x * TILE;
    uint r = sg * 16 + gl_SubgroupInvocationID / 2;
    uint t = t0 + r;
    STAGE(DSs, q, t0, T, view_base(Q_AT, b, head, row));
    STAGE(Ks, dout, t0, T, token_base(b, head, row));
    barrier();
    FRAG_A qa[4];
    FRAG_A ga[4];
    LOAD_ROWS(qa, DSs, sg);
    LOAD_ROWS(ga, Ks, sg);
    // delta of the lane's row, in f32 from the stored output and its gradient.
    uint tc = min(t, T - 1);
    float delta = 0.0;
    [[unroll]] for (uint i = 0; i < 8; i++) {
        uint at = token_base(b, head, tc) / 4 + 2 * i + gl_SubgroupInvocationID % 2;
        delta += dot(dout[at], out_[at]);
    }
    delta += subgroupShuffleXor(delta, 1);
    if (t < T && gl_SubgroupInvocationID % 2 == 0) {
        delta_out[(b * H + head) * T + t] = delta;
    }
    float row_lse = lse[(b * H + head) * T + tc];
    uvec2 seen = keys_seen(tc);
    uint tile_first = keys_seen(t0).x;
    uint tile_end = keys_seen(min(t0 + TILE, T) - 1).y;
    FRAG_C dqc[4];
    [[unroll]] for (uint n = 0; n < 4; n++) {
        dqc[n] = FRAG_C(0.0);
    }
    for (uint j0 = tile_first; j0 < tile_end; j0 += TILE) {
        barrier();
        STAGE(Ks, k, j0, tile_end, view_base(K_AT, b, kh, row));
        STAGE(Vs, v, j0, tile_end, view_base(V_AT, b, kh, row));
        barrier();
        FRAG_C acc[4];
        TIMES_ROWS(acc, qa, Ks);
        SPILL(acc, sg);
        vec4 pr[8];
        [[unroll]] for (uint i = 0; i < 8; i++) {
            vec4 s = Ss[lane_quad(r, i, FS)];
            [[unroll]] for (uint e = 0; e < 4; e++) {
                uint j = j0 + lane_column(i, e);
                pr[i][e] = (j >= seen.x && j < seen.y) ? exp(s[e] - row_lse) : 0.0;
            }
        }
        subgroupBarrier();
        TIMES_ROWS(acc, ga, Vs);
        SPILL(acc, sg);
        [[unroll]] for (uint i = 0; i < 8; i++) {
            DSs[lane_quad(r, i, HS)] = f16vec4(pr[i] * (Ss[lane_quad(r, i, FS)] - delta));
        }
        subgroupBarrier();
        ACCUMULATE(dqc, DSs, sg, Ks);
    }
    SPILL(dqc, sg);
    if (t < T) {
        uint row = p[DQ_TOKEN_MAJOR] != 0 ? (b * T + t) * H + head : (b * H + head) * T + t;
        [[unroll]] for (uint i = 0; i < 8; i++) {
            dq[row * (D / 4) + 2 * i + gl_SubgroupInvocationID % 2] = round16(Ss[lane_quad(r, i, FS)]);
        }
    }
}
