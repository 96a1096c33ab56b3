//! Training data read the way Hugging Face users expect: a `--data` argument (a `.txt`, `.jsonl` or `.parquet`
//! file, a folder of them, or a Hub dataset id) becomes token sequences.
//!
//! Text is tokenized one document at a time with the tokenizer's special tokens (as `datasets.map(tokenize)`
//! does), concatenated and cut into `seq_len`-token chunks with the remainder dropped (transformers' `run_clm`
//! `group_texts`). Rows of `input_ids` are taken as they are, one sequence each.

use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hf_hub::{Cache, Repo, RepoType};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;
use parquet::schema::types::Type;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::hub::{HubOptions, api, cached_snapshot_dir, check_revision, is_repo_id};
use crate::tokenizer::Tokenizer;
use crate::train::data::TokenData;

/// The data file kinds, by lower-cased extension.
const EXTENSIONS: [&str; 3] = ["parquet", "jsonl", "txt"];

impl TokenData {
    /// Reads `source`: a `.txt` file (each line with its line break a document), a `.jsonl` file (each line an object with
    /// a `text` string or an `input_ids` array), a `.parquet` file (a `text` or `input_ids` column), a folder
    /// (its files of those kinds in name order), or a Hub dataset id `owner/name[@revision]` (its train split,
    /// fetched into the cache with the options of the environment). `tokenizer` is needed for text.
    pub fn load(source: &str, tokenizer: Option<&Tokenizer>, seq_len: usize) -> Result<TokenData> {
        let files = match local_files(source)? {
            Some(files) => files,
            None => hub_files(source, &HubOptions::from_env()?)?,
        };
        read_files(source, files, tokenizer, seq_len)
    }

    /// [`TokenData::load`] with explicit Hub options instead of the environment's.
    pub fn load_with(
        source: &str,
        tokenizer: Option<&Tokenizer>,
        seq_len: usize,
        options: &HubOptions,
    ) -> Result<TokenData> {
        let files = match local_files(source)? {
            Some(files) => files,
            None => hub_files(source, options)?,
        };
        read_files(source, files, tokenizer, seq_len)
    }
}

/// The files of an existing path (`None` when nothing is there, so it may be a Hub id).
fn local_files(source: &str) -> Result<Option<Vec<PathBuf>>> {
    let path = Path::new(source);
    if path.is_file() {
        return Ok(Some(vec![path.to_path_buf()]));
    }
    if !path.is_dir() {
        return Ok(None);
    }
    let entries = std::fs::read_dir(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let file = entry.path();
        if file.is_file() && extension(&file).is_some_and(|e| EXTENSIONS.contains(&e.as_str())) {
            files.push(file);
        }
    }
    if files.is_empty() {
        return Err(Error::Invalid(format!(
            "{}: a folder without data files (.parquet, .jsonl or .txt)",
            path.display()
        )));
    }
    files.sort();
    Ok(Some(files))
}

/// The lower-cased extension of `path`, if any.
fn extension(path: &Path) -> Option<String> {
    path.extension().map(|e| e.to_string_lossy().to_ascii_lowercase())
}

/// The cached files of the train split of the Hub dataset `source` (`owner/name`, optionally `@revision`),
/// fetching what the cache lacks unless offline.
fn hub_files(source: &str, options: &HubOptions) -> Result<Vec<PathBuf>> {
    let (repo_id, revision) = source.split_once('@').unwrap_or((source, "main"));
    if !repo_id.contains('/') || !is_repo_id(repo_id) {
        return Err(Error::Invalid(format!(
            "{source}: no such file or folder, and not a Hub dataset id (owner/name or owner/name@revision)"
        )));
    }
    check_revision(revision)?;
    let repo_dir = options.cache_dir.join(Repo::dataset(repo_id.to_string()).folder_name());
    if options.offline {
        let not_cached = || {
            Error::Hub(format!(
                "HF_HUB_OFFLINE is set and dataset {repo_id} (revision {revision}) is not in the cache {}; run \
                 once online or unset HF_HUB_OFFLINE",
                options.cache_dir.display()
            ))
        };
        let snapshot = cached_snapshot_dir(&repo_dir, revision).ok_or_else(not_cached)?;
        let mut names = Vec::new();
        list_files(&snapshot, "", &mut names)?;
        let files = split_files(&names);
        if files.is_empty() {
            return Err(not_cached());
        }
        return Ok(files.iter().map(|f| snapshot.join(f)).collect());
    }
    let hub = |what: String| Error::Hub(format!("dataset {repo_id} (revision {revision}): {what}"));
    let api = api(options).map_err(|e| hub(format!("cannot start the HTTP client: {e}")))?;
    let repo = |rev: &str| Repo::with_revision(repo_id.to_string(), RepoType::Dataset, rev.to_string());
    let info = api.repo(repo(revision)).info().map_err(|e| {
        hub(format!(
            "cannot read the repository from {}: {e} (check the id and revision; private or gated repositories \
             need HF_TOKEN)",
            options.endpoint
        ))
    })?;
    let names: Vec<String> = info.siblings.into_iter().map(|s| s.rfilename).collect();
    let files = split_files(&names);
    if files.is_empty() {
        return Err(hub("the repository has no .parquet, .jsonl or .txt files".into()));
    }
    // Every file at the commit the revision resolved to, so a branch that moves meanwhile cannot mix commits.
    let commit = info.sha;
    let pinned = api.repo(repo(&commit));
    let snapshot = repo_dir.join("snapshots").join(&commit);
    let mut paths = Vec::new();
    for file in files {
        let path = snapshot.join(&file);
        if !path.is_file() {
            let got = pinned
                .download(&file)
                .map_err(|e| hub(format!("downloading {file}: {e}")))?;
            if got != path {
                return Err(hub(format!(
                    "{file} arrived as {} instead of at commit {commit}",
                    got.display()
                )));
            }
        }
        paths.push(path);
    }
    Cache::new(options.cache_dir.clone())
        .repo(repo(revision))
        .create_ref(&commit)
        .map_err(|e| hub(format!("writing the cache ref for {revision}: {e}")))?;
    Ok(paths)
}

