//! The Train tab: data and settings (full or LoRA), start / pause / stop / checkpoint, live curves of the loss
//! (smoothed), the held-out loss, the learning rate, tokens/s and GPU memory, export as CSV or PNG, and earlier
//! runs reopened for comparison.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use eframe::egui;
use egui_plot::{Line, Plot, PlotPoints};
use hierarchos_core::DType;
use hierarchos_nn::train::LrScheduler;

use crate::app::StudioApp;
use crate::metrics::{Point, to_csv};
use crate::runs::Run;
use crate::widgets::loss_plot;
use crate::worker::{Command, LoraSettings, ModelSummary, TrainSettings};

/// What the Train tab edits and shows.
pub struct TrainState {
    /// Settings of the next run (`out` is filled in when it starts).
    pub settings: TrainSettings,
    /// Train a LoRA adapter (else every parameter).
    pub use_lora: bool,
    /// The adapter's settings.
    pub lora: LoraSettings,
    /// Smoothing of the loss curve (0: none).
    pub smoothing: f64,
    /// The folder of the running run.
    pub running: Option<PathBuf>,
    /// The step it ends at.
    pub total_steps: usize,
    /// Whether it is paused.
    pub paused: bool,
    /// Whether Stop was pressed (the run ends after its current step).
    pub stopping: bool,
    /// Points of the running (or last) run.
    pub points: Vec<Point>,
    /// Runs found on disk.
    pub runs: Vec<Run>,
    /// Which of them are drawn beside the current one.
    pub compare: Vec<bool>,
    /// The last notice (checkpoint saved, export written...).
    pub message: Option<String>,
    /// Where the loss plot was drawn last frame (what "Export PNG" crops the screenshot to).
    plot_rect: egui::Rect,
    /// Written by the screenshot callback of a PNG export (another thread), shown as the next message.
    notice: Arc<Mutex<Option<String>>>,
    /// The folder of the last run, where exports go.
    last_run: Option<PathBuf>,
}

impl TrainState {
    /// The tab before any model is loaded: `data` preselected, `runs` from disk.
    pub fn new(data: String, runs: Vec<Run>) -> TrainState {
        TrainState {
            settings: TrainSettings {
                model: String::new(),
                data,
                lora: None,
                steps: 300,
                batch_size: 16,
                seq_len: 128,
                lr: 3e-3,
                warmup_steps: 20,
                scheduler: LrScheduler::Cosine,
                eval_split: 0.01,
                eval_every: 50,
                seed: 42,
                out: PathBuf::new(),
            },
            use_lora: false,
            lora: LoraSettings {
                r: 16,
                alpha: 32.0,
                dropout: 0.05,
                targets: "all-linear".into(),
                base_dtype: DType::F32,
            },
            smoothing: 0.6,
            running: None,
            total_steps: 0,
            paused: false,
            stopping: false,
            points: Vec::new(),
            compare: vec![false; runs.len()],
            runs,
            message: None,
            plot_rect: egui::Rect::NOTHING,
            notice: Arc::default(),
            last_run: None,
        }
    }

    /// Settings suited to `model`: a small model (under 10M parameters) trains every parameter at a high
    /// learning rate; a larger one with weights trains a LoRA adapter at a low one, in longer sequences.
    pub fn defaults_for(&mut self, model: &ModelSummary) {
        let small = model.params < 10_000_000;
        self.use_lora = !small && model.has_weights;
        let s = &mut self.settings;
        if small {
            (s.lr, s.batch_size, s.seq_len, s.steps, s.warmup_steps) = (3e-3, 16, 128, 300, 20);
        } else if self.use_lora {
            (s.lr, s.batch_size, s.seq_len, s.steps, s.warmup_steps) = (2e-4, 4, 512, 200, 10);
        } else {
            (s.lr, s.batch_size, s.seq_len, s.steps, s.warmup_steps) = (5e-5, 4, 512, 200, 10);
        }
    }

