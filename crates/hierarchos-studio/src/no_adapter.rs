//! The window shown when no adapter can compute (no Vulkan, Metal or DX12 driver, or `HIERARCHOS_ADAPTER` names
//! none): the reason and what to install, instead of an exit with a message on a terminal the user may not have.
//! It draws through whatever wgpu finds to draw with (OpenGL included).

use eframe::egui;

/// The no-adapter window.
pub struct NoAdapterApp {
    /// Why no device opened.
    pub reason: String,
}

impl NoAdapterApp {
    /// The window's contents.
    pub fn show(&mut self, ui: &mut egui::Ui) {
        egui::CentralPanel::default().show(ui, |ui| {
            ui.heading("No GPU adapter to compute on");
            ui.add_space(8.0);
            ui.colored_label(egui::Color32::LIGHT_RED, &self.reason);
            ui.add_space(8.0);
            ui.label(
                "Hierarchos runs its kernels through Vulkan, Metal or DX12. Install your GPU's driver, or on a \
                 machine without a GPU Mesa's software Vulkan driver (Debian and Ubuntu: sudo apt-get install \
                 mesa-vulkan-drivers), then start the Studio again. HIERARCHOS_ADAPTER picks an adapter by index \
                 or name (`hierarchos info` lists them).",
            );
            ui.add_space(8.0);
            if ui.button("Quit").clicked() {
                ui.ctx().send_viewport_cmd(egui::ViewportCommand::Close);
            }
        });
    }
}

impl eframe::App for NoAdapterApp {
    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        self.show(ui);
    }
}
