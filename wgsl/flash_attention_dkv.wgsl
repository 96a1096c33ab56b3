// Causal attention for training, backward to the keys and values (ops/flash_attention.rs), after the query kernel
// stored delta: for key j, dv_j = Σ_i p_ij dout_i and dk_j = Σ_i p_ij (dout_i · v_j - delta_i) q_i over the queries
// i of every query head that reads this key/value head (GQA: the group's gradients are summed here, keys and
// values are never repeated). One thread per key row (BR keys of one key/value head per workgroup) keeps the key,
// the value and both gradients in registers and walks the queries that see it in tiles of BC queries (rows of q
// and dout, with their lse and delta) staged in workgroup memory.
//
// Bindings: dk, dv [B, KVH, S, D] (dense, written), q, k, v through their views, dout [B, T, H, D], lse and
// delta [B, H, T] (dense).

var<workgroup> qs: array<vec4<f32>, BC * D4>;
var<workgroup> gs: array<vec4<f32>, BC * D4>;
var<workgroup> lse_s: array<f32, BC>;
var<workgroup> delta_s: array<f32, BC>;
var<private> kr: array<vec4<f32>, D4>;
var<private> vr: array<vec4<f32>, D4>;
var<private> dk_acc: array<vec4<f32>, D4>;
var<private> dv_acc: array<vec4<f32>, D4>;

fn load_dout(base: u32, c: u32) -> vec4<f32> {
    var r = vec4<f32>(0.0);
    for (var e = 0u; e < 4u; e = e + 1u) {
        if (4u * c + e < p[8]) {
            r[e] = dout[base + 4u * c + e];
        }
    }
    return r;
}

fn store_dk(base: u32, c: u32, x: vec4<f32>) {
    for (var e = 0u; e < 4u; e = e + 1u) {
        if (4u * c + e < p[8]) {
            dk[base + 4u * c + e] = x[e];
        }
    }
}

fn store_dv(base: u32, c: u32, x: vec4<f32>) {
    for (var e = 0u; e < 4u; e = e + 1u) {
        if (4u * c + e < p[8]) {
            dv[base + 4u * c + e] = x[e];
        }
    }
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let H = p[1];
    let T = p[2];
    let S = p[3];
    let D = p[8];
    let group = p[4];
    let KVH = H / group;
    let b = wg.y / KVH;
    let kh = wg.y % KVH;
    let j0 = wg.x * BR;
    let j = j0 + lid;
    let live = j < S;
    let seeing = queries_seeing(min(j, S - 1u));
    let tile_first = queries_seeing(j0).x;
    let tile_end = queries_seeing(min(j0 + BR, S) - 1u).y;
    if (live) {
        let kb = view_base(K_AT, b, kh, j);
        let vb = view_base(V_AT, b, kh, j);
        //@UNROLL
        kr[@c] = load_k(kb, @c);
        vr[@c] = load_v(vb, @c);
        //@END
    }
    for (var r = 0u; r < group; r = r + 1u) {
        let h = kh * group + r;
        for (var i0 = tile_first; i0 < tile_end; i0 = i0 + BC) {
            workgroupBarrier();
            for (var x = lid; x < BC * D4; x = x + BR) {
                let i = i0 + x / D4;
                let c = x % D4;
                var qq = vec4<f32>(0.0);
                var gq = vec4<f32>(0.0);
                if (i < tile_end) {
                    qq = load_q(view_base(Q_AT, b, h, i), c);
                    gq = load_dout(((b * T + i) * H + h) * D, c);
                }
                qs[x] = qq;
                gs[x] = gq;
            }
            if (lid < BC) {
                let i = min(i0 + lid, T - 1u);
                lse_s[lid] = lse[(b * H + h) * T + i];
                delta_s[lid] = delta[(b * H + h) * T + i];
            }
            workgroupBarrier();
            let first = max(seeing.x, i0);
            let end = min(seeing.y, i0 + BC);
            for (var i = first; i < end; i = i + 1u) {
                let row = (i - i0) * D4;
                var s = 0.0;
                var dp = 0.0;
                //@UNROLL
                s = s + dot(qs[row + @c], kr[@c]);
                dp = dp + dot(gs[row + @c], vr[@c]);
                //@END
                let pr = exp(s - lse_s[i - i0]);
                let ds = pr * (dp - delta_s[i - i0]);
                //@UNROLL
                dv_acc[@c] = fma(vec4<f32>(pr), gs[row + @c], dv_acc[@c]);
                dk_acc[@c] = fma(vec4<f32>(ds), qs[row + @c], dk_acc[@c]);
                //@END
            }
        }
    }
    if (live) {
        let ob = ((b * KVH + kh) * S + j) * D;
        //@UNROLL
        store_dk(ob, @c, dk_acc[@c]);
        store_dv(ob, @c, dv_acc[@c]);
        //@END
    }
}
