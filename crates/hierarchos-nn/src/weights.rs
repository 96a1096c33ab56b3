//! Safetensors weights: one `model.safetensors` or shards listed by `model.safetensors.index.json`, memory-mapped
//! so that opening a model reads only the headers and each tensor is converted to f32 as it is loaded.

use std::cell::OnceCell;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use hierarchos_core::{Device, Tensor};
use safetensors::tensor::{Dtype, Metadata, SafeTensors, TensorInfo};
#[cfg(not(target_arch = "wasm32"))]
use serde_json::Value;

use crate::error::{Error, Result};

/// The single-file weights name.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The index of sharded weights.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// The bytes of one safetensors (or GGUF) file: a memory map where there are files, an owned buffer on the web.
pub(crate) enum Bytes {
    #[cfg(not(target_arch = "wasm32"))]
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            #[cfg(not(target_arch = "wasm32"))]
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// One parsed safetensors file; tensor offsets are relative to `data_start`.
struct Shard {
    path: PathBuf,
    bytes: Bytes,
    data_start: usize,
    metadata: Metadata,
}

impl Shard {
    fn parse(path: PathBuf, bytes: Bytes) -> Result<Shard> {
        let (header_len, metadata) = SafeTensors::read_metadata(bytes.as_slice()).map_err(|e| Error::Weights {
            path: path.clone(),
            message: format!("not a valid safetensors file: {}", describe(&e)),
        })?;
        Ok(Shard {
            path,
            bytes,
            data_start: 8 + header_len,
            metadata,
        })
    }

    fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.metadata.info(name)
    }
}

/// Says what a safetensors parse error means in the words of the file format.
fn describe(e: &safetensors::SafeTensorError) -> String {
    use safetensors::SafeTensorError as E;
    match e {
        E::HeaderTooSmall => "file shorter than the 8-byte header length".into(),
        E::HeaderTooLarge | E::InvalidHeaderLength => "header length past the end of the file".into(),
        E::InvalidHeader(_) => "header is not UTF-8".into(),
        E::InvalidHeaderDeserialization(err) => format!("header is not valid JSON: {err}"),
        E::MetadataIncompleteBuffer => "tensor data does not fill the file exactly (offsets past the end?)".into(),
        E::InvalidOffset(name) => format!("tensor '{name}' has invalid data offsets"),
        E::TensorInvalidInfo => "a tensor's shape and dtype do not match its byte size".into(),
        other => other.to_string(),
    }
}

/// The weights of one model, opened lazily: tensor bytes are read when loaded.
pub struct Weights {
    /// The index file or the single file: what a missing tensor is reported against.
    source: PathBuf,
    shards: Vec<Shard>,
    /// Tensor name -> index into `shards`.
    index: HashMap<String, usize>,
    /// The first module of every tensor name (`model`, `lm_head`), built on first use by [`Weights::stored_name`].
    top_modules: OnceCell<HashSet<String>>,
}

impl std::fmt::Debug for Weights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Weights")
            .field("source", &self.source)
            .field("tensors", &self.index.len())
            .finish()
    }
}

impl Weights {
    /// Opens the weights in a model folder: `model.safetensors.index.json` with its shards if present, else
    /// `model.safetensors`.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open(dir: &Path) -> Result<Weights> {
        let index_path = dir.join(INDEX_FILE);
        if index_path.is_file() {
            return Weights::open_sharded(dir, &index_path);
        }
        let single = dir.join(SINGLE_FILE);
        if !single.is_file() {
            return Err(Error::Weights {
                path: dir.to_path_buf(),
                message: format!("neither {SINGLE_FILE} nor {INDEX_FILE} found"),
            });
        }
        Ok(Weights::from_single(Shard::parse(single.clone(), map_file(&single)?)?))
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn open_sharded(dir: &Path, index_path: &Path) -> Result<Weights> {
        let bad = |message: String| Error::Weights {
            path: index_path.to_path_buf(),
            message,
        };
        let text = std::fs::read_to_string(index_path).map_err(|source| Error::Io {
            path: index_path.to_path_buf(),
            source,
        })?;
        let value: Value = serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let Some(map) = value.get("weight_map").and_then(Value::as_object) else {
            return Err(bad("no `weight_map` object".into()));
        };
        let mut files: Vec<&str> = Vec::new();
        let mut wanted: Vec<(&str, usize)> = Vec::with_capacity(map.len());
        for (name, file) in map {
            let Some(file) = file.as_str() else {
                return Err(bad(format!("tensor '{name}': shard name {file} is not a string")));
            };
            if !is_plain_file_name(file) {
                return Err(bad(format!(
                    "tensor '{name}': shard '{file}' is not a file name in the model folder"
                )));
            }
            let i = match files.iter().position(|f| *f == file) {
                Some(i) => i,
                None => {
                    files.push(file);
                    files.len() - 1
                }
            };
            wanted.push((name, i));
        }
        let mut shards = Vec::with_capacity(files.len());
        for file in &files {
            let path = dir.join(file);
            if !path.is_file() {
                return Err(bad(format!("shard '{file}' named in the index is missing")));
            }
            shards.push(Shard::parse(path.clone(), map_file(&path)?)?);
        }
        for &(name, i) in &wanted {
            if shards[i].info(name).is_none() {
                return Err(Error::Weights {
                    path: shards[i].path.clone(),
                    message: format!("tensor '{name}' listed in {INDEX_FILE} is not in this shard"),
                });
            }
        }
        let index = wanted.into_iter().map(|(name, i)| (name.to_string(), i)).collect();
        Ok(Weights {
            source: index_path.to_path_buf(),
            shards,
            index,
            top_modules: OnceCell::new(),
        })
    }