    /// A run started writing into `dir` (a resumed one with its earlier points), to end at step `steps`.
    pub fn started(&mut self, dir: PathBuf, points: Vec<Point>, steps: usize) {
        self.points = points;
        self.running = Some(dir.clone());
        self.last_run = Some(dir);
        self.total_steps = steps;
        self.paused = false;
        self.stopping = false;
        self.message = None;
    }

    /// A step finished.
    pub fn point(&mut self, point: Point) {
        self.points.push(point);
    }

    /// The run ended; the run list is read again from `runs_dir`.
    pub fn finished(&mut self, dir: &Path, stopped: bool, runs_dir: &Path) {
        self.running = None;
        self.paused = false;
        self.stopping = false;
        self.message = Some(format!(
            "{} after {} steps: {}",
            if stopped { "stopped" } else { "done" },
            self.points.last().map_or(0, |p| p.step),
            dir.display()
        ));
        // The comparison choices follow their runs into the new list.
        let chosen: Vec<PathBuf> = self
            .runs
            .iter()
            .zip(&self.compare)
            .filter(|(_, on)| **on)
            .map(|(r, _)| r.dir.clone())
            .collect();
        self.runs = Run::list(runs_dir);
        self.compare = self.runs.iter().map(|r| chosen.contains(&r.dir)).collect();
    }
}

impl StudioApp {
    /// The Train tab.
    pub(crate) fn train_panel(&mut self, ui: &mut egui::Ui) {
        self.train_settings(ui);
        ui.separator();
        self.train_controls(ui);
        ui.separator();
        self.train_plots(ui);
    }

    fn train_settings(&mut self, ui: &mut egui::Ui) {
        let can_lora = self.model.as_ref().is_some_and(|m| m.has_weights);
        let t = &mut self.train;
        let s = &mut t.settings;
        ui.horizontal(|ui| {
            let label = ui.label("Data (.txt, .jsonl, .parquet or a folder)");
            ui.add(egui::TextEdit::singleline(&mut s.data).desired_width(420.0))
                .labelled_by(label.id);
        });
        egui::Grid::new("train_settings").num_columns(8).show(ui, |ui| {
            ui.label("steps");
            ui.add(egui::DragValue::new(&mut s.steps).range(1..=1_000_000));
            ui.label("batch");
            ui.add(egui::DragValue::new(&mut s.batch_size).range(1..=1024));
            ui.label("sequence length");
            ui.add(egui::DragValue::new(&mut s.seq_len).range(2..=32768));
            ui.label("learning rate");
            ui.add(
                egui::DragValue::new(&mut s.lr)
                    .range(0.0..=1.0)
                    .speed(1e-5)
                    .max_decimals(6),
            );
            ui.end_row();
            ui.label("warmup");
            ui.add(egui::DragValue::new(&mut s.warmup_steps).range(0..=100_000));
            ui.label("schedule");
            egui::ComboBox::from_id_salt("schedule")
                .selected_text(format!("{:?}", s.scheduler))
                .show_ui(ui, |ui| {
                    for sch in [LrScheduler::Constant, LrScheduler::Linear, LrScheduler::Cosine] {
                        ui.selectable_value(&mut s.scheduler, sch, format!("{sch:?}"));
                    }
                });
            ui.label("eval split");
            ui.add(egui::DragValue::new(&mut s.eval_split).range(0.0..=0.5).speed(0.001));
            ui.label("eval every");
            ui.add(egui::DragValue::new(&mut s.eval_every).range(0..=100_000));
            ui.end_row();
        });
        ui.horizontal(|ui| {
            ui.add_enabled(can_lora, egui::Checkbox::new(&mut t.use_lora, "LoRA adapter"))
                .on_disabled_hover_text("LoRA needs a model with weights (train the embedded one in full first)");
            if !can_lora {
                t.use_lora = false;
            }
            ui.add_enabled_ui(t.use_lora, |ui| {
                let l = &mut t.lora;
                ui.label("r");
                ui.add(egui::DragValue::new(&mut l.r).range(1..=1024));
                ui.label("alpha");
                ui.add(egui::DragValue::new(&mut l.alpha).range(0.0..=4096.0));
                ui.label("dropout");
                ui.add(egui::DragValue::new(&mut l.dropout).range(0.0..=0.9).speed(0.01));
                ui.label("targets");
                ui.add(egui::TextEdit::singleline(&mut l.targets).desired_width(160.0));
                egui::ComboBox::from_id_salt("base_dtype")
                    .selected_text(format!("base in {}", l.base_dtype))
                    .show_ui(ui, |ui| {
                        for d in [DType::F32, DType::F16, DType::BF16] {
                            ui.selectable_value(&mut l.base_dtype, d, format!("base in {d}"));
                        }
                    });
            });
        });
    }

