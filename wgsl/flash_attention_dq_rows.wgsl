// Causal attention for training, backward to the queries (ops/flash_attention.rs), run before the key/value
// kernel; the same sums as flash_attention_dq.wgsl (and delta, stored for the key/value kernel), shaped as
// flash_attention_dkv_rows.wgsl: each query row belongs to a group of G threads (in one subgroup), thread
// `member` holding quads member + G m (m < QM) of the query, the output gradient and the query gradient in
// registers. Keys and values stream past in tiles of STREAM rows staged in workgroup memory (each read a
// broadcast); per key a thread multiplies its quads, the group adds its partial scores with subgroup shuffles,
// and every thread updates its quads of dq. A workgroup takes ROWS query rows of one head; the next key tile's
// loads are held in registers while the current one is used.
//
// The Rust side defines the constants and group_sum(x) as for flash_attention_dkv_rows.wgsl.
//
// Bindings: dq [B, H, T, D] (written through its view, dense along D) and delta [B, H, T] (dense, written), q,
// k, v through their views, out and dout [B, T, H, D] and lse [B, H, T] (dense); with rotary embeddings, the
// tables of flash_attention_rotary.wgsl.

// Quad c of key row j's k and v (the streamed rows), key/value head kh of sequence b.
fn stream_quads(j: u32, c: u32, b: u32, kh: u32) -> array<vec4<f32>, 2> {
    let k = key_quad(b, kh, j, c);
    let v = load_v(view_base(V_AT, b, kh, j), c);
    return array<vec4<f32>, 2>(k, v);
}

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
    let ob = ((b * T + tc) * H + h) * D;
    var delta_part = 0.0;
    //@FOR m QM
    let c@m = min(member + G * @mu, D4 - 1u);
    let in@m = member + G * @mu < D4;
    let q@m = select(vec4<f32>(0.0), query_quad(b, h, tc, c@m), in@m);
    let g@m = select(vec4<f32>(0.0), load_dout(ob, c@m), in@m);
    delta_part = delta_part + dot(g@m, select(vec4<f32>(0.0), load_out(ob, c@m), in@m));
    var dq@m = vec4<f32>(0.0);
    //@END
    let delta = group_sum(delta_part);
    if (t < T && member == 0u) {
        delta_out[(b * H + h) * T + t] = delta;
    }
    let row_lse = lse[(b * H + h) * T + tc];
    // The keys the row sees (those of row T - 1 for the threads past the rows, whose dq is never stored).
    let seen = keys_seen(tc);
    let tile_first = keys_seen(t0).x;
    let tile_end = keys_seen(min(t0 + ROWS, T) - 1u).y;
    let tiles = (tile_end - tile_first + STREAM - 1u) / STREAM;
    //@FOR e STAGED
    var next@e = fetch_stream(lid + THREADS * @eu, tile_first, tile_end, b, kh);
    //@END
    for (var n = 0u; n < tiles; n = n + 1u) {
        let buf = n % 2u;
        let j0 = tile_first + n * STREAM;
        // The buffer written here was last read in round n - 2; every thread has passed round n - 1's barrier since,
        // so one barrier a round suffices.
        //@FOR e STAGED
        put_stream(buf, lid + THREADS * @eu, next@e);
        //@END
        workgroupBarrier();
        if (n + 1u < tiles) {
            //@FOR e STAGED
            next@e = fetch_stream(lid + THREADS * @eu, j0 + STREAM, tile_end, b, kh);
            //@END
        }
        let row0 = buf * STREAM * QS + member;
        for (var r0 = 0u; r0 < STREAM; r0 = r0 + UNROLL) {
            // Each pair of a group's threads takes the exps of two streamed rows, one each (see pair_exp).
            var x: array<f32, UNROLL>;
            var e: array<vec2<f32>, PAIRS>;
            //@FOR u UNROLL
            let at@u = row0 + (r0 + @uu) * QS;
            // Sums in the tiled kernels' order (a dot product per quad, quads in order): with one thread per row
            // both kernels round alike. (Four chains of multiply-adds instead ran no faster on the H200 and moved
            // the two-step training fixtures' parameter errors past their bound.)
            var s_part@u = 0.0;
            var dp_part@u = 0.0;
            //@FOR m QM
            let k@u_@m = stream_a[at@u + G * @mu];
            s_part@u = s_part@u + dot(q@m, k@u_@m);
            dp_part@u = dp_part@u + dot(g@m, stream_b[at@u + G * @mu]);
            //@END
            let s@u = group_sum(s_part@u);
            let dp@u = group_sum(dp_part@u);
            x[@u] = s@u - row_lse;
            //@END
            //@FOR v PAIRS
            e[@vu] = pair_exp(x[2u * @vu], x[2u * @vu + 1u], odd);
            //@END
            //@FOR u UNROLL
            let ds@u = select(0.0, e[@uu / 2u][@uu % 2u], within(j0 + r0 + @uu, seen)) * (dp@u - delta);
            //@FOR m QM
            dq@m = fma(vec4<f32>(ds@u), k@u_@m, dq@m);
            //@END
            //@END
        }
    }
    // Quad m's rotary partner is quad m + QM / 2 (mod QM) of the same thread (flash_attention_rotary.wgsl).
    var dqs: array<vec4<f32>, QM>;
    //@FOR m QM
    dqs[@mu] = dq@m;
    //@END
    //@FOR m QM
    store_query(b, h, t, member + G * @mu, query_grad(tc, c@m, dq@m, dqs[(@mu + QM / 2u) % QM]));
    //@END
}
