//! The GGUF container (versions 2 and 3, little-endian): header, typed metadata, tensor infos and the aligned data
//! section, memory-mapped. Every count, length and offset is checked against the bytes that are really there
//! before anything is allocated or read, so a truncated or corrupt file is an error naming the field, never a
//! panic or a huge allocation.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use hierarchos_core::quant::GgmlType;

use crate::error::{Error, Result};
use crate::weights::Bytes;
#[cfg(not(target_arch = "wasm32"))]
use crate::weights::map_file;

/// The four bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions.
const MAX_DIMS: usize = 4;
/// Arrays of arrays deeper than this are rejected (no real file nests at all; it bounds the recursion).
const MAX_ARRAY_DEPTH: usize = 4;

/// The type of a metadata value, with its on-disk id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueType {
    /// 8-bit unsigned.
    U8,
    /// 8-bit signed.
    I8,
    /// 16-bit unsigned.
    U16,
    /// 16-bit signed.
    I16,
    /// 32-bit unsigned.
    U32,
    /// 32-bit signed.
    I32,
    /// 32-bit float.
    F32,
    /// One byte, 0 or 1.
    Bool,
    /// UTF-8 text with a u64 length.
    String,
    /// Element type, u64 count, elements.
    Array,
    /// 64-bit unsigned.
    U64,
    /// 64-bit signed.
    I64,
    /// 64-bit float.
    F64,
}

impl ValueType {
    fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The fewest bytes one value of this type takes, to bound array counts by the bytes left.
    fn min_size(self) -> usize {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `u8`.
    U8(u8),
    /// `i8`.
    I8(i8),
    /// `u16`.
    U16(u16),
    /// `i16`.
    I16(i16),
    /// `u32`.
    U32(u32),
    /// `i32`.
    I32(i32),
    /// `f32`.
    F32(f32),
    /// `bool`.
    Bool(bool),
    /// `string`.
    String(String),
    /// An array: its element type (kept so that empty arrays still say what they hold) and its elements.
    Array(ValueType, Vec<Value>),
    /// `u64`.
    U64(u64),
    /// `i64`.
    I64(i64),
    /// `f64`.
    F64(f64),
}

impl Value {
    /// The value as a non-negative integer, whatever integer type the writer chose.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a number (any integer or float type).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// The value as text.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as a flag.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The elements of an array.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(_, items) => Some(items),
            _ => None,
        }
    }

    /// A short description for messages: the type, and the length of strings and arrays.
    pub fn describe(&self) -> String {
        match self {
            Value::String(s) if s.len() <= 60 => format!("{s:?}"),
            Value::String(s) => format!("string of {} bytes", s.len()),
            Value::Array(t, items) => format!("array of {} {t:?}", items.len()),
            other => format!("{other:?}"),
        }
    }
}

/// Where one tensor is and what it holds.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// The llama.cpp tensor name (`blk.0.attn_q.weight`).
    pub name: String,
    /// ggml's dimensions, innermost (contiguous) first: a `[rows, cols]` matrix is stored as `[cols, rows]`.
    pub dims: Vec<u64>,
    /// Storage type (any ggml type is read; [`hierarchos_core::quant`] says which can be computed with).
    pub ty: GgmlType,
    /// Byte offset of the data from the start of the data section.
    pub offset: u64,
    /// Bytes of data.
    pub size: u64,
}

impl TensorInfo {
    /// The row-major shape (outermost first), as the Hugging Face tensor of the same data has it.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    /// Number of values.
    pub fn len(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Whether the tensor holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An opened GGUF file: metadata and tensor infos parsed, tensor data left in the (mapped) file until asked for.
pub struct Gguf {
    path: PathBuf,
    bytes: Bytes,
    version: u32,
    alignment: u64,
    data_start: usize,
    metadata: Vec<(String, Value)>,
    keys: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    names: HashMap<String, usize>,
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// Reads little-endian fields, each checked against the end of the bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn error(&self, field: &str, message: &str) -> Error {
        self.error_at(self.pos, field, message)
    }

    fn error_at(&self, pos: usize, field: &str, message: &str) -> Error {
        Error::Weights {
            path: self.path.to_path_buf(),
            message: format!("GGUF {field} (at byte {pos}): {message}"),
        }
    }

    fn take(&mut self, n: u64, field: &dyn Fn() -> String) -> Result<&'a [u8]> {
        let left = self.bytes.len() - self.pos;
        match usize::try_from(n) {
            Ok(n) if n <= left => {
                let s = &self.bytes[self.pos..self.pos + n];
                self.pos += n;
                Ok(s)
            }
            _ => Err(self.error(
                &field(),
                &format!("needs {n} bytes but the file ends {left} bytes later (truncated?)"),
            )),
        }
    }

