#!/usr/bin/env bash
# Time from a cold process to the first generated token for the 110M Llama shape (random weights, saved by one
# training step): three runs with the caches as they are (the first fills them), then without the NVIDIA
# driver's own shader cache and Hierarchos' pipeline cache, then with the pipeline cache only.
# Usage: scripts/bench_warm_start.sh PATH_TO_HIERARCHOS_BINARY
set -euo pipefail
bin=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/model"
cp assets/tiny-llama/tokenizer.json assets/tiny-llama/tokenizer_config.json "$work/model/"
python3 - "$work/model/config.json" <<'PY'
import json, sys
c = json.load(open("assets/tiny-llama/config.json"))
c.update(vocab_size=32000, hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
         num_key_value_heads=12, head_dim=64, max_position_embeddings=2048, tie_word_embeddings=False)
json.dump(c, open(sys.argv[1], "w"))
PY
"$bin" train -m "$work/model" --data assets/tinyshakespeare.txt --steps 1 --batch-size 1 --seq-len 64 \
    --out "$work/run" 2>&1 | tail -1
generate() { "$bin" generate -m "$work/run" -p "ROMEO:" -n 1 >/dev/null 2>&1; }
TIMEFORMAT="%R s"
for i in 1 2 3; do echo -n "run $i: "; time generate; done
echo -n "no driver shader cache, no pipeline cache: "
time (HIERARCHOS_DISABLE=pipeline_cache __GL_SHADER_DISK_CACHE=0 generate)
echo -n "pipeline cache only: "
time (__GL_SHADER_DISK_CACHE=0 generate)
