//! Unary elementwise ops: forward and backward are one WGSL expression each.

use hierarchos_wgpu::{COMMON_WGSL, DType, Dispatch, Gpu, Language};

use crate::error::{Error, Result};
use crate::ops::map::Map;
use crate::tensor::Tensor;

const GATED_QUADS_WGSL: &str = include_str!("../../../../wgsl/gated_quads.wgsl");

/// A unary elementwise function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnaryOp {
    /// -x
    Neg,
    /// |x|
    Abs,
    /// sign(x) (-1, 0, 1); gradient zero.
    Sign,
    /// e^x
    Exp,
    /// ln x
    Log,
    /// √x
    Sqrt,
    /// 1/√x
    Rsqrt,
    /// 1/x
    Recip,
    /// sin x
    Sin,
    /// cos x
    Cos,
    /// tanh x
    Tanh,
    /// 1/(1+e^-x)
    Sigmoid,
    /// max(x, 0)
    Relu,
    /// x·sigmoid(x) (SiLU / swish)
    Silu,
    /// exact GELU: x·Φ(x)
    Gelu,
    /// GELU with the tanh approximation
    GeluTanh,
    /// ReLU squared, `max(x, 0)²` (the plain MLP of Arcee and Nemotron)
    Relu2,
}

impl UnaryOp {
    fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Sign => "sign",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Recip => "recip",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Relu => "relu",
            UnaryOp::Silu => "silu",
            UnaryOp::Gelu => "gelu",
            UnaryOp::GeluTanh => "gelu_tanh",
            UnaryOp::Relu2 => "relu2",
        }
    }

    /// WGSL for the value at `x`.
    pub(crate) fn forward(self) -> &'static str {
        match self {
            UnaryOp::Neg => "-x",
            UnaryOp::Abs => "abs(x)",
            UnaryOp::Sign => "sign(x)",
            UnaryOp::Exp => "exp_acc(x)",
            UnaryOp::Log => "log(x)",
            UnaryOp::Sqrt => "sqrt(x)",
            UnaryOp::Rsqrt => "1.0 / sqrt(x)",
            UnaryOp::Recip => "1.0 / x",
            UnaryOp::Sin => "sin(x)",
            UnaryOp::Cos => "cos(x)",
            UnaryOp::Tanh => "tanh_acc(x)",
            UnaryOp::Sigmoid => "sigmoid_acc(x)",
            UnaryOp::Relu => "select(x, 0.0, x < 0.0)",
            UnaryOp::Silu => "x * sigmoid_acc(x)",
            UnaryOp::Gelu => "gelu_erf(x)",
            UnaryOp::GeluTanh => "gelu_tanh(x)",
            UnaryOp::Relu2 => "select(x, 0.0, x < 0.0) * select(x, 0.0, x < 0.0)",
        }
    }

    /// WGSL for the input gradient from the output gradient `g`, input `x` and output `y`.
    fn backward(self) -> &'static str {
        match self {
            UnaryOp::Neg => "-g",
            UnaryOp::Abs => "g * sign(x)",
            UnaryOp::Sign => "0.0 * g",
            UnaryOp::Exp => "g * y",
            UnaryOp::Log => "g / x",
            UnaryOp::Sqrt => "g * 0.5 / y",
            UnaryOp::Rsqrt => "-0.5 * g * y * y * y",
            UnaryOp::Recip => "-g * y * y",
            UnaryOp::Sin => "g * cos(x)",
            UnaryOp::Cos => "-g * sin(x)",
            UnaryOp::Tanh => "g * (1.0 - y * y)",
            UnaryOp::Sigmoid => "g * y * (1.0 - y)",
            UnaryOp::Relu => "select(0.0, g, x > 0.0)",
            UnaryOp::Silu => "g * sigmoid_acc(x) * (1.0 + x * (1.0 - sigmoid_acc(x)))",
            UnaryOp::Gelu => "g * gelu_erf_grad(x)",
            UnaryOp::GeluTanh => "g * gelu_tanh_grad(x)",
            UnaryOp::Relu2 => "2.0 * g * select(x, 0.0, x < 0.0)",
        }
    }

    fn accepts(self, dtype: DType) -> bool {
        dtype.is_float() || (dtype == DType::I32 && matches!(self, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign))
    }
}

