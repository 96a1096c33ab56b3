//! Text to token ids and back, as the model's own Hugging Face tokenizer does it: `tokenizer.json` through the
//! `tokenizers` crate, special tokens from `tokenizer_config.json` / `generation_config.json`, and the chat template
//! rendered with `minijinja` the way transformers renders it with Jinja2.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::chat_template::{ChatMessage, SpecialTokens, render_chat_template};
use crate::error::{Error, Result};
use crate::generation_config::GenerationConfig;
use crate::model_files::{Folder, ModelFiles};

/// A model's tokenizer with the special tokens and chat template that generation needs.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
    config_path: PathBuf,
    special: SpecialTokens,
    eos_tokens: Vec<String>,
    eos_ids: Vec<u32>,
    chat_template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("path", &self.path)
            .field("vocab_size", &self.vocab_size())
            .field("special", &self.special)
            .field("eos_tokens", &self.eos_tokens)
            .finish()
    }
}

fn parse_json(text: &str, path: &Path) -> Result<Value> {
    serde_json::from_str(text).map_err(|e| Error::Tokenizer {
        path: path.to_path_buf(),
        message: format!("malformed JSON: {e}"),
    })
}

/// A special token in tokenizer_config.json is either its text or an `AddedToken` object with `content`.
fn token_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

/// transformers 5 builds a Llama tokenizer's pipeline from its config, not from tokenizer.json: no normalizer, a
/// Metaspace pre-tokenizer that puts "▁" before the first piece of text (`legacy: false`, the default), before
/// every piece between special tokens (`legacy: true`) or nowhere (`add_prefix_space: false`), and the matching
/// decoder. Older Llama 2 exports normalize in their tokenizer.json instead, and encode otherwise as saved.
fn llama_pipeline(inner: &mut tokenizers::Tokenizer, config: &Value) -> std::result::Result<(), String> {
    use tokenizers::decoders::{DecoderWrapper, byte_fallback::ByteFallback, fuse::Fuse, strip::Strip};
    use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
    let class = config.get("tokenizer_class").and_then(Value::as_str);
    if !matches!(class, Some("LlamaTokenizer" | "LlamaTokenizerFast"))
        || !matches!(inner.get_model(), tokenizers::ModelWrapper::BPE(_))
    {
        return Ok(());
    }
    let flag = |key: &str, default: bool| config.get(key).and_then(Value::as_bool).unwrap_or(default);
    let add_prefix_space = flag("add_prefix_space", true);
    let scheme = match (add_prefix_space, flag("legacy", false)) {
        (false, _) => PrependScheme::Never,
        (true, true) => PrependScheme::Always,
        (true, false) => PrependScheme::First,
    };
    let space = tokenizers::normalizers::Replace::new("▁", " ").map_err(|e| e.to_string())?;
    let mut decoders = vec![
        DecoderWrapper::Replace(space),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ];
    if add_prefix_space {
        decoders.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
    }
    inner.with_normalizer(None::<tokenizers::NormalizerWrapper>);
    inner.with_pre_tokenizer(Some(Metaspace::new('▁', scheme, false)));
    inner.with_decoder(Some(tokenizers::decoders::sequence::Sequence::new(decoders)));
    Ok(())
}

/// The special tokens transformers reads for a folder: each named one from `tokenizer_config.json`, else from
/// `special_tokens_map.json`, and the additional ones (`additional_special_tokens`, transformers 5's
/// `extra_special_tokens`, a list or named entries).
fn special_tokens(config: &Value, map: &Value) -> SpecialTokens {
    let lookup = |key: &str| match config.get(key) {
        Some(v) if !v.is_null() => Some(v),
        _ => map.get(key),
    };
    let mut special = SpecialTokens::default();
    for name in [
        "bos_token",
        "eos_token",
        "unk_token",
        "sep_token",
        "pad_token",
        "cls_token",
        "mask_token",
    ] {
        if let Some(text) = lookup(name).and_then(token_text) {
            special.named.push((name.to_string(), text));
        }
    }
    for key in ["additional_special_tokens", "extra_special_tokens"] {
        match lookup(key) {
            Some(Value::Array(list)) => special.additional.extend(list.iter().filter_map(token_text)),
            Some(Value::Object(named)) => {
                for (name, v) in named {
                    if let Some(text) = token_text(v) {
                        special.named.push((name.clone(), text.clone()));
                        special.additional.push(text);
                    }
                }
            }
            _ => {}
        }
    }
    special
}

