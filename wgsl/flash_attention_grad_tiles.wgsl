// Shared by the two tiled backward kernels of flash attention (ops/flash_attention.rs), which work like a matrix
// product: a workgroup of 64 threads (8 x 8) holds one tile of TILE query rows (q, dout, with their lse and delta)
// and one of TILE key rows (k, v) in workgroup memory, and each thread computes R x R entries of the tile's scores
// s = q · k and output-gradient products dp = dout · v from vec4 reads, R + R rows read for R * R dot products.
// From them, p = exp(s - lse) (zero where the key is hidden) and ds = p (dp - delta) go to workgroup memory, where
// the kernel's second half multiplies them into its gradients. Rows are padded by one vec4 (and score rows by one
// element) so that the eight threads of a row of the layout read or write distinct banks.
//
// The Rust side defines R (2, or 1 where those tiles do not fit the workgroup memory), TILE = 8R, M = ceil(D4 / 8), the
// head-row quads ty, ty + 8, ... each thread accumulates in the second half, and STAGED = ceil(TILE * D4 / 64),
// the quads of a tile each thread stages (quads lid, lid + 64, ...); each kernel defines
// SCORES_KEY_MAJOR, the layout its second half reads the scores in.

const RS: u32 = D4 + 1u;
const PS: u32 = TILE + 1u;

var<workgroup> q_s: array<vec4<f32>, TILE * RS>;
var<workgroup> g_s: array<vec4<f32>, TILE * RS>;
var<workgroup> k_s: array<vec4<f32>, TILE * RS>;
var<workgroup> v_s: array<vec4<f32>, TILE * RS>;
var<workgroup> p_s: array<f32, TILE * PS>;
var<workgroup> ds_s: array<f32, TILE * PS>;
var<workgroup> lse_s: array<f32, TILE>;
var<workgroup> delta_s: array<f32, TILE>;

// The q and dout quads of quad x of the tile of query rows from i0, of batch b, head h (zeros at or past `end` and
// past the tile). The kernels fetch the tile they stream one round ahead, so that its loads are in flight while
// the current tile is multiplied, and put it into workgroup memory the next round. Straight-line code: addresses
// are clamped into the rows (to row 0 when there are none), loads are never skipped, the unwanted ones are zeroed.
fn fetch_query(x: u32, i0: u32, end: u32, b: u32, h: u32) -> array<vec4<f32>, 2> {
    let i = min(i0 + x / D4, max(end, 1u) - 1u);
    let c = x % D4;
    let live = i0 + x / D4 < end && x < TILE * D4;
    let q = query_quad(b, h, i, c);
    let g = load_dout(((b * p[2] + i) * p[1] + h) * p[8], c);
    return array<vec4<f32>, 2>(select(vec4<f32>(0.0), q, live), select(vec4<f32>(0.0), g, live));
}

fn put_query(x: u32, f: array<vec4<f32>, 2>) {
    if (x < TILE * D4) {
        q_s[x / D4 * RS + x % D4] = f[0];
        g_s[x / D4 * RS + x % D4] = f[1];
    }
}

// The k and v quads of quad x of the tile of key rows from j0, of batch b, key/value head kh, as fetch_query.
fn fetch_key(x: u32, j0: u32, end: u32, b: u32, kh: u32) -> array<vec4<f32>, 2> {
    let j = min(j0 + x / D4, max(end, 1u) - 1u);
    let c = x % D4;
    let live = j0 + x / D4 < end && x < TILE * D4;
    let k = key_quad(b, kh, j, c);
    let v = load_v(view_base(V_AT, b, kh, j), c);
    return array<vec4<f32>, 2>(select(vec4<f32>(0.0), k, live), select(vec4<f32>(0.0), v, live));
}

fn put_key(x: u32, f: array<vec4<f32>, 2>) {
    if (x < TILE * D4) {
        k_s[x / D4 * RS + x % D4] = f[0];
        v_s[x / D4 * RS + x % D4] = f[1];
    }
}

// Writes p and ds of the staged tiles (query rows from i0, key rows from j0) to p_s and ds_s: thread (ty, tx)
// takes query rows ty + 8y and key rows tx + 8x.
fn score_tile(ty: u32, tx: u32, i0: u32, j0: u32) {
    //@FOR y R
    //@FOR x R
    var s_@y_@x = 0.0;
    var dp_@y_@x = 0.0;
    //@END
    //@END
    //@FOR c D4
    {
        //@FOR y R
        let q@y = q_s[(ty + 8u * @yu) * RS + @cu];
        let g@y = g_s[(ty + 8u * @yu) * RS + @cu];
        //@END
        //@FOR x R
        let k@x = k_s[(tx + 8u * @xu) * RS + @cu];
        let v@x = v_s[(tx + 8u * @xu) * RS + @cu];
        //@FOR y R
        s_@y_@x = s_@y_@x + dot(q@y, k@x);
        dp_@y_@x = dp_@y_@x + dot(g@y, v@x);
        //@END
        //@END
    }
    //@END
    //@FOR y R
    //@FOR x R
    store_scores(ty + 8u * @yu, tx + 8u * @xu, i0, j0, s_@y_@x, dp_@y_@x);
    //@END
    //@END
}

// p and ds of staged query row r and key row c from their score s and output-gradient product dp. With
// SCORES_KEY_MAJOR, entry (r, c) is at c * PS + r, otherwise at r * PS + c.
fn store_scores(r: u32, c: u32, i0: u32, j0: u32, s: f32, dp: f32) {
    let pr = select(0.0, exp_acc(s - lse_s[r]), visible(i0 + r, j0 + c));
    var at = r * PS + c;
    if (SCORES_KEY_MAJOR) {
        at = c * PS + r;
    }
    p_s[at] = pr;
    ds_s[at] = pr * (dp - delta_s[r]);
}
