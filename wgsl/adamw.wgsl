// One AdamW step over several parameter tensors in one launch (ops/adamw.rs), in the order of
// torch.optim.AdamW's single-tensor update so that f32 results round like PyTorch's:
//   x <- x * (1 - lr * wd)
//   m <- m + (g - m) * (1 - beta1)            (lerp)
//   v <- v * beta2 + (1 - beta2) * g * g
//   x <- x - step_size * m / (sqrt(v) / sqrt(1 - beta2^t) + eps),   step_size = lr / (1 - beta1^t)
// where g is the gradient times the step's gradient scale (gradient clipping's factor, as clip_grad_norm_ scales
// the gradients before the step): the host's, or with it clipping's from the step's gradient norm on the device
// (`grad_factor` and `live`, which the Rust side defines: adamw_gate.wgsl). The step's other scalars are computed
// on the host in f64 and passed as f32 bits.
// Workgroup w updates 256 W elements of the tensor whose range of workgroups holds it, W per thread. The Rust side
// defines `alias V` (f32, or vec4<f32> when every length and offset of the launch is a multiple of 4: wider loads,
// the same arithmetic per element), W, the bindings param<t>, grad<t>, m<t>, v<t> and `update(t, i)`,
// which runs `adamw` on element i of tensor t of the launch.
//
// Parameters (u32 words): [tensors, largest gradient norm (f32 bits, 0: no clipping), the gate's element offset,
// then WORDS per tensor: n, param offset, grad offset, m offset, v offset,
// decay, 1 - beta1, beta2, 1 - beta2, step_size, sqrt(1 - beta2^t), eps, gradient scale, first workgroup].

const WORDS: u32 = 14u;

fn word(t: u32, k: u32) -> u32 {
    return p[3u + WORDS * t + k];
}

fn scalar(t: u32, k: u32) -> f32 {
    return bitcast<f32>(word(t, k));
}

struct Moved {
    x: V,
    m: V,
    v: V,
}

fn adamw(t: u32, x0: V, g0: V, m0: V, v0: V) -> Moved {
    let g = g0 * grad_factor(t);
    let x = x0 * scalar(t, 5u);
    let m = m0 + (g - m0) * scalar(t, 6u);
    let v = v0 * scalar(t, 7u) + scalar(t, 8u) * (g * g);
    let denom = sqrt(v) / scalar(t, 10u) + scalar(t, 11u);
    return Moved(x - scalar(t, 9u) * (m / denom), m, v);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let w = wid.x + wid.y * nwg.x;
    var t = 0u;
    for (var k = 1u; k < p[0]; k = k + 1u) {
        if (w >= word(k, 13u)) {
            t = k;
        }
    }
    let i = (w - word(t, 13u)) * 256u + lid;
    // Past the last tensor's workgroups (the grid may round up), i is past its end too.
    if (i >= word(t, 0u) / W || !live()) {
        return;
    }
    update(t, i);
}
