// Causal attention for training, backward to the keys and values (ops/flash_attention.rs), after the query kernel
// stored delta: for key j, dv_j = Σ_i p_ij dout_i and dk_j = Σ_i p_ij (dout_i · v_j - delta_i) q_i over the queries
// i of every query head that reads this key/value head (GQA: the group's gradients are summed here, keys and
// values are never repeated). A workgroup keeps TILE keys and values of one key/value head staged and walks the
// tiles of queries that see them (flash_attention_grad_tiles.wgsl); thread (ty, tx) accumulates keys tx + 8x,
// head-row quads ty + 8m of both gradients in registers.
//
// Bindings: dk, dv [B, KVH, S, D] (written through their views, dense along D), q, k, v through their views,
// dout [B, T, H, D], lse and delta [B, H, T] (dense).

const SCORES_KEY_MAJOR: bool = false;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    //@FOR x R
    //@FOR m M
    var dk_@x_@m = vec4<f32>(0.0);
    var dv_@x_@m = vec4<f32>(0.0);
    //@END
    //@END
    let lid = lid3.x;
    let ty = lid / 8u;
    let tx = lid % 8u;
    let H = p[1];
    let T = p[2];
    let S = p[3];
    let group = p[4];
    let KVH = H / group;
    let b = wg.x / KVH;
    let kh = wg.x % KVH;
    // Blocks of earlier keys are seen by more queries: they launch first (see ops/flash_attention.rs, `launch`).
    let j0 = wg.y * TILE;
    let tile_first = queries_seeing(j0).x;
    let tile_end = queries_seeing(min(j0 + TILE, S) - 1u).y;
    //@FOR e STAGED
    let kv@e = fetch_key(lid + 64u * @eu, j0, S, b, kh);
    //@END
    //@FOR e STAGED
    put_key(lid + 64u * @eu, kv@e);
    //@END
    // Rounds over the query tiles of every head of the group, each fetched a round ahead.
    let tiles = (tile_end - tile_first + TILE - 1u) / TILE;
    let rounds = group * tiles;
    //@FOR e STAGED
    var next@e = fetch_query(lid + 64u * @eu, tile_first, tile_end, b, kh * group);
    //@END
    var next_lse = 0.0;
    var next_delta = 0.0;
    if (lid < TILE) {
        let at = (b * H + kh * group) * T + min(tile_first + lid, T - 1u);
        next_lse = lse[at];
        next_delta = delta[at];
    }
    for (var n = 0u; n < rounds; n = n + 1u) {
        let i0 = tile_first + (n % tiles) * TILE;
        workgroupBarrier();
        //@FOR e STAGED
        put_query(lid + 64u * @eu, next@e);
        //@END
        if (lid < TILE) {
            lse_s[lid] = next_lse;
            delta_s[lid] = next_delta;
        }
        workgroupBarrier();
        if (n + 1u < rounds) {
            let h = kh * group + (n + 1u) / tiles;
            let i1 = tile_first + ((n + 1u) % tiles) * TILE;
            //@FOR e STAGED
            next@e = fetch_query(lid + 64u * @eu, i1, tile_end, b, h);
            //@END
            if (lid < TILE) {
                let at = (b * H + h) * T + min(i1 + lid, T - 1u);
                next_lse = lse[at];
                next_delta = delta[at];
            }
        }
        score_tile(ty, tx, i0, j0);
        workgroupBarrier();
        // Every row of the tile: rows past the queries that see these keys are zeros with p = ds = 0.
        //@FOR i TILE
        {
            //@FOR m M
            let g@m = g_s[@iu * RS + min(ty + 8u * @mu, D4 - 1u)];
            let q@m = q_s[@iu * RS + min(ty + 8u * @mu, D4 - 1u)];
            //@END
            //@FOR x R
            let p@x = vec4<f32>(p_s[@iu * PS + tx + 8u * @xu]);
            let ds@x = vec4<f32>(ds_s[@iu * PS + tx + 8u * @xu]);
            //@FOR m M
            dv_@x_@m = fma(p@x, g@m, dv_@x_@m);
            dk_@x_@m = fma(ds@x, q@m, dk_@x_@m);
            //@END
            //@END
        }
        //@END
    }
    //@FOR x R
    //@FOR m M
    store_key(b, kh, j0 + tx + 8u * @xu, ty + 8u * @mu, dk_@x_@m, dv_@x_@m);
    //@END
    //@END
}
