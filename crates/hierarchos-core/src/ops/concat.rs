//! Concatenation and stacking along a dimension.

use std::sync::Arc;

use crate::autograd::{Node, grad_enabled};
use crate::error::{Error, Result};
use crate::ops::map::Map;
use crate::shape::resolve_dim;
use crate::tensor::Tensor;

/// Inputs per kernel launch: params, output and four inputs stay within WebGPU's eight storage bindings.
const INPUTS_PER_KERNEL: usize = 4;

impl Tensor {
    /// Joins tensors along `dim`; all other dimensions and the dtype must match.
    pub fn cat(tensors: &[Tensor], dim: isize) -> Result<Tensor> {
        let first = tensors.first().ok_or_else(|| Error::Invalid {
            op: "cat",
            message: "no tensors given".into(),
        })?;
        let d = resolve_dim("cat", dim, first.rank())?;
        for t in tensors {
            if t.dtype() != first.dtype() {
                return Err(Error::DTypeMismatch {
                    op: "cat",
                    expected: first.dtype().to_string(),
                    got: t.dtype(),
                });
            }
            let same = t.rank() == first.rank() && (0..t.rank()).all(|k| k == d || t.shape()[k] == first.shape()[k]);
            if !same {
                return Err(Error::ShapeMismatch {
                    op: "cat",
                    lhs: first.shape().to_vec(),
                    rhs: t.shape().to_vec(),
                });
            }
        }
        if tensors.len() == 1 {
            return Ok(tensors[0].clone());
        }
        if tensors.len() > INPUTS_PER_KERNEL {
            let parts = tensors
                .chunks(INPUTS_PER_KERNEL)
                .map(|c| Tensor::cat(c, dim))
                .collect::<Result<Vec<_>>>()?;
            return Tensor::cat(&parts, dim);
        }
        let mut shape = first.shape().to_vec();
        shape[d] = tensors.iter().map(|t| t.shape()[d]).sum();
        // Each input is read through a layout with the output's shape, shifted back by its start along `d`, so
        // output coordinate c maps to input coordinate c - start.
        let mut inputs = Vec::new();
        let mut ends = vec![d as u32];
        let mut start = 0usize;
        for t in tensors {
            inputs.push((t, t.layout().shifted(&shape, d, -(start as isize))));
            start += t.shape()[d];
            ends.push(start as u32);
        }
        // Element i (load_in{k}), or on quads elements i..i + 4 (load_in{k}4), from the input whose
        // columns along d hold it. Quads never straddle two inputs when each input's width along the last
        // dimension is a multiple of 4, or when the inputs meet along another dimension.
        let body = |suffix: &str| {
            let mut body = String::from("let c = out_coord(i, extra_u32(0u));\n");
            for k in 0..inputs.len() - 1 {
                body += &format!(
                    "    if (c < extra_u32({}u)) {{ return load_in{k}{suffix}(strided_offset({k}u, i)); }}\n",
                    k + 1
                );
            }
            let k = inputs.len() - 1;
            body + &format!("    return load_in{k}{suffix}(strided_offset({k}u, i));")
        };
        let (plain, quad) = (body(""), body("4"));
        let last = d + 1 == shape.len();
        let quads = !last || tensors.iter().all(|t| t.shape()[d].is_multiple_of(4));
        let map = Map {
            op: "cat",
            inputs,
            shape,
            dtype: first.dtype(),
            body: plain,
            preload: false,
            extras: ends,
            quad_body: quads.then_some(quad),
        };
        Ok(record_cat(map.run()?, tensors, d))
    }

    /// `tensors` joined along `dim` without a copy, when they already lie back to back in one buffer (the
    /// projections of a stacked layer, each a view of it): a view of that storage whose gradient reaches each
    /// input as [`Tensor::cat`]'s does, so that training runs one product over the joined weights. Writing into
    /// it writes into the inputs. `None` when they do not lie so.
    pub fn cat_view(tensors: &[Tensor], dim: isize) -> Result<Option<Tensor>> {
        let Some(first) = tensors.first() else {
            return Ok(None);
        };
        let d = resolve_dim("cat", dim, first.rank())?;
        let l = first.layout();
        let mut start = 0;
        for t in tensors {
            let m = t.layout();
            let adjacent = Arc::ptr_eq(t.shared_buffer(), first.shared_buffer())
                && t.dtype() == first.dtype()
                && m.strides == l.strides
                && (0..t.rank()).all(|k| k == d || m.shape[k] == l.shape[k])
                && m.offset == l.offset + start * l.strides[d];
            if !adjacent {
                return Ok(None);
            }
            start += m.shape[d];
        }
        let mut layout = l.clone();
        layout.shape[d] = start;
        Ok(Some(record_cat(first.with_layout(layout), tensors, d)))
    }

    /// Stacks equally shaped tensors along a new dimension `dim`.
    pub fn stack(tensors: &[Tensor], dim: isize) -> Result<Tensor> {
        let first = tensors.first().ok_or_else(|| Error::Invalid {
            op: "stack",
            message: "no tensors given".into(),
        })?;
        let d = resolve_dim("stack", dim, first.rank() + 1)? as isize;
        let parts = tensors.iter().map(|t| t.unsqueeze(d)).collect::<Result<Vec<_>>>()?;
        Tensor::cat(&parts, d)
    }
}

/// `out`, the concatenation of `tensors` along `d`, recorded so that each input's gradient is its slice of
/// `out`'s.
fn record_cat(out: Tensor, tensors: &[Tensor], d: usize) -> Tensor {
    if !grad_enabled() || !tensors.iter().any(Tensor::requires_grad) {
        return out;
    }
    let sizes: Vec<usize> = tensors.iter().map(|t| t.shape()[d]).collect();
    let refs: Vec<&Tensor> = tensors.iter().collect();
    let node = Node::record(
        "cat",
        &refs,
        Box::new(move |g| {
            let mut start = 0;
            let mut grads = Vec::new();
            for &n in &sizes {
                grads.push(Some(g.narrow(d as isize, start, n)?.contiguous()?));
                start += n;
            }
            Ok(grads)
        }),
    );
    out.with_node(node)
}
