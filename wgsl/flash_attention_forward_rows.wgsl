// Causal attention for training, forward (ops/flash_attention.rs), on devices with subgroups: the output and
// log-sum-exp of flash_attention_forward.wgsl, shaped as the backward's row kernels. Each query row belongs to a
// group of G consecutive threads (in one subgroup), thread `member` holding quads member + G m (m < QM) of the
// query and the output in registers: G times the threads of one thread per row, each with a G-th of the
// registers, so that more of them run at once and hide each other's latencies. Per key a thread multiplies its
// quads (the partial scores in the row kernels' order, so that the backward recomputes the same scores), the
// group adds them with subgroup shuffles, and every thread updates its quads of the output.
//
// Keys are taken KB at a time, in groups aligned to the tile (so a row's sums do not depend on which rows share
// its subgroup), the online softmax rescaling the output at most once per group. The loop runs over the keys
// any row of the subgroup sees, uniform across the subgroup as its shuffles need; keys a row does not see get no
// weight.
//
// The Rust side defines G (a power of two, at most the smallest subgroup size), QM, ROWS (query rows a
// workgroup owns), THREADS = ROWS G, BC (keys per staged tile), KQ (groups of four keys per step: 4 KQ divides
// BC) and group_sum(x).
//
// Bindings: as flash_attention_forward.wgsl.

// Keys per step.
const KB: u32 = 4u * KQ;

@compute @workgroup_size(THREADS)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let H = p[1];
    let T = p[2];
    let D = p[8];
    let b = wg.x / H;
    let h = wg.x % H;
    let kh = h / p[4];
    let t0 = query_block_start(wg.y, ROWS);
    let t = t0 + lid / G;
    let member = lid % G;
    let odd = (member & 1u) == 1u;
    let tc = min(t, T - 1u);
    let seen = keys_seen(tc);
    // With rotary embeddings the first query head of each key/value head keeps the rotated keys (and the
    // values) of its block's positions, which it stages anyway.
    let keep = select(vec2<u32>(0u), vec2<u32>(t0, min(t0 + ROWS, T)), h % p[4] == 0u);
    //@FOR m QM
    let c@m = min(member + G * @mu, D4 - 1u);
    let in@m = member + G * @mu < D4;
    let q@m = select(vec4<f32>(0.0), query_quad(b, h, tc, c@m), in@m);
    if (t < T && in@m) {
        keep_query(b, h, t, c@m, q@m);
    }
    var acc@m = vec4<f32>(0.0);
    //@END
    var m = neg_inf();
    var l = 0.0;
    // Rows are consecutive and their ranges grow with them: the subgroup's keys run from its first row's first
    // to its last row's end.
    let lo = subgroupMin(seen.x);
    let hi = subgroupMax(seen.y);
    let tile_first = keys_seen(t0).x;
    let tile_end = keys_seen(min(t0 + ROWS, T) - 1u).y;
    for (var j0 = tile_first; j0 < tile_end; j0 = j0 + BC) {
        stage_keys(lid, j0, tile_end, b, kh, keep);
        let end = min(hi, j0 + BC);
        for (var j = j0 + (max(lo, j0) - j0) / KB * KB; j < end; j = j + KB) {
            let at = (j - j0) * D4;
            //@FOR w KQ
            var s@w_0 = 0.0;
            var s@w_1 = 0.0;
            var s@w_2 = 0.0;
            var s@w_3 = 0.0;
            //@END
            //@FOR m QM
            //@FOR w KQ
            let k@m_@w = at + @wu * 4u * D4 + c@m;
            s@w_0 = s@w_0 + dot(q@m, ks[k@m_@w]);
            s@w_1 = s@w_1 + dot(q@m, ks[k@m_@w + D4]);
            s@w_2 = s@w_2 + dot(q@m, ks[k@m_@w + 2u * D4]);
            s@w_3 = s@w_3 + dot(q@m, ks[k@m_@w + 3u * D4]);
            //@END
            //@END
            var mx = neg_inf();
            //@FOR w KQ
            let x@w_0 = select(neg_inf(), group_sum(s@w_0), within(j + @wu * 4u, seen));
            let x@w_1 = select(neg_inf(), group_sum(s@w_1), within(j + @wu * 4u + 1u, seen));
            let x@w_2 = select(neg_inf(), group_sum(s@w_2), within(j + @wu * 4u + 2u, seen));
            let x@w_3 = select(neg_inf(), group_sum(s@w_3), within(j + @wu * 4u + 3u, seen));
            mx = max(mx, max(max(x@w_0, x@w_1), max(x@w_2, x@w_3)));
            //@END
            if (mx > m) {
                let f = exp_acc(m - mx);
                l = l * f;
                //@FOR m QM
                acc@m = acc@m * f;
                //@END
                m = mx;
            }
            // Until the row has seen a key, every score is -inf: weigh them exp(-inf - 0) = 0, not NaN.
            let base = select(m, 0.0, m == neg_inf());
            //@FOR w KQ
            let e@w_01 = pair_exp(x@w_0 - base, x@w_1 - base, odd);
            let e@w_23 = pair_exp(x@w_2 - base, x@w_3 - base, odd);
            let e@w_0 = e@w_01.x;
            let e@w_1 = e@w_01.y;
            let e@w_2 = e@w_23.x;
            let e@w_3 = e@w_23.y;
            l = l + ((e@w_0 + e@w_1) + (e@w_2 + e@w_3));
            //@END
            //@FOR m QM
            //@FOR w KQ
            let v@m_@w = at + @wu * 4u * D4 + c@m;
            acc@m = fma(vec4<f32>(e@w_0), vs[v@m_@w], fma(vec4<f32>(e@w_1), vs[v@m_@w + D4],
                fma(vec4<f32>(e@w_2), vs[v@m_@w + 2u * D4], fma(vec4<f32>(e@w_3), vs[v@m_@w + 3u * D4], acc@m))));
            //@END
            //@END
        }
    }
    if (t < T) {
        let ob = ((b * T + t) * H + h) * D;
        let inv = 1.0 / l;
        //@FOR m QM
        if (in@m) {
            store_out(ob, c@m, acc@m * inv);
        }
        //@END
        if (member == 0u) {
            lse[(b * H + h) * T + t] = m + log(l);
        }
    }
}
