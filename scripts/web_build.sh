#!/usr/bin/env bash
# Builds the web demo (the Studio's crate for wasm32-unknown-unknown, on WebGPU) into OUT (default target/web):
# the wasm module bound to JavaScript by wasm-bindgen, and index.html. The wasm-bindgen CLI must be the version of
# the wasm-bindgen crate in Cargo.lock; if $HIERARCHOS_TOOLS/bin (default ~/.cache/hierarchos-tools/bin) lacks it,
# it is installed there with cargo (about 5 minutes, once).
#
#   scripts/web_build.sh [OUT] [--dev] [--serve PORT]
#
# --dev builds the dev profile (dependencies optimized, Hierarchos' own crates not; it reuses CI's wasm32 check
# build). With --serve, the folder is then served on http://127.0.0.1:PORT/ (WebGPU needs a secure context:
# localhost is).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/target/web
port=
profile=release
while [ $# -gt 0 ]; do
  case "$1" in
    --serve) port=$2; shift 2 ;;
    --dev) profile=dev; shift ;;
    *) out=$1; shift ;;
  esac
done
cd "$root"
version=$(awk '$0 == "name = \"wasm-bindgen\"" { getline; gsub(/"/, "", $3); print $3 }' Cargo.lock)
[ -n "$version" ] || { echo "web_build: no wasm-bindgen in Cargo.lock" >&2; exit 1; }
tools=${HIERARCHOS_TOOLS:-$HOME/.cache/hierarchos-tools}
bindgen=$tools/bin/wasm-bindgen
if ! "$bindgen" --version 2>/dev/null | grep -qx "wasm-bindgen $version"; then
  echo "web_build: installing wasm-bindgen-cli $version into $tools" >&2
  cargo install wasm-bindgen-cli --version "$version" --root "$tools"
fi
rustup target list --installed | grep -qx wasm32-unknown-unknown || rustup target add wasm32-unknown-unknown
cargo rustc -p hierarchos-studio --lib --profile "$profile" --target wasm32-unknown-unknown --crate-type cdylib
target_dir=${CARGO_TARGET_DIR:-$root/target}
[ "$profile" = dev ] && folder=debug || folder=release
mkdir -p "$out"
"$bindgen" --target web --no-typescript --out-dir "$out" \
  "$target_dir/wasm32-unknown-unknown/$folder/hierarchos_studio.wasm"
cp crates/hierarchos-studio/web/index.html "$out/"
echo "web_build: $out ($(du -sh "$out" | cut -f1))" >&2
if [ -n "$port" ]; then
  echo "web_build: serving http://127.0.0.1:$port/" >&2
  exec python3 -m http.server --bind 127.0.0.1 --directory "$out" "$port"
fi
