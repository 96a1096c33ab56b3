//! Rotary position embedding in one kernel: each output element reads its own input element and the partner
//! half a head away, so applying RoPE costs one dispatch instead of the slices, products and concatenation of
//! `x * cos + rotate_half(x) * sin`.

use std::sync::Arc;

use hierarchos_wgpu::{DType, Dispatch, Gpu, Language};

use crate::autograd::{Node, grad_enabled};
use crate::error::{Error, Result};
use crate::ops::attention::token_major;
use crate::ops::map::Map;
use crate::tensor::{Device, Tensor};

impl Tensor {
    /// Rotates the pairs `(j, j + D/2)` of the last dimension (size `D`) by the angles whose cosines and sines are
    /// `cos` and `sin`: `x * cos + rotate_half(x) * sin` with the half-split convention of Hugging Face's Llama
    /// (not interleaved pairs). `cos` and `sin` hold the `D/2` distinct values per position and broadcast to
    /// `x.shape[..-1] + [D/2]`. They are constants of the position: gradients flow to `x` only, so `cos` and
    /// `sin` must not require grad.
    pub fn rope(&self, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        self.rotate(cos, sin, false)
    }

    /// [`Tensor::rope`], or with `inverse` the rotation by the opposite angles (its backward).
    fn rotate(&self, cos: &Tensor, sin: &Tensor, inverse: bool) -> Result<Tensor> {
        const OP: &str = "rope";
        for t in [self, cos, sin] {
            if !t.dtype().is_float() {
                return Err(Error::DTypeMismatch {
                    op: OP,
                    expected: "a float dtype".into(),
                    got: t.dtype(),
                });
            }
        }
        let Some(&d) = self.shape().last() else {
            return Err(Error::RankMismatch {
                op: OP,
                expected: ">= 1".into(),
                got: vec![],
            });
        };
        if !d.is_multiple_of(2) {
            return Err(Error::Invalid {
                op: OP,
                message: format!("the last dimension of {:?} is odd", self.shape()),
            });
        }
        if grad_enabled() && (cos.requires_grad() || sin.requires_grad()) {
            return Err(Error::Invalid {
                op: OP,
                message: "cos and sin are not differentiated; detach them".into(),
            });
        }
        let half = d / 2;
        let mut half_shape = self.shape().to_vec();
        half_shape[self.rank() - 1] = half;
        let out = match self.rope_pairs(cos, sin, &half_shape, inverse)? {
            Some(out) => out,
            None if inverse => self.rope_elementwise(cos, &sin.neg()?, &half_shape)?,
            None => self.rope_elementwise(cos, sin, &half_shape)?,
        };
        if !grad_enabled() || !self.requires_grad() {
            return Ok(out);
        }
        let (cos, sin) = (cos.detach(), sin.detach());
        let node = Node::record(
            OP,
            &[self],
            // The rotation is orthogonal: its adjoint rotates by the opposite angles.
            Box::new(move |g| Ok(vec![Some(g.rotate(&cos, &sin, !inverse)?)])),
        );
        Ok(out.with_node(node))
    }