/// Makes the config's special tokens special in `inner` (text holding one maps to its id, as transformers
/// splits it out), and adds the `added_tokens_decoder` entries `tokenizer.json` lacks at the ids they name, where
/// those come next; a special token missing from the vocabulary gets the next id, as transformers gives it.
fn add_missing_tokens(inner: &mut tokenizers::Tokenizer, config: &Value, special: &SpecialTokens) {
    let mut decoder: Vec<(u32, &Value)> = config
        .get("added_tokens_decoder")
        .and_then(Value::as_object)
        .map(|m| m.iter().filter_map(|(id, v)| Some((id.parse().ok()?, v))).collect())
        .unwrap_or_default();
    decoder.sort_by_key(|(id, _)| *id);
    for (id, entry) in decoder {
        let Some(content) = entry.get("content").and_then(Value::as_str) else {
            continue;
        };
        if inner.token_to_id(content).is_none() && id as usize == inner.get_vocab_size(true) {
            let is_special = entry.get("special").and_then(Value::as_bool).unwrap_or(false);
            let token = tokenizers::AddedToken::from(content.to_string(), is_special);
            if is_special {
                inner.add_special_tokens(&[token]);
            } else {
                inner.add_tokens(&[token]);
            }
        }
    }
    let texts = special.named.iter().map(|(_, t)| t).chain(&special.additional);
    let tokens: Vec<tokenizers::AddedToken> = texts
        .filter(|t| !t.is_empty())
        .map(|t| tokenizers::AddedToken::from(t.clone(), true))
        .collect();
    inner.add_special_tokens(&tokens);
}

/// `chat_template` is a string, or a list of `{name, template}` of which transformers uses `default`.
fn chat_template_of(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
        _ => None,
    }
}

