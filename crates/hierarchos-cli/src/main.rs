//! The `hierarchos` command-line tool.

mod archs;
mod bench;
mod forward;
mod generate;
mod info;
mod merge;
mod train;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

/// Train, fine-tune and run transformer language models on any GPU that speaks Vulkan, Metal, DX12 or WebGPU.
#[derive(Parser)]
#[command(name = "hierarchos", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the GPU adapters found, the one chosen, its limits and which hardware features are used; with
    /// `-m FILE.gguf`, what the model file holds instead.
    Info(info::InfoArgs),
    /// Measure kernel throughput.
    Bench(BenchArgs),
    /// Write the logits of every position of a token sequence to a safetensors file.
    Forward(forward::ForwardArgs),
    /// Generate text from a prompt, streaming tokens to stdout.
    Generate(generate::GenerateArgs),
    /// Train all parameters of a model (or a new one) on a dataset; checkpoints load in transformers.
    Train(Box<train::TrainArgs>),
    /// Loss and perplexity of a model on a dataset.
    Eval(train::EvalArgs),
    /// Add a LoRA adapter into its base model's weights and save the result as a plain model folder.
    Merge(merge::MergeArgs),
    /// List the supported architectures (`model_type`s) and how far each is supported: registered, executes,
    /// or validated against transformers.
    Archs(archs::ArchsArgs),
}

#[derive(clap::Args)]
struct BenchArgs {
    /// Time every kernel on the GPU (timestamp queries; the same as `HIERARCHOS_PROFILE=1`) and print the GPU time
    /// per kernel, per decoded token or training step: where the time goes, to pick what to speed up next.
    /// Wall-clock figures drop while it is on.
    #[arg(long, global = true)]
    profile: bool,
    #[command(subcommand)]
    what: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// Matmul TFLOP/s (f32, f16) and softmax, elementwise and reduction GB/s.
    Ops(bench::OpsArgs),
    /// Prefill and decode tokens/s of a Llama-shaped model with random weights (default: the 110M shape).
    Model(bench::ModelArgs),
    /// Training tokens/s and peak memory of a Llama shape with random weights (default: the 110M shape).
    Train(bench::TrainBenchArgs),
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HIERARCHOS_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Info(args) => info::run(&args),
        Command::Bench(args) => {
            if args.profile {
                // SAFETY: no other thread runs yet; the device reads the variable when it opens.
                unsafe { std::env::set_var("HIERARCHOS_PROFILE", "1") };
            }
            match args.what {
                Bench::Ops(args) => bench::ops(&args),
                Bench::Model(args) => bench::model(&args),
                Bench::Train(args) => bench::train(&args),
            }
        }
        Command::Forward(args) => forward::run(&args),
        Command::Generate(args) => generate::run(&args),
        Command::Train(args) => train::train(&args),
        Command::Eval(args) => train::eval(&args),
        Command::Merge(args) => merge::run(&args),
        Command::Archs(args) => archs::run(&args),
    }
}

/// Loads a model folder or Hub id, and the PEFT adapter folder `adapter` onto it if given, with a spinner on stderr
/// (drawn only when stderr is a terminal).
fn load_model(
    arg: &str,
    revision: Option<&str>,
    adapter: Option<&std::path::Path>,
    device: &hierarchos_core::Device,
) -> Result<hierarchos_nn::Model> {
    let spinner = indicatif::ProgressBar::new_spinner().with_message(format!("loading {arg}"));
    spinner.enable_steady_tick(std::time::Duration::from_millis(100));
    let model = hierarchos_nn::Model::load(arg, revision, device).with_context(|| format!("loading model {arg}"));
    spinner.finish_and_clear();
    let mut model = model?;
    if let Some(dir) = adapter {
        model
            .lm
            .load_adapter(dir, false)
            .with_context(|| format!("applying adapter {}", dir.display()))?;
    }
    Ok(model)
}
