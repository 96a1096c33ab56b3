// Shared by the two query-gradient kernels of flash attention (ops/flash_attention.rs).

// Quad c of the gradient of query t (of batch b, head h), where it is in range: dq is dense [B, H, T, D], or
// [B, T, H, D] with DQ_TOKEN_MAJOR (p[24]; the order the queries' view was cut from).
fn store_query(b: u32, h: u32, t: u32, c: u32, quad: vec4<f32>) {
    if (t < p[2] && c < D4) {
        var row = (b * p[1] + h) * p[2] + t;
        if (p[DQ_TOKEN_MAJOR] != 0u) {
            row = (b * p[2] + t) * p[1] + h;
        }
        store_dq(row * p[8], c, quad);
    }
}
