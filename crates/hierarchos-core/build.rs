//! Compiles the kernels written in GLSL for Vulkan (what WGSL cannot express yet) to SPIR-V, one module per
//! specialization, into `$OUT_DIR/spirv.rs`. At build time, so that glslang is neither linked into Hierarchos
//! nor run when a kernel is first launched.

use glslang::{
    Compiler, CompilerOptions, ShaderInput, ShaderSource, ShaderStage, SourceLanguage, SpirvVersion, Target,
    VulkanVersion,
};
use std::fmt::Write;

const MATMUL_COOP: &str = "../../wgsl/matmul_coop.glsl";
const FLASH_COMMON: &str = "../../wgsl/flash_attention_coop_common.glsl";
/// The tensor-core flash-attention kernels, in the order of `FLASH_ATTENTION_COOP_SPIRV`.
const FLASH_KERNELS: [&str; 3] = [
    "../../wgsl/flash_attention_coop_forward.glsl",
    "../../wgsl/flash_attention_coop_dq.glsl",
    "../../wgsl/flash_attention_coop_dkv.glsl",
];

fn main() {
    let mut out = String::new();
    matmul_coop(&mut out);
    flash_attention_coop(&mut out);
    let dir = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    std::fs::write(format!("{dir}/spirv.rs"), out).expect("writing spirv.rs");
}

