// Shared by the two query-gradient kernels of flash attention (ops/flash_attention.rs).

// Quad c of the gradient of query t (of batch b, head h), where it is in range, through dq's view (DQ_AT).
fn store_query(b: u32, h: u32, t: u32, c: u32, quad: vec4<f32>) {
    if (t < p[2] && c < D4) {
        store_dq(view_base(DQ_AT, b, h, t), c, quad);
    }
}
