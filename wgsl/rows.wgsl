// Helpers of the row kernels (softmax, cumsum): one workgroup handles one row of R elements of a strided view
// whose row dimension comes last; the output is dense f32 [rows, R] in the view's order. The Rust side prepends
// bindings (`out`, `in0`), `load_in0` and the kernel, which calls these.
//
// Parameters: [rows, R, rank, shape[8], offset, strides[8], extras...].

const WG: u32 = 256u;
const EXTRA: u32 = 20u;

// The workgroup's row, or `rows` or more when the grid overshoots.
fn row_index(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + wid.y * nwg.x;
}

// Buffer offset of the first element of `row`.
fn row_base(row: u32) -> u32 {
    var rem = row * p[1];
    var off = p[11];
    for (var d = i32(p[2]) - 1; d >= 0; d = d - 1) {
        let n = p[3u + u32(d)];
        off = off + (rem % n) * p[12u + u32(d)];
        rem = rem / n;
    }
    return off;
}

// Element `j` of the row starting at `base`, as f32.
fn load_x(base: u32, j: u32) -> f32 {
    return f32(load_in0(base + j * p[11u + p[2]]));
}
