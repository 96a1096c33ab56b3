// Shared by the row kernels of flash attention's backward (ops/flash_attention.rs): a workgroup of THREADS = ROWS G
// threads, and the rows of the other side streamed in tiles of STREAM rows through two buffers of workgroup memory
// (stream_a, stream_b: q and dout for the key/value kernel, k and v for the query kernel), each row padded to QS
// quads. Each kernel defines stream_quads(row, c, b, head), quad c of its two streamed rows `row`.

const THREADS: u32 = ROWS * G;

var<workgroup> stream_a: array<vec4<f32>, 2u * STREAM * QS>;
var<workgroup> stream_b: array<vec4<f32>, 2u * STREAM * QS>;

// The two quads of staged quad x of the tile of rows from r0 of sequence b, head `head` (zeros at or past `end`,
// past D and past the tile). The kernels fetch the tile they stream one round ahead, so that its loads are in
// flight while the current tile is used: addresses clamped into the rows (to row 0 when there are none: keys
// that no query sees), loads never skipped.
fn fetch_stream(x: u32, r0: u32, end: u32, b: u32, head: u32) -> array<vec4<f32>, 2> {
    let r = min(r0 + x / QS, max(end, 1u) - 1u);
    let c = min(x % QS, D4 - 1u);
    let live = r0 + x / QS < end && x % QS < D4 && x < STREAM * QS;
    let f = stream_quads(r, c, b, head);
    return array<vec4<f32>, 2>(select(vec4<f32>(0.0), f[0], live), select(vec4<f32>(0.0), f[1], live));
}

// Puts fetched quad x into buffer `buf`.
fn put_stream(buf: u32, x: u32, f: array<vec4<f32>, 2>) {
    if (x < STREAM * QS) {
        stream_a[buf * STREAM * QS + x] = f[0];
        stream_b[buf * STREAM * QS + x] = f[1];
    }
}
