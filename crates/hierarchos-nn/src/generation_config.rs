//! `generation_config.json`: what transformers' `generate()` does for a model when told nothing else, its end
//! tokens and how it picks each token, so that a model generates here as its authors set it up.

use serde_json::Value;

use crate::error::{Error, Result};
use crate::model_files::Folder;
use crate::sampling::SamplingConfig;

/// The settings of a model folder's `generation_config.json` that Hierarchos applies.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationConfig {
    /// `eos_token_id` (one id or a list), when the file sets it.
    pub eos_ids: Option<Vec<u32>>,
    /// How tokens are picked: the argmax unless `do_sample`, and then transformers' defaults (temperature 1,
    /// top-k 50) for what the file leaves out; `repetition_penalty` either way, as transformers applies it.
    pub sampling: SamplingConfig,
    /// Settings that change what transformers' `generate()` picks but that are not applied here (beam search,
    /// n-gram bans, suppressed tokens, ...), each as `name = value`: the model warns of them once loaded.
    pub ignored: Vec<String>,
}

/// Settings that change the picked tokens and are not applied here: any value but transformers' neutral one is
/// reported in [`GenerationConfig::ignored`].
const NOT_APPLIED: [&str; 16] = [
    "num_beams",
    "no_repeat_ngram_size",
    "bad_words_ids",
    "suppress_tokens",
    "begin_suppress_tokens",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "min_length",
    "min_new_tokens",
    "typical_p",
    "epsilon_cutoff",
    "eta_cutoff",
    "exponential_decay_length_penalty",
    "sequence_bias",
    "penalty_alpha",
    "guidance_scale",
];

/// Whether `value` of setting `name` leaves transformers' generation as without it.
fn is_neutral(name: &str, value: &Value) -> bool {
    let number = value.as_f64();
    match name {
        "num_beams" | "typical_p" | "guidance_scale" => value.is_null() || number == Some(1.0),
        "no_repeat_ngram_size" | "min_length" | "min_new_tokens" | "epsilon_cutoff" | "eta_cutoff" => {
            value.is_null() || number == Some(0.0)
        }
        "bad_words_ids" | "suppress_tokens" | "begin_suppress_tokens" | "sequence_bias" => {
            value.is_null()
                || value.as_array().is_some_and(Vec::is_empty)
                || value.as_object().is_some_and(|o| o.is_empty())
        }
        _ => value.is_null(),
    }
}

impl GenerationConfig {
    /// `generation_config.json` of `folder`; the defaults (greedy, no end tokens of its own) without one.
    pub(crate) fn read(folder: Folder<'_>) -> Result<GenerationConfig> {
        let path = folder.path("generation_config.json");
        let Some(text) = folder.text("generation_config.json")? else {
            return Ok(GenerationConfig::default());
        };
        let invalid = |message: String| Error::Config {
            path: path.clone(),
            message,
        };
        let json: Value = serde_json::from_str(&text).map_err(|e| invalid(format!("malformed JSON: {e}")))?;
        let Value::Object(map) = &json else {
            return Err(invalid("expected a JSON object".into()));
        };
        let eos_ids = match map.get("eos_token_id") {
            None | Some(Value::Null) => None,
            Some(v) => Some(token_ids(v).ok_or_else(|| {
                invalid(format!(
                    "eos_token_id: expected a token id or a list of them, found {v}"
                ))
            })?),
        };
        let number = |key: &str| -> Result<Option<f64>> {
            match map.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_f64()
                    .map(Some)
                    .ok_or_else(|| invalid(format!("{key}: expected a number, found {v}"))),
            }
        };
        let do_sample = match map.get("do_sample") {
            None | Some(Value::Null) => false,
            Some(v) => v
                .as_bool()
                .ok_or_else(|| invalid(format!("do_sample: expected true or false, found {v}")))?,
        };
        let repetition_penalty = number("repetition_penalty")?.unwrap_or(1.0) as f32;
        let sampling = if do_sample {
            let top_k = number("top_k")?.unwrap_or(50.0);
            if !(top_k >= 0.0 && top_k.fract() == 0.0) {
                return Err(invalid(format!(
                    "top_k: expected a non-negative integer, found {top_k}"
                )));
            }
            SamplingConfig {
                temperature: number("temperature")?.unwrap_or(1.0) as f32,
                top_k: top_k as usize,
                top_p: number("top_p")?.unwrap_or(1.0) as f32,
                min_p: number("min_p")?.unwrap_or(0.0) as f32,
                repetition_penalty,
                seed: 0,
            }
        } else {
            SamplingConfig {
                repetition_penalty,
                ..SamplingConfig::default()
            }
        };
        sampling.validate().map_err(|e| invalid(e.to_string()))?;
        let ignored = NOT_APPLIED
            .iter()
            .filter_map(|name| {
                let value = map.get(*name)?;
                (!is_neutral(name, value)).then(|| format!("{name} = {value}"))
            })
            .collect();
        Ok(GenerationConfig {
            eos_ids,
            sampling,
            ignored,
        })
    }
}

/// One token id or a list of them.
fn token_ids(v: &Value) -> Option<Vec<u32>> {
    let one = |v: &Value| v.as_u64().and_then(|id| u32::try_from(id).ok());
    match v {
        Value::Array(list) => list.iter().map(one).collect(),
        v => one(v).map(|id| vec![id]),
    }
}
