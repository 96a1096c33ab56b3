// Causal attention for training, backward to the keys and values (ops/flash_attention.rs), after the query kernel
// stored delta; the same sums as flash_attention_dkv.wgsl, shaped for register reuse instead of as a tiled
// product: each key row belongs to a group of G consecutive threads, thread `member` of the group holding quads
// member + G m (m < QM) of the key, the value and both gradients in registers for the whole kernel. (A group
// must lie in one subgroup with its lanes in invocation order, as on every driver we run, whose subgroups are a
// workgroup's invocations in order.) Query rows stream past in tiles of STREAM rows (q, dout, lse, delta staged
// in workgroup memory, read by every group at once, so each read is a broadcast); per query row a thread
// multiplies its quads, the group adds its partial scores with subgroup shuffles, and every thread updates its
// quads of dk and dv from the same staged row. A workgroup takes ROWS keys of one key/value head and the query
// tiles of every query head that reads it (GQA: the group's gradients are summed here). The next tile's loads
// are held in registers while the current one is used.
//
// The Rust side defines G (a power of two, at most the smallest subgroup size), QM, QS = G QM (quads per staged
// row, D4 padded), ROWS (rows a workgroup owns), STREAM (rows per streamed tile), STAGED = ceil(STREAM QS /
// (ROWS G)), UNROLL (streamed rows handled per step of the inner loop, a divisor of STREAM: their products are
// independent, so the compiler can interleave them; the gradients still take the rows in order), and
// group_sum(x), the sum of x over the G threads of a group (subgroup shuffles; x itself when G is 1, so that no
// subgroup operation is needed then); flash_attention_rows_common.wgsl holds what both row kernels share.
//
// Bindings: dk, dv [B, KVH, S, D] (written through their views, dense along D), q, k, v through their views,
// dout [B, T, H, D], lse and delta [B, H, T] (dense); with rotary embeddings, the tables of
// flash_attention_rotary.wgsl.

var<workgroup> lse_t: array<f32, 2u * STREAM>;
var<workgroup> delta_t: array<f32, 2u * STREAM>;

// Quad c of query row i's q and dout (the streamed rows), head h of sequence b.
fn stream_quads(i: u32, c: u32, b: u32, h: u32) -> array<vec4<f32>, 2> {
    let q = query_quad(b, h, i, c);
    let g = load_dout(((b * p[2] + i) * p[1] + h) * p[8], c);
    return array<vec4<f32>, 2>(q, g);
}

@compute @workgroup_size(THREADS)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let H = p[1];
    let T = p[2];
    let S = p[3];
    let group = p[4];
    let KVH = H / group;
    let b = wg.x / KVH;
    let kh = wg.x % KVH;
    // Blocks of earlier keys are seen by more queries: they launch first (see ops/flash_attention.rs, `launch`).
    let j0 = wg.y * ROWS;
    let j = j0 + lid / G;
    let member = lid % G;
    let vb = view_base(V_AT, b, kh, min(j, S - 1u));
    //@FOR m QM
    let c@m = min(member + G * @mu, D4 - 1u);
    let in@m = member + G * @mu < D4;
    let k@m = select(vec4<f32>(0.0), key_quad(b, kh, min(j, S - 1u), c@m), in@m);
    let v@m = select(vec4<f32>(0.0), load_v(vb, c@m), in@m);
    var dk@m = vec4<f32>(0.0);
    var dv@m = vec4<f32>(0.0);
    //@END
    // The queries that see the key (those of key S - 1 for the threads past the keys, whose gradients are never
    // stored); the streamed rows past T lie past its end.
    let seeing = queries_seeing(min(j, S - 1u));
    let tile_first = queries_seeing(j0).x;
    let tile_end = queries_seeing(min(j0 + ROWS, S) - 1u).y;
    let tiles = (tile_end - tile_first + STREAM - 1u) / STREAM;
    let rounds = group * tiles;
    //@FOR e STAGED
    var next@e = fetch_stream(lid + THREADS * @eu, tile_first, tile_end, b, kh * group);
    //@END
    var next_lse = 0.0;
    var next_delta = 0.0;
    if (lid < STREAM) {
        let at = (b * H + kh * group) * T + min(tile_first + lid, T - 1u);
        next_lse = lse[at];
        next_delta = delta[at];
    }
    for (var n = 0u; n < rounds; n = n + 1u) {
        let buf = n % 2u;
        let i0 = tile_first + (n % tiles) * STREAM;
        // The buffer written here was last read in round n - 2; every thread has passed round n - 1's barrier since,
        // so one barrier a round suffices.
        //@FOR e STAGED
        put_stream(buf, lid + THREADS * @eu, next@e);
        //@END
        if (lid < STREAM) {
            lse_t[buf * STREAM + lid] = next_lse;
            delta_t[buf * STREAM + lid] = next_delta;
        }
        workgroupBarrier();
        if (n + 1u < rounds) {
            let h = kh * group + (n + 1u) / tiles;
            let i1 = tile_first + ((n + 1u) % tiles) * STREAM;
            //@FOR e STAGED
            next@e = fetch_stream(lid + THREADS * @eu, i1, tile_end, b, h);
            //@END
            if (lid < STREAM) {
                let at = (b * H + h) * T + min(i1 + lid, T - 1u);
                next_lse = lse[at];
                next_delta = delta[at];
            }
        }
        let row0 = buf * STREAM * QS + member;
        for (var r0 = 0u; r0 < STREAM; r0 = r0 + UNROLL) {
            //@FOR u UNROLL
            let at@u = row0 + (r0 + @uu) * QS;
            // Sums in the tiled kernels' order (a dot product per quad, quads in order): with one thread per row
            // both kernels round alike. (Four chains of multiply-adds instead ran no faster on the H200 and moved
            // the two-step training fixtures' parameter errors past their bound.)
            var s_part@u = 0.0;
            var dp_part@u = 0.0;
            //@FOR m QM
            let q@u_@m = stream_a[at@u + G * @mu];
            let g@u_@m = stream_b[at@u + G * @mu];
            s_part@u = s_part@u + dot(q@u_@m, k@m);
            dp_part@u = dp_part@u + dot(g@u_@m, v@m);
            //@END
            let s@u = group_sum(s_part@u);
            let dp@u = group_sum(dp_part@u);
            let pr@u = select(0.0, exp_acc(s@u - lse_t[buf * STREAM + r0 + @uu]), within(i0 + r0 + @uu, seeing));
            let ds@u = pr@u * (dp@u - delta_t[buf * STREAM + r0 + @uu]);
            //@END
            //@FOR u UNROLL
            //@FOR m QM
            dv@m = fma(vec4<f32>(pr@u), g@u_@m, dv@m);
            dk@m = fma(vec4<f32>(ds@u), q@u_@m, dk@m);
            //@END
            //@END
        }
    }
    // Quad m's rotary partner is quad m + QM / 2 (mod QM) of the same thread (flash_attention_rotary.wgsl).
    var dks: array<vec4<f32>, QM>;
    //@FOR m QM
    dks[@mu] = dk@m;
    //@END
    //@FOR m QM
    store_key(b, kh, j, member + G * @mu, key_grad(min(j, S - 1u), c@m, dk@m, dks[(@mu + QM / 2u) % QM]), dv@m);
    //@END
}