/// Appends the files under `dir` to `out` as `/`-separated paths after `prefix`.
fn list_files(dir: &Path, prefix: &str, out: &mut Vec<String>) -> Result<()> {
    let io = |source| Error::Io {
        path: dir.to_path_buf(),
        source,
    };
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if path.is_dir() {
            list_files(&path, &format!("{prefix}{name}/"), out)?;
        } else if path.is_file() {
            out.push(format!("{prefix}{name}"));
        }
    }
    Ok(())
}

/// The data files of a repository's train split, sorted: those in a `train` or `training` folder or whose file
/// name has the word `train`/`training` (set off by `-`, `_`, `.`, a space or a digit, as `datasets` matches
/// split names), or every data file when none is.
fn split_files(names: &[String]) -> Vec<String> {
    let data: Vec<&String> = names
        .iter()
        .filter(|n| extension(Path::new(n.as_str())).is_some_and(|e| EXTENSIONS.contains(&e.as_str())))
        .collect();
    let train: Vec<&String> = data.iter().copied().filter(|n| is_train(n)).collect();
    let mut files: Vec<String> = if train.is_empty() { data } else { train }
        .into_iter()
        .cloned()
        .collect();
    files.sort();
    files
}

/// Whether a repository path belongs to the train split by its folder or file name.
fn is_train(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    let (dirs, name) = lower.rsplit_once('/').unwrap_or(("", &lower));
    let sep = |c: char| "-_. ".contains(c) || c.is_ascii_digit();
    let has_word = |word: &str| {
        name.match_indices(word).any(|(i, _)| {
            name[..i].chars().next_back().is_none_or(sep) && name[i + word.len()..].chars().next().is_none_or(sep)
        })
    };
    dirs.split('/').any(|d| d == "train" || d == "training") || has_word("train") || has_word("training")
}

/// Where in a file a row is: a 1-based line of a text or JSON lines file, or a 0-based row of a parquet file
/// (as `dataset[i]` counts).
#[derive(Clone, Copy, Debug)]
enum Place {
    Line(usize),
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
fn bad(path: &Path, place: Place, what: impl fmt::Display) -> Error {
    Error::Invalid(format!("{}: {place}: {what}", path.display()))
}

/// The rows of all files, checked to be of one kind: tokenized text concatenated for packing, or `input_ids`
/// rows.
struct Rows<'a> {
    tokenizer: Option<&'a Tokenizer>,
    seq_len: usize,
    /// The first row's kind (true for `input_ids`) and where it was, for the error when a later row differs.
    kind: Option<(bool, String)>,
    tokens: Vec<u32>,
    sequences: Vec<Vec<u32>>,
}

