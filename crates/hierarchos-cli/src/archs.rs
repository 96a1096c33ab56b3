//! `hierarchos archs`: the registry of supported architectures and how far each is supported.

use anyhow::Result;
use hierarchos_nn::ARCHITECTURES;
use hierarchos_nn::registry::markdown;

/// Arguments of `hierarchos archs`.
#[derive(clap::Args)]
pub struct ArchsArgs {
    /// One JSON array on stdout: `model_type`, `status`, `fixtures`, `features` and `gap` (what keeps it from
    /// validated, or null) of each architecture.
    #[arg(long, conflicts_with = "markdown")]
    json: bool,
    /// ARCHITECTURES.md, as the repository holds it.
    #[arg(long)]
    markdown: bool,
}

/// Prints the registry: a table by default, or JSON, or the Markdown of ARCHITECTURES.md.
pub fn run(args: &ArchsArgs) -> Result<()> {
    if args.markdown {
        print!("{}", markdown());
        return Ok(());
    }
    if args.json {
        let entries: Vec<_> = ARCHITECTURES
            .iter()
            .map(|a| {
                serde_json::json!({
                    "model_type": a.family.model_type(),
                    "status": a.status.name(),
                    "fixtures": a.fixtures,
                    "features": a.features,
                    "gap": a.gap,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&entries)?);
        return Ok(());
    }
    let width = ARCHITECTURES
        .iter()
        .map(|a| a.family.model_type().len())
        .max()
        .unwrap_or(0);
    for a in &ARCHITECTURES {
        println!(
            "{:width$}  {:10}  {}",
            a.family.model_type(),
            a.status.name(),
            a.features
        );
    }
    Ok(())
}
