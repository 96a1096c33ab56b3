//! `hierarchos bench ops`: throughput of the core kernels, printed as a table or JSON lines so that
//! `scripts/bench_ops.py` can set them beside PyTorch on the same GPU.

use std::time::Instant;

use anyhow::{Context, Result};
use hierarchos_core::quant::{GgmlType, QTensor};
use hierarchos_core::{DType, Device, Tensor, default_device};
use hierarchos_nn::lora::{LoraConfig, TargetModules};
use hierarchos_nn::optim::AdamWConfig;
use hierarchos_nn::sampling::argmax;
use hierarchos_nn::train::data::TokenData;
use hierarchos_nn::train::{LrScheduler, Precision, Schedule, TrainConfig, Trainer};
use hierarchos_nn::{CausalLm, LinearWeight, Model, ModelConfig, SamplingConfig, StopConditions, generate};

/// What to measure.
#[derive(clap::Args)]
pub struct OpsArgs {
    /// Square matmul sizes.
    #[arg(long, value_delimiter = ',', default_value = "512,1024,2048,4096")]
    pub sizes: Vec<usize>,
    /// Linear layers `TOKENSxINxOUT` whose three training products are timed in f32 and f16: the forward
    /// `x @ W.t()`, the input gradient `g @ W` and the weight gradient `g.t() @ x` (the defaults are the 110M
    /// Llama shape's projections, MLP and head at 8 x 512 tokens).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "4096x768x768,4096x768x3072,4096x3072x768,4096x768x32000"
    )]
    pub linear: Vec<String>,
    /// Rows × columns of the softmax, elementwise and reduction benchmarks.
    #[arg(long, value_delimiter = ',', default_value = "8192,4096")]
    pub rows_cols: Vec<usize>,
    /// Causal attention shapes `BATCHxHEADSxTOKENSxHEAD_DIM` timed in training (forward, and forward plus
    /// backward); the default is the 110M Llama shape at 8 x 512 tokens.
    #[arg(long, value_delimiter = ',', default_value = "8x12x512x64")]
    pub attention: Vec<String>,
    /// Timed repetitions per case (after one warm-up run).
    #[arg(long, default_value_t = 10)]
    pub iters: usize,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Seconds per run of `f`, timed over `iters` runs queued back to back and one wait at the end.
fn time(device: &Device, iters: usize, mut f: impl FnMut() -> Result<Tensor>) -> Result<f64> {
    drop(f()?);
    device.synchronize()?;
    let start = Instant::now();
    for _ in 0..iters {
        drop(f()?);
    }
    device.synchronize()?;
    Ok(start.elapsed().as_secs_f64() / iters as f64)
}

fn report(json: bool, op: &str, shape: &str, dtype: DType, secs: f64, value: f64, unit: &str) {
    if json {
        println!(
            "{{\"op\":\"{op}\",\"shape\":\"{shape}\",\"dtype\":\"{dtype}\",\"ms\":{:.4},\"value\":{value:.2},\"unit\":\"{unit}\"}}",
            secs * 1e3
        );
    } else {
        println!(
            "{op:<12} {shape:<26} {dtype:<5} {:>10.3} ms {value:>10.1} {unit}",
            secs * 1e3
        );
    }
}

/// Dependent launches timed together by the launch-latency case.
const LAUNCH_CHAIN: usize = 200;

