//! The elementwise kernel every "one output element from a few input elements" op is built on: unary, binary,
//! where, casts, copies, masks, gathers and concatenation differ only in the WGSL body that computes element `i`.

use std::fmt::Write;
use std::sync::Arc;

use hierarchos_wgpu::{Access, COMMON_WGSL, DType, Dispatch, Gpu, Language};

use crate::error::{Error, Result};
use crate::shape::{Layout, MAX_DIMS, numel};
use crate::tensor::Tensor;

const MAP_WGSL: &str = include_str!("../../../../wgsl/map.wgsl");
const MAP_ELEMENTS_WGSL: &str = include_str!("../../../../wgsl/map_elements.wgsl");
const MAP_QUADS_WGSL: &str = include_str!("../../../../wgsl/map_quads.wgsl");
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
    /// For a body that loads its inputs itself: WGSL statements ending in `return`, computing output elements
    /// `i..i + 4` as a `vec4<f32>` with `load_in{k}4(strided_offset(k, i))` (four elements from one 128-bit
    /// load), for launches where every quad of the output reads quads of its inputs (see [`Map::quads`]).
    /// Preloading bodies need none: they are evaluated four times on the components of their inputs' quads.
    pub quad_body: Option<String>,
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
            quad_body: None,
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
        out.mark_written();
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
        let reads: Vec<Read> = self
            .inputs
            .iter()
            .map(|(_, l)| Read::of(l, &self.shape, &contiguous_out))
            .collect();
        let quads = self.quads(&reads, out);
        let mut params = vec![n as u32, self.shape.len() as u32];
        params.extend((0..MAX_DIMS).map(|d| self.shape.get(d).copied().unwrap_or(1) as u32));
        let mut key = format!("map:{}:{}:{}", self.op, out_access.storage_type(), self.dtype);
        let accesses: Vec<Access> = self
            .inputs
            .iter()
            .map(|(t, _)| Access::new(t.dtype(), native_f16))
            .collect();
        for (((t, l), a), read) in self.inputs.iter().zip(&accesses).zip(&reads) {
            params.push(l.offset as u32);
            params.extend((0..MAX_DIMS).map(|d| l.strides.get(d).copied().unwrap_or(0) as u32));
            let _ = write!(
                key,
                ":{}{}{}",
                t.dtype(),
                if a.packed { "p" } else { "" },
                read.letter()
            );
        }
        // A destination may start inside its buffer (a parameter that is a view of stacked weights), on a word.
        let epw = if quads { 4 } else { out_access.elems_per_word() as usize };
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
        let _ = write!(key, ":{}:{quads}:{}", self.preload, self.body);
        let source = || {
            let mut s = String::new();
            if native_f16 && (self.dtype == DType::F16 || self.inputs.iter().any(|(t, _)| t.dtype() == DType::F16)) {
                s.push_str("enable f16;\n");
            }
            s.push_str("@group(0) @binding(0) var<storage, read> p: array<u32>;\n");
            let word_type = if quads { "vec4<f32>" } else { out_access.storage_type() };
            let _ = writeln!(
                s,
                "@group(0) @binding(1) var<storage, read_write> out: array<{word_type}>;"
            );
            for (k, a) in accesses.iter().enumerate() {
                let ty = if quads { "vec4<f32>" } else { a.storage_type() };
                let _ = writeln!(
                    s,
                    "@group(0) @binding({}) var<storage, read> in{k}: array<{ty}>;",
                    k + 2
                );
                s.push_str(&match quads {
                    true => vec4_load_fns(&format!("in{k}")),
                    false => a.load_fn(&format!("in{k}")),
                });
            }
            if !quads {
                s.push_str(&out_access.store_fn("out"));
                s.push_str(&out_access.load_fn("out"));
            }
            s.push_str(COMMON_WGSL);
            let compute = self.dtype.compute_type();
            let word = if quads {
                "vec4<f32>".to_string()
            } else {
                format!("vec2<{compute}>")
            };
            let _ = writeln!(
                s,
                "const EPW: u32 = {epw}u;\nconst OUT_AT: u32 = {out_at}u;\nconst EXTRA: u32 = {extra_base}u;\n\
                 alias COMPUTE = {compute};\nalias Word = {word};\nconst WPT: u32 = {MAP_WORDS_PER_THREAD}u;"
            );
            s.push_str(&self.compute_fn(quads, reads.len()));
            s.push_str("fn strided_offset(k: u32, i: u32) -> u32 {\n");
            for (k, read) in reads.iter().enumerate() {
                let _ = writeln!(s, "    if (k == {k}u) {{ return {}_offset({k}u, i); }}", read.name());
            }
            s.push_str("    return any_offset(k, i);\n}\n");
            s.push_str(crate::ops::math::MATH_WGSL);
            s.push_str(MAP_WGSL);
            s.push_str(if quads { MAP_QUADS_WGSL } else { MAP_ELEMENTS_WGSL });
            s
        };
        let words = (n as u32).div_ceil(epw as u32);
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

