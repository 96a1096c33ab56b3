// The first pass of softmax and cross-entropy (rows.wgsl kernels): a thread's running logsumexp part, (max, Σ exp(x
// - max)), over its columns of a row. The kernel defines `row_value(i)`, element i of its input as f32.

// Adds element x to a running logsumexp part with one exp. NaN falls to the second branch and poisons the sum.
fn lse_push(a: vec4<f32>, x: f32) -> vec4<f32> {
    if (x > a.x) {
        return vec4<f32>(x, a.y * exp_acc(a.x - x) + 1.0, 0.0, 0.0);
    }
    return vec4<f32>(a.x, a.y + select(exp_acc(x - a.x), 0.0, (x == neg_inf())), 0.0, 0.0);
}

// Adds four elements at once: their exps are independent of each other (one exp to rescale the part, at most), so
// they overlap where lse_push's chain of one element after another would wait on each.
fn lse_push4(a: vec4<f32>, x: vec4<f32>) -> vec4<f32> {
    let m = max(a.x, max(max(x.x, x.y), max(x.z, x.w)));
    // exp(inf - inf) is NaN: a maximum of +-inf scales by exp(x - 0) instead (an infinite sum, or nothing).
    let base = select(m, 0.0, abs(m) == pos_inf());
    let e = (exp_acc(x.x - base) + exp_acc(x.y - base)) + (exp_acc(x.z - base) + exp_acc(x.w - base));
    return vec4<f32>(m, a.y * exp_acc(a.x - base) + e, 0.0, 0.0);
}

// The part over columns lid, lid + WG, ... of the row at `base` (column stride cs, p[1] columns): four columns a
// step, then the rest one at a time.
fn row_lse_part(base: u32, cs: u32, lid: u32) -> vec4<f32> {
    var own = vec4<f32>(neg_inf(), 0.0, 0.0, 0.0);
    var j = lid;
    for (; j + 3u * WG < p[1]; j = j + 4u * WG) {
        let at = base + j * cs;
        let step = WG * cs;
        own = lse_push4(own, vec4<f32>(row_value(at), row_value(at + step), row_value(at + 2u * step),
            row_value(at + 3u * step)));
    }
    for (; j < p[1]; j = j + WG) {
        own = lse_push(own, row_value(base + j * cs));
    }
    return own;
}