fn tokenizer_error(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Tokenizer {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

impl Tokenizer {
    /// The tokenizer of a model folder, or `None` when it has no `tokenizer.json` (ids still work without one).
    pub fn from_dir_if_present(dir: &Path) -> Result<Option<Tokenizer>> {
        if dir.join("tokenizer.json").is_file() {
            Tokenizer::from_dir(dir).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Reads `tokenizer.json` (required) and, where present, `tokenizer_config.json`, `generation_config.json`,
    /// `chat_template.jinja` and `chat_template.json` from a model folder.
    pub fn from_dir(dir: &Path) -> Result<Tokenizer> {
        Tokenizer::from_folder(Folder::Disk(dir))
    }

    /// The tokenizer of model files held in memory (the web demo's), or `None` without a `tokenizer.json`; `dir`
    /// labels the folder in errors.
    pub fn from_model_files(dir: &Path, files: &ModelFiles) -> Result<Option<Tokenizer>> {
        if files.get("tokenizer.json").is_none() {
            return Ok(None);
        }
        Tokenizer::from_folder(Folder::Memory(dir, files)).map(Some)
    }

    fn from_folder(folder: Folder<'_>) -> Result<Tokenizer> {
        let path = folder.path("tokenizer.json");
        let bytes = folder.bytes("tokenizer.json")?.ok_or_else(|| Error::Io {
            path: path.clone(),
            source: std::io::ErrorKind::NotFound.into(),
        })?;
        let mut inner = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| tokenizer_error(&path, e))?;

        let json_file = |name: &str| -> Result<Value> {
            match folder.text(name)? {
                Some(text) => parse_json(&text, &folder.path(name)),
                None => Ok(Value::Null),
            }
        };
        let config_path = folder.path("tokenizer_config.json");
        let config = json_file("tokenizer_config.json")?;
        llama_pipeline(&mut inner, &config).map_err(|e| tokenizer_error(&config_path, e))?;
        let special = special_tokens(&config, &json_file("special_tokens_map.json")?);
        add_missing_tokens(&mut inner, &config, &special);

        let mut eos_tokens: Vec<String> = special.get("eos_token").map(str::to_string).into_iter().collect();
        let mut eos_ids = GenerationConfig::read(folder)?.eos_ids.unwrap_or_default();
        for token in &eos_tokens {
            if let Some(id) = inner.token_to_id(token)
                && !eos_ids.contains(&id)
            {
                eos_ids.push(id);
            }
        }
        for &id in &eos_ids {
            if let Some(token) = inner.id_to_token(id)
                && !eos_tokens.contains(&token)
            {
                eos_tokens.push(token);
            }
        }

        // As transformers' tokenizer takes it: chat_template.jinja, else the config's; chat_template.json (a
        // processor's file, which the tokenizer ignores) only where neither has one.
        let chat_template = match folder.text("chat_template.jinja")? {
            Some(t) => Some(t),
            None => match config.get("chat_template").and_then(chat_template_of) {
                Some(t) => Some(t),
                None => json_file("chat_template.json")?
                    .get("chat_template")
                    .and_then(chat_template_of),
            },
        };

        Ok(Tokenizer {
            inner,
            path,
            config_path,
            special,
            eos_tokens,
            eos_ids,
            chat_template,
        })
    }

    /// A tokenizer assembled elsewhere (from GGUF metadata); `path` is the file it came from, named in errors.
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn from_parts(
        inner: tokenizers::Tokenizer,
        path: &Path,
        bos_token: Option<String>,
        eos_tokens: Vec<String>,
        pad_token: Option<String>,
        eos_ids: Vec<u32>,
        chat_template: Option<String>,
    ) -> Tokenizer {
        let named = [
            ("bos_token", bos_token),
            ("eos_token", eos_tokens.first().cloned()),
            ("pad_token", pad_token),
        ];
        let special = SpecialTokens {
            named: named
                .into_iter()
                .filter_map(|(name, text)| Some((name.to_string(), text?)))
                .collect(),
            additional: Vec::new(),
        };
        Tokenizer {
            inner,
            path: path.to_path_buf(),
            config_path: path.to_path_buf(),
            special,
            eos_tokens,
            eos_ids,
            chat_template,
        }
    }

    /// The `tokenizer.json` this was read from (for error messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of tokens, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Token ids of `text`; `add_special_tokens` applies the tokenizer's post-processor (e.g. a leading BOS).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| tokenizer_error(&self.path, e))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The text of `ids`; `skip_special_tokens` drops BOS, EOS and the like.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| tokenizer_error(&self.path, e))
    }

    /// An incremental decoder for streaming: it hands out text only once it is complete UTF-8 and stable.
    pub fn decode_stream(&self, skip_special_tokens: bool) -> DecodeStream<'_> {
        DecodeStream {
            tokenizer: self,
            skip_special_tokens,
            ids: Vec::new(),
            prefix: String::new(),
            prefix_index: 0,
        }
    }

    /// The id of a token's text, if it is in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The text of the beginning-of-sequence token, if the tokenizer has one.
    pub fn bos_token(&self) -> Option<&str> {
        self.special.get("bos_token")
    }

    /// The special tokens the tokenizer's config names (what a chat template sees).
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special
    }

    /// The texts of the end-of-sequence tokens (tokenizer_config.json's `eos_token` and generation_config.json's).
    pub fn eos_tokens(&self) -> &[String] {
        &self.eos_tokens
    }

    /// The ids generation stops on: generation_config.json's `eos_token_id` (one or a list) and the `eos_token`.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// The padding token's id, if one is configured.
    pub fn pad_id(&self) -> Option<u32> {
        self.special.get("pad_token").and_then(|t| self.inner.token_to_id(t))
    }

    /// The Jinja chat template, if the model has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Renders the chat template over `messages` as transformers' `apply_chat_template(tokenize=False)` does;
    /// encode the result with `add_special_tokens = false` (the template writes BOS itself).
    pub fn apply_chat_template(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let template = self.chat_template.as_deref().ok_or_else(|| Error::Tokenizer {
            path: self.config_path.clone(),
            message: "no chat_template (nor chat_template.jinja / chat_template.json beside it)".into(),
        })?;
        render_chat_template(template, messages, add_generation_prompt, &self.special).map_err(|message| {
            Error::Tokenizer {
                path: self.config_path.clone(),
                message,
            }
        })
    }
}

/// Streaming detokenizer of [`Tokenizer::decode_stream`]: byte-level tokens that split a character, and
/// tokenizers that merge spaces across tokens, produce text only once decoding the ids is settled.
pub struct DecodeStream<'a> {
    tokenizer: &'a Tokenizer,
    skip_special_tokens: bool,
    ids: Vec<u32>,
    prefix: String,
    prefix_index: usize,
}

impl DecodeStream<'_> {
    /// Feeds one id; returns the new text it completes, if any.
    pub fn step(&mut self, id: u32) -> Result<Option<String>> {
        tokenizers::tokenizer::step_decode_stream(
            &*self.tokenizer.inner,
            vec![id],
            self.skip_special_tokens,
            &mut self.ids,
            &mut self.prefix,
            &mut self.prefix_index,
        )
        .map_err(|e| tokenizer_error(&self.tokenizer.path, e))
    }
}
