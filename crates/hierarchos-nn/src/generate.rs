//! Autoregressive generation: one prefill over the prompt, then one cached forward per new token, each token
//! handed to a callback as soon as it is known (for streaming). Sampled tokens are chosen on the host by a
//! [`Sampler`]; greedy ones on the GPU, read one step behind (see `Chooser`).

use std::collections::VecDeque;

use web_time::Instant;

use hierarchos_core::{DType, PendingVec, Tensor, no_grad};

use crate::error::{Error, Result};
use crate::sampling::{Sampler, SamplingConfig};
use crate::tokenizer::Tokenizer;
use crate::{CausalLm, KvCache};

/// When generation ends before `max_new_tokens`.
#[derive(Clone, Debug, Default)]
pub struct StopConditions<'a> {
    /// End-of-sequence ids; the one generated is kept in the output, as transformers keeps it.
    pub eos_ids: Vec<u32>,
    /// Stop once the generated text contains one of these (kept in the output, as transformers keeps it).
    pub stop_strings: Vec<String>,
    /// Decodes tokens for the callback's text and for `stop_strings`; without it the callback gets no text.
    pub tokenizer: Option<&'a Tokenizer>,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// `max_new_tokens` were generated.
    Length,
    /// An end-of-sequence id was generated.
    Eos,
    /// A stop string appeared in the text.
    StopString,
}

impl StopReason {
    /// A short lowercase name, for JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Length => "length",
            StopReason::Eos => "eos",
            StopReason::StopString => "stop_string",
        }
    }
}

/// The generated tokens and how long they took.
#[derive(Clone, Debug)]
pub struct Generation {
    /// The new ids (the prompt left out).
    pub ids: Vec<u32>,
    /// Their text with special tokens skipped (empty without a tokenizer).
    pub text: String,
    /// Why it ended.
    pub stop_reason: StopReason,
    /// Prompt length.
    pub prompt_tokens: usize,
    /// Seconds of the prompt's forward pass, up to its logits on the host.
    pub prefill_secs: f64,
    /// Seconds of the cached single-token steps after it.
    pub decode_secs: f64,
}

impl Generation {
    /// Prompt tokens per second of the prefill.
    pub fn prefill_tokens_per_sec(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_secs.max(f64::MIN_POSITIVE)
    }

    /// Tokens per second of the cached steps (the first new token comes from the prefill and is not counted).
    pub fn decode_tokens_per_sec(&self) -> f64 {
        self.ids.len().saturating_sub(1) as f64 / self.decode_secs.max(f64::MIN_POSITIVE)
    }
}

/// The byte offset where a stop string ends in `text`, looking only at matches that reach into `text[new_from..]`
/// (the text added by the last token), so that each step costs the length of the new text, not of all of it.
pub fn find_stop_string(text: &str, new_from: usize, stop_strings: &[String]) -> Option<usize> {
    stop_strings
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| {
            let mut from = new_from.min(text.len()).saturating_sub(s.len() - 1);
            while !text.is_char_boundary(from) {
                from -= 1;
            }
            text[from..].find(s.as_str()).map(|at| from + at + s.len())
        })
        .min()
}

/// Positions of generated tokens the cache first holds room for; it grows past them as generation goes on.
const FIRST_STRETCH: usize = 256;

/// Logits of the last position after feeding `ids` (continuing `cache`, grown to hold them), on the GPU.
fn next_logits(lm: &CausalLm, ids: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
    cache.reserve(ids.shape()[1])?;
    no_grad(|| lm.forward_last(ids, Some(cache)))
}

/// Where the next token comes from.
enum Chooser {
    /// The logits are read back and a [`Sampler`] picks the token on the host (sampling, repetition penalty).
    Host { sampler: Sampler, logits: Vec<f32> },
    /// Greedy decoding without a host-side processor: the argmax runs on the GPU and feeds the next step's
    /// embedding directly, and the host reads each token one step behind, so the GPU always has the next step
    /// queued instead of idling while the host reads, chooses and records (the same tokens as the host path).
    Gpu {
        /// The newest token, still on the GPU (`[1, 1]`).
        newest: Tensor,
        /// Tokens on their way to the host, oldest first, each as `[largest logit, id]` (the logit tells a NaN
        /// row, which the host path refuses too).
        pending: VecDeque<PendingVec<f32>>,
        /// Tokens whose step has been recorded (read or not).
        recorded: usize,
    },
}

