//! The training step: gradient accumulation over micro-batches (under autocast in mixed precision), clipping and
//! the AdamW update at the scheduled learning rate on the device, and the loss and gradient norm read back (a
//! non-finite one stops the run, or skips the step of an f16 run).

use hierarchos_core::ops::adamw::ClipGate;
use hierarchos_core::ops::loss_scale::loss_scale_update;
use hierarchos_core::{DType, PendingVec, Tensor, autocast, no_grad};
use serde::{Deserialize, Serialize};
use web_time::Instant;

use crate::CausalLm;
use crate::error::{Error, Result};
use crate::optim::{AdamW, AdamWConfig, Moments, grad_norm_squared};
use crate::train::data::{Batch, Batcher, IGNORE_INDEX, TokenData, make_batch};
use crate::train::precision::{LossScale, Precision, is_power_of_two};
use crate::train::schedule::Schedule;
use crate::train::state::{TrainingState, initial_state};

/// The settings of a training run (saved in each checkpoint; a resumed run must keep those that shape it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Optimizer steps.
    pub steps: usize,
    /// Sequences per micro-batch.
    pub batch_size: usize,
    /// Tokens per packed sequence.
    pub seq_len: usize,
    /// Micro-batches whose gradients add up to one step: the loss is the mean over all their predicted tokens
    /// (transformers' `num_items_in_batch`), so padding spread unevenly over them changes nothing.
    pub grad_accum: usize,
    /// Learning rate and its schedule (`total_steps` is `steps`).
    pub schedule: Schedule,
    /// AdamW's settings.
    pub adamw: AdamWConfig,
    /// Clip the global gradient norm to this (0: off).
    pub max_grad_norm: f64,
    /// Shuffle the sequences (each epoch its own seeded order) instead of file order.
    pub shuffle: bool,
    /// Seed of the data order (and of the initial weights when training from scratch).
    pub seed: u64,
    /// The dtype of the matrix products (mixed precision; f32 master weights either way).
    #[serde(default)]
    pub precision: Precision,
}

impl TrainConfig {
    /// Rejects settings that cannot train.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Invalid(m));
        if self.steps == 0 || self.batch_size == 0 || self.grad_accum == 0 {
            return bad(format!(
                "steps ({}), batch size ({}) and gradient accumulation ({}) must be positive",
                self.steps, self.batch_size, self.grad_accum
            ));
        }
        if self.seq_len < 2 {
            return bad(format!(
                "sequence length {} is under 2 (nothing to predict)",
                self.seq_len
            ));
        }
        let s = &self.schedule;
        if !(s.lr.is_finite() && s.lr >= 0.0) {
            return bad(format!("learning rate {} is not a finite non-negative number", s.lr));
        }
        if !(self.max_grad_norm.is_finite() && self.max_grad_norm >= 0.0) {
            return bad(format!(
                "max grad norm {} is not a finite non-negative number",
                self.max_grad_norm
            ));
        }
        AdamW::new(self.adamw.clone()).map(|_| ())
    }
}

/// What one optimizer step did.
#[derive(Clone, Debug, PartialEq)]
pub struct StepStats {
    /// Steps completed, this one included.
    pub step: usize,
    /// Mean loss over the step's micro-batches.
    pub loss: f64,
    /// Learning rate it ran at.
    pub lr: f64,
    /// Global gradient norm before clipping (unscaled; infinite or NaN when an f16 step overflowed).
    pub grad_norm: f64,
    /// The loss scale the step ran at (f16 runs).
    pub loss_scale: Option<f64>,
    /// The gradients overflowed the loss scale: the update was skipped and the scale halved (f16 runs).
    pub skipped: bool,
    /// Tokens in its batches (padding left out).
    pub tokens: usize,
    /// Wall-clock seconds it took.
    pub secs: f64,
}

/// A training run in progress over a model whose parameters are trainable.
pub struct Trainer<'m> {
    lm: &'m CausalLm,
    params: Vec<(String, Tensor)>,
    optimizer: AdamW,
    batcher: Batcher,
    config: TrainConfig,
    step: usize,
    pad_id: u32,
    /// An f16 run's loss scale as of the last step read back...
    loss_scale: Option<LossScale>,
    /// ...and on the device, `[scale, 1 / scale, good steps]`, as of the last update recorded: each step's
    /// backward takes its scale from there, and its update unscales by the inverse and leaves the next scale there
    /// (see [`loss_scale_update`]), so that the host need not read a step back before recording the next.
    device_scale: Option<Tensor>,
    /// A step recorded ahead whose statistics are not read yet ([`Trainer::step_ahead`]).
    in_flight: Option<InFlight>,
    /// When the last step's statistics were read.
    last_done: Option<Instant>,
}

