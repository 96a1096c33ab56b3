//! Binary elementwise ops with NumPy broadcasting, their scalar forms, comparisons, `where` and `clamp`.

use hierarchos_wgpu::DType;

use crate::autograd::{Node, grad_enabled};
use crate::error::{Error, Result};
use crate::ops::cast::integer_range;
use crate::ops::map::Map;
use crate::tensor::Tensor;

/// A binary arithmetic function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    /// a + b
    Add,
    /// a - b
    Sub,
    /// a · b
    Mul,
    /// a / b
    Div,
    /// a^b
    Pow,
    /// max(a, b), NaN-propagating
    Maximum,
    /// min(a, b), NaN-propagating
    Minimum,
}

/// A comparison; the result is a `u32` tensor of 0 and 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpOp {
    /// a == b
    Eq,
    /// a != b
    Ne,
    /// a < b
    Lt,
    /// a <= b
    Le,
    /// a > b
    Gt,
    /// a >= b
    Ge,
}

impl BinaryOp {
    fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
        }
    }

    fn forward(self, dtype: DType) -> &'static str {
        let float = dtype.is_float();
        match self {
            BinaryOp::Add => "a + b",
            BinaryOp::Sub => "a - b",
            BinaryOp::Mul => "a * b",
            BinaryOp::Div => "a / b",
            BinaryOp::Pow => "pow_acc(a, b)",
            BinaryOp::Maximum if float => "max_nan(a, b)",
            BinaryOp::Minimum if float => "min_nan(a, b)",
            BinaryOp::Maximum => "max(a, b)",
            BinaryOp::Minimum => "min(a, b)",
        }
    }

    /// WGSL for the gradients of `a` and `b` given `g`.
    fn backward(self) -> (&'static str, &'static str) {
        match self {
            BinaryOp::Add => ("g", "g"),
            BinaryOp::Sub => ("g", "-g"),
            BinaryOp::Mul => ("g * b", "g * a"),
            BinaryOp::Div => ("g / b", "-g * a / (b * b)"),
            BinaryOp::Pow => (
                "select(g * b * pow_acc(a, b - 1.0), 0.0, b == 0.0)",
                "select(g * pow_acc(a, b) * log(a), 0.0, a == 0.0 && b >= 0.0)",
            ),
            BinaryOp::Maximum => (
                "select(select(0.0, 0.5 * g, (a == b)), g, (a > b))",
                "select(select(0.0, 0.5 * g, (a == b)), g, (b > a))",
            ),
            BinaryOp::Minimum => (
                "select(select(0.0, 0.5 * g, (a == b)), g, (a < b))",
                "select(select(0.0, 0.5 * g, (a == b)), g, (b < a))",
            ),
        }
    }

    /// For the gradient of each operand (`a`, then `b`), whether its expression above reads `a` and `b`: what
    /// the backward must keep alive (a residual `add` keeps neither of its inputs, so they can be freed).
    fn reads(self) -> [(bool, bool); 2] {
        match self {
            BinaryOp::Add | BinaryOp::Sub => [(false, false), (false, false)],
            BinaryOp::Mul => [(false, true), (true, false)],
            BinaryOp::Div => [(false, true), (true, true)],
            BinaryOp::Pow | BinaryOp::Maximum | BinaryOp::Minimum => [(true, true), (true, true)],
        }
    }

    fn float_only(self) -> bool {
        matches!(self, BinaryOp::Pow)
    }
}

impl CmpOp {
    fn name(self) -> &'static str {
        match self {
            CmpOp::Eq => "eq",
            CmpOp::Ne => "ne",
            CmpOp::Lt => "lt",
            CmpOp::Le => "le",
            CmpOp::Gt => "gt",
            CmpOp::Ge => "ge",
        }
    }

    /// WGSL for the comparison of `a` and `b`. `!=` is written as `!(a == b)` because some drivers compile
    /// `!=` to an ordered comparison, which is false for NaN.
    fn condition(self, a: &str, b: &str) -> String {
        match self {
            CmpOp::Eq => format!("({a} == {b})"),
            CmpOp::Ne => format!("!({a} == {b})"),
            CmpOp::Lt => format!("({a} < {b})"),
            CmpOp::Le => format!("({a} <= {b})"),
            CmpOp::Gt => format!("({a} > {b})"),
            CmpOp::Ge => format!("({a} >= {b})"),
        }
    }
}

