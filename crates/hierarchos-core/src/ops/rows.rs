//! The launcher of the row kernels (softmax, cumsum, normalizations, cross-entropy): one workgroup per row, the
//! last dimension of `lead + [cols]`, reading its inputs in place through strided views.

use std::fmt::Write;

use hierarchos_wgpu::{Access, COMMON_WGSL, DType, Dispatch, Gpu, GpuBuffer, Language};

use crate::autograd::no_grad;
use crate::error::{Error, Result};
use crate::shape::{Layout, MAX_DIMS, numel};
use crate::tensor::{Device, Tensor};

const ROWS_WGSL: &str = include_str!("../../../../wgsl/rows.wgsl");
const ROWS_SUBGROUP_WGSL: &str = include_str!("../../../../wgsl/rows_subgroup.wgsl");
/// The logsumexp pass over a row that softmax and cross-entropy share (their kernels define `row_value`).
pub(crate) const ROW_LOGSUMEXP_WGSL: &str = include_str!("../../../../wgsl/row_logsumexp.wgsl");

/// `lse_reduce` without subgroup operations.
const LSE_REDUCE_TREE: &str =
    "fn lse_reduce(lid: u32, sg_lane: u32, own: vec4<f32>) -> vec4<f32> { return workgroup_reduce(lid, own, LSE); }\n";

/// `run_row` of the kernels with an output shaped like their rows ([`RowKernel::output`]): the output is written
/// a word at a time (two elements for packed 16-bit outputs, whose rows then start on a word boundary because
/// `output` only writes them directly for even `cols`).
const OUTPUT_RUN_ROW: &str = "fn run_row(row: u32, lid: u32, sg_lane: u32) {
    let ctx = row_context(row, lid, sg_lane);
    let wpr = p[1] / EPW;
    for (var w = lid; w < wpr; w = w + WG) {
        let j = w * EPW;
        let v0 = out_value(ctx, j);
        var v1 = v0;
        if (EPW == 2u) {
            v1 = out_value(ctx, j + 1u);
        }
        store_out(row * wpr + w, v0, v1);
    }
}
";

/// Number of kernel-specific parameters (`scalar_u32(i)`, `scalar_f32(i)` in rows.wgsl).
pub(crate) const SCALARS: usize = 6;

/// A tensor bound to a row kernel: WGSL sees `name` with `load_<name>` (read) or `store_<name>` (write).
pub(crate) struct Binding<'a> {
    name: &'static str,
    tensor: &'a Tensor,
    write: bool,
}

impl<'a> Binding<'a> {
    /// `tensor`'s buffer, read-only.
    pub(crate) fn read(name: &'static str, tensor: &'a Tensor) -> Self {
        Binding {
            name,
            tensor,
            write: false,
        }
    }

    /// `tensor`'s buffer, written by the kernel.
    pub(crate) fn write(name: &'static str, tensor: &'a Tensor) -> Self {
        Binding {
            name,
            tensor,
            write: true,
        }
    }
}

/// Which function of the kernel runs.
#[derive(Clone, Copy)]
pub(crate) enum Entry {
    /// One workgroup per row runs `fn run_row(row: u32, lid: u32, sg_lane: u32)`.
    Rows,
    /// One workgroup per row runs `fn row_context(row: u32, lid: u32, sg_lane: u32) -> RowCtx`, then
    /// `fn out_value(ctx: RowCtx, j: u32) -> f32` for each output element (set by [`RowKernel::output`]).
    Output,
    /// At least this many workgroups (the grid may round up) run `fn run_group(group: u32, lid: u32, sg_lane: u32)`,
    /// which returns at once for groups past the kernel's work: for kernels that take several rows a workgroup.
    Groups(u32),
}

