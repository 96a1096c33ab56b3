//! Row normalizations over the last dimension, RMSNorm (Llama) and LayerNorm, with dedicated forward and backward
//! kernels.

use std::fmt::Write;

use hierarchos_wgpu::{Access, DType, Dispatch, Gpu, Language};

use crate::autograd::{Node, grad_enabled, no_grad};
use crate::error::{Error, Result};
use crate::ops::rows::{Binding, Entry, RowKernel, SCALARS, stored_dtype};
use crate::shape::numel;
use crate::tensor::Tensor;

const NORM_FORWARD_WGSL: &str = include_str!("../../../../wgsl/norm_forward.wgsl");
const NORM_BACKWARD_WGSL: &str = include_str!("../../../../wgsl/norm_backward.wgsl");
const RMS_NORM_QUADS_WGSL: &str = include_str!("../../../../wgsl/rms_norm_quads.wgsl");
const RMS_NORM_BACKWARD_QUADS_WGSL: &str = include_str!("../../../../wgsl/rms_norm_backward_quads.wgsl");
const ROW_SUM_QUADS_WGSL: &str = include_str!("../../../../wgsl/row_sum_quads.wgsl");
/// Rows per workgroup of the backward when it also sums the weight or bias gradients (one row otherwise): each
/// workgroup writes one partial sum per column, so fewer rows per workgroup mean more partial sums to add after,
/// more rows fewer workgroups to keep the GPU busy. On an H200 (110M shape, 25 backward passes a step over 4096
/// rows of 768, then the sums) 1, 2, 4 and 8 rows took 1.47, 1.22, 1.12 and 1.23 ms.
const GRAD_ROWS: usize = 4;
/// Longest row the backward takes: each thread keeps its share of a row in four arrays (4 KiB at this length,
/// within the 8 KiB of function memory WGSL guarantees).
const BACKWARD_MAX_COLS: usize = 1 << 16;
/// Most quads a lane takes in `rms_norm_backward_quads.wgsl`, which keeps five of its quads of every row in
/// registers (g, x, the prior gradient, the weight and its partial sum): rows of up to 1024 elements on 32-lane
/// subgroups.
const BACKWARD_QUADS_MAX_STEPS: usize = 8;

/// Which normalization.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Norm {
    Rms,
    Layer,
}

impl Norm {
    fn name(self) -> &'static str {
        match self {
            Norm::Rms => "rms_norm",
            Norm::Layer => "layer_norm",
        }
    }

    fn add_name(self) -> &'static str {
        match self {
            Norm::Rms => "add_rms_norm",
            Norm::Layer => "add_layer_norm",
        }
    }

    fn backward_name(self) -> &'static str {
        match self {
            Norm::Rms => "rms_norm_backward",
            Norm::Layer => "layer_norm_backward",
        }
    }
}

/// Which forward a `norm_forward.wgsl` kernel runs; both save (mean, rstd) per row.
#[derive(Clone, Copy)]
enum Pass<'a> {
    Forward,
    /// The forward of `x + r` (inputs x, r), also writing that sum to a contiguous tensor.
    AddForward {
        sum: &'a Tensor,
    },
}

/// The affine part of a normalization and its epsilon.
#[derive(Clone)]
struct Affine {
    weight: Option<Tensor>,
    bias: Option<Tensor>,
    eps: f64,
}

impl Affine {
    /// `weight(j)` and `bias(j)` in WGSL (1 and 0 when absent).
    fn defs(&self) -> String {
        format!(
            "fn weight(j: u32) -> f32 {{ return {}; }}\nfn bias(j: u32) -> f32 {{ return {}; }}\n",
            if self.weight.is_some() {
                "f32(load_w(scalar_u32(1u) + j * scalar_u32(2u)))"
            } else {
                "1.0"
            },
            if self.bias.is_some() {
                "f32(load_b(scalar_u32(3u) + j * scalar_u32(4u)))"
            } else {
                "0.0"
            }
        )
    }

