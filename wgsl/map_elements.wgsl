// Words of the map kernel (map.wgsl) holding one element, or two of a packed 16-bit output: Word is
// vec2<COMPUTE>, and the Rust side defines `compute(i)`, element i.

fn word(w: u32, n: u32) -> Word {
    let i0 = w * EPW;
    let v0 = compute(i0);
    var v1 = v0;
    if (EPW == 2u) {
        if (i0 + 1u < n) {
            v1 = compute(i0 + 1u);
        } else {
            // The last word of an odd count: its other half may be the next element of a larger tensor that
            // the output is a view of, so it is written back unchanged.
            v1 = load_out(2u * (p[OUT_AT] + w) + 1u);
        }
    }
    return Word(v0, v1);
}

fn store_word(w: u32, v: Word) {
    store_out(w, v.x, v.y);
}
