//! What an adapter tells about its hardware beyond wgpu's API. Kernels that split their work to fill the GPU
//! (split-K products) launch whole waves of workgroups when they know how many multiprocessors there are.

/// The streaming multiprocessors of an NVIDIA GPU under Vulkan (`VK_NV_shader_sm_builtins`); `None` for other
/// adapters, which keep the kernels' portable defaults.
#[cfg(any(windows, target_os = "linux", target_os = "android", target_os = "freebsd"))]
pub(crate) fn multiprocessors(adapter: &wgpu::Adapter) -> Option<u32> {
    use ash::vk;
    // SAFETY: the Vulkan adapter is only read from while the reference lives.
    let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }?;
    if !hal
        .physical_device_capabilities()
        .supports_extension(ash::nv::shader_sm_builtins::NAME)
    {
        return None;
    }
    let mut sm = vk::PhysicalDeviceShaderSMBuiltinsPropertiesNV::default();
    let mut properties = vk::PhysicalDeviceProperties2::default().push_next(&mut sm);
    // SAFETY: a structure of an extension the physical device lists, chained to a query of its own instance.
    unsafe {
        hal.shared_instance()
            .raw_instance()
            .get_physical_device_properties2(hal.raw_physical_device(), &mut properties)
    };
    (sm.shader_sm_count > 0).then_some(sm.shader_sm_count)
}

/// Elsewhere wgpu has no Vulkan backend to ask.
#[cfg(not(any(windows, target_os = "linux", target_os = "android", target_os = "freebsd")))]
pub(crate) fn multiprocessors(_adapter: &wgpu::Adapter) -> Option<u32> {
    None
}
