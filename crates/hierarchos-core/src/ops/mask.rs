//! Triangular masks of matrices: `triu` and `tril` (causal attention masks, triangular factors).

use crate::autograd::{Node, grad_enabled};
use crate::error::{Error, Result};
use crate::ops::map::Map;
use crate::tensor::Tensor;

impl Tensor {
    /// Keeps the elements on and above diagonal `k` of the last two dimensions (`col - row >= k`), zeroing the
    /// rest, like `torch.triu`.
    pub fn triu(&self, k: i64) -> Result<Tensor> {
        self.triangle("triu", k, true)
    }

    /// Keeps the elements on and below diagonal `k` of the last two dimensions (`col - row <= k`), zeroing the
    /// rest, like `torch.tril`.
    pub fn tril(&self, k: i64) -> Result<Tensor> {
        self.triangle("tril", k, false)
    }

    fn triangle(&self, op: &'static str, k: i64, upper: bool) -> Result<Tensor> {
        if self.rank() < 2 {
            return Err(Error::RankMismatch {
                op,
                expected: ">= 2".into(),
                got: self.shape().to_vec(),
            });
        }
        let zero = match self.dtype().compute_type() {
            "f32" => "0.0",
            "i32" => "0",
            _ => "0u",
        };
        let cmp = if upper { ">=" } else { "<=" };
        let body = format!(
            "let r = i32(out_coord(i, p[1] - 2u)); let c = i32(out_coord(i, p[1] - 1u));\n\
             \x20   return select({zero}, x0, (c - r {cmp} bitcast<i32>(extra_u32(0u))));"
        );
        let mut map = Map::elementwise(op, &[self], self.dtype(), body)?;
        map.extras.push(k.clamp(i32::MIN as i64, i32::MAX as i64) as i32 as u32);
        let out = map.run()?;
        if !grad_enabled() || !self.requires_grad() {
            return Ok(out);
        }
        let node = Node::record(
            op,
            &[self],
            Box::new(move |g| Ok(vec![Some(g.triangle(op, k, upper)?)])),
        );
        Ok(out.with_node(node))
    }
}