/// The greedy token of `logits` (`[1, vocab]`) as a `[1, 1]` id tensor for the next step, and its copy to the
/// host as `[largest logit, id]` (ids below 2^24 are exact in f32).
fn greedy_pick(logits: &Tensor) -> Result<(Tensor, PendingVec<f32>)> {
    let id = logits.argmax(-1, true)?;
    let pick = Tensor::cat(&[logits.max(&[-1], true)?, id.to_dtype(DType::F32)?], 1)?;
    Ok((id, pick.read_later()?))
}

impl Chooser {
    /// The host path where `host` asks for it (the GPU path feeds tokens the host has not read yet, so it cannot
    /// run the whole sequence again at a cache reset).
    async fn new(sampling: &SamplingConfig, logits: Tensor, host: bool) -> Result<Chooser> {
        let sampler = Sampler::new(sampling.clone())?;
        if host || sampling.is_sampling() || sampling.repetition_penalty != 1.0 {
            return Ok(Chooser::Host {
                sampler,
                logits: logits.to_vec_async().await?,
            });
        }
        let (newest, read) = greedy_pick(&logits)?;
        Ok(Chooser::Gpu {
            pending: VecDeque::from([read]),
            newest,
            recorded: 1,
        })
    }

    /// The next token; on the GPU path, first records the step after the newest token unless `limit` tokens are
    /// already under way.
    async fn next(&mut self, lm: &CausalLm, cache: &mut KvCache, history: &[u32], limit: usize) -> Result<u32> {
        match self {
            Chooser::Host { sampler, logits } => sampler.sample(logits, history),
            Chooser::Gpu {
                newest,
                pending,
                recorded,
            } => {
                if *recorded < limit {
                    let (id, read) = greedy_pick(&next_logits(lm, newest, cache)?)?;
                    *newest = id;
                    pending.push_back(read);
                    *recorded += 1;
                }
                let pick = pending
                    .pop_front()
                    .expect("a token is always under way")
                    .wait_async()
                    .await?;
                if pick[0].is_nan() {
                    return Err(Error::Invalid(format!(
                        "generate: the model produced NaN logits at position {}",
                        history.len()
                    )));
                }
                Ok(pick[1] as u32)
            }
        }
    }

    /// After the last token of `history` was accepted and more are wanted: the host path computes the logits
    /// that follow it (the GPU path already did), over the whole sequence again where the model resets its cache
    /// at this length ([`crate::ModelConfig::cache_reset_length`]).
    async fn advance(&mut self, lm: &CausalLm, cache: &mut KvCache, history: &[u32]) -> Result<()> {
        if let Chooser::Host { logits, .. } = self {
            let reset = lm.config().cache_reset_length();
            let feed = if reset.is_some_and(|at| history.len() >= at && cache.len() < at) {
                cache.truncate(0);
                history
            } else {
                &history[history.len() - 1..]
            };
            let ids = Tensor::from_slice(feed, &[1, feed.len()], lm.device())?;
            *logits = next_logits(lm, &ids, cache)?.to_vec_async().await?;
        }
        Ok(())
    }

    /// Waits until the prefill's result has reached the host (when no token was asked for, so that its time is
    /// measured).
    async fn settle(self) -> Result<()> {
        if let Chooser::Gpu { pending, .. } = self {
            for read in pending {
                read.wait_async().await?;
            }
        }
        Ok(())
    }
}

/// Generates up to `max_new_tokens` after `prompt_ids`, calling `on_token(id, text)` for each token as it is
/// chosen; `text` is the new complete text it adds (possibly empty: a character split over tokens waits for
/// the rest). An error from the callback stops generation and is returned.
#[cfg(not(target_arch = "wasm32"))]
pub fn generate(
    lm: &CausalLm,
    prompt_ids: &[u32],
    max_new_tokens: usize,
    sampling: &SamplingConfig,
    stop: &StopConditions<'_>,
    on_token: impl FnMut(u32, &str) -> Result<()>,
) -> Result<Generation> {
    pollster::block_on(generate_async(lm, prompt_ids, max_new_tokens, sampling, stop, on_token))
}

