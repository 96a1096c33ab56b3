// Helpers of the normalization and loss row kernels: a row is the last dimension of a strided tensor and one
// workgroup of 256 threads reduces it. The Rust side (ops/norm.rs, `RowKernel`) prepends the bindings, their
// load/store functions and `const COMBINE`.
//
// Parameters: [rows, C, nlead, lead_shape[8], scalars[6], then per strided view k: offset, column stride,
// lead_strides[8]]. A view holding only the leading dimensions (the targets of a loss) has column stride 0.

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
    var rem = row;
    var off = p[base];
    for (var d = i32(p[2]) - 1; d >= 0; d = d - 1) {
        let n = p[3u + u32(d)];
        off = off + (rem % n) * p[base + 2u + u32(d)];
        rem = rem / n;
    }
    return off;
}

fn col_stride(k: u32) -> u32 {
    return p[VIEWS + 10u * k + 1u];
}

// How two partial results merge. 0: componentwise sum. 1: Chan's merge of Welford (count, mean, M2), stable for
// the variance. 2: online logsumexp, (max, Σ exp(x - max)); an element is (x, 1).
fn combine(a: vec4<f32>, b: vec4<f32>) -> vec4<f32> {
    if (COMBINE == 1u) {
        let n = a.x + b.x;
        if (n == 0.0) {
            return a;
        }
        let d = b.y - a.y;
        return vec4<f32>(n, a.y + d * (b.x / n), a.z + b.z + d * d * (a.x * b.x / n), 0.0);
    }
    if (COMBINE == 2u) {
        let m = max(a.x, b.x);
        if (m == neg_inf()) {
            return vec4<f32>(m, 0.0, 0.0, 0.0);
        }
        return vec4<f32>(m, a.y * exp(a.x - m) + b.y * exp(b.x - m), 0.0, 0.0);
    }
    return a + b;
}

var<workgroup> partials: array<vec4<f32>, 256>;

// Combines the 256 threads' partial results with a shared-memory tree; every thread gets the total.
fn workgroup_reduce(lid: u32, v: vec4<f32>) -> vec4<f32> {
    partials[lid] = v;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            partials[lid] = combine(partials[lid], partials[lid + s]);
        }
        workgroupBarrier();
    }
    let total = partials[0];
    workgroupBarrier();
    return total;
}
