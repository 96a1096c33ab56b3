//! The web demo's GPU work: loading, generating and training run as async tasks on the page's one thread,
//! yielding at every readback so that the page keeps drawing. A task takes the model out of the shared state
//! while it runs and puts it back when done; the UI only reads the state.

use std::cell::RefCell;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use anyhow::{Context, Result};
use eframe::egui;
use hierarchos_core::Device;
use hierarchos_nn::optim::AdamWConfig;
use hierarchos_nn::train::data::{TokenData, pad_id};
use hierarchos_nn::train::{LrScheduler, Schedule, TrainConfig, Trainer};
use hierarchos_nn::{CausalLm, Model, ModelConfig, SamplingConfig, Weights};

use super::files::ModelBytes;
use crate::metrics::Point;

/// What the tasks and the UI share.
pub type State = Rc<RefCell<Shared>>;

/// The demo's state.
pub struct Shared {
    /// The loaded model (`None` while a task uses it).
    pub model: Option<Model>,
    /// What the UI shows of it.
    pub summary: Option<Summary>,
    /// The training data: file name and bytes.
    pub data: (String, Vec<u8>),
    /// What runs now.
    pub busy: Option<String>,
    /// Errors, newest last, until dismissed.
    pub errors: Vec<String>,
    /// The text generated so far.
    pub output: String,
    /// The last generation's ids and tokens per second.
    pub generated: Option<(Vec<u32>, f64)>,
    /// The training run's points.
    pub points: Vec<Point>,
    /// Set by Stop; the training ends after its current step.
    pub stop: bool,
}

/// A loaded model as the page describes it.
#[derive(Clone, Debug)]
pub struct Summary {
    /// Where it came from.
    pub label: String,
    /// `model_type`.
    pub family: String,
    /// Parameters.
    pub params: usize,
    /// Whether it came with weights (else they are random, to be trained).
    pub weights: bool,
    /// Whether it has a tokenizer.
    pub tokenizer: bool,
}

/// A training run's settings.
#[derive(Clone, Debug)]
pub struct TrainRequest {
    /// Optimizer steps.
    pub steps: usize,
    /// Sequences per step.
    pub batch_size: usize,
    /// Tokens per sequence.
    pub seq_len: usize,
    /// Peak learning rate (cosine decay to 0).
    pub lr: f64,
}

impl Shared {
    /// The state at start: no model, the embedded corpus as data.
    pub fn new() -> Shared {
        Shared {
            model: None,
            summary: None,
            data: (
                crate::embedded::CORPUS_NAME.to_string(),
                crate::embedded::CORPUS.as_bytes().to_vec(),
            ),
            busy: None,
            errors: Vec::new(),
            output: String::new(),
            generated: None,
            points: Vec::new(),
            stop: false,
        }
    }
}

/// Runs `task` on the page's event loop, marked busy with `what` until it ends; its error goes to the list.
pub fn spawn(state: &State, ctx: &egui::Context, what: &str, task: impl Future<Output = Result<()>> + 'static) {
    state.borrow_mut().busy = Some(what.to_string());
    let (state, ctx) = (state.clone(), ctx.clone());
    wasm_bindgen_futures::spawn_local(async move {
        let result = task.await;
        let mut s = state.borrow_mut();
        s.busy = None;
        if let Err(e) = result {
            s.errors.push(format!("{e:#}"));
        }
        ctx.request_repaint();
    });
}

/// The embedded model's files (no weights: it starts from random ones, to be trained).
pub fn embedded_model() -> Result<ModelBytes> {
    let label = format!("embedded {}", crate::embedded::MODEL_NAME);
    let named = crate::embedded::MODEL_FILES
        .iter()
        .map(|(name, text)| (name.to_string(), text.as_bytes().to_vec()))
        .collect();
    Ok(ModelBytes {
        files: hierarchos_nn::ModelFiles::from_named(Path::new(&label), named)?,
        label,
        weights: None,
    })
}

