//! `hierarchos merge`: a base model plus a LoRA adapter written as one plain model folder (the adapter's update
//! added into the weights), which loads in transformers and Hierarchos without PEFT and runs at the base model's
//! speed.

use std::path::PathBuf;

use anyhow::{Context, Result};
use hierarchos_core::default_device;
use hierarchos_nn::train::checkpoint::{ModelFiles, write_model};

/// The base, the adapter and where to write the merged model.
#[derive(clap::Args)]
pub struct MergeArgs {
    /// Base model folder or Hub id.
    #[arg(short, long)]
    pub model: String,
    /// Hub revision when MODEL is a Hub id.
    #[arg(long)]
    pub revision: Option<String>,
    /// PEFT LoRA adapter folder.
    #[arg(long)]
    pub adapter: PathBuf,
    /// Output folder: config.json, model.safetensors (f32) and the base's tokenizer files.
    #[arg(long)]
    pub out: PathBuf,
}

pub fn run(args: &MergeArgs) -> Result<()> {
    let device = default_device().context("opening the default GPU")?;
    let mut model = crate::load_model(&args.model, args.revision.as_deref(), Some(&args.adapter), &device)?;
    model.lm.merge_adapters().context("merging the adapter")?;
    model.lm.remove_adapters();
    let files = ModelFiles::read(&model.dir)?;
    write_model(&args.out, &model.lm, &files).with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!(
        "merged {} into {}: {}",
        args.adapter.display(),
        args.model,
        args.out.display()
    );
    Ok(())
}
