// The key/value tiles of the forward kernels (ops/flash_attention.rs): BC keys of key/value
// head kh staged in workgroup memory, zeros past the keys any row of the workgroup sees.

var<workgroup> ks: array<vec4<f32>, BC * D4>;
var<workgroup> vs: array<vec4<f32>, BC * D4>;

// Stages keys j0..j0 + BC (those before `end`) of batch b, head kh, and keeps those in `keep` for the backward
// (keep_key: rotary embeddings); every thread of the workgroup (THREADS) calls it.
fn stage_keys(lid: u32, j0: u32, end: u32, b: u32, kh: u32, keep: vec2<u32>) {
    workgroupBarrier();
    for (var i = lid; i < BC * D4; i = i + THREADS) {
        let j = j0 + i / D4;
        let c = i % D4;
        var kq = vec4<f32>(0.0);
        var vq = vec4<f32>(0.0);
        if (j < end) {
            kq = key_quad(b, kh, j, c);
            vq = load_v(view_base(V_AT, b, kh, j), c);
            if (within(j, keep)) {
                keep_key(b, kh, j, c, kq, vq);
            }
        }
        ks[i] = kq;
        vs[i] = vq;
    }
    workgroupBarrier();
}
