//! The Studio window: a tab bar (Model, Train, Chat, Device), the open tab, and a status line. The state of each
//! tab lives here; the tabs draw themselves in their own files. GPU work happens on the [`Worker`] thread: the
//! window sends it commands and applies its events at the start of every frame.

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, Sender, channel};

use eframe::egui;
use hierarchos_core::Device;
use hierarchos_nn::SamplingConfig;

use crate::chat_panel::ChatState;
use crate::embedded::Embedded;
use crate::metrics::Point;
use crate::runs::Run;
use crate::train_panel::TrainState;
use crate::worker::{Command, Event, ModelSummary, Operation, Worker};

/// Where the Studio keeps its files, and what it opens first.
#[derive(Clone, Debug)]
pub struct StudioOptions {
    /// Root of the Studio's files: the embedded model and corpus, and `runs/`.
    pub home: PathBuf,
    /// The model loaded at start (default: the embedded one).
    pub model: Option<String>,
    /// Train on its own once the model is loaded (a demonstration, and the screenshot script).
    pub autorun: Option<Autorun>,
}

/// A short training run the Studio starts by itself, then optionally a screenshot of the window, then quits.
#[derive(Clone, Debug)]
pub struct Autorun {
    /// Steps to train (small batches of short sequences).
    pub steps: usize,
    /// Where to save a PNG of the window when training ends (the app then closes).
    pub screenshot: Option<PathBuf>,
}

impl StudioOptions {
    /// `$HIERARCHOS_STUDIO_HOME`, else `~/.hierarchos-studio`, else a folder under the system temp dir.
    pub fn from_env() -> StudioOptions {
        let home = std::env::var_os("HIERARCHOS_STUDIO_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".hierarchos-studio")))
            .unwrap_or_else(|| std::env::temp_dir().join("hierarchos-studio"));
        StudioOptions {
            home,
            model: None,
            autorun: None,
        }
    }

    /// The folder runs are written to.
    pub fn runs_dir(&self) -> PathBuf {
        self.home.join("runs")
    }
}

/// The open tab.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tab {
    /// Pick and inspect a model.
    Model,
    /// Train it and watch the curves.
    Train,
    /// Generate from it.
    Chat,
    /// The GPU.
    Device,
}

/// The application state.
pub struct StudioApp {
    /// Where files go.
    pub options: StudioOptions,
    /// The embedded default's files.
    pub embedded: Option<Embedded>,
    /// The compute device (shared with the renderer on the desktop).
    pub device: Device,
    /// The open tab.
    pub tab: Tab,
    /// The model field of the Model tab (a folder or a Hub id).
    pub model_arg: String,
    /// The loaded model.
    pub model: Option<ModelSummary>,
    /// What the worker is doing, while it works.
    pub busy: Option<String>,
    /// Errors, newest last, until dismissed.
    pub errors: Vec<String>,
    /// The Train tab.
    pub train: TrainState,
    /// The Chat tab.
    pub chat: ChatState,
    /// Whether the autorun's training was started.
    autorun_started: bool,
    /// Whether the next loaded model should reset the Train tab's settings to its defaults (a model the user
    /// opened, not the one a run just trained).
    defaults_pending: bool,
    ctx: egui::Context,
    commands: Sender<Command>,
    events: Receiver<Event>,
}

impl StudioApp {
    /// The app on `device`, with its worker thread started and the first model loading.
    pub fn new(ctx: &egui::Context, device: Device, options: StudioOptions) -> StudioApp {
        let (commands, worker_commands) = channel();
        let (worker_events, events) = channel();
        let repaint_ctx = ctx.clone();
        let worker = Worker::new(
            device.clone(),
            worker_commands,
            worker_events,
            Box::new(move || repaint_ctx.request_repaint()),
        );
        std::thread::Builder::new()
            .name("hierarchos-worker".into())
            .spawn(move || worker.run())
            .expect("spawning the worker thread");
        let mut errors = Vec::new();
        let embedded = match Embedded::write(&options.home) {
            Ok(e) => Some(e),
            Err(e) => {
                errors.push(format!("writing the embedded model: {e:#}"));
                None
            }
        };
        let model_arg = options
            .model
            .clone()
            .or_else(|| embedded.as_ref().map(|e| e.model.display().to_string()))
            .unwrap_or_default();
        let data = embedded
            .as_ref()
            .map(|e| e.corpus.display().to_string())
            .unwrap_or_default();
        let runs = Run::list(&options.runs_dir());
        let mut app = StudioApp {
            train: TrainState::new(data, runs),
            chat: ChatState::default(),
            options,
            embedded,
            device,
            tab: Tab::Model,
            model_arg,
            model: None,
            busy: None,
            errors,
            autorun_started: false,
            defaults_pending: false,
            ctx: ctx.clone(),
            commands,
            events,
        };
        if !app.model_arg.is_empty() {
            app.send(Command::Load(app.model_arg.clone()));
        }
        app
    }

    /// Sends a command to the worker.
    pub fn send(&mut self, command: Command) {
        if let Command::Load(arg) = &command {
            self.busy = Some(format!("loading {arg}"));
            self.defaults_pending = true;
        }
        if self.commands.send(command).is_err() {
            self.errors.push("the worker thread has stopped".into());
        }
    }

    /// Whether the worker is free for a new command (no operation under way, no training running).
    pub fn idle(&self) -> bool {
        self.busy.is_none() && self.train.running.is_none()
    }