/// Loads `bytes` as the current model (its weights trainable; random from seed 0 without weights, as on the
/// desktop).
pub async fn load(state: State, device: Device, bytes: ModelBytes) -> Result<()> {
    {
        let mut s = state.borrow_mut();
        s.model = None;
        s.summary = None;
    }
    let dir = PathBuf::from(&bytes.label);
    let config = ModelConfig::from_json(&bytes.files.config_json, &dir.join("config.json"))?;
    let has_weights = bytes.weights.is_some();
    let lm = match bytes.weights {
        Some(weights) => {
            let weights = Weights::from_bytes(weights, &dir.join(hierarchos_nn::weights::SINGLE_FILE))?;
            CausalLm::load_trainable(&config, &weights, &device)?
        }
        None => CausalLm::init_random(&config, 0, &device)?,
    };
    let model = Model::from_model_files(&dir, lm, &bytes.files)?;
    let summary = Summary {
        label: bytes.label,
        family: model.config.model_type.clone(),
        params: model.lm.parameter_count(),
        weights: has_weights,
        tokenizer: model.tokenizer.is_some(),
    };
    let mut s = state.borrow_mut();
    s.model = Some(model);
    s.summary = Some(summary);
    Ok(())
}

/// The model, taken out of the state for a task.
fn take_model(state: &State) -> Result<Model> {
    state
        .borrow_mut()
        .model
        .take()
        .context("no model loaded (load one first)")
}

/// Generates up to `max_new_tokens` after `prompt`, streaming the text into the state.
pub async fn generate(
    state: State,
    ctx: egui::Context,
    prompt: String,
    max_new_tokens: usize,
    sampling: SamplingConfig,
) -> Result<()> {
    let model = take_model(&state)?;
    let result = async {
        let ids = model.encode_prompt(&prompt, false)?;
        {
            let mut s = state.borrow_mut();
            s.output.clear();
            s.generated = None;
        }
        let generation = model
            .generate_async(&ids, max_new_tokens, &sampling, &[], |_, text| {
                state.borrow_mut().output.push_str(text);
                ctx.request_repaint();
                Ok(())
            })
            .await?;
        let speed = generation.decode_tokens_per_sec();
        state.borrow_mut().generated = Some((generation.ids, speed));
        Ok(())
    }
    .await;
    state.borrow_mut().model = Some(model);
    result
}

/// Trains every parameter of the model on the state's data, a point per step, until the last step or Stop.
pub async fn train(state: State, ctx: egui::Context, device: Device, r: TrainRequest) -> Result<()> {
    let model = take_model(&state)?;
    let result = async {
        let (name, bytes) = state.borrow().data.clone();
        let data = TokenData::from_memory(Path::new(&name), &bytes, model.tokenizer.as_ref(), r.seq_len)?;
        let config = TrainConfig {
            steps: r.steps,
            batch_size: r.batch_size,
            seq_len: r.seq_len,
            grad_accum: 1,
            schedule: Schedule {
                lr: r.lr,
                scheduler: LrScheduler::Cosine,
                warmup_steps: 0,
                total_steps: r.steps,
            },
            adamw: AdamWConfig::default(),
            max_grad_norm: 1.0,
            shuffle: true,
            seed: 0,
            precision: Default::default(),
        };
        let mut trainer = Trainer::new(
            &model.lm,
            config,
            data.sequences.len(),
            pad_id(model.tokenizer.as_ref()),
        )?;
        {
            let mut s = state.borrow_mut();
            s.points.clear();
            s.stop = false;
        }
        while trainer.completed_steps() < r.steps && !state.borrow().stop {
            let step = trainer.step_async(&data).await?;
            let point = Point {
                step: step.step,
                loss: Some(step.loss),
                eval_loss: None,
                lr: step.lr,
                tokens_per_sec: step.tokens as f64 / step.secs.max(1e-9),
                memory_mib: device.memory().live_bytes as f64 / (1 << 20) as f64,
            };
            let mut s = state.borrow_mut();
            s.busy = Some(format!("training: step {} of {}", step.step, r.steps));
            s.points.push(point);
            ctx.request_repaint();
        }
        Ok(())
    }
    .await;
    state.borrow_mut().model = Some(model);
    result
}