/// The 32-bit pattern of `v` as a value of `dtype`'s compute type (how scalars travel in kernel parameters):
/// integers wrap into 32 bits as torch's integer arithmetic does (`u32 + -1` subtracts one), so `v` must be
/// [`integral`] for integer dtypes.
fn scalar_bits(v: f64, dtype: DType) -> u32 {
    match dtype {
        DType::U32 | DType::I32 => (v as i64) as u32,
        _ => (v as f32).to_bits(),
    }
}

/// Whether `s` is an integer that arithmetic on an integer tensor takes as it is.
fn integral(s: f64) -> bool {
    s.fract() == 0.0 && s.abs() < 2f64.powi(63)
}

/// `x op s` for an integer tensor `x` (values in `lo..=hi`) as the same comparison with an integer its dtype holds, so that the
/// answer is the exact one torch gives: `x < 2.5` is `x <= 2`, `x == 2.5` never holds, and on u32 `x > -1`
/// always does (`x >= 0`).
fn integer_comparison(op: CmpOp, s: f64, (lo, hi): (f64, f64)) -> (CmpOp, f64) {
    let (always, never) = ((CmpOp::Ge, lo), (CmpOp::Lt, lo));
    let holds = |yes: bool| if yes { always } else { never };
    match op {
        _ if s.is_nan() => holds(op == CmpOp::Ne),
        _ if s < lo => holds(matches!(op, CmpOp::Gt | CmpOp::Ge | CmpOp::Ne)),
        _ if s > hi => holds(matches!(op, CmpOp::Lt | CmpOp::Le | CmpOp::Ne)),
        _ if s.fract() == 0.0 => (op, s),
        CmpOp::Lt | CmpOp::Le => (CmpOp::Le, s.floor()),
        CmpOp::Gt | CmpOp::Ge => (CmpOp::Ge, s.ceil()),
        CmpOp::Eq | CmpOp::Ne => holds(op == CmpOp::Ne),
    }
}

fn check_same_dtype(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch {
            op,
            expected: a.dtype().to_string(),
            got: b.dtype(),
        });
    }
    Ok(())
}

impl Tensor {
    /// `op` elementwise with broadcasting; both operands must have the same dtype.
    pub fn binary(&self, rhs: &Tensor, op: BinaryOp) -> Result<Tensor> {
        check_same_dtype(op.name(), self, rhs)?;
        if op.float_only() && !self.dtype().is_float() {
            return Err(Error::DTypeMismatch {
                op: op.name(),
                expected: "a float dtype".into(),
                got: self.dtype(),
            });
        }
        let body = format!("let a = x0; let b = x1; return {};", op.forward(self.dtype()));
        let out = Map::elementwise(op.name(), &[self, rhs], self.dtype(), body)?.run()?;
        if !grad_enabled() || !(self.requires_grad() || rhs.requires_grad()) {
            return Ok(out);
        }
        let (need_a, need_b) = (self.requires_grad(), rhs.requires_grad());
        // Only the operands a needed gradient reads are kept for the backward.
        let [(a_reads_a, a_reads_b), (b_reads_a, b_reads_b)] = op.reads();
        let keep_a = (need_a && a_reads_a) || (need_b && b_reads_a);
        let keep_b = (need_a && a_reads_b) || (need_b && b_reads_b);
        let a = keep_a.then(|| self.detach());
        let b = keep_b.then(|| rhs.detach());
        let (shape_a, shape_b) = (self.shape().to_vec(), rhs.shape().to_vec());
        let node = Node::record(
            op.name(),
            &[self, rhs],
            Box::new(move |g| {
                let (ga, gb) = op.backward();
                let grad = |expr: &str, target: &[usize]| -> Result<Tensor> {
                    let full = match expr {
                        "g" => g.clone(),
                        "-g" => g.neg()?,
                        _ => {
                            // An operand the expression does not read is not kept: `g` stands in for it.
                            let body = format!("let g = x0; let a = x1; let b = x2; return {expr};");
                            let inputs = [g, a.as_ref().unwrap_or(g), b.as_ref().unwrap_or(g)];
                            Map::elementwise(op.name(), &inputs, g.dtype(), body)?.run()?
                        }
                    };
                    full.sum_to(target)
                };
                Ok(vec![
                    if need_a { Some(grad(ga, &shape_a)?) } else { None },
                    if need_b { Some(grad(gb, &shape_b)?) } else { None },
                ])
            }),
        );
        Ok(out.with_node(node))
    }

