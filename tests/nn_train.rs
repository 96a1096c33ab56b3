//! Training: two `torch.optim.AdamW` steps on the causal-LM loss of the fixture models (see
//! tests/fixtures/README.md) against transformers' float64 reference, checkpoints that resume bit for bit, a
//! non-finite loss that stops the run, and saved models that load back.

mod common;
use common::fixtures::*;
use common::*;
use serde_json::json;
use std::path::Path;

use hierarchos::core::{DType, Tensor};
use hierarchos::nn::optim::{AdamW, AdamWConfig};
use hierarchos::nn::train::checkpoint::{self, ModelFiles};
use hierarchos::nn::train::data::TokenData;
use hierarchos::nn::train::{LossScale, LrScheduler, Precision, Schedule, StepStats, TrainConfig, Trainer, evaluate};
use hierarchos::nn::{CausalLm, Error, Model, ModelConfig, Weights};

/// The issue's bound on any parameter after the two damped steps, unless PyTorch's own f32 lands further from the
/// float64 reference on a fixture (1.2e-7..9.4e-6 here, mostly the rounding of norm weights near 1): then 1.5x
/// PyTorch's error. PyTorch's error is the largest of its runs: the fixture script's (reference.json) and those of
/// `scripts/torch_f32_spread.py` (tests/fixtures/torch_f32_spread.json: the CPU with one thread and with all, and
/// CUDA). The damped steps turn a gradient's rounding into a parameter error of its size, and the few gradients
/// that nearly cancel (embedding rows of tokens seen once, some key projections) follow any change of summation
/// order, so one f32 run is one sample of that noise: PyTorch's own runs differ by up to 5x (Gemma 3's embeddings).
const PARAM_ATOL: f64 = 2.5e-7;
const TORCH_F32_FACTOR: f64 = 1.5;

/// Relative bound on the two losses (the first is the forward pass alone, the second follows one update).
const LOSS_RTOL: f64 = 1e-6;

/// The largest parameter error of PyTorch's f32 runs of fixture `name` (see [`PARAM_ATOL`]).
fn torch_f32_error(name: &str, dir: &Path) -> f64 {
    let fixture = report(dir)["diagnostics"]["transformers_f32_adamw"]["adamw_damped"]["max_abs_param_err"]
        .as_f64()
        .unwrap();
    let file = dir.parent().unwrap().join("torch_f32_spread.json");
    let spread: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let runs = spread["fixtures"][name]
        .as_object()
        .unwrap_or_else(|| panic!("{name}: no runs in torch_f32_spread.json (run scripts/torch_f32_spread.py)"));
    runs.values()
        .map(|run| run["max_abs_param_err"].as_f64().unwrap())
        .fold(fixture, f64::max)
}

/// The fixture model with every parameter trainable.
fn trainable(dir: &Path) -> CausalLm {
    let config = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let weights = Weights::open(dir).unwrap();
    let d = dev();
    CausalLm::build(&config, &mut |name, shape| {
        Ok(weights.load(name, shape, &d)?.requires_grad_())
    })
    .unwrap()
}

#[test]
fn two_adamw_steps_match_pytorch_float64() {
    // Every family is run and reported before the test fails, so that one run shows every margin.
    let mut over = Vec::new();
    for name in validated() {
        let dir = fixture(name);
        let lm = trainable(&dir);
        let ids = input_ids(&dir);
        let mut opt = AdamW::new(AdamWConfig {
            eps: 1e-3,
            weight_decay: 0.1,
            ..AdamWConfig::default()
        })
        .unwrap();
        let params = lm.parameters();
        let losses = two_steps(&lm, &ids, &params, &mut opt);
        let want_losses: Vec<f64> = reference_tensors(&dir, "adamw_damped_losses").remove(0).1;
        for (k, (got, want)) in losses.iter().zip(&want_losses).enumerate() {
            let rel = (got - want).abs() / want.abs();
            eprintln!("{name}: loss {k} relative error {rel:.2e}");
            assert!(rel <= LOSS_RTOL, "{name}: loss {k} = {got}, reference {want}");
        }
        let want = adamw_damped_reference(&dir);
        let got: Vec<(String, Tensor)> = {
            let mut g = params.clone();
            g.sort_by(|a, b| a.0.cmp(&b.0));
            g
        };
        assert_eq!(
            got.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            want.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            "{name}: parameter names"
        );
        // The largest error of each parameter, with the element's index (row and column of a matrix), so that
        // runs on different GPUs can be compared element by element.
        let mut errors: Vec<(f64, String)> = got
            .iter()
            .zip(&want)
            .map(|((pname, p), (_, w))| {
                let v = p.to_vec::<f32>().unwrap();
                assert_eq!(v.len(), w.len(), "{name} {pname}");
                let (at, d) = v
                    .iter()
                    .zip(w)
                    .map(|(&a, &b)| (a as f64 - b).abs())
                    .enumerate()
                    .fold((0, 0.0), |worst, (i, d)| if d > worst.1 { (i, d) } else { worst });
                let at = match p.shape() {
                    [_, cols] => format!("[{}, {}]", at / cols, at % cols),
                    _ => format!("[{at}]"),
                };
                (d, format!("{pname}{at}"))
            })
            .collect();
        errors.sort_by(|a, b| b.0.total_cmp(&a.0));
        let torch = torch_f32_error(name, &dir);
        let bound = PARAM_ATOL.max(TORCH_F32_FACTOR * torch);
        let worst: Vec<String> = errors.iter().take(3).map(|(d, p)| format!("{p} {d:.2e}")).collect();
        eprintln!(
            "{name}: max |param - float64 reference|: {}; PyTorch f32 {torch:.2e}, bound {bound:.2e}",
            worst.join(", ")
        );
        if errors[0].0 > bound {
            over.push(format!(
                "{name}: {} differs by {:.2e} (bound {bound:.2e})",
                errors[0].1, errors[0].0
            ));
        }
    }
    assert!(over.is_empty(), "past the bound: {}", over.join("; "));
}

