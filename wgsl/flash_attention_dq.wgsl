// Causal attention for training, backward to the queries (ops/flash_attention.rs), run before the key/value
// kernel: with p_j = exp(q · k_j - lse) the probabilities recomputed from the forward's log-sum-exp and
// delta = Σ_d dout · out (also stored for the key/value kernel), dq = Σ_j p_j (dout · v_j - delta) k_j. A
// workgroup keeps TILE query rows of one head staged and walks the tiles of keys they see
// (flash_attention_grad_tiles.wgsl); thread (ty, tx) accumulates query rows tx + 8x, head-row quads ty + 8m.
//
// Bindings: dq [B, H, T, D] (written through its view, dense along D) and delta [B, H, T] (dense, written), q,
// k, v through their views, out and dout [B, T, H, D] and lse [B, H, T] (dense).

const SCORES_KEY_MAJOR: bool = true;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    //@FOR x R
    //@FOR m M
    var dq_@x_@m = vec4<f32>(0.0);
    //@END
    //@END
    let lid = lid3.x;
    let ty = lid / 8u;
    let tx = lid % 8u;
    let H = p[1];
    let T = p[2];
    let D = p[8];
    let b = wg.x / H;
    let h = wg.x % H;
    let kh = h / p[4];
    let t0 = query_block_start(wg.y, TILE);
    let tile_first = keys_seen(t0).x;
    let tile_end = keys_seen(min(t0 + TILE, T) - 1u).y;
    //@FOR e STAGED
    let qg@e = fetch_query(lid + 64u * @eu, t0, T, b, h);
    //@END
    //@FOR e STAGED
    put_query(lid + 64u * @eu, qg@e);
    //@END
    // Key tiles, each fetched a round ahead.
    //@FOR e STAGED
    var next@e = fetch_key(lid + 64u * @eu, tile_first, tile_end, b, kh);
    //@END
    workgroupBarrier();
    if (lid < TILE) {
        let t = t0 + lid;
        var delta = 0.0;
        if (t < T) {
            let ob = ((b * T + t) * H + h) * D;
            //@FOR c D4
            delta = delta + dot(g_s[lid * RS + @cu], load_out(ob, @cu));
            //@END
            delta_out[(b * H + h) * T + t] = delta;
        }
        lse_s[lid] = lse[(b * H + h) * T + min(t, T - 1u)];
        delta_s[lid] = delta;
    }
    for (var j0 = tile_first; j0 < tile_end; j0 = j0 + TILE) {
        workgroupBarrier();
        //@FOR e STAGED
        put_key(lid + 64u * @eu, next@e);
        //@END
        workgroupBarrier();
        if (j0 + TILE < tile_end) {
            //@FOR e STAGED
            next@e = fetch_key(lid + 64u * @eu, j0 + TILE, tile_end, b, kh);
            //@END
        }
        score_tile(ty, tx, t0, j0);
        workgroupBarrier();
        // Every key of the tile: keys past those the queries see are zeros with ds = 0.
        //@FOR j TILE
        {
            //@FOR m M
            let k@m = k_s[@ju * RS + min(ty + 8u * @mu, D4 - 1u)];
            //@END
            //@FOR x R
            let ds@x = vec4<f32>(ds_s[@ju * PS + tx + 8u * @xu]);
            //@FOR m M
            dq_@x_@m = fma(ds@x, k@m, dq_@x_@m);
            //@END
            //@END
        }
        //@END
    }
    //@FOR x R
    //@FOR m M
    store_query(b, h, t0 + tx + 8u * @xu, ty + 8u * @mu, dq_@x_@m);
    //@END
    //@END
}
