#!/usr/bin/env bash
# Starts the desktop Studio under Xvfb (a virtual X display) on the embedded model, lets it train a few steps and
# saves a PNG of the window once training ends: the loss curve, the held-out loss and the learning-rate, speed and
# memory plots. Installs xvfb (Debian/Ubuntu) when it is missing; without a GPU the software Vulkan driver runs it.
# Usage: scripts/studio_screenshot.sh [OUT.png] [STEPS]
# STUDIO_BIN=path runs that binary instead of building one (CI passes the one `cargo test --workspace` built).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-studio.png}")
steps=${2:-8}
if ! command -v xvfb-run >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq xvfb >/dev/null
fi
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
bin="${STUDIO_BIN:-}"
if [ -z "$bin" ]; then
    cargo build -q -p hierarchos-studio
    bin="${CARGO_TARGET_DIR:-target}/debug/hierarchos-studio"
fi
home=$(mktemp -d)
rm -f "$out"
HIERARCHOS_STUDIO_HOME="$home" timeout 900 xvfb-run -a -s "-screen 0 1280x960x24" \
    "$bin" --train-steps "$steps" --screenshot "$out"
test -s "$out"
echo "screenshot: $out (runs in $home/runs)"
