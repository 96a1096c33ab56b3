//! `hierarchos info`: what the runtime sees and what it chose, so users can tell why a kernel variant runs.

use anyhow::{Context, Result};
use hierarchos_core::Gpu;

pub fn run() -> Result<()> {
    println!("Adapters:");
    for a in hierarchos_wgpu::list_adapters() {
        let i = &a.info;
        println!(
            "  [{}] {} ({:?}, {:?}, driver: {} {})",
            a.index, i.name, i.backend, i.device_type, i.driver, i.driver_info
        );
    }
    let gpu = Gpu::default_gpu().context("opening the default GPU")?;
    let i = gpu.adapter_info();
    let caps = gpu.caps();
    let l = gpu.limits();
    let on = |b: bool| if b { "on" } else { "off" };
    println!("Chosen: {} ({:?}, {:?})", i.name, i.backend, i.device_type);
    println!("  driver: {} {}", i.driver, i.driver_info);
    println!(
        "  subgroups: {} (size {}..{})",
        on(caps.subgroups),
        caps.subgroup_size.0,
        caps.subgroup_size.1
    );
    println!("  f16: {}", on(caps.f16));
    println!("  timestamps: {}", on(caps.timestamps));
    println!("  cooperative matrix: {}", on(caps.cooperative_matrix));
    println!("  max buffer: {} MiB", l.max_buffer_size >> 20);
    println!("  max storage binding: {} MiB", l.max_storage_buffer_binding_size >> 20);
    println!(
        "  max workgroup storage: {} KiB",
        l.max_compute_workgroup_storage_size >> 10
    );
    println!(
        "  max invocations per workgroup: {}",
        l.max_compute_invocations_per_workgroup
    );
    println!(
        "  max storage buffers per stage: {}",
        l.max_storage_buffers_per_shader_stage
    );
    println!("Select another adapter with HIERARCHOS_ADAPTER=<index or name>; turn features off with");
    println!("HIERARCHOS_DISABLE=subgroup,f16,coopmat.");
    Ok(())
}
