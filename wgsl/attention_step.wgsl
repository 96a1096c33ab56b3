// The fused step of cached attention (ops/attention.rs, Tensor::attention_step), prepended to
// attention_decode.wgsl: queries and the step's new keys are rotated as they are read (the rotation of `rope`:
// pairs (d, d + D/2), x[d] c - x[d + D/2] s below the half, x[d] c + x[d - D/2] s above it, c and s of column
// d mod D/2), new keys and values are read from the projections instead of the cache, and stored into it.
//
// Parameters after the 24 of attention_decode.wgsl: [position of the first new key in the cache, k_new offset and
// strides (b, t, kvh, d), v_new likewise, offsets of cos_q, sin_q, cos_k, sin_k in `tab`, tab strides (t, j)].

// Element d of query row `qb` (position t of the step), rotated by the query tables (which carry the score scale).
fn rotated_q(qb: u32, t: u32, d: u32) -> f32 {
    let half = p[3] / 2u;
    let qd = p[13u];
    let jj = d % half;
    let c = tab[p[35] + t * p[39] + jj * p[40]];
    let s = tab[p[36] + t * p[39] + jj * p[40]];
    let x = q[qb + d * qd];
    if (d < half) {
        return x * c - q[qb + (d + half) * qd] * s;
    }
    return x * c + q[qb + (d - half) * qd] * s;
}

// Quad d4 (zeros past D) of the new key (kv = 0, rotated by the key tables) or value (kv = 1) of position t of
// the step, key/value head `head`.
fn new_quad(kv: u32, b: u32, head: u32, t: u32, d4: u32) -> vec4<f32> {
    let d_len = p[3];
    let half = d_len / 2u;
    var r = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c = c + 1u) {
        let d = 4u * d4 + c;
        if (d < d_len) {
            if (kv == 1u) {
                r[c] = v_new[p[30] + b * p[31] + t * p[32] + head * p[33] + d * p[34]];
            } else {
                let base = p[25] + b * p[26] + t * p[27] + head * p[28];
                let jj = d % half;
                let cs = tab[p[37] + t * p[39] + jj * p[40]];
                let sn = tab[p[38] + t * p[39] + jj * p[40]];
                let x = k_new[base + d * p[29]];
                if (d < half) {
                    r[c] = x * cs - k_new[base + (d + half) * p[29]] * sn;
                } else {
                    r[c] = x * cs + k_new[base + (d - half) * p[29]] * sn;
                }
            }
        }
    }
    return r;
}
