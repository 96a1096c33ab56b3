//! The Model tab: open a folder or a Hub id (or the embedded default) and see what it needs.

use eframe::egui;
use hierarchos_core::DType;

use crate::app::StudioApp;
use crate::widgets::{facts, mib};
use crate::worker::Command;

impl StudioApp {
    /// The Model tab.
    pub(crate) fn model_panel(&mut self, ui: &mut egui::Ui) {
        ui.heading("Model");
        ui.horizontal(|ui| {
            let label = ui.label("Folder or Hub id");
            ui.add(egui::TextEdit::singleline(&mut self.model_arg).desired_width(420.0))
                .labelled_by(label.id);
            if ui.add_enabled(self.idle(), egui::Button::new("Load")).clicked() {
                let arg = self.model_arg.trim().to_string();
                self.send(Command::Load(arg));
            }
            if let Some(e) = &self.embedded
                && ui
                    .add_enabled(self.idle(), egui::Button::new("Embedded default"))
                    .clicked()
            {
                self.model_arg = e.model.display().to_string();
                self.send(Command::Load(self.model_arg.clone()));
            }
        });
        ui.label(
            "A Hub id is downloaded into the Hugging Face cache (HF_HUB_OFFLINE=1 uses the cache only). The \
             embedded default is a 1M-parameter Llama with a tokenizer made for the Shakespeare corpus: it starts \
             from random weights, so train it before chatting.",
        );
        ui.separator();
        let Some(m) = &self.model else {
            return;
        };
        let lora = format!(
            "{} (base in f32), {} (in bf16) + activations",
            mib(m.lora_bytes(DType::F32)),
            mib(m.lora_bytes(DType::BF16))
        );
        let rows = [
            ("folder", m.dir.display().to_string()),
            ("family", m.family.clone()),
            ("parameters", format!("{:.2}M", m.params as f64 / 1e6)),
            ("dtype", "f32 weights and activations".into()),
            (
                "weights",
                if m.has_weights {
                    "from the folder".into()
                } else {
                    "none in the folder: random, to be trained".into()
                },
            ),
            ("adapter", if m.adapter { "LoRA attached" } else { "none" }.into()),
            (
                "tokenizer",
                if m.tokenizer { "yes" } else { "none (token ids only)" }.into(),
            ),
            ("chat template", if m.chat_template { "yes" } else { "none" }.into()),
            ("memory for inference", mib(m.inference_bytes())),
            (
                "memory for full fine-tuning",
                format!("{} + activations", mib(m.full_training_bytes())),
            ),
            ("memory for LoRA", lora),
        ];
        facts(ui, "model_facts", &rows);
    }
}
