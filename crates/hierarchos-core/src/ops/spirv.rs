//! The SPIR-V of the GLSL kernels, compiled by build.rs (`MATMUL_COOP_SPIRV`, `FLASH_ATTENTION_COOP_SPIRV`).

include!(concat!(env!("OUT_DIR"), "/spirv.rs"));

/// The index of the variant compiled for cooperative matrices of `edge` (the first index of both SPIR-V tables):
/// build.rs compiles fragments of 16, then of 8.
pub(crate) fn coop_variant(edge: u32) -> usize {
    (edge != 16) as usize
}

#[cfg(test)]
mod tests {
    use super::MATMUL_COOP_SPIRV;

    /// The instructions of a SPIR-V module past its header, as (opcode, operands).
    fn instructions(words: &[u32]) -> Vec<(u32, &[u32])> {
        let mut out = Vec::new();
        let mut at = 5;
        while at < words.len() {
            let count = (words[at] >> 16) as usize;
            out.push((words[at] & 0xffff, &words[at + 1..at + count]));
            at += count;
        }
        out
    }

    /// The bf16 matmul modules are the f16 ones with their one 16-bit float type encoded as bfloat16 and the
    /// capabilities and extension that take it; the f16 ones declare none of that.
    #[test]
    fn bf16_modules_declare_a_bfloat16_type() {
        const OP_EXTENSION: u32 = 10;
        const OP_CAPABILITY: u32 = 17;
        const OP_TYPE_FLOAT: u32 = 22;
        let flat = |table: &'static super::MatmulCoopVariants| {
            table
                .iter()
                .flatten()
                .flatten()
                .flatten()
                .flatten()
                .copied()
                .collect::<Vec<&[u32]>>()
        };
        let (f16, bf16) = (flat(&MATMUL_COOP_SPIRV[0]), flat(&MATMUL_COOP_SPIRV[1]));
        assert_eq!(f16.len(), bf16.len());
        for (table, is_bf16) in [(f16, false), (bf16, true)] {
            for module in table {
                let code = instructions(module);
                let halves: Vec<&[u32]> = code
                    .iter()
                    .filter(|(op, operands)| *op == OP_TYPE_FLOAT && operands[1] == 16)
                    .map(|(_, operands)| *operands)
                    .collect();
                let want: &[u32] = if is_bf16 { &[16, 0] } else { &[16] };
                assert_eq!(halves.len(), 1);
                assert_eq!(&halves[0][1..], want);
                let capabilities: Vec<u32> = code
                    .iter()
                    .filter(|(op, _)| *op == OP_CAPABILITY)
                    .map(|(_, o)| o[0])
                    .collect();
                assert_eq!(
                    capabilities.contains(&5116) && capabilities.contains(&5118),
                    is_bf16,
                    "BFloat16TypeKHR and BFloat16CooperativeMatrixKHR"
                );
                let extension: Vec<u8> = b"SPV_KHR_bfloat16\0\0\0\0".to_vec();
                let declared = code.iter().any(|(op, operands)| {
                    *op == OP_EXTENSION
                        && operands
                            .iter()
                            .flat_map(|w| w.to_le_bytes())
                            .eq(extension.iter().copied())
                });
                assert_eq!(declared, is_bf16, "OpExtension \"SPV_KHR_bfloat16\"");
            }
        }
    }
}