    /// `op(self, s)` (or `op(s, self)` when `scalar_first`) for a scalar `s`. An integer tensor with a scalar
    /// that is no integer (`x + 0.5`) computes in f32 and gives f32, as torch promotes it.
    pub fn binary_scalar(&self, s: f64, op: BinaryOp, scalar_first: bool) -> Result<Tensor> {
        if op.float_only() && !self.dtype().is_float() {
            return Err(Error::DTypeMismatch {
                op: op.name(),
                expected: "a float dtype".into(),
                got: self.dtype(),
            });
        }
        if !self.dtype().is_float() && !integral(s) {
            return self.to_dtype(DType::F32)?.binary_scalar(s, op, scalar_first);
        }
        let c = self.dtype().compute_type();
        let bind = if scalar_first {
            "let a = s; let b = x;"
        } else {
            "let a = x; let b = s;"
        };
        let prelude = format!("let s = bitcast<{c}>(extra_u32(0u)); {bind}");
        let body = format!("let x = x0; {prelude} return {};", op.forward(self.dtype()));
        let mut map = Map::elementwise(op.name(), &[self], self.dtype(), body)?;
        map.extras.push(scalar_bits(s, self.dtype()));
        let out = map.run()?;
        if !grad_enabled() || !self.requires_grad() {
            return Ok(out);
        }
        // The tensor is kept for the backward only if the gradient reads it (`x * s` does not).
        let [(reads_a, _), (_, reads_b)] = op.reads();
        let x = (if scalar_first { reads_b } else { reads_a }).then(|| self.detach());
        let node = Node::record(
            op.name(),
            &[self],
            Box::new(move |g| {
                let (ga, gb) = op.backward();
                let expr = if scalar_first { gb } else { ga };
                let body = format!("let g = x0; let x = x1; {prelude} return {expr};");
                let mut map = Map::elementwise(op.name(), &[g, x.as_ref().unwrap_or(g)], g.dtype(), body)?;
                map.extras.push(scalar_bits(s, g.dtype()));
                Ok(vec![Some(map.run()?)])
            }),
        );
        Ok(out.with_node(node))
    }

