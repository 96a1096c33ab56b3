// Causal attention for training, forward (ops/flash_attention.rs): out[b, t, h] = Σ_j softmax_j(q · k_j) v_j and
// the log-sum-exp of each row's scores, which the backward needs to recompute the probabilities. One thread per
// query row (BR rows of one head per workgroup) keeps the row and its output in registers and walks the keys it
// sees in tiles of BC keys staged in workgroup memory, with an online softmax: the scores are never stored, so
// memory stays linear in the sequence length. Query head h reads key/value head h / group (GQA without copies).
//
// Bindings: out [B, T, H, D] and lse [B, H, T] (dense), q, k, v through their views.

var<workgroup> ks: array<vec4<f32>, BC * D4>;
var<workgroup> vs: array<vec4<f32>, BC * D4>;
var<private> qr: array<vec4<f32>, D4>;
var<private> acc: array<vec4<f32>, D4>;

fn store_out(base: u32, c: u32, x: vec4<f32>) {
    for (var e = 0u; e < 4u; e = e + 1u) {
        if (4u * c + e < p[8]) {
            out[base + 4u * c + e] = x[e];
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
    if (live) {
        let qb = view_base(Q_AT, b, h, t);
        //@UNROLL
        qr[@c] = load_q(qb, @c);
        //@END
    }
    var m = neg_inf();
    var l = 0.0;
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
            //@UNROLL
            s = s + dot(qr[@c], ks[row + @c]);
            //@END
            if (s > m) {
                let r = exp(m - s);
                l = l * r;
                //@UNROLL
                acc[@c] = acc[@c] * r;
                //@END
                m = s;
            }
            let e = exp(s - m);
            l = l + e;
            //@UNROLL
            acc[@c] = fma(vec4<f32>(e), vs[row + @c], acc[@c]);
            //@END
        }
    }
    if (live) {
        let ob = ((b * T + t) * H + h) * D;
        let inv = 1.0 / l;
        //@UNROLL
        store_out(ob, @c, acc[@c] * inv);
        //@END
        lse[(b * H + h) * T + t] = m + log(l);
    }
}
