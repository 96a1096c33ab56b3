// The sum of a row as the row kernels add it (rows.wgsl: 256 threads, thread t adding elements t, t + 256, ...
// in order, then a tree halving the threads, t taking t + s for s = 128, 64, ..., 1), for kernels that take a row
// per subgroup of L lanes (a power of two, at most 64) reading quads q = lane + n L: the same additions in the
// same order, so that they give the row kernels' bits. Lane l stands for threads 4l + i + 4L m (component i of
// slot m, m < 64 / L), which element j of the row (quad n of the lane) belongs to exactly when m = n % (64 / L):
// tree steps s >= 4L add slots of one lane, steps 4 <= s < 4L shuffle lanes down, steps 2 and 1 add components.

fn row_sum(parts: array<vec4<f32>, SLOTS>, lanes: u32) -> f32 {
    var slot = parts;
    for (var s = 32u / lanes; s > 0u; s = s >> 1u) {
        for (var m = 0u; m < s; m = m + 1u) {
            slot[m] = slot[m] + slot[m + s];
        }
    }
    var a = slot[0];
    for (var d = lanes / 2u; d > 0u; d = d >> 1u) {
        a = a + subgroupShuffleDown(a, d);
    }
    return subgroupBroadcastFirst((a.x + a.z) + (a.y + a.w));
}