/// Throughput of the core kernels beside each other (see the module docs).
pub fn ops(args: &OpsArgs) -> Result<()> {
    let device = default_device().context("opening the default GPU")?;
    if !args.json {
        println!(
            "device: {} ({:?})",
            device.adapter_info().name,
            device.adapter_info().backend
        );
    }
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for &n in &args.sizes {
            let a = Tensor::randn(&[n, n], 1, 0, dtype, &device)?;
            let b = Tensor::randn(&[n, n], 2, 0, dtype, &device)?;
            let secs = time(&device, args.iters, || Ok(a.matmul(&b)?))?;
            let tflops = 2.0 * (n as f64).powi(3) / secs / 1e12;
            report(
                args.json,
                "matmul",
                &format!("{n}x{n}x{n}"),
                dtype,
                secs,
                tflops,
                "TFLOP/s",
            );
        }
    }
    for case in &args.linear {
        let [tokens, inputs, outputs] = dims("--linear", case, "TOKENSxINxOUT")?;
        let flops = 2.0 * (tokens * inputs * outputs) as f64;
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let x = Tensor::randn(&[tokens, inputs], 11, 0, dtype, &device)?;
            let w = Tensor::randn(&[outputs, inputs], 12, 0, dtype, &device)?;
            let g = Tensor::randn(&[tokens, outputs], 13, 0, dtype, &device)?;
            for (name, [lhs, rhs]) in [
                ("x@W.t", [x.clone(), w.t()?]),
                ("g@W", [g.clone(), w.clone()]),
                ("g.t@x", [g.t()?, x.clone()]),
            ] {
                let secs = time(&device, args.iters, || Ok(lhs.matmul(&rhs)?))?;
                let shape = format!("{case} {name}");
                report(args.json, "linear", &shape, dtype, secs, flops / secs / 1e12, "TFLOP/s");
            }
        }
    }
    let [rows, cols] = args.rows_cols[..] else {
        anyhow::bail!("--rows-cols takes two numbers")
    };
    let shape = format!("{rows}x{cols}");
    let bytes = (rows * cols * 4) as f64;
    let x = Tensor::randn(&[rows, cols], 3, 0, DType::F32, &device)?;
    let y = Tensor::randn(&[rows, cols], 4, 0, DType::F32, &device)?;
    let secs = time(&device, args.iters, || Ok(x.softmax(-1)?))?;
    report(
        args.json,
        "softmax",
        &shape,
        DType::F32,
        secs,
        2.0 * bytes / secs / 1e9,
        "GB/s",
    );
    let secs = time(&device, args.iters, || Ok(x.add(&y)?))?;
    report(
        args.json,
        "add",
        &shape,
        DType::F32,
        secs,
        3.0 * bytes / secs / 1e9,
        "GB/s",
    );
    let secs = time(&device, args.iters, || Ok(x.sum(&[-1], false)?))?;
    report(args.json, "sum", &shape, DType::F32, secs, bytes / secs / 1e9, "GB/s");

    // Launch latency: a chain of small dependent launches, each reading the last one's output (decode is made
    // of such chains).
    let small = Tensor::randn(&[1, 576], 5, 0, DType::F32, &device)?;
    let secs = time(&device, args.iters, || {
        let mut h = small.clone();
        for _ in 0..LAUNCH_CHAIN {
            h = h.add(&small)?;
        }
        Ok(h)
    })?;
    let per_launch = secs / LAUNCH_CHAIN as f64;
    report(
        args.json,
        "launch",
        "1x576 chain",
        DType::F32,
        per_launch,
        per_launch * 1e6,
        "us/launch",
    );
    training_attention(args, &device)?;
    decode_attention(args, &device)
}

/// The `N` sizes of a shape argument such as `4096x768x768` given to `flag`, which expects `form`.
fn dims<const N: usize>(flag: &str, case: &str, form: &str) -> Result<[usize; N]> {
    let sizes: Vec<usize> = case
        .split('x')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .with_context(|| format!("{flag} {case}: expected {form}"))?;
    sizes
        .try_into()
        .map_err(|_| anyhow::anyhow!("{flag} {case}: expected {form}"))
}

