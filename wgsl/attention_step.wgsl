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

// Element d of the new key (kv = 0, rotated by the key tables) or value (kv = 1) of position t of the step,
// key/value head `head`.
fn new_element(kv: u32, b: u32, head: u32, t: u32, d: u32) -> f32 {
    if (kv == 1u) {
        return v_new[p[30] + b * p[31] + t * p[32] + head * p[33] + d * p[34]];
    }
    let half = p[3] / 2u;
    let base = p[25] + b * p[26] + t * p[27] + head * p[28];
    let jj = d % half;
    let c = tab[p[37] + t * p[39] + jj * p[40]];
    let s = tab[p[38] + t * p[39] + jj * p[40]];
    let x = k_new[base + d * p[29]];
    if (d < half) {
        return x * c - k_new[base + (d + half) * p[29]] * s;
    }
    return x * c + k_new[base + (d - half) * p[29]] * s;
}
