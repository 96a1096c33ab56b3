//! Checkpoints: a folder transformers loads as is (`config.json`, `model.safetensors` with Hugging Face names, the
//! tokenizer files), or for a model training a LoRA adapter a folder PEFT loads (`adapter_config.json`,
//! `adapter_model.safetensors`, the tokenizer files), plus what resuming needs (`optimizer.safetensors` with
//! AdamW's moments, `trainer_state.json` with the step, the data position and the settings). A checkpoint is
//! written whole into a temporary folder and renamed into place, so a crash or a kill mid-save never damages an
//! earlier checkpoint.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use hierarchos_core::Device;

use crate::error::{Error, Result};
use crate::lora::{ADAPTER_CONFIG_FILE, LoraConfig, is_adapter_dir};
pub use crate::model_files::ModelFiles;
use crate::optim::{AdamW, Moments};
use crate::train::state::STATE_FORMAT;
pub use crate::train::state::{TrainingState, initial_state};
use crate::weights::{Weights, write_atomic};
use crate::{CausalLm, ModelConfig};

/// Name of the training state file; its presence marks a folder as a resumable checkpoint.
pub const STATE_FILE: &str = "trainer_state.json";
const OPTIMIZER_FILE: &str = "optimizer.safetensors";

/// The folder of the checkpoint after `step` steps under `out`.
pub fn checkpoint_dir(out: &Path, step: usize) -> PathBuf {
    out.join(format!("checkpoint-{step}"))
}

/// Writes the model (a transformers folder) and the training state as `out/checkpoint-{step}`, then deletes all
/// but the newest `keep` checkpoints (0 keeps all), never the one just written (a run resumed from an older
/// checkpoint saves below newer ones). A checkpoint of the same step is replaced only once the new one is whole.
/// Returns the new folder.
pub fn save(
    out: &Path,
    lm: &CausalLm,
    files: &ModelFiles,
    optimizer: &AdamW,
    state: &TrainingState,
    keep: usize,
) -> Result<PathBuf> {
    let dir = checkpoint_dir(out, state.step);
    let tmp = out.join(format!(".checkpoint-{}.tmp-{}", state.step, std::process::id()));
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { path, source }
    };
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    write_model(&tmp, lm, files)?;
    let mut moments = Vec::new();
    let mut param_steps = BTreeMap::new();
    for (name, m) in sorted(optimizer.moments()) {
        moments.push((format!("{name}.exp_avg"), m.m.clone()));
        moments.push((format!("{name}.exp_avg_sq"), m.v.clone()));
        param_steps.insert(name.clone(), m.step);
    }
    Weights::save(&tmp.join(OPTIMIZER_FILE), &moments)?;
    let state = TrainingState {
        param_steps,
        ..state.clone()
    };
    let json = serde_json::to_string_pretty(&state).map_err(|e| Error::Invalid(format!("training state: {e}")))?;
    write_atomic(&tmp.join(STATE_FILE), json.as_bytes())?;
    // Moved aside, not deleted, until the new one is in place: a crash in between leaves it under that name.
    let replaced = out.join(format!(".checkpoint-{}.replaced-{}", state.step, std::process::id()));
    if dir.exists() {
        std::fs::rename(&dir, &replaced).map_err(io(&dir))?;
    }
    std::fs::rename(&tmp, &dir).map_err(io(&dir))?;
    if replaced.exists() {
        std::fs::remove_dir_all(&replaced).map_err(io(&replaced))?;
    }
    if keep > 0 {
        let others = checkpoints(out)?.into_iter().rev().filter(|(_, path)| *path != dir);
        for (_, old) in others.skip(keep - 1) {
            std::fs::remove_dir_all(&old).map_err(io(&old))?;
        }
    }
    Ok(dir)
}

/// Writes `config.json`, `model.safetensors` (every parameter by its Hugging Face name, f32) and the copied
/// files into `dir`, each through a temporary file renamed into place, and removes a sharded model's index and
/// shards found there; for a model with an adapter, the adapter (PEFT's two files) and the copied files.
pub fn write_model(dir: &Path, lm: &CausalLm, files: &ModelFiles) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    if lm.adapter_config().is_some() {
        lm.save_adapter(dir)?;
    } else {
        Weights::save(
            &dir.join("model.safetensors"),
            &[lm.parameters(), lm.buffers()].concat(),
        )?;
        Weights::remove_stale_shards(dir)?;
        write_atomic(&dir.join("config.json"), files.config_json.as_bytes())?;
    }
    for (name, bytes) in &files.files {
        write_atomic(&dir.join(name), bytes)?;
    }
    Ok(())
}