/// Causal attention in training ([`Tensor::flash_attention`]) for each `--attention` shape: forward, and forward
/// plus backward (of the output's sum). FLOPs count the visible half of the score matrix: 2·B·H·T²·D forward (two
/// products), 2.5 times that backward (five).
fn training_attention(args: &OpsArgs, device: &Device) -> Result<()> {
    for case in &args.attention {
        let [b, h, t, d] = dims("--attention", case, "BATCHxHEADSxTOKENSxHEAD_DIM")?;
        let leaf = |seed| -> Result<Tensor> {
            Ok(Tensor::randn(&[b, h, t, d], seed, 0, DType::F32, device)?.requires_grad_())
        };
        let (q, k, v) = (leaf(14)?, leaf(15)?, leaf(16)?);
        let forward_flops = 2.0 * (b * h * t * t * d) as f64;
        let shape = format!("{case} causal");
        let secs = time(device, args.iters, || {
            hierarchos_core::no_grad(|| Ok(q.flash_attention(&k, &v, 0, 0, None)?))
        })?;
        report(
            args.json,
            "attn_fwd",
            &shape,
            DType::F32,
            secs,
            forward_flops / secs / 1e12,
            "TFLOP/s",
        );
        let secs = time(device, args.iters, || {
            for x in [&q, &k, &v] {
                x.zero_grad();
            }
            q.flash_attention(&k, &v, 0, 0, None)?.sum_all()?.backward()?;
            q.grad().context("a query gradient")
        })?;
        report(
            args.json,
            "attn_fwd_bwd",
            &shape,
            DType::F32,
            secs,
            3.5 * forward_flops / secs / 1e12,
            "TFLOP/s",
        );
    }
    Ok(())
}

/// One decode step's attention (SmolLM2-135M's heads: 9 query heads over 3 key/value heads of 64) at several
/// cache lengths, alone and fused with the rotary and cache update ([`Tensor::attention_step`]).
fn decode_attention(args: &OpsArgs, device: &Device) -> Result<()> {
    let (h, kvh, d, capacity) = (9, 3, 64, 1024);
    let k_cache = Tensor::randn(&[1, kvh, capacity, d], 6, 0, DType::F32, device)?;
    let v_cache = Tensor::randn(&[1, kvh, capacity, d], 7, 0, DType::F32, device)?;
    let q = Tensor::randn(&[1, 1, h, d], 8, 0, DType::F32, device)?;
    let k = Tensor::randn(&[1, 1, kvh, d], 9, 0, DType::F32, device)?;
    let v = Tensor::randn(&[1, 1, kvh, d], 10, 0, DType::F32, device)?;
    let cos = Tensor::full(&[1, d / 2], 1.0, DType::F32, device)?;
    let sin = Tensor::zeros(&[1, d / 2], DType::F32, device)?;
    let tables = hierarchos_core::ops::rope::RopeTables {
        cos_q: &cos,
        sin_q: &sin,
        cos_k: &cos,
        sin_k: &sin,
    };
    let q_heads = q.transpose(1, 2)?;
    for context in [16, 128, 512] {
        let position = context - 1;
        let secs = time(device, args.iters * 20, || {
            Ok(q.attention_step(
                hierarchos_core::ops::attention::NewKeys { k: &k, v: &v, tables },
                &k_cache,
                &v_cache,
                position,
                None,
            )?)
        })?;
        let shape = format!("9/3x64 ctx {context}");
        report(args.json, "attn_step", &shape, DType::F32, secs, secs * 1e6, "us");
        let keys = k_cache.narrow(2, 0, context)?;
        let values = v_cache.narrow(2, 0, context)?;
        let secs = time(device, args.iters * 20, || {
            Ok(q_heads.cached_attention(&keys, &values, position, 0, None)?)
        })?;
        report(args.json, "attn_cached", &shape, DType::F32, secs, secs * 1e6, "us");
    }
    Ok(())
}

