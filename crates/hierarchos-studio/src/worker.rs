//! The Studio's worker: a thread that owns the GPU work (loading a model, training it, generating from it), so that
//! the window stays responsive. The UI sends [`Command`]s; the worker answers with [`Event`]s and asks for a
//! repaint after each one.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::time::Instant;

use anyhow::{Context, Result};
use hierarchos_core::{DType, Device};
use hierarchos_nn::lora::{LoraConfig, TargetModules};
use hierarchos_nn::optim::AdamWConfig;
use hierarchos_nn::train::checkpoint;
use hierarchos_nn::train::data::{TokenData, pad_id};
use hierarchos_nn::train::setup::{Source, Trained, has_weights, load_source};
use hierarchos_nn::train::{LrScheduler, Schedule, StepStats, TrainConfig, Trainer, evaluate};
use hierarchos_nn::{Model, SamplingConfig};
use serde::{Deserialize, Serialize};

use crate::metrics::Point;
use crate::runs::MetricsLog;
use crate::widgets::mib;

/// What the UI asks of the worker.
#[derive(Debug)]
pub enum Command {
    /// Load a model folder or Hub id (replacing the current model).
    Load(String),
    /// Train the current model's folder with these settings.
    Train(Box<TrainSettings>),
    /// Continue the run in this folder from its newest checkpoint.
    ResumeRun(PathBuf),
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
    /// The worker holds no model any more (an operation freed it, then failed).
    Unloaded,
    /// A training run started (or resumed, with the points it had), writing into this folder.
    RunStarted {
        /// The run's folder.
        dir: PathBuf,
        /// Points of the steps before (a resumed run).
        points: Vec<Point>,
        /// The step the run ends at.
        steps: usize,
    },
    /// A training step finished (with its evaluation loss when it evaluated).
    Point(Point),
    /// The running training was paused (`true`) or resumed.
    Paused(bool),
    /// A checkpoint was written.
    Checkpoint(PathBuf),
    /// Training ended (all steps, or stopped); the trained model is now the current one.
    TrainDone {
        /// The run's folder.
        dir: PathBuf,
        /// Whether it was stopped before its last step.
        stopped: bool,
    },
    /// The next piece of generated text (`base`: of the base model, in a comparison).
    Token {
        /// The text.
        text: String,
        /// Whether the base model (adapter off) generated it.
        base: bool,
    },
    /// Generation ended.
    Generated {
        /// Tokens generated.
        tokens: usize,
        /// Wall-clock seconds.
        secs: f64,
    },
    /// Something failed; the worker carries on with the next command.
    Error {
        /// What failed.
        during: Operation,
        /// The error, with its causes.
        message: String,
    },
}

/// What an [`Event::Error`] interrupted, so that the UI resets the right state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// Loading a model.
    Load,
    /// A training run (which ended with the error).
    Train,
    /// A generation.
    Generate,
    /// A command turned down (a training runs); nothing changed.
    Refused,
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
    /// How the model's `generation_config.json` picks tokens: the Chat tab starts from it.
    pub sampling: SamplingConfig,
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    #[serde(with = "dtype_name")]
    pub base_dtype: DType,
}