/// Random token sequences of the fixture vocabulary (300), for runs that only need some data.
fn random_data(rng: &mut Rng, rows: usize, len: usize) -> TokenData {
    TokenData {
        sequences: (0..rows)
            .map(|_| (0..len).map(|_| rng.below(300) as u32).collect())
            .collect(),
        packed: true,
        files: Vec::new(),
    }
}

fn small_run(steps: usize) -> TrainConfig {
    TrainConfig {
        steps,
        batch_size: 2,
        seq_len: 12,
        grad_accum: 2,
        schedule: Schedule {
            lr: 2e-3,
            scheduler: LrScheduler::Cosine,
            warmup_steps: 1,
            total_steps: steps,
        },
        adamw: AdamWConfig {
            weight_decay: 0.01,
            no_decay_1d: true,
            ..AdamWConfig::default()
        },
        max_grad_norm: 0.5,
        shuffle: true,
        seed: 7,
        precision: Default::default(),
    }
}

fn values(lm: &CausalLm) -> Vec<(String, Vec<f32>)> {
    lm.parameters()
        .into_iter()
        .map(|(n, p)| (n, p.to_vec::<f32>().unwrap()))
        .collect()
}

/// Micro-batches that predict different numbers of tokens weigh by them, as transformers' `num_items_in_batch`
/// does: rows of 12, 12, 3 and 3 tokens (22 and 4 predicted in two micro-batches of two) train as one batch of
/// four, in the loss reported and the parameters after the step (averaging the micro-batches' means gave 6.58
/// for 7.30). With beta1 = beta2 = 0 and eps = 1, AdamW's update stays nearly linear in the gradient.
#[test]
fn accumulated_micro_batches_weigh_by_their_predicted_tokens() {
    let mut rng = Rng::new("accumulated_micro_batches_weigh_by_their_predicted_tokens");
    let data = TokenData {
        sequences: [12, 12, 3, 3]
            .iter()
            .map(|&len| (0..len).map(|_| rng.below(300) as u32).collect())
            .collect(),
        packed: false,
        files: Vec::new(),
    };
    let run = |batch_size, grad_accum| {
        let lm = trainable(&fixture("llama"));
        let config = TrainConfig {
            batch_size,
            grad_accum,
            shuffle: false,
            max_grad_norm: 0.0,
            adamw: AdamWConfig {
                beta1: 0.0,
                beta2: 0.0,
                eps: 1.0,
                weight_decay: 0.0,
                no_decay_1d: false,
            },
            ..small_run(1)
        };
        let loss = Trainer::new(&lm, config, 4, 0).unwrap().step(&data).unwrap().loss;
        (loss, values(&lm))
    };
    let (start, (one_loss, one), (acc_loss, acc)) = (values(&trainable(&fixture("llama"))), run(4, 1), run(2, 2));
    assert!(
        (acc_loss - one_loss).abs() <= 1e-6 * one_loss,
        "loss {acc_loss} accumulated, {one_loss} at once"
    );
    let (mut gap, mut moved) = (0.0f32, 0.0f32);
    for (((_, a), (_, o)), (_, s)) in acc.iter().zip(&one).zip(&start) {
        for ((a, o), s) in a.iter().zip(o).zip(s) {
            gap = gap.max((a - o).abs());
            moved = moved.max((o - s).abs());
        }
    }
    assert!(gap <= 1e-3 * moved, "parameters {gap} apart after an update of {moved}");
}