    fn train_controls(&mut self, ui: &mut egui::Ui) {
        let controls = self.train.running.is_some() && !self.train.stopping;
        ui.horizontal(|ui| {
            let can_start = self.model.is_some() && self.idle();
            if ui.add_enabled(can_start, egui::Button::new("Start training")).clicked() {
                self.start_training();
            }
            let paused = self.train.paused;
            if ui
                .add_enabled(controls, egui::Button::new(if paused { "Resume" } else { "Pause" }))
                .clicked()
            {
                self.send(if paused { Command::Resume } else { Command::Pause });
            }
            if ui.add_enabled(controls, egui::Button::new("Stop")).clicked() {
                self.train.stopping = true;
                self.send(Command::Stop);
                if paused {
                    // A paused worker waits for a command: the Stop reaches it, and no Resume is needed.
                    self.train.paused = false;
                }
            }
            if ui.add_enabled(controls, egui::Button::new("Checkpoint now")).clicked() {
                self.send(Command::Checkpoint);
            }
            if let Some(p) = self.train.points.last() {
                ui.label(format!(
                    "step {}/{}  loss {:.4}  lr {:.2e}  {:.0} tokens/s  {:.1} MiB",
                    p.step,
                    self.train.total_steps,
                    p.loss.unwrap_or(f64::NAN),
                    p.lr,
                    p.tokens_per_sec,
                    p.memory_mib
                ));
            }
        });
        if let Some(m) = &self.train.message {
            ui.label(m);
        }
    }

    pub(crate) fn start_training(&mut self) {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let mut settings = self.train.settings.clone();
        settings.out = self.options.runs_dir().join(format!("run-{stamp}"));
        settings.model = self
            .model
            .as_ref()
            .map(|m| m.dir.display().to_string())
            .unwrap_or_default();
        settings.lora = self.train.use_lora.then(|| self.train.lora.clone());
        self.busy = Some("starting the run".into());
        self.send(Command::Train(Box::new(settings)));
    }

