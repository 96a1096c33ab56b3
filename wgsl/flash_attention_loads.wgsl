// How the flash-attention kernels (ops/flash_attention.rs) read query and key rows as they are: every kernel
// without rotary embeddings, and the backward with them (which reads the rows its forward kept rotated).

// Quad c of query row t of batch b, head h.
fn query_quad(b: u32, h: u32, t: u32, c: u32) -> vec4<f32> {
    return load_q(view_base(Q_AT, b, h, t), c);
}

// Quad c of key row j of batch b, key/value head kh.
fn key_quad(b: u32, kh: u32, j: u32, c: u32) -> vec4<f32> {
    return load_k(view_base(K_AT, b, kh, j), c);
}