/// The gradients of `gated(x, up)` where `x` and `up` are the halves of `xu` (a stacked gate/up product's output,
/// `n` columns each), side by side in one new tensor shaped as `xu`: backward then hands the product its gradient
/// whole, where two separate gradients would be copied into one. Columns below `n` take the activation's rule fed
/// with g·up, the others g·op(x); each input is read through a layout with the output's shape, shifted so that
/// output column c reads column c, c + n or c - n of its tensor ([`crate::shape::Layout::shifted`]).
fn gated_backward_side_by_side(g: &Tensor, xu: &Tensor, n: usize, op: UnaryOp) -> Result<Tensor> {
    let last = xu.rank() - 1;
    let shifted = |t: &Tensor, by: isize| t.layout().shifted(xu.shape(), last, by);
    let n_signed = n as isize;
    let body = format!(
        "let c = out_coord(i, extra_u32(0u));\n\
         \x20   if (c < extra_u32(1u)) {{\n\
         \x20       let x = load_in2(strided_offset(2u, i));\n\
         \x20       let y = {forward};\n\
         \x20       let g = load_in0(strided_offset(0u, i)) * load_in3(strided_offset(3u, i));\n\
         \x20       return {backward};\n\
         \x20   }}\n\
         \x20   let x = load_in4(strided_offset(4u, i));\n\
         \x20   return load_in1(strided_offset(1u, i)) * ({forward});",
        forward = op.forward(),
        backward = op.backward()
    );
    Map {
        op: "gated",
        inputs: vec![
            (g, shifted(g, 0)),
            (g, shifted(g, -n_signed)),
            (xu, shifted(xu, 0)),
            (xu, shifted(xu, n_signed)),
            (xu, shifted(xu, -n_signed)),
        ],
        shape: xu.shape().to_vec(),
        dtype: xu.dtype(),
        body,
        preload: false,
        extras: vec![last as u32, n as u32],
        quad_body: None,
    }
    .run()
}

/// Both gradients of `gated(x, u)` side by side in one `[.., 2n]` tensor, from the output gradient `g`, through
/// `gated_quads.wgsl`: where `x`, `u` and `g` are f32 of one shape whose rows (`n` columns, a multiple of 4) lie at
/// unit stride, each starting on a quad. None where they do not, for the elementwise kernel.
fn gated_backward_quads(x: &Tensor, u: &Tensor, g: &Tensor, op: UnaryOp) -> Result<Option<Tensor>> {
    let tensors = [x, u, g];
    let n = x.shape().last().copied().unwrap_or(0);
    let rows: Vec<(usize, usize)> = tensors.iter().filter_map(|t| t.layout().quad_rows()).collect();
    if x.numel() == 0
        || !n.is_multiple_of(4)
        || rows.len() < tensors.len()
        || tensors
            .iter()
            .any(|t| t.dtype() != DType::F32 || t.shape() != x.shape())
    {
        return Ok(None);
    }
    let mut params = vec![(x.numel() / n) as u32, (n / 4) as u32];
    for (offset, stride) in rows {
        params.extend([offset as u32, stride as u32]);
    }
    let mut shape = x.shape().to_vec();
    *shape.last_mut().unwrap() = 2 * n;
    let device = x.device();
    let numel = crate::shape::numel(&shape);
    let out = device.alloc("gated", Tensor::bytes_for(numel, DType::F32))?;
    let mut buffers = vec![&out];
    buffers.extend(tensors.iter().map(|t| t.buffer()));
    device.dispatch(Dispatch {
        op: "gated",
        runtime_checks: false,
        language: Language::Wgsl,
        key: &format!("gated_quads:{}", op.name()),
        source: &|| {
            let mut s = String::from("@group(0) @binding(0) var<storage, read> p: array<u32>;\n");
            for (i, name) in ["out", "xs", "us", "gs"].iter().enumerate() {
                let access = if i == 0 { "read_write" } else { "read" };
                s.push_str(&format!(
                    "@group(0) @binding({}) var<storage, {access}> {name}: array<vec4<f32>>;\n",
                    i + 1
                ));
            }
            s.push_str(COMMON_WGSL);
            s.push_str(crate::ops::math::MATH_WGSL);
            s.push_str(&format!(
                "fn act(x: f32) -> f32 {{ return {}; }}\n\
                 fn act_grad(x: f32, g: f32) -> f32 {{ let y = act(x); return {}; }}\n{GATED_QUADS_WGSL}",
                op.forward(),
                op.backward()
            ));
            s
        },
        buffers: &buffers,
        params: &params,
        workgroups: Gpu::grid((x.numel() / 4).div_ceil(256) as u32),
    })?;
    Ok(Some(Tensor::from_buffer(out, &shape, DType::F32, None)))
}