/// A step that fails in its second micro-batch (a token past the vocabulary) leaves no gradient behind: the next
/// step does not add the first micro-batch's. The id is named whatever the batch's size: the GPU only clamps the
/// lookups of batches past `CHECKED_INDEX_LIMIT` ids (a NaN loss at step 1 was all that said so), and evaluation
/// refuses it too.
#[test]
fn a_step_that_fails_part_way_leaves_no_gradient() {
    let mut rng = Rng::new("a_step_that_fails_part_way_leaves_no_gradient");
    let mut data = random_data(&mut rng, 4, 12);
    data.sequences[1][3] = 1000;
    let lm = trainable(&fixture("llama"));
    let config = TrainConfig {
        batch_size: 1,
        shuffle: false,
        ..small_run(2)
    };
    let mut t = Trainer::new(&lm, config, 4, 0).unwrap();
    let err = t.step(&data).unwrap_err().to_string();
    assert!(err.contains("token id 1000") && err.contains("step 1"), "{err}");
    let left: Vec<String> = lm
        .parameters()
        .into_iter()
        .filter(|(_, p)| {
            p.grad()
                .is_some_and(|g| g.to_vec::<f32>().unwrap().iter().any(|&x| x != 0.0))
        })
        .map(|(n, _)| n)
        .collect();
    assert!(left.is_empty(), "gradients left after the failed step: {left:?}");
    let mut big = random_data(&mut rng, 1100, 60);
    big.sequences[700][5] = 1000;
    let config = TrainConfig {
        batch_size: 1100,
        grad_accum: 1,
        seq_len: 60,
        shuffle: false,
        ..small_run(1)
    };
    let err = Trainer::new(&lm, config, 1100, 0)
        .unwrap()
        .step(&big)
        .unwrap_err()
        .to_string();
    assert!(err.contains("token id 1000 (row 700, position 5"), "{err}");
    let err = evaluate(&lm, &big, 1100, 0).unwrap_err().to_string();
    assert!(err.contains("token id 1000"), "{err}");
}

/// transformers' router settings for training (Mixtral's noise, the load-balancing loss) load for inference,
/// which they do not change, and stop training before its first step, naming the field.
#[test]
fn router_training_settings_load_but_do_not_train() {
    let dir = fixture("mixtral");
    let d = dev();
    let weights = Weights::open(&dir).unwrap();
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    for (field, value) in [
        ("output_router_logits", json!(true)),
        ("router_jitter_noise", json!(0.1)),
    ] {
        let mut changed: serde_json::Value = serde_json::from_str(&text).unwrap();
        changed[field] = value;
        let config = ModelConfig::from_json(&changed.to_string(), &dir.join("config.json")).unwrap();
        let lm = CausalLm::build(&config, &mut |name, shape| {
            Ok(weights.load(name, shape, &d)?.requires_grad_())
        })
        .unwrap();
        let ids = Tensor::from_slice(&[3u32, 5, 7], &[1, 3], &d).unwrap();
        lm.forward(&ids, None).unwrap().to_vec::<f32>().unwrap();
        let err = Trainer::new(&lm, small_run(1), 4, 0)
            .err()
            .expect("training refused")
            .to_string();
        assert!(err.contains(field) && err.contains("training"), "{err}");
    }
}

#[test]
fn resuming_from_a_checkpoint_continues_bit_for_bit() {
    // In mixed precision too: an f16 run's loss scale is part of the checkpoint.
    for precision in [Precision::F32, Precision::F16] {
        resume_continues_bit_for_bit(precision);
    }
}

fn resume_continues_bit_for_bit(precision: Precision) {
    let dir = fixture("llama");
    let data = random_data(&mut Rng::new("resume data"), 7, 12);
    let files = ModelFiles::read(&dir).unwrap();
    let run = TrainConfig {
        precision,
        ..small_run(4)
    };
    // Four steps straight.
    let straight = trainable(&dir);
    let mut t = Trainer::new(&straight, run.clone(), data.sequences.len(), 1).unwrap();
    let losses: Vec<f64> = (0..4).map(|_| t.step(&data).unwrap().loss).collect();
    // Two steps, a checkpoint, a fresh process's worth of loading, two more.
    let out = tmpdir("resume");
    let first = trainable(&dir);
    let mut t = Trainer::new(&first, run, data.sequences.len(), 1).unwrap();
    for _ in 0..2 {
        t.step(&data).unwrap();
    }
    let saved = checkpoint::save(&out, &first, &files, t.optimizer(), &t.state("random").unwrap(), 2).unwrap();
    assert_eq!(saved, checkpoint::resolve_resume(&out).unwrap());
    if precision == Precision::F32 {
        // A run resumed from an older checkpoint saves below newer ones: rotation keeps what it just wrote, and
        // a checkpoint of the same step is replaced whole.
        let mut later = t.state("random").unwrap();
        later.step = 5;
        let newer = checkpoint::save(&out, &first, &files, t.optimizer(), &later, 1).unwrap();
        let again = checkpoint::save(&out, &first, &files, t.optimizer(), &t.state("random").unwrap(), 1).unwrap();
        assert_eq!(again, saved);
        assert!(saved.join("trainer_state.json").exists() && !newer.exists());
        let names: Vec<_> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [saved.file_name().unwrap()], "nothing but the checkpoint left");
    }
    let ckpt = checkpoint::load(&saved, &dev()).unwrap();
    assert_eq!(ckpt.state.step, 2);
    assert_eq!(values(&ckpt.lm), values(&first), "weights read back");
    let mut t = Trainer::resume(&ckpt.lm, &ckpt.state, ckpt.moments, data.sequences.len(), 1).unwrap();
    let resumed: Vec<f64> = (0..2).map(|_| t.step(&data).unwrap().loss).collect();
    assert_eq!(resumed, losses[2..], "{precision}: losses after resuming");
    assert_eq!(
        values(&ckpt.lm),
        values(&straight),
        "{precision}: parameters after 2 + 2 steps"
    );
    assert!(
        losses[3] < losses[0],
        "{precision}: training lowers the loss: {losses:?}"
    );
}

