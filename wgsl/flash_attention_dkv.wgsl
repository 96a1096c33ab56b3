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

@compute @workgroup_size(BR)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    //@UNROLL
    var kr@i = vec4<f32>(0.0);
    var vr@i = vec4<f32>(0.0);
    var dk_acc@i = vec4<f32>(0.0);
    var dv_acc@i = vec4<f32>(0.0);
    //@END
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
        kr@i = load_k(kb, @c);
        vr@i = load_v(vb, @c);
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
            for (var i = first; i < end; i = i + 4u) {
                let n = four_rows(i, i0, i0 + BC - 1u);
                let r = n * D4;
                var a0 = vec4<f32>(0.0);
                var a1 = vec4<f32>(0.0);
                var a2 = vec4<f32>(0.0);
                var a3 = vec4<f32>(0.0);
                var g0 = vec4<f32>(0.0);
                var g1 = vec4<f32>(0.0);
                var g2 = vec4<f32>(0.0);
                var g3 = vec4<f32>(0.0);
                //@UNROLL
                a0 = fma(qs[r.x + @c], kr@i, a0);
                a1 = fma(qs[r.y + @c], kr@i, a1);
                a2 = fma(qs[r.z + @c], kr@i, a2);
                a3 = fma(qs[r.w + @c], kr@i, a3);
                g0 = fma(gs[r.x + @c], vr@i, g0);
                g1 = fma(gs[r.y + @c], vr@i, g1);
                g2 = fma(gs[r.z + @c], vr@i, g2);
                g3 = fma(gs[r.w + @c], vr@i, g3);
                //@END
                let p0 = exp(hsum(a0) - lse_s[n.x]);
                let p1 = select(0.0, exp(hsum(a1) - lse_s[n.y]), i + 1u < end);
                let p2 = select(0.0, exp(hsum(a2) - lse_s[n.z]), i + 2u < end);
                let p3 = select(0.0, exp(hsum(a3) - lse_s[n.w]), i + 3u < end);
                let d0 = vec4<f32>(p0 * (hsum(g0) - delta_s[n.x]));
                let d1 = vec4<f32>(p1 * (hsum(g1) - delta_s[n.y]));
                let d2 = vec4<f32>(p2 * (hsum(g2) - delta_s[n.z]));
                let d3 = vec4<f32>(p3 * (hsum(g3) - delta_s[n.w]));
                let e0 = vec4<f32>(p0);
                let e1 = vec4<f32>(p1);
                let e2 = vec4<f32>(p2);
                let e3 = vec4<f32>(p3);
                //@UNROLL
                dv_acc@i = fma(e0, gs[r.x + @c], fma(e1, gs[r.y + @c], fma(e2, gs[r.z + @c], fma(e3, gs[r.w + @c], dv_acc@i))));
                dk_acc@i = fma(d0, qs[r.x + @c], fma(d1, qs[r.y + @c], fma(d2, qs[r.z + @c], fma(d3, qs[r.w + @c], dk_acc@i))));
                //@END
            }
        }
    }
    if (live) {
        let ob = ((b * KVH + kh) * S + j) * D;
        //@UNROLL
        store_dk(ob, @c, dk_acc@i);
        store_dv(ob, @c, dv_acc@i);
        //@END
    }
}