    /// Removes a sharded model's index and the shards it names from `dir`, where a single `model.safetensors`
    /// was just written: [`Weights::open`] reads the index first, so a stale one would load the old weights.
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn remove_stale_shards(dir: &Path) -> Result<()> {
        let index_path = dir.join(INDEX_FILE);
        let Ok(text) = std::fs::read_to_string(&index_path) else {
            return Ok(());
        };
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let mut shards: Vec<&str> = value
            .get("weight_map")
            .and_then(Value::as_object)
            .into_iter()
            .flat_map(|map| map.values().filter_map(Value::as_str))
            .filter(|file| is_plain_file_name(file) && *file != SINGLE_FILE)
            .collect();
        shards.sort_unstable();
        shards.dedup();
        let io = |path: PathBuf| move |source| Error::Io { path, source };
        // The index first: without it the shards are never read, whatever happens next.
        std::fs::remove_file(&index_path).map_err(io(index_path.clone()))?;
        for file in shards {
            let path = dir.join(file);
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(path)(e)),
                _ => {}
            }
        }
        Ok(())
    }

    /// The tensors of one safetensors file by path (memory-mapped), whatever its name (an optimizer state, say).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open_file(path: &Path) -> Result<Weights> {
        Ok(Weights::from_single(Shard::parse(path.to_path_buf(), map_file(path)?)?))
    }

    /// Weights from the bytes of one safetensors file (for the web, or data already in memory); `label` names it in
    /// errors.
    pub fn from_bytes(bytes: Vec<u8>, label: &Path) -> Result<Weights> {
        Ok(Weights::from_single(Shard::parse(
            label.to_path_buf(),
            Bytes::Owned(bytes),
        )?))
    }

    fn from_single(shard: Shard) -> Weights {
        let index = shard.metadata.tensors().into_keys().map(|name| (name, 0)).collect();
        Weights {
            source: shard.path.clone(),
            shards: vec![shard],
            index,
            top_modules: OnceCell::new(),
        }
    }

    /// All tensor names, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.index.keys().cloned().collect();
        names.sort();
        names
    }

    /// Whether the weights hold `name` (e.g. to tell a tied `lm_head` from a separate one).
    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// The stored name of parameter `name` of a model whose base module is `base` (`model`, `transformer`):
    /// `name`, or `name` without `base.` when the file holds nothing under `base`, as checkpoints saved from the
    /// bare base model do (GPT-2's, BLOOM's and OPT's on the Hub; transformers adds the prefix on load). Unlike
    /// transformers, which decides tensor by tensor, a file holding anything under `base` is read by its names.
    pub fn stored_name<'a>(&self, name: &'a str, base: &str) -> &'a str {
        let modules = self.top_modules.get_or_init(|| {
            self.index
                .keys()
                .map(|k| k.split('.').next().unwrap_or(k).to_string())
                .collect()
        });
        match name.strip_prefix(base).and_then(|rest| rest.strip_prefix('.')) {
            Some(inner) if !self.contains(name) && !modules.contains(base) => inner,
            _ => name,
        }
    }

    /// The stored shape of `name`, if present.
    pub fn shape(&self, name: &str) -> Option<Vec<usize>> {
        let shard = &self.shards[*self.index.get(name)?];
        shard.info(name).map(|info| info.shape.clone())
    }

    /// Loads `name` as an f32 tensor on `device`, checking that it has `shape`; f16, bf16 and f64 are converted
    /// on the host.
    pub fn load(&self, name: &str, shape: &[usize], device: &Device) -> Result<Tensor> {
        let data = self.read_f32(name, shape)?;
        Ok(Tensor::from_slice(&data, shape, device)?)
    }

    /// The values of `name` as f32 on the host, checking that it has `shape`.
    pub fn read_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let Some(&i) = self.index.get(name) else {
            return Err(Error::Weights {
                path: self.source.clone(),
                message: format!("tensor '{name}' (expected shape {shape:?}) is missing"),
            });
        };
        let shard = &self.shards[i];
        let bad = |message: String| Error::Weights {
            path: shard.path.clone(),
            message: format!("tensor '{name}': {message}"),
        };
        let info = shard.info(name).ok_or_else(|| bad("missing".into()))?;
        if info.shape != shape {
            return Err(bad(format!("expected shape {shape:?}, found {:?}", info.shape)));
        }
        let (start, end) = info.data_offsets;
        let bytes = shard
            .bytes
            .as_slice()
            .get(shard.data_start + start..shard.data_start + end)
            .ok_or_else(|| bad("data offsets past the end of the file".into()))?;
        let le2 = |c: &[u8]| u16::from_le_bytes([c[0], c[1]]);
        Ok(match info.dtype {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_bits(le2(c)).to_f32())
                .collect(),
            Dtype::BF16 => bytes
                .chunks_exact(2)
                // The top half of an f32, bit for bit (signaling NaNs too, which `half` would quiet).
                .map(|c| f32::from_bits(u32::from(le2(c)) << 16))
                .collect(),
            Dtype::F64 => bytes
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap_or_default()) as f32)
                .collect(),
            other => {
                return Err(bad(format!(
                    "unsupported dtype {other:?} (supported: F32, F16, BF16, F64)"
                )));
            }
        })
    }

    /// Writes `tensors` as one f32 safetensors file, through a temporary file renamed into place so that a
    /// crash never leaves a truncated file under `path`.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn save(path: &Path, tensors: &[(String, Tensor)]) -> Result<()> {
        let mut host = Vec::with_capacity(tensors.len());
        for (name, t) in tensors {
            host.push((name.as_str(), t.shape().to_vec(), t.to_f32_vec()?));
        }
        let views: Vec<(&str, &[usize], &[f32])> =
            host.iter().map(|(n, s, d)| (*n, s.as_slice(), d.as_slice())).collect();
        save_f32(path, &views)
    }
}