/// A model written where a sharded one was replaces it: the stale index (which loading prefers) and its shards
/// go, so the folder loads the new weights (`merge --out` into such a folder kept loading the old ones).
#[test]
fn a_model_written_over_a_sharded_one_replaces_it() {
    let dir = fixture("llama");
    let out = tmpdir("over-sharded");
    hierarchos::nn::weights::save_f32(&out.join("model-00001-of-00001.safetensors"), &[("x", &[1], &[1.0])]).unwrap();
    let index = r#"{"weight_map": {"x": "model-00001-of-00001.safetensors"}}"#;
    std::fs::write(out.join(hierarchos::nn::weights::INDEX_FILE), index).unwrap();
    let lm = trainable(&dir);
    checkpoint::write_model(&out, &lm, &ModelFiles::read(&dir).unwrap()).unwrap();
    let names = Weights::open(&out).unwrap().names();
    assert!(names.contains(&"model.embed_tokens.weight".to_string()), "{names:?}");
    assert!(!out.join("model-00001-of-00001.safetensors").exists());
}

/// Products in f16 or bf16 (f32 master weights): the losses follow the f32 run's closely, the parameters stay
/// f32, and only f16 carries a loss scale (2^16 while nothing overflows).
#[test]
fn mixed_precision_follows_f32_training() {
    let dir = fixture("llama");
    let data = random_data(&mut Rng::new("mixed precision data"), 7, 12);
    let f32_run = trainable(&dir);
    let mut t = Trainer::new(&f32_run, small_run(4), data.sequences.len(), 1).unwrap();
    let want: Vec<f64> = (0..4).map(|_| t.step(&data).unwrap().loss).collect();
    for precision in [Precision::F16, Precision::Bf16] {
        let lm = trainable(&dir);
        let run = TrainConfig {
            precision,
            ..small_run(4)
        };
        let mut t = Trainer::new(&lm, run, data.sequences.len(), 1).unwrap();
        let steps: Vec<StepStats> = (0..4).map(|_| t.step(&data).unwrap()).collect();
        for (s, w) in steps.iter().zip(&want) {
            assert!(
                (s.loss - w).abs() <= 2e-2 * w.abs(),
                "{precision}: loss {} against f32 {w}",
                s.loss
            );
            assert!(!s.skipped);
            let scale = (precision == Precision::F16).then_some(LossScale::INITIAL);
            assert_eq!(s.loss_scale, scale, "{precision}");
        }
        assert!(lm.parameters().iter().all(|(_, p)| p.dtype() == DType::F32));
        assert!(steps[3].loss < steps[0].loss, "{precision}: {steps:?}");
        let losses: Vec<f64> = steps.iter().map(|s| s.loss).collect();
        assert_ne!(losses, want, "{precision}: the products did run in 16 bits");
    }
}

/// An f16 step whose scaled gradients overflow is skipped (the weights stay as they were) and halves the scale;
/// the next step runs at the halved scale.
#[test]
fn an_f16_overflow_skips_the_step_and_halves_the_loss_scale() {
    let dir = fixture("llama");
    let data = random_data(&mut Rng::new("overflow data"), 6, 12);
    let lm = trainable(&dir);
    let huge = 2f64.powi(100);
    let mut t = f16_run_at_scale(&lm, &data, huge);
    let before = values(&lm);
    let s = t.step(&data).unwrap();
    assert!(s.skipped && !s.grad_norm.is_finite(), "{s:?}");
    assert!(s.loss.is_finite());
    assert_eq!(s.loss_scale, Some(huge));
    assert_eq!(values(&lm), before, "a skipped step leaves the weights alone");
    assert_eq!(t.state("random").unwrap().loss_scale.unwrap().scale, huge / 2.0);
    let s = t.step(&data).unwrap();
    assert_eq!((s.step, s.loss_scale), (2, Some(huge / 2.0)));
}

/// An f16 run resumed at loss scale `scale`.
fn f16_run_at_scale<'m>(lm: &'m CausalLm, data: &TokenData, scale: f64) -> Trainer<'m> {
    let run = TrainConfig {
        precision: Precision::F16,
        ..small_run(10)
    };
    let mut state = Trainer::new(lm, run, data.sequences.len(), 1)
        .unwrap()
        .state("random")
        .unwrap();
    state.loss_scale = Some(LossScale { scale, good_steps: 0 });
    Trainer::resume(lm, &state, Default::default(), data.sequences.len(), 1).unwrap()
}

