// Fused attention over a key/value cache (ops/attention.rs): one workgroup of WG threads per output row (b, t, h)
// computes softmax(q · k_j) over the keys the query sees and the weighted sum of the values, in one launch. The
// keys run in chunks of CH with an online softmax: each chunk's scores sit in workgroup memory, the running max M
// rescales the per-thread partial sums and the output accumulators when it grows.
//
// Decode is latency-bound (a handful of workgroups, each walking the cache), so both phases keep many loads in
// flight and read four elements at a time: a score is a dot product over the D/4 quads of the head with four
// independent accumulators, and the value sum splits the threads into DL lanes along the quads (the power of two
// >= D/4) times WG / DL slices of the keys, each slice summing its keys four at a time; the slices are added at
// the end. Each thread's output quad is `lid % DL`. The Rust side binds k and v as vec4 arrays when rows are
// dense and 16-byte aligned, else as f32 arrays read through their strides: it declares the bindings, adds
// reduce(lid, x, is_max) (attention_reduce_*.wgsl, replacing the SG_BUILTINS and SG_INIT markers), HEAD_DIM, and
// defines
// load_k(base, d4) / load_v(base, d4), quad d4 of the row at element offset `base` (zeros past D). With STEP
// (attention_step.wgsl) queries and the step's new keys are rotated here and the new keys and values cached.
//
// Visibility: key j (absolute position k_start + j) is seen by query t (position q_start + t) iff
// kpos <= qpos and, with a window w > 0, kpos + w > qpos. The visible keys are one contiguous range, so the
// kernel only walks that range instead of masking scores to -inf; the Rust side guarantees it is never empty.
//
// Parameters (u32 words): [rows, H, T, D, S, group (H / KVH), q_start, k_start, window (0: none),
// q offset, q strides (b, h, t, d), k offset, k strides (b, kvh, s, d), v offset, v strides (b, kvh, s, d)].

const WG: u32 = 256u;
const CH: u32 = 1024u;
const MAX_D4: u32 = 64u;
const Q_AT: u32 = 9u;
const K_AT: u32 = 14u;
const V_AT: u32 = 19u;

var<workgroup> q_row: array<vec4<f32>, MAX_D4>;
// The query row element by element (zeros past D), before it is packed into quads.
var<workgroup> q_el: array<f32, 4u * MAX_D4>;
// With STEP: the step's keys (rotated) and values of this key/value head, for up to STEP_MAX_T positions, element
// by element (zeros past D).
const STEP_MAX_T: u32 = 2u;
var<workgroup> fresh_k: array<f32, STEP_MAX_T * 4u * MAX_D4>;
var<workgroup> fresh_v: array<f32, STEP_MAX_T * 4u * MAX_D4>;
var<workgroup> scores: array<f32, CH>;
var<workgroup> red: array<f32, WG>;
var<workgroup> red4: array<vec4<f32>, WG>;

// Element offset of row (b, head, pos) of the view whose offset and strides start at p[at].
fn base_of(at: u32, b: u32, head: u32, pos: u32) -> u32 {
    return p[at] + b * p[at + 1u] + head * p[at + 2u] + pos * p[at + 3u];
}

fn quad_of_q(d4: u32) -> vec4<f32> {
    return vec4<f32>(q_el[4u * d4], q_el[4u * d4 + 1u], q_el[4u * d4 + 2u], q_el[4u * d4 + 3u]);
}

// Quad d4 of the step's key (kv = 0) or value (kv = 1) of position t, from workgroup memory.
fn fresh_quad(kv: u32, t: u32, d4: u32) -> vec4<f32> {
    let i = t * 4u * MAX_D4 + 4u * d4;
    if (kv == 0u) {
        return vec4<f32>(fresh_k[i], fresh_k[i + 1u], fresh_k[i + 2u], fresh_k[i + 3u]);
    }
    return vec4<f32>(fresh_v[i], fresh_v[i + 1u], fresh_v[i + 2u], fresh_v[i + 3u]);
}

// Quad d4 of value j: from the cache (rows from `vb`, `vs` apart), or from workgroup memory for this step's.
fn value_at(vb: u32, vs: u32, j: u32, d4: u32) -> vec4<f32> {
    if (STEP && j >= p[24]) {
        return fresh_quad(1u, j - p[24], d4);
    }
    return load_v(vb + j * vs, d4);
}

