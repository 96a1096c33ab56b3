// Elementwise "map" kernel template: each thread computes WPT output words (one element each, or two for packed
// 16-bit outputs), 256 words apart, from strided inputs. The Rust side prepends bindings, load/store functions,
// `compute` and its type COMPUTE, `strided_offset`, and WPT. A thread issues all its loads before its stores, so
// that it keeps several loads in flight.
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

// Output word `w`: one element, or two for packed 16-bit outputs.
fn word(w: u32, n: u32) -> vec2<COMPUTE> {
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
    return vec2<COMPUTE>(v0, v1);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let first = (wid.x + wid.y * nwg.x) * (256u * WPT) + lid;
    let n = p[0];
    let words = (n + EPW - 1u) / EPW;
    var v: array<vec2<COMPUTE>, WPT>;
    for (var k = 0u; k < WPT; k = k + 1u) {
        let w = first + 256u * k;
        if (w < words) {
            v[k] = word(w, n);
        }
    }
    for (var k = 0u; k < WPT; k = k + 1u) {
        let w = first + 256u * k;
        if (w < words) {
            store_out(p[OUT_AT] + w, v[k].x, v[k].y);
        }
    }
}
