// Dynamic loss scaling's bookkeeping on the device (ops/loss_scale.rs), as PyTorch's GradScaler.update: after a
// step whose loss is finite, a non-finite squared gradient norm halves the scale and restarts the count of good
// steps; a finite one counts a good step, and the growth interval's good step in a row doubles the scale and
// restarts the count. A non-finite loss changes nothing (the run stops there). Halving and doubling are exact,
// and the scale stays within 2^-126..2^126 (`LossScale` in hierarchos-nn), so that the inverse kept beside it
// is an exact normal f32 too (torch stops only at infinity). The Rust side prepends finite.wgsl.
//
// state[p[0]..] = [scale, 1 / scale, good steps]; stats[p[1]..] = [loss, squared gradient norm].
// Parameters: [state offset, statistics offset, growth interval].

@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> state: array<f32>;
@group(0) @binding(2) var<storage, read> stats: array<f32>;

@compute @workgroup_size(1)
fn main() {
    let at = p[0];
    if (!finite(stats[p[1]])) {
        return;
    }
    // (factor, its inverse): multiplications only, which WGSL keeps exact where its division need not be.
    var factor = vec2<f32>(1.0, 1.0);
    var good = 0.0;
    if (!finite(stats[p[1] + 1u])) {
        if (state[at] > 0x1p-126f) {
            factor = vec2<f32>(0.5, 2.0);
        }
    } else {
        good = state[at + 2u] + 1.0;
        if (good >= f32(p[2])) {
            if (state[at] < 0x1p126f) {
                factor = vec2<f32>(2.0, 0.5);
            }
            good = 0.0;
        }
    }
    state[at] = state[at] * factor.x;
    state[at + 1u] = state[at + 1u] * factor.y;
    state[at + 2u] = good;
}