// Score of the cached key row at element offset `kr`: the head's quads with four independent accumulators. No
// branch sits between the loads, so all of them are in flight at once (the keys of this step are scored apart).
fn score_cached(kr: u32) -> f32 {
    var s0 = 0.0;
    var s1 = 0.0;
    var s2 = 0.0;
    var s3 = 0.0;
    let d4_len = (HEAD_DIM + 3u) / 4u;
    var d4 = 0u;
    for (; d4 + 4u <= d4_len; d4 = d4 + 4u) {
        s0 = s0 + dot(q_row[d4], load_k(kr, d4));
        s1 = s1 + dot(q_row[d4 + 1u], load_k(kr, d4 + 1u));
        s2 = s2 + dot(q_row[d4 + 2u], load_k(kr, d4 + 2u));
        s3 = s3 + dot(q_row[d4 + 3u], load_k(kr, d4 + 3u));
    }
    for (; d4 < d4_len; d4 = d4 + 1u) {
        s0 = s0 + dot(q_row[d4], load_k(kr, d4));
    }
    return (s0 + s1) + (s2 + s3);
}

// Score of the step's key of position t (rotated, in workgroup memory), summed in the order of score_cached.
fn score_fresh(t: u32) -> f32 {
    var s0 = 0.0;
    var s1 = 0.0;
    var s2 = 0.0;
    var s3 = 0.0;
    let d4_len = (HEAD_DIM + 3u) / 4u;
    var d4 = 0u;
    for (; d4 + 4u <= d4_len; d4 = d4 + 4u) {
        s0 = s0 + dot(q_row[d4], fresh_quad(0u, t, d4));
        s1 = s1 + dot(q_row[d4 + 1u], fresh_quad(0u, t, d4 + 1u));
        s2 = s2 + dot(q_row[d4 + 2u], fresh_quad(0u, t, d4 + 2u));
        s3 = s3 + dot(q_row[d4 + 3u], fresh_quad(0u, t, d4 + 3u));
    }
    for (; d4 < d4_len; d4 = d4 + 1u) {
        s0 = s0 + dot(q_row[d4], fresh_quad(0u, t, d4));
    }
    return (s0 + s1) + (s2 + s3);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32 /*@SG_BUILTINS*/) {
    //@SG_INIT
    let row = wid.x + wid.y * nwg.x;
    // Uniform across the workgroup, so the early return keeps the barriers below in uniform control flow.
    if (row >= p[0]) {
        return;
    }
    let heads = p[1];
    // The head size is a constant of the pipeline (HEAD_DIM), so that the loops over it unroll and a score's
    // loads are all in flight at once.
    let d_len = HEAD_DIM;
    let d4_len = (HEAD_DIM + 3u) / 4u;
    let h = row % heads;
    let t = (row / heads) % p[2];
    let b = row / (heads * p[2]);
    let kvh = h / p[5];
    let qpos = p[6] + t;
    let k_start = p[7];
    let window = p[8];

    // The query row, and with STEP the step's keys (rotated) and values, one element per thread: a thread per
    // row would walk it alone while the others wait at the next barrier (decode is latency-bound).
    let qb = base_of(Q_AT, b, h, t);
    let d_pad = 4u * d4_len;
    for (var d = lid; d < d_pad; d = d + WG) {
        var x = 0.0;
        if (d < d_len) {
            if (STEP) {
                x = rotated_q(qb, t, d);
            } else {
                x = q[qb + d * p[Q_AT + 4u]];
            }
        }
        q_el[d] = x;
    }
    if (STEP) {
        for (var i = lid; i < p[2] * d_pad; i = i + WG) {
            let tt = i / d_pad;
            let d = i % d_pad;
            var kx = 0.0;
            var vx = 0.0;
            if (d < d_len) {
                kx = new_element(0u, b, kvh, tt, d);
                vx = new_element(1u, b, kvh, tt, d);
            }
            fresh_k[tt * 4u * MAX_D4 + d] = kx;
            fresh_v[tt * 4u * MAX_D4 + d] = vx;
        }
    }
    workgroupBarrier();
    for (var d4 = lid; d4 < d4_len; d4 = d4 + WG) {
        q_row[d4] = quad_of_q(d4);
    }
    // The first workgroup of each key/value head caches the step's keys and values; no workgroup reads those
    // cache rows in this launch.
    if (STEP && t == 0u && (h % p[5]) == 0u) {
        for (var i = lid; i < p[2] * d4_len; i = i + WG) {
            let tt = i / d4_len;
            let d4 = i % d4_len;
            store_k(base_of(K_AT, b, kvh, p[24] + tt), d4, fresh_quad(0u, tt, d4));
            store_v(base_of(V_AT, b, kvh, p[24] + tt), d4, fresh_quad(1u, tt, d4));
        }
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
    let vb = base_of(V_AT, b, kvh, 0u);
    let vs = p[V_AT + 3u];

    // Value-sum lanes: DL along the quads of D, WG / DL slices of the keys.
    var dl = 1u;
    while (dl < d4_len) {
        dl = dl << 1u;
    }
    let slices = WG / dl;
    let dlane = lid % dl;
    let slice = lid / dl;
    let owns_d = dlane < d4_len;

    var m_run = neg_inf();
    var l_part = 0.0;
    var acc = vec4<f32>(0.0);
    for (var c0 = lo; c0 < hi; c0 = c0 + CH) {
        let n = min(CH, hi - c0);
        // Keys of the chunk that come from the cache; with STEP the rest are this step's.
        var n_cached = n;
        if (STEP) {
            n_cached = min(n, max(p[24], c0) - c0);
        }
        var local_max = neg_inf();
        for (var i = lid; i < n; i = i + WG) {
            let j = c0 + i;
            var s: f32;
            if (STEP && j >= p[24]) {
                s = score_fresh(j - p[24]);
            } else {
                s = score_cached(kb + j * ks);
            }
            scores[i] = s;
            local_max = max(local_max, s);
        }
        // The barriers inside also publish `scores` to the whole workgroup.
        let m_new = max(m_run, reduce(lid, local_max, true));
        // exp(-inf - -inf) is NaN: a running max or chunk max of -inf carries no mass and scales to 0.
        let empty = (m_new == neg_inf());
        let scale = select(exp_acc(m_run - m_new), 0.0, (m_run == neg_inf()));
        m_run = m_new;
        l_part = l_part * scale;
        acc = acc * scale;
        for (var i = lid; i < n; i = i + WG) {
            let e = select(exp_acc(scores[i] - m_new), 0.0, empty);
            scores[i] = e;
            l_part = l_part + e;
        }
        workgroupBarrier();
        if (owns_d) {
            var a0 = vec4<f32>(0.0);
            var a1 = vec4<f32>(0.0);
            var a2 = vec4<f32>(0.0);
            var a3 = vec4<f32>(0.0);
            var i = slice;
            // Rounds of four keys, their loads in flight together. Rounds wholly in the cache load without a
            // branch; with STEP, the one round that reaches this step's keys and the leftovers take value_at. The
            // rounds are the same as without STEP, so the sum is bit for bit that of attention over the cache.
            for (; i + 3u * slices < n_cached; i = i + 4u * slices) {
                a0 = a0 + scores[i] * load_v(vb + (c0 + i) * vs, dlane);
                a1 = a1 + scores[i + slices] * load_v(vb + (c0 + i + slices) * vs, dlane);
                a2 = a2 + scores[i + 2u * slices] * load_v(vb + (c0 + i + 2u * slices) * vs, dlane);
                a3 = a3 + scores[i + 3u * slices] * load_v(vb + (c0 + i + 3u * slices) * vs, dlane);
            }
            for (; i + 3u * slices < n; i = i + 4u * slices) {
                a0 = a0 + scores[i] * value_at(vb, vs, c0 + i, dlane);
                a1 = a1 + scores[i + slices] * value_at(vb, vs, c0 + i + slices, dlane);
                a2 = a2 + scores[i + 2u * slices] * value_at(vb, vs, c0 + i + 2u * slices, dlane);
                a3 = a3 + scores[i + 3u * slices] * value_at(vb, vs, c0 + i + 3u * slices, dlane);
            }
            for (; i < n; i = i + slices) {
                a0 = a0 + scores[i] * value_at(vb, vs, c0 + i, dlane);
            }
            acc = acc + ((a0 + a1) + (a2 + a3));
        }
        // The next chunk overwrites `scores`.
        workgroupBarrier();
    }

    let total = reduce(lid, l_part, false);
    red4[lid] = acc;
    workgroupBarrier();
    if (slice == 0u && owns_d) {
        var sum = vec4<f32>(0.0);
        for (var sl = 0u; sl < slices; sl = sl + 1u) {
            sum = sum + red4[sl * dl + dlane];
        }
        let y = sum / total;
        for (var c = 0u; c < 4u; c = c + 1u) {
            let d = 4u * dlane + c;
            if (d < d_len) {
                out[row * d_len + d] = y[c];
            }
        }
    }
}
