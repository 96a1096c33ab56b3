// The backward of the gated activation act(x) * u over f32 rows read as quads (ops/unary.rs, `gated`): both
// gradients side by side in one [rows, 2n] tensor, the layout of the stacked gate/up product whose halves x and u
// are. One thread per quad of four columns writes a quad of each: the elementwise kernel computes one output
// element per thread, so it would read x twice. The arithmetic is the elementwise kernel's: d/dx is act's
// backward rule fed with g * u, d/du is g * act(x).
//
// The Rust side prepends the bindings (out, x, u, g), `act(x)` and `act_grad(x, g)`. Parameters (u32 words,
// offsets and strides in quads): [rows, quads a row, x offset, x row stride, u offset, u row stride, g offset,
// g row stride].

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let q = (wid.x + wid.y * nwg.x) * 256u + lid;
    let width = p[1];
    if (q >= p[0] * width) {
        return;
    }
    let r = q / width;
    let c = q % width;
    let x = xs[p[2] + r * p[3] + c];
    let u = us[p[4] + r * p[5] + c];
    let g = gs[p[6] + r * p[7] + c];
    let gu = g * u;
    let out_row = r * 2u * width + c;
    out[out_row] = vec4<f32>(act_grad(x.x, gu.x), act_grad(x.y, gu.y), act_grad(x.z, gu.z), act_grad(x.w, gu.w));
    out[out_row + width] = g * vec4<f32>(act(x.x), act(x.y), act(x.z), act(x.w));
}
