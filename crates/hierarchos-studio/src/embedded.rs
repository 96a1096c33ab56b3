//! The embedded default: the small Llama-shaped model folder (config and tokenizer, no weights) and the Shakespeare
//! corpus from `assets/`, compiled into the app so that a first run can train and chat without any download.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The files of `assets/tiny-llama/` by name.
pub const MODEL_FILES: [(&str, &str); 3] = [
    ("config.json", include_str!("../../../assets/tiny-llama/config.json")),
    (
        "tokenizer.json",
        include_str!("../../../assets/tiny-llama/tokenizer.json"),
    ),
    (
        "tokenizer_config.json",
        include_str!("../../../assets/tiny-llama/tokenizer_config.json"),
    ),
];
/// The folder name of the embedded model.
pub const MODEL_NAME: &str = "tiny-llama";
/// The file name of the embedded corpus.
pub const CORPUS_NAME: &str = "tinyshakespeare.txt";
/// `assets/tinyshakespeare.txt` (public domain).
pub const CORPUS: &str = include_str!("../../../assets/tinyshakespeare.txt");

/// Where the embedded files were written.
#[derive(Clone, Debug)]
pub struct Embedded {
    /// The model folder.
    pub model: PathBuf,
    /// The corpus file.
    pub corpus: PathBuf,
}

impl Embedded {
    /// Writes the embedded files under `root` (unchanged files are left alone) and returns their paths.
    pub fn write(root: &Path) -> Result<Embedded> {
        let model = root.join(MODEL_NAME);
        std::fs::create_dir_all(&model).with_context(|| format!("creating {}", model.display()))?;
        for (name, text) in MODEL_FILES {
            write_if_changed(&model.join(name), text)?;
        }
        let corpus = root.join(CORPUS_NAME);
        write_if_changed(&corpus, CORPUS)?;
        Ok(Embedded { model, corpus })
    }
}

fn write_if_changed(path: &Path, text: &str) -> Result<()> {
    if std::fs::read_to_string(path).ok().as_deref() != Some(text) {
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