/// Writes host f32 data as one safetensors file (temporary file, then rename); names must be unique.
#[cfg(not(target_arch = "wasm32"))]
pub fn save_f32(path: &Path, tensors: &[(&str, &[usize], &[f32])]) -> Result<()> {
    let bad = |message: String| Error::Weights {
        path: path.to_path_buf(),
        message,
    };
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({ "format": "pt" }));
    let mut offset = 0usize;
    for (name, shape, data) in tensors {
        if shape.iter().product::<usize>() != data.len() {
            return Err(bad(format!(
                "tensor '{name}': {} values do not fill shape {shape:?}",
                data.len()
            )));
        }
        let end = offset + 4 * data.len();
        let entry = serde_json::json!({ "dtype": "F32", "shape": shape, "data_offsets": [offset, end] });
        if header.insert(name.to_string(), entry).is_some() || *name == "__metadata__" {
            return Err(bad(format!("tensor name '{name}' used twice")));
        }
        offset = end;
    }
    let mut json = Value::Object(header).to_string().into_bytes();
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut bytes = Vec::with_capacity(8 + json.len() + offset);
    bytes.extend_from_slice(&(json.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&json);
    for (_, _, data) in tensors {
        for v in *data {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
    }
    if path.file_name().is_none() {
        return Err(bad("not a file path".into()));
    }
    write_atomic(path, &bytes)
}

/// Whether a shard name the index gives is a file of the model folder itself, not a path out of it.
#[cfg(not(target_arch = "wasm32"))]
fn is_plain_file_name(file: &str) -> bool {
    Path::new(file).components().count() == 1 && file != ".."
}

/// Writes `bytes` to `path` through a temporary file in the same folder renamed into place, so that a crash never
/// leaves a truncated file under `path`, nor a power loss an empty one.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(path.file_name().unwrap_or_default());
    // Unique per call, not only per process: two threads writing the same name must not share a temporary file
    // (one's rename would take the other's away).
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let serial = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    tmp_name.push(format!(".{}-{serial}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    // Synced before the rename: after a power loss the name holds the old bytes or the new ones, never a file
    // that was renamed before its contents reached the disk.
    let written = std::fs::File::create(&tmp).and_then(|mut f| {
        std::io::Write::write_all(&mut f, bytes)?;
        f.sync_all()
    });
    written.map_err(|source| Error::Io {
        path: tmp.clone(),
        source,
    })?;
    std::fs::rename(&tmp, path).map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    })
}

#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn map_file(path: &Path) -> Result<Bytes> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    // SAFETY: the map is read-only; a model file changed underneath a running process is outside what any loader
    // can guard against (the same contract as the safetensors crate's own examples).
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    Ok(Bytes::Mapped(map))
}
