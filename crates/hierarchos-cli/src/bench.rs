//! `hierarchos bench ops`: throughput of the core kernels, printed as a table or JSON lines so that
//! `scripts/bench_ops.py` can set them beside PyTorch on the same GPU.

use std::time::Instant;

use anyhow::{Context, Result};
use hierarchos_core::{DType, Device, Tensor, default_device};

/// What to measure.
#[derive(clap::Args)]
pub struct OpsArgs {
    /// Square matmul sizes.
    #[arg(long, value_delimiter = ',', default_value = "512,1024,2048,4096")]
    pub sizes: Vec<usize>,
    /// Rows × columns of the softmax, elementwise and reduction benchmarks.
    #[arg(long, value_delimiter = ',', default_value = "8192,4096")]
    pub rows_cols: Vec<usize>,
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
            "{op:<12} {shape:<16} {dtype:<5} {:>10.3} ms {value:>10.1} {unit}",
            secs * 1e3
        );
    }
}

pub fn ops(args: &OpsArgs) -> Result<()> {
    let device = default_device().context("opening the default GPU")?;
    if !args.json {
        println!(
            "device: {} ({:?})",
            device.adapter_info().name,
            device.adapter_info().backend
        );
    }
    for dtype in [DType::F32, DType::F16] {
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
    Ok(())
}
