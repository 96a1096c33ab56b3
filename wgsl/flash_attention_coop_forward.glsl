// Flash-attention forward on tensor cores (after flash_attention_coop_common.glsl): out[b, t, h] = Σ_j
// softmax_j(q · k_j) v_j and the log-sum-exp of each row, as flash_attention_forward.wgsl. A workgroup takes TILE
// query rows of one head; each subgroup keeps its FRAG rows of q in registers as fragments and, for each tile of
// TILE keys and values, computes its FRAG x TILE scores on tensor cores, then the LANES lanes of each row update
// its online softmax from the spilled scores (lane l: row l / LANES) and write that row's f16 probabilities over
// the staged queries (no longer needed), which multiply the values on tensor cores; the lanes rescale and add the
// spilled result to the row's output, which they keep in registers (D / LANES elements each).

layout(std430, binding = 1) writeonly buffer Out { vec4 out_[]; };
layout(std430, binding = 2) writeonly buffer Lse { float lse[]; };
layout(std430, binding = 3) readonly buffer Q { vec4 q[]; };
layout(std430, binding = 4) readonly buffer K { vec4 k[]; };
layout(std430, binding = 5) readonly buffer V { vec4 v[]; };

// The queries, then each subgroup's probabilities in its own rows.
shared f16vec4 QPs[TILE * HS];
shared f16vec4 Ks[TILE * HS];
shared f16vec4 Vs[TILE * HS];
shared vec4 Ss[TILE * FS];

void main() {
    uint sg = gl_SubgroupID;
    uint H = p[1];
    uint T = p[2];
    uint r = lane_row();
    QueryTile tile = query_tile();
    STAGE(QPs, q, tile.t0, T, view_base(Q_AT, tile.b, tile.head, row));
    barrier();
    FRAG_A qa[D_FRAGS];
    LOAD_ROWS(qa, QPs, sg);
    uvec2 seen = keys_seen(min(tile.t, T - 1));
    float m = NEG_INF;
    float l = 0.0;
    vec4 o[D_QUADS];
    [[unroll]] for (uint i = 0; i < D_QUADS; i++) {
        o[i] = vec4(0.0);
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
        vec4 s[T_QUADS];
        float mx = m;
        [[unroll]] for (uint i = 0; i < T_QUADS; i++) {
            s[i] = Ss[lane_quad(r, i, FS)];
            [[unroll]] for (uint e = 0; e < 4; e++) {
                uint j = j0 + lane_column(i, e);
                s[i][e] = (j >= seen.x && j < seen.y) ? s[i][e] : NEG_INF;
            }
            mx = max(mx, max(max(s[i].x, s[i].y), max(s[i].z, s[i].w)));
        }
        mx = row_max(mx);
        // A row that has seen no key yet keeps m = -inf and weighs nothing.
        float alpha = mx == NEG_INF ? 1.0 : exp(m - mx);
        float sum = 0.0;
        [[unroll]] for (uint i = 0; i < T_QUADS; i++) {
            vec4 pr = mx == NEG_INF ? vec4(0.0) : exp(s[i] - mx);
            sum += (pr.x + pr.y) + (pr.z + pr.w);
            QPs[lane_quad(r, i, HS)] = f16vec4(pr);
        }
        [[unroll]] for (uint i = 0; i < D_QUADS; i++) {
            o[i] *= alpha;
        }
        l = l * alpha + row_sum(sum);
        m = mx;
        subgroupBarrier();
        FRAG_C pv[D_FRAGS];
        [[unroll]] for (uint n = 0; n < D_FRAGS; n++) {
            pv[n] = FRAG_C(0.0);
        }
        ACCUMULATE(pv, QPs, sg, Vs);
        SPILL(pv, D_FRAGS, sg);
        [[unroll]] for (uint i = 0; i < D_QUADS; i++) {
            o[i] += Ss[lane_quad(r, i, FS)];
        }
    }
    if (tile.t < T) {
        float inv = 1.0 / l;
        uint ob = token_base(tile.b, tile.head, tile.t) / 4;
        [[unroll]] for (uint i = 0; i < D_QUADS; i++) {
            out_[ob + lane_column_quad(i)] = round16(o[i] * inv);
        }
        if (gl_SubgroupInvocationID % LANES == 0) {
            lse[(tile.b * H + tile.head) * T + tile.t] = m + log(l);
        }
    }
}