/// The model to time: a real one (`-m`), or random weights of a given shape.
#[derive(clap::Args)]
pub struct ModelArgs {
    /// A model to time instead of random weights: a `.gguf` file or a model folder / Hub id (the shape flags
    /// are then ignored).
    #[arg(short = 'm', long = "model")]
    pub model: Option<String>,
    /// With a `.gguf` model: dequantize its weights to f32 on load (the same model unquantized).
    #[arg(long)]
    pub dequantize: bool,
    /// The shape of the random model.
    #[command(flatten)]
    pub shape: Shape,
    /// Keep the linear weights in this ggml block format (`q4_1` or `q8_0`, random blocks) instead of f32.
    /// `--hidden 576 --layers 30 --heads 9 --kv-heads 3 --intermediate 1536 --vocab 49152 --tied --quant q4_1`
    /// is the shape of SmolLM2-135M Q4_1.
    #[arg(long)]
    pub quant: Option<String>,
    /// Prompt length for the prefill measurement.
    #[arg(long, default_value_t = 512)]
    pub prefill: usize,
    /// Prompt tokens in the cache before decoding starts.
    #[arg(long, default_value_t = 16)]
    pub context: usize,
    /// Tokens decoded one at a time through the KV cache (after the `--context` prompt).
    #[arg(long, default_value_t = 128)]
    pub decode: usize,
    /// Timed repetitions: prefill reports the mean, decode the best run.
    #[arg(long, default_value_t = 5)]
    pub iters: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// A Llama shape for random weights; the defaults are the 110M Llama shape (untied, no GQA).
#[derive(clap::Args)]
pub struct Shape {
    /// Model width.
    #[arg(long, default_value_t = 768)]
    pub hidden: usize,
    /// Decoder layers.
    #[arg(long, default_value_t = 12)]
    pub layers: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 12)]
    pub heads: usize,
    /// Key/value heads (default: as many as attention heads, as in the 110M Llama shape).
    #[arg(long)]
    pub kv_heads: Option<usize>,
    /// The output projection reuses the embedding matrix.
    #[arg(long)]
    pub tied: bool,
    /// MLP width.
    #[arg(long, default_value_t = 3072)]
    pub intermediate: usize,
    /// Vocabulary size.
    #[arg(long, default_value_t = 32000)]
    pub vocab: usize,
}

impl Shape {
    /// The Llama config of this shape for up to `positions` positions.
    fn config(&self, positions: usize) -> Result<ModelConfig> {
        let json = serde_json::json!({
            "model_type": "llama",
            "hidden_size": self.hidden,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads.unwrap_or(self.heads),
            "intermediate_size": self.intermediate,
            "vocab_size": self.vocab,
            "max_position_embeddings": positions.next_power_of_two(),
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "tie_word_embeddings": self.tied,
        });
        Ok(ModelConfig::from_json(
            &json.to_string(),
            std::path::Path::new("<bench config>"),
        )?)
    }
}

/// Blocks of `ty` for `n` random weights of size about 0.02 (finite scales, random quants).
fn random_blocks(ty: GgmlType, n: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut byte = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state as u8
    };
    let scale = half::f16::from_f32(0.005).to_le_bytes();
    let mut out = Vec::with_capacity(n / ty.block_size() * ty.type_size());
    for _ in 0..n / ty.block_size() {
        out.extend_from_slice(&scale);
        if ty == GgmlType::Q4_1 {
            out.extend_from_slice(&half::f16::from_f32(-0.04).to_le_bytes());
        }
        while out.len() % ty.type_size() != 0 {
            out.push(byte());
        }
    }
    out
}

