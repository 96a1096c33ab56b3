//! `hierarchos train` and `hierarchos eval`: full-parameter or LoRA training with a progress bar, metrics as JSON
//! lines and checkpoints under `--out` that transformers (or PEFT, for adapters) loads as they are; `--resume`
//! continues a run exactly.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use hierarchos_core::{DType, default_device};
use hierarchos_nn::Tokenizer;
use hierarchos_nn::lora::{LoraConfig, TargetModules};
use hierarchos_nn::optim::AdamWConfig;
use hierarchos_nn::train::checkpoint;
use hierarchos_nn::train::data::{TokenData, pad_id};
use hierarchos_nn::train::setup::{Source, Trained, load_source};
use hierarchos_nn::train::{LrScheduler, Precision, Schedule, TrainConfig, Trainer, evaluate};

/// Optimizer steps of a new run when --steps is not given.
const DEFAULT_STEPS: usize = 100;

/// What to train, on what, how, and where to write it. Defaults are transformers' `TrainingArguments` defaults.
#[derive(clap::Args)]
pub struct TrainArgs {
    /// Model folder or Hub id; a folder with `config.json` (and a tokenizer) but no weights trains from random
    /// weights drawn from --seed. Not needed with --resume.
    #[arg(short, long, required_unless_present = "resume")]
    pub model: Option<String>,
    /// Hub revision when MODEL is a Hub id.
    #[arg(long)]
    pub revision: Option<String>,
    /// Training data: a .txt, .jsonl or .parquet file, a folder of them, or a Hub dataset id (with --resume:
    /// defaults to the run's).
    #[arg(long, required_unless_present = "resume")]
    pub data: Option<String>,
    /// Optimizer steps in all [default: 100; with --resume: the run's, or where the resumed run now ends].
    #[arg(long)]
    pub steps: Option<usize>,
    /// Sequences per micro-batch.
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    /// Tokens per packed sequence (text data is cut into chunks of this length).
    #[arg(long, default_value_t = 512)]
    pub seq_len: usize,
    /// Peak learning rate.
    #[arg(long, default_value_t = 5e-5)]
    pub lr: f64,
    /// AdamW beta1.
    #[arg(long, default_value_t = 0.9)]
    pub adam_beta1: f64,
    /// AdamW beta2.
    #[arg(long, default_value_t = 0.999)]
    pub adam_beta2: f64,
    /// AdamW epsilon.
    #[arg(long, default_value_t = 1e-8)]
    pub adam_epsilon: f64,
    /// Decoupled weight decay.
    #[arg(long, default_value_t = 0.0)]
    pub weight_decay: f64,
    /// Leave biases and norm weights undecayed, as transformers' Trainer does.
    #[arg(long)]
    pub no_decay_1d: bool,
    /// Steps of linear warmup.
    #[arg(long, default_value_t = 0)]
    pub warmup_steps: usize,
    /// Learning-rate curve after warmup: constant, linear or cosine.
    #[arg(long, default_value = "linear")]
    pub lr_scheduler: String,
    /// Clip the global gradient norm to this (0: off).
    #[arg(long, default_value_t = 1.0)]
    pub max_grad_norm: f64,
    /// Micro-batches per optimizer step.
    #[arg(long, default_value_t = 1)]
    pub grad_accum: usize,
    /// Keep the data in file order (step k takes sequences k*B .. k*B+B-1).
    #[arg(long)]
    pub no_shuffle: bool,
    /// Seed of the data order and of random initial weights.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Mixed precision: the dtype of the matrix products (f32, f16 or bf16; master weights, optimizer and every
    /// other op stay f32). f16 runs products, and attention with heads of 64, on tensor cores where the GPU has
    /// cooperative matrices, with dynamic loss scaling; bf16 needs no loss scaling, and its products run on
    /// tensor cores only where the driver also has `VK_KHR_shader_bfloat16` (else on the portable kernels).
    #[arg(long, default_value = "f32", conflicts_with = "resume")]
    pub dtype: Precision,
    /// Hold out this fraction of the sequences (the last ones) for evaluation.
    #[arg(long, default_value_t = 0.0)]
    pub eval_split: f64,
    /// Evaluation data (instead of --eval-split).
    #[arg(long, conflicts_with = "eval_split")]
    pub eval_data: Option<String>,
    /// Evaluate every K steps (and at the end) when there is evaluation data; 0: only at the end.
    #[arg(long, default_value_t = 0)]
    pub eval_every: usize,
    /// Save a checkpoint every K steps (and at the end); 0: only at the end.
    #[arg(long, default_value_t = 0)]
    pub save_every: usize,
    /// Checkpoints kept under --out (the oldest are deleted); 0 keeps all.
    #[arg(long, default_value_t = 2)]
    pub save_total_limit: usize,
    /// Output folder: `checkpoint-N/` folders, and the final model at its top.
    #[arg(long)]
    pub out: PathBuf,
    /// Continue the run saved in this folder (its newest checkpoint) or checkpoint folder, with the run's
    /// settings (only --steps, --data and the output flags may change).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Append one JSON object per step (and per evaluation) to this file.
    #[arg(long)]
    pub metrics: Option<PathBuf>,
    /// Train a new LoRA adapter of this rank instead of every parameter (the model stays frozen); --out then
    /// holds PEFT adapter folders.
    #[arg(long, conflicts_with_all = ["adapter", "resume"])]
    pub lora_r: Option<usize>,
    /// LoRA's alpha: the update is scaled by alpha / r (PEFT's default).
    #[arg(long, default_value_t = 8.0, requires = "lora_r")]
    pub lora_alpha: f64,
    /// Dropout on the adapters' inputs while training.
    #[arg(long, default_value_t = 0.0, requires = "lora_r")]
    pub lora_dropout: f64,
    /// The layers to adapt: `all-linear`, or module names (comma-separated; a name matches every layer's module
    /// of that name).
    #[arg(long, default_value = "q_proj,v_proj", requires = "lora_r")]
    pub lora_targets: String,
    /// Scale by alpha / sqrt(r) (rsLoRA) instead of alpha / r.
    #[arg(long, requires = "lora_r")]
    pub use_rslora: bool,
    /// Continue training this PEFT LoRA adapter folder on MODEL (a new run: fresh optimizer state).
    #[arg(long, conflicts_with = "resume")]
    pub adapter: Option<PathBuf>,
    /// While an adapter trains, hold the frozen model's matrices in this dtype (f16 or bf16 halve their memory;
    /// activations and the adapter stay f32).
    #[arg(long, default_value = "f32", conflicts_with = "resume")]
    pub base_dtype: DType,
}

