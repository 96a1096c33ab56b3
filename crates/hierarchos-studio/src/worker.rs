//! The Studio's worker: a thread that owns the GPU work (loading a model, training it, generating from it), so that
//! the window stays responsive. The UI sends [`Command`]s; the worker answers with [`Event`]s and asks for a
//! repaint after each one.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::time::Instant;

use anyhow::{Context, Result, anyhow};
use hierarchos_core::{DType, Device};
use hierarchos_nn::lora::{LoraConfig, TargetModules};
use hierarchos_nn::optim::AdamWConfig;
use hierarchos_nn::train::checkpoint;
use hierarchos_nn::train::data::TokenData;
use hierarchos_nn::train::setup::{Trained, load_source, pad_id};
use hierarchos_nn::train::{LrScheduler, Schedule, TrainConfig, Trainer, evaluate};
use hierarchos_nn::{Model, SamplingConfig};

use crate::runs::{MetricsLog, Point};

/// What the UI asks of the worker.
#[derive(Debug)]
pub enum Command {
    /// Load a model folder or Hub id (replacing the current model).
    Load(String),
    /// Train the current model's folder with these settings.
    Train(Box<TrainSettings>),
    /// Hold the running training after its current step.
    Pause,
    /// Continue a paused training.
    Resume,
    /// End the running training after its current step (saving a checkpoint).
    Stop,
    /// Save a checkpoint of the running training now.
    Checkpoint,
    /// Generate from the current model.
    Generate(GenerateRequest),
}

/// What the worker tells the UI.
#[derive(Debug, Clone)]
pub enum Event {
    /// A long operation started or moved on (shown with a spinner until the next event).
    Busy(String),
    /// A model is loaded and ready.
    Loaded(ModelSummary),
    /// A training run started, writing into this folder.
    RunStarted(PathBuf),
    /// A training step (or an evaluation) finished.
    Point(Point),
    /// A checkpoint was written.
    Checkpoint(PathBuf),
    /// Training ended (all steps, or stopped); the trained model is now the current one.
    TrainDone {
        /// The run's folder.
        dir: PathBuf,
        /// Whether it was stopped before its last step.
        stopped: bool,
    },
    /// The next piece of generated text.
    Token(String),
    /// Generation ended.
    Generated {
        /// Tokens generated.
        tokens: usize,
        /// Wall-clock seconds.
        secs: f64,
    },
    /// Something failed; the worker carries on with the next command.
    Error(String),
}

/// A model as the UI describes it.
#[derive(Debug, Clone)]
pub struct ModelSummary {
    /// The folder the model came from.
    pub dir: PathBuf,
    /// `model_type`.
    pub family: String,
    /// Parameters.
    pub params: usize,
    /// Whether the folder holds weights (a folder without them trains from random weights, and cannot take an
    /// adapter).
    pub has_weights: bool,
    /// Whether a LoRA adapter is attached (after a LoRA run).
    pub adapter: bool,
    /// Whether the folder has a tokenizer.
    pub tokenizer: bool,
    /// Whether the tokenizer has a chat template.
    pub chat_template: bool,
}

impl ModelSummary {
    /// Bytes to hold the f32 weights for inference.
    pub fn inference_bytes(&self) -> u64 {
        4 * self.params as u64
    }

    /// Bytes full fine-tuning holds besides activations: weights, gradients and AdamW's two moments, f32.
    pub fn full_training_bytes(&self) -> u64 {
        16 * self.params as u64
    }

    /// Bytes LoRA holds besides activations with the frozen weights in `base` (the adapter is a few percent).
    pub fn lora_bytes(&self, base: DType) -> u64 {
        (base.size() * self.params) as u64
    }
}

/// A LoRA adapter to train.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraSettings {
    /// Rank.
    pub r: usize,
    /// Alpha (the update is scaled by alpha / r).
    pub alpha: f64,
    /// Dropout on the adapter's input.
    pub dropout: f64,
    /// `all-linear` or module names.
    pub targets: String,
    /// The dtype the frozen model is held in.
    pub base_dtype: DType,
}

/// A training run's settings, as the train panel edits them.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainSettings {
    /// A .txt, .jsonl or .parquet file or a folder of them.
    pub data: String,
    /// `None`: every parameter.
    pub lora: Option<LoraSettings>,
    /// Optimizer steps.
    pub steps: usize,
    /// Sequences per step.
    pub batch_size: usize,
    /// Tokens per sequence.
    pub seq_len: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Warmup steps.
    pub warmup_steps: usize,
    /// Learning-rate curve after warmup.
    pub scheduler: LrScheduler,
    /// Fraction of the sequences held out for evaluation (0: none).
    pub eval_split: f64,
    /// Evaluate every this many steps (and at the end).
    pub eval_every: usize,
    /// Seed of the data order and of new weights.
    pub seed: u64,
    /// The folder the run writes (checkpoints, metrics, the final model or adapter).
    pub out: PathBuf,
}

