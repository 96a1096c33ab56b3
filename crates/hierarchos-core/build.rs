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

/// `&[...]` of the SPIR-V words of `source`, compiled as a compute shader; panics with glslang's log naming `what`.
fn words(source: &str, what: &str) -> String {
    let words = compile(source).unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut out = String::from("&[");
    for w in words {
        write!(out, "{w:#x},").unwrap();
    }
    out.push(']');
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
         /// SPIR-V of `wgsl/matmul_coop.glsl`, indexed by FRAG (16, 8), EDGES, A_ALONG_M, B_ALONG_K and OUTPUT \
         (OUTPUT_F16, OUTPUT_WIDE, OUTPUT_PARTIAL).\npub(crate) static MATMUL_COOP_SPIRV: MatmulCoopVariants ="
    )
    .unwrap();
    let header = "#version 450\n#define OUTPUT_F16 0\n#define OUTPUT_WIDE 1\n#define OUTPUT_PARTIAL 2\n";
    matmul_coop_level(out, &source, header.to_string(), &MATMUL_COOP_DEFINES);
    out.push_str(";\n");
}

/// The nested array of variants over `defines`, each compiled with `header` and one value of each define.
fn matmul_coop_level(out: &mut String, source: &str, header: String, defines: &[(&str, &[u32])]) {
    let Some(((name, values), inner)) = defines.split_first() else {
        out.push_str(&words(
            &(header.clone() + source),
            &format!("{MATMUL_COOP} with {header}"),
        ));
        return;
    };
    out.push_str("[\n");
    for value in *values {
        matmul_coop_level(out, source, format!("{header}#define {name} {value}\n"), inner);
        out.push_str(",\n");
    }
    out.push(']');
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
            out.push_str(&words(&source, &format!("{kernel} (FRAG {frag})")));
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