/// A checkpoint whose loss scale no f16 run reaches (damaged) is refused with what is wrong with it.
#[test]
fn a_damaged_loss_scale_is_refused_on_resume() {
    let dir = fixture("llama");
    let lm = trainable(&dir);
    let run = TrainConfig {
        precision: Precision::F16,
        ..small_run(3)
    };
    let state = Trainer::new(&lm, run, 4, 1).unwrap().state("random").unwrap();
    let interval = LossScale::GROWTH_INTERVAL;
    for (scale, good_steps) in [
        (3.0, 0),
        (0.0, 0),
        (-2.0, 0),
        (f64::NAN, 0),
        (f64::INFINITY, 0),
        (2f64.powi(127), 0),
        (2f64.powi(-127), 0),
        (1024.0 * (1.0 + f64::EPSILON), 0),
        (2.0, interval),
    ] {
        let mut damaged = state.clone();
        damaged.loss_scale = Some(LossScale { scale, good_steps });
        let err = Trainer::resume(&lm, &damaged, Default::default(), 4, 1).err();
        let message = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            message.contains("loss scale"),
            "{scale} after {good_steps}: {message:?}"
        );
    }
    let mut fine = state.clone();
    fine.loss_scale = Some(LossScale {
        scale: 2f64.powi(-126),
        good_steps: interval - 1,
    });
    assert!(Trainer::resume(&lm, &fine, Default::default(), 4, 1).is_ok());
}

/// Recorded ahead, an f16 run halves its loss scale on the device before the next step's backward: from a scale
/// far too large, the same steps overflow, then train, at the same scales and with the same weights as a
/// blocking run.
#[test]
fn f16_overflows_recorded_ahead_are_the_blocking_ones() {
    let dir = fixture("llama");
    let data = random_data(&mut Rng::new("overflow data"), 6, 12);
    // 2^16 trains this model (`mixed_precision_follows_f32_training`): by the ninth step the scale is 2^16 at most,
    // so some step trains. (A later step may overflow again at 2^17 or 2^18, depending on the random data.)
    let start = 2f64.powi(24);
    let blocking = trainable(&dir);
    let mut t = f16_run_at_scale(&blocking, &data, start);
    let want: Vec<_> = (0..10).map(|_| reported(&t.step(&data).unwrap())).collect();
    assert!(want[0].5 && want.iter().any(|w| !w.5), "{want:?}");
    let ahead = trainable(&dir);
    let mut a = f16_run_at_scale(&ahead, &data, start);
    let mut got = Vec::new();
    for _ in 0..10 {
        got.extend(a.step_ahead(&data).unwrap().as_ref().map(reported));
    }
    got.extend(a.finish().unwrap().as_ref().map(reported));
    // Debug text: an overflowed norm is NaN, which equals nothing.
    assert_eq!(format!("{got:?}"), format!("{want:?}"));
    let scale = |t: &Trainer| t.state("random").unwrap().loss_scale;
    assert_eq!(scale(&a), scale(&t));
    assert_eq!(values(&ahead), values(&blocking));
}

#[test]
fn the_async_step_is_the_blocking_step() {
    // The web steps through `step_async` (no blocking readback there): the same losses and weights, bit for bit.
    let dir = fixture("llama");
    let data = random_data(&mut Rng::new("async data"), 6, 12);
    let blocking = trainable(&dir);
    let mut t = Trainer::new(&blocking, small_run(3), data.sequences.len(), 1).unwrap();
    let want: Vec<f64> = (0..3).map(|_| t.step(&data).unwrap().loss).collect();
    let awaited = trainable(&dir);
    let mut t = Trainer::new(&awaited, small_run(3), data.sequences.len(), 1).unwrap();
    let got: Vec<f64> = (0..3)
        .map(|_| pollster::block_on(t.step_async(&data)).unwrap().loss)
        .collect();
    assert_eq!(got, want);
    assert_eq!(values(&awaited), values(&blocking));
}

/// What a step reports but its wall-clock time.
fn reported(s: &StepStats) -> (usize, f64, f64, f64, Option<f64>, bool, usize) {
    (s.step, s.loss, s.lr, s.grad_norm, s.loss_scale, s.skipped, s.tokens)
}

/// The optimizer's step count for each parameter.
fn counts(t: &Trainer) -> Vec<(String, u64)> {
    let mut c: Vec<(String, u64)> = t
        .optimizer()
        .moments()
        .iter()
        .map(|(n, m)| (n.clone(), m.step))
        .collect();
    c.sort();
    c
}

