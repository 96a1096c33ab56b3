//! Loads a Hugging Face model folder (or Hub id) and streams a generation through the library API.
//! Run with `cargo run --example generate -- [MODEL] [PROMPT] [NEW_TOKENS]`; the model defaults to the tiny
//! Llama fixture in `tests/fixtures/llama`.

use std::io::Write;

use hierarchos::core::default_device;
use hierarchos::nn::{Model, SamplingConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let model_arg = args
        .next()
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/llama").into());
    let prompt = args.next().unwrap_or_else(|| "Alice was beginning to get very".into());
    let new_tokens: usize = args.next().map_or(Ok(24), |n| n.parse())?;

    let device = default_device()?;
    let model = Model::load(&model_arg, None, &device)?;
    let prompt_ids = model.encode_prompt(&prompt, false)?;
    // Greedy; set a temperature (and top_k / top_p / min_p) to sample, with `seed` fixing the draws.
    let sampling = SamplingConfig::default();

    print!("{prompt}");
    let mut stdout = std::io::stdout();
    let generation = model.generate(&prompt_ids, new_tokens, &sampling, &[], |_id, text| {
        print!("{text}");
        stdout
            .flush()
            .map_err(|e| hierarchos::nn::Error::Invalid(e.to_string()))
    })?;
    println!();
    eprintln!(
        "{} tokens in {:.2} s: prefill {:.1} tokens/s, decode {:.1} tokens/s",
        generation.ids.len(),
        generation.prefill_secs + generation.decode_secs,
        generation.prefill_tokens_per_sec(),
        generation.decode_tokens_per_sec()
    );
    Ok(())
}
