// Causal attention for training, backward to the queries (ops/flash_attention.rs), run before the key/value
// kernel: with p_j = exp(q · k_j - lse) the probabilities recomputed from the forward's log-sum-exp and
// delta = Σ_d dout · out (also stored for the key/value kernel), dq = Σ_j p_j (dout · v_j - delta) k_j. One thread
// per query row, keys in staged tiles, as in the forward.
//
// Bindings: dq [B, H, T, D] and delta [B, H, T] (dense, written), q, k, v through their views, out and dout
// [B, T, H, D] and lse [B, H, T] (dense).

var<workgroup> ks: array<vec4<f32>, BC * D4>;
var<workgroup> vs: array<vec4<f32>, BC * D4>;
var<private> qr: array<vec4<f32>, D4>;
var<private> gr: array<vec4<f32>, D4>;
var<private> acc: array<vec4<f32>, D4>;

fn load_dout(base: u32, c: u32) -> vec4<f32> {
    var r = vec4<f32>(0.0);
    for (var e = 0u; e < 4u; e = e + 1u) {
        if (4u * c + e < p[8]) {
            r[e] = dout[base + 4u * c + e];
        }
    }
    return r;
}

fn load_out(base: u32, c: u32) -> vec4<f32> {
    var r = vec4<f32>(0.0);
    for (var e = 0u; e < 4u; e = e + 1u) {
        if (4u * c + e < p[8]) {
            r[e] = out[base + 4u * c + e];
        }
    }
    return r;
}

fn store_dq(base: u32, c: u32, x: vec4<f32>) {
    for (var e = 0u; e < 4u; e = e + 1u) {
        if (4u * c + e < p[8]) {
            dq[base + 4u * c + e] = x[e];
        }
    }
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
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
        qr[@c] = load_q(qb, @c);
        gr[@c] = load_dout(ob, @c);
        delta = delta + dot(gr[@c], load_out(ob, @c));
        //@END
        row_lse = lse[(b * H + h) * T + t];
        delta_out[(b * H + h) * T + t] = delta;
    }
    for (var j0 = tile_first; j0 < tile_end; j0 = j0 + BC) {
        workgroupBarrier();
        for (var i = lid; i < BC * D4; i = i + BR) {
            let j = j0 + i / D4;
            let c = i % D4;
            var kq = vec4<f32>(0.0);
            var vq = vec4<f32>(0.0);
            if (j < tile_end) {
                kq = load_k(view_base(K_AT, b, kh, j), c);
                vq = load_v(view_base(V_AT, b, kh, j), c);
            }
            ks[i] = kq;
            vs[i] = vq;
        }
        workgroupBarrier();
        let first = max(seen.x, j0);
        let end = min(seen.y, j0 + BC);
        for (var j = first; j < end; j = j + 1u) {
            let row = (j - j0) * D4;
            var s = 0.0;
            var dp = 0.0;
            //@UNROLL
            s = s + dot(qr[@c], ks[row + @c]);
            dp = dp + dot(gr[@c], vs[row + @c]);
            //@END
            let ds = exp(s - row_lse) * (dp - delta);
            //@UNROLL
            acc[@c] = fma(vec4<f32>(ds), ks[row + @c], acc[@c]);
            //@END
        }
    }
    if (live) {
        let db = ((b * H + h) * T + t) * D;
        //@UNROLL
        store_dq(db, @c, acc[@c]);
        //@END
    }
}
