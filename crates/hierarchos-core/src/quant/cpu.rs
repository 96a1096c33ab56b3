//! The CPU dequantizers, one per block format, written after ggml's `dequantize_row_*` (same operations in the
//! same order, so the same f32 results).

use half::{bf16, f16};

use super::GgmlType;

fn half(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Plain float types, converted exactly.
pub(super) fn floats(ty: GgmlType, bytes: &[u8]) -> Vec<f32> {
    match ty {
        GgmlType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        GgmlType::F16 => bytes.chunks_exact(2).map(|c| half(c, 0)).collect(),
        GgmlType::BF16 => bytes
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        _ => unreachable!("floats() is only called for float types"),
    }
}

/// Appends the values of one block of a supported quantized type (`b` is exactly one block).
pub(super) fn dequantize_block(ty: GgmlType, b: &[u8], out: &mut Vec<f32>) {
    match ty {
        GgmlType::Q4_0 => q4(half(b, 0), None, &b[2..18], out),
        GgmlType::Q4_1 => q4(half(b, 0), Some(half(b, 2)), &b[4..20], out),
        GgmlType::Q5_0 => q5(half(b, 0), None, &b[2..6], &b[6..22], out),
        GgmlType::Q5_1 => q5(half(b, 0), Some(half(b, 2)), &b[4..8], &b[8..24], out),
        GgmlType::Q8_0 => {
            let d = half(b, 0);
            out.extend(b[2..34].iter().map(|&q| q as i8 as f32 * d));
        }
        GgmlType::Q4_K => k_quant(b, &b[16..144], None, out),
        GgmlType::Q5_K => k_quant(b, &b[48..176], Some(&b[16..48]), out),
        GgmlType::Q6_K => q6_k(b, out),
        _ => unreachable!("dequantize_block() is only called for supported quantized types"),
    }
}

/// Q4_0 (`x * d`, x in -8..8) and Q4_1 (`x * d + m`, x in 0..16): element j in the low nibble of byte j, element
/// j + 16 in its high nibble.
fn q4(d: f32, m: Option<f32>, qs: &[u8], out: &mut Vec<f32>) {
    let value = |x: u8| match m {
        None => (x as i32 - 8) as f32 * d,
        Some(m) => x as f32 * d + m,
    };
    out.extend(qs.iter().map(|&q| value(q & 0xf)));
    out.extend(qs.iter().map(|&q| value(q >> 4)));
}

/// Q5_0 / Q5_1: as Q4 with a fifth bit per element from the 32-bit `qh` (bit i for element i).
fn q5(d: f32, m: Option<f32>, qh: &[u8], qs: &[u8], out: &mut Vec<f32>) {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let value = |x: u32| match m {
        None => (x as i32 - 16) as f32 * d,
        Some(m) => x as f32 * d + m,
    };
    out.extend((0..16).map(|j| value((qs[j] & 0xf) as u32 | (((qh >> j) << 4) & 0x10))));
    out.extend((0..16).map(|j| value((qs[j] >> 4) as u32 | ((qh >> (j + 12)) & 0x10))));
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..8) packed in 12 bytes.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Q4_K and Q5_K (`qh` present): super-block scales d, dmin; 8 sub-blocks of 32 with 6-bit scales and mins;
/// each 64 elements use 32 bytes of `qs` (low nibbles first, then high) and, for Q5_K, bits 2c and 2c + 1 of `qh`.
fn k_quant(b: &[u8], qs: &[u8], qh: Option<&[u8]>, out: &mut Vec<f32>) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    let scales = &b[4..16];
    for c in 0..4 {
        let q = &qs[32 * c..32 * c + 32];
        for (sub, shift) in [(2 * c, 0), (2 * c + 1, 4)] {
            let (sc, m) = scale_min_k4(sub, scales);
            let (d1, m1) = (d * sc as f32, dmin * m as f32);
            out.extend((0..32).map(|l| {
                let high = qh.map_or(0, |h| ((h[l] >> sub) & 1) << 4);
                d1 * (((q[l] >> shift) & 0xf) + high) as f32 - m1
            }));
        }
    }
}

/// Q6_K: 6-bit quants (low 4 bits in `ql`, high 2 in `qh`) minus 32, 16 signed 8-bit scales, one f16 d.
fn q6_k(b: &[u8], out: &mut Vec<f32>) {
    let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = half(b, 208);
    let start = out.len();
    out.resize(start + 256, 0.0);
    let y = &mut out[start..];
    for n in 0..2 {
        let (ql, qh, sc, y) = (&ql[64 * n..], &qh[32 * n..], &sc[8 * n..], &mut y[128 * n..]);
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * sc[is] as i8 as f32 * q1 as f32;
            y[l + 32] = d * sc[is + 2] as i8 as f32 * q2 as f32;
            y[l + 64] = d * sc[is + 4] as i8 as f32 * q3 as f32;
            y[l + 96] = d * sc[is + 6] as i8 as f32 * q4 as f32;
        }
    }
}