impl<'m> Trainer<'m> {
    /// A run at step 0 over `sequences` training sequences; `pad_id` fills short rows (their labels are skipped).
    pub fn new(lm: &'m CausalLm, config: TrainConfig, sequences: usize, pad_id: u32) -> Result<Trainer<'m>> {
        config.validate()?;
        if let Some(refusal) = lm.config().moe.as_ref().and_then(|m| m.training_unsupported.as_ref()) {
            return Err(Error::Invalid(refusal.clone()));
        }
        let params = lm.trainable_parameters();
        if let Some((name, _)) = params
            .iter()
            .find(|(_, p)| !p.requires_grad() || p.dtype() != DType::F32)
        {
            return Err(Error::Invalid(format!(
                "parameter {name} is not a trainable f32 tensor (load the model with CausalLm::load_trainable, or \
                 attach an adapter)"
            )));
        }
        if sequences == 0 {
            return Err(Error::Invalid("the training data holds no sequence".into()));
        }
        if config.precision == Precision::Bf16
            && params.first().is_some_and(|(_, p)| {
                let caps = p.device().caps();
                caps.cooperative_matrix.is_some() && !caps.bf16_cooperative_matrix
            })
        {
            tracing::warn!(
                "bf16 products run on the portable kernels (this driver multiplies no bf16 cooperative matrices); \
                 f16 runs products and attention on this GPU's tensor cores, several times faster"
            );
        }
        let mut t = Trainer {
            lm,
            params,
            optimizer: AdamW::new(config.adamw.clone())?,
            batcher: Batcher::new(sequences, config.seed, config.shuffle)?,
            loss_scale: None,
            device_scale: None,
            config,
            step: 0,
            pad_id,
            in_flight: None,
            last_done: None,
        };
        if t.config.precision == Precision::F16 {
            t.set_loss_scale(LossScale::default())?;
        }
        Ok(t)
    }

    /// Sets an f16 run's loss scale, on the host and the device; refuses one no f16 run reaches (a damaged
    /// checkpoint): not a power of two whose inverse is a normal f32 too, or as many good steps as the growth
    /// interval.
    fn set_loss_scale(&mut self, s: LossScale) -> Result<()> {
        let in_range = LossScale::RANGE.contains(&s.scale);
        if !(is_power_of_two(s.scale) && in_range && s.good_steps < LossScale::GROWTH_INTERVAL) {
            return Err(Error::Invalid(format!(
                "loss scale {} after {} good steps: expected a power of two from 2^-126 to 2^126, after fewer \
                 than {} good steps",
                s.scale,
                s.good_steps,
                LossScale::GROWTH_INTERVAL
            )));
        }
        let state = [s.scale as f32, (1.0 / s.scale) as f32, s.good_steps as f32];
        self.device_scale = Some(Tensor::from_slice(&state, &[3], self.lm.device())?);
        self.loss_scale = Some(s);
        Ok(())
    }

    /// Continues a run from a checkpoint's state and moments (`lm` holds its weights).
    pub fn resume(
        lm: &'m CausalLm,
        state: &TrainingState,
        moments: std::collections::HashMap<String, Moments>,
        sequences: usize,
        pad_id: u32,
    ) -> Result<Trainer<'m>> {
        let mut t = Trainer::new(lm, state.config.clone(), sequences, pad_id)?;
        t.optimizer.set_moments(moments);
        t.batcher = Batcher::restore(
            sequences,
            state.config.seed,
            state.config.shuffle,
            state.batcher.clone(),
        )?;
        t.step = state.step;
        if t.loss_scale.is_some() {
            t.set_loss_scale(state.loss_scale.clone().unwrap_or_default())?;
        }
        Ok(t)
    }

    /// Steps completed so far.
    pub fn completed_steps(&self) -> usize {
        self.step
    }

    /// The run's settings.
    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// The optimizer (its moments go into checkpoints).
    pub fn optimizer(&self) -> &AdamW {
        &self.optimizer
    }

