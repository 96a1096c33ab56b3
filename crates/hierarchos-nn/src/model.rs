//! A model folder or Hub id turned into something that answers prompts: configuration, weights, the decoder and
//! (when the folder has one) its tokenizer, with the end-of-sequence ids transformers would stop on.

use std::path::{Path, PathBuf};

use crate::chat_template::ChatMessage;
use crate::error::{Error, Result};
use crate::generate::{Generation, StopConditions, generate_async};
use crate::generation_config::GenerationConfig;
use crate::model_files::{Folder, ModelFiles};
use crate::sampling::SamplingConfig;
use crate::tokenizer::Tokenizer;
use crate::{CausalLm, ModelConfig};
#[cfg(not(target_arch = "wasm32"))]
use crate::{
    Weights,
    gguf::{self, Gguf},
};
#[cfg(not(target_arch = "wasm32"))]
use hierarchos_core::Device;

/// A loaded causal language model.
pub struct Model {
    /// The folder the files came from (a Hub snapshot for Hub ids), or the `.gguf` file.
    pub dir: PathBuf,
    /// `config.json`.
    pub config: ModelConfig,
    /// The decoder with its weights on the device.
    pub lm: CausalLm,
    /// `tokenizer.json` and friends, when the folder has them.
    pub tokenizer: Option<Tokenizer>,
    /// The ids generation stops on.
    pub eos_ids: Vec<u32>,
    /// How the model's authors set generation to pick tokens (`generation_config.json`; greedy without one):
    /// what callers start from before their own settings.
    pub sampling: SamplingConfig,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("dir", &self.dir)
            .field("model_type", &self.config.model_type)
            .field("tokenizer", &self.tokenizer)
            .field("eos_ids", &self.eos_ids)
            .finish()
    }
}

impl Model {
    /// Loads `arg`, a `.gguf` file, a local model folder or a Hub id (fetched at `revision` into the Hugging Face
    /// cache).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load(arg: &str, revision: Option<&str>, device: &Device) -> Result<Model> {
        let path = Path::new(arg);
        if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
            return Model::from_gguf(path, device, false);
        }
        let dir = crate::hub::resolve_model(arg, revision)?;
        Model::from_dir(&dir, device)
    }

    /// Loads a local model folder: `config.json`, the safetensors weights, and `tokenizer.json` if present.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn from_dir(dir: &Path, device: &Device) -> Result<Model> {
        let config = ModelConfig::from_file(&dir.join("config.json"))?;
        let weights = Weights::open(dir)?;
        let lm = CausalLm::load(&config, &weights, device)?;
        Model::with_lm(dir, lm, Tokenizer::from_dir_if_present(dir)?)
    }

    /// A model of the folder `dir` whose decoder is `lm` (one just trained, say) and whose tokenizer is
    /// `tokenizer`: the end-of-sequence ids come from the folder as [`Model::from_dir`] reads them.
    pub fn with_lm(dir: &Path, lm: CausalLm, tokenizer: Option<Tokenizer>) -> Result<Model> {
        let generation = GenerationConfig::read(Folder::Disk(dir))?;
        Ok(Model::assemble(dir, lm, tokenizer, generation))
    }

    /// A model whose decoder is `lm` and whose tokenizer and end-of-sequence ids come from `files` held in memory
    /// (the web demo, which has no file system); `dir` labels it.
    pub fn from_model_files(dir: &Path, lm: CausalLm, files: &ModelFiles) -> Result<Model> {
        let tokenizer = Tokenizer::from_model_files(dir, files)?;
        let generation = GenerationConfig::read(Folder::Memory(dir, files))?;
        Ok(Model::assemble(dir, lm, tokenizer, generation))
    }

    fn assemble(dir: &Path, lm: CausalLm, tokenizer: Option<Tokenizer>, generation: GenerationConfig) -> Model {
        let config = lm.config().clone();
        for setting in &generation.ignored {
            tracing::warn!(
                "{}: {setting} is not applied: generation here can pick other tokens than transformers' generate()",
                dir.join("generation_config.json").display()
            );
        }
        // transformers stops on generation_config.json's ids, else config.json's; the tokenizer's EOS is the
        // last resort for folders that have neither.
        let eos_ids = match generation.eos_ids {
            Some(ids) => ids,
            None if !config.eos_token_ids.is_empty() => config.eos_token_ids.clone(),
            None => tokenizer.as_ref().map(|t| t.eos_ids().to_vec()).unwrap_or_default(),
        };
        Model {
            dir: dir.to_path_buf(),
            config,
            lm,
            tokenizer,
            eos_ids,
            sampling: generation.sampling,
        }
    }

    /// Loads a `.gguf` file: configuration, tokenizer and chat template from its metadata. The linear weights stay
    /// quantized on the GPU unless `dequantize` asks for f32 everywhere (to fine-tune them).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn from_gguf(path: &Path, device: &Device, dequantize: bool) -> Result<Model> {
        let gguf = Gguf::open(path)?;
        let config = gguf::model_config(&gguf)?;
        let lm = gguf.load(&config, device, dequantize)?;
        let tokenizer = gguf::tokenizer(&gguf)?;
        let eos_ids = if config.eos_token_ids.is_empty() {
            tokenizer.eos_ids().to_vec()
        } else {
            config.eos_token_ids.clone()
        };
        Ok(Model {
            dir: path.to_path_buf(),
            config,
            lm,
            tokenizer: Some(tokenizer),
            eos_ids,
            sampling: SamplingConfig::default(),
        })
    }

    /// The tokenizer, or an error naming the missing `tokenizer.json`.
    pub fn tokenizer(&self) -> Result<&Tokenizer> {
        self.tokenizer.as_ref().ok_or_else(|| Error::Tokenizer {
            path: self.dir.join("tokenizer.json"),
            message: "missing: this model folder has no tokenizer, pass token ids instead of text".into(),
        })
    }

    /// The ids of a text prompt; with `chat` it is sent as one user message through the chat template.
    pub fn encode_prompt(&self, text: &str, chat: bool) -> Result<Vec<u32>> {
        let tokenizer = self.tokenizer()?;
        if chat {
            let rendered = tokenizer.apply_chat_template(&[ChatMessage::new("user", text)], true)?;
            tokenizer.encode(&rendered, false)
        } else {
            tokenizer.encode(text, true)
        }
    }

    /// Generates after `prompt_ids`, stopping on the model's EOS ids or `stop_strings`; see [`crate::generate()`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn generate(
        &self,
        prompt_ids: &[u32],
        max_new_tokens: usize,
        sampling: &SamplingConfig,
        stop_strings: &[String],
        on_token: impl FnMut(u32, &str) -> Result<()>,
    ) -> Result<Generation> {
        pollster::block_on(self.generate_async(prompt_ids, max_new_tokens, sampling, stop_strings, on_token))
    }

    /// [`Model::generate`] without blocking (the web's way): it yields while each token is read back.
    pub async fn generate_async(
        &self,
        prompt_ids: &[u32],
        max_new_tokens: usize,
        sampling: &SamplingConfig,
        stop_strings: &[String],
        on_token: impl FnMut(u32, &str) -> Result<()>,
    ) -> Result<Generation> {
        let stop = StopConditions {
            eos_ids: self.eos_ids.clone(),
            stop_strings: stop_strings.to_vec(),
            tokenizer: self.tokenizer.as_ref(),
        };
        generate_async(&self.lm, prompt_ids, max_new_tokens, sampling, &stop, on_token).await
    }
}
