// Normalization backward for weight and bias, a column reduction on rows.wgsl with its own `main`: workgroup
// (x, y) sums columns 256x .. 256x + 255 over rows y * per .. (y + 1) * per (per = scalar 5) of g * x̂ and of g,
// from g (view 0), x (view 1) and the saved (mean, rstd). Partial sums go to `partial` as [chunks, 2, C]; the Rust
// side adds them.

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let c = p[1];
    let j = wid.x * WG + lid;
    if (j >= c) {
        return;
    }
    let per = scalar_u32(5u);
    let r0 = wid.y * per;
    let r1 = min(r0 + per, p[0]);
    let sg = j * col_stride(0u);
    let sx = j * col_stride(1u);
    var dw = 0.0;
    var db = 0.0;
    for (var row = r0; row < r1; row = row + 1u) {
        let g = f32(load_g(row_base(0u, row) + sg));
        let x = f32(load_x(row_base(1u, row) + sx));
        dw = dw + g * (x - stats[2u * row]) * stats[2u * row + 1u];
        db = db + g;
    }
    partial[2u * wid.y * c + j] = dw;
    partial[(2u * wid.y + 1u) * c + j] = db;
}
