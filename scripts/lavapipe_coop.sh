#!/usr/bin/env bash
# Runs a cargo command on a newer lavapipe, one that offers cooperative matrices (f16 8 x 8 x 8 into f32, Mesa
# 25.1 and later), so that the tensor-core matmul kernel runs and is tested on a CPU. Debian 12's Mesa 22.3 has
# none. Mesa and its libraries come from Debian trixie-backports (signed by the Debian archive keys Debian 12
# carries), unpacked, not installed, into a folder of their own with trixie's C library; cargo starts each test
# binary through that folder's dynamic loader (its target runner), so nothing on the system changes.
#
# Usage: scripts/lavapipe_coop.sh cargo test --test ops_matmul
# The folder is kept for later runs: $HIERARCHOS_TOOLS/lavapipe-coop (default /var/tmp/hierarchos-tools).
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: scripts/lavapipe_coop.sh COMMAND [ARGS...]" >&2; exit 2; }
root="${HIERARCHOS_TOOLS:-/var/tmp/hierarchos-tools}/lavapipe-coop"
lib="$root/usr/lib/x86_64-linux-gnu"
[ "$(uname -m)" = x86_64 ] || { echo "lavapipe_coop.sh: x86_64 only" >&2; exit 1; }

if [ ! -f "$root/lvp_icd.json" ]; then
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    mkdir -p "$work/state/lists/partial" "$work/cache/archives/partial" "$work/debs"
    touch "$work/state/status"
    keys=/usr/share/keyrings/debian-archive-keyring.gpg
    cat >"$work/sources.list" <<EOF
deb [signed-by=$keys] http://deb.debian.org/debian trixie main
deb [signed-by=$keys] http://deb.debian.org/debian trixie-backports main
EOF
    cat >"$work/apt.conf" <<EOF
Dir::State "$work/state";
Dir::State::status "$work/state/status";
Dir::Cache "$work/cache";
Dir::Etc::SourceList "$work/sources.list";
Dir::Etc::SourceParts "/dev/null";
Dir::Etc::Preferences "/dev/null";
Dir::Etc::PreferencesParts "/dev/null";
APT::Architecture "amd64";
APT::Default-Release "trixie-backports";
APT::Sandbox::User "root";
Acquire::Languages "none";
EOF
    export APT_CONFIG="$work/apt.conf"
    apt-get update -qq
    # Every package Mesa's Vulkan drivers and the Vulkan loader need, down to the C library.
    packages="$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
        --no-replaces --no-enhances mesa-vulkan-drivers libvulkan1 | grep -v '^[ <]' | sort -u)"
    # shellcheck disable=SC2086
    (cd "$work/debs" && apt-get download -qq $packages)
    rm -rf "$root.partial"
    mkdir -p "$root.partial"
    for deb in "$work"/debs/*.deb; do
        dpkg-deb -x "$deb" "$root.partial"
    done
    version="$(dpkg-deb -f "$work"/debs/mesa-vulkan-drivers_*.deb Version)"
    cat >"$root.partial/lvp_icd.json" <<EOF
{"file_format_version": "1.0.0", "ICD": {"library_path": "$lib/libvulkan_lvp.so", "api_version": "1.3.0"}}
EOF
    echo "lavapipe_coop.sh: Mesa $version unpacked into $root"
    rm -rf "$root"
    mv "$root.partial" "$root"
fi

export VK_DRIVER_FILES="$root/lvp_icd.json"
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$lib/ld-linux-x86-64.so.2 --library-path $lib"
exec "$@"
