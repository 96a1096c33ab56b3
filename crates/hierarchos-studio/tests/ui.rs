//! The Studio driven through its real widgets (egui_kittest, AccessKit labels) on the default device: the
//! embedded model loads at start, a short training run fills the loss plot, and the trained model generates;
//! failures (a bad folder, out of memory, no adapter) are messages in the window.

use std::time::{Duration, Instant};

use eframe::egui;
use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use hierarchos_core::{Gpu, GpuOptions};
use hierarchos_studio::no_adapter::NoAdapterApp;
use hierarchos_studio::{StudioApp, StudioOptions, Tab};

/// Frames until `done` holds for the app (the worker thread does the work), failing after `limit`.
fn wait(harness: &mut Harness<'_, StudioApp>, what: &str, limit: Duration, done: impl Fn(&StudioApp) -> bool) {
    let start = Instant::now();
    while !done(harness.state()) {
        assert!(
            harness.state().errors.is_empty(),
            "{what}: the app shows errors {:?}",
            harness.state().errors
        );
        assert!(start.elapsed() < limit, "{what}: not done after {limit:?}");
        harness.step();
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn home(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("hierarchos-studio-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn train_the_embedded_model_then_generate() {
    let device = hierarchos_core::default_device().expect("a GPU adapter (lavapipe in CI)");
    let options = StudioOptions {
        home: home("ui"),
        model: None,
        autorun: None,
    };
    let runs = options.runs_dir();
    let mut harness = Harness::builder()
        .with_size(egui::vec2(1200.0, 900.0))
        .build_eframe(|cc| StudioApp::new(&cc.egui_ctx, device, options));
    wait(
        &mut harness,
        "loading the embedded model",
        Duration::from_secs(60),
        |app| app.model.is_some(),
    );
    let model = harness.state().model.clone().unwrap();
    assert_eq!(model.family, "llama");
    assert!(!model.has_weights, "the embedded model starts from random weights");

    harness.get_by_label("Train").click();
    harness.step();
    assert_eq!(harness.state().tab, Tab::Train);
    {
        // A run the software driver finishes in seconds.
        let s = &mut harness.state_mut().train.settings;
        (
            s.steps,
            s.batch_size,
            s.seq_len,
            s.eval_every,
            s.eval_split,
            s.warmup_steps,
        ) = (4, 2, 16, 2, 0.001, 0);
    }
    harness.get_by_label("Start training").click();
    wait(&mut harness, "training", Duration::from_secs(300), |app| {
        app.train.running.is_none() && app.train.points.len() == 4
    });
    let points = harness.state().points().to_vec();
    assert!(points.iter().all(|p| p.loss.is_some_and(f64::is_finite)), "{points:?}");
    assert_eq!(
        points.iter().filter(|p| p.eval_loss.is_some()).count(),
        2,
        "evaluated at steps 2 and 4"
    );
    assert_eq!(points.last().unwrap().step, 4);
    let run = harness.state().train.runs.last().cloned().expect("the run is listed");
    assert!(run.dir.starts_with(&runs));
    assert_eq!(run.points, points, "the run's metrics file holds what the plot showed");
    for file in ["config.json", "model.safetensors", "tokenizer.json", "checkpoint-4"] {
        assert!(run.dir.join(file).exists(), "{file} missing from the run folder");
    }
    assert!(
        harness.state().model.as_ref().unwrap().has_weights,
        "the trained model is now current"
    );

    harness.get_by_label("Chat").click();
    harness.step();
    harness.state_mut().chat.max_new_tokens = 8;
    harness.get_by_label("Generate").click();
    wait(&mut harness, "generating", Duration::from_secs(120), |app| {
        !app.chat.generating && app.chat.speed.is_some()
    });
    assert!(!harness.state().chat.output.is_empty(), "no text generated");
    assert!((1..=8).contains(&harness.state().chat.speed.unwrap().0));

    // A LoRA run on the trained model, then its answer beside the base model's.
    harness.get_by_label("Train").click();
    harness.step();
    {
        let t = &mut harness.state_mut().train;
        t.use_lora = true;
        (t.lora.r, t.lora.targets) = (4, "q_proj,v_proj".into());
        (t.settings.steps, t.settings.eval_split) = (2, 0.0);
    }
    harness.get_by_label("Start training").click();
    wait(&mut harness, "LoRA training", Duration::from_secs(300), |app| {
        app.train.running.is_none() && app.train.points.len() == 2
    });
    assert!(
        harness.state().model.as_ref().unwrap().adapter,
        "the adapter is attached"
    );
    let lora_run = harness.state().train.runs.last().cloned().unwrap();
    assert!(
        lora_run.dir.join("adapter_config.json").is_file(),
        "a LoRA run writes a PEFT adapter"
    );
    harness.get_by_label("Chat").click();
    harness.step();
    harness.state_mut().chat.compare_base = true;
    // The last generation's figures would satisfy the wait below before the click is even handled.
    harness.state_mut().chat.speed = None;
    harness.get_by_label("Generate").click();
    wait(&mut harness, "generating twice", Duration::from_secs(120), |app| {
        !app.chat.generating && app.chat.speed.is_some()
    });
    let chat = &harness.state().chat;
    assert!(!chat.output.is_empty() && !chat.base_output.is_empty(), "{chat:?}");
}

#[test]
fn a_bad_model_folder_is_an_error_message() {
    let device = hierarchos_core::default_device().expect("a GPU adapter (lavapipe in CI)");
    let missing = home("missing-model");
    let options = StudioOptions {
        home: home("bad"),
        model: Some(missing.display().to_string()),
        autorun: None,
    };
    let mut harness = Harness::builder()
        .with_size(egui::vec2(1000.0, 700.0))
        .build_eframe(|cc| StudioApp::new(&cc.egui_ctx, device, options));
    let start = Instant::now();
    while harness.state().errors.is_empty() {
        assert!(start.elapsed() < Duration::from_secs(60), "no error shown");
        harness.step();
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        harness.state().errors[0].contains("missing-model"),
        "{:?}",
        harness.state().errors
    );
    assert!(harness.state().model.is_none());
    // Through AccessKit (by widget, not by position: the status panel grows when the error appears).
    harness.get_by_label("dismiss").click_accesskit();
    harness.run_steps(2);
    assert!(harness.state().errors.is_empty(), "{:?}", harness.state().errors);
}

#[test]
fn a_stopped_run_continues_from_its_checkpoint() {
    let device = hierarchos_core::default_device().expect("a GPU adapter (lavapipe in CI)");
    let options = StudioOptions {
        home: home("resume"),
        model: None,
        autorun: None,
    };
    let mut harness = Harness::builder()
        .with_size(egui::vec2(1200.0, 900.0))
        .build_eframe(|cc| StudioApp::new(&cc.egui_ctx, device, options));
    wait(&mut harness, "loading", Duration::from_secs(60), |app| {
        app.model.is_some()
    });
    harness.get_by_label("Train").click_accesskit();
    harness.step();
    {
        let s = &mut harness.state_mut().train.settings;
        // Enough steps that Stop lands before the end even on a fast GPU.
        (s.steps, s.batch_size, s.seq_len, s.eval_split, s.warmup_steps) = (40, 2, 16, 0.0, 0);
    }
    harness.get_by_label("Start training").click_accesskit();
    wait(&mut harness, "the first step", Duration::from_secs(120), |app| {
        !app.train.points.is_empty()
    });
    harness.get_by_label("Stop").click_accesskit();
    wait(&mut harness, "stopping", Duration::from_secs(120), |app| {
        app.train.running.is_none()
    });
    let stopped_at = harness.state().train.points.len();
    assert!((1..40).contains(&stopped_at), "stopped after {stopped_at} steps");
    assert!(
        harness
            .state()
            .train
            .message
            .as_deref()
            .unwrap_or("")
            .starts_with("stopped")
    );
    harness.get_by_label_contains("Earlier runs").click_accesskit();
    harness.step();
    harness.get_by_label("Continue").click_accesskit();
    wait(&mut harness, "continuing", Duration::from_secs(300), |app| {
        app.train.running.is_none() && app.train.points.len() == 40
    });
    let steps: Vec<usize> = harness.state().points().iter().map(|p| p.step).collect();
    assert_eq!(steps, (1..=40).collect::<Vec<_>>());
    let run = harness.state().train.runs.last().cloned().unwrap();
    assert_eq!(run.points.len(), 40, "the metrics file holds each step once");
    assert!(run.dir.join("checkpoint-40").is_dir());
}

/// Out of memory is a message, not a crash: on a device with a 1 MiB budget the embedded model (4 MiB of weights)
/// does not fit; the app says so, holds no model, and is idle again.
#[test]
fn out_of_memory_is_an_error_message() {
    let options = GpuOptions {
        memory_limit: Some(1 << 20),
        ..GpuOptions::from_env()
    };
    let device = pollster::block_on(Gpu::open(&options)).expect("a GPU adapter (lavapipe in CI)");
    let options = StudioOptions {
        home: home("oom"),
        model: None,
        autorun: None,
    };
    let mut harness = Harness::builder()
        .with_size(egui::vec2(1200.0, 900.0))
        .build_eframe(|cc| StudioApp::new(&cc.egui_ctx, device, options));
    let start = Instant::now();
    while harness.state().errors.is_empty() {
        assert!(start.elapsed() < Duration::from_secs(60), "no error after a minute");
        harness.step();
        std::thread::sleep(Duration::from_millis(20));
    }
    harness.run_steps(2);
    let errors = harness.state().errors.clone();
    assert!(errors[0].contains("out of GPU memory"), "{errors:?}");
    assert!(harness.state().model.is_none());
    assert!(harness.state().idle(), "the app is idle after the error");
    harness.get_by_label_contains("out of GPU memory");
}

/// Without an adapter the Studio opens a window that gives the reason and what to install.
#[test]
fn no_adapter_is_a_window_with_the_reason() {
    let reason = "HIERARCHOS_ADAPTER=none matches none of: llvmpipe".to_string();
    let mut harness = Harness::builder()
        .with_size(egui::vec2(640.0, 280.0))
        .build_eframe(|_| NoAdapterApp { reason });
    harness.run_steps(2);
    harness.get_by_label("No GPU adapter to compute on");
    harness.get_by_label_contains("matches none of: llvmpipe");
    harness.get_by_label_contains("mesa-vulkan-drivers");
    harness.get_by_label("Quit");
}
