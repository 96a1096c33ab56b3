//! GGUF tensors under their Hugging Face names: llama.cpp's names mapped back (`blk.N.attn_q.weight` is
//! `model.layers.N.self_attn.q_proj.weight`), the rows of Llama's q/k projections put back in the order of the
//! Hugging Face rope layout, and the values dequantized to f32.

use std::borrow::Cow;

use hierarchos_core::quant::{GgmlType, QTensor, dequantize};
use hierarchos_core::{Device, Tensor};

use crate::config::ModelConfig;
use crate::decoder::CausalLm;
use crate::error::{Error, Result};
use crate::gguf::reader::Gguf;

/// The llama.cpp name of a Hugging Face decoder tensor, if it has one.
pub fn gguf_name(hf: &str) -> Option<String> {
    match hf {
        "model.embed_tokens.weight" => return Some("token_embd.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    let (module, suffix) = rest.rsplit_once('.')?;
    let short = match module {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{short}.{suffix}"))
}

impl Gguf {
    fn weights_error(&self, message: String) -> Error {
        Error::Weights {
            path: self.path().to_path_buf(),
            message,
        }
    }

    /// The stored blocks of the Hugging Face tensor `hf` with its type, checked to have `shape`; the rows of
    /// Llama's q/k projections are reordered from llama.cpp's interleaved rope layout back to the Hugging Face
    /// one (whole rows move, so this works on quantized blocks too).
    pub fn hf_tensor_bytes(
        &self,
        hf: &str,
        shape: &[usize],
        config: &ModelConfig,
    ) -> Result<(GgmlType, Cow<'_, [u8]>)> {
        let name = gguf_name(hf).ok_or_else(|| self.weights_error(format!("tensor '{hf}' has no GGUF counterpart")))?;
        let info = self.tensor(&name).ok_or_else(|| {
            self.weights_error(format!("tensor '{name}' ('{hf}', expected shape {shape:?}) is missing"))
        })?;
        if info.shape() != shape {
            return Err(self.weights_error(format!(
                "tensor '{name}' ('{hf}'): expected shape {shape:?}, found {:?}",
                info.shape()
            )));
        }
        let bytes = self.tensor_bytes(&name)?;
        let heads = match hf.rsplit('.').nth(1) {
            Some("q_proj") => config.num_attention_heads,
            Some("k_proj") => config.num_key_value_heads,
            _ => 0,
        };
        if heads == 0 || !matches!(config.model_type.as_str(), "llama" | "mistral") {
            return Ok((info.ty, Cow::Borrowed(bytes)));
        }
        let d = config.head_dim;
        let rows = shape[0];
        if !d.is_multiple_of(2) || rows != heads * d || bytes.is_empty() {
            return Err(self.weights_error(format!(
                "tensor '{name}': {rows} rows are not {heads} heads of an even head_dim {d}"
            )));
        }
        let row_bytes = bytes.len() / rows;
        let half = d / 2;
        let mut out = Vec::with_capacity(bytes.len());
        for r in 0..rows {
            let (h, i) = (r / d, r % d);
            let src = h * d + 2 * (i % half) + i / half;
            out.extend_from_slice(&bytes[src * row_bytes..(src + 1) * row_bytes]);
        }
        Ok((info.ty, Cow::Owned(out)))
    }

    /// The values of the Hugging Face tensor `hf` as f32 (see [`Gguf::hf_tensor_bytes`]), dequantized exactly as
    /// ggml does.
    pub fn hf_tensor_f32(&self, hf: &str, shape: &[usize], config: &ModelConfig) -> Result<Vec<f32>> {
        let (ty, bytes) = self.hf_tensor_bytes(hf, shape, config)?;
        dequantize(ty, &bytes, shape.iter().product())
            .map_err(|e| self.weights_error(format!("tensor '{hf}' ({}): {e}", gguf_name(hf).unwrap_or_default())))
    }

    /// Builds the decoder of `config` on `device`. With `dequantize`, every weight becomes f32 (trainable, e.g.
    /// for LoRA); otherwise the quantized linear weights stay in their block format on the GPU and only
    /// embeddings, norms and float tensors are converted.
    pub fn load(&self, config: &ModelConfig, device: &Device, dequantize: bool) -> Result<CausalLm> {
        CausalLm::build_with(
            config,
            &mut |name, shape| {
                let data = self.hf_tensor_f32(name, shape, config)?;
                Ok(Tensor::from_slice(&data, shape, device)?)
            },
            &mut |name, shape| {
                if dequantize {
                    return Ok(None);
                }
                let (ty, bytes) = self.hf_tensor_bytes(name, &shape, config)?;
                if ty.is_float() {
                    return Ok(None);
                }
                Ok(Some(QTensor::from_ggml(ty, &bytes, shape, device).map_err(|e| {
                    self.weights_error(format!(
                        "tensor '{name}' ({}): {e}",
                        gguf_name(name).unwrap_or_default()
                    ))
                })?))
            },
        )
    }
}
