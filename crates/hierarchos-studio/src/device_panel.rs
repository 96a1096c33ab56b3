//! The Device tab: the adapter the Studio computes (and draws) on, its features, memory and kernel timings.

use eframe::egui;

use crate::app::StudioApp;
use crate::model_panel::mib;

impl StudioApp {
    /// The Device tab.
    pub(crate) fn device_panel(&mut self, ui: &mut egui::Ui) {
        ui.heading("Device");
        let info = self.device.adapter_info();
        let caps = self.device.caps();
        let memory = self.device.memory();
        egui::Grid::new("device_facts")
            .num_columns(2)
            .striped(true)
            .show(ui, |ui| {
                let mut row = |k: &str, v: String| {
                    ui.label(k);
                    ui.label(v);
                    ui.end_row();
                };
                row("adapter", info.name.clone());
                row("backend", format!("{:?}", info.backend));
                row("type", format!("{:?}", info.device_type));
                row("driver", format!("{} {}", info.driver, info.driver_info));
                row(
                    "subgroups",
                    if caps.subgroups {
                        format!("yes ({}..{} lanes)", caps.subgroup_size.0, caps.subgroup_size.1)
                    } else {
                        "no (shared-memory fallbacks)".into()
                    },
                );
                row("f16 shaders", yes_no(caps.f16));
                row("cooperative matrices", yes_no(caps.cooperative_matrix));
                row("timestamp queries", yes_no(caps.timestamps));
                row("memory in tensors", mib(memory.live_bytes));
                row("peak", mib(memory.peak_bytes));
                row("pooled for reuse", mib(memory.pooled_bytes));
            });
        ui.separator();
        let profile = self.device.profile();
        if profile.is_empty() {
            ui.label(
                "Per-kernel GPU times: start the Studio with HIERARCHOS_PROFILE=1 on an adapter with timestamp \
                 queries inside passes.",
            );
            return;
        }
        ui.label("GPU time per kernel since start (HIERARCHOS_PROFILE=1):");
        egui::ScrollArea::vertical().show(ui, |ui| {
            egui::Grid::new("kernels").striped(true).show(ui, |ui| {
                for k in profile.iter().take(40) {
                    ui.label(format!("{:.1} ms", k.total_ns / 1e6));
                    ui.label(format!("{}", k.launches));
                    ui.label(k.kernel.chars().take(90).collect::<String>());
                    ui.end_row();
                }
            });
        });
    }
}

fn yes_no(b: bool) -> String {
    if b { "yes".into() } else { "no".into() }
}