    /// [`Tensor::rope`] in the pair kernel (one thread per rotated pair, or per four) for f32 tensors of rank 1 to
    /// 4 with tables broadcast to `half_shape`; `None` for the rest, which take the elementwise form. Training
    /// applies RoPE to every layer's queries and keys forward and backward, where the elementwise form spent most
    /// of its time computing strided coordinates for every element.
    fn rope_pairs(&self, cos: &Tensor, sin: &Tensor, half_shape: &[usize], inverse: bool) -> Result<Option<Tensor>> {
        const OP: &str = "rope";
        let r = self.rank();
        if [self, cos, sin].iter().any(|t| t.dtype() != DType::F32) || r > 4 || self.numel() == 0 {
            return Ok(None);
        }
        // Views padded to rank 4 with leading dimensions of size 1.
        let padded = |l: &crate::shape::Layout| {
            let mut words = vec![l.offset as u32];
            words.extend(std::iter::repeat_n(0, 4 - r));
            words.extend(l.strides.iter().map(|&s| s as u32));
            words
        };
        let mut lead = vec![1usize; 4 - r];
        lead.extend(&self.shape()[..r - 1]);
        let half = half_shape[r - 1];
        let cos_layout = cos.layout().broadcast_to(OP, half_shape)?;
        let sin_layout = sin.layout().broadcast_to(OP, half_shape)?;
        // Four pairs a thread where every row starts on a vec4 and its pairs lie at unit stride.
        let quads = [self.layout(), &cos_layout, &sin_layout]
            .iter()
            .all(|l| l.rows_of_vec4s());
        let w = if half.is_multiple_of(4) && quads { 4 } else { 1 };
        let mut params = vec![
            (self.numel() / 2 / w) as u32,
            half as u32,
            lead[1] as u32,
            lead[2] as u32,
        ];
        params.extend(padded(self.layout()));
        params.extend(padded(&cos_layout));
        params.extend(padded(&sin_layout));
        // Queries and keys are views of `[B, T, H, D]` projections seen as `[B, H, T, D]`: the rotated tensor keeps
        // that order (and so do the attention gradients it is fed back), so that the projections' backward
        // reshapes the gradient without a copy. Other inputs come out dense.
        let keep_order = token_major(self);
        let d = 2 * half;
        let (s1, s2) = (lead[1], lead[2]);
        params.extend(match keep_order {
            true => [(s1 * s2 * d) as u32, d as u32, (s1 * d) as u32],
            false => [(s1 * s2 * d) as u32, (s2 * d) as u32, d as u32],
        });
        params.push(if inverse { -1f32 } else { 1f32 }.to_bits());
        let device = self.device();
        let out = device.alloc(OP, Tensor::bytes_for(self.numel(), DType::F32))?;
        device.dispatch(Dispatch {
            op: OP,
            runtime_checks: false,
            language: Language::Wgsl,
            key: &format!("rope_pairs:{w}"),
            source: &|| {
                let word = if w == 4 { "vec4<f32>" } else { "f32" };
                format!("alias Word = {word};\nconst W: u32 = {w}u;\n{ROPE_PAIRS_WGSL}")
            },
            buffers: &[&out, self.buffer(), cos.buffer(), sin.buffer()],
            params: &params,
            workgroups: Gpu::grid((self.numel() / 2 / w).div_ceil(256) as u32),
        })?;
        Ok(Some(match keep_order {
            true => {
                let sh = self.shape();
                Tensor::from_buffer(out, &[sh[0], sh[2], sh[1], sh[3]], DType::F32, None).permute(&[0, 2, 1, 3])?
            }
            false => Tensor::from_buffer(out, self.shape(), DType::F32, None),
        }))
    }

    /// [`Tensor::rope`] as an elementwise map over any dtypes and ranks: each output element reads its own input
    /// element and its partner half a head away.
    fn rope_elementwise(&self, cos: &Tensor, sin: &Tensor, half_shape: &[usize]) -> Result<Tensor> {
        const OP: &str = "rope";
        let half = half_shape[self.rank() - 1];
        // cos/sin are read at coordinate j of the full head; the kernel steps back half a head for j >= D/2.
        let widen = |t: &Tensor| -> Result<_> {
            let mut l = t.layout().broadcast_to(OP, half_shape)?;
            l.shape = self.shape().to_vec();
            Ok(l)
        };
        let last_stride = |l: &crate::shape::Layout| l.strides.last().copied().unwrap_or(0) as u32;
        let (lc, ls) = (widen(cos)?, widen(sin)?);
        let extras = vec![
            half as u32,
            last_stride(self.layout()),
            last_stride(&lc),
            last_stride(&ls),
        ];
        let body = "let j = out_coord(i, p[1] - 1u);
    let h = extra_u32(0u);
    let xo = strided_offset(0u, i);
    let co = strided_offset(1u, i);
    let so = strided_offset(2u, i);
    if (j < h) {
        return load_in0(xo) * load_in1(co) - load_in0(xo + h * extra_u32(1u)) * load_in2(so);
    }
    return load_in0(xo) * load_in1(co - h * extra_u32(2u)) + load_in0(xo - h * extra_u32(1u)) * load_in2(so - h * extra_u32(3u));";
        Map {
            op: OP,
            inputs: vec![(self, self.layout().clone()), (cos, lc), (sin, ls)],
            shape: self.shape().to_vec(),
            dtype: self.dtype(),
            body: body.into(),
            preload: false,
            extras,
            quad_body: None,
        }
        .run()
    }
}