impl Map<'_> {
    /// Whether the launch runs on quads: an f32 output whose rows (a multiple of 4 long) start on quads, every
    /// input f32 and laid out as the output or as rows starting on quads, and a body that can compute four
    /// elements. Each thread then moves 128 bits per load and store where it would move 32: on an H200 the
    /// elementwise kernels read and wrote at about 2 TB/s in 32-bit words.
    fn quads(&self, reads: &[Read], out: &Tensor) -> bool {
        let width = self.shape.last().copied().unwrap_or(0);
        self.dtype == DType::F32
            && (self.preload || self.quad_body.is_some())
            && width.is_multiple_of(4)
            && out.layout().offset.is_multiple_of(4)
            && self.inputs.iter().zip(reads).all(|((t, l), read)| {
                t.dtype() == DType::F32
                    && match read {
                        Read::Dense => l.offset.is_multiple_of(4),
                        Read::Rows => l.rows_of_vec4s(),
                        Read::Any => false,
                    }
            })
    }

    /// `compute(i)` (one element) or, on quads, `compute4(i)` (elements `i..i + 4`).
    fn compute_fn(&self, quads: bool, inputs: usize) -> String {
        let c = self.dtype.compute_type();
        if !quads {
            let mut s = format!("fn compute(i: u32) -> {c} {{\n");
            if self.preload {
                for k in 0..inputs {
                    let _ = writeln!(s, "    let x{k} = load_in{k}(strided_offset({k}u, i));");
                }
            }
            let _ = writeln!(s, "    {}\n}}", self.body);
            return s;
        }
        match &self.quad_body {
            Some(body) if !self.preload => format!("fn compute4(i: u32) -> vec4<f32> {{\n    {body}\n}}\n"),
            _ => {
                let xs: Vec<String> = (0..inputs).map(|k| format!(", x{k}: f32")).collect();
                let mut s = format!(
                    "fn compute_at(i: u32{}) -> f32 {{\n    {}\n}}\n",
                    xs.concat(),
                    self.body
                );
                s.push_str("fn compute4(i: u32) -> vec4<f32> {\n");
                for k in 0..inputs {
                    let _ = writeln!(s, "    let q{k} = load_in{k}4(strided_offset({k}u, i));");
                }
                let lanes: Vec<String> = ["x", "y", "z", "w"]
                    .iter()
                    .enumerate()
                    .map(|(j, lane)| {
                        let args: Vec<String> = (0..inputs).map(|k| format!(", q{k}.{lane}")).collect();
                        format!("compute_at(i + {j}u{})", args.concat())
                    })
                    .collect();
                let _ = writeln!(s, "    return vec4<f32>({});\n}}", lanes.join(", "));
                s
            }
        }
    }
}

/// `load_{name}` and `load_{name}4` for f32 elements bound as `array<vec4<f32>>`: element `i`, and the quad of
/// elements `i..i + 4` (`i` a multiple of 4).
pub(crate) fn vec4_load_fns(name: &str) -> String {
    format!(
        "fn load_{name}(i: u32) -> f32 {{ return {name}[i / 4u][i % 4u]; }}\n\
         fn load_{name}4(i: u32) -> vec4<f32> {{ return {name}[i / 4u]; }}\n"
    )
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
