// Shared by the flash-attention kernels (ops/flash_attention.rs): parameters, views and the visible ranges.
//
// Parameters (u32 words): [B, H, T, S, group (H / KVH), q_start, k_start, window (0: none), D,
// q offset, q strides (b, h, t, d), k offset, k strides (b, kvh, s, d), v offset, v strides (b, kvh, s, d),
// whether dq, and dk with dv, are stored token-major (read by the tensor-core kernels only), the element offsets
// of the rotary tables cos_q, sin_q, cos_k, sin_k (flash_attention_rotary.wgsl; zeros without them), then for
// the backward the views the gradients dq, dk and dv are stored through (offset, strides along b, head, pos, d;
// rows dense along d)].
// The Rust side defines D4 (quads per head row, D rounded up to 4) and the tile constants of each kernel (BR
// and BC for the forward; R, TILE, M and STAGED for the tiled backward kernels; G, QM, QS, ROWS, STREAM,
// STAGED and UNROLL for the row kernels; see their files), and repeats every block
// between `//@FOR x N` and its `//@END` N times (N one of those constants; blocks nest), with `@x` set to 0, 1,
// ... in each copy: per-thread rows and tiles are separate variables (`acc@i`), which drivers keep in registers
// where arrays indexed in loops land in slow local memory. It also defines load_NAME(base, c) for every
// head-row binding read (quad c of the row at element offset `base`: through the view's stride along d for q,
// k and v, dense otherwise; zeros past D) and store_NAME(base, c, x) for every one written.
//
// Visibility, as in attention_decode.wgsl: key j (position k_start + j) is seen by query t (position q_start + t)
// iff kpos <= qpos and, with a window w > 0, kpos + w > qpos. The Rust side guarantees every query sees a key.

const Q_AT: u32 = 9u;
const K_AT: u32 = 14u;
const V_AT: u32 = 19u;
const ROPE_AT: u32 = 26u;
const DQ_AT: u32 = 30u;
const DK_AT: u32 = 35u;
const DV_AT: u32 = 40u;

// Element offset of row (b, head, pos) of the view whose offset and strides start at p[at].
fn view_base(at: u32, b: u32, head: u32, pos: u32) -> u32 {
    return p[at] + b * p[at + 1u] + head * p[at + 2u] + pos * p[at + 3u];
}

// The first query row of block `block` of `rows` query rows: blocks of later rows see more keys, so they take the
// lowest numbers and launch first (see ops/flash_attention.rs, `launch`).
fn query_block_start(block: u32, rows: u32) -> u32 {
    return ((p[2] + rows - 1u) / rows - 1u - block) * rows;
}

// The keys query `t` sees: [first, end).
fn keys_seen(t: u32) -> vec2<u32> {
    let qpos = p[5] + t;
    let end = min(p[3], qpos + 1u - p[6]);
    var first = 0u;
    if (p[7] > 0u && qpos + 1u > p[7] + p[6]) {
        first = qpos + 1u - p[7] - p[6];
    }
    return vec2<u32>(first, end);
}

// The queries key `j` is seen by: [first, end).
fn queries_seeing(j: u32) -> vec2<u32> {
    let kpos = p[6] + j;
    var first = 0u;
    if (kpos > p[5]) {
        first = min(p[2], kpos - p[5]);
    }
    var end = p[2];
    if (p[7] > 0u) {
        // The window's end saturates at the last position: no query lies there (checked on the Rust side).
        end = min(p[2], max(kpos + min(p[7], 0xffffffffu - kpos), p[5]) - p[5]);
    }
    return vec2<u32>(first, max(first, end));
}

// Whether x lies in [range.x, range.y): a pair's visibility, tested against a row's precomputed range.
fn within(x: u32, range: vec2<u32>) -> bool {
    return x >= range.x && x < range.y;
}

// Whether query i (of the T) sees key j (of the S).
fn visible(i: u32, j: u32) -> bool {
    let qpos = p[5] + i;
    let kpos = p[6] + j;
    return i < p[2] && j < p[3] && kpos <= qpos && (p[7] == 0u || qpos - kpos < p[7]);
}