/// A generation request.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// Prompt text.
    pub prompt: String,
    /// Send it as one user message through the chat template.
    pub chat: bool,
    /// Most new tokens.
    pub max_new_tokens: usize,
    /// Sampling settings.
    pub sampling: SamplingConfig,
}

/// The worker's state: the device and the current model.
pub struct Worker {
    device: Device,
    model: Option<Model>,
    commands: Receiver<Command>,
    events: Sender<Event>,
    repaint: Box<dyn Fn() + Send>,
}

impl Worker {
    /// A worker on `device` answering `commands` on `events`, calling `repaint` after each event.
    pub fn new(
        device: Device,
        commands: Receiver<Command>,
        events: Sender<Event>,
        repaint: Box<dyn Fn() + Send>,
    ) -> Worker {
        Worker {
            device,
            model: None,
            commands,
            events,
            repaint,
        }
    }

    /// Serves commands until the UI side hangs up.
    pub fn run(mut self) {
        while let Ok(command) = self.commands.recv() {
            let result = match command {
                Command::Load(arg) => self.load(&arg),
                Command::Train(settings) => self.train(&settings),
                Command::Generate(request) => self.generate(&request),
                Command::Pause | Command::Resume | Command::Stop | Command::Checkpoint => {
                    Err(anyhow!("no training is running"))
                }
            };
            if let Err(e) = result {
                self.send(Event::Error(format!("{e:#}")));
            }
        }
    }

    fn send(&self, event: Event) {
        // The UI side gone means the app is closing: nothing left to tell.
        let _ = self.events.send(event);
        (self.repaint)();
    }

    fn load(&mut self, arg: &str) -> Result<()> {
        self.send(Event::Busy(format!("loading {arg}")));
        self.model = None;
        let dir = hierarchos_nn::hub::resolve_model(arg, None).with_context(|| format!("loading {arg}"))?;
        let has_weights = has_weights(&dir);
        let model = if has_weights {
            Model::from_dir(&dir, &self.device).with_context(|| format!("loading {arg}"))?
        } else {
            // A config and tokenizer alone (the embedded default): random weights, to be trained.
            let config = hierarchos_nn::ModelConfig::from_file(&dir.join("config.json"))?;
            let lm = hierarchos_nn::CausalLm::init_random(&config, 0, &self.device)?;
            Model::with_lm(&dir, lm, hierarchos_nn::Tokenizer::from_dir_if_present(&dir)?)?
        };
        self.send(Event::Loaded(summary(&model, has_weights)));
        self.model = Some(model);
        Ok(())
    }