    fn array<const N: usize>(&mut self, field: &dyn Fn() -> String) -> Result<[u8; N]> {
        let s = self.take(N as u64, field)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, field: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    fn u64(&mut self, field: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    fn string(&mut self, field: &dyn Fn() -> String) -> Result<String> {
        let start = self.pos;
        let len = self.u64(&|| format!("{} length", field()))?;
        let bytes = self.take(len, field)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| self.error_at(start, &field(), &format!("not UTF-8 ({e})")))
    }

    /// A count that must leave room for `count * min_size` more bytes: a count past the end of the file is
    /// reported here, before any allocation.
    fn count(&mut self, min_size: usize, field: &dyn Fn() -> String) -> Result<usize> {
        let n = self.u64(field)?;
        let left = (self.bytes.len() - self.pos) as u64;
        if n.checked_mul(min_size as u64).is_none_or(|need| need > left) {
            return Err(self.error(
                &field(),
                &format!("{n} items of at least {min_size} bytes each do not fit the {left} bytes left"),
            ));
        }
        Ok(n as usize)
    }

    fn value(&mut self, ty: ValueType, depth: usize, field: &dyn Fn() -> String) -> Result<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(field)?[0]),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(field)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(field)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(field)?)),
            ValueType::U32 => Value::U32(self.u32(field)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(field)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(field)?)),
            ValueType::U64 => Value::U64(self.u64(field)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(field)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(field)?)),
            ValueType::Bool => match self.array::<1>(field)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.error_at(self.pos - 1, &field(), &format!("bool byte is {b}, not 0 or 1"))),
            },
            ValueType::String => Value::String(self.string(field)?),
            ValueType::Array => {
                let elem = self.value_type(&|| format!("{} element type", field()))?;
                if elem == ValueType::Array && depth + 1 >= MAX_ARRAY_DEPTH {
                    return Err(self.error(&field(), &format!("arrays nested more than {MAX_ARRAY_DEPTH} deep")));
                }
                let n = self.count(elem.min_size(), &|| format!("{} count", field()))?;
                let mut items = Vec::with_capacity(n);
                for i in 0..n {
                    items.push(self.value(elem, depth + 1, &|| format!("{}[{i}]", field()))?);
                }
                Value::Array(elem, items)
            }
        })
    }

    fn value_type(&mut self, field: &dyn Fn() -> String) -> Result<ValueType> {
        let id = self.u32(field)?;
        ValueType::from_id(id).ok_or_else(|| {
            self.error_at(
                self.pos - 4,
                &field(),
                &format!("unknown value type {id} (known: 0..=12)"),
            )
        })
    }
}