    /// The state a checkpoint saves now (the moments' steps are filled in by the checkpoint). An error while a
    /// step recorded ahead is in flight: its update and batches are already counted (see [`Trainer::finish`]).
    pub fn state(&self, data: &str) -> Result<TrainingState> {
        self.check_settled()?;
        let mut s = initial_state(&self.config, data, self.batcher.state());
        s.step = self.step;
        s.base_dtype = self.lm.frozen_dtype().map(|d| d.to_string());
        s.loss_scale = self.loss_scale.clone();
        Ok(s)
    }

    /// One optimizer step on the next batches of `data`, returned once the GPU has run it. (No step may be in
    /// flight from [`Trainer::step_ahead`].)
    #[cfg(not(target_arch = "wasm32"))]
    pub fn step(&mut self, data: &TokenData) -> Result<StepStats> {
        self.check_settled()?;
        let begun = self.begin(data)?;
        let flight = self.commit(begun)?;
        let values = flight.read.wait()?;
        self.conclude(flight.step, &values)
    }

    /// [`Trainer::step`] without blocking on the GPU (the web has no blocking readback): the loss and gradient
    /// norm are awaited.
    pub async fn step_async(&mut self, data: &TokenData) -> Result<StepStats> {
        self.check_settled()?;
        let begun = self.begin(data)?;
        let flight = self.commit(begun)?;
        let values = flight.read.wait_async().await?;
        self.conclude(flight.step, &values)
    }