#[test]
fn steps_recorded_ahead_are_the_blocking_steps() {
    // `hierarchos train` reads each step back while the GPU runs the next: the same statistics and weights, bit
    // for bit, in f32 and in f16 (whose loss scale the device keeps from step to step).
    for precision in [Precision::F32, Precision::F16] {
        let dir = fixture("llama");
        let data = random_data(&mut Rng::new("ahead data"), 6, 12);
        let run = TrainConfig {
            precision,
            ..small_run(3)
        };
        let blocking = trainable(&dir);
        let mut t = Trainer::new(&blocking, run.clone(), data.sequences.len(), 1).unwrap();
        let want: Vec<_> = (0..3).map(|_| reported(&t.step(&data).unwrap())).collect();
        let want_counts = counts(&t);
        let ahead = trainable(&dir);
        let mut t = Trainer::new(&ahead, run, data.sequences.len(), 1).unwrap();
        let mut got = Vec::new();
        for _ in 0..3 {
            got.extend(t.step_ahead(&data).unwrap());
        }
        assert!(t.in_flight(), "{precision}");
        assert!(
            t.step(&data).is_err(),
            "{precision}: a blocking step while one is in flight"
        );
        assert!(
            t.state("random").is_err(),
            "{precision}: a checkpoint's state while one is in flight"
        );
        got.extend(t.finish().unwrap());
        assert!(!t.in_flight() && t.finish().unwrap().is_none());
        assert_eq!(got.iter().map(reported).collect::<Vec<_>>(), want, "{precision}");
        assert_eq!(t.completed_steps(), 3);
        assert_eq!(counts(&t), want_counts, "{precision}");
        assert_eq!(values(&ahead), values(&blocking), "{precision}");
    }
}

#[test]
fn a_non_finite_step_recorded_ahead_stops_where_the_blocking_step_does() {
    // The device skips the diverged update itself, and the optimizer takes back its counts: the same step fails,
    // and the weights and counts are those of the step before it, as in a blocking run.
    let dir = fixture("qwen2");
    let data = random_data(&mut Rng::new("nan data"), 4, 8);
    let mut config = small_run(10);
    config.max_grad_norm = 0.0;
    config.schedule.warmup_steps = 0;
    config.schedule.lr = 1e30;
    let failed_step = |e: Error| match e {
        Error::NonFinite { step, .. } => step,
        other => panic!("expected a non-finite loss, got {other}"),
    };
    let blocking = trainable(&dir);
    let mut t = Trainer::new(&blocking, config.clone(), data.sequences.len(), 1).unwrap();
    let mut last_good = values(&blocking);
    let want = (1..=10)
        .find_map(|_| match t.step(&data) {
            Ok(_) => {
                last_good = values(&blocking);
                None
            }
            Err(e) => Some(failed_step(e)),
        })
        .expect("a 1e30 learning rate diverges");
    assert!(want > 1, "step {want}: the run must diverge after a good step");
    assert_eq!(values(&blocking), last_good, "the diverged update was skipped");
    let want_counts = counts(&t);
    assert_eq!(t.completed_steps(), want - 1);
    let ahead = trainable(&dir);
    let mut t = Trainer::new(&ahead, config, data.sequences.len(), 1).unwrap();
    let got = failed_step(
        (1..=10)
            .find_map(|_| t.step_ahead(&data).err())
            .expect("diverges ahead too"),
    );
    assert_eq!(got, want);
    assert_eq!(t.completed_steps(), want - 1);
    assert_eq!(counts(&t), want_counts);
    assert_eq!(values(&ahead), values(&blocking));
}

#[test]
fn a_non_finite_loss_stops_with_its_step_and_keeps_the_last_checkpoint() {
    let dir = fixture("qwen2");
    let data = random_data(&mut Rng::new("nan data"), 4, 8);
    let files = ModelFiles::read(&dir).unwrap();
    let lm = trainable(&dir);
    let mut config = small_run(10);
    config.max_grad_norm = 0.0;
    config.schedule.warmup_steps = 0;
    config.schedule.lr = 1e30;
    let mut t = Trainer::new(&lm, config, data.sequences.len(), 1).unwrap();
    let out = tmpdir("nan");
    let saved = checkpoint::save(&out, &lm, &files, t.optimizer(), &t.state("random").unwrap(), 0).unwrap();
    let before = values(&lm);
    let failed = (1..=10)
        .find_map(|_| t.step(&data).err())
        .expect("a 1e30 learning rate diverges");
    match failed {
        Error::NonFinite { step, .. } => assert!((1..=10).contains(&step), "{failed}"),
        other => panic!("expected a non-finite loss, got {other}"),
    }
    assert!(failed.to_string().starts_with("step "), "{failed}");
    // A save that died half-way leaves a temporary folder, which resuming ignores.
    std::fs::create_dir_all(out.join(".checkpoint-9.tmp-1")).unwrap();
    std::fs::write(out.join(".checkpoint-9.tmp-1/model.safetensors"), b"trunc").unwrap();
    assert_eq!(checkpoint::resolve_resume(&out).unwrap(), saved);
    assert_eq!(values(&checkpoint::load(&saved, &dev()).unwrap().lm), before);
}

