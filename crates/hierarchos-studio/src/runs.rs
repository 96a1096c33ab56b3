//! Training runs kept on disk: each run folder holds `studio_metrics.jsonl` (one [`Point`] per step) next to its
//! checkpoints, so that runs can be reopened, plotted side by side and exported as CSV.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::metrics::Point;
use crate::worker::TrainSettings;

/// The metrics file of a run folder.
pub const METRICS_FILE: &str = "studio_metrics.jsonl";
/// The run's [`TrainSettings`].
const SETTINGS_FILE: &str = "studio_run.json";

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
