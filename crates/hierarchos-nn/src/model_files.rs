//! The small files of a model folder (`config.json`, the tokenizer files, the generation config) held in memory:
//! checkpoints copy them from the folder a run started from, and the web demo, which has no file system, builds
//! models and tokenizers from them.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The model files besides `config.json` that travel with a model, when the folder has them.
pub const COPIED_FILES: [&str; 9] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
];

/// The text of `config.json` and the other small files of a model folder.
#[derive(Clone, Debug)]
pub struct ModelFiles {
    /// `config.json` as read.
    pub config_json: String,
    /// Other files by name (tokenizer, generation config, chat template).
    pub files: Vec<(String, Vec<u8>)>,
}

impl ModelFiles {
    /// `config.json` and whichever of [`COPIED_FILES`] `dir` holds.
    pub fn read(dir: &Path) -> Result<ModelFiles> {
        let read = |path: PathBuf| std::fs::read(&path).map_err(|source| Error::Io { path, source });
        let config_json = config_text(dir, read(dir.join("config.json"))?)?;
        let mut files = Vec::new();
        for name in COPIED_FILES {
            let path = dir.join(name);
            if path.is_file() {
                files.push((name.to_string(), read(path)?));
            }
        }
        Ok(ModelFiles { config_json, files })
    }

    /// The files given by name (a folder fetched or picked in a browser); `config.json` is required, names that
    /// are not model files are left out, and `dir` labels the folder in errors.
    pub fn from_named(dir: &Path, named: Vec<(String, Vec<u8>)>) -> Result<ModelFiles> {
        let mut config = None;
        let mut files = Vec::new();
        for (name, bytes) in named {
            if name == "config.json" {
                config = Some(bytes);
            } else if COPIED_FILES.contains(&name.as_str()) {
                files.push((name, bytes));
            }
        }
        let config = config.ok_or_else(|| Error::Config {
            path: dir.join("config.json"),
            message: "missing: a model folder needs its config.json".into(),
        })?;
        Ok(ModelFiles {
            config_json: config_text(dir, config)?,
            files,
        })
    }

    /// The bytes of file `name`, if the folder has it.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.files.iter().find(|(n, _)| n == name).map(|(_, b)| b.as_slice())
    }
}

fn config_text(dir: &Path, bytes: Vec<u8>) -> Result<String> {
    String::from_utf8(bytes).map_err(|_| Error::Config {
        path: dir.join("config.json"),
        message: "not UTF-8".into(),
    })
}

/// Where the small files of a model folder are read from: the disk, or a [`ModelFiles`] in memory (labelled by
/// the folder it stands for, which errors name).
#[derive(Clone, Copy)]
pub(crate) enum Folder<'a> {
    /// The folder on disk.
    Disk(&'a Path),
    /// Files held in memory.
    Memory(&'a Path, &'a ModelFiles),
}

impl Folder<'_> {
    /// The path of file `name` (for messages).
    pub fn path(&self, name: &str) -> PathBuf {
        match self {
            Folder::Disk(dir) | Folder::Memory(dir, _) => dir.join(name),
        }
    }

    /// The bytes of file `name`, `None` when the folder lacks it.
    pub fn bytes(&self, name: &str) -> Result<Option<Vec<u8>>> {
        match self {
            Folder::Disk(dir) => {
                let path = dir.join(name);
                match std::fs::read(&path) {
                    Ok(bytes) => Ok(Some(bytes)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(source) => Err(Error::Io { path, source }),
                }
            }
            Folder::Memory(_, files) => Ok(files.get(name).map(<[u8]>::to_vec)),
        }
    }

    /// The text of file `name`, `None` when the folder lacks it.
    pub fn text(&self, name: &str) -> Result<Option<String>> {
        self.bytes(name)?
            .map(|bytes| {
                String::from_utf8(bytes).map_err(|_| Error::Config {
                    path: self.path(name),
                    message: "not UTF-8".into(),
                })
            })
            .transpose()
    }
}
