//! `hierarchos info`: what the runtime sees and what it chose, so users can tell why a kernel variant runs.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use hierarchos_core::Gpu;
use hierarchos_nn::gguf::{self, Gguf};

/// What to describe.
#[derive(clap::Args)]
pub struct InfoArgs {
    /// A `.gguf` model file: print its architecture, configuration and tensor types instead of the GPU.
    #[arg(short, long)]
    pub model: Option<String>,
}

pub fn run(args: &InfoArgs) -> Result<()> {
    match &args.model {
        Some(model) => model_info(Path::new(model)),
        None => gpu_info(),
    }
}

/// Sizes in the unit that keeps them readable.
fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.2} KiB", b as f64 / (1u64 << 10) as f64),
        b => format!("{b} B"),
    }
}

fn model_info(path: &Path) -> Result<()> {
    anyhow::ensure!(
        path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")),
        "info -m: {} is not a .gguf file",
        path.display()
    );
    let g = Gguf::open(path)?;
    let text = |key: &str| g.get(key).and_then(|v| v.as_str()).unwrap_or("?").to_string();
    println!("{}: GGUF v{}", path.display(), g.version());
    println!("  name: {}", text("general.name"));
    println!("  architecture: {}", text("general.architecture"));
    println!("  metadata keys: {}", g.metadata().len());
    match gguf::model_config(&g) {
        Ok(c) => println!(
            "  config: {} layers, hidden {}, MLP {}, {} heads / {} key-value heads of {}, vocab {}, context {}, \
             rope theta {}{}",
            c.num_hidden_layers,
            c.hidden_size,
            c.intermediate_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
            c.vocab_size,
            c.max_position_embeddings,
            c.rope.theta,
            if c.tie_word_embeddings { ", tied embeddings" } else { "" }
        ),
        Err(e) => println!("  config: not runnable here: {e}"),
    }
    let tokens = g
        .get("tokenizer.ggml.tokens")
        .and_then(|v| v.as_array())
        .map_or(0, <[_]>::len);
    println!(
        "  tokenizer: {} ({} pre-tokenizer), {tokens} tokens{}",
        text("tokenizer.ggml.model"),
        text("tokenizer.ggml.pre"),
        if g.get("tokenizer.chat_template").is_some() {
            ", chat template"
        } else {
            ""
        }
    );
    let mut by_type: BTreeMap<&str, (usize, u64, u64)> = BTreeMap::new();
    for t in g.tensors() {
        let e = by_type.entry(t.ty.name()).or_default();
        *e = (e.0 + 1, e.1 + t.len(), e.2 + t.size);
    }
    let (values, bytes) = by_type.values().fold((0, 0), |(v, b), e| (v + e.1, b + e.2));
    println!(
        "  tensors: {} ({} parameters, {})",
        g.tensors().len(),
        values,
        size(bytes)
    );
    for (ty, (count, values, bytes)) in &by_type {
        println!(
            "    {ty:<8} {count:>5} tensors {values:>13} values {:>12} ({:.2} bits/value)",
            size(*bytes),
            *bytes as f64 * 8.0 / (*values).max(1) as f64
        );
    }
    Ok(())
}

fn gpu_info() -> Result<()> {
    println!("Adapters:");
    for a in hierarchos_wgpu::list_adapters() {
        let i = &a.info;
        println!(
            "  [{}] {} ({:?}, {:?}, driver: {} {})",
            a.index, i.name, i.backend, i.device_type, i.driver, i.driver_info
        );
    }
    let gpu = Gpu::default_gpu().context("opening the default GPU")?;
    let i = gpu.adapter_info();
    let caps = gpu.caps();
    let l = gpu.limits();
    let on = |b: bool| if b { "on" } else { "off" };
    println!("Chosen: {} ({:?}, {:?})", i.name, i.backend, i.device_type);
    println!("  driver: {} {}", i.driver, i.driver_info);
    println!(
        "  subgroups: {} (size {}..{})",
        on(caps.subgroups),
        caps.subgroup_size.0,
        caps.subgroup_size.1
    );
    println!("  f16: {}", on(caps.f16));
    println!("  timestamps: {}", on(caps.timestamps));
    match caps.cooperative_matrix {
        Some(e) => println!(
            "  cooperative matrix: on ({} {e} x {e} x {e} into f32)",
            caps.cooperative_matrix_types()
        ),
        None => println!("  cooperative matrix: off"),
    }
    match caps.multiprocessors {
        Some(n) => println!("  multiprocessors: {n}"),
        None => println!("  multiprocessors: not reported"),
    }
    println!("  max buffer: {} MiB", l.max_buffer_size >> 20);
    println!("  max storage binding: {} MiB", l.max_storage_buffer_binding_size >> 20);
    println!(
        "  max workgroup storage: {} KiB",
        l.max_compute_workgroup_storage_size >> 10
    );
    println!(
        "  max invocations per workgroup: {}",
        l.max_compute_invocations_per_workgroup
    );
    println!(
        "  max storage buffers per stage: {}",
        l.max_storage_buffers_per_shader_stage
    );
    println!("Select another adapter with HIERARCHOS_ADAPTER=<index or name>; turn features off with");
    println!("HIERARCHOS_DISABLE=subgroup,f16,coopmat,coopmat_bf16,multiprocessors.");
    Ok(())
}
