//! WGSL math helpers shared by the generated kernels.

/// Accurate tanh, sigmoid, erfc, GELU and NaN-propagating max/min.
pub(crate) const MATH_WGSL: &str = include_str!("../../../../wgsl/math.wgsl");
