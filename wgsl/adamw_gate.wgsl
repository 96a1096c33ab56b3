// Gradient clipping read on the device for adamw.wgsl (ops/adamw.rs, `ClipGate`): gate[p[2]..] = [loss,
// squared norm of the gradients as they are]. Every gradient is multiplied by its tensor's host factor (word 12,
// the inverse of a loss scale, or 1) times clip_grad_norm_'s factor max_norm / (norm + 1e-6), at most 1, for the
// unscaled norm, in f32 as PyTorch computes it; p[1] holds max_norm (0: no clipping). Nothing is updated unless
// the loss and the norm are finite.

@group(0) @binding(1) var<storage, read> gate: array<f32>;

// Tested on the bits: compilers may fold comparisons of a value with itself.
fn finite(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u;
}

fn grad_factor(t: u32) -> f32 {
    let unscale = scalar(t, 12u);
    let max_norm = bitcast<f32>(p[1]);
    let norm = sqrt(gate[p[2] + 1u]) * unscale;
    let clip = select(1.0, min(1.0, max_norm / (norm + 1e-6)), max_norm > 0.0);
    return clip * unscale;
}

fn live() -> bool {
    return finite(gate[p[2]]) && finite(gate[p[2] + 1u]);
}
