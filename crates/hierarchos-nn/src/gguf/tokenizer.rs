//! The tokenizer stored in GGUF metadata (`tokenizer.ggml.*`) rebuilt as the `tokenizers` tokenizer the model was
//! trained with: a byte-level BPE with the vocabulary and merges of the file, the pre-tokenizer that
//! `tokenizer.ggml.pre` names (llama.cpp's name for the original tokenizer's split regex), the special tokens by
//! their token types, and the chat template.

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use crate::error::{Error, Result};
use crate::gguf::config::Meta;
use crate::gguf::reader::{Gguf, Value};
use crate::tokenizer::Tokenizer;

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;

/// Llama 3's split regex (llama.cpp pre-tokenizer `llama-bpe`).
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split regex (llama.cpp pre-tokenizer `qwen2`).
const QWEN2_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The `tokenizer.ggml.pre` values understood, for the error listing them.
const SUPPORTED_PRE: &str = "gpt2, smollm, starcoder, refact, codeshell, command-r, llama-bpe, llama3, qwen2";

/// Builds the tokenizer of a GGUF file (`tokenizer.ggml.model` `gpt2`: byte-level BPE).
pub fn tokenizer(gguf: &Gguf) -> Result<Tokenizer> {
    let m = Meta { gguf };
    let bad = |key: &str, message: &str| Error::Tokenizer {
        path: gguf.path().to_path_buf(),
        message: format!("GGUF metadata `{key}`: {message}"),
    };
    match m.str("tokenizer.ggml.model")? {
        Some("gpt2") => {}
        Some(other) => {
            return Err(bad(
                "tokenizer.ggml.model",
                &format!("tokenizer model '{other}' is not supported (supported: gpt2, the byte-level BPE)"),
            ));
        }
        None => return Err(bad("tokenizer.ggml.model", "missing: the file has no tokenizer")),
    }
    let tokens = strings(gguf, "tokenizer.ggml.tokens")?;
    if tokens.is_empty() || u32::try_from(tokens.len()).is_err() {
        return Err(bad("tokenizer.ggml.tokens", &format!("{} tokens", tokens.len())));
    }
    let types: Option<Vec<i32>> = match gguf.get("tokenizer.ggml.token_type") {
        None => None,
        Some(v) => Some(
            v.as_array()
                .and_then(|items| {
                    items
                        .iter()
                        .map(|t| match t {
                            Value::I32(t) => Some(*t),
                            other => other.as_u64().and_then(|t| i32::try_from(t).ok()),
                        })
                        .collect::<Option<Vec<i32>>>()
                })
                .filter(|t| t.len() == tokens.len())
                .ok_or_else(|| {
                    bad(
                        "tokenizer.ggml.token_type",
                        &format!("expected {} integers, found {}", tokens.len(), v.describe()),
                    )
                })?,
        ),
    };
    let merges = strings(gguf, "tokenizer.ggml.merges")?
        .iter()
        .enumerate()
        .map(|(i, merge)| {
            // llama.cpp splits at the first space after the first character (a merge part is never empty).
            let split = merge.char_indices().skip(1).find(|&(_, c)| c == ' ').map(|(at, _)| at);
            split
                .map(|at| (merge[..at].to_string(), merge[at + 1..].to_string()))
                .ok_or_else(|| {
                    bad(
                        "tokenizer.ggml.merges",
                        &format!("merge #{i} {merge:?} is not two tokens separated by a space"),
                    )
                })
        })
        .collect::<Result<Vec<(String, String)>>>()?;
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.to_string(), i as u32))
        .collect();
    let model = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| bad("tokenizer.ggml.merges", &e.to_string()))?;
    let mut inner = tokenizers::Tokenizer::new(model);

    let pre = m.str("tokenizer.ggml.pre")?.unwrap_or("gpt2");
    let byte_level = |use_regex: bool| PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, use_regex));
    let split = |regex: &str| -> Result<PreTokenizerWrapper> {
        Split::new(
            SplitPattern::Regex(regex.into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map(PreTokenizerWrapper::Split)
        .map_err(|e| bad("tokenizer.ggml.pre", &e.to_string()))
    };
    let pre_tokenizer = match pre {
        "gpt2" | "default" => byte_level(true),
        "smollm" | "starcoder" | "refact" | "codeshell" | "command-r" => {
            PreTokenizerWrapper::Sequence(Sequence::new(vec![
                PreTokenizerWrapper::Digits(Digits::new(true)),
                byte_level(true),
            ]))
        }
        "llama-bpe" | "llama3" | "llama-v3" => {
            PreTokenizerWrapper::Sequence(Sequence::new(vec![split(LLAMA3_REGEX)?, byte_level(false)]))
        }
        "qwen2" => {
            inner.with_normalizer(Some(NFC));
            PreTokenizerWrapper::Sequence(Sequence::new(vec![split(QWEN2_REGEX)?, byte_level(false)]))
        }
        other => {
            return Err(bad(
                "tokenizer.ggml.pre",
                &format!("pre-tokenizer '{other}' is not supported; supported: {SUPPORTED_PRE}"),
            ));
        }
    };
    inner.with_pre_tokenizer(Some(pre_tokenizer));
    inner.with_decoder(Some(ByteLevelDecoder::default()));

    // Control tokens are special (skipped when decoding with `skip_special_tokens`); user-defined ones are
    // matched whole but are text. Without token types, the ids named in the metadata are the special ones.
    let (special, user): (Vec<AddedToken>, Vec<AddedToken>) = match &types {
        Some(types) => tokens
            .iter()
            .zip(types)
            .filter(|&(_, &t)| t == CONTROL || t == USER_DEFINED)
            .map(|(token, &t)| AddedToken::from(token.to_string(), t == CONTROL).normalized(false))
            .partition(|t| t.special),
        None => (
            [
                "tokenizer.ggml.bos_token_id",
                "tokenizer.ggml.eos_token_id",
                "tokenizer.ggml.unknown_token_id",
                "tokenizer.ggml.padding_token_id",
            ]
            .iter()
            .filter_map(|key| m.u32(key).transpose())
            .collect::<Result<Vec<u32>>>()?
            .into_iter()
            .filter_map(|id| tokens.get(id as usize))
            .map(|token| AddedToken::from(token.to_string(), true).normalized(false))
            .collect(),
            Vec::new(),
        ),
    };
    inner.add_special_tokens(&special);
    inner.add_tokens(&user);

    let token_of = |key: &str| -> Result<Option<String>> {
        match m.u32(key)? {
            None => Ok(None),
            Some(id) => tokens
                .get(id as usize)
                .map(|t| Some(t.to_string()))
                .ok_or_else(|| bad(key, &format!("id {id} is past the {} tokens", tokens.len()))),
        }
    };
    let bos_token = token_of("tokenizer.ggml.bos_token_id")?;
    let pad_token = token_of("tokenizer.ggml.padding_token_id")?;
    let mut eos_tokens = Vec::new();
    let mut eos_ids = Vec::new();
    for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"] {
        if let (Some(token), Some(id)) = (token_of(key)?, m.u32(key)?)
            && !eos_ids.contains(&id)
        {
            eos_ids.push(id);
            eos_tokens.push(token);
        }
    }
    let add_bos = m.bool("tokenizer.ggml.add_bos_token")?.unwrap_or(false);
    let add_eos = m.bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
    if add_bos || add_eos {
        let mut ends = Vec::new();
        let mut single = Vec::new();
        if add_bos {
            let token = bos_token
                .clone()
                .ok_or_else(|| bad("tokenizer.ggml.bos_token_id", "missing, but add_bos_token is set"))?;
            single.push(token.clone());
            ends.push((token, m.u32("tokenizer.ggml.bos_token_id")?.unwrap_or_default()));
        }
        single.push("$A".into());
        if add_eos {
            let (token, id) = eos_tokens
                .first()
                .cloned()
                .zip(eos_ids.first().copied())
                .ok_or_else(|| bad("tokenizer.ggml.eos_token_id", "missing, but add_eos_token is set"))?;
            single.push(token.clone());
            ends.push((token, id));
        }
        let mut builder = TemplateProcessing::builder();
        let processor = builder
            .try_single(single.join(" "))
            .map_err(|e| bad("tokenizer.ggml.add_bos_token", &e))?
            .special_tokens(ends)
            .build()
            .map_err(|e| bad("tokenizer.ggml.add_bos_token", &e.to_string()))?;
        inner.with_post_processor(Some(processor));
    }
    let chat_template = m.str("tokenizer.chat_template")?.map(str::to_string);
    Ok(Tokenizer::from_parts(
        inner,
        gguf.path(),
        bos_token,
        eos_tokens,
        pad_token,
        eos_ids,
        chat_template,
    ))
}

/// The array of strings under `key` (required).
fn strings<'a>(gguf: &'a Gguf, key: &str) -> Result<Vec<&'a str>> {
    let bad = |message: String| Error::Tokenizer {
        path: gguf.path().to_path_buf(),
        message: format!("GGUF metadata `{key}`: {message}"),
    };
    let value = gguf.get(key).ok_or_else(|| bad("missing".into()))?;
    value
        .as_array()
        .and_then(|items| items.iter().map(Value::as_str).collect::<Option<Vec<&str>>>())
        .ok_or_else(|| bad(format!("expected an array of strings, found {}", value.describe())))
}