/// Prefill and decode tokens/s of a Llama-shaped model with random weights (f32, or quantized linear layers).
pub fn model(args: &ModelArgs) -> Result<()> {
    let device = default_device().context("opening the default GPU")?;
    let (lm, params, weights) = match &args.model {
        Some(path) => real_model(path, args.dequantize, &device)?,
        None => random_model(args, &device)?,
    };
    let vocab = lm.config().vocab_size;
    let ids = |n: usize| {
        Tensor::from_slice(
            &(0..n as u32).map(|i| (i * 7919) % vocab as u32).collect::<Vec<_>>(),
            &[1, n],
            &device,
        )
    };

    let prompt = ids(args.prefill)?;
    device.reset_profile();
    let prefill_secs = time(&device, args.iters, || {
        let mut cache = lm.new_cache(1, args.prefill)?;
        Ok(lm.forward_last(&prompt, Some(&mut cache))?)
    })?;
    // `time` runs the prefill once more to warm up.
    print_profile(&device, (args.iters + 1) as f64, "prefill");

    // Decode: the best of `iters` runs (the first also warms the pool and pipeline caches).
    // Decode as `hierarchos generate` does it: greedy, the argmax on the GPU and each token read one step
    // behind. The best of `iters` runs (the first also warms the pool and pipeline caches).
    let prompt: Vec<u32> = (0..args.context as u32).map(|i| (i * 7919) % vocab as u32).collect();
    let mut decode_tps = 0.0f64;
    for _ in 0..args.iters.max(1) {
        let g = generate(
            &lm,
            &prompt,
            args.decode + 1,
            &SamplingConfig::default(),
            &StopConditions::default(),
            |_, _| Ok(()),
        )?;
        decode_tps = decode_tps.max(g.decode_tokens_per_sec());
    }

    // The sampling path: all logits read back and the token chosen on the host each step (here their argmax,
    // so that it decodes the same tokens). The launch count, host recording time and kernel profile come from
    // here.
    let short = ids(args.context)?;
    let (mut read_back_secs, mut host_secs, mut per_token) = (f64::INFINITY, 0.0, 0.0);
    for _ in 0..args.iters.max(1) {
        let mut cache = lm.new_cache(1, args.context + args.decode)?;
        let mut logits = lm.forward_last(&short, Some(&mut cache))?;
        device.synchronize()?;
        // The kernel profile (if on) covers the last run's decoded tokens.
        device.reset_profile();
        let start = Instant::now();
        let launches = device.dispatch_count();
        let mut host = 0.0;
        for _ in 0..args.decode {
            let next = argmax(&logits.to_vec::<f32>()?) as u32;
            let recording = Instant::now();
            logits = lm.forward_last(&Tensor::from_slice(&[next], &[1, 1], &device)?, Some(&mut cache))?;
            host += recording.elapsed().as_secs_f64();
        }
        logits.to_vec::<f32>()?;
        let secs = start.elapsed().as_secs_f64();
        if secs < read_back_secs {
            read_back_secs = secs;
            host_secs = host;
            per_token = (device.dispatch_count() - launches) as f64 / args.decode as f64;
        }
    }
    // Time the host spends recording a token's launches (the GPU runs them meanwhile or after).
    let host_us = host_secs * 1e6 / args.decode as f64;
    print_profile(&device, args.decode as f64, "decoded token");

    let prefill_tps = args.prefill as f64 / prefill_secs;
    let read_back_tps = args.decode as f64 / read_back_secs;
    if args.json {
        println!(
            "{{\"params\":{params},\"prefill_tokens\":{},\"prefill_tok_s\":{prefill_tps:.1},\"decode_tokens\":{},\"decode_tok_s\":{decode_tps:.1},\"decode_read_back_tok_s\":{read_back_tps:.1},\"dispatches_per_token\":{per_token:.1},\"host_us_per_token\":{host_us:.0}}}",
            args.prefill, args.decode
        );
    } else {
        println!(
            "device: {} ({:?})",
            device.adapter_info().name,
            device.adapter_info().backend
        );
        println!("model: {:.1}M parameters ({weights})", params as f64 / 1e6);
        println!("prefill {} tokens: {prefill_tps:.0} tokens/s", args.prefill);
        println!(
            "decode {} tokens (greedy, as `generate`): {decode_tps:.1} tokens/s",
            args.decode
        );
        println!(
            "decode {} tokens, logits read back each token (the sampling path): {read_back_tps:.1} tokens/s, \
             {per_token:.0} kernel launches per token, {host_us:.0} µs of host recording per token",
            args.decode
        );
    }
    Ok(())
}

/// The kernel profile (`--profile`, `HIERARCHOS_PROFILE=1`) since the last `reset_profile`, as GPU time per
/// `unit` over `count` of them, largest first; nothing when profiling is off.
fn print_profile(device: &Device, count: f64, unit: &str) {
    let profile = device.profile();
    if profile.is_empty() {
        return;
    }
    let total: f64 = profile.iter().map(|k| k.total_ns).sum();
    println!(
        "GPU time per {unit} (--profile): {:.1} µs in kernels",
        total / 1e3 / count
    );
    for k in &profile {
        println!(
            "  {:>10.1} µs  {:>7.1} launches  {}",
            k.total_ns / 1e3 / count,
            k.launches as f64 / count,
            k.kernel
                .lines()
                .next()
                .unwrap_or_default()
                .chars()
                .take(90)
                .collect::<String>()
        );
    }
}

