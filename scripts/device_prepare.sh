#!/usr/bin/env bash
# Prepares one lease of the GPU machine (`run` in the tool library), where nothing can be built or downloaded:
# builds the release CLI and the tensor-core tests, fetches the Vulkan loader's .deb, and packs them into the
# ignored folders .bench/ and .gl/ with .bench/run.sh. Then, from the checkout, one device call per part, with
# carry [".gl", ".bench"]:
#   bash .bench/run.sh tests   the tensor-core kernels against the CPU reference on the GPU (ops_matmul,
#                              ops_flash_attention), then `bench_ops.py` with and without cooperative matrices
#   bash .bench/run.sh train   `bench_train.py --mixed`, then `--lora 16`
#   bash .bench/run.sh sass    the driver's shader cache after the f16 and bf16 products of `bench ops`, as
#                              $OUT/nvidia-cache.tgz: read it here with scripts/nv_sass.py
# Each part stays under the 10 minutes a call may take. About 10-15 minutes of building on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/hierarchos-release-target}"
for d in .gl .bench; do
    grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >>.git/info/exclude
done
rm -rf .bench
mkdir -p .gl .bench
# The NVIDIA ICD (libGLX_nvidia) cannot create an instance without glvnd's libGLdispatch: bring it with the loader.
if ! ls .gl/libvulkan1_*.deb .gl/libglvnd0_*.deb >/dev/null 2>&1; then
    lists="$(mktemp -d)"
    mkdir -p "$lists/partial"
    apt="-oAPT::Architecture=amd64 -oDir::State::Lists=$lists"
    # shellcheck disable=SC2086
    apt-get $apt update -qq && (cd .gl && apt-get $apt download -qq libvulkan1 libglvnd0 libglx0 libegl1)
fi
cargo build -q --release -p hierarchos-cli
# Stripped: a device call carries the tracked tree (53 MiB) and these folders within 64 MiB.
tmp="$(mktemp -d)"
for test in ops_matmul ops_flash_attention; do
    bin="$(cargo test --release --test "$test" --no-run 2>&1 | grep -m1 -o "/[^ )]*/$test-[0-9a-f]*")"
    strip -o "$tmp/$test" "$bin"
    xz -T2 -6 -c "$tmp/$test" >".bench/$test.xz"
done
strip -o "$tmp/hierarchos" "$CARGO_TARGET_DIR/release/hierarchos"
xz -T2 -6 -c "$tmp/hierarchos" >.bench/hierarchos.xz
rm -rf "$tmp"
cat >.bench/run.sh <<'RUN'
# Made by scripts/device_prepare.sh: bash .bench/run.sh tests|train|sass
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
for f in .bench/*.xz; do xz -dc "$f" >"/tmp/$(basename "$f" .xz)"; chmod +x "/tmp/$(basename "$f" .xz)"; done
/tmp/hierarchos info 2>&1 | grep -E "Chosen|cooperative|subgroups"
case "${1:-}" in
tests)
    for t in ops_matmul ops_flash_attention; do
        echo "== $t on the GPU"
        timeout 120 "/tmp/$t" 2>&1 | grep -E "test result|panicked|FAILED|cooperative" | head -20
    done
    linear=512x768x768,500x768x768,37x576x1536,1000x960x960
    echo "== bench_ops.py, cooperative matrices on"
    timeout 200 python3 scripts/bench_ops.py /tmp/hierarchos --sizes 4096 --linear $linear --iters 20 2>&1 | grep -E "f16|ratio"
    echo "== bench_ops.py, HIERARCHOS_DISABLE=coopmat"
    HIERARCHOS_DISABLE=coopmat timeout 200 python3 scripts/bench_ops.py /tmp/hierarchos --sizes 4096 --linear $linear \
        --iters 20 2>&1 | grep -E "f16|ratio"
    ;;
train)
    echo "== bench_train.py --mixed"
    timeout 280 python3 scripts/bench_train.py /tmp/hierarchos --mixed 2>&1 | tail -12
    echo "== bench_train.py --lora 16"
    timeout 280 python3 scripts/bench_train.py /tmp/hierarchos --lora 16 2>&1 | tail -12
    ;;
sass)
    rm -rf ~/.cache/nvidia
    HIERARCHOS_DISABLE=pipeline_cache timeout 200 /tmp/hierarchos bench ops --sizes 4096 --linear 4096x768x3072 \
        --rows-cols 64,64 --attention 1x1x64x64 --iters 5 2>&1 | grep -E "matmul|x@W|g@W|g.t@x"
    tar -C ~/.cache -czf "$OUT/nvidia-cache.tgz" nvidia && ls -l "$OUT"
    ;;
*)
    echo "usage: bash .bench/run.sh tests|train|sass" >&2
    exit 2
    ;;
esac
RUN
du -sh .bench .gl