    /// Applies the worker's events that arrived since the last frame.
    pub fn apply_events(&mut self) {
        while let Ok(event) = self.events.try_recv() {
            match event {
                Event::Busy(what) => self.busy = Some(what),
                Event::Loaded(summary) => {
                    self.busy = None;
                    if std::mem::take(&mut self.defaults_pending) {
                        self.train.defaults_for(&summary);
                    }
                    // Another model: its own sampling settings (the same one, trained, keeps the user's).
                    if self.model.as_ref().is_none_or(|m| m.dir != summary.dir) {
                        self.chat.sampling = SamplingConfig {
                            seed: self.chat.sampling.seed,
                            ..summary.sampling.clone()
                        };
                    }
                    self.model = Some(summary);
                }
                Event::Unloaded => self.model = None,
                Event::RunStarted { dir, points, steps } => {
                    self.busy = None;
                    self.train.started(dir, points, steps);
                }
                Event::Point(point) => self.train.point(point),
                Event::Paused(paused) => self.train.paused = paused,
                Event::Checkpoint(dir) => self.train.message = Some(format!("checkpoint saved: {}", dir.display())),
                Event::TrainDone { dir, stopped } => {
                    self.busy = None;
                    self.train.finished(&dir, stopped, &self.options.runs_dir());
                    if let Some(path) = self.options.autorun.as_ref().and_then(|a| a.screenshot.clone()) {
                        self.screenshot_and_quit(path);
                    }
                }
                Event::Token { text, base: false } => self.chat.output.push_str(&text),
                Event::Token { text, base: true } => self.chat.base_output.push_str(&text),
                Event::Generated { tokens, secs } => {
                    self.busy = None;
                    self.chat.finished(tokens, secs);
                }
                Event::Error { during, message } => {
                    match during {
                        Operation::Load => self.busy = None,
                        Operation::Train => {
                            self.busy = None;
                            self.train.running = None;
                        }
                        Operation::Generate => {
                            self.busy = None;
                            self.chat.generating = false;
                        }
                        Operation::Refused => {}
                    }
                    if self.options.autorun.is_some() && during != Operation::Refused {
                        // A scripted run (the screenshot script) must not wait for a person to close it.
                        eprintln!("hierarchos-studio: {message}");
                        std::process::exit(1);
                    }
                    self.errors.push(message);
                }
            }
        }
    }

    /// The points of the running (or last) run.
    pub fn points(&self) -> &[Point] {
        &self.train.points
    }

    /// Starts the autorun's training once the model is loaded.
    fn autorun(&mut self) {
        let Some(run) = &self.options.autorun else {
            return;
        };
        if self.autorun_started || self.model.is_none() || !self.idle() {
            return;
        }
        self.autorun_started = true;
        self.tab = Tab::Train;
        let s = &mut self.train.settings;
        (s.steps, s.batch_size, s.seq_len, s.warmup_steps) = (run.steps, 8, 64, 0);
        s.eval_every = (run.steps / 4).max(1);
        self.start_training();
    }

    /// Saves a PNG of the window (next frame) to `path`, then closes it.
    fn screenshot_and_quit(&mut self, path: PathBuf) {
        let ctx = self.ctx.clone();
        self.ctx.request_screenshot(move |image| {
            if let Err(e) = crate::train_panel::save_png(&image, &path) {
                eprintln!("writing {}: {e}", path.display());
            } else {
                eprintln!("wrote {}", path.display());
            }
            ctx.send_viewport_cmd(egui::ViewportCommand::Close);
        });
    }

    /// The whole window for one frame.
    pub fn show(&mut self, ui: &mut egui::Ui) {
        egui::Panel::top("tabs").show(ui, |ui| {
            ui.horizontal(|ui| {
                ui.heading("Hierarchos Studio");
                ui.separator();
                for (tab, name) in [
                    (Tab::Model, "Model"),
                    (Tab::Train, "Train"),
                    (Tab::Chat, "Chat"),
                    (Tab::Device, "Device"),
                ] {
                    ui.selectable_value(&mut self.tab, tab, name);
                }
            });
        });
        egui::Panel::bottom("status").show(ui, |ui| self.status_line(ui));
        egui::CentralPanel::default().show(ui, |ui| match self.tab {
            Tab::Model => self.model_panel(ui),
            Tab::Train => self.train_panel(ui),
            Tab::Chat => self.chat_panel(ui),
            Tab::Device => crate::device_panel::device_panel(ui, &self.device),
        });
    }

    fn status_line(&mut self, ui: &mut egui::Ui) {
        ui.horizontal(|ui| {
            if let Some(what) = &self.busy {
                ui.spinner();
                ui.label(what);
            } else if self.train.paused {
                ui.label("training paused");
            } else if self.train.running.is_some() {
                ui.spinner();
                ui.label("training");
            } else if let Some(m) = &self.model {
                ui.label(format!("{} ({}) ready", m.dir.display(), m.family));
            } else {
                ui.label("no model loaded");
            }
        });
        crate::widgets::error_list(ui, &mut self.errors);
    }
}

impl eframe::App for StudioApp {
    /// Events are applied here, so that they keep flowing while the window is hidden (`ui` is then skipped).
    fn logic(&mut self, _ctx: &egui::Context, _frame: &mut eframe::Frame) {
        self.apply_events();
        self.autorun();
    }

    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        self.show(ui);
    }
}