impl Tensor {
    /// `op(self) · up` in one kernel: the gated MLP (SwiGLU with `Silu`, GeGLU with `Gelu`) without the
    /// activation tensor in between, which saves a launch and a round trip through memory. Broadcasts like `mul`.
    pub fn gated(&self, up: &Tensor, op: UnaryOp) -> Result<Tensor> {
        if !self.dtype().is_float() || up.dtype() != self.dtype() {
            return Err(Error::DTypeMismatch {
                op: "gated",
                expected: "two tensors of one float dtype".into(),
                got: up.dtype(),
            });
        }
        let body = format!("let x = x0; return ({}) * x1;", op.forward());
        let out = Map::elementwise("gated", &[self, up], self.dtype(), body)?.run()?;
        if !crate::autograd::grad_enabled() || !(self.requires_grad() || up.requires_grad()) {
            return Ok(out);
        }
        let (x, u) = (self.detach(), up.detach());
        let side_by_side = match x.rank() > 0 && x.shape() == u.shape() {
            true => Tensor::cat_view(&[x.clone(), u.clone()], -1)?,
            false => None,
        };
        let node = crate::autograd::Node::record(
            "gated",
            &[self, up],
            Box::new(move |g| {
                if let Some(xu) = &side_by_side {
                    let n = x.shape()[x.rank() - 1];
                    let both = match gated_backward_quads(&x, &u, g, op)? {
                        Some(both) => both,
                        None => gated_backward_side_by_side(g, xu, n, op)?,
                    };
                    return Ok(vec![Some(both.narrow(-1, 0, n)?), Some(both.narrow(-1, n, n)?)]);
                }
                // d/dx is the activation's backward rule fed with g·up; d/dup is g·op(x).
                let body = format!(
                    "let x = x1; let y = {}; let g = x0 * x2; return {};",
                    op.forward(),
                    op.backward()
                );
                let gx = Map::elementwise("gated", &[g, &x, &u], x.dtype(), body)?.run()?;
                let body = format!("let x = x1; return x0 * ({});", op.forward());
                let gu = Map::elementwise("gated", &[g, &x], u.dtype(), body)?.run()?;
                Ok(vec![Some(gx.sum_to(x.shape())?), Some(gu.sum_to(u.shape())?)])
            }),
        );
        Ok(out.with_node(node))
    }

    /// Applies `op` elementwise.
    pub fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        if !op.accepts(self.dtype()) {
            return Err(Error::DTypeMismatch {
                op: op.name(),
                expected: "a float dtype".into(),
                got: self.dtype(),
            });
        }
        let body = format!("let x = x0; return {};", op.forward());
        let out = Map::elementwise(op.name(), &[self], self.dtype(), body)?.run()?;
        if !crate::autograd::grad_enabled() || !self.requires_grad() {
            return Ok(out);
        }
        let (x, y) = (self.detach(), out.detach());
        let node = crate::autograd::Node::record(
            op.name(),
            &[self],
            Box::new(move |g| {
                let body = format!("let g = x0; let x = x1; let y = x2; return {};", op.backward());
                Ok(vec![Some(
                    Map::elementwise(op.name(), &[g, &x, &y], x.dtype(), body)?.run()?,
                )])
            }),
        );
        Ok(out.with_node(node))
    }

    /// -x
    pub fn neg(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Neg)
    }
    /// |x|
    pub fn abs(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Abs)
    }
    /// sign(x)
    pub fn sign(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sign)
    }
    /// e^x
    pub fn exp(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Exp)
    }
    /// ln x
    pub fn log(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Log)
    }
    /// √x
    pub fn sqrt(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sqrt)
    }
    /// 1/√x
    pub fn rsqrt(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Rsqrt)
    }
    /// 1/x
    pub fn recip(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Recip)
    }
    /// sin x
    pub fn sin(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sin)
    }
    /// cos x
    pub fn cos(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Cos)
    }
    /// tanh x
    pub fn tanh(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Tanh)
    }
    /// Logistic sigmoid.
    pub fn sigmoid(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sigmoid)
    }
    /// max(x, 0)
    pub fn relu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Relu)
    }
    /// x·sigmoid(x)
    pub fn silu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Silu)
    }
    /// Exact (erf) GELU.
    pub fn gelu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Gelu)
    }
    /// tanh-approximated GELU (`gelu_pytorch_tanh`).
    pub fn gelu_tanh(&self) -> Result<Tensor> {
        self.unary(UnaryOp::GeluTanh)
    }
}
