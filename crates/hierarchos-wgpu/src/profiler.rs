//! Per-kernel GPU time from timestamp queries written around each launch (`HIERARCHOS_PROFILE=1`): what
//! `hierarchos bench` prints to show where a step's GPU time goes. Each submitted batch resolves its
//! timestamps and waits for them, so only the kernel times, not the throughput, are meaningful while it runs.

use std::collections::HashMap;

/// The total GPU time of one kernel (by pipeline key) over the launches timed so far.
#[derive(Clone, Debug)]
pub struct KernelTime {
    /// The kernel's pipeline key: its name and specializations.
    pub kernel: String,
    /// Launches timed.
    pub launches: u64,
    /// Their summed GPU time in nanoseconds.
    pub total_ns: f64,
}

pub(crate) struct Profiler {
    queries: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    readback: wgpu::Buffer,
    /// Nanoseconds per timestamp tick (the web, which cannot wait for timings, never reads it).
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    period_ns: f64,
    capacity: u32,
    /// Kernels of the open batch, in launch order (launch i wrote timestamps 2i and 2i + 1).
    pending: Vec<String>,
    totals: HashMap<String, (u64, f64)>,
}

impl Profiler {
    /// A profiler for batches of up to `launches` launches; `None` without in-pass timestamp support.
    pub(crate) fn new(device: &wgpu::Device, queue: &wgpu::Queue, launches: usize) -> Option<Profiler> {
        if !device
            .features()
            .contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES)
        {
            return None;
        }
        let capacity = 2 * launches as u32;
        let bytes = capacity as u64 * 8;
        let buffer = |usage| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("hierarchos profile"),
                size: bytes,
                usage,
                mapped_at_creation: false,
            })
        };
        Some(Profiler {
            queries: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("hierarchos profile"),
                ty: wgpu::QueryType::Timestamp,
                count: capacity,
            }),
            resolved: buffer(wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC),
            readback: buffer(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST),
            period_ns: queue.get_timestamp_period() as f64,
            capacity,
            pending: Vec::new(),
            totals: HashMap::new(),
        })
    }

    /// Whether another launch fits the open batch's queries.
    pub(crate) fn has_room(&self) -> bool {
        (2 * self.pending.len() as u32) < self.capacity
    }

    /// Index of the timestamp before the next launch of `kernel` (the one after it is the next index).
    pub(crate) fn begin(&mut self, kernel: &str) -> u32 {
        self.pending.push(kernel.to_string());
        2 * (self.pending.len() as u32 - 1)
    }

    pub(crate) fn queries(&self) -> &wgpu::QuerySet {
        &self.queries
    }

    /// Records the copy of the batch's timestamps (outside any pass); returns how many launches it covers.
    pub(crate) fn resolve(&self, encoder: &mut wgpu::CommandEncoder) -> usize {
        let n = self.pending.len() as u32;
        if n > 0 {
            encoder.resolve_query_set(&self.queries, 0..2 * n, &self.resolved, 0);
            encoder.copy_buffer_to_buffer(&self.resolved, 0, &self.readback, 0, 16 * n as u64);
        }
        n as usize
    }

    /// Waits for the submitted batch's timestamps and adds them to the totals.
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn collect(&mut self, device: &wgpu::Device) {
        let n = self.pending.len();
        if n == 0 {
            return;
        }
        let slice = self.readback.slice(0..16 * n as u64);
        slice.map_async(wgpu::MapMode::Read, |_| {});
        if device.poll(wgpu::PollType::wait_indefinitely()).is_ok()
            && let Ok(view) = slice.get_mapped_range()
        {
            let ticks: Vec<u64> = view
                .chunks_exact(8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
                .collect();
            for (i, kernel) in self.pending.drain(..).enumerate() {
                let ns = ticks[2 * i + 1].saturating_sub(ticks[2 * i]) as f64 * self.period_ns;
                let e = self.totals.entry(kernel).or_insert((0, 0.0));
                e.0 += 1;
                e.1 += ns;
            }
            drop(view);
        }
        self.pending.clear();
        self.readback.unmap();
    }

    /// On the web nothing may block: the timings of the batch are dropped.
    #[cfg(target_arch = "wasm32")]
    pub(crate) fn collect(&mut self, _device: &wgpu::Device) {
        self.pending.clear();
    }

    /// The totals, longest first.
    pub(crate) fn report(&self) -> Vec<KernelTime> {
        let mut v: Vec<KernelTime> = self
            .totals
            .iter()
            .map(|(k, &(launches, total_ns))| KernelTime {
                kernel: k.clone(),
                launches,
                total_ns,
            })
            .collect();
        v.sort_by(|a, b| b.total_ns.total_cmp(&a.total_ns));
        v
    }

    pub(crate) fn reset(&mut self) {
        self.totals.clear();
    }
}