    fn train_plots(&mut self, ui: &mut egui::Ui) {
        ui.horizontal(|ui| {
            ui.label("smoothing");
            ui.add(egui::Slider::new(&mut self.train.smoothing, 0.0..=0.99));
            let dir = self.train.last_run.clone();
            if ui.add_enabled(dir.is_some(), egui::Button::new("Export CSV")).clicked()
                && let Some(dir) = dir
            {
                let path = dir.join("loss.csv");
                self.train.message = Some(match std::fs::write(&path, to_csv(&self.train.points)) {
                    Ok(()) => format!("wrote {}", path.display()),
                    Err(e) => format!("writing {}: {e}", path.display()),
                });
            }
            if ui
                .add_enabled(self.train.last_run.is_some(), egui::Button::new("Export PNG"))
                .clicked()
                && let Some(dir) = &self.train.last_run
            {
                let (rect, ppp) = (self.train.plot_rect, ui.ctx().pixels_per_point());
                let (path, notice) = (dir.join("loss.png"), self.train.notice.clone());
                let ctx = ui.ctx().clone();
                ui.ctx().request_screenshot(move |image| {
                    let message = match crop(&image, rect, ppp) {
                        Some(plot) => match save_png(&plot, &path) {
                            Ok(()) => format!("wrote {}", path.display()),
                            Err(e) => format!("writing {}: {e}", path.display()),
                        },
                        None => "the plot is not on screen: nothing exported".into(),
                    };
                    *notice.lock().unwrap_or_else(|p| p.into_inner()) = Some(message);
                    ctx.request_repaint();
                });
            }
        });
        if let Some(m) = self.train.notice.lock().unwrap_or_else(|p| p.into_inner()).take() {
            self.train.message = Some(m);
        }
        let others: Vec<(String, &[Point])> = self
            .train
            .runs
            .iter()
            .zip(&self.train.compare)
            .filter(|(_, on)| **on)
            .map(|(r, _)| (r.name(), r.points.as_slice()))
            .collect();
        let response = loss_plot(ui, &self.train.points, self.train.smoothing, &others);
        self.train.plot_rect = response.rect;
        ui.horizontal(|ui| {
            let width = (ui.available_width() / 3.0 - 8.0).max(100.0);
            let series = |f: fn(&Point) -> f64| -> Vec<[f64; 2]> {
                self.train.points.iter().map(|p| [p.step as f64, f(p)]).collect()
            };
            for (id, name, values) in [
                ("lr_plot", "learning rate", series(|p| p.lr)),
                ("speed_plot", "tokens/s", series(|p| p.tokens_per_sec)),
                ("memory_plot", "GPU MiB", series(|p| p.memory_mib)),
            ] {
                ui.vertical(|ui| {
                    ui.label(name);
                    Plot::new(id)
                        .height(120.0)
                        .width(width)
                        .show(ui, |plot| plot.line(Line::new(name, PlotPoints::from(values))));
                });
            }
        });
        if !self.train.runs.is_empty() {
            let can_resume = self.idle();
            let mut resume = None;
            ui.collapsing("Earlier runs (draw beside this one, or continue one)", |ui| {
                for (run, on) in self.train.runs.iter().zip(self.train.compare.iter_mut()) {
                    ui.horizontal(|ui| {
                        if ui.add_enabled(can_resume, egui::Button::new("Continue")).clicked() {
                            resume = Some(run.dir.clone());
                        }
                        let text = format!("{}: {} ({} steps)", run.name(), run.description, run.points.len());
                        ui.checkbox(on, text);
                    });
                }
            });
            if let Some(dir) = resume {
                self.busy = Some(format!("resuming {}", dir.display()));
                self.send(Command::ResumeRun(dir));
            }
        }
    }
}

/// The part of a window screenshot `image` under `rect` (in points at `ppp` pixels per point), clipped to the
/// image; `None` when nothing of it is on screen.
fn crop(image: &egui::ColorImage, rect: egui::Rect, ppp: f32) -> Option<egui::ColorImage> {
    let full = egui::Rect::from_min_size(egui::Pos2::ZERO, egui::vec2(image.size[0] as f32, image.size[1] as f32));
    let pixels = egui::Rect::from_min_max(
        (rect.min.to_vec2() * ppp).round().to_pos2(),
        (rect.max.to_vec2() * ppp).round().to_pos2(),
    )
    .intersect(full);
    (pixels.width() >= 1.0 && pixels.height() >= 1.0).then(|| {
        image.region_by_pixels(
            [pixels.min.x as usize, pixels.min.y as usize],
            [pixels.width() as usize, pixels.height() as usize],
        )
    })
}

/// Writes `image` as a PNG file.
pub(crate) fn save_png(image: &egui::ColorImage, path: &Path) -> image::ImageResult<()> {
    let rgba: Vec<u8> = image.pixels.iter().flat_map(|c| c.to_array()).collect();
    image::save_buffer(
        path,
        &rgba,
        image.size[0] as u32,
        image.size[1] as u32,
        image::ExtendedColorType::Rgba8,
    )
}
