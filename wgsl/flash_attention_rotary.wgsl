// Rotary position embedding inside the flash-attention kernels (ops/flash_attention.rs), so that training runs
// no rotary kernels and no copies around attention: the forward reads queries and keys unrotated from the
// projection, rotates them as it loads them and keeps the rotated rows, with the values, for the backward
// (`kept`, [B, T, H + 2 KVH, D]: query heads, then key heads, then value heads); the backward reads those and
// rotates the query and key gradients back as it stores them. The same arithmetic as rope_pairs.wgsl: the pair
// (j, j + D/2) of a head row becomes (x_j cos_j - x_{j+D/2} sin_j, x_{j+D/2} cos_j + x_j sin_j), and the
// gradients take the sines times -1.
//
// The Rust side binds the tables cos_q, sin_q (rows of the queries) and cos_k, sin_k (rows of the keys), each
// [rows, D/2] dense from the element offset in p[ROPE_AT ..], as arrays of vec4s (D is a multiple of 8, so
// that a quad and its partner D4 / 2 quads away hold whole pairs).

// Quad c (< D4) of a row rotated by the cosine quad `cs` and sine quad `sn` of its position, from the row's quad c
// and the quad it pairs with.
fn rotate_quad(c: u32, x: vec4<f32>, partner: vec4<f32>, cs: vec4<f32>, sn: vec4<f32>) -> vec4<f32> {
    if (c < D4 / 2u) {
        return x * cs - partner * sn;
    }
    return x * cs + partner * sn;
}

// Where quad c's cosines (or sines) lie in row `row` of the table whose offset is p[at].
fn table_at(at: u32, row: u32, c: u32) -> u32 {
    return (p[at] + row * (p[8] / 2u)) / 4u + c % (D4 / 2u);
}

// Quad c of query row t of batch b, head h, rotated.
fn rotated_query(b: u32, h: u32, t: u32, c: u32) -> vec4<f32> {
    let base = view_base(Q_AT, b, h, t);
    let cs = cos_q[table_at(ROPE_AT, t, c)];
    let sn = sin_q[table_at(ROPE_AT + 1u, t, c)];
    return rotate_quad(c, load_q(base, c), load_q(base, (c + D4 / 2u) % D4), cs, sn);
}

// Quad c of key row j of batch b, key/value head kh, rotated.
fn rotated_key(b: u32, kh: u32, j: u32, c: u32) -> vec4<f32> {
    let base = view_base(K_AT, b, kh, j);
    let cs = cos_k[table_at(ROPE_AT + 2u, j, c)];
    let sn = sin_k[table_at(ROPE_AT + 3u, j, c)];
    return rotate_quad(c, load_k(base, c), load_k(base, (c + D4 / 2u) % D4), cs, sn);
}

// Quad c of query row t's gradient from `x`, that of the rotated row, and `partner`, its quad c ± D4 / 2:
// rotating back is the rotation's adjoint, the same cosines with the sines negated.
fn query_back(t: u32, c: u32, x: vec4<f32>, partner: vec4<f32>) -> vec4<f32> {
    let cs = cos_q[table_at(ROPE_AT, t, c)];
    let sn = sin_q[table_at(ROPE_AT + 1u, t, c)] * -1.0;
    return rotate_quad(c, x, partner, cs, sn);
}

// Quad c of key row j's gradient, as query_back.
fn key_back(j: u32, c: u32, x: vec4<f32>, partner: vec4<f32>) -> vec4<f32> {
    let cs = cos_k[table_at(ROPE_AT + 2u, j, c)];
    let sn = sin_k[table_at(ROPE_AT + 3u, j, c)] * -1.0;
    return rotate_quad(c, x, partner, cs, sn);
}

// Where row t of head `head` (of the H + 2 KVH) of batch b starts in `kept`.
fn kept_row(b: u32, head: u32, t: u32) -> u32 {
    return ((b * p[2] + t) * (p[1] + 2u * (p[1] / p[4])) + head) * p[8];
}