/// A model loaded from `path`, its parameter count and a description of its weights.
fn real_model(path: &str, dequantize: bool, device: &Device) -> Result<(CausalLm, usize, String)> {
    let p = std::path::Path::new(path);
    let model = if p.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        Model::from_gguf(p, device, dequantize)
    } else {
        Model::load(path, None, device)
    }
    .with_context(|| format!("loading {path}"))?;
    let lm = model.lm;
    let mut params = lm.parameter_count();
    let mut types = std::collections::BTreeSet::new();
    // Quantized weights are not parameters (they are frozen); a tied head is a copy of the embedding.
    let tied = lm.config().tie_word_embeddings;
    for (path, l) in lm.linears() {
        if let LinearWeight::Quantized(q) = &l.weight
            && !(tied && path == "lm_head")
        {
            params += q.shape()[0] * q.shape()[1];
            types.insert(q.ggml_type().to_string());
        }
    }
    let weights = if types.is_empty() {
        format!("{path}, f32")
    } else {
        format!("{path}, {}", types.into_iter().collect::<Vec<_>>().join("+"))
    };
    Ok((lm, params, weights))
}

/// A Llama-shaped model of the flags' shape with random weights (f32, or quantized linear layers).
fn random_model(args: &ModelArgs, device: &Device) -> Result<(CausalLm, usize, String)> {
    let device = device.clone();
    let config = args.shape.config(args.prefill.max(args.context) + args.decode)?;
    let quant = match args.quant.as_deref() {
        None => None,
        Some("q4_1") => Some(GgmlType::Q4_1),
        Some("q8_0") => Some(GgmlType::Q8_0),
        Some(other) => anyhow::bail!("--quant {other}: expected q4_1 or q8_0"),
    };
    let mut seed = 0;
    let mut quant_seed = 1 << 32;
    let mut quantized_params = 0;
    let lm = CausalLm::build_with(
        &config,
        &mut |name, shape| {
            seed += 1;
            let t = if name.ends_with("norm.weight") {
                Tensor::ones(shape, DType::F32, &device)?
            } else {
                Tensor::randn(shape, seed, 0, DType::F32, &device)?.mul_scalar(0.02)?
            };
            Ok(t)
        },
        &mut |name, shape| {
            // Only the projections: a random quantized head would not be the embedding matrix it is tied to.
            let Some(ty) = quant.filter(|_| name.ends_with("_proj.weight")) else {
                return Ok(None);
            };
            quant_seed += 1;
            quantized_params += shape[0] * shape[1];
            Ok(Some(QTensor::from_ggml(
                ty,
                &random_blocks(ty, shape[0] * shape[1], quant_seed),
                shape,
                &device,
            )?))
        },
    )?;
    let params: usize = lm.parameters().iter().map(|(_, t)| t.numel()).sum::<usize>() + quantized_params;
    let weights = format!("random, linear layers {}", args.quant.as_deref().unwrap_or("f32"));
    Ok((lm, params, weights))
}

/// The training run to time.
#[derive(clap::Args)]
pub struct TrainBenchArgs {
    /// The shape of the model (random weights).
    #[command(flatten)]
    pub shape: Shape,
    /// Sequences per step.
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 512)]
    pub seq_len: usize,
    /// Timed steps (after one warm-up step).
    #[arg(long, default_value_t = 5)]
    pub steps: usize,
    /// Train a LoRA adapter of this rank (alpha 2r, no dropout) instead of every parameter.
    #[arg(long)]
    pub lora_r: Option<usize>,
    /// The layers the adapter targets: `all-linear` or module names.
    #[arg(long, default_value = "all-linear", requires = "lora_r")]
    pub lora_targets: String,
    /// With --lora-r: hold the frozen model's matrices in this dtype.
    #[arg(long, default_value = "f32", requires = "lora_r")]
    pub base_dtype: DType,
    /// Mixed precision: the dtype of the matrix products (f32, f16 or bf16), as `train --dtype`.
    #[arg(long, default_value = "f32")]
    pub dtype: Precision,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Full-parameter (or LoRA) training throughput (forward, backward, clipping and the AdamW update, f32) of a
