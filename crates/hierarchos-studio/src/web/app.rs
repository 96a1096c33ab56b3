//! The web demo's page: the model (embedded, fetched from a folder URL, or picked files), generation with
//! streamed text, training with a live loss curve, the device, and a status line. A scripted run (see
//! [`Script`]) drives the same tasks the buttons start and publishes what they produced.

use std::cell::RefCell;
use std::rc::Rc;

use eframe::egui;
use hierarchos_core::Device;
use hierarchos_nn::SamplingConfig;
use serde_json::json;

use super::tasks::{self, Shared, State, TrainRequest};
use super::{Script, files, publish};
use crate::widgets::{error_list, facts, loss_plot};

/// Where a scripted run stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Loading,
    Generating,
    Training,
    Done,
}

/// The web demo.
pub struct WebApp {
    state: State,
    device: Device,
    ctx: egui::Context,
    /// The model folder URL field.
    url: String,
    prompt: String,
    max_new_tokens: usize,
    sampling: SamplingConfig,
    train: TrainRequest,
    smoothing: f64,
    script: Option<(Script, Stage)>,
}

impl WebApp {
    /// The page on `device`, loading the scripted model or the embedded one.
    pub fn new(ctx: &egui::Context, device: Device, script: Option<Script>) -> WebApp {
        let mut app = WebApp {
            state: Rc::new(RefCell::new(Shared::new())),
            device,
            ctx: ctx.clone(),
            url: String::new(),
            prompt: "ROMEO:".into(),
            max_new_tokens: 32,
            sampling: SamplingConfig::default(),
            train: TrainRequest {
                steps: 20,
                batch_size: 8,
                seq_len: 64,
                lr: 3e-3,
            },
            smoothing: 0.6,
            script: None,
        };
        match script.as_ref() {
            Some(s) if s.pick => app.pick_model(),
            Some(Script { model: Some(url), .. }) => {
                app.url = url.clone();
                app.load_url();
            }
            _ => app.load_embedded(),
        }
        if let Some(script) = script {
            if let Some(prompt) = &script.prompt {
                app.prompt = prompt.clone();
                app.max_new_tokens = script.tokens.max(1);
            }
            app.train.steps = script.train_steps.max(1);
            app.script = Some((script, Stage::Loading));
        }
        app
    }

    fn idle(&self) -> bool {
        self.state.borrow().busy.is_none()
    }

    fn load_embedded(&mut self) {
        match tasks::embedded_model() {
            Ok(bytes) => {
                let task = tasks::load(self.state.clone(), self.device.clone(), bytes);
                tasks::spawn(&self.state, &self.ctx, "loading the embedded model", task);
            }
            Err(e) => self.state.borrow_mut().errors.push(format!("{e:#}")),
        }
    }

    fn load_url(&mut self) {
        let (state, device, url) = (self.state.clone(), self.device.clone(), self.url.clone());
        let what = format!("fetching {url}");
        tasks::spawn(&self.state, &self.ctx, &what, async move {
            let bytes = files::fetch_model(&url).await?;
            tasks::load(state, device, bytes).await
        });
    }

    fn pick_model(&mut self) {
        let (state, device) = (self.state.clone(), self.device.clone());
        tasks::spawn(&self.state, &self.ctx, "picking model files", async move {
            match files::pick_model().await? {
                Some(bytes) => tasks::load(state, device, bytes).await,
                None => Ok(()),
            }
        });
    }

    fn pick_data(&mut self) {
        let state = self.state.clone();
        tasks::spawn(&self.state, &self.ctx, "picking training data", async move {
            if let Some(data) = files::pick_data().await {
                state.borrow_mut().data = data;
            }
            Ok(())
        });
    }

    fn generate(&mut self) {
        let task = tasks::generate(
            self.state.clone(),
            self.ctx.clone(),
            self.prompt.clone(),
            self.max_new_tokens,
            self.sampling.clone(),
        );
        tasks::spawn(&self.state, &self.ctx, "generating", task);
    }

    fn start_training(&mut self) {
        let task = tasks::train(
            self.state.clone(),
            self.ctx.clone(),
            self.device.clone(),
            self.train.clone(),
        );
        tasks::spawn(&self.state, &self.ctx, "training", task);
    }

    /// Moves a scripted run on when the previous task has ended: generate, then train, then publish.
    fn advance_script(&mut self) {
        let Some((script, stage)) = self.script.clone() else {
            return;
        };
        if !self.idle() {
            return;
        }
        let errors = self.state.borrow().errors.clone();
        if !errors.is_empty() {
            publish(&json!({ "error": errors.join("; ") }));
            self.script = None;
            return;
        }
        let next = match stage {
            Stage::Loading if script.prompt.is_some() => {
                self.sampling = SamplingConfig::default();
                self.generate();
                Stage::Generating
            }
            Stage::Loading | Stage::Generating if script.train_steps > 0 => {
                self.start_training();
                Stage::Training
            }
            _ => {
                let s = self.state.borrow();
                let (ids, speed) = s.generated.clone().unwrap_or_default();
                let losses: Vec<f64> = s.points.iter().filter_map(|p| p.loss).collect();
                publish(&json!({
                    "model": s.summary.as_ref().map(|m| m.label.clone()),
                    "adapter": self.device.adapter_info().name,
                    "ids": ids,
                    "text": s.output,
                    "tokens_per_sec": speed,
                    "losses": losses,
                }));
                Stage::Done
            }
        };
        self.script = (next != Stage::Done).then_some((script, next));
    }

