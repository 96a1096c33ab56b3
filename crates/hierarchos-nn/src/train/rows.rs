//! Data files as token sequences, the way Hugging Face users expect: text is tokenized one document at a time
//! with the tokenizer's special tokens (as `datasets.map(tokenize)` does), concatenated and cut into
//! `seq_len`-token chunks with the remainder dropped (transformers' `run_clm` `group_texts`). Rows of `input_ids`
//! are taken as they are, one sequence each. `files.rs` finds and reads the files natively; here is what the web,
//! which has no file system, shares with it: the rows of `.txt` and `.jsonl` text, and files held in memory.

use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;
use crate::train::data::TokenData;

impl TokenData {
    /// The sequences of a `.txt` or `.jsonl` file held in memory (on the web: the embedded corpus, or a file the
    /// user picked), read as [`TokenData::load`](crate::train::data::TokenData) reads files from disk; `name` gives
    /// its kind and labels errors.
    pub fn from_memory(name: &Path, bytes: &[u8], tokenizer: Option<&Tokenizer>, seq_len: usize) -> Result<TokenData> {
        let mut rows = Rows::new(tokenizer, seq_len)?;
        let text = utf8_text(name, bytes.to_vec())?;
        match extension(name).as_deref() {
            Some("txt") => read_txt(name, &text, &mut rows)?,
            Some("jsonl") => read_jsonl(name, &text, &mut rows)?,
            _ => {
                return Err(Error::Invalid(format!(
                    "{}: not a data file held in memory; supported: .txt, .jsonl",
                    name.display()
                )));
            }
        }
        rows.finish(&name.display().to_string(), vec![name.to_path_buf()])
    }
}

/// The lower-cased extension of `path`, if any.
pub(super) fn extension(path: &Path) -> Option<String> {
    path.extension().map(|e| e.to_string_lossy().to_ascii_lowercase())
}

/// Where in a file a row is: a 1-based line of a text or JSON lines file, or a 0-based row of a parquet file
/// (as `dataset[i]` counts).
#[derive(Clone, Copy, Debug)]
pub(super) enum Place {
    Line(usize),
    // Parquet files are read natively only.
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    Row(usize),
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Line(n) => write!(f, "line {n}"),
            Place::Row(n) => write!(f, "row {n}"),
        }
    }
}

/// A data error naming the file and the row at fault.
pub(super) fn bad(path: &Path, place: Place, what: impl fmt::Display) -> Error {
    Error::Invalid(format!("{}: {place}: {what}", path.display()))
}

/// The rows of all files, checked to be of one kind: tokenized text concatenated for packing, or `input_ids`
/// rows.
pub(super) struct Rows<'a> {
    tokenizer: Option<&'a Tokenizer>,
    seq_len: usize,
    /// The first row's kind (true for `input_ids`) and where it was, for the error when a later row differs.
    kind: Option<(bool, String)>,
    tokens: Vec<u32>,
    sequences: Vec<Vec<u32>>,
}