    /// Scalars 0..5: eps, weight offset and stride, bias offset and stride.
    fn scalars(&self) -> [u32; SCALARS] {
        let at = |t: &Option<Tensor>| {
            t.as_ref()
                .map_or((0, 0), |t| (t.layout().offset as u32, t.layout().strides[0] as u32))
        };
        let (wo, ws) = at(&self.weight);
        let (bo, bs) = at(&self.bias);
        [(self.eps as f32).to_bits(), wo, ws, bo, bs, 0]
    }

    fn bindings(&self) -> impl Iterator<Item = Binding<'_>> {
        [("w", &self.weight), ("b", &self.bias)]
            .into_iter()
            .filter_map(|(name, t)| t.as_ref().map(|t| Binding::read(name, t)))
    }

    /// Checks the arguments of normalizing `x` and returns the affine part, detached (the node saves it).
    fn checked(
        op: &'static str,
        x: &Tensor,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Affine> {
        if !x.dtype().is_float() {
            return Err(Error::DTypeMismatch {
                op,
                expected: "a float dtype".into(),
                got: x.dtype(),
            });
        }
        let Some(&cols) = x.shape().last() else {
            return Err(Error::RankMismatch {
                op,
                expected: ">= 1".into(),
                got: vec![],
            });
        };
        for p in [weight, bias].into_iter().flatten() {
            if p.shape() != [cols] {
                return Err(Error::ShapeMismatch {
                    op,
                    lhs: x.shape().to_vec(),
                    rhs: p.shape().to_vec(),
                });
            }
            if !p.dtype().is_float() {
                return Err(Error::DTypeMismatch {
                    op,
                    expected: "a float dtype".into(),
                    got: p.dtype(),
                });
            }
            if !std::sync::Arc::ptr_eq(p.device(), x.device()) {
                return Err(Error::Invalid {
                    op,
                    message: "inputs live on different devices".into(),
                });
            }
        }
        Ok(Affine {
            weight: weight.map(Tensor::detach),
            bias: bias.map(Tensor::detach),
            eps,
        })
    }
}

/// `norm_input(base0, base1, j)`, the element the forward kernel normalizes, and `save_input(word, v0, v1)`: x
/// (view 0) and nothing to save, or with `add` the sum x + r (view 1) rounded to `dtype` exactly as `Tensor::add`
/// stores it (so the statistics see the same values as `sum.rms_norm(..)`), saved to `sum`.
fn input_defs(dtype: DType, add: bool) -> String {
    let x = "f32(load_x(b0 + j * col_stride(0u)))";
    if !add {
        return format!(
            "const RESIDUAL: bool = false;\n\
             fn norm_input(b0: u32, b1: u32, j: u32) -> f32 {{ return {x}; }}\n\
             fn save_input(w: u32, v0: f32, v1: f32) {{}}\n"
        );
    }
    let rounded = match dtype {
        DType::F16 => "unpack2x16float(f32_to_f16(s)).x",
        DType::BF16 => "bitcast<f32>(f32_to_bf16(s) << 16u)",
        _ => "s",
    };
    format!(
        "const RESIDUAL: bool = true;\n\
         fn norm_input(b0: u32, b1: u32, j: u32) -> f32 {{\n\
         \x20   let s = {x} + f32(load_r(b1 + j * col_stride(1u)));\n\
         \x20   return {rounded};\n}}\n\
         fn save_input(w: u32, v0: f32, v1: f32) {{ store_sum(w, v0, v1); }}\n"
    )
}

/// A new (mean, rstd) buffer for `rows` rows.
fn new_stats(op: &'static str, x: &Tensor, rows: usize) -> Result<Tensor> {
    Ok(Tensor::from_buffer(
        x.device().alloc(op, Tensor::bytes_for(rows * 2, DType::F32))?,
        &[rows, 2],
        DType::F32,
        None,
    ))
}

