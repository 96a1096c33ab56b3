//! Element types and how kernels load and store them.

use std::fmt;

/// Element type of a tensor. 16-bit floats are stored two to a 32-bit word unless the adapter has `SHADER_F16`
/// (then f16 is stored natively); arithmetic always happens in f32 (floats) or in 32-bit integers, as PyTorch
/// does for its half types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE single precision.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16: the top half of an f32.
    BF16,
    /// Unsigned 32-bit integer (token ids, indices, boolean masks as 0/1).
    U32,
    /// Signed 32-bit integer (labels with -100 as ignore index).
    I32,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            _ => 4,
        }
    }

    /// Whether values of this type are floating point.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// The WGSL type values are computed in.
    pub fn compute_type(self) -> &'static str {
        match self {
            DType::U32 => "u32",
            DType::I32 => "i32",
            _ => "f32",
        }
    }

    /// The short name used in errors and kernel cache keys.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::U32 => "u32",
            DType::I32 => "i32",
        }
    }
}

impl std::str::FromStr for DType {
    type Err = String;

    /// A dtype by its short name (`f32`, `f16`, `bf16`, `u32`, `i32`) or torch's (`float32`, `float16`,
    /// `bfloat16`), as command lines and config files spell them.
    fn from_str(s: &str) -> Result<DType, String> {
        Ok(match s {
            "f32" | "float32" => DType::F32,
            "f16" | "float16" => DType::F16,
            "bf16" | "bfloat16" => DType::BF16,
            "u32" | "uint32" => DType::U32,
            "i32" | "int32" => DType::I32,
            _ => return Err(format!("unknown dtype '{s}' (f32, f16, bf16, u32, i32)")),
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a buffer of some dtype is declared and accessed in WGSL on a given device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Access {
    /// The element type.
    pub dtype: DType,
    /// True when 16-bit values are packed two per `u32` word (bf16 always, f16 without `SHADER_F16`).
    pub packed: bool,
}

impl Access {
    /// The access mode for `dtype` on a device that does (or does not) use native f16.
    pub fn new(dtype: DType, native_f16: bool) -> Self {
        let packed = matches!(dtype, DType::BF16) || (dtype == DType::F16 && !native_f16);
        Access { dtype, packed }
    }

    /// The WGSL array element type of the binding.
    pub fn storage_type(self) -> &'static str {
        match (self.dtype, self.packed) {
            (_, true) => "u32",
            (DType::F32, _) => "f32",
            (DType::F16, _) => "f16",
            (DType::U32, _) => "u32",
            (DType::I32, _) => "i32",
            (DType::BF16, false) => unreachable!("bf16 is always packed"),
        }
    }

    /// Number of elements one thread writes so that no two threads share an output word.
    pub fn elems_per_word(self) -> u32 {
        if self.packed { 2 } else { 1 }
    }

    /// WGSL declaring `fn load_<name>(i: u32) -> C` for element `i` of binding `name`.
    pub fn load_fn(self, name: &str) -> String {
        let c = self.dtype.compute_type();
        let body = match (self.dtype, self.packed) {
            (DType::F16, true) => format!("return unpack2x16float({name}[i >> 1u])[i & 1u];"),
            (DType::BF16, _) => {
                format!(
                    "let w = {name}[i >> 1u]; return bitcast<f32>(select(w << 16u, w & 0xffff0000u, (i & 1u) == 1u));"
                )
            }
            (DType::F16, false) => format!("return f32({name}[i]);"),
            _ => format!("return {name}[i];"),
        };
        format!("fn load_{name}(i: u32) -> {c} {{ {body} }}\n")
    }

    /// WGSL declaring `fn store_<name>(w: u32, v0: C, v1: C)` writing word `w`: one element (`v1` ignored) for
    /// unpacked types, the two elements `2w` and `2w + 1` for packed ones.
    pub fn store_fn(self, name: &str) -> String {
        let c = self.dtype.compute_type();
        let body = match (self.dtype, self.packed) {
            (DType::F16, true) => format!("{name}[w] = f32_to_f16(v0) | (f32_to_f16(v1) << 16u);"),
            (DType::BF16, _) => {
                format!("{name}[w] = (f32_to_bf16(v0) & 0xffffu) | (f32_to_bf16(v1) << 16u);")
            }
            (DType::F16, false) => format!("{name}[w] = f16(unpack2x16float(f32_to_f16(v0)).x);"),
            _ => format!("{name}[w] = v0;"),
        };
        format!("fn store_{name}(w: u32, v0: {c}, v1: {c}) {{ {body} }}\n")
    }
}

/// WGSL helpers every kernel may call: exact f32 to bf16/f16 rounding (round to nearest even).
pub const COMMON_WGSL: &str = include_str!("../../../wgsl/common.wgsl");
