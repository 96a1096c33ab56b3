// Causal attention for training, backward to the queries (ops/flash_attention.rs), run before the key/value
// kernel: with p_j = exp(q · k_j - lse) the probabilities recomputed from the forward's log-sum-exp and
// delta = Σ_d dout · out (also stored for the key/value kernel), dq = Σ_j p_j (dout · v_j - delta) k_j. One thread
// per query row, keys in staged tiles, as in the forward.
//
// Bindings: dq [B, H, T, D] and delta [B, H, T] (dense, written), q, k, v through their views, out and dout
// [B, T, H, D] and lse [B, H, T] (dense).


@compute @workgroup_size(BR)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    //@UNROLL
    var qr@i = vec4<f32>(0.0);
    var gr@i = vec4<f32>(0.0);
    var acc@i = vec4<f32>(0.0);
    //@END
    let lid = lid3.x;
    let H = p[1];
    let T = p[2];
    let D = p[8];
    let b = wg.y / H;
    let h = wg.y % H;
    let kh = h / p[4];
    let t0 = wg.x * BR;
    let t = t0 + lid;
    let live = t < T;
    let seen = keys_seen(min(t, T - 1u));
    let tile_first = keys_seen(t0).x;
    let tile_end = keys_seen(min(t0 + BR, T) - 1u).y;
    var row_lse = 0.0;
    var delta = 0.0;
    if (live) {
        let qb = view_base(Q_AT, b, h, t);
        let ob = ((b * T + t) * H + h) * D;
        //@UNROLL
        qr@i = load_q(qb, @c);
        gr@i = load_dout(ob, @c);
        delta = delta + dot(gr@i, load_out(ob, @c));
        //@END
        row_lse = lse[(b * H + h) * T + t];
        delta_out[(b * H + h) * T + t] = delta;
    }
    for (var j0 = tile_first; j0 < tile_end; j0 = j0 + BC) {
        stage_keys(lid, j0, tile_end, b, kh);
        let first = max(seen.x, j0);
        let end = min(seen.y, j0 + BC);
        for (var j = first; j < end; j = j + 4u) {
            let r = four_rows(j, j0, j0 + BC - 1u) * D4;
            var a0 = vec4<f32>(0.0);
            var a1 = vec4<f32>(0.0);
            var a2 = vec4<f32>(0.0);
            var a3 = vec4<f32>(0.0);
            var g0 = vec4<f32>(0.0);
            var g1 = vec4<f32>(0.0);
            var g2 = vec4<f32>(0.0);
            var g3 = vec4<f32>(0.0);
            //@UNROLL
            a0 = fma(qr@i, ks[r.x + @c], a0);
            a1 = fma(qr@i, ks[r.y + @c], a1);
            a2 = fma(qr@i, ks[r.z + @c], a2);
            a3 = fma(qr@i, ks[r.w + @c], a3);
            g0 = fma(gr@i, vs[r.x + @c], g0);
            g1 = fma(gr@i, vs[r.y + @c], g1);
            g2 = fma(gr@i, vs[r.z + @c], g2);
            g3 = fma(gr@i, vs[r.w + @c], g3);
            //@END
            let ds0 = vec4<f32>(exp(hsum(a0) - row_lse) * (hsum(g0) - delta));
            let ds1 = vec4<f32>(select(0.0, exp(hsum(a1) - row_lse) * (hsum(g1) - delta), j + 1u < end));
            let ds2 = vec4<f32>(select(0.0, exp(hsum(a2) - row_lse) * (hsum(g2) - delta), j + 2u < end));
            let ds3 = vec4<f32>(select(0.0, exp(hsum(a3) - row_lse) * (hsum(g3) - delta), j + 3u < end));
            //@UNROLL
            acc@i = fma(ds0, ks[r.x + @c], fma(ds1, ks[r.y + @c], fma(ds2, ks[r.z + @c], fma(ds3, ks[r.w + @c], acc@i))));
            //@END
        }
    }
    if (live) {
        let db = ((b * H + h) * T + t) * D;
        //@UNROLL
        store_dq(db, @c, acc@i);
        //@END
    }
}
