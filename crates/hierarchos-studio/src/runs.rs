//! Training runs kept on disk: each run folder holds `studio_metrics.jsonl` (one [`Point`] per step) next to its
//! checkpoints, so that runs can be reopened, plotted side by side and exported as CSV.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::worker::TrainSettings;

/// The metrics file of a run folder.
pub const METRICS_FILE: &str = "studio_metrics.jsonl";
/// The run's [`TrainSettings`].
const SETTINGS_FILE: &str = "studio_run.json";

/// What one training step measured (and the evaluation loss when it evaluated).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// Steps completed.
    pub step: usize,
    /// Training loss of the step.
    pub loss: Option<f64>,
    /// Held-out loss, on the steps that evaluated.
    pub eval_loss: Option<f64>,
    /// Learning rate the step ran at.
    pub lr: f64,
    /// Training throughput of the step.
    pub tokens_per_sec: f64,
    /// GPU memory held by tensors after the step.
    pub memory_mib: f64,
}

/// Appends a run's points to its metrics file as they come.
pub struct MetricsLog {
    file: std::fs::File,
}

impl MetricsLog {
    /// Writes the run's settings into `dir` (what resuming it reads back).
    pub fn write_settings(dir: &Path, settings: &TrainSettings) -> Result<()> {
        let path = dir.join(SETTINGS_FILE);
        std::fs::write(&path, serde_json::to_string_pretty(settings)?)
            .with_context(|| format!("writing {}", path.display()))
    }

    /// The settings the run in `dir` was started with.
    pub fn read_settings(dir: &Path) -> Result<TrainSettings> {
        let path = dir.join(SETTINGS_FILE);
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{}: not the settings of a Studio run", path.display()))
    }

    /// Opens the metrics file of the run in `dir` for appending (a resumed run continues it).
    pub fn open(dir: &Path) -> Result<MetricsLog> {
        let path = dir.join(METRICS_FILE);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        Ok(MetricsLog { file })
    }

    /// Writes one point.
    pub fn append(&mut self, point: &Point) -> Result<()> {
        writeln!(self.file, "{}", serde_json::to_string(point)?)?;
        Ok(())
    }
}

/// A run found on disk.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    /// Its folder.
    pub dir: PathBuf,
    /// What it trained, from its summary file.
    pub description: String,
    /// Its points, in step order.
    pub points: Vec<Point>,
}

impl Run {
    /// The run in `dir`, if it is one (has a metrics file); lines that do not parse are skipped.
    pub fn open(dir: &Path) -> Option<Run> {
        let text = std::fs::read_to_string(dir.join(METRICS_FILE)).ok()?;
        let points: Vec<Point> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
        // A resumed run appends the steps after its checkpoint again: the newest value of a step wins.
        let mut by_step = std::collections::BTreeMap::new();
        for p in points {
            let p: Point = p;
            by_step.insert(p.step, p);
        }
        let points = by_step.into_values().collect();
        let description = match MetricsLog::read_settings(dir) {
            Ok(s) => format!(
                "{}, {} steps, lr {}",
                match &s.lora {
                    Some(l) => format!("LoRA r={} alpha={} ({})", l.r, l.alpha, l.targets),
                    None => "full".into(),
                },
                s.steps,
                s.lr
            ),
            Err(_) => String::new(),
        };
        Some(Run {
            dir: dir.to_path_buf(),
            description,
            points,
        })
    }

    /// The runs under `root`, newest folder name last.
    pub fn list(root: &Path) -> Vec<Run> {
        let mut runs: Vec<Run> = std::fs::read_dir(root)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| Run::open(&e.path()))
            .collect();
        runs.sort_by(|a, b| a.dir.cmp(&b.dir));
        runs
    }

    /// The run's name (its folder's).
    pub fn name(&self) -> String {
        self.dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

/// The points as CSV: `step,loss,eval_loss,lr,tokens_per_sec,memory_mib` (empty cells where a step has no value).
pub fn to_csv(points: &[Point]) -> String {
    let opt = |v: Option<f64>| v.map(|x| x.to_string()).unwrap_or_default();
    let mut s = String::from("step,loss,eval_loss,lr,tokens_per_sec,memory_mib\n");
    for p in points {
        s.push_str(&format!(
            "{},{},{},{},{},{}\n",
            p.step,
            opt(p.loss),
            opt(p.eval_loss),
            p.lr,
            p.tokens_per_sec,
            p.memory_mib
        ));
    }
    s
}

/// Exponential moving average of `values` with weight `smoothing` on the past (0: the values themselves), with
/// the bias correction TensorBoard applies so that the curve starts at the first value.
pub fn smooth(values: &[[f64; 2]], smoothing: f64) -> Vec<[f64; 2]> {
    let mut avg = 0.0;
    let mut weight = 0.0;
    values
        .iter()
        .map(|&[x, y]| {
            avg = smoothing * avg + (1.0 - smoothing) * y;
            weight = smoothing * weight + (1.0 - smoothing);
            [x, if weight > 0.0 { avg / weight } else { y }]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smoothing_starts_at_the_first_value_and_follows_a_constant() {
        let v = [[1.0, 4.0], [2.0, 4.0], [3.0, 4.0]];
        assert_eq!(smooth(&v, 0.9), v.to_vec());
        let v = [[1.0, 0.0], [2.0, 10.0]];
        let s = smooth(&v, 0.5);
        assert_eq!(s[0], [1.0, 0.0]);
        assert!((s[1][1] - 10.0 * 0.5 / 0.75).abs() < 1e-12);
        assert_eq!(smooth(&v, 0.0), v.to_vec());
    }

    #[test]
    fn csv_leaves_missing_values_empty() {
        let p = Point {
            step: 3,
            loss: Some(2.5),
            eval_loss: None,
            lr: 0.001,
            tokens_per_sec: 100.0,
            memory_mib: 1.5,
        };
        assert_eq!(
            to_csv(&[p]),
            "step,loss,eval_loss,lr,tokens_per_sec,memory_mib\n3,2.5,,0.001,100,1.5\n"
        );
    }
}
