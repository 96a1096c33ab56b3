//! `hierarchos generate`: text (or ids) in, tokens streamed to stdout as they are chosen, speed on stderr.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use hierarchos_core::default_device;
use hierarchos_nn::SamplingConfig;

/// The model, the prompt and how to sample.
#[derive(clap::Args)]
pub struct GenerateArgs {
    /// Model folder or Hugging Face Hub id.
    #[arg(short, long)]
    pub model: String,
    /// Hub revision (branch, tag or commit) when MODEL is a Hub id.
    #[arg(long)]
    pub revision: Option<String>,
    /// A PEFT LoRA adapter folder to apply (`adapter_config.json`, `adapter_model.safetensors`).
    #[arg(long)]
    pub adapter: Option<PathBuf>,
    /// Prompt text.
    #[arg(short, long, required_unless_present = "ids", conflicts_with = "ids")]
    pub prompt: Option<String>,
    /// Prompt token ids, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub ids: Vec<u32>,
    /// Most new tokens to generate.
    #[arg(short = 'n', long, default_value_t = 64, allow_negative_numbers = true)]
    pub max_new_tokens: usize,
    /// Sampling temperature; 0 is greedy. Each setting left out is the model's generation_config.json's, as
    /// transformers' generate() takes it (greedy without one); a filter below on a greedy model samples at 1.
    #[arg(long, allow_negative_numbers = true)]
    pub temperature: Option<f32>,
    /// Sample among the K most likely tokens only (0: all).
    #[arg(long, allow_negative_numbers = true)]
    pub top_k: Option<usize>,
    /// Sample among the most likely tokens that make up probability P.
    #[arg(long, allow_negative_numbers = true)]
    pub top_p: Option<f32>,
    /// Drop tokens less likely than P times the most likely one.
    #[arg(long, allow_negative_numbers = true)]
    pub min_p: Option<f32>,
    /// Penalty on tokens already in the sequence (1 is none; transformers' repetition_penalty).
    #[arg(long, allow_negative_numbers = true)]
    pub repetition_penalty: Option<f32>,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Send the prompt as a user message through the model's chat template.
    #[arg(long, requires = "prompt")]
    pub chat: bool,
    /// Stop once the generated text contains STR (repeatable).
    #[arg(long, value_name = "STR")]
    pub stop: Vec<String>,
    /// End with one JSON line holding the generated `ids` and `text`.
    #[arg(long)]
    pub json: bool,
}

impl GenerateArgs {
    /// The settings given, the model's `defaults` for the others.
    fn sampling(&self, defaults: &SamplingConfig) -> SamplingConfig {
        let filtered = self.top_k.is_some() || self.top_p.is_some() || self.min_p.is_some();
        let temperature = match self.temperature {
            Some(t) => t,
            None if filtered && !defaults.is_sampling() => 1.0,
            None => defaults.temperature,
        };
        SamplingConfig {
            temperature,
            top_k: self.top_k.unwrap_or(defaults.top_k),
            top_p: self.top_p.unwrap_or(defaults.top_p),
            min_p: self.min_p.unwrap_or(defaults.min_p),
            repetition_penalty: self.repetition_penalty.unwrap_or(defaults.repetition_penalty),
            seed: self.seed,
        }
    }
}

pub fn run(args: &GenerateArgs) -> Result<()> {
    // The flags alone first, so that a bad one is refused before the model loads.
    args.sampling(&SamplingConfig::default()).validate()?;
    let device = default_device().context("opening the default GPU")?;
    let model = crate::load_model(&args.model, args.revision.as_deref(), args.adapter.as_deref(), &device)?;
    let sampling = args.sampling(&model.sampling);
    sampling.validate()?;
    let prompt_ids = match &args.prompt {
        Some(text) => model.encode_prompt(text, args.chat)?,
        None => args.ids.clone(),
    };
    let has_tokenizer = model.tokenizer.is_some();
    let mut out = std::io::stdout().lock();
    let generation = model.generate(&prompt_ids, args.max_new_tokens, &sampling, &args.stop, |id, text| {
        // Without a tokenizer the ids themselves are the stream.
        let written = if has_tokenizer {
            write!(out, "{text}")
        } else {
            write!(out, "{id} ")
        };
        written
            .and_then(|()| out.flush())
            .map_err(|e| hierarchos_nn::Error::Invalid(format!("stdout: {e}")))
    })?;
    writeln!(out)?;
    if args.json {
        let text = has_tokenizer.then_some(&generation.text);
        let json = serde_json::json!({
            "ids": generation.ids,
            "text": text,
            "prompt_ids": prompt_ids,
            "stop_reason": generation.stop_reason.as_str(),
            "prefill_tokens_per_s": generation.prefill_tokens_per_sec(),
            "decode_tokens_per_s": generation.decode_tokens_per_sec(),
        });
        writeln!(out, "{json}")?;
    }
    out.flush()?;
    eprintln!(
        "prompt: {} tokens, {:.1} tokens/s; generated: {} tokens, {:.1} tokens/s ({})",
        generation.prompt_tokens,
        generation.prefill_tokens_per_sec(),
        generation.ids.len(),
        generation.decode_tokens_per_sec(),
        generation.stop_reason.as_str()
    );
    Ok(())
}