/// A model and data to evaluate.
#[derive(clap::Args)]
pub struct EvalArgs {
    /// Model folder or Hub id.
    #[arg(short, long)]
    pub model: String,
    /// Hub revision when MODEL is a Hub id.
    #[arg(long)]
    pub revision: Option<String>,
    /// A PEFT LoRA adapter folder to apply.
    #[arg(long)]
    pub adapter: Option<PathBuf>,
    /// Data: a .txt, .jsonl or .parquet file, a folder of them, or a Hub dataset id.
    #[arg(long)]
    pub data: String,
    /// Sequences per batch.
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    /// Tokens per packed sequence.
    #[arg(long, default_value_t = 512)]
    pub seq_len: usize,
}

/// What the arguments ask to train.
fn trained(args: &TrainArgs) -> Trained {
    match (&args.adapter, args.lora_r) {
        (Some(dir), _) => Trained::Adapter(dir.clone()),
        (None, Some(r)) => {
            let mut config = LoraConfig::new(
                r,
                args.lora_alpha,
                args.lora_dropout,
                TargetModules::parse(&args.lora_targets),
            );
            config.use_rslora = args.use_rslora;
            Trained::NewAdapter(Box::new(config))
        }
        (None, None) => Trained::All,
    }
}

fn config_from(args: &TrainArgs) -> Result<TrainConfig> {
    let scheduler: LrScheduler = args.lr_scheduler.parse()?;
    let steps = args.steps.unwrap_or(DEFAULT_STEPS);
    let config = TrainConfig {
        steps,
        batch_size: args.batch_size,
        seq_len: args.seq_len,
        grad_accum: args.grad_accum,
        schedule: Schedule {
            lr: args.lr,
            scheduler,
            warmup_steps: args.warmup_steps,
            total_steps: steps,
        },
        adamw: AdamWConfig {
            beta1: args.adam_beta1,
            beta2: args.adam_beta2,
            eps: args.adam_epsilon,
            weight_decay: args.weight_decay,
            no_decay_1d: args.no_decay_1d,
        },
        max_grad_norm: args.max_grad_norm,
        shuffle: !args.no_shuffle,
        seed: args.seed,
        precision: args.dtype,
    };
    config.validate()?;
    Ok(config)
}