/// The causal-LM loss scores position p against label p + 1 and skips labels of -100 (padding), as
/// transformers does: checked against an f64 cross-entropy of the model's own logits, for u32 labels (the ids
/// again) and for i32 labels with padding.
#[test]
fn the_loss_scores_each_position_against_the_next_label_and_skips_padding() {
    let dir = fixture("llama3_tied");
    let lm = trainable(&dir);
    let ids = input_ids(&dir);
    let (b, t) = (ids.shape()[0], ids.shape()[1]);
    let id_values = ids.to_vec::<u32>().unwrap();
    let logits = lm.forward(&ids, None).unwrap();
    let vocab = logits.shape()[2];
    let rows = logits.to_vec::<f32>().unwrap();
    let want = |labels: &[i32]| -> f64 {
        let (mut sum, mut count) = (0.0, 0);
        for r in 0..b {
            for p in 0..t - 1 {
                let label = labels[r * t + p + 1];
                if label == -100 {
                    continue;
                }
                let row = &rows[(r * t + p) * vocab..(r * t + p + 1) * vocab];
                let max = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
                let lse = max + row.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
                sum += lse - row[label as usize] as f64;
                count += 1;
            }
        }
        sum / count as f64
    };
    let all: Vec<i32> = id_values.iter().map(|&v| v as i32).collect();
    let got = lm.loss(&ids, &ids).unwrap().to_vec::<f32>().unwrap()[0] as f64;
    assert!(
        (got - want(&all)).abs() <= 1e-5 * want(&all).abs(),
        "u32 labels: {got} vs {}",
        want(&all)
    );
    // Pad the second half of every row but the first.
    let mut padded = all.clone();
    for r in 1..b {
        for p in t / 2..t {
            padded[r * t + p] = -100;
        }
    }
    let labels = Tensor::from_slice(&padded, &[b, t], &dev()).unwrap();
    let loss = lm.loss(&ids, &labels).unwrap();
    let got = loss.to_vec::<f32>().unwrap()[0] as f64;
    assert!(
        (got - want(&padded)).abs() <= 1e-5 * want(&padded).abs(),
        "padded: {got} vs {}",
        want(&padded)
    );
    assert!(
        (want(&padded) - want(&all)).abs() > 1e-4,
        "the padding changes the loss"
    );
}

/// A tied model saves no head; DeepSeek-V3's routing correction (a buffer, not a parameter) is saved too.
#[test]
fn a_saved_model_loads_back_with_the_same_logits() {
    for name in ["llama3_tied", "deepseek_v3"] {
        let dir = fixture(name);
        let lm = trainable(&dir);
        let out = tmpdir("export");
        checkpoint::write_model(&out, &lm, &ModelFiles::read(&dir).unwrap()).unwrap();
        let (names, original) = (
            Weights::open(&out).unwrap().names(),
            Weights::open(&dir).unwrap().names(),
        );
        assert_eq!(names, original, "{name}: the saved tensors");
        let back = Model::from_dir(&out, &dev()).unwrap();
        assert!(back.tokenizer.is_some());
        let ids = input_ids(&dir);
        let a = lm.forward(&ids, None).unwrap().to_vec::<f32>().unwrap();
        let b = back.lm.forward(&ids, None).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(a, b, "{name}");
    }
}

#[test]
fn schedules_follow_transformers_lambdas() {
    let at = |scheduler, step| {
        Schedule {
            lr: 2.0,
            scheduler,
            warmup_steps: 2,
            total_steps: 10,
        }
        .lr_at(step)
    };
    // Warmup from 0 (transformers' first step runs at rate 0), then each curve.
    for s in [LrScheduler::Constant, LrScheduler::Linear, LrScheduler::Cosine] {
        assert_eq!((at(s, 0), at(s, 1), at(s, 2)), (0.0, 1.0, 2.0), "{s:?}");
    }
    assert_eq!(at(LrScheduler::Constant, 9), 2.0);
    assert_eq!(at(LrScheduler::Linear, 6), 1.0);
    assert_eq!(at(LrScheduler::Linear, 10), 0.0);
    assert!((at(LrScheduler::Cosine, 6) - 1.0).abs() < 1e-12);
    assert!(at(LrScheduler::Cosine, 10).abs() < 1e-12);
    assert_eq!(at(LrScheduler::Linear, 12), 0.0, "past the end stays at 0");
    assert!("cosine_with_restarts".parse::<LrScheduler>().is_err());
}

#[test]
fn gradient_norm_matches_torch() {
    // (The clipping factor is the device's: ops_adamw.rs.)
    use hierarchos::nn::optim::grad_norm;
    let d = dev();
    let a = Tensor::from_slice(&[1.0f32, -2.0, 2.0], &[3], &d)
        .unwrap()
        .requires_grad_();
    let b = Tensor::from_slice(&[0.5f32, 0.5], &[2], &d).unwrap().requires_grad_();
    let unused = Tensor::from_slice(&[9.0f32], &[1], &d).unwrap().requires_grad_();
    // d(sum(a*a) + sum(3b))/da = 2a, /db = 3: norm sqrt(4 + 16 + 16 + 9 + 9) = sqrt(54).
    a.mul(&a)
        .unwrap()
        .sum(&[], false)
        .unwrap()
        .add(&b.mul_scalar(3.0).unwrap().sum(&[], false).unwrap())
        .unwrap()
        .backward()
        .unwrap();
    let params = vec![
        ("a".to_string(), a),
        ("b".to_string(), b),
        ("unused".to_string(), unused),
    ];
    assert!((grad_norm(&params).unwrap() - 54f64.sqrt()).abs() < 1e-5);
}

