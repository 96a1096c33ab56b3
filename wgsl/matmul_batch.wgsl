// Shared by the matmul kernels. Parameters: [M, N, K, batch, batch_rank, a_offset, a_stride_m, a_stride_k,
// b_offset, b_stride_k, b_stride_n, batch_shape[6], a_batch_strides[6], b_batch_strides[6]].

// Buffer offsets of batch entry `batch` in the left (x) and right (y) operands.
fn batch_bases(batch: u32) -> vec2<u32> {
    var a = p[5];
    var b = p[8];
    var rest = batch;
    for (var d = i32(p[4]) - 1; d >= 0; d = d - 1) {
        let n = p[11u + u32(d)];
        let i = rest % n;
        rest = rest / n;
        a = a + i * p[17u + u32(d)];
        b = b + i * p[23u + u32(d)];
    }
    return vec2<u32>(a, b);
}
