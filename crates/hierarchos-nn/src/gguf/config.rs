//! [`ModelConfig`] from GGUF metadata: llama.cpp writes the Hugging Face config as `{arch}.*` keys (the same key
//! names for every family), and the presence of bias and norm tensors says what `config.json` flags would say.

use crate::config::{ModelConfig, RopeConfig, RopeScaling};
use crate::error::{Error, Result};
use crate::gguf::reader::{Gguf, Value};
use crate::registry::Family;

/// Typed reads of metadata keys, with errors naming the key.
pub(crate) struct Meta<'a> {
    pub(crate) gguf: &'a Gguf,
}

impl Meta<'_> {
    pub(crate) fn error(&self, key: &str, message: &str) -> Error {
        Error::Config {
            path: self.gguf.path().to_path_buf(),
            message: format!("GGUF metadata `{key}`: {message}"),
        }
    }

    fn read<T>(&self, key: &str, expected: &str, read: impl Fn(&Value) -> Option<T>) -> Result<Option<T>> {
        match self.gguf.get(key) {
            None => Ok(None),
            Some(v) => read(v)
                .map(Some)
                .ok_or_else(|| self.error(key, &format!("expected {expected}, found {}", v.describe()))),
        }
    }

    pub(crate) fn usize(&self, key: &str) -> Result<Option<usize>> {
        self.read(key, "a non-negative integer", |v| {
            v.as_u64().and_then(|n| usize::try_from(n).ok())
        })
    }

    pub(crate) fn u32(&self, key: &str) -> Result<Option<u32>> {
        self.read(key, "a token id", |v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
    }

    pub(crate) fn f64(&self, key: &str) -> Result<Option<f64>> {
        self.read(key, "a number", Value::as_f64)
    }

    pub(crate) fn str(&self, key: &str) -> Result<Option<&str>> {
        match self.gguf.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.error(key, &format!("expected a string, found {}", v.describe()))),
        }
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn bool(&self, key: &str) -> Result<Option<bool>> {
        self.read(key, "true or false", Value::as_bool)
    }

    fn positive(&self, key: &str) -> Result<usize> {
        match self.usize(key)? {
            None => Err(self.error(key, "missing")),
            Some(0) => Err(self.error(key, "must be positive")),
            Some(n) => Ok(n),
        }
    }
}

/// The family named by `general.architecture`.
pub fn architecture(gguf: &Gguf) -> Result<Family> {
    let meta = Meta { gguf };
    let arch = meta
        .str("general.architecture")?
        .ok_or_else(|| meta.error("general.architecture", "missing"))?;
    Family::from_model_type(arch, gguf.path())
}