    fn train(&mut self, s: &TrainSettings) -> Result<()> {
        let dir = self
            .model
            .as_ref()
            .map(|m| m.dir.clone())
            .context("load a model first")?;
        self.send(Event::Busy("preparing the run".into()));
        let trained = match &s.lora {
            Some(l) => Trained::NewAdapter(Box::new(LoraConfig::new(
                l.r,
                l.alpha,
                l.dropout,
                TargetModules::parse(&l.targets),
            ))),
            None => Trained::All,
        };
        let base_dtype = s.lora.as_ref().map_or(DType::F32, |l| l.base_dtype);
        // The model being trained replaces the current one (its memory is needed).
        self.model = None;
        let source = load_source(
            &dir,
            &dir.display().to_string(),
            None,
            &trained,
            base_dtype,
            s.seed,
            &self.device,
        )?;
        self.send(Event::Busy(format!("reading {}", s.data)));
        let mut data = TokenData::load(&s.data, source.tokenizer.as_ref(), s.seq_len)?;
        let eval = if s.eval_split > 0.0 {
            let (train, eval) = data.split_eval(s.eval_split)?;
            data = train;
            Some(eval)
        } else {
            None
        };
        let config = TrainConfig {
            steps: s.steps,
            batch_size: s.batch_size,
            seq_len: s.seq_len,
            grad_accum: 1,
            schedule: Schedule {
                lr: s.lr,
                scheduler: s.scheduler,
                warmup_steps: s.warmup_steps,
                total_steps: s.steps,
            },
            adamw: AdamWConfig::default(),
            max_grad_norm: 1.0,
            shuffle: true,
            seed: s.seed,
        };
        let pad = pad_id(source.tokenizer.as_ref());
        let stopped = {
            let mut trainer = Trainer::new(&source.lm, config, data.sequences.len(), pad)?;
            std::fs::create_dir_all(&s.out).with_context(|| format!("creating {}", s.out.display()))?;
            let mut log = MetricsLog::create(&s.out, s)?;
            self.send(Event::RunStarted(s.out.clone()));
            let save = |trainer: &Trainer| -> Result<PathBuf> {
                Ok(checkpoint::save(
                    &s.out,
                    &source.lm,
                    &source.files,
                    trainer.optimizer(),
                    &trainer.state(&s.data),
                    2,
                )?)
            };
            let mut stopped = false;
            let mut paused = false;
            while trainer.completed_steps() < s.steps {
                // Commands between steps; while paused, wait for the next one.
                loop {
                    let command = if paused {
                        match self.commands.recv() {
                            Ok(c) => c,
                            Err(_) => return Ok(()),
                        }
                    } else {
                        match self.commands.try_recv() {
                            Ok(c) => c,
                            Err(TryRecvError::Empty) => break,
                            Err(TryRecvError::Disconnected) => return Ok(()),
                        }
                    };
                    match command {
                        Command::Pause => {
                            paused = true;
                            self.send(Event::Busy("paused".into()));
                        }
                        Command::Resume => paused = false,
                        Command::Stop => {
                            stopped = true;
                            break;
                        }
                        Command::Checkpoint => {
                            let dir = save(&trainer)?;
                            self.send(Event::Checkpoint(dir));
                        }
                        other => self.send(Event::Error(format!("training is running: {other:?} has to wait"))),
                    }
                }
                if stopped {
                    break;
                }
                let step = trainer.step(&data)?;
                let mut point = Point {
                    step: step.step,
                    loss: Some(step.loss),
                    eval_loss: None,
                    lr: step.lr,
                    tokens_per_sec: step.tokens as f64 / step.secs.max(1e-9),
                    memory_mib: self.device.memory().live_bytes as f64 / (1 << 20) as f64,
                };
                let last = step.step == s.steps;
                if let Some(eval) = &eval
                    && (last || (s.eval_every > 0 && step.step % s.eval_every == 0))
                {
                    point.eval_loss = Some(evaluate(&source.lm, eval, s.batch_size, pad)?.loss);
                }
                log.append(&point)?;
                self.send(Event::Point(point));
            }
            let dir = save(&trainer)?;
            checkpoint::write_model(&s.out, &source.lm, &source.files)?;
            self.send(Event::Checkpoint(dir));
            stopped
        };
        self.model = Some(Model::with_lm(&dir, source.lm, source.tokenizer)?);
        self.send(Event::TrainDone {
            dir: s.out.clone(),
            stopped,
        });
        if let Some(model) = &self.model {
            self.send(Event::Loaded(summary(model, true)));
        }
        Ok(())
    }

    fn generate(&mut self, r: &GenerateRequest) -> Result<()> {
        let model = self.model.as_ref().context("load a model first")?;
        let ids = model.encode_prompt(&r.prompt, r.chat)?;
        self.send(Event::Busy("generating".into()));
        let start = Instant::now();
        let mut tokens = 0;
        let events = &self.events;
        let repaint = &self.repaint;
        model.generate(&ids, r.max_new_tokens, &r.sampling, &[], |_, text| {
            tokens += 1;
            let _ = events.send(Event::Token(text.to_string()));
            repaint();
            Ok(())
        })?;
        self.send(Event::Generated {
            tokens,
            secs: start.elapsed().as_secs_f64(),
        });
        Ok(())
    }
}

fn has_weights(dir: &Path) -> bool {
    use hierarchos_nn::weights::{INDEX_FILE, SINGLE_FILE};
    [SINGLE_FILE, INDEX_FILE].iter().any(|f| dir.join(f).is_file())
}

fn summary(model: &Model, has_weights: bool) -> ModelSummary {
    ModelSummary {
        dir: model.dir.clone(),
        family: model.config.model_type.clone(),
        params: model.lm.parameters().iter().map(|(_, p)| p.numel()).sum(),
        has_weights,
        adapter: model.lm.adapter_config().is_some(),
        tokenizer: model.tokenizer.is_some(),
        chat_template: model.tokenizer.as_ref().is_some_and(|t| t.chat_template().is_some()),
    }
}