const ROPE_PAIRS_WGSL: &str = include_str!("../../../../wgsl/rope_pairs.wgsl");
const ROPE_CACHE_WGSL: &str = include_str!("../../../../wgsl/rope_cache.wgsl");
/// Storage buffers the fused rotary and cache kernel binds: parameters, output, q, k, v, two caches, four tables.
const ROPE_CACHE_BINDINGS: u32 = 11;

/// The rotary tables of one attention step: cosines and sines `[T, D/2]` for queries (usually carrying the
/// score scale) and for keys.
#[derive(Clone, Copy, Debug)]
pub struct RopeTables<'a> {
    /// Query cosines.
    pub cos_q: &'a Tensor,
    /// Query sines.
    pub sin_q: &'a Tensor,
    /// Key cosines.
    pub cos_k: &'a Tensor,
    /// Key sines.
    pub sin_k: &'a Tensor,
}

impl Tensor {
    /// Whether `device` binds as many storage buffers per kernel as [`Tensor::rope_into_cache`] needs (browsers
    /// offer 8 to 10; callers then use [`Tensor::rope`] and [`Tensor::write_at`]).
    pub fn rope_into_cache_fits(device: &Device) -> bool {
        device.limits().max_storage_buffers_per_shader_stage >= ROPE_CACHE_BINDINGS
    }

