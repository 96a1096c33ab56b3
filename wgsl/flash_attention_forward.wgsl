// Causal attention for training, forward (ops/flash_attention.rs): out[b, t, h] = Σ_j softmax_j(q · k_j) v_j and
// the log-sum-exp of each row's scores, which the backward needs to recompute the probabilities. One thread per
// query row (BR rows of one head per workgroup) keeps the row and its output in registers and walks the keys it
// sees in tiles of BC keys staged in workgroup memory, with an online softmax: the scores are never stored, so
// memory stays linear in the sequence length. Query head h reads key/value head h / group (GQA without copies).
// Devices with subgroups run flash_attention_forward_rows.wgsl instead.
//
// Bindings: out [B, T, H, D] and lse [B, H, T] (dense), q, k, v through their views; with rotary embeddings, the
// tables of flash_attention_rotary.wgsl.

// The inner loop takes four keys at a time, for four independent chains of multiply-adds; lanes past
// the end of the range reread the tile's last row and are given no weight.
fn hsum(a: vec4<f32>) -> f32 {
    return (a.x + a.y) + (a.z + a.w);
}

// The rows within the tile staged from row `first` of the four rows from `i` (rows past `last`, the tile's last
// one, read as it).
fn four_rows(i: u32, first: u32, last: u32) -> vec4<u32> {
    return min(vec4<u32>(i) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last)) - vec4<u32>(first);
}

@compute @workgroup_size(BR)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    //@FOR i D4
    var qr@i = vec4<f32>(0.0);
    var acc@i = vec4<f32>(0.0);
    //@END
    let lid = lid3.x;
    let H = p[1];
    let T = p[2];
    let D = p[8];
    let b = wg.x / H;
    let h = wg.x % H;
    let kh = h / p[4];
    let t0 = query_block_start(wg.y, BR);
    let t = t0 + lid;
    let live = t < T;
    let seen = keys_seen(min(t, T - 1u));
    let tile_first = keys_seen(t0).x;
    let tile_end = keys_seen(min(t0 + BR, T) - 1u).y;
    // With rotary embeddings (self-attention: key j at query j's position), the first query head of each
    // key/value head keeps the rotated keys (and the values) of its block's positions, which it stages anyway.
    let keep = select(vec2<u32>(0u), vec2<u32>(t0, min(t0 + BR, T)), h % p[4] == 0u);
    if (live) {
        //@FOR i D4
        qr@i = query_quad(b, h, t, @iu);
        keep_query(b, h, t, @iu, qr@i);
        //@END
    }
    var m = neg_inf();
    var l = 0.0;
    for (var j0 = tile_first; j0 < tile_end; j0 = j0 + BC) {
        stage_keys(lid, j0, tile_end, b, kh, keep);
        let first = max(seen.x, j0);
        let end = min(seen.y, j0 + BC);
        for (var j = first; j < end; j = j + 4u) {
            let r = four_rows(j, j0, j0 + BC - 1u) * D4;
            var a0 = vec4<f32>(0.0);
            var a1 = vec4<f32>(0.0);
            var a2 = vec4<f32>(0.0);
            var a3 = vec4<f32>(0.0);
            //@FOR i D4
            a0 = fma(qr@i, ks[r.x + @iu], a0);
            a1 = fma(qr@i, ks[r.y + @iu], a1);
            a2 = fma(qr@i, ks[r.z + @iu], a2);
            a3 = fma(qr@i, ks[r.w + @iu], a3);
            //@END
            let s0 = hsum(a0);
            let s1 = select(neg_inf(), hsum(a1), j + 1u < end);
            let s2 = select(neg_inf(), hsum(a2), j + 2u < end);
            let s3 = select(neg_inf(), hsum(a3), j + 3u < end);
            let mx = max(max(s0, s1), max(s2, s3));
            if (mx > m) {
                let r = exp_acc(m - mx);
                l = l * r;
                //@FOR i D4
                acc@i = acc@i * r;
                //@END
                m = mx;
            }
            let e0 = vec4<f32>(exp_acc(s0 - m));
            let e1 = vec4<f32>(exp_acc(s1 - m));
            let e2 = vec4<f32>(exp_acc(s2 - m));
            let e3 = vec4<f32>(exp_acc(s3 - m));
            l = l + (e0.x + e1.x) + (e2.x + e3.x);
            //@FOR i D4
            acc@i = fma(e0, vs[r.x + @iu], fma(e1, vs[r.y + @iu], fma(e2, vs[r.z + @iu], fma(e3, vs[r.w + @iu], acc@i))));
            //@END
        }
    }
    if (live) {
        let ob = ((b * T + t) * H + h) * D;
        let inv = 1.0 / l;
        //@FOR i D4
        store_out(ob, @iu, acc@i * inv);
        //@END
        lse[(b * H + h) * T + t] = m + log(l);
    }
}
