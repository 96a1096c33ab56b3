// Shared by the two key/value-gradient kernels of flash attention (ops/flash_attention.rs).

// Quad c of the gradients of key j (of batch b, key/value head kh), where both are in range: dk and dv are dense
// [B, KVH, S, D], or [B, S, KVH, D] with DKV_TOKEN_MAJOR (p[25]; the order the keys' and values' views were cut
// from).
fn store_key(b: u32, kh: u32, j: u32, c: u32, dk_quad: vec4<f32>, dv_quad: vec4<f32>) {
    if (j < p[3] && c < D4) {
        let kvh = p[1] / p[4];
        var row = (b * kvh + kh) * p[3] + j;
        if (p[DKV_TOKEN_MAJOR] != 0u) {
            row = (b * p[3] + j) * kvh + kh;
        }
        store_dk(row * p[8], c, dk_quad);
        store_dv(row * p[8], c, dv_quad);
    }
}