/// Runs the normalization forward for `pass` over rows of `inputs` (views 0, 1, ...), giving a new tensor of
/// `inputs[0]`'s shape in `dtype`.
fn norm_rows(
    kind: Norm,
    pass: Pass<'_>,
    inputs: &[(&'static str, &Tensor)],
    affine: &Affine,
    stats: &Tensor,
    dtype: DType,
) -> Result<Tensor> {
    let op = match pass {
        Pass::Forward => kind.name(),
        Pass::AddForward { .. } => kind.add_name(),
    };
    if kind == Norm::Rms
        && let Some(y) = rms_norm_quads(op, pass, inputs, affine, stats, dtype)?
    {
        return Ok(y);
    }
    let shape = inputs[0].1.shape();
    let mut defs = format!("const LAYER: bool = {};\n{}", kind == Norm::Layer, affine.defs());
    let mut bindings = Vec::new();
    match pass {
        Pass::Forward => {
            bindings.push(Binding::write("stats", stats));
            defs.push_str(&input_defs(dtype, false));
        }
        Pass::AddForward { sum } => {
            bindings.push(Binding::write("stats", stats));
            bindings.push(Binding::write("sum", sum));
            defs.push_str(&input_defs(dtype, true));
        }
    }
    bindings.extend(inputs.iter().map(|&(name, t)| Binding::read(name, t)));
    bindings.extend(affine.bindings());
    RowKernel {
        scalars: affine.scalars(),
        views: inputs.iter().map(|(_, t)| t.layout()).collect(),
        bindings,
        defs,
        ..RowKernel::new(
            op,
            &shape[..shape.len() - 1],
            shape[shape.len() - 1],
            &[NORM_FORWARD_WGSL],
        )
    }
    .output(dtype, inputs[0].1.device())
}

/// `SLOTS` of rms_norm_quads.wgsl (64 over the smallest subgroup), where the device has subgroups whose sizes are
/// powers of two of at most 64, as its `row_sum` needs; None otherwise.
fn row_sum_slots(device: &crate::tensor::Device) -> Option<u32> {
    let (min, max) = device.caps().subgroup_size;
    (device.caps().subgroups && min.is_power_of_two() && max.is_power_of_two() && max <= 64).then(|| 64 / min)
}

/// Whether `t` is f32 rows that start on quads, as the kernels on quads read it.
fn on_quad_rows(t: &Tensor) -> bool {
    t.dtype() == DType::F32 && t.layout().quad_rows().is_some()
}

/// `t`'s offset and row stride in quads (zeros for a tensor the kernel does not bind).
fn quad_view(t: Option<&Tensor>) -> [u32; 2] {
    t.and_then(|t| t.layout().quad_rows())
        .map_or([0, 0], |(o, s)| [o as u32, s as u32])
}

/// Whether the weight, if any, is f32 at unit stride from a quad, as the kernels on quads read it.
fn weight_on_quads(affine: &Affine) -> bool {
    affine
        .weight
        .as_ref()
        .is_none_or(|w| w.dtype() == DType::F32 && w.layout().strides == [1] && w.layout().offset.is_multiple_of(4))
}

/// The tensors of `named` (name, tensor if bound, access mode) that a kernel on quads binds from binding
/// `first` on, and their WGSL declarations as arrays of vec4s.
fn quad_bindings<'a>(named: &[(&str, Option<&'a Tensor>, &str)], first: usize) -> (Vec<&'a Tensor>, String) {
    let mut decls = String::new();
    let mut tensors = Vec::new();
    for (name, t, mode) in named {
        if let Some(t) = t {
            let _ = writeln!(
                decls,
                "@group(0) @binding({}) var<storage, {mode}> {name}: array<vec4<f32>>;",
                first + tensors.len()
            );
            tensors.push(*t);
        }
    }
    (tensors, decls)
}