#[test]
fn sgd_momentum_nesterov_and_weight_decay_follow_torch() {
    use hierarchos::nn::optim::Sgd;
    let d = dev();
    let mut rng = Rng::new("sgd");
    for (momentum, dampening, weight_decay, nesterov) in [
        (0.0, 0.0, 0.0, false),
        (0.9, 0.0, 0.0, false),
        (0.9, 0.1, 0.01, false),
        (0.8, 0.0, 0.05, true),
    ] {
        let x0 = rng.vec(7, -1.0, 1.0);
        let p = Tensor::from_slice(&x0, &[7], &d).unwrap().requires_grad_();
        let mut opt = Sgd::with_momentum(0.1, momentum);
        (opt.dampening, opt.weight_decay, opt.nesterov) = (dampening, weight_decay, nesterov);
        let mut x: Vec<f64> = x0.iter().map(|&v| v as f64).collect();
        let mut buf: Option<Vec<f64>> = None;
        for _ in 0..3 {
            let c = rng.vec(7, -1.0, 1.0);
            // loss = sum(c * p^2): gradient 2 c p.
            let ct = Tensor::from_slice(&c, &[7], &d).unwrap();
            p.mul(&p)
                .unwrap()
                .mul(&ct)
                .unwrap()
                .sum(&[], false)
                .unwrap()
                .backward()
                .unwrap();
            opt.step(std::slice::from_ref(&p)).unwrap();
            let g: Vec<f64> = (0..7).map(|i| 2.0 * c[i] as f64 * x[i] + weight_decay * x[i]).collect();
            let step: Vec<f64> = if momentum == 0.0 {
                g
            } else {
                let b: Vec<f64> = match &buf {
                    None => g.clone(),
                    Some(b) => (0..7).map(|i| momentum * b[i] + (1.0 - dampening) * g[i]).collect(),
                };
                let s = if nesterov {
                    (0..7).map(|i| g[i] + momentum * b[i]).collect()
                } else {
                    b.clone()
                };
                buf = Some(b);
                s
            };
            for i in 0..7 {
                x[i] -= 0.1 * step[i];
            }
        }
        let what = format!("sgd momentum {momentum} dampening {dampening} wd {weight_decay} nesterov {nesterov}");
        assert_close(&what, &p.to_vec::<f32>().unwrap(), &x, 1e-5, 1e-6);
    }
    // What torch.optim.SGD refuses, refused before anything moves.
    let p = Tensor::from_slice(&[1.0f32, 2.0], &[2], &d).unwrap().requires_grad_();
    for (lr, momentum, dampening, weight_decay, nesterov) in [
        (-0.1, 0.0, 0.0, 0.0, false),
        (f64::NAN, 0.0, 0.0, 0.0, false),
        (0.1, -0.5, 0.0, 0.0, false),
        (0.1, 0.0, 0.0, -0.1, false),
        (0.1, 0.0, 0.0, 0.0, true),
        (0.1, 0.9, 0.5, 0.0, true),
    ] {
        p.sum(&[], false).unwrap().backward().unwrap();
        let mut opt = Sgd::with_momentum(lr, momentum);
        (opt.dampening, opt.weight_decay, opt.nesterov) = (dampening, weight_decay, nesterov);
        assert!(opt.step(std::slice::from_ref(&p)).is_err(), "{opt:?}");
        assert_eq!(p.to_vec::<f32>().unwrap(), [1.0, 2.0]);
        p.zero_grad();
    }
}

/// `no_decay_1d` leaves out what transformers' Trainer leaves out by name, which adds Cohere's 2-D per-head query
/// and key norm weights to the 1-D parameters (with weight decay 0.5, decaying them put k_norm 108% of an
/// update off).
#[test]
fn no_decay_names_follow_transformers_trainer() {
    use hierarchos::nn::optim::trainer_leaves_undecayed;
    for name in [
        "model.layers.0.self_attn.q_norm.weight",
        "model.layers.3.self_attn.k_norm.weight",
        "model.norm.weight",
        "model.layers.1.input_layernorm.weight",
        "gpt_neox.final_layer_norm.weight",
        "model.layers.0.self_attn.q_layernorm.norms.0.weight",
        "model.layers.0.self_attn.q_proj.bias",
    ] {
        assert!(trainer_leaves_undecayed(name), "{name}");
    }
    for name in [
        "model.embed_tokens.weight",
        "lm_head.weight",
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.0.self_attn.normal_proj.weight",
    ] {
        assert!(!trainer_leaves_undecayed(name), "{name}");
    }
}
