// Softmax / log-softmax over rows (see rows.wgsl): one read pass keeps a running (max, sum of exp(x - max)) per
// thread (online softmax), the workgroup merges them, then one read + write pass normalizes. `LOG` selects
// log-softmax; `SUBGROUPS` merges through subgroup operations instead of a shared-memory tree.

struct Part {
    m: f32,
    s: f32,
}

var<workgroup> sh_m: array<f32, 256>;
var<workgroup> sh_s: array<f32, 256>;
var<workgroup> n_parts: atomic<u32>;

// Merges two partial (max, sum) pairs. A part whose max is -inf holds no mass: its sum is 0, or NaN when it
// saw a NaN, which must survive the merge.
fn merge(a: Part, b: Part) -> Part {
    let m = max(a.m, b.m);
    if (m == neg_inf()) {
        return Part(m, a.s + b.s);
    }
    return Part(m, a.s * exp(a.m - m) + b.s * exp(b.m - m));
}

// Adds element x to a running part with one exp. NaN falls to the second branch and poisons the sum.
fn push(a: Part, x: f32) -> Part {
    if (x > a.m) {
        return Part(x, a.s * exp(a.m - x) + 1.0);
    }
    return Part(a.m, a.s + select(exp(x - a.m), 0.0, (x == neg_inf())));
}

fn combine_tree(own: Part, lid: u32) -> Part {
    sh_m[lid] = own.m;
    sh_s[lid] = own.s;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            let c = merge(Part(sh_m[lid], sh_s[lid]), Part(sh_m[lid + s], sh_s[lid + s]));
            sh_m[lid] = c.m;
            sh_s[lid] = c.s;
        }
        workgroupBarrier();
    }
    return Part(sh_m[0], sh_s[0]);
}

fn run_row(row: u32, lid: u32, sg_lane: u32) {
    let n = p[1];
    let base = row_base(row);
    var own = Part(neg_inf(), 0.0);
    for (var j = lid; j < n; j = j + WG) {
        own = push(own, load_x(base, j));
    }
    let total = combine(own, lid, sg_lane);
    let out_base = row * n;
    if (LOG) {
        // (x - max) - log(sum) keeps full precision for large x, unlike x - (max + log(sum)).
        let log_s = log(total.s);
        for (var j = lid; j < n; j = j + WG) {
            out[out_base + j] = (load_x(base, j) - total.m) - log_s;
        }
    } else {
        let inv = 1.0 / total.s;
        for (var j = lid; j < n; j = j + WG) {
            out[out_base + j] = exp(load_x(base, j) - total.m) * inv;
        }
    }
}