    /// One inference step's rotary and cache update in a single launch (decode is bound by launches): returns
    /// the queries `self` (`[B, T, H, D]`, any layout) rotated by the query tables as a dense `[B, H, T, D]`
    /// tensor, rotates the keys `k` (`[B, T, KVH, D]`) into `k_cache` and copies the values `v` into `v_cache`
    /// (the cache regions of the new positions, `[B, KVH, T, D]` views). The same arithmetic as [`Tensor::rope`]
    /// and [`Tensor::write_at`]. Everything is f32; not differentiable (a cache holds values, not history).
    pub fn rope_into_cache(
        &self,
        k: &Tensor,
        v: &Tensor,
        tables: RopeTables<'_>,
        k_cache: &Tensor,
        v_cache: &Tensor,
    ) -> Result<Tensor> {
        const OP: &str = "rope_into_cache";
        let q = self;
        let all = [
            q,
            k,
            v,
            tables.cos_q,
            tables.sin_q,
            tables.cos_k,
            tables.sin_k,
            k_cache,
            v_cache,
        ];
        if let Some(t) = all.iter().find(|t| t.dtype() != DType::F32) {
            return Err(Error::DTypeMismatch {
                op: OP,
                expected: "f32".into(),
                got: t.dtype(),
            });
        }
        if grad_enabled() && [q, k, v].iter().any(|t| t.requires_grad()) {
            return Err(Error::Invalid {
                op: OP,
                message: "the fused rotary and cache update is for inference; use rope and write_at to train".into(),
            });
        }
        let bad = || Error::Invalid {
            op: OP,
            message: format!(
                "queries {:?}, keys {:?}, values {:?}, tables {:?}, caches {:?} / {:?} do not fit \
                 ([B, T, H, D], [B, T, KVH, D] twice, [T, D/2] four times, [B, KVH, T, D] twice, D even)",
                q.shape(),
                k.shape(),
                v.shape(),
                tables.cos_q.shape(),
                k_cache.shape(),
                v_cache.shape()
            ),
        };
        if q.rank() != 4 || k.rank() != 4 || v.shape() != k.shape() {
            return Err(bad());
        }
        let [b, t, h, d] = [q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]];
        let kvh = k.shape()[2];
        if k.shape()[0] != b || k.shape()[1] != t || k.shape()[3] != d || !d.is_multiple_of(2) {
            return Err(bad());
        }
        let table = [t, d / 2];
        let cache = [b, kvh, t, d];
        let tabs = [tables.cos_q, tables.sin_q, tables.cos_k, tables.sin_k];
        if tabs.iter().any(|x| x.shape() != table) || k_cache.shape() != cache || v_cache.shape() != cache {
            return Err(bad());
        }
        if std::ptr::eq(k_cache.buffer(), v_cache.buffer()) {
            return Err(Error::Invalid {
                op: OP,
                message: "keys and values must be cached in different buffers".into(),
            });
        }
        let device = q.device().clone();
        if all.iter().any(|x| !Arc::ptr_eq(x.device(), &device)) {
            return Err(Error::Invalid {
                op: OP,
                message: "operands live on different devices".into(),
            });
        }
        let n = b * t * (h + 2 * kvh) * d;
        if n == 0 {
            return Tensor::zeros(&[b, h, t, d], DType::F32, &device);
        }
        if !Tensor::rope_into_cache_fits(&device) {
            return Err(Error::Invalid {
                op: OP,
                message: format!(
                    "the device binds {} storage buffers per kernel, the fused kernel {ROPE_CACHE_BINDINGS} (use \
                     rope and write_at)",
                    device.limits().max_storage_buffers_per_shader_stage
                ),
            });
        }
        // Every element is written by the kernel: no clearing (which would also end the open compute pass).
        let out = Tensor::from_buffer(
            device.alloc(OP, Tensor::bytes_for(b * h * t * d, DType::F32))?,
            &[b, h, t, d],
            DType::F32,
            None,
        );
        let mut params = vec![b as u32, t as u32, h as u32, kvh as u32, d as u32, n as u32];
        for x in [q, k, v, k_cache, v_cache] {
            params.push(x.layout().offset as u32);
            params.extend(x.layout().strides.iter().map(|&s| s as u32));
        }
        for x in tabs {
            params.push(x.layout().offset as u32);
            params.extend(x.layout().strides.iter().map(|&s| s as u32));
        }
        let source = || {
            let mut s = String::from("@group(0) @binding(0) var<storage, read> p: array<u32>;\n");
            let names = [
                ("out", "read_write"),
                ("q", "read"),
                ("k", "read"),
                ("v", "read"),
                ("kc", "read_write"),
                ("vc", "read_write"),
                ("cos_q", "read"),
                ("sin_q", "read"),
                ("cos_k", "read"),
                ("sin_k", "read"),
            ];
            for (i, (name, access)) in names.iter().enumerate() {
                s.push_str(&format!(
                    "@group(0) @binding({}) var<storage, {access}> {name}: array<f32>;\n",
                    i + 1
                ));
            }
            s.push_str(ROPE_CACHE_WGSL);
            s
        };
        device.dispatch(Dispatch {
            op: OP,
            runtime_checks: false,
            language: Language::Wgsl,
            key: OP,
            source: &source,
            buffers: &[
                out.buffer(),
                q.buffer(),
                k.buffer(),
                v.buffer(),
                k_cache.buffer(),
                v_cache.buffer(),
                tables.cos_q.buffer(),
                tables.sin_q.buffer(),
                tables.cos_k.buffer(),
                tables.sin_k.buffer(),
            ],
            params: &params,
            workgroups: Gpu::grid((n as u32).div_ceil(256)),
        })?;
        Ok(out)
    }
}
