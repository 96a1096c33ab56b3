// One AdamW step over a parameter tensor (ops/adamw.rs), in the order of torch.optim.AdamW's single-tensor
// update so that f32 results round like PyTorch's:
//   x <- x * (1 - lr * wd)
//   m <- m + (g - m) * (1 - beta1)            (lerp)
//   v <- v * beta2 + (1 - beta2) * g * g
//   x <- x - step_size * m / (sqrt(v) / sqrt(1 - beta2^t) + eps),   step_size = lr / (1 - beta1^t)
// where g is the gradient times the step's gradient scale (gradient clipping's factor, as clip_grad_norm_ scales
// the gradients before the step). The step's scalars are computed on the host in f64 and passed as f32 bits. Each
// thread updates W elements: the Rust side defines `alias V` (f32, or vec4<f32> when the length and every offset
// are multiples of 4: wider loads, the same arithmetic per element) and W.
//
// Parameters (u32 words): [n, param offset, grad offset, m offset, v offset, decay, 1 - beta1, beta2, 1 - beta2,
// step_size, sqrt(1 - beta2^t), eps, gradient scale].

@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> param: array<V>;
@group(0) @binding(2) var<storage, read> grad: array<V>;
@group(0) @binding(3) var<storage, read_write> m: array<V>;
@group(0) @binding(4) var<storage, read_write> v: array<V>;

fn scalar(k: u32) -> f32 {
    return bitcast<f32>(p[k]);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + lid;
    if (i >= p[0] / W) {
        return;
    }
    let xi = p[1] / W + i;
    let gi = p[2] / W + i;
    let mi = p[3] / W + i;
    let vi = p[4] / W + i;
    let g = grad[gi] * scalar(12u);
    let x = param[xi] * scalar(5u);
    let m1 = m[mi] + (g - m[mi]) * scalar(6u);
    let v1 = v[vi] * scalar(7u) + scalar(8u) * (g * g);
    m[mi] = m1;
    v[vi] = v1;
    let denom = sqrt(v1) / scalar(10u) + scalar(11u);
    param[xi] = x - scalar(9u) * (m1 / denom);
}
