//! The Chat tab: a prompt (plain, or through the model's chat template), sampling controls, and the streamed
//! answer with its speed.

use eframe::egui;
use hierarchos_nn::SamplingConfig;

use crate::app::StudioApp;
use crate::worker::{Command, GenerateRequest};

/// What the Chat tab edits and shows.
#[derive(Debug)]
pub struct ChatState {
    /// The prompt.
    pub prompt: String,
    /// Send the prompt through the chat template.
    pub chat: bool,
    /// Most new tokens.
    pub max_new_tokens: usize,
    /// Sampling settings (temperature 0: greedy).
    pub sampling: SamplingConfig,
    /// The text generated so far.
    pub output: String,
    /// Also generate with the adapter switched off, side by side.
    pub compare_base: bool,
    /// The base model's text in a comparison.
    pub base_output: String,
    /// Whether a generation is running.
    pub generating: bool,
    /// Tokens and tokens/s of the last generation.
    pub speed: Option<(usize, f64)>,
}

impl Default for ChatState {
    fn default() -> Self {
        ChatState {
            prompt: "ROMEO:".into(),
            chat: false,
            max_new_tokens: 64,
            sampling: SamplingConfig::default(),
            output: String::new(),
            compare_base: false,
            base_output: String::new(),
            generating: false,
            speed: None,
        }
    }
}

impl ChatState {
    /// A generation ended.
    pub fn finished(&mut self, tokens: usize, secs: f64) {
        self.generating = false;
        self.speed = Some((tokens, tokens as f64 / secs.max(1e-9)));
    }
}

impl StudioApp {
    /// The Chat tab.
    pub(crate) fn chat_panel(&mut self, ui: &mut egui::Ui) {
        ui.heading("Chat");
        let has_template = self.model.as_ref().is_some_and(|m| m.chat_template);
        let has_adapter = self.model.as_ref().is_some_and(|m| m.adapter);
        let c = &mut self.chat;
        let label = ui.label("Prompt");
        ui.add(
            egui::TextEdit::multiline(&mut c.prompt)
                .desired_rows(3)
                .desired_width(f32::INFINITY),
        )
        .labelled_by(label.id);
        ui.horizontal(|ui| {
            ui.add_enabled(has_template, egui::Checkbox::new(&mut c.chat, "as a chat message"))
                .on_disabled_hover_text("the model has no chat template");
            ui.add_enabled(
                has_adapter,
                egui::Checkbox::new(&mut c.compare_base, "beside the base model"),
            )
            .on_disabled_hover_text("the model has no adapter (train one with LoRA)");
            ui.label("max new tokens");
            ui.add(egui::DragValue::new(&mut c.max_new_tokens).range(1..=4096));
        });
        ui.horizontal(|ui| {
            ui.label("temperature");
            ui.add(
                egui::DragValue::new(&mut c.sampling.temperature)
                    .range(0.0..=5.0)
                    .speed(0.05),
            );
            ui.label("top-k");
            ui.add(egui::DragValue::new(&mut c.sampling.top_k).range(0..=1000));
            ui.label("top-p");
            ui.add(egui::DragValue::new(&mut c.sampling.top_p).range(0.0..=1.0).speed(0.01));
            ui.label("min-p");
            ui.add(egui::DragValue::new(&mut c.sampling.min_p).range(0.0..=1.0).speed(0.01));
            ui.label("repetition penalty");
            ui.add(
                egui::DragValue::new(&mut c.sampling.repetition_penalty)
                    .range(1.0..=3.0)
                    .speed(0.01),
            );
            ui.label("seed");
            ui.add(egui::DragValue::new(&mut c.sampling.seed));
        });
        if !has_template {
            c.chat = false;
        }
        let ready = self.model.is_some() && self.idle();
        if ui.add_enabled(ready, egui::Button::new("Generate")).clicked() {
            let request = GenerateRequest {
                prompt: self.chat.prompt.clone(),
                chat: self.chat.chat,
                max_new_tokens: self.chat.max_new_tokens,
                sampling: self.chat.sampling.clone(),
                compare_base: self.chat.compare_base && has_adapter,
            };
            self.chat.output.clear();
            self.chat.base_output.clear();
            self.chat.speed = None;
            self.chat.generating = true;
            self.send(Command::Generate(request));
        }
        ui.separator();
        if let Some((tokens, rate)) = self.chat.speed {
            ui.label(format!("{tokens} tokens, {rate:.1} tokens/s"));
        }
        let compare = self.chat.compare_base && has_adapter;
        egui::ScrollArea::vertical().show(ui, |ui| {
            if compare {
                ui.columns(2, |cols| {
                    cols[0].strong("with the adapter");
                    cols[0].label(egui::RichText::new(&self.chat.output).monospace());
                    cols[1].strong("base model");
                    cols[1].label(egui::RichText::new(&self.chat.base_output).monospace());
                });
            } else {
                ui.label(egui::RichText::new(&self.chat.output).monospace());
            }
        });
    }
}
