//! ALiBi (attention with linear biases): BLOOM's and Falcon-RW's position information, a per-head bias of each
//! score linear in the key's position, in place of rotary embeddings. transformers' two copies of
//! `build_alibi_tensor` compute the same slopes but round and add the biases differently.

/// ALiBi's slope of each of `heads` heads: the powers 1, 2, ... of `2^(-8 / n)` for the largest power of two
/// `n <= heads`, then the odd powers of `2^(-4 / n)` for the rest. Correctly rounded to f32; torch's f32 `pow`
/// is a unit in the last place off for some (one slope of 32 heads, for one), which moves BLOOM's biases by
/// about position x 1e-8 and Falcon's, rounded to bf16, not at all.
pub fn alibi_slopes(heads: usize) -> Vec<f32> {
    let closest = 1usize << heads.max(1).ilog2();
    let base = |n: usize| 2f64.powf(-(2f64.powf(-((n as f64).log2() - 3.0)))) as f32;
    let power = |b: f32, k: usize| (b as f64).powi(k as i32) as f32;
    let first = (1..=closest).map(|k| power(base(closest), k));
    let extra = (0..heads - closest.min(heads)).map(|i| power(base(2 * closest), 2 * i + 1));
    first.chain(extra).take(heads).collect()
}

/// How a family forms and adds ALiBi's biases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alibi {
    /// BLOOM: the slope times the position in f32, added to the scaled scores.
    Bloom,
    /// Falcon: the bf16 slope times the position cast to bf16, rounded to bf16, added to the scores before the
    /// score scale (so scaled with them).
    Falcon,
}

impl Alibi {
    /// The bias of a key at position `pos` for a head of slope `slope` (from [`alibi_slopes`]), on the scale of
    /// scores that carry the score scale `score_scale`.
    pub fn bias(self, slope: f32, pos: usize, score_scale: f64) -> f32 {
        match self {
            Alibi::Bloom => slope * pos as f32,
            Alibi::Falcon => {
                let bias = bf16_round(bf16_round(slope) * bf16_round(pos as f32));
                (bias as f64 * score_scale) as f32
            }
        }
    }
}

/// `x` rounded to the nearest bf16 (ties to even), as an f32; NaN stays NaN.
fn bf16_round(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let b = x.to_bits();
    f32::from_bits(b.wrapping_add(0x7fff + ((b >> 16) & 1)) & 0xffff_0000)
}
