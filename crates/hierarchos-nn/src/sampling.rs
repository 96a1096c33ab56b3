//! Choosing the next token from a row of logits, with the logits processors of transformers applied in its order
//! (repetition penalty, then temperature, top-k, top-p, min-p) and a seeded host RNG, so a seed reproduces a
//! generation on any device.

use crate::error::{Error, Result};

/// How the next token is chosen. The default is greedy decoding.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingConfig {
    /// Softmax temperature; 0 means greedy (argmax).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0: off).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p` (1: off).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one (0: off).
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of tokens already in the sequence by this (1: off).
    pub repetition_penalty: f32,
    /// Seed of the sampling RNG.
    pub seed: u64,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        SamplingConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            seed: 0,
        }
    }
}

impl SamplingConfig {
    /// Rejects settings transformers rejects too, before any work is done.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str, v: f32| Err(Error::Invalid(format!("sampling: {what} {v} out of range")));
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad("temperature (>= 0)", self.temperature);
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return bad("top_p (0..=1)", self.top_p);
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p (0..=1)", self.min_p);
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return bad("repetition_penalty (> 0)", self.repetition_penalty);
        }
        Ok(())
    }

    /// Whether tokens are drawn at random (otherwise the argmax is taken).
    pub fn is_sampling(&self) -> bool {
        self.temperature > 0.0
    }
}

/// SplitMix64: tiny, fast and the same on every platform, which is all reproducible sampling needs.
#[derive(Clone, Debug)]
pub(crate) struct SplitMix64(pub(crate) u64);

impl SplitMix64 {
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 53 random bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Picks tokens one at a time; holds the RNG so that a seed fixes the whole sequence of draws.
#[derive(Clone, Debug)]
pub struct Sampler {
    config: SamplingConfig,
    rng: SplitMix64,
}

impl Sampler {
    /// A sampler for `config` (validated here), its RNG seeded with `config.seed`.
    pub fn new(config: SamplingConfig) -> Result<Sampler> {
        config.validate()?;
        let rng = SplitMix64(config.seed);
        Ok(Sampler { config, rng })
    }

    /// The settings.
    pub fn config(&self) -> &SamplingConfig {
        &self.config
    }

    /// Applies the configured processors to `logits` in transformers' order; `history` is every id of the
    /// sequence so far (prompt included), as transformers' repetition penalty sees it. Greedy decoding only
    /// applies the repetition penalty, as transformers does without `do_sample`.
    pub fn process(&self, logits: &mut [f32], history: &[u32]) {
        let c = &self.config;
        if c.repetition_penalty != 1.0 {
            apply_repetition_penalty(logits, history, c.repetition_penalty);
        }
        if !c.is_sampling() {
            return;
        }
        if c.temperature != 1.0 {
            apply_temperature(logits, c.temperature);
        }
        if c.top_k != 0 {
            apply_top_k(logits, c.top_k);
        }
        if c.top_p < 1.0 {
            apply_top_p(logits, c.top_p);
        }
        if c.min_p > 0.0 {
            apply_min_p(logits, c.min_p);
        }
    }

    /// The next token after `history` given the model's `logits` for it.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<u32> {
        if logits.is_empty() {
            return Err(Error::Invalid("sampling: empty logits".into()));
        }
        if let Some(i) = logits.iter().position(|x| x.is_nan()) {
            return Err(Error::Invalid(format!(
                "sampling: the model produced NaN logits (vocabulary entry {i} first)"
            )));
        }
        let mut scores = logits.to_vec();
        self.process(&mut scores, history);
        if self.config.is_sampling() && scores.contains(&f32::INFINITY) {
            // transformers fails here too (its probabilities come out NaN): the draw has no distribution.
            return Err(Error::Invalid(format!(
                "sampling: temperature {} scales the logits past f32's range (temperature 0 decodes greedily)",
                self.config.temperature
            )));
        }
        let id = if self.config.is_sampling() {
            self.draw(&scores)
        } else {
            argmax(&scores)
        };
        Ok(id as u32)
    }

