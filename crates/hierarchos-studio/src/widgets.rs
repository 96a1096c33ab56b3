//! Small display helpers shared by the desktop tabs and the web demo.

use eframe::egui;
use egui_plot::{Legend, Line, Plot, PlotPoints, Points};

use crate::metrics::{Point, smooth};

/// MiB, for display.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// A two-column table of names and values.
pub fn facts(ui: &mut egui::Ui, id: &str, rows: &[(&str, String)]) {
    egui::Grid::new(id).num_columns(2).striped(true).show(ui, |ui| {
        for (k, v) in rows {
            ui.label(*k);
            ui.label(v);
            ui.end_row();
        }
    });
}

/// The loss curve of `points` (raw in grey, smoothed by `smoothing`, evaluation losses as dots) with the smoothed
/// curves of `others` (earlier runs by name) beside it; returns the plot's response (its rect is what a PNG
/// export crops).
pub fn loss_plot(ui: &mut egui::Ui, points: &[Point], smoothing: f64, others: &[(String, &[Point])]) -> egui::Response {
    let losses =
        |points: &[Point]| -> Vec<[f64; 2]> { points.iter().filter_map(|p| Some([p.step as f64, p.loss?])).collect() };
    let loss = losses(points);
    let eval: Vec<[f64; 2]> = points
        .iter()
        .filter_map(|p| Some([p.step as f64, p.eval_loss?]))
        .collect();
    let smoothed = smooth(&loss, smoothing);
    Plot::new("loss_plot")
        .height(260.0)
        .legend(Legend::default())
        .x_axis_label("step")
        .y_axis_label("loss")
        .show(ui, |plot| {
            plot.line(Line::new("loss (raw)", PlotPoints::from(loss)).color(egui::Color32::from_gray(120)));
            plot.line(Line::new("loss", PlotPoints::from(smoothed)));
            plot.points(Points::new("eval loss", PlotPoints::from(eval)).radius(4.0));
            for (name, run) in others {
                plot.line(Line::new(
                    name.as_str(),
                    PlotPoints::from(smooth(&losses(run), smoothing)),
                ));
            }
        })
        .response
}

/// The errors not yet dismissed, newest last, each with a button that dismisses it.
pub fn error_list(ui: &mut egui::Ui, errors: &mut Vec<String>) {
    let mut dismissed = None;
    for (i, e) in errors.iter().enumerate() {
        ui.horizontal_wrapped(|ui| {
            if ui.small_button("dismiss").clicked() {
                dismissed = Some(i);
            }
            ui.colored_label(egui::Color32::LIGHT_RED, format!("error: {e}"));
        });
    }
    if let Some(i) = dismissed {
        errors.remove(i);
    }
}
