//! Compiles the kernels written in GLSL for Vulkan (what WGSL cannot express yet) to SPIR-V, one module per
//! specialization, into `$OUT_DIR/spirv.rs`. At build time, so that glslang is neither linked into Hierarchos
//! nor run when a kernel is first launched.

use glslang::{
    Compiler, CompilerOptions, ShaderInput, ShaderSource, ShaderStage, SourceLanguage, SpirvVersion, Target,
    VulkanVersion,
};
use std::fmt::Write;

const MATMUL_COOP: &str = "../../wgsl/matmul_coop.glsl";

fn main() {
    println!("cargo:rerun-if-changed={MATMUL_COOP}");
    let source = std::fs::read_to_string(MATMUL_COOP).unwrap_or_else(|e| panic!("{MATMUL_COOP}: {e}"));
    let mut out = String::from(
        "/// SPIR-V of `wgsl/matmul_coop.glsl`, indexed by `[A_ALONG_M][B_ALONG_K][OUTPUT]` (OUTPUT_F16, \
         OUTPUT_WIDE, OUTPUT_PARTIAL).\npub(crate) static MATMUL_COOP_SPIRV: [[[&[u32]; 3]; 2]; 2] = [\n",
    );
    for a_along_m in 0..2 {
        out.push_str("[\n");
        for b_along_k in 0..2 {
            out.push_str("[\n");
            for output in 0..3 {
                let header = format!(
                    "#version 450\n#define A_ALONG_M {a_along_m}\n#define B_ALONG_K {b_along_k}\n\
                     #define OUTPUT_F16 0\n#define OUTPUT_WIDE 1\n#define OUTPUT_PARTIAL 2\n#define OUTPUT {output}\n"
                );
                let words = compile(&(header + source.as_str()))
                    .unwrap_or_else(|e| panic!("{MATMUL_COOP} ({a_along_m} {b_along_k} {output}): {e}"));
                out.push_str("&[");
                for w in words {
                    write!(out, "{w:#x},").unwrap();
                }
                out.push_str("],\n");
            }
            out.push_str("],\n");
        }
        out.push_str("],\n");
    }
    out.push_str("];\n");
    let dir = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    std::fs::write(format!("{dir}/spirv.rs"), out).expect("writing spirv.rs");
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
