// Helpers of the row kernels (softmax, log-softmax, cumsum, RMSNorm, LayerNorm, cross-entropy): a row is the last
// dimension of `lead + [C]` and one workgroup of WG threads handles it, reading any number of strided views. The
// Rust side (ops/rows.rs, `RowKernel`) prepends the bindings with their load/store functions and the kernel's
// constants, and appends `lse_reduce`, the kernel and its entry point.
//
// Parameters: [rows, C, nlead, lead_shape[8], scalars[6], then per strided view k: offset, column stride,
// lead_strides[8]]. A view holding only the leading dimensions (the targets of a loss) has column stride 0.

const WG: u32 = 256u;
const SCALARS: u32 = 11u;
const VIEWS: u32 = 17u;

fn scalar_u32(i: u32) -> u32 {
    return p[SCALARS + i];
}

fn scalar_f32(i: u32) -> f32 {
    return bitcast<f32>(p[SCALARS + i]);
}

// Element offset of the first element of `row` in view `k`.
fn row_base(k: u32, row: u32) -> u32 {
    let base = VIEWS + 10u * k;
    return strided_index(row, p[2], 3u, base, base + 2u);
}

fn col_stride(k: u32) -> u32 {
    return p[VIEWS + 10u * k + 1u];
}

// What a kernel with an output shaped like its rows computes once per row before the output is written (see
// `RowKernel::output`): `row_context` returns it, `out_value` uses it.
struct RowCtx {
    v: vec4<f32>,
    base0: u32,
    base1: u32,
}

// How two partial results merge. SUM: componentwise. WELFORD: Chan's merge of (count, mean, M2), stable for the
// variance. LSE: online logsumexp, (max, Σ exp(x - max)); a part whose max is -inf holds no mass, its sum is 0, or
// NaN when it saw a NaN, which must survive the merge.
const SUM: u32 = 0u;
const WELFORD: u32 = 1u;
const LSE: u32 = 2u;

fn combine(a: vec4<f32>, b: vec4<f32>, kind: u32) -> vec4<f32> {
    if (kind == WELFORD) {
        let n = a.x + b.x;
        if (n == 0.0) {
            return a;
        }
        let d = b.y - a.y;
        return vec4<f32>(n, a.y + d * (b.x / n), a.z + b.z + d * d * (a.x * b.x / n), 0.0);
    }
    if (kind == LSE) {
        let m = max(a.x, b.x);
        if (m == neg_inf()) {
            return vec4<f32>(m, a.y + b.y, 0.0, 0.0);
        }
        return vec4<f32>(m, a.y * exp_acc(a.x - m) + b.y * exp_acc(b.x - m), 0.0, 0.0);
    }
    return a + b;
}

var<workgroup> partials: array<vec4<f32>, 256>;

// Combines the WG threads' partial results with a shared-memory tree; every thread gets the total.
fn workgroup_reduce(lid: u32, v: vec4<f32>, kind: u32) -> vec4<f32> {
    partials[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            partials[lid] = combine(partials[lid], partials[lid + s], kind);
        }
        workgroupBarrier();
    }
    let total = partials[0];
    workgroupBarrier();
    return total;
}