impl<'a> Rows<'a> {
    pub(super) fn new(tokenizer: Option<&'a Tokenizer>, seq_len: usize) -> Result<Rows<'a>> {
        if seq_len < 2 {
            return Err(Error::Invalid(format!(
                "seq_len {seq_len}: a causal LM needs sequences of at least 2 tokens"
            )));
        }
        Ok(Rows {
            tokenizer,
            seq_len,
            kind: None,
            tokens: Vec::new(),
            sequences: Vec::new(),
        })
    }

    /// The sequences of all rows read from `files` (which `source` names): packed text cut into `seq_len`
    /// chunks, or the `input_ids` rows.
    pub(super) fn finish(mut self, source: &str, files: Vec<PathBuf>) -> Result<TokenData> {
        let packed = match self.kind {
            None => return Err(Error::Invalid(format!("{source}: no rows"))),
            Some((ids, _)) => !ids,
        };
        if packed {
            if self.tokens.len() < self.seq_len {
                return Err(Error::Invalid(format!(
                    "{source}: {} tokens, fewer than seq_len {}",
                    self.tokens.len(),
                    self.seq_len
                )));
            }
            self.sequences = self.tokens.chunks_exact(self.seq_len).map(<[u32]>::to_vec).collect();
        }
        Ok(TokenData {
            sequences: self.sequences,
            packed,
            files,
        })
    }

    fn check_kind(&mut self, ids: bool, path: &Path, place: Place) -> Result<()> {
        match &self.kind {
            None => self.kind = Some((ids, format!("{}: {place}", path.display()))),
            Some((first, at)) if *first != ids => {
                let (this, other) = if ids {
                    ("input_ids", "text")
                } else {
                    ("text", "input_ids")
                };
                return Err(bad(
                    path,
                    place,
                    format!("a `{this}` row, but {at} has `{other}` (all rows must be one kind)"),
                ));
            }
            Some(_) => {}
        }
        Ok(())
    }

    pub(super) fn text(&mut self, text: &str, path: &Path, place: Place) -> Result<()> {
        self.check_kind(false, path, place)?;
        let Some(tokenizer) = self.tokenizer else {
            return Err(bad(path, place, "text rows need a tokenizer, and none was given"));
        };
        let ids = tokenizer.encode(text, true).map_err(|e| bad(path, place, e))?;
        self.tokens.extend(ids);
        Ok(())
    }

    pub(super) fn ids(&mut self, ids: Vec<u32>, path: &Path, place: Place) -> Result<()> {
        self.check_kind(true, path, place)?;
        if ids.len() < 2 {
            return Err(bad(
                path,
                place,
                format!(
                    "`input_ids` has length {}; a causal LM needs at least 2 ids (nothing to predict otherwise)",
                    ids.len()
                ),
            ));
        }
        if ids.len() > self.seq_len {
            return Err(bad(
                path,
                place,
                format!(
                    "`input_ids` has length {}, more than seq_len {}",
                    ids.len(),
                    self.seq_len
                ),
            ));
        }
        self.sequences.push(ids);
        Ok(())
    }
}

/// The bytes of file `path` as text; invalid bytes are reported at their line.
pub(super) fn utf8_text(path: &Path, bytes: Vec<u8>) -> Result<String> {
    String::from_utf8(bytes).map_err(|e| {
        let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        let line = valid.iter().filter(|&&b| b == b'\n').count() + 1;
        bad(path, Place::Line(line), "not valid UTF-8")
    })
}

/// Each line, its line break included, is one document (blank lines too), as transformers' `run_clm` reads text
/// files (`keep_linebreaks`): with a tokenizer that adds no special tokens the stream is the file itself.
pub(super) fn read_txt(path: &Path, text: &str, rows: &mut Rows) -> Result<()> {
    for (i, line) in text.split_inclusive('\n').enumerate() {
        rows.text(line, path, Place::Line(i + 1))?;
    }
    Ok(())
}

/// Each non-blank line is a JSON object with `input_ids` (used as is) or a `text` string.
pub(super) fn read_jsonl(path: &Path, text: &str, rows: &mut Rows) -> Result<()> {
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let place = Place::Line(i + 1);
        let value: Value = serde_json::from_str(line).map_err(|e| bad(path, place, format!("not valid JSON: {e}")))?;
        let Some(object) = value.as_object() else {
            return Err(bad(path, place, "not a JSON object"));
        };
        if let Some(ids) = object.get("input_ids") {
            let Some(ids) = ids.as_array() else {
                return Err(bad(path, place, "`input_ids` is not an array"));
            };
            let ids = ids
                .iter()
                .enumerate()
                .map(|(k, v)| token_id(v.as_i64(), || v.to_string()).map_err(|e| bad(path, place, at_index(k, e))))
                .collect::<Result<Vec<u32>>>()?;
            rows.ids(ids, path, place)?;
        } else if let Some(text) = object.get("text") {
            let Some(text) = text.as_str() else {
                return Err(bad(path, place, "`text` is not a string"));
            };
            rows.text(text, path, place)?;
        } else {
            return Err(bad(path, place, "no `text` or `input_ids` field"));
        }
    }
    Ok(())
}

/// The message of a bad id at index `k` of `input_ids`.
pub(super) fn at_index(k: usize, what: String) -> String {
    format!("`input_ids`[{k}] is {what}")
}

/// A token id from an integer, when it fits the i32 labels of the loss; `shown` renders the value for the error.
pub(super) fn token_id(value: Option<i64>, shown: impl Fn() -> String) -> std::result::Result<u32, String> {
    value
        .and_then(|v| i32::try_from(v).ok())
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| format!("{}, not a token id (an integer in 0..={})", shown(), i32::MAX))
}
