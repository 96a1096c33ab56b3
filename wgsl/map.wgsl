// Elementwise "map" kernel template: each thread computes WPT output words, 256 words apart, from strided inputs.
// A word is one element, two of a packed 16-bit output (map_elements.wgsl), or a quad of four f32 elements read
// and written as vectors (map_quads.wgsl). The Rust side prepends bindings, load/store functions, `compute` (or
// `compute4`) and its type COMPUTE, `strided_offset`, WPT, EPW (elements a word), Word and one of those two files
// with `word` and `store_word`. A thread issues all its loads before its stores, so that it keeps several loads
// in flight.
//
// Parameters (binding 0, u32 words): [numel, rank, shape[8], then per input: offset, strides[8], then the word
// where the output starts (OUT_AT), then extras].

fn out_coord(i: u32, d: u32) -> u32 {
    var rem = i;
    for (var k = p[1] - 1u; k > d; k = k - 1u) {
        rem = rem / p[2u + k];
    }
    return rem % p[2u + d];
}

// Where input k holds element i, by how it is laid out (the Rust side's `Read`, which also writes
// `strided_offset(k, i)` to pick one of these per input).
fn dense_offset(k: u32, i: u32) -> u32 {
    return p[10u + 9u * k] + i;
}

fn rows_offset(k: u32, i: u32) -> u32 {
    let base = 10u + 9u * k;
    let rank = p[1];
    let width = p[1u + rank];
    return p[base] + (i / width) * p[base + rank - 1u] + i % width;
}

fn any_offset(k: u32, i: u32) -> u32 {
    let base = 10u + 9u * k;
    return strided_index(i, p[1], 2u, base, base + 1u);
}

fn extra_f32(j: u32) -> f32 {
    return bitcast<f32>(p[EXTRA + j]);
}

fn extra_u32(j: u32) -> u32 {
    return p[EXTRA + j];
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let first = (wid.x + wid.y * nwg.x) * (256u * WPT) + lid;
    let n = p[0];
    let words = (n + EPW - 1u) / EPW;
    var v: array<Word, WPT>;
    for (var k = 0u; k < WPT; k = k + 1u) {
        let w = first + 256u * k;
        if (w < words) {
            v[k] = word(w, n);
        }
    }
    for (var k = 0u; k < WPT; k = k + 1u) {
        let w = first + 256u * k;
        if (w < words) {
            store_word(p[OUT_AT] + w, v[k]);
        }
    }
}