/// A training run's settings, as the train panel edits them (kept in the run's folder, so that it can resume).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainSettings {
    /// The model folder the run starts from (filled in when it starts).
    #[serde(default)]
    pub model: String,
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
    /// With an adapter attached: also generate with it switched off (the base model), for comparison.
    pub compare_base: bool,
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
            let (during, result) = match command {
                Command::Load(arg) => (Operation::Load, self.load(&arg)),
                Command::Train(settings) => (Operation::Train, self.train(&settings)),
                Command::ResumeRun(dir) => (Operation::Train, self.resume(&dir)),
                Command::Generate(request) => (Operation::Generate, self.generate(&request)),
                // A control arriving after its run ended (a second Stop, say) has nothing left to do.
                Command::Pause | Command::Resume | Command::Stop | Command::Checkpoint => continue,
            };
            if let Err(e) = result {
                self.send(Event::Error {
                    during,
                    message: format!("{e:#}"),
                });
                if self.model.is_none() {
                    self.send(Event::Unloaded);
                }
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
        // Hub downloads show their progress (a few updates a second); HF_HUB_OFFLINE=1 reads the cache only.
        let options = hierarchos_nn::hub::HubOptions::from_env()?;
        let mut shown = Instant::now();
        let mut report = |file: &str, done: u64, size: u64| {
            if done == size || shown.elapsed().as_millis() >= 200 {
                shown = Instant::now();
                self.send(Event::Busy(format!(
                    "downloading {file}: {} of {}",
                    mib(done),
                    mib(size)
                )));
            }
        };
        let dir = hierarchos_nn::hub::resolve_model_reporting(arg, None, &options, Some(&mut report))
            .with_context(|| format!("loading {arg}"))?;
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
        let base = dir.display().to_string();
        let source = load_source(&dir, &base, None, &trained, base_dtype, s.seed, &self.device)?;
        let (data, eval) = self.read_data(s, source.tokenizer.as_ref())?;
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
            precision: Default::default(),
        };
        let pad = pad_id(source.tokenizer.as_ref());
        std::fs::create_dir_all(&s.out).with_context(|| format!("creating {}", s.out.display()))?;
        MetricsLog::write_settings(&s.out, s)?;
        let stopped = {
            let mut trainer = Trainer::new(&source.lm, config, data.sequences.len(), pad)?;
            self.send(Event::RunStarted {
                dir: s.out.clone(),
                points: Vec::new(),
                steps: s.steps,
            });
            self.drive(&source, &mut trainer, &data, eval.as_ref(), s)?
        };
        self.finish(&dir, source, s, stopped)
    }

    /// Continues the run in folder `run` from its newest checkpoint, with the settings it was started with.
    fn resume(&mut self, run: &Path) -> Result<()> {
        self.send(Event::Busy(format!("resuming {}", run.display())));
        let mut s = MetricsLog::read_settings(run)?;
        // The folder as found now (it may have moved since the run started).
        s.out = run.to_path_buf();
        let ckpt_dir = checkpoint::resolve_resume(run)?;
        self.model = None;
        let ckpt = checkpoint::load(&ckpt_dir, &self.device)
            .with_context(|| format!("reading checkpoint {}", ckpt_dir.display()))?;
        let tokenizer = hierarchos_nn::Tokenizer::from_dir_if_present(&ckpt_dir)?;
        let source = Source {
            lm: ckpt.lm,
            files: ckpt.files,
            tokenizer,
            frozen_bytes: None,
        };
        let (data, eval) = self.read_data(&s, source.tokenizer.as_ref())?;
        let pad = pad_id(source.tokenizer.as_ref());
        // The model folder the run started from: where generation finds its EOS ids afterwards.
        let dir = PathBuf::from(&s.model);
        let stopped = {
            let mut trainer = Trainer::resume(&source.lm, &ckpt.state, ckpt.moments, data.sequences.len(), pad)?;
            let earlier = crate::runs::Run::open(run).map(|r| r.points).unwrap_or_default();
            let earlier = earlier.into_iter().filter(|p| p.step <= ckpt.state.step).collect();
            self.send(Event::RunStarted {
                dir: s.out.clone(),
                points: earlier,
                steps: s.steps,
            });
            self.drive(&source, &mut trainer, &data, eval.as_ref(), &s)?
        };
        self.finish(&dir, source, &s, stopped)
    }

    /// The run's training sequences and, with an evaluation split, the held-out ones.
    fn read_data(
        &self,
        s: &TrainSettings,
        tokenizer: Option<&hierarchos_nn::Tokenizer>,
    ) -> Result<(TokenData, Option<TokenData>)> {
        self.send(Event::Busy(format!("reading {}", s.data)));
        let data = TokenData::load(&s.data, tokenizer, s.seq_len)?;
        if s.eval_split > 0.0 {
            let (train, eval) = data.split_eval(s.eval_split)?;
            Ok((train, Some(eval)))
        } else {
            Ok((data, None))
        }
    }

    /// Trains until the run's last step or a Stop, answering Pause, Resume and Checkpoint between steps; each
    /// step's point goes to the metrics file and the UI. Returns whether it was stopped; a checkpoint and the
    /// final model (or adapter) are written either way (unless the UI has gone).
    fn drive(
        &self,
        source: &Source,
        trainer: &mut Trainer,
        data: &TokenData,
        eval: Option<&TokenData>,
        s: &TrainSettings,
    ) -> Result<bool> {
        let mut log = MetricsLog::open(&s.out)?;
        let pad = pad_id(source.tokenizer.as_ref());
        let save = |trainer: &Trainer| -> Result<PathBuf> {
            Ok(checkpoint::save(
                &s.out,
                &source.lm,
                &source.files,
                trainer.optimizer(),
                &trainer.state(&s.data)?,
                2,
            )?)
        };
        // The steps evaluated, whose points carry the evaluation loss.
        let evaluates = |step: usize| {
            eval.is_some() && (step == s.steps || (s.eval_every > 0 && step.is_multiple_of(s.eval_every)))
        };
        // A step's point, once its statistics are read back; evaluated where due (its weights are settled then).
        let mut report = |step: StepStats| -> Result<()> {
            let mut point = Point {
                step: step.step,
                loss: Some(step.loss),
                eval_loss: None,
                lr: step.lr,
                tokens_per_sec: step.tokens as f64 / step.secs.max(1e-9),
                memory_mib: self.device.memory().live_bytes as f64 / (1 << 20) as f64,
            };
            if let Some(eval) = eval
                && evaluates(step.step)
            {
                point.eval_loss = Some(evaluate(&source.lm, eval, s.batch_size, pad)?.loss);
            }
            log.append(&point)?;
            self.send(Event::Point(point));
            Ok(())
        };
        let mut stopped = false;
        let mut paused = false;
        while trainer.completed_steps() < s.steps && !stopped {
            // Commands between steps; while paused, wait for the next one.
            loop {
                let command = if paused {
                    match self.commands.recv() {
                        Ok(c) => c,
                        Err(_) => return Ok(true),
                    }
                } else {
                    match self.commands.try_recv() {
                        Ok(c) => c,
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => return Ok(true),
                    }
                };
                // Commands act on settled weights: the step recorded ahead is read back first.
                if let Some(step) = trainer.finish()? {
                    report(step)?;
                }
                match command {
                    Command::Pause => {
                        paused = true;
                        self.send(Event::Paused(true));
                    }
                    Command::Resume => {
                        paused = false;
                        self.send(Event::Paused(false));
                    }
                    Command::Stop => {
                        stopped = true;
                        break;
                    }
                    // A failed save is reported; the run goes on (an earlier checkpoint is intact).
                    Command::Checkpoint => match save(trainer) {
                        Ok(dir) => self.send(Event::Checkpoint(dir)),
                        Err(e) => self.send(Event::Error {
                            during: Operation::Refused,
                            message: format!("checkpoint: {e:#}"),
                        }),
                    },
                    other => self.send(Event::Error {
                        during: Operation::Refused,
                        message: format!("a training is running: stop it first ({other:?} was not done)"),
                    }),
                }
            }
            if stopped {
                break;
            }
            // Each step is read back while the GPU runs the next (`Trainer::step_ahead`), but for the evaluated
            // ones and the last, which are read back at once.
            let number = trainer.next_step();
            if let Some(step) = trainer.step_ahead(data)? {
                report(step)?;
            }
            if number == s.steps || evaluates(number) {
                if let Some(step) = trainer.finish()? {
                    report(step)?;
                }
            }
        }
        if let Some(step) = trainer.finish()? {
            report(step)?;
        }
        self.send(Event::Checkpoint(save(trainer)?));
        checkpoint::write_model(&s.out, &source.lm, &source.files)?;
        Ok(stopped)
    }

    /// Makes the trained model the current one and tells the UI. After full training its folder is the run's
    /// (which holds the trained weights, for a later LoRA run to start from); an adapter keeps its base's.
    fn finish(&mut self, base: &Path, source: Source, s: &TrainSettings, stopped: bool) -> Result<()> {
        let dir = if source.lm.adapter_config().is_some() {
            base
        } else {
            &s.out
        };
        let model = Model::with_lm(dir, source.lm, source.tokenizer)?;
        self.send(Event::Loaded(summary(&model, true)));
        self.model = Some(model);
        self.send(Event::TrainDone {
            dir: s.out.clone(),
            stopped,
        });
        Ok(())
    }

    fn generate(&mut self, r: &GenerateRequest) -> Result<()> {
        let model = self.model.as_mut().context("load a model first")?;
        let ids = model.encode_prompt(&r.prompt, r.chat)?;
        let compare = r.compare_base && model.lm.adapter_config().is_some();
        let _ = self.events.send(Event::Busy("generating".into()));
        (self.repaint)();
        let start = Instant::now();
        let mut tokens = 0;
        let mut secs = 0.0;
        for base in [false, true] {
            if base && !compare {
                break;
            }
            model.lm.enable_adapters(!base);
            let (events, repaint) = (&self.events, &self.repaint);
            let result = model.generate(&ids, r.max_new_tokens, &r.sampling, &[], |_, text| {
                if !base {
                    tokens += 1;
                }
                let _ = events.send(Event::Token {
                    text: text.to_string(),
                    base,
                });
                repaint();
                Ok(())
            });
            model.lm.enable_adapters(true);
            result?;
            if !base {
                // The speed shown is the adapter's pass alone.
                secs = start.elapsed().as_secs_f64();
            }
        }
        self.send(Event::Generated { tokens, secs });
        Ok(())
    }
}

/// A dtype stored by its name (`bf16`).
mod dtype_name {
    use hierarchos_core::DType;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &DType, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(d.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DType, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

fn summary(model: &Model, has_weights: bool) -> ModelSummary {
    ModelSummary {
        dir: model.dir.clone(),
        family: model.config.model_type.clone(),
        params: model.lm.parameter_count(),
        has_weights,
        adapter: model.lm.adapter_config().is_some(),
        tokenizer: model.tokenizer.is_some(),
        chat_template: model.tokenizer.as_ref().is_some_and(|t| t.chat_template().is_some()),
        sampling: model.sampling.clone(),
    }
}