/// One launch of a row kernel. `sg_lane` is the subgroup lane when the device has subgroup operations (0
/// otherwise), and `lse_reduce(lid, sg_lane, part)` merges the workgroup's online-logsumexp parts through them.
pub(crate) struct RowKernel<'a> {
    /// Op name; with `defs` and the bindings' types it identifies the kernel, so each set of files needs its own.
    pub op: &'static str,
    /// The leading dimensions; their product is the number of rows.
    pub lead: &'a [usize],
    /// Row length.
    pub cols: usize,
    /// Kernel-specific parameters.
    pub scalars: [u32; SCALARS],
    /// Views read by rows (`row_base(k, row)`, `col_stride(k)`): shape `lead` plus optionally `[cols]`.
    pub views: Vec<&'a Layout>,
    /// Tensors at bindings 1, 2, ...
    pub bindings: Vec<Binding<'a>>,
    /// WGSL constants and generated functions the kernel files need.
    pub defs: String,
    /// The kernel's WGSL, appended after rows.wgsl.
    pub files: &'a [&'static str],
    /// What runs.
    pub entry: Entry,
}

impl<'a> RowKernel<'a> {
    /// A kernel over rows `lead` of `cols` elements running `run_row`, with no views, bindings or definitions yet.
    pub(crate) fn new(op: &'static str, lead: &'a [usize], cols: usize, files: &'a [&'static str]) -> Self {
        RowKernel {
            op,
            lead,
            cols,
            scalars: [0; SCALARS],
            views: Vec::new(),
            bindings: Vec::new(),
            defs: String::new(),
            files,
            entry: Entry::Rows,
        }
    }

    /// Records the launch (nothing when there are no rows to run).
    pub(crate) fn run(self, device: &Device) -> Result<()> {
        let nlead = self.lead.len();
        if nlead >= MAX_DIMS {
            return Err(Error::RankMismatch {
                op: self.op,
                expected: format!("<= {MAX_DIMS}"),
                got: self.lead.to_vec(),
            });
        }
        let rows = numel(self.lead);
        let workgroups = match self.entry {
            Entry::Rows | Entry::Output if rows == 0 => return Ok(()),
            Entry::Rows | Entry::Output => Gpu::grid(rows as u32),
            Entry::Groups(count) => Gpu::grid(count),
        };
        let subgroups = device.caps().subgroups;
        let mut params = vec![rows as u32, self.cols as u32, nlead as u32];
        params.extend((0..MAX_DIMS).map(|d| self.lead.get(d).copied().unwrap_or(1) as u32));
        params.extend(self.scalars);
        for v in &self.views {
            params.push(v.offset as u32);
            params.push(v.strides.get(nlead).copied().unwrap_or(0) as u32);
            params.extend((0..MAX_DIMS).map(|d| if d < nlead { v.strides[d] as u32 } else { 0 }));
        }
        let entry_tag = match self.entry {
            Entry::Rows => "rows",
            Entry::Output => "output",
            Entry::Groups(_) => "groups",
        };
        let native = device.caps().f16;
        let access: Vec<Access> = self
            .bindings
            .iter()
            .map(|b| Access::new(b.tensor.dtype(), native))
            .collect();
        let mut key = format!("rows:{}:{entry_tag}:{subgroups}:{}", self.op, self.defs);
        for (b, a) in self.bindings.iter().zip(&access) {
            let _ = write!(key, ":{}:{}:{}:{}", b.name, a.dtype, a.packed, b.write);
        }
        let source = || {
            let mut s = String::new();
            if access.iter().any(|a| a.dtype == DType::F16 && !a.packed) {
                s.push_str("enable f16;\n");
            }
            s.push_str("@group(0) @binding(0) var<storage, read> p: array<u32>;\n");
            for (k, (b, access)) in self.bindings.iter().zip(&access).enumerate() {
                let mode = if b.write { "read_write" } else { "read" };
                let _ = writeln!(
                    s,
                    "@group(0) @binding({}) var<storage, {mode}> {}: array<{}>;",
                    k + 1,
                    b.name,
                    access.storage_type()
                );
                s.push_str(&if b.write {
                    access.store_fn(b.name)
                } else {
                    access.load_fn(b.name)
                });
            }
            s.push_str(COMMON_WGSL);
            s.push_str(&self.defs);
            s.push_str(ROWS_WGSL);
            s.push_str(if subgroups { ROWS_SUBGROUP_WGSL } else { LSE_REDUCE_TREE });
            for f in self.files {
                s.push_str(f);
            }
            if let Entry::Output = self.entry {
                s.push_str(OUTPUT_RUN_ROW);
            }
            let call = match self.entry {
                Entry::Rows | Entry::Output => "if (row >= p[0]) { return; }\n    run_row",
                Entry::Groups(_) => "run_group",
            };
            // Naga 30 rejects `enable subgroups;`: the subgroup builtins are available as soon as the device
            // has `Features::SUBGROUP`.
            let (lane_param, lane, init) = if subgroups {
                (
                    ", @builtin(subgroup_invocation_id) sg_lane: u32, @builtin(subgroup_id) sg_id: u32, \
                     @builtin(num_subgroups) n_sg: u32",
                    "sg_lane",
                    "sg_id_p = sg_id;\n    n_sg_p = n_sg;\n",
                )
            } else {
                ("", "0u", "")
            };
            let _ = write!(
                s,
                "@compute @workgroup_size(256)\n\
                 fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,\n\
                 \x20       @builtin(local_invocation_index) lid: u32{lane_param}) {{\n\
                 \x20   {init}\
                 \x20   let row = wid.x + wid.y * nwg.x;\n\
                 \x20   {call}(row, lid, {lane});\n}}\n"
            );
            s
        };
        let buffers: Vec<&GpuBuffer> = self.bindings.iter().map(|b| b.tensor.buffer()).collect();
        device.dispatch(Dispatch {
            op: self.op,
            runtime_checks: false,
            language: Language::Wgsl,
            key: &key,
            source: &source,
            buffers: &buffers,
            params: &params,
            workgroups,
        })?;
        Ok(())
    }

    /// Runs the kernel as [`Entry::Output`] and returns its output, a new `lead + [cols]` tensor in `dtype` bound
    /// first as `out`: written directly when no two rows share an output word, else in f32 and then cast.
    pub(crate) fn output(mut self, dtype: DType, device: &Device) -> Result<Tensor> {
        let out_dtype = stored_dtype(dtype, self.cols, device);
        self.entry = Entry::Output;
        let epw = Access::new(out_dtype, device.caps().f16).elems_per_word();
        let _ = writeln!(self.defs, "const EPW: u32 = {epw}u;");
        let out = self.with_out(out_dtype, device)?;
        if out_dtype == dtype {
            Ok(out)
        } else {
            no_grad(|| out.to_dtype(dtype))
        }
    }

    /// Runs the kernel ([`Entry::Rows`]), whose `run_row` writes element `j` of row `row` to
    /// `out[row * C + j]`, and returns `out`: a new f32 tensor `lead + [cols]`.
    pub(crate) fn output_f32(self, device: &Device) -> Result<Tensor> {
        self.with_out(DType::F32, device)
    }

    /// Runs the kernel with a new `lead + [cols]` tensor of `dtype` bound first as `out`, and returns it.
    fn with_out(self, dtype: DType, device: &Device) -> Result<Tensor> {
        let mut shape = self.lead.to_vec();
        shape.push(self.cols);
        let n = numel(&shape);
        let out = Tensor::from_buffer(device.alloc(self.op, Tensor::bytes_for(n, dtype))?, &shape, dtype, None);
        if n > 0 {
            let mut kernel: RowKernel<'_> = self;
            kernel.bindings.insert(0, Binding::write("out", &out));
            kernel.run(device)?;
        }
        Ok(out)
    }
}

/// The dtype a row kernel writes rows of `cols` elements of `dtype` in: `dtype` itself, or f32 where packed 16-bit
/// rows of odd length would share words between rows (the caller casts back).
pub(crate) fn stored_dtype(dtype: DType, cols: usize, device: &Device) -> DType {
    if Access::new(dtype, device.caps().f16).packed && cols % 2 == 1 {
        DType::F32
    } else {
        dtype
    }
}

/// `t`'s layout with `dim` moved last, so that rows run along `dim`, and the permutation that puts the kernel's
/// output back in `t`'s dimension order.
pub(crate) fn dim_last(t: &Tensor, dim: usize) -> Result<(Layout, Vec<usize>)> {
    let rank = t.rank();
    let perm: Vec<usize> = (0..rank).filter(|&k| k != dim).chain([dim]).collect();
    let mut back = vec![0; rank];
    for (i, &k) in perm.iter().enumerate() {
        back[k] = i;
    }
    Ok((t.layout().permute(&perm)?, back))
}