impl Rows<'_> {
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

    fn text(&mut self, text: &str, path: &Path, place: Place) -> Result<()> {
        self.check_kind(false, path, place)?;
        let Some(tokenizer) = self.tokenizer else {
            return Err(bad(path, place, "text rows need a tokenizer, and none was given"));
        };
        let ids = tokenizer.encode(text, true).map_err(|e| bad(path, place, e))?;
        self.tokens.extend(ids);
        Ok(())
    }

    fn ids(&mut self, ids: Vec<u32>, path: &Path, place: Place) -> Result<()> {
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

/// Reads `files` (the files `source` names) into sequences.
fn read_files(source: &str, files: Vec<PathBuf>, tokenizer: Option<&Tokenizer>, seq_len: usize) -> Result<TokenData> {
    if seq_len < 2 {
        return Err(Error::Invalid(format!(
            "seq_len {seq_len}: a causal LM needs sequences of at least 2 tokens"
        )));
    }
    let mut rows = Rows {
        tokenizer,
        seq_len,
        kind: None,
        tokens: Vec::new(),
        sequences: Vec::new(),
    };
    for file in &files {
        match extension(file).as_deref() {
            Some("txt") => read_txt(file, &mut rows)?,
            Some("jsonl") => read_jsonl(file, &mut rows)?,
            Some("parquet") => read_parquet(file, &mut rows)?,
            other => {
                let found = other.map_or("no extension".to_string(), |e| format!("extension .{e}"));
                return Err(Error::Invalid(format!(
                    "{}: {found} is not a data file; supported: .parquet, .jsonl, .txt (or a folder of them, or \
                     a Hub dataset id)",
                    file.display()
                )));
            }
        }
    }
    let packed = match rows.kind {
        None => return Err(Error::Invalid(format!("{source}: no rows"))),
        Some((ids, _)) => !ids,
    };
    if packed {
        if rows.tokens.len() < seq_len {
            return Err(Error::Invalid(format!(
                "{source}: {} tokens, fewer than seq_len {seq_len}",
                rows.tokens.len()
            )));
        }
        rows.sequences = rows.tokens.chunks_exact(seq_len).map(<[u32]>::to_vec).collect();
    }
    Ok(TokenData {
        sequences: rows.sequences,
        packed,
        files,
    })
}

/// The UTF-8 text of a file; invalid bytes are reported at their line.
fn read_text_file(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    String::from_utf8(bytes).map_err(|e| {
        let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        let line = valid.iter().filter(|&&b| b == b'\n').count() + 1;
        bad(path, Place::Line(line), "not valid UTF-8")
    })
}

/// Each line, its line break included, is one document (blank lines too), as transformers' `run_clm` reads text
/// files (`keep_linebreaks`): with a tokenizer that adds no special tokens the stream is the file itself.
fn read_txt(path: &Path, rows: &mut Rows) -> Result<()> {
    for (i, line) in read_text_file(path)?.split_inclusive('\n').enumerate() {
        rows.text(line, path, Place::Line(i + 1))?;
    }
    Ok(())
}

/// Each non-blank line is a JSON object with `input_ids` (used as is) or a `text` string.
fn read_jsonl(path: &Path, rows: &mut Rows) -> Result<()> {
    for (i, line) in read_text_file(path)?.lines().enumerate() {
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
fn at_index(k: usize, what: String) -> String {
    format!("`input_ids`[{k}] is {what}")
}

/// A token id from an integer, when it fits the i32 labels of the loss; `shown` renders the value for the error.
fn token_id(value: Option<i64>, shown: impl Fn() -> String) -> std::result::Result<u32, String> {
    value
        .and_then(|v| i32::try_from(v).ok())
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| format!("{}, not a token id (an integer in 0..={})", shown(), i32::MAX))
}

/// A `text` string column or an `input_ids` list-of-integers column, read row by row (only that column is
/// decoded).
fn read_parquet(path: &Path, rows: &mut Rows) -> Result<()> {
    let file = File::open(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let invalid = |what: String| Error::Invalid(format!("{}: {what}", path.display()));
    let reader = SerializedFileReader::new(file).map_err(|e| invalid(format!("not a readable parquet file: {e}")))?;
    let fields = reader.metadata().file_metadata().schema().get_fields();
    let column = ["input_ids", "text"]
        .into_iter()
        .find_map(|name| fields.iter().find(|f| f.name() == name))
        .ok_or_else(|| {
            let names: Vec<&str> = fields.iter().map(|f| f.name()).collect();
            invalid(format!(
                "no `text` or `input_ids` column (columns: {})",
                names.join(", ")
            ))
        })?;
    let name = column.name().to_string();
    let projection = Type::group_type_builder("schema")
        .with_fields(vec![Arc::clone(column)])
        .build()
        .map_err(|e| invalid(format!("column `{name}`: {e}")))?;
    let iter = reader
        .get_row_iter(Some(projection))
        .map_err(|e| invalid(format!("column `{name}`: {e}")))?;
    for (i, row) in iter.enumerate() {
        let place = Place::Row(i);
        let row = row.map_err(|e| bad(path, place, e))?;
        let Some((_, value)) = row.into_columns().into_iter().next() else {
            return Err(bad(path, place, format!("no `{name}` value")));
        };
        match (name.as_str(), value) {
            ("text", Field::Str(text)) => rows.text(&text, path, place)?,
            ("input_ids", Field::ListInternal(list)) => {
                let ids = list
                    .elements()
                    .iter()
                    .enumerate()
                    .map(|(k, v)| token_id(integer(v), || v.to_string()).map_err(|e| bad(path, place, at_index(k, e))))
                    .collect::<Result<Vec<u32>>>()?;
                rows.ids(ids, path, place)?;
            }
            ("text", other) => return Err(bad(path, place, format!("`text` is {other}, not a string"))),
            (_, other) => {
                return Err(bad(
                    path,
                    place,
                    format!("`input_ids` is {other}, not a list of integers"),
                ));
            }
        }
    }
    Ok(())
}

/// The value of an integer parquet field (`None` for anything else, nulls included).
fn integer(field: &Field) -> Option<i64> {
    match *field {
        Field::Byte(v) => Some(v.into()),
        Field::Short(v) => Some(v.into()),
        Field::Int(v) => Some(v.into()),
        Field::Long(v) => Some(v),
        Field::UByte(v) => Some(v.into()),
        Field::UShort(v) => Some(v.into()),
        Field::UInt(v) => Some(v.into()),
        Field::ULong(v) => i64::try_from(v).ok(),
        _ => None,
    }
}
