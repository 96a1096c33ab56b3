//! Autoregressive generation: one prefill over the prompt, then one cached forward per new token, each token
//! chosen on the host by a [`Sampler`] and handed to a callback as soon as it is known (for streaming).

use std::time::Instant;

use hierarchos_core::{Tensor, no_grad};

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

/// Logits of the last position after feeding `ids` (continuing `cache`), on the host.
fn next_logits(lm: &CausalLm, ids: &[u32], cache: &mut KvCache) -> Result<Vec<f32>> {
    let ids = Tensor::from_slice(ids, &[1, ids.len()], lm.device())?;
    let logits = no_grad(|| lm.forward_last(&ids, Some(cache)))?;
    Ok(logits.to_vec::<f32>()?)
}

/// Generates up to `max_new_tokens` after `prompt_ids`, calling `on_token(id, text)` for each token as it is
/// chosen; `text` is the new complete text it adds (possibly empty: a character split over tokens waits for
/// the rest). An error from the callback stops generation and is returned.
pub fn generate(
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
    let mut sampler = Sampler::new(sampling.clone())?;
    let mut cache = lm.new_cache(1, prompt_ids.len() + max_new_tokens)?;
    let mut stream = stop.tokenizer.map(|t| t.decode_stream(true));
    let mut history = prompt_ids.to_vec();
    let mut ids = Vec::with_capacity(max_new_tokens);
    let mut text = String::new();

    let start = Instant::now();
    let mut logits = next_logits(lm, prompt_ids, &mut cache)?;
    let prefill_secs = start.elapsed().as_secs_f64();
    let decode_start = Instant::now();
    let stop_reason = loop {
        if ids.len() == max_new_tokens {
            break StopReason::Length;
        }
        let id = sampler.sample(&logits, &history)?;
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
            logits = next_logits(lm, &[id], &mut cache)?;
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