/// [`generate()`] without blocking (the web's way): it yields while each token is read back.
pub async fn generate_async(
    lm: &CausalLm,
    prompt_ids: &[u32],
    max_new_tokens: usize,
    sampling: &SamplingConfig,
    stop: &StopConditions<'_>,
    mut on_token: impl FnMut(u32, &str) -> Result<()>,
) -> Result<Generation> {
    if prompt_ids.is_empty() {
        return Err(Error::Invalid("generate: the prompt has no tokens".into()));
    }
    if !stop.stop_strings.is_empty() && stop.tokenizer.is_none() {
        return Err(Error::Invalid("generate: stop strings need a tokenizer".into()));
    }
    let vocab = lm.config().vocab_size;
    if let Some(&bad) = prompt_ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(Error::Invalid(format!(
            "generate: prompt id {bad} is outside the vocabulary of {vocab}"
        )));
    }
    sampling.validate()?;
    if let Some(positions) = &lm.embed_positions {
        let table = positions.weight.shape()[0].saturating_sub(lm.config().position_offset);
        if prompt_ids.len().checked_add(max_new_tokens).is_none_or(|n| n > table) {
            return Err(Error::Invalid(format!(
                "generate: {} prompt and {max_new_tokens} new tokens pass the model's {table} positions",
                prompt_ids.len()
            )));
        }
    }
    let mut cache = lm.new_cache(1, prompt_ids.len() + max_new_tokens.min(FIRST_STRETCH))?;
    let mut stream = stop.tokenizer.map(|t| t.decode_stream(true));
    let mut history = prompt_ids.to_vec();
    let mut ids = Vec::with_capacity(max_new_tokens.min(FIRST_STRETCH));
    let mut text = String::new();

    let start = Instant::now();
    let prompt = Tensor::from_slice(prompt_ids, &[1, prompt_ids.len()], lm.device())?;
    let resets = lm
        .config()
        .cache_reset_length()
        .is_some_and(|at| prompt_ids.len() < at && prompt_ids.len().saturating_add(max_new_tokens) > at);
    let mut chooser = Chooser::new(sampling, next_logits(lm, &prompt, &mut cache)?, resets).await?;
    // The prefill ends when its token reaches the host.
    let mut prefill_secs = None;
    let mut decode_start = Instant::now();
    let stop_reason = loop {
        if ids.len() == max_new_tokens {
            break StopReason::Length;
        }
        let id = chooser.next(lm, &mut cache, &history, max_new_tokens).await?;
        if prefill_secs.is_none() {
            prefill_secs = Some(start.elapsed().as_secs_f64());
            decode_start = Instant::now();
        }
        ids.push(id);
        history.push(id);
        let new_from = text.len();
        if let Some(stream) = stream.as_mut()
            && let Some(piece) = stream.step(id)?
        {
            text.push_str(&piece);
        }
        on_token(id, &text[new_from..])?;
        if stop.eos_ids.contains(&id) {
            break StopReason::Eos;
        }
        if find_stop_string(&text, new_from, &stop.stop_strings).is_some() {
            break StopReason::StopString;
        }
        if ids.len() < max_new_tokens {
            chooser.advance(lm, &mut cache, &history).await?;
        }
    };
    let prefill_secs = match prefill_secs {
        Some(secs) => secs,
        // No token was asked for: the prefill was only recorded so far.
        None => {
            chooser.settle().await?;
            start.elapsed().as_secs_f64()
        }
    };
    let decode_secs = decode_start.elapsed().as_secs_f64();
    if let Some(tokenizer) = stop.tokenizer {
        text = tokenizer.decode(&ids, true)?;
    }
    Ok(Generation {
        ids,
        text,
        stop_reason,
        prompt_tokens: prompt_ids.len(),
        prefill_secs,
        decode_secs,
    })
}