fn read(path: &str) -> String {
    println!("cargo:rerun-if-changed={path}");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// SPIR-V of `source`, compiled as a compute shader; panics with glslang's log naming `what`.
fn spirv(source: &str, what: &str) -> Vec<u32> {
    compile(source).unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// `&[...]` of SPIR-V words, for `spirv.rs`.
fn literal(words: &[u32]) -> String {
    let mut out = String::from("&[");
    for w in words {
        write!(out, "{w:#x},").unwrap();
    }
    out.push(']');
    out
}

/// The module with its 16-bit float type made bfloat16 (`SPV_KHR_bfloat16`: the same OpTypeFloat with the
/// BFloat16KHR encoding, and the capabilities for that type and for cooperative matrices of it). A kernel that only
/// loads, converts, multiplies as cooperative matrices and stores its 16-bit values, as `matmul_coop.glsl` does,
/// then computes the same thing on bf16 values: glslang 15 has no `bfloat16_t` to write it with.
fn to_bf16(words: &[u32]) -> Vec<u32> {
    const OP_EXTENSION: u32 = 10;
    const OP_CAPABILITY: u32 = 17;
    const OP_TYPE_FLOAT: u32 = 22;
    const BFLOAT16_TYPE: u32 = 5116;
    const BFLOAT16_COOPERATIVE_MATRIX: u32 = 5118;
    const BFLOAT16_ENCODING: u32 = 0;
    let mut name: Vec<u8> = b"SPV_KHR_bfloat16".to_vec();
    name.resize(name.len() / 4 * 4 + 4, 0);
    let name: Vec<u32> = name
        .chunks(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let (mut out, mut at, mut extension_added, mut halves) = (words[..5].to_vec(), 5, false, 0);
    while at < words.len() {
        let (count, op) = ((words[at] >> 16) as usize, words[at] & 0xffff);
        let instruction = &words[at..at + count];
        if op != OP_CAPABILITY && !extension_added {
            for capability in [BFLOAT16_TYPE, BFLOAT16_COOPERATIVE_MATRIX] {
                out.extend([(2 << 16) | OP_CAPABILITY, capability]);
            }
            out.push(((1 + name.len() as u32) << 16) | OP_EXTENSION);
            out.extend(&name);
            extension_added = true;
        }
        if op == OP_TYPE_FLOAT && instruction[2] == 16 {
            assert_eq!(count, 3, "an f16 type with an encoding already");
            out.extend([(4 << 16) | OP_TYPE_FLOAT, instruction[1], 16, BFLOAT16_ENCODING]);
            halves += 1;
        } else {
            out.extend(instruction);
        }
        at += count;
    }
    assert_eq!(halves, 1, "one 16-bit float type to make bf16");
    out
}

/// The defines `wgsl/matmul_coop.glsl` is compiled for, outermost first: `MATMUL_COOP_SPIRV` nests one array level
/// per define, indexed by the position of its value here.
const MATMUL_COOP_DEFINES: [(&str, &[u32]); 5] = [
    ("FRAG", &[16, 8]),
    ("EDGES", &[0, 1]),
    ("A_ALONG_M", &[0, 1]),
    ("B_ALONG_K", &[0, 1]),
    ("OUTPUT", &[0, 1, 2]),
];

fn matmul_coop(out: &mut String) {
    let source = read(MATMUL_COOP);
    let mut ty = "&'static [u32]".to_string();
    for (_, values) in MATMUL_COOP_DEFINES.iter().rev() {
        ty = format!("[{ty}; {}]", values.len());
    }
    writeln!(
        out,
        "/// One array level per define of `wgsl/matmul_coop.glsl`.\ntype MatmulCoopVariants = {ty};\n\
         /// SPIR-V of `wgsl/matmul_coop.glsl`, indexed by the operands' type (f16, then bf16: compiled with BF16 \
         and their 16-bit type made bf16), FRAG (16, 8), EDGES, A_ALONG_M, B_ALONG_K and OUTPUT (OUTPUT_F16, \
         OUTPUT_WIDE, OUTPUT_PARTIAL: the output is bf16 where the operands are).\n\
         pub(crate) static MATMUL_COOP_SPIRV: [MatmulCoopVariants; 2] ="
    )
    .unwrap();
    let header = "#version 450\n#define OUTPUT_F16 0\n#define OUTPUT_WIDE 1\n#define OUTPUT_PARTIAL 2\n";
    let mut tables = [String::new(), String::new()];
    matmul_coop_level(&mut tables, &source, header.to_string(), &MATMUL_COOP_DEFINES);
    let [f16, bf16] = tables;
    writeln!(out, "[{f16},\n{bf16}];").unwrap();
}

/// The nested arrays of variants over `defines`, each compiled with `header` and one value of each define: into
/// `tables[0]` with BF16 0, into `tables[1]` with BF16 1 and made bf16.
fn matmul_coop_level(tables: &mut [String; 2], source: &str, header: String, defines: &[(&str, &[u32])]) {
    let Some(((name, values), inner)) = defines.split_first() else {
        for (table, bf16) in tables.iter_mut().zip([false, true]) {
            let header = format!("{header}#define BF16 {}\n", bf16 as u32);
            let words = spirv(&(header.clone() + source), &format!("{MATMUL_COOP} with {header}"));
            table.push_str(&literal(&if bf16 { to_bf16(&words) } else { words }));
        }
        return;
    };
    for table in tables.iter_mut() {
        table.push_str("[\n");
    }
    for value in *values {
        matmul_coop_level(tables, source, format!("{header}#define {name} {value}\n"), inner);
        for table in tables.iter_mut() {
            table.push_str(",\n");
        }
    }
    for table in tables.iter_mut() {
        table.push(']');
    }
}

fn flash_attention_coop(out: &mut String) {
    let common = read(FLASH_COMMON);
    out.push_str(
        "/// SPIR-V of the tensor-core flash-attention kernels, for fragments of 16 (subgroups of 32), then of 8 \
         (subgroups of 8): forward, query gradients, key/value gradients.\n\
         pub(crate) static FLASH_ATTENTION_COOP_SPIRV: [[&[u32]; 3]; 2] = [\n",
    );
    for (frag, lanes) in [(16, 2), (8, 1)] {
        out.push_str("[\n");
        for kernel in FLASH_KERNELS {
            let source = format!(
                "#version 450\n#define FRAG {frag}\n#define LANES {lanes}\n{common}{}",
                read(kernel)
            );
            out.push_str(&literal(&spirv(&source, &format!("{kernel} (FRAG {frag})"))));
            out.push_str(",\n");
        }
        out.push_str("],\n");
    }
    out.push_str("];\n");
}

/// SPIR-V for the compute shader `source` (GLSL 450, for Vulkan 1.2), or glslang's log.
fn compile(source: &str) -> Result<Vec<u32>, String> {
    let compiler = Compiler::acquire().ok_or("glslang failed to initialize")?;
    let source = ShaderSource::from(source.to_string());
    let options = CompilerOptions {
        source_language: SourceLanguage::GLSL,
        target: Target::Vulkan {
            version: VulkanVersion::Vulkan1_2,
            spirv_version: SpirvVersion::SPIRV1_5,
        },
        ..Default::default()
    };
    let input = ShaderInput::new(
        &source,
        ShaderStage::Compute,
        &options,
        None::<&[(&str, Option<&str>)]>,
        None,
    )
    .map_err(|e| e.to_string())?;
    compiler
        .create_shader(input)
        .and_then(|shader| shader.compile())
        .map_err(|e| e.to_string())
}