impl Gguf {
    /// Opens and memory-maps a `.gguf` file, parsing its header, metadata and tensor infos.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open(path: &Path) -> Result<Gguf> {
        Gguf::parse(path.to_path_buf(), map_file(path)?)
    }

    /// Parses a GGUF file already in memory; `label` names it in errors.
    pub fn from_bytes(bytes: Vec<u8>, label: &Path) -> Result<Gguf> {
        Gguf::parse(label.to_path_buf(), Bytes::Owned(bytes))
    }

    fn parse(path: PathBuf, bytes: Bytes) -> Result<Gguf> {
        let mut c = Cursor {
            bytes: bytes.as_slice(),
            pos: 0,
            path: &path,
        };
        let magic = c.array::<4>(&|| "magic".into())?;
        if magic != MAGIC {
            return Err(c.error_at(
                0,
                "magic",
                &format!("found {magic:02x?}, expected \"GGUF\" (not a GGUF file)"),
            ));
        }
        let version = c.u32(&|| "version".into())?;
        if version != 2 && version != 3 {
            let hint = if version.swap_bytes() == 2 || version.swap_bytes() == 3 {
                " (a big-endian file; only little-endian GGUF is supported)"
            } else {
                ""
            };
            return Err(c.error_at(
                4,
                "version",
                &format!("unsupported version {version}{hint}; supported: 2, 3"),
            ));
        }
        // A tensor info takes at least 4 + 8 bytes of name length and dimension count, 4 of type and 8 of offset.
        let tensor_count = c.u64(&|| "tensor_count".into())?;
        let kv_count = c.count(8 + 4 + 1, &|| "metadata_kv_count".into())?;
        let mut metadata = Vec::with_capacity(kv_count);
        let mut keys = HashMap::with_capacity(kv_count);
        for i in 0..kv_count {
            let key = c.string(&|| format!("metadata #{i} key"))?;
            let ty = c.value_type(&|| format!("metadata '{key}' type"))?;
            let value = c.value(ty, 0, &|| format!("metadata '{key}'"))?;
            if keys.insert(key.clone(), i).is_some() {
                return Err(c.error(&format!("metadata '{key}'"), "key appears twice"));
            }
            metadata.push((key, value));
        }
        let alignment = match keys.get("general.alignment").map(|&i| &metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(Value::U32(a)) if *a != 0 && a.is_power_of_two() => u64::from(*a),
            Some(other) => {
                return Err(c.error(
                    "metadata 'general.alignment'",
                    &format!("must be a u32 power of two, found {}", other.describe()),
                ));
            }
        };
        let left = (c.bytes.len() - c.pos) as u64;
        if tensor_count.checked_mul(24).is_none_or(|need| need > left) {
            return Err(c.error(
                "tensor_count",
                &format!("{tensor_count} tensor infos of at least 24 bytes each do not fit the {left} bytes left"),
            ));
        }
        let mut tensors = Vec::with_capacity(tensor_count as usize);
        let mut names = HashMap::with_capacity(tensor_count as usize);
        for i in 0..tensor_count as usize {
            let name = c.string(&|| format!("tensor #{i} name"))?;
            let field = |what: &str| format!("tensor '{name}' {what}");
            let n_dims = c.u32(&|| field("n_dims"))? as usize;
            if n_dims > MAX_DIMS {
                return Err(c.error_at(
                    c.pos - 4,
                    &field("n_dims"),
                    &format!("{n_dims} dimensions (at most {MAX_DIMS})"),
                ));
            }
            let mut dims = Vec::with_capacity(n_dims);
            for d in 0..n_dims {
                dims.push(c.u64(&|| field(&format!("dims[{d}]")))?);
            }
            let type_id = c.u32(&|| field("type"))?;
            let Some(ty) = GgmlType::from_id(type_id) else {
                return Err(c.error_at(c.pos - 4, &field("type"), &format!("unknown ggml type {type_id}")));
            };
            let offset = c.u64(&|| field("offset"))?;
            let at = c.pos - 8;
            let bad = |c: &Cursor, message: String| c.error_at(at, &field("offset"), &message);
            let len = dims
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .filter(|&n| n <= i64::MAX as u64);
            let Some(len) = len else {
                return Err(bad(&c, format!("dimensions {dims:?} overflow")));
            };
            let row = dims.first().copied().unwrap_or(1);
            let (block, type_size) = (ty.block_size() as u64, ty.type_size() as u64);
            if !row.is_multiple_of(block) {
                return Err(bad(
                    &c,
                    format!("rows of {row} values are not whole {} blocks of {block}", ty.name(),),
                ));
            }
            let Some(size) = (len / block).checked_mul(type_size) else {
                return Err(bad(&c, format!("dimensions {dims:?} of {} overflow", ty.name())));
            };
            if !offset.is_multiple_of(alignment) {
                return Err(bad(
                    &c,
                    format!("{offset} is not a multiple of the alignment {alignment}"),
                ));
            }
            if names.insert(name.clone(), i).is_some() {
                return Err(c.error(&format!("tensor '{name}'"), "name appears twice"));
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ty,
                offset,
                size,
            });
        }
        let file_len = c.bytes.len() as u64;
        let data_start = (c.pos as u64).next_multiple_of(alignment);
        let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
        by_offset.sort_by_key(|t| t.offset);
        for (k, t) in by_offset.iter().enumerate() {
            let end = t.offset.checked_add(t.size);
            if end.and_then(|e| e.checked_add(data_start)).is_none_or(|e| e > file_len) {
                return Err(Error::Weights {
                    path: path.clone(),
                    message: format!(
                        "GGUF tensor '{}' data: {} bytes at offset {} of the data section (which starts at byte \
                         {data_start}) run past the end of the file ({file_len} bytes; truncated?)",
                        t.name, t.size, t.offset
                    ),
                });
            }
            if let (Some(end), Some(next)) = (end, by_offset.get(k + 1))
                && next.offset < end
            {
                return Err(Error::Weights {
                    path: path.clone(),
                    message: format!(
                        "GGUF tensor '{}' data (offset {}, {} bytes) overlaps tensor '{}' at offset {}",
                        t.name, t.offset, t.size, next.name, next.offset
                    ),
                });
            }
        }
        // Past the end only when there are no tensors, which then never index from it.
        let data_start = data_start.min(file_len) as usize;
        Ok(Gguf {
            path,
            bytes,
            version,
            alignment,
            data_start,
            metadata,
            keys,
            tensors,
            names,
        })
    }

    /// The file (or label) this was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of the tensor data (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Byte offset of the data section in the file.
    pub fn data_start(&self) -> usize {
        self.data_start
    }

    /// All metadata in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The value of metadata `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.keys.get(key).map(|&i| &self.metadata[i].1)
    }

    /// All tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The info of tensor `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.names.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw bytes of tensor `name` (blocks as stored).
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8]> {
        let info = self.tensor(name).ok_or_else(|| Error::Weights {
            path: self.path.clone(),
            message: format!("tensor '{name}' is not in the file"),
        })?;
        // In range: parse checked offset + size against the data section.
        let start = self.data_start + info.offset as usize;
        Ok(&self.bytes.as_slice()[start..start + info.size as usize])
    }
}