    /// Records the next optimizer step and returns the statistics of the one before it, if one was in flight:
    /// the host reads a step's loss and norm back while the GPU already runs the next, so that the GPU never
    /// waits for the host between steps (on an H200, the 110M Llama shape's f32 step takes 96.3 ms this way
    /// against 99.0 when each step is read back before the next is recorded). The statistics of the last step
    /// come from [`Trainer::finish`], which also settles the parameters before they are read, evaluated or saved.
    /// A non-finite loss or norm still stops the run with its step, the parameters as they were before it: the
    /// device skips that update itself. In an f16 run the device also keeps the loss scale, which an overflow
    /// halves before the next step's backward.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn step_ahead(&mut self, data: &TokenData) -> Result<Option<StepStats>> {
        let mut done = None;
        let begun = self.begin(data)?;
        if let Some(flight) = self.in_flight.take() {
            // What is recorded goes to the GPU before the host waits for the step before it.
            let waited = self
                .lm
                .device()
                .flush()
                .map_err(|e| Error::from(hierarchos_core::Error::from(e)))
                .and_then(|()| Ok(flight.read.wait()?));
            match waited.and_then(|values| self.conclude(flight.step, &values)) {
                Ok(stats) => done = Some(stats),
                Err(e) => {
                    self.zero_grads();
                    return Err(e);
                }
            }
        }
        self.in_flight = Some(self.commit(begun)?);
        Ok(done)
    }

    /// The statistics of the step in flight from [`Trainer::step_ahead`], once the GPU has run it (`None` when
    /// there is none).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn finish(&mut self) -> Result<Option<StepStats>> {
        let Some(flight) = self.in_flight.take() else {
            return Ok(None);
        };
        let values = flight.read.wait()?;
        self.conclude(flight.step, &values).map(Some)
    }

    /// Whether a step recorded ahead awaits [`Trainer::finish`].
    pub fn in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// The number (1-based) of the step the next call records: one past those completed and the one in flight.
    pub fn next_step(&self) -> usize {
        self.step + usize::from(self.in_flight()) + 1
    }

    fn check_settled(&self) -> Result<()> {
        match self.in_flight {
            Some(_) => Err(Error::Invalid(
                "a step recorded by step_ahead is still in flight: call finish first".into(),
            )),
            None => Ok(()),
        }
    }

    /// The factor the loss of the next step read back was multiplied by (1 unless f16 scales it).
    fn scale(&self) -> f64 {
        self.loss_scale.as_ref().map_or(1.0, |s| s.scale)
    }

    /// The first half of a step: forward and backward of its micro-batches, and `[mean loss, squared gradient
    /// norm]` on the device, with the inverse of the loss scale in an f16 run. A step that fails part way (a
    /// token past the vocabulary in its second micro-batch) leaves no gradient behind for the next one.
    fn begin(&mut self, data: &TokenData) -> Result<Begun> {
        let begun = self.record_micro_batches(data);
        if begun.is_err() {
            self.zero_grads();
        }
        begun
    }

    fn zero_grads(&self) {
        for (_, p) in &self.params {
            p.zero_grad();
        }
    }

    fn record_micro_batches(&mut self, data: &TokenData) -> Result<Begun> {
        let start = Instant::now();
        let accum = self.config.grad_accum;
        let mut losses = Vec::with_capacity(accum);
        let mut tokens = 0;
        let scale = self
            .device_scale
            .as_ref()
            .map(|s| s.narrow(0, 0, 1)?.reshape(&[]))
            .transpose()?;
        // Steps before this one, so that the micro-batches and learning rate are the same however the steps run.
        let index = self.next_step() - 1;
        let batches: Vec<Batch> = (0..accum)
            .map(|_| make_batch(data, &self.batcher.next_indices(self.config.batch_size), self.pad_id))
            .collect();
        let vocab = self.lm.config().vocab_size;
        for batch in &batches {
            batch
                .check_vocab(vocab)
                .map_err(|e| Error::Invalid(format!("step {}: {e}", index + 1)))?;
        }
        let shares: Vec<usize> = batches.iter().map(Batch::predicted).collect();
        let predicted: usize = shares.iter().sum();
        if predicted == 0 {
            return Err(Error::Invalid(format!(
                "step {}: its batches hold no token to predict (every label skipped)",
                index + 1
            )));
        }
        for (micro, (batch, &share)) in batches.iter().zip(&shares).enumerate() {
            tokens += batch.labels.iter().filter(|&&l| l != IGNORE_INDEX).count();
            // The step's loss is the mean over all its predicted tokens, as transformers' Trainer takes it
            // (`num_items_in_batch`): each micro-batch's mean weighs by its share of them, so padding spread
            // unevenly over the micro-batches gives the gradient of one batch of them all.
            if share == 0 {
                continue;
            }
            // Each micro-batch draws its own adapter dropout masks, the same ones when a run is resumed.
            self.lm.seed_lora_dropout(self.config.seed, index * accum + micro);
            let loss = match self.config.precision.autocast() {
                Some(half) => autocast(half, || batch_loss(self.lm, batch))??,
                None => batch_loss(self.lm, batch)?,
            };
            let scaled = match &scale {
                Some(s) => loss.mul(s)?,
                None => loss.clone(),
            };
            let (scaled, reported) = match accum {
                1 => (scaled, loss.detach()),
                _ => {
                    let weight = share as f64 / predicted as f64;
                    (scaled.mul_scalar(weight)?, loss.detach().mul_scalar(weight)?)
                }
            };
            scaled.backward()?;
            losses.push(reported.reshape(&[1])?);
        }
        let stats = no_grad(|| -> Result<_> {
            let loss = Tensor::cat(&losses, 0)?.sum(&[], false)?.reshape(&[1])?;
            let norm_sq = match grad_norm_squared(&self.params)? {
                Some(n) => n.reshape(&[1])?,
                None => Tensor::zeros(&[1], DType::F32, self.lm.device())?,
            };
            let mut stats = vec![loss, norm_sq];
            if let Some(s) = &self.device_scale {
                stats.push(s.narrow(0, 1, 1)?);
            }
            Ok(Tensor::cat(&stats, 0)?)
        })?;
        Ok(Begun {
            stats,
            tokens,
            start,
            number: index + 1,
        })
    }

    /// The second half: the clipped AdamW update, which the device skips where the loss or norm is not finite,
    /// and the statistics' readback under way.
    fn commit(&mut self, begun: Begun) -> Result<InFlight> {
        let lr = self.config.schedule.lr_at(begun.number - 1);
        let gate = ClipGate {
            stats: &begun.stats,
            max_norm: self.config.max_grad_norm,
        };
        self.optimizer.step_clipped(&self.params, lr, 1.0, Some(&gate))?;
        if let Some(s) = &self.device_scale {
            loss_scale_update(s, &begun.stats, LossScale::GROWTH_INTERVAL as u32)?;
        }
        Ok(InFlight {
            read: begun.stats.read_later::<f32>()?,
            step: Recorded {
                number: begun.number,
                lr,
                tokens: begun.tokens,
                start: begun.start,
            },
        })
    }

    /// A step's statistics, read back: a non-finite loss or norm stops the run (the device skipped the update,
    /// whose counts the optimizer takes back), or in an f16 run skips the step and halves the scale, as the
    /// device did.
    fn conclude(&mut self, flight: Recorded, values: &[f32]) -> Result<StepStats> {
        let scale = self.scale();
        if let Some(&inverse) = values.get(2) {
            debug_assert_eq!(inverse, (1.0 / scale) as f32, "the device's loss scale left the host's");
        }
        let (loss, norm) = (values[0] as f64, (values[1] as f64).sqrt() / scale);
        let overflow = self.loss_scale.is_some() && loss.is_finite() && !norm.is_finite();
        if !loss.is_finite() || !norm.is_finite() {
            self.optimizer.retract_last_step();
            if !overflow {
                return Err(Error::NonFinite {
                    step: flight.number,
                    what: if loss.is_finite() { "gradient norm" } else { "loss" },
                    value: if loss.is_finite() { norm } else { loss },
                });
            }
        }
        if let Some(s) = &mut self.loss_scale {
            s.update(!overflow);
        }
        self.step = flight.number;
        // Steps recorded ahead overlap: each counts from the end of the one before it.
        let now = Instant::now();
        let since = self.last_done.map_or(flight.start, |t| t.max(flight.start));
        self.last_done = Some(now);
        Ok(StepStats {
            step: flight.number,
            loss,
            lr: flight.lr,
            grad_norm: norm,
            loss_scale: self.loss_scale.is_some().then_some(scale),
            skipped: overflow,
            tokens: flight.tokens,
            secs: now.duration_since(since).as_secs_f64(),
        })
    }
}

