// Fused attention over a key/value cache (ops/attention.rs): one workgroup of WG threads per output row (b, t, h)
// computes softmax(q · k_j) over the keys the query sees and the weighted sum of the values, in one launch. The
// keys run in chunks of CH with an online softmax: each chunk's scores sit in workgroup memory, the running max M
// rescales the per-thread partial sums and the output accumulators when it grows.
//
// Decode is latency-bound (a handful of workgroups, each walking the cache), so both phases keep many loads in
// flight: a score is a dot product over D with four independent accumulators, and the value sum splits the
// threads into DL lanes along D (the power of two >= D) times WG / DL slices of the keys, each slice summing its
// keys four at a time; the slices are added at the end. Each thread's output component is `lid % DL`.
//
// Visibility: key j (absolute position k_start + j) is seen by query t (position q_start + t) iff
// kpos <= qpos and, with a window w > 0, kpos + w > qpos. The visible keys are one contiguous range, so the
// kernel only walks that range instead of masking scores to -inf; the Rust side guarantees it is never empty.
//
// Parameters (u32 words): [rows, H, T, D, S, group (H / KVH), q_start, k_start, window (0: none),
// q offset, q strides (b, h, t, d), k offset, k strides (b, kvh, s, d), v offset, v strides (b, kvh, s, d)].

@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> q: array<f32>;
@group(0) @binding(3) var<storage, read> k: array<f32>;
@group(0) @binding(4) var<storage, read> v: array<f32>;

const WG: u32 = 256u;
const CH: u32 = 1024u;
const MAX_D: u32 = 256u;
const Q_AT: u32 = 9u;
const K_AT: u32 = 14u;
const V_AT: u32 = 19u;

var<workgroup> q_row: array<f32, MAX_D>;
var<workgroup> scores: array<f32, CH>;
var<workgroup> red: array<f32, WG>;

// Max over the workgroup's values (a shared-memory tree); every thread gets it.
fn reduce_max(lid: u32, x: f32) -> f32 {
    red[lid] = x;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            red[lid] = max(red[lid], red[lid + s]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

// Sum over the workgroup's values; every thread gets it.
fn reduce_sum(lid: u32, x: f32) -> f32 {
    red[lid] = x;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            red[lid] = red[lid] + red[lid + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

// Element offset of row (b, head, pos) of the view whose offset and strides start at p[at].
fn base_of(at: u32, b: u32, head: u32, pos: u32) -> u32 {
    return p[at] + b * p[at + 1u] + head * p[at + 2u] + pos * p[at + 3u];
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    // Uniform across the workgroup, so the early return keeps the barriers below in uniform control flow.
    if (row >= p[0]) {
        return;
    }
    let heads = p[1];
    let d_len = p[3];
    let h = row % heads;
    let t = (row / heads) % p[2];
    let b = row / (heads * p[2]);
    let kvh = h / p[5];
    let qpos = p[6] + t;
    let k_start = p[7];
    let window = p[8];

    let qb = base_of(Q_AT, b, h, t);
    for (var d = lid; d < d_len; d = d + WG) {
        q_row[d] = q[qb + d * p[Q_AT + 4u]];
    }
    workgroupBarrier();

    // Visible keys: j in [lo, hi).
    let hi = qpos - k_start + 1u;
    var lo = 0u;
    if (window > 0u && hi > window) {
        lo = hi - window;
    }

    let kb = base_of(K_AT, b, kvh, 0u);
    let ks = p[K_AT + 3u];
    let kd = p[K_AT + 4u];
    let vb = base_of(V_AT, b, kvh, 0u);
    let vs = p[V_AT + 3u];
    let vd = p[V_AT + 4u];

    // Value-sum lanes: DL along D, WG / DL slices of the keys.
    var dl = 1u;
    while (dl < d_len) {
        dl = dl << 1u;
    }
    let slices = WG / dl;
    let dlane = lid % dl;
    let slice = lid / dl;
    let owns_d = dlane < d_len;
    let vcol = vb + dlane * vd;

    var m_run = neg_inf();
    var l_part = 0.0;
    var acc = 0.0;
    for (var c0 = lo; c0 < hi; c0 = c0 + CH) {
        let n = min(CH, hi - c0);
        var local_max = neg_inf();
        for (var i = lid; i < n; i = i + WG) {
            let kr = kb + (c0 + i) * ks;
            var s0 = 0.0;
            var s1 = 0.0;
            var s2 = 0.0;
            var s3 = 0.0;
            var d = 0u;
            for (; d + 4u <= d_len; d = d + 4u) {
                s0 = s0 + q_row[d] * k[kr + d * kd];
                s1 = s1 + q_row[d + 1u] * k[kr + (d + 1u) * kd];
                s2 = s2 + q_row[d + 2u] * k[kr + (d + 2u) * kd];
                s3 = s3 + q_row[d + 3u] * k[kr + (d + 3u) * kd];
            }
            for (; d < d_len; d = d + 1u) {
                s0 = s0 + q_row[d] * k[kr + d * kd];
            }
            let s = (s0 + s1) + (s2 + s3);
            scores[i] = s;
            local_max = max(local_max, s);
        }
        // The barriers inside also publish `scores` to the whole workgroup.
        let m_new = max(m_run, reduce_max(lid, local_max));
        // exp(-inf - -inf) is NaN: a running max or chunk max of -inf carries no mass and scales to 0.
        let empty = (m_new == neg_inf());
        let scale = select(exp(m_run - m_new), 0.0, (m_run == neg_inf()));
        m_run = m_new;
        l_part = l_part * scale;
        acc = acc * scale;
        for (var i = lid; i < n; i = i + WG) {
            let e = select(exp(scores[i] - m_new), 0.0, empty);
            scores[i] = e;
            l_part = l_part + e;
        }
        workgroupBarrier();
        if (owns_d) {
            var a0 = 0.0;
            var a1 = 0.0;
            var a2 = 0.0;
            var a3 = 0.0;
            var i = slice;
            for (; i + 3u * slices < n; i = i + 4u * slices) {
                a0 = a0 + scores[i] * v[vcol + (c0 + i) * vs];
                a1 = a1 + scores[i + slices] * v[vcol + (c0 + i + slices) * vs];
                a2 = a2 + scores[i + 2u * slices] * v[vcol + (c0 + i + 2u * slices) * vs];
                a3 = a3 + scores[i + 3u * slices] * v[vcol + (c0 + i + 3u * slices) * vs];
            }
            for (; i < n; i = i + slices) {
                a0 = a0 + scores[i] * v[vcol + (c0 + i) * vs];
            }
            acc = acc + ((a0 + a1) + (a2 + a3));
        }
        // The next chunk overwrites `scores`.
        workgroupBarrier();
    }

    let total = reduce_sum(lid, l_part);
    red[lid] = acc;
    workgroupBarrier();
    if (slice == 0u && owns_d) {
        var sum = 0.0;
        for (var sl = 0u; sl < slices; sl = sl + 1u) {
            sum = sum + red[sl * dl + dlane];
        }
        out[row * d_len + dlane] = sum / total;
    }
}
