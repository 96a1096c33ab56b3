//! ggml's quantized block formats (the tensor types of GGUF files): their sizes, a bit-exact CPU dequantizer,
//! and [`QTensor`], quantized weights kept as blocks on the GPU with kernels that dequantize inside the matmul.
//!
//! The CPU dequantizer is the reference: it follows ggml's `dequantize_row_*` operation by operation. Every
//! product of a scale (an f16, or an f16 times a 6- or 8-bit integer) and a quant is exact in f32, so each value
//! is rounded once at most; GPU kernels therefore reproduce the CPU values bit for bit whether or not their
//! compiler fuses the multiply-add.

mod cpu;
mod gpu;

use crate::error::{Error, Result};

pub use gpu::{Fusion, QTensor};

/// A ggml tensor type, as GGUF files number them. Sizes are known for all of them; [`dequantize`] and
/// [`QTensor`] take the float types and the formats listed in [`GgmlType::is_supported`].
#[allow(non_camel_case_types, missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

/// (type, GGUF id, name, elements per block, bytes per block), from ggml's `type_traits`.
const TYPES: [(GgmlType, u32, &str, usize, usize); 32] = {
    use GgmlType::*;
    [
        (F32, 0, "F32", 1, 4),
        (F16, 1, "F16", 1, 2),
        (Q4_0, 2, "Q4_0", 32, 18),
        (Q4_1, 3, "Q4_1", 32, 20),
        (Q5_0, 6, "Q5_0", 32, 22),
        (Q5_1, 7, "Q5_1", 32, 24),
        (Q8_0, 8, "Q8_0", 32, 34),
        (Q8_1, 9, "Q8_1", 32, 36),
        (Q2_K, 10, "Q2_K", 256, 84),
        (Q3_K, 11, "Q3_K", 256, 110),
        (Q4_K, 12, "Q4_K", 256, 144),
        (Q5_K, 13, "Q5_K", 256, 176),
        (Q6_K, 14, "Q6_K", 256, 210),
        (Q8_K, 15, "Q8_K", 256, 292),
        (IQ2_XXS, 16, "IQ2_XXS", 256, 66),
        (IQ2_XS, 17, "IQ2_XS", 256, 74),
        (IQ3_XXS, 18, "IQ3_XXS", 256, 98),
        (IQ1_S, 19, "IQ1_S", 256, 50),
        (IQ4_NL, 20, "IQ4_NL", 32, 18),
        (IQ3_S, 21, "IQ3_S", 256, 110),
        (IQ2_S, 22, "IQ2_S", 256, 82),
        (IQ4_XS, 23, "IQ4_XS", 256, 136),
        (I8, 24, "I8", 1, 1),
        (I16, 25, "I16", 1, 2),
        (I32, 26, "I32", 1, 4),
        (I64, 27, "I64", 1, 8),
        (F64, 28, "F64", 1, 8),
        (IQ1_M, 29, "IQ1_M", 256, 56),
        (BF16, 30, "BF16", 1, 2),
        (TQ1_0, 34, "TQ1_0", 256, 54),
        (TQ2_0, 35, "TQ2_0", 256, 66),
        (MXFP4, 39, "MXFP4", 32, 17),
    ]
};

impl GgmlType {
    fn entry(self) -> &'static (GgmlType, u32, &'static str, usize, usize) {
        TYPES
            .iter()
            .find(|e| e.0 == self)
            .expect("every type has a table entry")
    }

    /// The type with GGUF id `id`, or `None` for ids ggml does not define (removed ones included).
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TYPES.iter().find(|e| e.1 == id).map(|e| e.0)
    }

    /// The id GGUF files store.
    pub fn id(self) -> u32 {
        self.entry().1
    }

    /// The name llama.cpp prints (`Q4_K`, `F16`, ...).
    pub fn name(self) -> &'static str {
        self.entry().2
    }

    /// Elements per block (1 for plain types).
    pub fn block_size(self) -> usize {
        self.entry().3
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        self.entry().4
    }

    /// Bytes holding `n` elements, or `None` when `n` is not a whole number of blocks (or overflows).
    pub fn bytes_for(self, n: usize) -> Option<usize> {
        if !n.is_multiple_of(self.block_size()) {
            return None;
        }
        (n / self.block_size()).checked_mul(self.type_size())
    }

    /// Whether [`dequantize`] takes this type; the quantized ones among them also run on the GPU ([`QTensor`]).
    pub fn is_supported(self) -> bool {
        self.is_float() || self.is_gpu_quant()
    }

    /// The plain float types (F32, F16, BF16).
    pub fn is_float(self) -> bool {
        matches!(self, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
    }

    /// The block formats with GPU kernels.
    pub(crate) fn is_gpu_quant(self) -> bool {
        use GgmlType::*;
        matches!(self, Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4_K | Q5_K | Q6_K)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The list of supported types for error messages.
fn supported_names() -> String {
    TYPES
        .iter()
        .filter(|e| e.0.is_supported())
        .map(|e| e.2)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks that `bytes` holds exactly `n` elements of `ty` and that `ty` is supported by `op`.
pub(crate) fn check_bytes(op: &'static str, ty: GgmlType, bytes: usize, n: usize) -> Result<()> {
    if !ty.is_supported() {
        return Err(Error::Invalid {
            op,
            message: format!("tensor type {ty} is not supported (supported: {})", supported_names()),
        });
    }
    match ty.bytes_for(n) {
        None => Err(Error::Invalid {
            op,
            message: format!(
                "{n} elements are not a whole number of {ty} blocks of {}",
                ty.block_size()
            ),
        }),
        Some(want) if want != bytes => Err(Error::Invalid {
            op,
            message: format!("{n} elements of {ty} take {want} bytes, got {bytes}"),
        }),
        Some(_) => Ok(()),
    }
}

/// The `n` values stored in `bytes` (ggml's layout, little-endian) as f32, exactly as ggml dequantizes them.
/// Errors when the type is not supported or `bytes` does not hold exactly `n` elements.
pub fn dequantize(ty: GgmlType, bytes: &[u8], n: usize) -> Result<Vec<f32>> {
    check_bytes("dequantize", ty, bytes.len(), n)?;
    if ty.is_float() {
        return Ok(cpu::floats(ty, bytes));
    }
    let mut out = Vec::with_capacity(n);
    for block in bytes.chunks_exact(ty.type_size()) {
        cpu::dequantize_block(ty, block, &mut out);
    }
    Ok(out)
}
