#!/usr/bin/env bash
# The web demo's test: builds it (scripts/web_build.sh), serves it with the llama fixture next to it on
# 127.0.0.1, and has headless Chromium (Debian's chromium, WebGPU behind --enable-unsafe-webgpu) run scripted
# sessions through Playwright: fetch the fixture, generate greedily (the ids must equal `hierarchos generate`'s on
# this machine), then train (the loss must fall); then the same generation from the fixture's files given to the
# page's file picker; and a browser without WebGPU must get a message in the page. Installs chromium and
# playwright-core when missing.
#
#   scripts/web_test.sh HIERARCHOS_CLI [SCREENSHOT.png]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cli=$1
screenshot=${2:-}
cd "$root"
tools=${HIERARCHOS_TOOLS:-$HOME/.cache/hierarchos-tools}
if ! command -v chromium >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
fi
if [ ! -d "$tools/node/node_modules/playwright-core" ]; then
  npm install --silent --no-audit --no-fund --prefix "$tools/node" playwright-core@1
fi
out=$(mktemp -d)
server=
trap 'kill $server 2>/dev/null || true; rm -rf "$out"' EXIT
scripts/web_build.sh "$out" --dev
mkdir -p "$out/fixtures"
cp -r tests/fixtures/llama "$out/fixtures/llama"
prompt="The quick brown fox"
tokens=12
steps=6
expected=$("$cli" generate -m tests/fixtures/llama -p "$prompt" -n "$tokens" --json | tail -n 1 |
  python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["ids"]))')
echo "web_test: the native CLI generates $expected" >&2
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -m http.server --bind 127.0.0.1 --directory "$out" "$port" >/dev/null 2>&1 &
server=$!
for _ in $(seq 50); do
  curl -sf "http://127.0.0.1:$port/index.html" >/dev/null && break
  sleep 0.1
done
query=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.urlencode({"model": "fixtures/llama", "prompt": sys.argv[1], "tokens": sys.argv[2], "train_steps": sys.argv[3]}))' "$prompt" "$tokens" "$steps")
export NODE_PATH="$tools/node/node_modules"
node tests/web/demo.cjs "http://127.0.0.1:$port/index.html?$query" "$expected" "$steps" ${screenshot:+"$screenshot"}
# The same model through the file picker (generation only).
picked=$(printf "$root/tests/fixtures/llama/%s," config.json tokenizer.json tokenizer_config.json \
  generation_config.json model.safetensors)
query=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.urlencode({"pick": 1, "prompt": sys.argv[1], "tokens": sys.argv[2]}))' "$prompt" "$tokens")
PICK_FILES=${picked%,} node tests/web/demo.cjs "http://127.0.0.1:$port/index.html?$query" "$expected" 0
# A browser without WebGPU gets a message in the page.
NO_WEBGPU=1 node tests/web/demo.cjs "http://127.0.0.1:$port/index.html" "[]" 0