    /// self + rhs
    pub fn add(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Add)
    }
    /// self - rhs
    pub fn sub(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Sub)
    }
    /// self · rhs
    pub fn mul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Mul)
    }
    /// self / rhs
    pub fn div(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Div)
    }
    /// self ^ rhs
    pub fn pow(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Pow)
    }
    /// Elementwise maximum.
    pub fn maximum(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Maximum)
    }
    /// Elementwise minimum.
    pub fn minimum(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Minimum)
    }
    /// self + s
    pub fn add_scalar(&self, s: f64) -> Result<Tensor> {
        self.binary_scalar(s, BinaryOp::Add, false)
    }
    /// self - s
    pub fn sub_scalar(&self, s: f64) -> Result<Tensor> {
        self.binary_scalar(s, BinaryOp::Sub, false)
    }
    /// self · s
    pub fn mul_scalar(&self, s: f64) -> Result<Tensor> {
        self.binary_scalar(s, BinaryOp::Mul, false)
    }
    /// self / s
    pub fn div_scalar(&self, s: f64) -> Result<Tensor> {
        self.binary_scalar(s, BinaryOp::Div, false)
    }
    /// self ^ s
    pub fn pow_scalar(&self, s: f64) -> Result<Tensor> {
        self.binary_scalar(s, BinaryOp::Pow, false)
    }

    /// Elementwise comparison with broadcasting; a `u32` tensor of 0 and 1.
    pub fn compare(&self, rhs: &Tensor, op: CmpOp) -> Result<Tensor> {
        check_same_dtype(op.name(), self, rhs)?;
        let body = format!("return select(0u, 1u, {});", op.condition("x0", "x1"));
        Map::elementwise(op.name(), &[self, rhs], DType::U32, body)?.run()
    }

    /// Comparison with a scalar; a `u32` tensor of 0 and 1. Integer tensors compare exactly with any scalar.
    pub fn compare_scalar(&self, s: f64, op: CmpOp) -> Result<Tensor> {
        let (op, s) = match integer_range(self.dtype()) {
            None => (op, s),
            Some(range) => integer_comparison(op, s, range),
        };
        let c = self.dtype().compute_type();
        let body = format!(
            "return select(0u, 1u, {});",
            op.condition("x0", &format!("bitcast<{c}>(extra_u32(0u))"))
        );
        let mut map = Map::elementwise(op.name(), &[self], DType::U32, body)?;
        map.extras.push(scalar_bits(s, self.dtype()));
        map.run()
    }

    /// `on_true` where `self` (the condition, any dtype) is non-zero, else `on_false`; all three broadcast.
    pub fn where_cond(&self, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
        check_same_dtype("where", on_true, on_false)?;
        let out = Map::elementwise(
            "where",
            &[self, on_true, on_false],
            on_true.dtype(),
            "return select(x2, x1, !(x0 == 0));".into(),
        )?
        .run()?;
        if !grad_enabled() || !(on_true.requires_grad() || on_false.requires_grad()) {
            return Ok(out);
        }
        let cond = self.detach();
        let (shape_t, shape_f) = (on_true.shape().to_vec(), on_false.shape().to_vec());
        let node = Node::record(
            "where",
            &[on_true, on_false],
            Box::new(move |g| {
                let zero = "0.0";
                let pick = |keep_true: bool| -> Result<Tensor> {
                    let body = if keep_true {
                        format!("return select({zero}, x1, !(x0 == 0));")
                    } else {
                        format!("return select(x1, {zero}, !(x0 == 0));")
                    };
                    Map::elementwise("where", &[&cond, g], g.dtype(), body)?.run()
                };
                Ok(vec![
                    Some(pick(true)?.sum_to(&shape_t)?),
                    Some(pick(false)?.sum_to(&shape_f)?),
                ])
            }),
        );
        Ok(out.with_node(node))
    }

    /// Limits every element to `[min, max]` (NaN stays NaN); the gradient passes where `min <= x <= max`.
    pub fn clamp(&self, min: f64, max: f64) -> Result<Tensor> {
        if !self.dtype().is_float() {
            return Err(Error::DTypeMismatch {
                op: "clamp",
                expected: "a float dtype".into(),
                got: self.dtype(),
            });
        }
        let run = move |inputs: &[&Tensor], body: &str| -> Result<Tensor> {
            Map::elementwise("clamp", inputs, inputs[0].dtype(), body.into())?
                .with_f32(&[min as f32, max as f32])
                .run()
        };
        let out = run(&[self], "return min_nan(max_nan(x0, extra_f32(0u)), extra_f32(1u));")?;
        if !grad_enabled() || !self.requires_grad() {
            return Ok(out);
        }
        let x = self.detach();
        let node = Node::record(
            "clamp",
            &[self],
            Box::new(move |g| {
                let body = "return select(0.0, x0, (x1 >= extra_f32(0u)) && (x1 <= extra_f32(1u)));";
                Ok(vec![Some(run(&[g, &x], body)?)])
            }),
        );
        Ok(out.with_node(node))
    }
}
