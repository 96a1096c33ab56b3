//! `hierarchos forward`: the logits of every position of one sequence, written as safetensors so that they can be
//! compared with another implementation's.

use std::path::PathBuf;

use anyhow::{Context, Result};
use hierarchos_core::{Tensor, default_device, no_grad};
use hierarchos_nn::Model;

/// The model and the sequence to run.
#[derive(clap::Args)]
pub struct ForwardArgs {
    /// Model folder or Hugging Face Hub id.
    #[arg(short, long)]
    pub model: String,
    /// Hub revision (branch, tag or commit) when MODEL is a Hub id.
    #[arg(long)]
    pub revision: Option<String>,
    /// A PEFT LoRA adapter folder to apply (`adapter_config.json`, `adapter_model.safetensors`).
    #[arg(long)]
    pub adapter: Option<PathBuf>,
    /// Token ids, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        required_unless_present = "text",
        conflicts_with = "text"
    )]
    pub ids: Vec<u32>,
    /// Text to tokenize (with the tokenizer's special tokens) instead of ids.
    #[arg(long)]
    pub text: Option<String>,
    /// Output file: tensor `logits`, f32, shape [T, vocab].
    #[arg(short, long)]
    pub output: PathBuf,
}

pub fn run(args: &ForwardArgs) -> Result<()> {
    let device = default_device().context("opening the default GPU")?;
    let model = crate::load_model(&args.model, args.revision.as_deref(), args.adapter.as_deref(), &device)?;
    let ids = match &args.text {
        Some(text) => model.tokenizer()?.encode(text, true)?,
        None => args.ids.clone(),
    };
    let logits = logits(&model, &ids)?;
    let vocab = model.config.vocab_size;
    hierarchos_nn::weights::save_f32(&args.output, &[("logits", &[ids.len(), vocab], &logits)])
        .with_context(|| format!("writing {}", args.output.display()))?;
    eprintln!("wrote logits [{}, {vocab}] to {}", ids.len(), args.output.display());
    Ok(())
}

/// Row-major `[T, vocab]` logits of one sequence.
fn logits(model: &Model, ids: &[u32]) -> Result<Vec<f32>> {
    anyhow::ensure!(!ids.is_empty(), "forward: no tokens to run");
    let vocab = model.config.vocab_size;
    if let Some(&bad) = ids.iter().find(|&&id| id as usize >= vocab) {
        anyhow::bail!("forward: token id {bad} is outside the vocabulary of {vocab}");
    }
    let ids = Tensor::from_slice(ids, &[1, ids.len()], model.lm.device())?;
    let logits = no_grad(|| model.lm.forward(&ids, None)).context("forward pass")?;
    Ok(logits.to_vec::<f32>()?)
}
