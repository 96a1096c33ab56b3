// Gradient clipping read on the device for adamw.wgsl (ops/adamw.rs, `ClipGate`): gate[p[2]..] = [loss,
// squared norm of the gradients as they are], and with SCALED the inverse of the loss scale they were computed
// at. Every gradient is multiplied by its tensor's host factor (word 12, the inverse of a loss scale, or 1), by
// that inverse (SCALED), and by clip_grad_norm_'s factor max_norm / (norm + 1e-6), at most 1, for the unscaled
// norm, in f32 as PyTorch computes it; p[1] holds max_norm (0: no clipping). Nothing is updated unless the loss
// and the norm are finite. The Rust side defines SCALED and prepends finite.wgsl.

@group(0) @binding(1) var<storage, read> gate: array<f32>;

fn grad_factor(t: u32) -> f32 {
    var unscale = scalar(t, 12u);
    if (SCALED) {
        unscale = unscale * gate[p[2] + 2u];
    }
    let max_norm = bitcast<f32>(p[1]);
    let norm = sqrt(gate[p[2] + 1u]) * unscale;
    let clip = select(1.0, min(1.0, max_norm / (norm + 1e-6)), max_norm > 0.0);
    return clip * unscale;
}

fn live() -> bool {
    return finite(gate[p[2]]) && finite(gate[p[2] + 1u]);
}