/// Reads the model configuration of a GGUF file; architectures Hierarchos does not run fail closed.
pub fn model_config(gguf: &Gguf) -> Result<ModelConfig> {
    let family = architecture(gguf)?;
    if !matches!(family, Family::Llama | Family::Mistral | Family::Qwen2 | Family::Qwen3) {
        return Err(Meta { gguf }.error(
            "general.architecture",
            &format!("GGUF files of {} are not supported yet", family.model_type()),
        ));
    }
    let m = Meta { gguf };
    let arch = family.model_type();
    let key = |k: &str| format!("{arch}.{k}");
    let hidden_size = m.positive(&key("embedding_length"))?;
    let num_attention_heads = m.positive(&key("attention.head_count"))?;
    let num_key_value_heads = m.usize(&key("attention.head_count_kv"))?.unwrap_or(num_attention_heads);
    if num_key_value_heads == 0 || !num_attention_heads.is_multiple_of(num_key_value_heads) {
        return Err(m.error(
            &key("attention.head_count_kv"),
            &format!("{num_key_value_heads} does not divide the {num_attention_heads} heads"),
        ));
    }
    let head_dim = match m.usize(&key("attention.key_length"))? {
        Some(0) => return Err(m.error(&key("attention.key_length"), "must be positive")),
        Some(d) => d,
        None if hidden_size.is_multiple_of(num_attention_heads) => hidden_size / num_attention_heads,
        None => {
            return Err(m.error(
                &key("attention.head_count"),
                &format!("{num_attention_heads} heads do not divide embedding_length {hidden_size}"),
            ));
        }
    };
    if let Some(v) = m.usize(&key("attention.value_length"))?
        && v != head_dim
    {
        return Err(m.error(
            &key("attention.value_length"),
            &format!("{v} differs from the key length {head_dim} (not supported)"),
        ));
    }
    if let Some(r) = m.usize(&key("rope.dimension_count"))?
        && r != head_dim
    {
        return Err(m.error(
            &key("rope.dimension_count"),
            &format!("rotary over {r} of {head_dim} head dimensions (partial rotary) is not supported"),
        ));
    }
    if gguf.tensor("rope_freqs.weight").is_some() {
        return Err(m.error(
            &key("rope"),
            "per-frequency rope factors (tensor rope_freqs.weight, Llama 3.1 scaling) are not supported",
        ));
    }
    let max_position_embeddings = m.usize(&key("context_length"))?.unwrap_or(2048);
    let rms_norm_eps = m.f64(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-6);
    if !(rms_norm_eps > 0.0 && rms_norm_eps.is_finite()) {
        return Err(m.error(&key("attention.layer_norm_rms_epsilon"), "must be positive"));
    }
    let theta = m.f64(&key("rope.freq_base"))?.unwrap_or(10000.0);
    if !(theta > 0.0 && theta.is_finite()) {
        return Err(m.error(&key("rope.freq_base"), "must be positive"));
    }
    let vocab_size = match m.usize(&key("vocab_size"))? {
        Some(n) => n,
        None => gguf
            .get("tokenizer.ggml.tokens")
            .and_then(Value::as_array)
            .map(<[Value]>::len)
            .ok_or_else(|| m.error(&key("vocab_size"), "missing, and no tokenizer.ggml.tokens to count"))?,
    };
    if vocab_size == 0 {
        return Err(m.error(&key("vocab_size"), "must be positive"));
    }
    let has = |name: &str| gguf.tensor(name).is_some();
    let (attention_bias, o_proj_bias, mlp_bias) = match family {
        Family::Qwen2 => (true, false, false),
        _ => (
            has("blk.0.attn_q.bias"),
            has("blk.0.attn_output.bias"),
            has("blk.0.ffn_up.bias"),
        ),
    };
    let eos_token_ids = ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"]
        .iter()
        .filter_map(|k| m.u32(k).transpose())
        .collect::<Result<Vec<u32>>>()?
        .into_iter()
        .fold(Vec::new(), |mut ids, id| {
            if !ids.contains(&id) {
                ids.push(id);
            }
            ids
        });
    Ok(ModelConfig {
        model_type: arch.to_string(),
        head_dim,
        max_position_embeddings,
        rms_norm_eps,
        rope: RopeConfig {
            theta,
            scaling: rope_scaling(&m, arch, max_position_embeddings)?,
        },
        rotary_dim: head_dim,
        tie_word_embeddings: !has("output.weight"),
        attention_bias,
        o_proj_bias,
        mlp_bias,
        qk_norm: family == Family::Qwen3,
        bos_token_id: m.u32("tokenizer.ggml.bos_token_id")?,
        eos_token_ids,
        ..ModelConfig::llama(
            vocab_size,
            hidden_size,
            m.positive(&key("feed_forward_length"))?,
            m.positive(&key("block_count"))?,
            num_attention_heads,
            num_key_value_heads,
        )
    })
}

/// `{arch}.rope.scaling.*`: none, linear or yarn (llama.cpp's names).
fn rope_scaling(m: &Meta, arch: &str, max_position_embeddings: usize) -> Result<RopeScaling> {
    let key = |k: &str| format!("{arch}.rope.scaling.{k}");
    let kind = m.str(&key("type"))?.unwrap_or("none");
    let factor = || -> Result<f64> {
        match m.f64(&key("factor"))? {
            Some(f) if f > 0.0 && f.is_finite() => Ok(f),
            Some(_) => Err(m.error(&key("factor"), "must be positive")),
            None => Err(m.error(&key("factor"), "missing")),
        }
    };
    Ok(match kind {
        "none" => RopeScaling::Default,
        "linear" => RopeScaling::Linear { factor: factor()? },
        "yarn" => RopeScaling::Yarn {
            factor: factor()?,
            original_max_position_embeddings: m
                .usize(&key("original_context_length"))?
                .unwrap_or(max_position_embeddings),
            beta_fast: m.f64(&key("yarn_beta_fast"))?.unwrap_or(32.0),
            beta_slow: m.f64(&key("yarn_beta_slow"))?.unwrap_or(1.0),
            attention_factor: None,
        },
        other => {
            return Err(m.error(
                &key("type"),
                &format!("unsupported rope scaling '{other}'; supported: none, linear, yarn"),
            ));
        }
    })
}