    /// A draw from `softmax(scores)`, like `torch.multinomial` (masked tokens have probability 0).
    fn draw(&mut self, scores: &[f32]) -> usize {
        let probs = softmax(scores);
        let u = self.rng.next_f64();
        let mut acc = 0.0;
        let mut last = argmax(scores);
        for (i, &p) in probs.iter().enumerate() {
            if p > 0.0 {
                acc += p;
                last = i;
                if u < acc {
                    return i;
                }
            }
        }
        last
    }
}

/// The first index of the largest value, as `torch.argmax` breaks ties; a NaN counts as the largest (as in torch
/// and in `Tensor::argmax`, so greedy decoding picks the same token on the host and on the GPU).
pub fn argmax(scores: &[f32]) -> usize {
    if let Some(nan) = scores.iter().position(|x| x.is_nan()) {
        return nan;
    }
    let mut best = 0;
    for (i, &x) in scores.iter().enumerate() {
        if x > scores[best] {
            best = i;
        }
    }
    best
}

/// Softmax in f64; `-inf` entries get probability 0.
pub fn softmax(scores: &[f32]) -> Vec<f64> {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let exps: Vec<f64> = scores.iter().map(|&x| (x as f64 - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

/// transformers' `RepetitionPenaltyLogitsProcessor`: each distinct id of `history` once, negative logits
/// multiplied and positive ones divided by `penalty`, so the penalty always makes a seen token less likely.
pub fn apply_repetition_penalty(logits: &mut [f32], history: &[u32], penalty: f32) {
    let mut seen = vec![false; logits.len()];
    for &id in history {
        let i = id as usize;
        if i < logits.len() && !seen[i] {
            seen[i] = true;
            let x = logits[i];
            logits[i] = if x < 0.0 { x * penalty } else { x / penalty };
        }
    }
}

/// transformers' `TemperatureLogitsWarper`.
pub fn apply_temperature(logits: &mut [f32], temperature: f32) {
    for x in logits {
        *x /= temperature;
    }
}

/// transformers' `TopKLogitsWarper`: everything below the k-th largest logit is masked (ties with it stay).
pub fn apply_top_k(logits: &mut [f32], k: usize) {
    let k = k.clamp(1, logits.len().max(1));
    if k >= logits.len() {
        return;
    }
    let mut sorted = logits.to_vec();
    sorted.sort_unstable_by(|a, b| b.total_cmp(a));
    let kth = sorted[k - 1];
    for x in logits {
        if *x < kth {
            *x = f32::NEG_INFINITY;
        }
    }
}

/// Indices of `logits` from the smallest logit to the largest; ties keep index order.
fn ascending(logits: &[f32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[a].total_cmp(&logits[b]));
    order
}

/// transformers' `TopPLogitsWarper`: going up from the least likely token, mask tokens while their cumulative
/// probability stays at or below `1 - top_p`; the most likely token always stays.
pub fn apply_top_p(logits: &mut [f32], top_p: f32) {
    let order = ascending(logits);
    let probs = softmax(logits);
    let threshold = 1.0 - top_p as f64;
    let mut cumulative = 0.0;
    for &i in &order[..order.len().saturating_sub(1)] {
        cumulative += probs[i];
        if cumulative > threshold {
            break;
        }
        logits[i] = f32::NEG_INFINITY;
    }
}

/// transformers' `MinPLogitsWarper`: mask tokens whose probability is below `min_p` times the largest one.
pub fn apply_min_p(logits: &mut [f32], min_p: f32) {
    let probs = softmax(logits);
    let top = probs.iter().copied().fold(0.0, f64::max);
    let cutoff = min_p as f64 * top;
    let keep = argmax(logits);
    for (i, x) in logits.iter_mut().enumerate() {
        if probs[i] < cutoff && i != keep {
            *x = f32::NEG_INFINITY;
        }
    }
}