/// [`norm_rows`] for RMSNorm through `rms_norm_quads.wgsl`, one row per subgroup: where the device has subgroups
/// and the output, x (and r), the weight and the sum are f32 whose rows (a multiple of 4 long) start on quads,
/// the weight at unit stride. None otherwise, for the row kernel.
fn rms_norm_quads(
    op: &'static str,
    pass: Pass<'_>,
    inputs: &[(&'static str, &Tensor)],
    affine: &Affine,
    stats: &Tensor,
    dtype: DType,
) -> Result<Option<Tensor>> {
    let x = inputs[0].1;
    let device = x.device();
    let cols = x.shape().last().copied().unwrap_or(0);
    let sum = match pass {
        Pass::Forward => None,
        Pass::AddForward { sum } => Some(sum),
    };
    let Some(slots) = row_sum_slots(device) else {
        return Ok(None);
    };
    if dtype != DType::F32
        || x.numel() == 0
        || !cols.is_multiple_of(4)
        || !inputs.iter().all(|(_, t)| on_quad_rows(t))
        || !weight_on_quads(affine)
        || sum.is_some_and(|s| !s.layout().is_contiguous() || !s.layout().offset.is_multiple_of(4))
    {
        return Ok(None);
    }
    let rows = x.numel() / cols;
    let r = inputs.get(1).map(|(_, t)| *t);
    let mut params = vec![rows as u32, (cols / 4) as u32];
    params.extend(quad_view(Some(x)));
    params.extend(quad_view(r));
    params.push(affine.weight.as_ref().map_or(0, |w| (w.layout().offset / 4) as u32));
    params.push((affine.eps as f32).to_bits());
    let out = device.alloc(op, Tensor::bytes_for(x.numel(), DType::F32))?;
    // The bindings after out and stats: those of this launch's inputs and outputs, by name.
    let (bound, decls) = quad_bindings(
        &[
            ("sums", sum, "read_write"),
            ("xs", Some(x), "read"),
            ("rs", r, "read"),
            ("ws", affine.weight.as_ref(), "read"),
        ],
        3,
    );
    let mut buffers = vec![&out, stats.buffer()];
    buffers.extend(bound.iter().map(|t| t.buffer()));
    let (has_sum, has_r, has_w) = (sum.is_some(), r.is_some(), affine.weight.is_some());
    device.dispatch(Dispatch {
        op,
        runtime_checks: false,
        language: Language::Wgsl,
        key: &format!("rms_norm_quads:{has_sum}:{has_r}:{has_w}:{slots}"),
        source: &|| {
            let mut s = String::from(
                "@group(0) @binding(0) var<storage, read> p: array<u32>;\n\
                 @group(0) @binding(1) var<storage, read_write> out: array<vec4<f32>>;\n\
                 @group(0) @binding(2) var<storage, read_write> stats: array<f32>;\n",
            );
            s += &decls;
            s += match has_r {
                true => "fn row_quad(row: u32, q: u32) -> vec4<f32> { return xs[p[2] + row * p[3] + q] + rs[p[4] + row * p[5] + q]; }\n",
                false => "fn row_quad(row: u32, q: u32) -> vec4<f32> { return xs[p[2] + row * p[3] + q]; }\n",
            };
            s += match has_sum {
                true => "fn save_sum(i: u32, v: vec4<f32>) { sums[i] = v; }\n",
                false => "fn save_sum(i: u32, v: vec4<f32>) {}\n",
            };
            s += match has_w {
                true => "fn weight(q: u32) -> vec4<f32> { return ws[p[6] + q]; }\n",
                false => "fn weight(q: u32) -> vec4<f32> { return vec4<f32>(1.0); }\n",
            };
            s += &format!("const SLOTS: u32 = {slots}u;\n");
            s + ROW_SUM_QUADS_WGSL + RMS_NORM_QUADS_WGSL
        },
        buffers: &buffers,
        params: &params,
        // A workgroup of 256 threads takes one row per subgroup: as few as the largest subgroups allow.
        workgroups: Gpu::grid(rows.div_ceil(256 / device.caps().subgroup_size.1.clamp(1, 256) as usize) as u32),
    })?;
    Ok(Some(Tensor::from_buffer(out, x.shape(), DType::F32, None)))
}

/// The gradients a normalization node needs from `g`, in one pass over `g` and `x`: `[dx, dw, db]` for the
/// `need`ed ones, dx in x's dtype, the weight's and bias's (Σ over rows of g·x̂ and of g) in f32. `gathered`, the
/// gradient x already has from elsewhere (the residual stream's), is added to dx: by the kernel as it stores
/// an f32 dx, else by an add after it, the same sum either way.
fn norm_backward(
    kind: Norm,
    g: &Tensor,
    x: &Tensor,
    affine: &Affine,
    stats: &Tensor,
    need: [bool; 3],
    gathered: Option<Tensor>,
) -> Result<[Option<Tensor>; 3]> {
    let op = kind.backward_name();
    let device = x.device().clone();
    let shape = x.shape();
    let (lead, cols) = (&shape[..shape.len() - 1], shape[shape.len() - 1]);
    let rows = numel(lead);
    let [need_x, need_w, need_b] = need;
    if cols > BACKWARD_MAX_COLS {
        return Err(Error::Invalid {
            op,
            message: format!("rows of {cols} elements are longer than the backward takes ({BACKWARD_MAX_COLS})"),
        });
    }
    let dx_dtype = stored_dtype(x.dtype(), cols, &device);
    let (prior, gathered) = match gathered {
        Some(p) if need_x && dx_dtype == DType::F32 && p.dtype() == DType::F32 && p.shape() == shape => (Some(p), None),
        other => (None, other),
    };
    let dx = need_x
        .then(|| {
            let bytes = Tensor::bytes_for(x.numel(), dx_dtype);
            Ok::<_, Error>(Tensor::from_buffer(device.alloc(op, bytes)?, shape, dx_dtype, None))
        })
        .transpose()?;
    let parts = usize::from(need_w) + usize::from(need_b);
    let per = if parts > 0 { GRAD_ROWS } else { 1 };
    let groups = rows.div_ceil(per);
    if groups > u32::MAX as usize {
        return Err(Error::Invalid {
            op,
            message: format!("{rows} rows are too many"),
        });
    }
    let partial = (parts > 0)
        .then(|| {
            let bytes = Tensor::bytes_for(groups * parts * cols, DType::F32);
            Ok::<_, Error>(Tensor::from_buffer(
                device.alloc(op, bytes)?,
                &[groups, parts, cols],
                DType::F32,
                None,
            ))
        })
        .transpose()?;
    let on_quads = || match (kind, &dx) {
        (Norm::Rms, Some(dx)) => {
            rms_norm_backward_quads(g, x, affine, stats, prior.as_ref(), dx, partial.as_ref(), per)
        }
        _ => Ok(false),
    };
    if rows > 0 && cols > 0 && (need_x || parts > 0) && !on_quads()? {
        let epw = if need_x {
            Access::new(dx_dtype, device.caps().f16).elems_per_word() as usize
        } else {
            1
        };
        // dx leaves the bias out, so the kernel binds none.
        let affine = Affine {
            bias: None,
            ..affine.clone()
        };
        let mut defs = format!(
            "const LAYER: bool = {};\n{}const EPW: u32 = {epw}u;\nconst WPT: u32 = {}u;\n\
             const DX: bool = {need_x};\nconst DW: bool = {need_w};\nconst DB: bool = {need_b};\n\
             const PARTS: u32 = {parts}u;\nconst PRIOR: bool = {};\n",
            kind == Norm::Layer,
            affine.defs(),
            cols.div_ceil(256 * epw),
            prior.is_some(),
        );
        let mut bindings = vec![Binding::read("stats", stats)];
        match &dx {
            Some(dx) => bindings.push(Binding::write("dx", dx)),
            None => defs.push_str("fn store_dx(w: u32, v0: f32, v1: f32) {}\n"),
        }
        match &partial {
            Some(partial) => bindings.push(Binding::write("partial", partial)),
            None => defs.push_str("fn store_partial(w: u32, v0: f32, v1: f32) {}\n"),
        }
        bindings.extend([Binding::read("g", g), Binding::read("x", x)]);
        bindings.extend(affine.bindings());
        let mut views = vec![g.layout(), x.layout()];
        match &prior {
            Some(prior) => {
                bindings.push(Binding::read("prior", prior));
                views.push(prior.layout());
                defs.push_str("fn prior_grad(row: u32, j: u32) -> f32 { return load_prior(row_base(2u, row) + j * col_stride(2u)); }\n");
            }
            None => defs.push_str("fn prior_grad(row: u32, j: u32) -> f32 { return 0.0; }\n"),
        }
        let mut scalars = affine.scalars();
        scalars[5] = per as u32;
        RowKernel {
            scalars,
            views,
            bindings,
            defs,
            entry: Entry::Groups(groups as u32),
            ..RowKernel::new(op, lead, cols, &[NORM_BACKWARD_WGSL])
        }
        .run(&device)?;
    }
    let dx = dx.map(|dx| no_grad(|| dx.to_dtype(x.dtype()))).transpose()?;
    let dx = match (gathered, dx) {
        (Some(gathered), Some(dx)) => Some(no_grad(|| gathered.add(&dx))?),
        (gathered, dx) => dx.or(gathered),
    };
    let sums = match partial {
        Some(p) if groups == 1 => Some(p.reshape(&[parts, cols])?),
        Some(p) => Some(p.sum(&[0], false)?),
        None => None,
    };
    let part = |k: usize| -> Result<Tensor> {
        match &sums {
            Some(s) if rows > 0 => s.narrow(0, k, 1)?.reshape(&[cols]),
            _ => Tensor::zeros(&[cols], DType::F32, &device),
        }
    };
    Ok([
        dx,
        need_w.then(|| part(0)).transpose()?,
        need_b.then(|| part(parts - 1)).transpose()?,
    ])
}

/// The RMSNorm backward through `rms_norm_backward_quads.wgsl`, a group of `per` rows per subgroup, writing `dx`
/// (with `prior` added) and, where given, the weight's `partial` sums: where the device has subgroups as
/// `row_sum` needs them and g, x, dx and prior are f32 rows starting on quads (a multiple of 4 long, at most
/// [`BACKWARD_QUADS_MAX_STEPS`] quads a lane), the weight f32 at unit stride. False, with nothing launched,
/// otherwise (the row kernel then runs).
#[allow(clippy::too_many_arguments)]
fn rms_norm_backward_quads(
    g: &Tensor,
    x: &Tensor,
    affine: &Affine,
    stats: &Tensor,
    prior: Option<&Tensor>,
    dx: &Tensor,
    partial: Option<&Tensor>,
    per: usize,
) -> Result<bool> {
    let device = x.device();
    let cols = x.shape().last().copied().unwrap_or(0);
    let Some(slots) = row_sum_slots(device) else {
        return Ok(false);
    };
    let steps = (cols / 4).div_ceil(device.caps().subgroup_size.0 as usize);
    if x.numel() == 0
        || !cols.is_multiple_of(4)
        || steps > BACKWARD_QUADS_MAX_STEPS
        || ![g, x, dx].into_iter().chain(prior).all(on_quad_rows)
        || !weight_on_quads(affine)
    {
        return Ok(false);
    }
    let rows = x.numel() / cols;
    let mut params = vec![rows as u32, (cols / 4) as u32, per as u32];
    params.extend(quad_view(Some(g)));
    params.extend(quad_view(Some(x)));
    params.extend(quad_view(prior));
    params.push(affine.weight.as_ref().map_or(0, |w| (w.layout().offset / 4) as u32));
    // The bindings after dx and stats, by name: g and x, then those this launch has.
    let (bound, decls) = quad_bindings(
        &[
            ("gs", Some(g), "read"),
            ("xs", Some(x), "read"),
            ("partial", partial, "read_write"),
            ("priors", prior, "read"),
            ("ws", affine.weight.as_ref(), "read"),
        ],
        3,
    );
    let mut buffers = vec![dx.buffer(), stats.buffer()];
    buffers.extend(bound.iter().map(|t| t.buffer()));
    let (has_partial, has_prior, has_w) = (partial.is_some(), prior.is_some(), affine.weight.is_some());
    let groups = rows.div_ceil(per);
    // LANES: the lanes of every subgroup where all have as many, else 0.
    let (min_lanes, max_lanes) = device.caps().subgroup_size;
    let lanes = if min_lanes == max_lanes { min_lanes } else { 0 };
    device.dispatch(Dispatch {
        op: "rms_norm_backward",
        runtime_checks: false,
        language: Language::Wgsl,
        key: &format!("rms_norm_backward_quads:{has_partial}:{has_prior}:{has_w}:{slots}:{steps}:{lanes}"),
        source: &|| {
            let mut s = String::from(
                "@group(0) @binding(0) var<storage, read> p: array<u32>;\n\
                 @group(0) @binding(1) var<storage, read_write> dx: array<vec4<f32>>;\n\
                 @group(0) @binding(2) var<storage, read> stats: array<f32>;\n",
            );
            s += &decls;
            s += match has_partial {
                true => "fn store_partial(i: u32, v: vec4<f32>) { partial[i] = v; }\n",
                false => "fn store_partial(i: u32, v: vec4<f32>) {}\n",
            };
            s += match has_prior {
                true => "fn prior_quad(row: u32, q: u32) -> vec4<f32> { return priors[p[7] + row * p[8] + q]; }\n",
                false => "fn prior_quad(row: u32, q: u32) -> vec4<f32> { return vec4<f32>(0.0); }\n",
            };
            s += match has_w {
                true => "fn weight(q: u32) -> vec4<f32> { return ws[p[9] + q]; }\n",
                false => "fn weight(q: u32) -> vec4<f32> { return vec4<f32>(1.0); }\n",
            };
            s += &format!(
                "const PRIOR: bool = {has_prior};\nconst SLOTS: u32 = {slots}u;\nconst STEPS: u32 = {steps}u;\n\
                 const LANES: u32 = {lanes}u;\n"
            );
            s + ROW_SUM_QUADS_WGSL + RMS_NORM_BACKWARD_QUADS_WGSL
        },
        buffers: &buffers,
        params: &params,
        // A workgroup of 256 threads takes one group per subgroup: as few as the largest subgroups allow.
        workgroups: Gpu::grid(groups.div_ceil(256 / device.caps().subgroup_size.1.clamp(1, 256) as usize) as u32),
    })?;
    Ok(true)
}

impl Tensor {
    /// Llama's RMSNorm over the last dimension, `x / sqrt(mean(x²) + eps) * weight`, as Hugging Face's
    /// `LlamaRMSNorm`: statistics in f32 whatever the dtype, weight applied after normalizing. The result is rounded
    /// once to `x`'s dtype (Hugging Face also rounds the normalized value before the weight multiply; the two differ
    /// by at most an ulp of the 16-bit type).
    pub fn rms_norm(&self, weight: Option<&Tensor>, eps: f64) -> Result<Tensor> {
        self.norm(Norm::Rms, weight, None, eps)
    }

    /// `torch.nn.functional.layer_norm` over the last dimension: `(x - mean) / sqrt(var + eps) * weight + bias`
    /// with the biased variance, computed in f32 with a Welford merge (stable when the mean dwarfs the spread).
    pub fn layer_norm(&self, weight: Option<&Tensor>, bias: Option<&Tensor>, eps: f64) -> Result<Tensor> {
        self.norm(Norm::Layer, weight, bias, eps)
    }

    /// The residual add and RMSNorm of a transformer layer in one kernel launch: `(sum, normed)` with
    /// `sum = self + residual` (same shape and dtype, no broadcasting) and `normed = sum.rms_norm(weight, eps)`,
    /// bit for bit what the two ops give separately. Decoding runs one token at a time, where launches rather than
    /// memory traffic set the speed. Both outputs are contiguous and differentiable.
    pub fn add_rms_norm(&self, residual: &Tensor, weight: Option<&Tensor>, eps: f64) -> Result<(Tensor, Tensor)> {
        self.add_norm(Norm::Rms, residual, weight, None, eps)
    }

    /// [`Tensor::add_rms_norm`] with a LayerNorm: `(self + residual, (self + residual).layer_norm(..))` in one launch.
    pub fn add_layer_norm(
        &self,
        residual: &Tensor,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<(Tensor, Tensor)> {
        self.add_norm(Norm::Layer, residual, weight, bias, eps)
    }

    fn norm(&self, kind: Norm, weight: Option<&Tensor>, bias: Option<&Tensor>, eps: f64) -> Result<Tensor> {
        let affine = Affine::checked(kind.name(), self, weight, bias, eps)?;
        let stats = new_stats(kind.name(), self, numel(&self.shape()[..self.rank() - 1]))?;
        let y = norm_rows(
            kind,
            Pass::Forward,
            &[("x", &self.detach())],
            &affine,
            &stats,
            self.dtype(),
        )?;
        self.record_norm(kind, y, stats, affine, [weight, bias])
    }

    /// `(self + residual, norm(self + residual))` from one launch; the norm's node takes the sum as its input, so
    /// its gradient goes through the same backward as [`Tensor::rms_norm`] and adds to the sum's own.
    fn add_norm(
        &self,
        kind: Norm,
        residual: &Tensor,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<(Tensor, Tensor)> {
        let op = kind.add_name();
        let affine = Affine::checked(op, self, weight, bias, eps)?;
        if residual.shape() != self.shape() {
            return Err(Error::ShapeMismatch {
                op,
                lhs: self.shape().to_vec(),
                rhs: residual.shape().to_vec(),
            });
        }
        if residual.dtype() != self.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                expected: self.dtype().to_string(),
                got: residual.dtype(),
            });
        }
        if !std::sync::Arc::ptr_eq(residual.device(), self.device()) {
            return Err(Error::Invalid {
                op,
                message: "inputs live on different devices".into(),
            });
        }
        let (dtype, device) = (self.dtype(), self.device());
        let shape = self.shape();
        let stats = new_stats(op, self, numel(&shape[..shape.len() - 1]))?;
        // The sum is stored like the normalized output (`RowKernel::output`): in f32 when packed 16-bit rows of odd
        // length would share words, holding values already rounded to `dtype`, so the cast back is exact.
        let sum_dtype = stored_dtype(dtype, shape[shape.len() - 1], device);
        let sum = Tensor::from_buffer(
            device.alloc(op, Tensor::bytes_for(self.numel(), sum_dtype))?,
            shape,
            sum_dtype,
            None,
        );
        let (x, r) = (self.detach(), residual.detach());
        let y = norm_rows(
            kind,
            Pass::AddForward { sum: &sum },
            &[("x", &x), ("r", &r)],
            &affine,
            &stats,
            dtype,
        )?;
        let sum = no_grad(|| sum.to_dtype(dtype))?;
        let needs = [self.requires_grad(), residual.requires_grad()];
        let sum = sum.with_node(Node::record(
            op,
            &[self, residual],
            Box::new(move |g| Ok(needs.iter().map(|&n| n.then(|| g.clone())).collect())),
        ));
        let normed = sum.record_norm(kind, y, stats, affine, [weight, bias])?;
        Ok((sum, normed))
    }

    /// Attaches to `y`, the normalization of `self` with `stats` saved by the forward, the node of its backward.
    fn record_norm(
        &self,
        kind: Norm,
        y: Tensor,
        stats: Tensor,
        affine: Affine,
        [weight, bias]: [Option<&Tensor>; 2],
    ) -> Result<Tensor> {
        let needs = [
            self.requires_grad(),
            weight.is_some_and(Tensor::requires_grad),
            bias.is_some_and(Tensor::requires_grad),
        ];
        if !grad_enabled() || !needs.iter().any(|&n| n) {
            return Ok(y);
        }
        let x = self.detach();
        let mut inputs = vec![self];
        inputs.extend(weight);
        inputs.extend(bias);
        let node = Node::record_adding(
            kind.name(),
            &inputs,
            Box::new(move |g, gathered| {
                let [dx, dw, db] = norm_backward(kind, g, &x, &affine, &stats, needs, gathered)?;
                let mut grads = vec![dx];
                for (p, d) in [(&affine.weight, dw), (&affine.bias, db)] {
                    if let Some(p) = p {
                        grads.push(d.map(|d| d.to_dtype(p.dtype())).transpose()?);
                    }
                }
                Ok(grads)
            }),
        );
        Ok(y.with_node(node))
    }
}
