//! The elementwise kernel every "one output element from a few input elements" op is built on: unary, binary,
//! where, casts, copies, masks, gathers and concatenation differ only in the WGSL body that computes element `i`.

use std::fmt::Write;
use std::sync::Arc;

use hierarchos_wgpu::{Access, COMMON_WGSL, DType, Dispatch, Gpu, Language};

use crate::error::{Error, Result};
use crate::shape::{Layout, MAX_DIMS, numel};
use crate::tensor::Tensor;

const MAP_WGSL: &str = include_str!("../../../../wgsl/map.wgsl");
/// Output words per thread (map.wgsl's `WPT`): one a thread kept too few loads in flight to fill the memory bus.
const MAP_WORDS_PER_THREAD: u32 = 4;

/// One elementwise kernel launch.
pub(crate) struct Map<'a> {
    /// Op name (errors, labels, cache key).
    pub op: &'static str,
    /// Inputs, each with the layout it is read through (broadcast to the output shape, or any layout the body
    /// indexes itself).
    pub inputs: Vec<(&'a Tensor, Layout)>,
    /// Output shape; the output is a new contiguous tensor.
    pub shape: Vec<usize>,
    /// Output dtype.
    pub dtype: DType,
    /// WGSL statements ending in `return`, computing output element `i`. `x0`, `x1`, ... hold the input values
    /// at `i` when `preload` is set; otherwise the body calls `load_in{k}(strided_offset(k, i))` itself.
    pub body: String,
    /// Load `x{k}` before the body.
    pub preload: bool,
    /// Extra parameters (read with `extra_u32(j)` / `extra_f32(j)`).
    pub extras: Vec<u32>,
}