pub fn train(args: &TrainArgs) -> Result<()> {
    anyhow::ensure!(
        args.base_dtype == DType::F32 || args.lora_r.is_some() || args.adapter.is_some(),
        "--base-dtype {} holds a frozen model: it needs --lora-r or --adapter",
        args.base_dtype
    );
    let device = default_device().context("opening the default GPU")?;
    let (source, mut config, data_arg, resumed) = match &args.resume {
        Some(dir) => {
            let dir = checkpoint::resolve_resume(dir)?;
            let ckpt =
                checkpoint::load(&dir, &device).with_context(|| format!("reading checkpoint {}", dir.display()))?;
            let data = args.data.clone().unwrap_or_else(|| ckpt.state.data.clone());
            eprintln!("resuming {} at step {}", dir.display(), ckpt.state.step);
            let source = Source {
                lm: ckpt.lm,
                files: ckpt.files,
                tokenizer: Tokenizer::from_dir_if_present(&dir)?,
                frozen_bytes: None,
            };
            (
                source,
                ckpt.state.config.clone(),
                data,
                Some((ckpt.state, ckpt.moments)),
            )
        }
        None => {
            let model = args.model.as_deref().expect("clap requires --model without --resume");
            let dir = hierarchos_nn::hub::resolve_model(model, args.revision.as_deref())?;
            // A resumed adapter run loads its base from here: a folder by its absolute path, else the Hub id.
            let base = match std::fs::canonicalize(model) {
                Ok(path) => path.display().to_string(),
                Err(_) => model.to_string(),
            };
            let revision = args.revision.as_deref();
            let source = load_source(
                &dir,
                &base,
                revision,
                &trained(args),
                args.base_dtype,
                args.seed,
                &device,
            )
            .with_context(|| format!("loading model {model}"))?;
            if let Some((before, after)) = source.frozen_bytes {
                let mib = |b: usize| b as f64 / (1 << 20) as f64;
                eprintln!(
                    "frozen weights held in {}: {:.1} MiB instead of {:.1} MiB",
                    args.base_dtype,
                    mib(after),
                    mib(before)
                );
            }
            let data = args.data.clone().expect("clap requires --data without --resume");
            (source, config_from(args)?, data, None)
        }
    };
    if let Some(steps) = args.steps.filter(|&s| resumed.is_some() && s != config.steps) {
        let done = resumed.as_ref().map_or(0, |(state, _)| state.step);
        if steps < done {
            bail!("--steps {steps}: the resumed run has already taken {done} steps");
        }
        // Extending (or shortening) a run moves where a decaying schedule ends.
        config.steps = steps;
        config.schedule.total_steps = steps;
    }
    let tokenizer = source.tokenizer.as_ref();
    let mut data =
        TokenData::load(&data_arg, tokenizer, config.seq_len).with_context(|| format!("loading data {data_arg}"))?;
    let eval = match (&args.eval_data, args.eval_split) {
        (Some(path), _) => {
            Some(TokenData::load(path, tokenizer, config.seq_len).with_context(|| format!("loading {path}"))?)
        }
        (None, f) if f > 0.0 => {
            let (train, eval) = data.split_eval(f)?;
            data = train;
            Some(eval)
        }
        _ => None,
    };
    let pad = pad_id(tokenizer);
    let lm = &source.lm;
    let mut trainer = match resumed {
        Some((state, moments)) => {
            let mut state = state;
            state.config = config.clone();
            Trainer::resume(lm, &state, moments, data.sequences.len(), pad)?
        }
        None => Trainer::new(lm, config.clone(), data.sequences.len(), pad)?,
    };
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let mut metrics = match &args.metrics {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("opening {}", path.display()))?,
        ),
        None => None,
    };
    let mut log = |line: serde_json::Value| -> Result<()> {
        if let Some(f) = metrics.as_mut() {
            writeln!(f, "{line}")?;
        }
        Ok(())
    };
    eprintln!(
        "training {} {} on {} sequences of up to {} tokens ({} eval), {} steps of {} x {}",
        lm.trainable_parameters().iter().map(|(_, p)| p.numel()).sum::<usize>(),
        if lm.adapter_config().is_some() {
            "adapter parameters (the model is frozen)"
        } else {
            "parameters"
        },
        data.sequences.len(),
        config.seq_len,
        eval.as_ref().map_or(0, |e| e.sequences.len()),
        config.steps,
        config.grad_accum,
        config.batch_size
    );
    device.reset_peak();
    let bar = indicatif::ProgressBar::new(config.steps as u64).with_position(trainer.completed_steps() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}")
            .expect("a valid template"),
    );
    let (mut tokens, mut secs) = (0usize, 0.0f64);
    let save = |trainer: &Trainer| -> Result<PathBuf> {
        let state = trainer.state(&data_arg)?;
        let dir = checkpoint::save(
            &args.out,
            lm,
            &source.files,
            trainer.optimizer(),
            &state,
            args.save_total_limit,
        )?;
        Ok(dir)
    };
    let evaluate_now = |step: usize, log: &mut dyn FnMut(serde_json::Value) -> Result<()>| -> Result<()> {
        if let Some(eval) = &eval {
            let e = evaluate(lm, eval, config.batch_size, pad)?;
            // Printed above the bar on a terminal, and to stderr as it is elsewhere (where the bar is hidden).
            bar.suspend(|| {
                eprintln!(
                    "step {step}: eval loss {:.4}, perplexity {:.2} ({} tokens)",
                    e.loss, e.perplexity, e.tokens
                )
            });
            log(serde_json::json!({"step": step, "eval_loss": e.loss, "eval_perplexity": e.perplexity}))?;
        }
        Ok(())
    };
    // A step's statistics are read back while the GPU runs the next (`Trainer::step_ahead`), except for steps
    // whose parameters are evaluated or saved, and the last: those are settled before anything else is recorded.
    let evaluates = |step: usize| args.eval_every > 0 && step.is_multiple_of(args.eval_every);
    let saves = |step: usize| args.save_every > 0 && step.is_multiple_of(args.save_every);
    while trainer.completed_steps() < config.steps {
        let number = trainer.next_step();
        let settles = number == config.steps || evaluates(number) || saves(number);
        let mut done = Vec::new();
        let recorded = trainer
            .step_ahead(&data)
            .map(|s| done.extend(s))
            .and_then(|()| match settles {
                true => trainer.finish().map(|s| done.extend(s)),
                false => Ok(()),
            });
        // Steps read back before a failure are logged before it is reported.
        for s in done {
            tokens += s.tokens;
            secs += s.secs;
            bar.set_position(s.step as u64);
            let skipped = if s.skipped {
                " (gradients overflowed: step skipped)"
            } else {
                ""
            };
            bar.set_message(format!(
                "loss {:.4} lr {:.2e} |g| {:.3} {:.0} tok/s{skipped}",
                s.loss,
                s.lr,
                s.grad_norm,
                tokens as f64 / secs.max(1e-9)
            ));
            if s.skipped {
                tracing::warn!(step = s.step, loss_scale = ?s.loss_scale, "f16 gradients overflowed: step skipped");
            }
            let mut line = serde_json::json!({
                "step": s.step, "loss": s.loss, "lr": s.lr, "grad_norm": s.grad_norm,
                "tokens": s.tokens, "tokens_per_sec": s.tokens as f64 / s.secs.max(1e-9),
            });
            if let Some(scale) = s.loss_scale {
                line["loss_scale"] = scale.into();
                line["skipped"] = s.skipped.into();
            }
            log(line)?;
            let last = s.step == config.steps;
            if evaluates(s.step) && !last {
                evaluate_now(s.step, &mut log)?;
            }
            if saves(s.step) && !last {
                save(&trainer)?;
            }
        }
        if let Err(e) = recorded {
            bar.abandon();
            return Err(e).context(match checkpoint::checkpoints(&args.out)?.pop() {
                Some((step, dir)) => format!("the checkpoint of step {step} is kept in {}", dir.display()),
                None => "no checkpoint was saved before it".to_string(),
            });
        }
    }
    bar.finish();
    evaluate_now(trainer.completed_steps(), &mut log)?;
    let dir = save(&trainer)?;
    checkpoint::write_model(&args.out, lm, &source.files)?;
    let peak = device.memory().peak_bytes;
    eprintln!(
        "done: {} steps, {:.0} tokens/s, peak GPU memory {:.1} MiB; {} in {} (checkpoint {})",
        trainer.completed_steps(),
        tokens as f64 / secs.max(1e-9),
        peak as f64 / (1 << 20) as f64,
        if lm.adapter_config().is_some() {
            "adapter"
        } else {
            "model"
        },
        args.out.display(),
        dir.display()
    );
    Ok(())
}

pub fn eval(args: &EvalArgs) -> Result<()> {
    let device = default_device().context("opening the default GPU")?;
    let model = crate::load_model(&args.model, args.revision.as_deref(), args.adapter.as_deref(), &device)?;
    let data = TokenData::load(&args.data, model.tokenizer.as_ref(), args.seq_len)
        .with_context(|| format!("loading data {}", args.data))?;
    if data.sequences.is_empty() {
        bail!("{}: no sequences", args.data);
    }
    let pad = pad_id(model.tokenizer.as_ref());
    let e = evaluate(&model.lm, &data, args.batch_size, pad)?;
    println!(
        "loss {:.6}  perplexity {:.4}  ({} tokens in {} sequences)",
        e.loss,
        e.perplexity,
        e.tokens,
        data.sequences.len()
    );
    Ok(())
}
