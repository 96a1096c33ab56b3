//! What an adapter tells about its hardware beyond wgpu's API, and the device features wgpu does not know to
//! enable. Kernels that split their work to fill the GPU (split-K products) launch whole waves of workgroups when
//! they know how many multiprocessors there are; bf16 products run on tensor cores where the driver has
//! `VK_KHR_shader_bfloat16`, which wgpu 30 neither reports nor enables.

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

#[cfg(any(windows, target_os = "linux", target_os = "android", target_os = "freebsd"))]
const BFLOAT16_EXTENSION: &std::ffi::CStr = c"VK_KHR_shader_bfloat16";

/// `VkPhysicalDeviceShaderBfloat16FeaturesKHR`, which the ash release wgpu-hal uses predates.
#[cfg(any(windows, target_os = "linux", target_os = "android", target_os = "freebsd"))]
#[repr(C)]
struct Bfloat16Features {
    s_type: ash::vk::StructureType,
    p_next: *mut std::ffi::c_void,
    shader_bfloat16_type: ash::vk::Bool32,
    shader_bfloat16_dot_product: ash::vk::Bool32,
    shader_bfloat16_cooperative_matrix: ash::vk::Bool32,
}

#[cfg(any(windows, target_os = "linux", target_os = "android", target_os = "freebsd"))]
impl Bfloat16Features {
    /// `VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_BFLOAT16_FEATURES_KHR`; the component type
    /// `VK_COMPONENT_TYPE_BFLOAT16_KHR` has the same number.
    const S_TYPE: i32 = 1_000_141_000;

    fn new(type_and_cooperative_matrix: bool) -> Self {
        let on = ash::vk::Bool32::from(type_and_cooperative_matrix);
        Bfloat16Features {
            s_type: ash::vk::StructureType::from_raw(Self::S_TYPE),
            p_next: std::ptr::null_mut(),
            shader_bfloat16_type: on,
            shader_bfloat16_dot_product: 0,
            shader_bfloat16_cooperative_matrix: on,
        }
    }
}

/// Whether the Vulkan adapter multiplies bf16 cooperative matrices of `edge` x `edge` x `edge` into f32 ones
/// within a subgroup (`VK_KHR_shader_bfloat16` with its type and cooperative-matrix features), the shape the
/// f16 tensor-core kernels use: then bf16 products run those kernels too.
#[cfg(any(windows, target_os = "linux", target_os = "android", target_os = "freebsd"))]
pub(crate) fn bf16_cooperative_matrix(adapter: &wgpu::Adapter, edge: u32) -> bool {
    use ash::vk;
    // SAFETY: the Vulkan adapter is only read from while the reference lives.
    let Some(hal) = (unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }) else {
        return false;
    };
    if !hal
        .physical_device_capabilities()
        .supports_extension(BFLOAT16_EXTENSION)
    {
        return false;
    }
    let shared = hal.shared_instance();
    let mut features = Bfloat16Features::new(false);
    let mut query = vk::PhysicalDeviceFeatures2 {
        p_next: (&raw mut features).cast(),
        ..Default::default()
    };
    // SAFETY: the structure of an extension the physical device lists, chained to a query of its own instance.
    unsafe {
        shared
            .raw_instance()
            .get_physical_device_features2(hal.raw_physical_device(), &mut query)
    };
    if features.shader_bfloat16_type == 0 || features.shader_bfloat16_cooperative_matrix == 0 {
        return false;
    }
    let coop = ash::khr::cooperative_matrix::Instance::new(shared.entry(), shared.raw_instance());
    // SAFETY: the adapter offers cooperative matrices (the caller checked wgpu's feature for them).
    let shapes = unsafe { coop.get_physical_device_cooperative_matrix_properties(hal.raw_physical_device()) };
    let bf16 = vk::ComponentTypeKHR::from_raw(Bfloat16Features::S_TYPE);
    shapes.unwrap_or_default().iter().any(|c| {
        (c.m_size, c.n_size, c.k_size) == (edge, edge, edge)
            && (c.a_type, c.b_type) == (bf16, bf16)
            && (c.c_type, c.result_type) == (vk::ComponentTypeKHR::FLOAT32, vk::ComponentTypeKHR::FLOAT32)
            && c.scope == vk::ScopeKHR::SUBGROUP
    })
}

/// Elsewhere wgpu has no Vulkan backend to ask.
#[cfg(not(any(windows, target_os = "linux", target_os = "android", target_os = "freebsd")))]
pub(crate) fn bf16_cooperative_matrix(_adapter: &wgpu::Adapter, _edge: u32) -> bool {
    false
}

/// Opens the device as `desc` asks, with bf16 shader types and cooperative matrices enabled too where `bf16`
/// (which [`bf16_cooperative_matrix`] allowed): through wgpu-hal, which takes extra Vulkan extensions and
/// features at device creation. Errors are the driver's or wgpu's message.
#[cfg(any(windows, target_os = "linux", target_os = "android", target_os = "freebsd"))]
pub(crate) async fn request_device(
    adapter: &wgpu::Adapter,
    desc: &wgpu::DeviceDescriptor<'_>,
    bf16: bool,
) -> Result<(wgpu::Device, wgpu::Queue), String> {
    if !bf16 {
        return adapter.request_device(desc).await.map_err(|e| e.to_string());
    }
    let mut features = Box::new(Bfloat16Features::new(true));
    let chained: *mut Bfloat16Features = &mut *features;
    let callback = Box::new(move |args: wgpu::hal::vulkan::CreateDeviceCallbackArgs| {
        args.extensions.push(BFLOAT16_EXTENSION);
        // SAFETY: `features` outlives the device creation this chain is read by, and keeps the rest of the chain.
        unsafe { (*chained).p_next = args.create_info.p_next.cast_mut() };
        args.create_info.p_next = chained.cast_const().cast();
    });
    let opened = {
        // SAFETY: the Vulkan adapter is only used to open a device while the reference lives.
        let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }.ok_or("not a Vulkan adapter")?;
        // SAFETY: the callback only adds an extension the adapter lists and its features' structure.
        unsafe {
            hal.open_with_callback(
                desc.required_features,
                &desc.required_limits,
                &desc.memory_hints,
                Some(callback),
            )
        }
        .map_err(|e| e.to_string())?
    };
    drop(features);
    // SAFETY: the hal device was opened on this adapter with the features and limits of `desc`.
    unsafe { adapter.create_device_from_hal(opened, desc) }.map_err(|e| e.to_string())
}

/// Elsewhere there is no extra feature to enable.
#[cfg(not(any(windows, target_os = "linux", target_os = "android", target_os = "freebsd")))]
pub(crate) async fn request_device(
    adapter: &wgpu::Adapter,
    desc: &wgpu::DeviceDescriptor<'_>,
    _bf16: bool,
) -> Result<(wgpu::Device, wgpu::Queue), String> {
    adapter.request_device(desc).await.map_err(|e| e.to_string())
}