/// The checkpoints under `out`, oldest first, as (step, folder).
pub fn checkpoints(out: &Path) -> Result<Vec<(usize, PathBuf)>> {
    let mut found = Vec::new();
    let entries = match std::fs::read_dir(out) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(found),
        Err(source) => {
            return Err(Error::Io {
                path: out.to_path_buf(),
                source,
            });
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let step = name
            .to_str()
            .and_then(|n| n.strip_prefix("checkpoint-"))
            .and_then(|s| s.parse().ok());
        if let Some(step) = step
            && entry.path().join(STATE_FILE).is_file()
        {
            found.push((step, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

/// The checkpoint `--resume ARG` names: `ARG` itself when it holds a training state, else its newest
/// `checkpoint-N`.
pub fn resolve_resume(arg: &Path) -> Result<PathBuf> {
    if arg.join(STATE_FILE).is_file() {
        return Ok(arg.to_path_buf());
    }
    checkpoints(arg)?.pop().map(|(_, dir)| dir).ok_or_else(|| {
        Error::Invalid(format!(
            "--resume {}: no checkpoint there (a folder with {STATE_FILE}, or checkpoint-N folders holding one)",
            arg.display()
        ))
    })
}

/// A checkpoint read back: the trainable model, the optimizer moments and the training state.
pub struct Checkpoint {
    /// The model with every parameter trainable, or the base model with the checkpoint's adapter trainable.
    pub lm: CausalLm,
    /// The files to carry into later checkpoints.
    pub files: ModelFiles,
    /// AdamW's moments by parameter name.
    pub moments: HashMap<String, Moments>,
    /// Step, data position and settings.
    pub state: TrainingState,
}

/// Reads the checkpoint folder `dir` (see [`resolve_resume`]).
pub fn load(dir: &Path, device: &Device) -> Result<Checkpoint> {
    let path = dir.join(STATE_FILE);
    let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
        path: path.clone(),
        source,
    })?;
    let state: TrainingState = serde_json::from_str(&text).map_err(|e| Error::Config {
        path: path.clone(),
        message: format!("not a training state: {e}"),
    })?;
    if state.format != STATE_FORMAT {
        return Err(Error::Config {
            path,
            message: format!("format '{}' is not {STATE_FORMAT}", state.format),
        });
    }
    let (lm, files) = if is_adapter_dir(dir) {
        let adapter = LoraConfig::read(dir)?;
        let Some(base) = adapter.base_model_name_or_path.as_deref() else {
            return Err(Error::Config {
                path: dir.join(ADAPTER_CONFIG_FILE),
                message: "base_model_name_or_path is not set: which model does the adapter belong to?".into(),
            });
        };
        let revision = adapter.other.get("revision").and_then(serde_json::Value::as_str);
        let base_dir = crate::hub::resolve_model(base, revision)?;
        let config = ModelConfig::from_file(&base_dir.join("config.json"))?;
        let mut lm = CausalLm::load(&config, &Weights::open(&base_dir)?, device)?;
        lm.load_adapter(dir, true)?;
        if let Some(dtype) = &state.base_dtype {
            lm.store_frozen_in(dtype.parse().map_err(|e: String| Error::Config {
                path: path.clone(),
                message: format!("base_dtype: {e}"),
            })?)?;
        }
        (lm, ModelFiles::read(&base_dir)?)
    } else {
        let config = ModelConfig::from_file(&dir.join("config.json"))?;
        let lm = CausalLm::load_trainable(&config, &Weights::open(dir)?, device)?;
        (lm, ModelFiles::read(dir)?)
    };
    let optimizer = Weights::open_file(&dir.join(OPTIMIZER_FILE))?;
    let mut moments = HashMap::new();
    for (name, p) in lm.trainable_parameters() {
        let Some(&step) = state.param_steps.get(&name) else {
            continue;
        };
        let read = |kind: &str| optimizer.load(&format!("{name}.{kind}"), p.shape(), device);
        moments.insert(
            name.clone(),
            Moments {
                m: read("exp_avg")?,
                v: read("exp_avg_sq")?,
                step,
            },
        );
    }
    Ok(Checkpoint {
        lm,
        files,
        moments,
        state,
    })
}

fn sorted(map: &HashMap<String, Moments>) -> Vec<(&String, &Moments)> {
    let mut v: Vec<_> = map.iter().collect();
    v.sort_by(|a, b| a.0.cmp(b.0));
    v
}