impl Map<'_> {
    /// Elementwise over inputs broadcast to a common shape.
    pub(crate) fn elementwise<'a>(
        op: &'static str,
        inputs: &[&'a Tensor],
        dtype: DType,
        body: String,
    ) -> Result<Map<'a>> {
        let mut shape: Vec<usize> = Vec::new();
        for t in inputs {
            shape = crate::shape::broadcast_shapes(op, &shape, t.shape())?;
        }
        let inputs = inputs
            .iter()
            .map(|t| Ok((*t, t.layout().broadcast_to(op, &shape)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Map {
            op,
            inputs,
            shape,
            dtype,
            body,
            preload: true,
            extras: Vec::new(),
        })
    }

    /// Adds f32 extras.
    pub(crate) fn with_f32(mut self, values: &[f32]) -> Self {
        self.extras.extend(values.iter().map(|v| v.to_bits()));
        self
    }

    /// Runs the kernel into a new contiguous tensor; the result has no autograd history.
    pub(crate) fn run(self) -> Result<Tensor> {
        let device = self.device()?;
        let buf = device.alloc(self.op, Tensor::bytes_for(numel(&self.shape), self.dtype))?;
        let out = Tensor::from_buffer(buf, &self.shape, self.dtype, None);
        self.launch(&out)?;
        Ok(out)
    }

    /// Runs the kernel writing into `out`, which must be dense (from a word boundary of its buffer), have the map's
    /// shape and dtype, and not be read by the kernel (wgpu cannot bind one buffer for reading and writing).
    pub(crate) fn run_into(self, out: &Tensor) -> Result<()> {
        let l = out.layout();
        if out.shape() != self.shape.as_slice() || out.dtype() != self.dtype {
            return Err(Error::ShapeMismatch {
                op: self.op,
                lhs: out.shape().to_vec(),
                rhs: self.shape.clone(),
            });
        }
        if !l.is_contiguous() {
            return Err(Error::Invalid {
                op: self.op,
                message: "the destination must be a dense tensor".into(),
            });
        }
        if self.inputs.iter().any(|(t, _)| std::ptr::eq(t.buffer(), out.buffer())) {
            return Err(Error::Invalid {
                op: self.op,
                message: "the destination is also a source".into(),
            });
        }
        out.forget_id_range();
        self.launch(out)
    }

    fn device(&self) -> Result<crate::tensor::Device> {
        if self.shape.len() > MAX_DIMS {
            return Err(Error::RankMismatch {
                op: self.op,
                expected: format!("<= {MAX_DIMS}"),
                got: self.shape.clone(),
            });
        }
        let device = self
            .inputs
            .first()
            .map(|(t, _)| t.device().clone())
            .ok_or_else(|| Error::Invalid {
                op: self.op,
                message: "no inputs".into(),
            })?;
        for (t, _) in &self.inputs {
            if !Arc::ptr_eq(t.device(), &device) {
                return Err(Error::Invalid {
                    op: self.op,
                    message: "inputs live on different devices".into(),
                });
            }
        }
        Ok(device)
    }

    fn launch(self, out: &Tensor) -> Result<()> {
        let device = self.device()?;
        let n = numel(&self.shape);
        let native_f16 = device.caps().f16;
        let out_access = Access::new(self.dtype, native_f16);
        if n == 0 {
            return Ok(());
        }
        let contiguous_out = Layout::contiguous(&self.shape);
        let mut params = vec![n as u32, self.shape.len() as u32];
        params.extend((0..MAX_DIMS).map(|d| self.shape.get(d).copied().unwrap_or(1) as u32));
        let mut key = format!("map:{}:{}:{}", self.op, out_access.storage_type(), self.dtype);
        let accesses: Vec<Access> = self
            .inputs
            .iter()
            .map(|(t, _)| Access::new(t.dtype(), native_f16))
            .collect();
        let mut reads = Vec::new();
        for ((t, l), a) in self.inputs.iter().zip(&accesses) {
            params.push(l.offset as u32);
            params.extend((0..MAX_DIMS).map(|d| l.strides.get(d).copied().unwrap_or(0) as u32));
            let read = Read::of(l, &self.shape, &contiguous_out);
            reads.push(read);
            let _ = write!(
                key,
                ":{}{}{}",
                t.dtype(),
                if a.packed { "p" } else { "" },
                read.letter()
            );
        }
        // A destination may start inside its buffer (a parameter that is a view of stacked weights), on a word.
        let epw = out_access.elems_per_word() as usize;
        let out_offset = out.layout().offset;
        if !out_offset.is_multiple_of(epw) {
            return Err(Error::Invalid {
                op: self.op,
                message: format!("the destination starts at element {out_offset}, inside a packed word"),
            });
        }
        let out_at = params.len();
        params.push((out_offset / epw) as u32);
        let extra_base = params.len();
        params.extend(&self.extras);
        let _ = write!(key, ":{}:{}", self.preload, self.body);
        let source = || {
            let mut s = String::new();
            if native_f16 && (self.dtype == DType::F16 || self.inputs.iter().any(|(t, _)| t.dtype() == DType::F16)) {
                s.push_str("enable f16;\n");
            }
            s.push_str("@group(0) @binding(0) var<storage, read> p: array<u32>;\n");
            let _ = writeln!(
                s,
                "@group(0) @binding(1) var<storage, read_write> out: array<{}>;",
                out_access.storage_type()
            );
            for (k, a) in accesses.iter().enumerate() {
                let _ = writeln!(
                    s,
                    "@group(0) @binding({}) var<storage, read> in{k}: array<{}>;",
                    k + 2,
                    a.storage_type()
                );
                s.push_str(&a.load_fn(&format!("in{k}")));
            }
            s.push_str(&out_access.store_fn("out"));
            s.push_str(&out_access.load_fn("out"));
            s.push_str(COMMON_WGSL);
            let _ = writeln!(
                s,
                "const EPW: u32 = {}u;\nconst OUT_AT: u32 = {out_at}u;\nconst EXTRA: u32 = {extra_base}u;\n\
                 alias COMPUTE = {};\nconst WPT: u32 = {MAP_WORDS_PER_THREAD}u;",
                out_access.elems_per_word(),
                self.dtype.compute_type()
            );
            let _ = writeln!(s, "fn compute(i: u32) -> {} {{", self.dtype.compute_type());
            if self.preload {
                for k in 0..reads.len() {
                    let _ = writeln!(s, "    let x{k} = load_in{k}(strided_offset({k}u, i));");
                }
            }
            let _ = writeln!(s, "    {}\n}}", self.body);
            s.push_str("fn strided_offset(k: u32, i: u32) -> u32 {\n");
            for (k, read) in reads.iter().enumerate() {
                let _ = writeln!(s, "    if (k == {k}u) {{ return {}_offset({k}u, i); }}", read.name());
            }
            s.push_str("    return any_offset(k, i);\n}\n");
            s.push_str(crate::ops::math::MATH_WGSL);
            s.push_str(MAP_WGSL);
            s
        };
        let words = (n as u32).div_ceil(out_access.elems_per_word());
        let mut buffers = vec![out.buffer()];
        buffers.extend(self.inputs.iter().map(|(t, _)| t.buffer()));
        device.dispatch(Dispatch {
            op: self.op,
            runtime_checks: false,
            language: Language::Wgsl,
            key: &key,
            source: &source,
            buffers: &buffers,
            params: &params,
            workgroups: Gpu::grid(words.div_ceil(256 * MAP_WORDS_PER_THREAD)),
        })?;
        Ok(())
    }
}

/// How the map kernel addresses an input: the address arithmetic of a general strided read (a division and a
/// remainder per dimension) slows a memory-bound kernel down, and the common views need far less.
#[derive(Clone, Copy)]
enum Read {
    /// Laid out as the output: element `i` at `offset + i`.
    Dense,
    /// Rows of the output's width, each contiguous, a fixed stride apart (a column block of a wider matrix, as
    /// `narrow` along the last dimension leaves it): one division by the width.
    Rows,
    /// Anything else.
    Any,
}

impl Read {
    fn of(l: &Layout, shape: &[usize], contiguous: &Layout) -> Read {
        if l.shape != shape {
            return Read::Any;
        }
        if l.strides == contiguous.strides {
            return Read::Dense;
        }
        match shape.len() >= 2 && l.row_stride().is_some() {
            true => Read::Rows,
            false => Read::Any,
        }
    }

    /// The letter in the pipeline key.
    fn letter(self) -> char {
        match self {
            Read::Dense => 'c',
            Read::Rows => 'r',
            Read::Any => 's',
        }
    }

    /// The map.wgsl function computing the offset.
    fn name(self) -> &'static str {
        match self {
            Read::Dense => "dense",
            Read::Rows => "rows",
            Read::Any => "any",
        }
    }
}
