// Shared by the two key/value-gradient kernels of flash attention (ops/flash_attention.rs).

// Quad c of the gradients of key j (of batch b, key/value head kh), where both are in range, through the views
// of dk and dv (DK_AT, DV_AT).
fn store_key(b: u32, kh: u32, j: u32, c: u32, dk_quad: vec4<f32>, dv_quad: vec4<f32>) {
    if (j < p[3] && c < D4) {
        store_dk(view_base(DK_AT, b, kh, j), c, dk_quad);
        store_dv(view_base(DV_AT, b, kh, j), c, dv_quad);
    }
}
