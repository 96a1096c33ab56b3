//! Rotary position embedding in one kernel: each output element reads its own input element and the partner
//! half a head away, so applying RoPE costs one dispatch instead of the slices, products and concatenation of
//! `x * cos + rotate_half(x) * sin`.

use crate::autograd::{Node, grad_enabled};
use crate::error::{Error, Result};
use crate::ops::map::Map;
use crate::tensor::Tensor;

impl Tensor {
    /// Rotates the pairs `(j, j + D/2)` of the last dimension (size `D`) by the angles whose cosines and sines are
    /// `cos` and `sin`: `x * cos + rotate_half(x) * sin` with the half-split convention of Hugging Face's Llama
    /// (not interleaved pairs). `cos` and `sin` hold the `D/2` distinct values per position and broadcast to
    /// `x.shape[..-1] + [D/2]`. They are constants of the position: gradients flow to `x` only, so `cos` and
    /// `sin` must not require grad.
    pub fn rope(&self, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
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
        // cos/sin are read at coordinate j of the full head; the kernel steps back half a head for j >= D/2.
        let widen = |t: &Tensor| -> Result<_> {
            let mut l = t.layout().broadcast_to(OP, &half_shape)?;
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
        let out = Map {
            op: OP,
            inputs: vec![(self, self.layout().clone()), (cos, lc), (sin, ls)],
            shape: self.shape().to_vec(),
            dtype: self.dtype(),
            body: body.into(),
            preload: false,
            extras,
        }
        .run()?;
        if !grad_enabled() || !self.requires_grad() {
            return Ok(out);
        }
        let (cos, sin) = (cos.detach(), sin.detach());
        let node = Node::record(
            OP,
            &[self],
            // The rotation is orthogonal: its adjoint rotates by the opposite angles.
            Box::new(move |g| Ok(vec![Some(g.rope(&cos, &sin.neg()?)?)])),
        );
        Ok(out.with_node(node))
    }
}
