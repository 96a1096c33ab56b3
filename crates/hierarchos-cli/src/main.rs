//! The `hierarchos` command-line tool.

mod bench;
mod info;

use anyhow::Result;
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
    /// Show the GPU adapters found, the one chosen, its limits and which hardware features are used.
    Info,
    /// Measure kernel throughput.
    #[command(subcommand)]
    Bench(Bench),
}

#[derive(Subcommand)]
enum Bench {
    /// Matmul TFLOP/s (f32, f16) and softmax, elementwise and reduction GB/s.
    Ops(bench::OpsArgs),
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HIERARCHOS_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Info => info::run(),
        Command::Bench(Bench::Ops(args)) => bench::ops(&args),
    }
}