/// A step's forward and backward, recorded (see [`Trainer::step_ahead`]).
struct Begun {
    /// `[mean loss, squared gradient norm]`, and the inverse loss scale in an f16 run, on the device.
    stats: Tensor,
    tokens: usize,
    start: Instant,
    /// Its number (1-based).
    number: usize,
}

/// A step whose update is recorded, its statistics on their way back.
struct InFlight {
    read: PendingVec<f32>,
    step: Recorded,
}

/// What the statistics of a recorded step are reported with.
struct Recorded {
    number: usize,
    lr: f64,
    tokens: usize,
    start: Instant,
}

/// The model's loss on a host batch (its ids and labels uploaded).
fn batch_loss(lm: &CausalLm, batch: &Batch) -> Result<Tensor> {
    let shape = [batch.batch, batch.len];
    let ids = Tensor::from_slice(&batch.ids, &shape, lm.device())?;
    let labels = Tensor::from_slice(&batch.labels, &shape, lm.device())?;
    lm.loss(&ids, &labels)
}

/// Loss over a whole dataset.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EvalStats {
    /// Mean next-token cross-entropy over every predicted token.
    pub loss: f64,
    /// `exp(loss)`.
    pub perplexity: f64,
    /// Predicted tokens counted.
    pub tokens: usize,
}

/// The mean next-token loss of `lm` over every sequence of `data`, in batches of `batch_size` (no gradients).
#[cfg(not(target_arch = "wasm32"))]
pub fn evaluate(lm: &CausalLm, data: &TokenData, batch_size: usize, pad_id: u32) -> Result<EvalStats> {
    if data.sequences.is_empty() || batch_size == 0 {
        return Err(Error::Invalid(
            "evaluation needs at least one sequence and a positive batch size".into(),
        ));
    }
    let (mut sum, mut count) = (0.0f64, 0usize);
    let indices: Vec<usize> = (0..data.sequences.len()).collect();
    for chunk in indices.chunks(batch_size) {
        let batch = make_batch(data, chunk, pad_id);
        batch.check_vocab(lm.config().vocab_size)?;
        let predicted = batch.predicted();
        if predicted == 0 {
            continue;
        }
        let loss = no_grad(|| batch_loss(lm, &batch))?.to_vec::<f32>()?[0] as f64;
        sum += loss * predicted as f64;
        count += predicted;
    }
    if count == 0 {
        return Err(Error::Invalid("the evaluation data has no token to predict".into()));
    }
    let loss = sum / count as f64;
    Ok(EvalStats {
        loss,
        perplexity: loss.exp(),
        tokens: count,
    })
}