    fn model_section(&mut self, ui: &mut egui::Ui) {
        ui.heading("Model");
        let idle = self.idle();
        if let Some(m) = self.state.borrow().summary.clone() {
            facts(
                ui,
                "model_facts",
                &[
                    ("from", m.label),
                    ("family", m.family),
                    ("parameters", format!("{:.2} M", m.params as f64 / 1e6)),
                    (
                        "weights",
                        if m.weights { "loaded" } else { "random (train it)" }.to_string(),
                    ),
                    ("tokenizer", if m.tokenizer { "yes" } else { "no" }.to_string()),
                ],
            );
        } else {
            ui.label("no model loaded");
        }
        ui.horizontal(|ui| {
            if ui.add_enabled(idle, egui::Button::new("Embedded tiny model")).clicked() {
                self.load_embedded();
            }
            if ui.add_enabled(idle, egui::Button::new("Open model files…")).clicked() {
                self.pick_model();
            }
        });
        ui.horizontal(|ui| {
            let label = ui.label("Folder URL");
            ui.add(egui::TextEdit::singleline(&mut self.url).desired_width(320.0))
                .labelled_by(label.id);
            if ui
                .add_enabled(idle && !self.url.is_empty(), egui::Button::new("Fetch"))
                .clicked()
            {
                self.load_url();
            }
        });
    }

    fn generate_section(&mut self, ui: &mut egui::Ui) {
        ui.heading("Generate");
        let ready = self.idle() && self.state.borrow().summary.as_ref().is_some_and(|m| m.tokenizer);
        let label = ui.label("Prompt");
        ui.add(
            egui::TextEdit::multiline(&mut self.prompt)
                .desired_rows(2)
                .desired_width(f32::INFINITY),
        )
        .labelled_by(label.id);
        ui.horizontal(|ui| {
            ui.label("max new tokens");
            ui.add(egui::DragValue::new(&mut self.max_new_tokens).range(1..=1024));
            ui.label("temperature (0: greedy)");
            ui.add(egui::Slider::new(&mut self.sampling.temperature, 0.0..=2.0));
            if ui.add_enabled(ready, egui::Button::new("Generate")).clicked() {
                self.generate();
            }
        });
        let s = self.state.borrow();
        if !s.output.is_empty() {
            egui::Frame::group(ui.style()).show(ui, |ui| {
                ui.label(egui::RichText::new(&s.output).monospace());
            });
        }
        if let Some((ids, speed)) = &s.generated {
            ui.label(format!("{} tokens, {speed:.1} tokens/s", ids.len()));
        }
    }

    fn train_section(&mut self, ui: &mut egui::Ui) {
        ui.heading("Train");
        let idle = self.idle();
        let ready = idle && self.state.borrow().summary.is_some();
        let training = self
            .state
            .borrow()
            .busy
            .as_deref()
            .is_some_and(|b| b.starts_with("training"));
        ui.horizontal(|ui| {
            let (name, size) = {
                let s = self.state.borrow();
                (s.data.0.clone(), s.data.1.len())
            };
            ui.label(format!("data: {name} ({:.1} KiB)", size as f64 / 1024.0));
            if ui.add_enabled(idle, egui::Button::new("Pick data file…")).clicked() {
                self.pick_data();
            }
        });
        ui.horizontal(|ui| {
            let t = &mut self.train;
            ui.label("steps");
            ui.add(egui::DragValue::new(&mut t.steps).range(1..=100_000));
            ui.label("batch");
            ui.add(egui::DragValue::new(&mut t.batch_size).range(1..=256));
            ui.label("sequence length");
            ui.add(egui::DragValue::new(&mut t.seq_len).range(2..=4096));
            ui.label("learning rate");
            ui.add(egui::DragValue::new(&mut t.lr).speed(1e-4).range(1e-6..=1.0));
        });
        ui.horizontal(|ui| {
            if ui.add_enabled(ready, egui::Button::new("Train")).clicked() {
                self.start_training();
            }
            if ui.add_enabled(training, egui::Button::new("Stop")).clicked() {
                self.state.borrow_mut().stop = true;
            }
            ui.label("smoothing");
            ui.add(egui::Slider::new(&mut self.smoothing, 0.0..=0.99));
        });
        let s = self.state.borrow();
        if let Some(last) = s.points.last() {
            ui.label(format!(
                "step {}: loss {:.4}, {:.0} tokens/s, {:.1} MiB on the GPU",
                last.step,
                last.loss.unwrap_or(f64::NAN),
                last.tokens_per_sec,
                last.memory_mib
            ));
        }
        loss_plot(ui, &s.points, self.smoothing, &[]);
    }

    fn status_line(&mut self, ui: &mut egui::Ui) {
        let mut s = self.state.borrow_mut();
        ui.horizontal(|ui| match &s.busy {
            Some(what) => {
                ui.spinner();
                ui.label(what);
            }
            None => {
                ui.label("ready");
            }
        });
        error_list(ui, &mut s.errors);
    }
}

impl eframe::App for WebApp {
    fn logic(&mut self, _ctx: &egui::Context, _frame: &mut eframe::Frame) {
        self.advance_script();
    }

    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        egui::Panel::bottom("status").show(ui, |ui| self.status_line(ui));
        egui::CentralPanel::default().show(ui, |ui| {
            egui::ScrollArea::vertical().show(ui, |ui| {
                ui.heading("Hierarchos Studio: web demo");
                ui.label("Runs on this browser's WebGPU adapter; nothing leaves the page.");
                ui.separator();
                self.model_section(ui);
                ui.separator();
                self.generate_section(ui);
                ui.separator();
                self.train_section(ui);
                ui.separator();
                ui.collapsing("Device", |ui| crate::device_panel::device_panel(ui, &self.device));
            });
        });
    }
}
