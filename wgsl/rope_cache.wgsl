// One attention step's rotary and cache update: invocation i of B*T*(H + 2*KVH)*D owns one element of the new
// queries, keys or values (in that order within each (b, t)). Queries are rotated into `out` ([B, H, T, D],
// dense), keys are rotated into `kc` and values copied into `vc` (the cache regions of the new positions,
// [B, KVH, T, D] views). The rotation is `rope`'s: pairs (j, j + D/2), out[j] = x[j] c - x[j + D/2] s below
// the half, x[j] c + x[j - D/2] s above it, with c and s of column j mod D/2.
//
// Parameters (u32 words): [B, T, H, KVH, D, n, then offset and 4 strides of q, k, v, kc, vc (at 6, 11, 16, 21,
// 26), then offset and 2 strides of cos_q, sin_q, cos_k, sin_k (at 31, 34, 37, 40)].

fn at4(base: u32, b: u32, t: u32, h: u32, j: u32) -> u32 {
    return p[base] + b * p[base + 1u] + t * p[base + 2u] + h * p[base + 3u] + j * p[base + 4u];
}

fn at2(base: u32, t: u32, j: u32) -> u32 {
    return p[base] + t * p[base + 1u] + j * p[base + 2u];
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + lid;
    if (i >= p[5]) {
        return;
    }
    let T = p[1];
    let H = p[2];
    let KVH = p[3];
    let D = p[4];
    let half = D / 2u;
    let per = (H + 2u * KVH) * D;
    let bt = i / per;
    let r = i % per;
    let b = bt / T;
    let t = bt % T;
    let head = r / D;
    let j = r % D;
    if (head >= H + KVH) {
        let hv = head - H - KVH;
        vc[at4(26u, b, hv, t, j)] = v[at4(16u, b, t, hv, j)];
        return;
    }
    let is_q = head < H;
    var h = head;
    var xb = 6u;
    if (!is_q) {
        h = head - H;
        xb = 11u;
    }
    let jj = j % half;
    let partner = select(j + half, j - half, (j >= half));
    var x: f32;
    var y: f32;
    if (is_q) {
        x = q[at4(xb, b, t, h, j)];
        y = q[at4(xb, b, t, h, partner)];
    } else {
        x = k[at4(xb, b, t, h, j)];
        y = k[at4(xb, b, t, h, partner)];
    }
    var c: f32;
    var s: f32;
    if (is_q) {
        c = cos_q[at2(31u, t, jj)];
        s = sin_q[at2(34u, t, jj)];
    } else {
        c = cos_k[at2(37u, t, jj)];
        s = sin_k[at2(40u, t, jj)];
    }
    var rotated: f32;
    if (j < half) {
        rotated = x * c - y * s;
    } else {
        rotated = x * c + y * s;
    }
    if (is_q) {
        out[((b * H + h) * T + t) * D + j] = rotated;
    } else {
        kc[at4(21u, b, h, t, j)] = rotated;
    }
}
