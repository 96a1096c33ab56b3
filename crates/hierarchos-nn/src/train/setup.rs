//! What a training run starts from: a model folder loaded with every parameter trainable (or random weights when
//! it has none), or frozen with a new or an existing LoRA adapter attached. The CLI and the Studio start runs
//! through here.

use std::path::{Path, PathBuf};

use hierarchos_core::{DType, Device};

use crate::error::{Error, Result};
use crate::lora::LoraConfig;
use crate::train::checkpoint::ModelFiles;
use crate::weights::{INDEX_FILE, SINGLE_FILE};
use crate::{CausalLm, ModelConfig, Tokenizer, Weights};

/// What a run trains.
#[derive(Clone, Debug)]
pub enum Trained {
    /// Every parameter.
    All,
    /// A new LoRA adapter with these settings, on the frozen model.
    NewAdapter(Box<LoraConfig>),
    /// The PEFT adapter in this folder, on the frozen model.
    Adapter(PathBuf),
}

/// A model ready to train and what its checkpoints carry along.
pub struct Source {
    /// The model, its trainable tensors collecting gradients.
    pub lm: CausalLm,
    /// `config.json` and the tokenizer files, copied into checkpoints.
    pub files: ModelFiles,
    /// The folder's tokenizer, if it has one.
    pub tokenizer: Option<Tokenizer>,
    /// With a 16-bit frozen base: the bytes its matrices took in f32 and take now.
    pub frozen_bytes: Option<(usize, usize)>,
}

/// Loads the model folder `dir` for training: its weights if it has any, else random weights from `seed`; to
/// train an adapter, the weights frozen (held in `base_dtype`) and the adapter attached, recording `base` (the
/// folder or Hub id the run was given) and the Hub `revision` as its base model.
pub fn load_source(
    dir: &Path,
    base: &str,
    revision: Option<&str>,
    trained: &Trained,
    base_dtype: DType,
    seed: u64,
    device: &Device,
) -> Result<Source> {
    let config = ModelConfig::from_file(&dir.join("config.json"))?;
    let has_weights = has_weights(dir);
    let frozen = || -> Result<CausalLm> {
        if !has_weights {
            return Err(Error::Invalid(format!(
                "{}: an adapter needs a model with weights",
                dir.display()
            )));
        }
        CausalLm::load(&config, &Weights::open(dir)?, device)
    };
    let mut lm = match trained {
        Trained::All if has_weights => CausalLm::load_trainable(&config, &Weights::open(dir)?, device)?,
        Trained::All => {
            tracing::info!(
                "{} has no weights: training from random weights (seed {seed})",
                dir.display()
            );
            CausalLm::init_random(&config, seed, device)?
        }
        Trained::NewAdapter(lora) => {
            let mut lm = frozen()?;
            lm.add_lora(lora, seed)?;
            lm.set_adapter_base(base, revision);
            lm
        }
        Trained::Adapter(adapter) => {
            let mut lm = frozen()?;
            lm.load_adapter(adapter, true)?;
            lm.set_adapter_base(base, revision);
            lm
        }
    };
    if base_dtype != DType::F32 && matches!(trained, Trained::All) {
        return Err(Error::Invalid(format!(
            "a base held in {base_dtype} is frozen: only an adapter can train on it"
        )));
    }
    let frozen_bytes = if base_dtype == DType::F32 {
        None
    } else {
        Some(lm.store_frozen_in(base_dtype)?)
    };
    Ok(Source {
        lm,
        files: ModelFiles::read(dir)?,
        tokenizer: Tokenizer::from_dir_if_present(dir)?,
        frozen_bytes,
    })
}

/// Whether the model folder `dir` holds weights (a folder with only a config and tokenizer trains from random
/// weights and cannot take an adapter).
pub fn has_weights(dir: &Path) -> bool {
    [SINGLE_FILE, INDEX_FILE].iter().any(|f| dir.join(f).is_file())
}
