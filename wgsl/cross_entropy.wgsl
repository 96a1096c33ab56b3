// Cross-entropy helper shared by the forward and backward kernels: the class of a target given its bits, -1 when
// it is the ignore index (scalars 0 and 1: whether there is one, its bits), -2 when outside 0..C, else the class.

fn target_class(bits: u32) -> i32 {
    if (scalar_u32(0u) == 1u && bits == scalar_u32(1u)) {
        return -1;
    }
    if (bits >= p[1]) {
        return -2;
    }
    return i32(bits);
}
