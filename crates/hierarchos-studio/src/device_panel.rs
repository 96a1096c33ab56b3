//! The Device tab: the adapter the Studio computes (and draws) on, its features, memory and kernel timings.

use eframe::egui;

use hierarchos_core::Device;

use crate::widgets::{facts, mib};

/// The Device tab (on the web: the device section).
pub(crate) fn device_panel(ui: &mut egui::Ui, device: &Device) {
    ui.heading("Device");
    let info = device.adapter_info();
    let caps = device.caps();
    let memory = device.memory();
    let subgroups = if caps.subgroups {
        format!("yes ({}..{} lanes)", caps.subgroup_size.0, caps.subgroup_size.1)
    } else {
        "no (shared-memory fallbacks)".into()
    };
    let rows = [
        ("adapter", info.name.clone()),
        ("backend", format!("{:?}", info.backend)),
        ("type", format!("{:?}", info.device_type)),
        ("driver", format!("{} {}", info.driver, info.driver_info)),
        ("subgroups", subgroups),
        ("f16 shaders", yes_no(caps.f16)),
        (
            "cooperative matrices",
            caps.cooperative_matrix.map_or("no".into(), |e| {
                format!("yes ({e} x {e} {})", caps.cooperative_matrix_types())
            }),
        ),
        ("timestamp queries", yes_no(caps.timestamps)),
        ("memory in tensors", mib(memory.live_bytes)),
        ("peak", mib(memory.peak_bytes)),
        ("pooled for reuse", mib(memory.pooled_bytes)),
    ];
    facts(ui, "device_facts", &rows);
    ui.separator();
    let profile = device.profile();
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

fn yes_no(b: bool) -> String {
    if b { "yes".into() } else { "no".into() }
}
