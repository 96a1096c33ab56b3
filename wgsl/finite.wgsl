// Whether an f32 is finite, tested on its exponent bits: WGSL lets compilers assume values are finite and fold
// comparisons of a value with itself, so `x == x` or `abs(x) < inf` may not catch NaN or infinity.
fn finite(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u;
}
