//! Training data read the way Hugging Face users expect: a `--data` argument (a `.txt`, `.jsonl` or `.parquet`
//! file, a folder of them, or a Hub dataset id) becomes token sequences.
//!
//! Text is tokenized one document at a time with the tokenizer's special tokens (as `datasets.map(tokenize)`
//! does), concatenated and cut into `seq_len`-token chunks with the remainder dropped (transformers' `run_clm`
//! `group_texts`). Rows of `input_ids` are taken as they are, one sequence each.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hf_hub::{Cache, Repo, RepoType};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;
use parquet::schema::types::Type;

use crate::error::{Error, Result};
use crate::hub::{HubOptions, api, cached_snapshot_dir, check_revision, is_repo_id};
use crate::tokenizer::Tokenizer;
use crate::train::data::TokenData;
use crate::train::rows::{Place, Rows, at_index, bad, extension, read_jsonl, read_txt, token_id, utf8_text};

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

/// Reads `files` (the files `source` names) into sequences.
fn read_files(source: &str, files: Vec<PathBuf>, tokenizer: Option<&Tokenizer>, seq_len: usize) -> Result<TokenData> {
    let mut rows = Rows::new(tokenizer, seq_len)?;
    for file in &files {
        match extension(file).as_deref() {
            Some("txt") => read_txt(file, &read_text_file(file)?, &mut rows)?,
            Some("jsonl") => read_jsonl(file, &read_text_file(file)?, &mut rows)?,
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
    rows.finish(source, files)
}

/// The UTF-8 text of a file; invalid bytes are reported at their line.
fn read_text_file(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    utf8_text(path, bytes)
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