/// random-weight Llama shape on random token ids, the kernel launches per step and the peak GPU memory held by
/// tensors.
pub fn train(args: &TrainBenchArgs) -> Result<()> {
    let device = default_device().context("opening the default GPU")?;
    let config = args.shape.config(args.seq_len)?;
    let mut lm = CausalLm::init_random(&config, 0, &device)?;
    let params = lm.parameter_count();
    if let Some(r) = args.lora_r {
        lm.add_lora(
            &LoraConfig::new(r, 2.0 * r as f64, 0.0, TargetModules::parse(&args.lora_targets)),
            0,
        )?;
        if args.base_dtype != DType::F32 {
            lm.store_frozen_in(args.base_dtype)?;
        }
    }
    let trainable: usize = lm.trainable_parameters().iter().map(|(_, p)| p.numel()).sum();
    let rows = args.batch_size * (args.steps + 1);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next_id = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % args.shape.vocab as u64) as u32
    };
    let data = TokenData {
        sequences: (0..rows)
            .map(|_| (0..args.seq_len).map(|_| next_id()).collect())
            .collect(),
        packed: true,
        files: Vec::new(),
    };
    let run = TrainConfig {
        steps: args.steps + 1,
        batch_size: args.batch_size,
        seq_len: args.seq_len,
        grad_accum: 1,
        schedule: Schedule {
            lr: 1e-4,
            scheduler: LrScheduler::Constant,
            warmup_steps: 0,
            total_steps: args.steps + 1,
        },
        adamw: AdamWConfig::default(),
        max_grad_norm: 1.0,
        shuffle: false,
        seed: 0,
        precision: args.dtype,
    };
    let mut trainer = Trainer::new(&lm, run, rows, 0)?;
    // The warm-up step compiles the kernels and fills the buffer pool.
    trainer.step(&data)?;
    device.synchronize()?;
    device.reset_peak();
    device.reset_profile();
    let launches = device.dispatch_count();
    let start = Instant::now();
    let mut last_loss = 0.0;
    // As `hierarchos train` runs: each step's loss read back while the GPU runs the next.
    for _ in 0..args.steps {
        if let Some(s) = trainer.step_ahead(&data)? {
            last_loss = s.loss;
        }
    }
    if let Some(s) = trainer.finish()? {
        last_loss = s.loss;
    }
    let secs = start.elapsed().as_secs_f64();
    let launches_per_step = (device.dispatch_count() - launches) as f64 / args.steps as f64;
    let tokens_per_sec = (args.steps * args.batch_size * args.seq_len) as f64 / secs;
    print_profile(&device, args.steps as f64, "training step");
    let memory = device.memory();
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "params": params,
                "trainable_params": trainable,
                "lora_r": args.lora_r,
                "base_dtype": args.base_dtype.to_string(),
                "dtype": args.dtype.to_string(),
                "batch_size": args.batch_size,
                "seq_len": args.seq_len,
                "steps": args.steps,
                "tokens_per_sec": tokens_per_sec,
                "step_ms": secs * 1e3 / args.steps as f64,
                "peak_bytes": memory.peak_bytes,
                "pooled_bytes": memory.pooled_bytes,
                "launches_per_step": launches_per_step,
                "loss": last_loss,
            })
        );
    } else {
        println!(
            "device: {} ({:?})",
            device.adapter_info().name,
            device.adapter_info().backend
        );
        println!(
            "model: {:.1}M parameters ({:.2}M trained), batch {} x {} tokens, products in {}, AdamW",
            params as f64 / 1e6,
            trainable as f64 / 1e6,
            args.batch_size,
            args.seq_len,
            args.dtype
        );
        println!(
            "training: {tokens_per_sec:.0} tokens/s ({:.1} ms per step, {launches_per_step:.0} kernel launches), peak \
             {:.0} MiB in tensors, {:.0} MiB pooled",
            secs * 1e3 / args.steps as f64,
            memory.peak_bytes as f64 / (1 << 20) as f64,
            memory.pooled_bytes as f64 / (1 << 20) as f64
        );
    }
    Ok(())
}
