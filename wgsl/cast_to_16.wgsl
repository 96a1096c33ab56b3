// Dense f32 to f16 or bf16 (ops/cast.rs), the casts of mixed-precision training: eight elements per thread, read
// as two vec4s and written as one vec4 of four words holding two 16-bit values each (the byte layout of both a
// native f16 array and a packed one). Rounding is `round16`, defined by the Rust side as exact round to nearest
// even (f32_to_f16 or f32_to_bf16), as the elementwise cast rounds.
//
// Parameters (u32 words): [groups of eight elements, input offset in vec4s].

@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;

fn pair(lo: f32, hi: f32) -> u32 {
    return (round16(lo) & 0xffffu) | (round16(hi) << 16u);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = (wid.x + wid.y * nwg.x) * 256u + lid;
    if (g >= p[0]) {
        return;
    }
    let a = x[p[1] + 2u * g];
    let b = x[p[1] + 2u * g + 1u];
    out[g] = vec4<u32>(pair(a.x, a.y), pair(a.z, a.w), pair(b.x, b.y), pair(b.z, b.w));
}
