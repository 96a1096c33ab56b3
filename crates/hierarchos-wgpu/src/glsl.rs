//! The bindings of kernels written in GLSL for Vulkan (what WGSL cannot express yet; compiled to SPIR-V at build
//! time and handed to the driver through wgpu's shader passthrough): read from their source, as for WGSL.

/// The storage buffers a GLSL kernel declares, as (binding, read-only) pairs: every line of the form
/// `layout(std430, binding = N) [readonly|writeonly] buffer ...`. Preprocessor conditionals are not evaluated, so
/// a kernel declares each binding on one line (varying its type through a `#define` if it must).
pub(crate) fn storage_bindings(source: &str) -> Result<Vec<(u32, bool)>, String> {
    let mut bindings = Vec::new();
    for line in source
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("layout(") && l.contains(" buffer "))
    {
        let (qualifiers, rest) = line["layout(".len()..]
            .split_once(')')
            .ok_or_else(|| format!("an unterminated layout( in `{line}`"))?;
        let binding = qualifiers
            .split(',')
            .find_map(|q| {
                q.trim()
                    .strip_prefix("binding")
                    .map(|v| v.trim_start().trim_start_matches('=').trim())
            })
            .ok_or_else(|| format!("no binding in `{line}`"))?;
        let binding: u32 = binding
            .parse()
            .map_err(|_| format!("binding `{binding}` is not a number in `{line}`"))?;
        bindings.push((binding, rest.trim_start().starts_with("readonly ")));
    }
    Ok(bindings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_bindings_read_access() {
        let src = "layout(std430, binding = 0) readonly buffer P { uint p[]; };\n\
                   layout(std430, binding=2) writeonly buffer O { float o[]; };\n\
                   layout(local_size_x = 128) in;\n\
                   layout(std430, binding = 1) buffer X { float x[]; };";
        assert_eq!(storage_bindings(src).unwrap(), [(0, true), (2, false), (1, false)]);
        assert!(storage_bindings("layout(std430) buffer P { uint p[]; };").is_err());
        assert!(storage_bindings("layout(std430, binding = x) buffer P { uint p[]; };").is_err());
    }
}
