// Words of the map kernel (map.wgsl) holding four f32 elements, where the output and every input are read and
// written as quads (a row's length a multiple of 4, each row starting on a quad): Word is vec4<f32>, and the Rust
// side defines `compute4(i)`, elements i..i + 4 from one 128-bit load of each input.

fn word(w: u32, n: u32) -> Word {
    return compute4(4u * w);
}

fn store_word(w: u32, v: Word) {
    out[w] = v;
}
