// Cumulative sum over rows of x (view 0), on rows.wgsl: each thread sums a contiguous chunk of the row, the
// workgroup scans the chunk sums in shared memory, then each thread rescans its chunk from its offset and writes
// f32 `out`. Scalar 0 = 1 scans from the end of the row (the gradient of cumsum).

var<workgroup> sh: array<f32, 256>;

fn run_row(row: u32, lid: u32, sg_lane: u32) {
    let n = p[1];
    let reverse = scalar_u32(0u) == 1u;
    let base = row_base(0u, row);
    let cs = col_stride(0u);
    let chunk = (n + WG - 1u) / WG;
    let start = min(lid * chunk, n);
    let end = min(start + chunk, n);
    var s = 0.0;
    for (var j = start; j < end; j = j + 1u) {
        s = s + f32(load_x(base + select(j, n - 1u - j, reverse) * cs));
    }
    sh[lid] = s;
    workgroupBarrier();
    for (var off = 1u; off < WG; off = off << 1u) {
        var v = 0.0;
        if (lid >= off) {
            v = sh[lid - off];
        }
        workgroupBarrier();
        sh[lid] = sh[lid] + v;
        workgroupBarrier();
    }
    var acc = 0.0;
    if (lid > 0u) {
        acc = sh[lid - 1u];
    }
    for (var j = start; j < end; j = j + 1u) {
        let k = select(j, n - 1u - j, reverse);
        acc = acc + f32(load_x(base + k * cs));
        out[row * n + k] = acc;
    }
}
