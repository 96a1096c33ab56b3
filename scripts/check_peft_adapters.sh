#!/usr/bin/env bash
# Continues fixture adapters made by PEFT (tests/fixtures/*/lora) through `hierarchos train --adapter` for the two
# AdamW steps of the fixtures' reference (torch's defaults, weight decay 0.01, batch A then batch B, no clipping),
# then has PEFT load the saved adapter (scripts/check_export.py): logits against `hierarchos forward --adapter`,
# and the trained tensors against the float64 reference.
# Usage: scripts/check_peft_adapters.sh PATH_TO_HIERARCHOS_BINARY [PYTHON]
set -euo pipefail
H=$1
PY=${2:-python3}
for fam in llama qwen2; do
  F=tests/fixtures/$fam
  $PY -c "import json; r=json.load(open('$F/reference.json')); [print(json.dumps({'input_ids': x})) for x in r['input_ids']]" > /tmp/$fam.jsonl
  rm -rf /tmp/ad-$fam
  $H train -m $F --adapter $F/lora --data /tmp/$fam.jsonl --no-shuffle --batch-size 1 --seq-len 24 --steps 2 --lr 1e-3 --lr-scheduler constant --weight-decay 0.01 --max-grad-norm 0 --out /tmp/ad-$fam 2>&1 | tail -1
  IDS=$($PY -c "import json; print(','.join(map(str, json.load(open('$F/reference.json'))['input_ids'][0])))")
  $H forward -m $F --adapter /tmp/ad-$fam --ids $IDS -o /tmp/ad-$fam.logits.safetensors 2>&1 | tail -1
  $PY scripts/check_export.py /tmp/ad-$fam /tmp/ad-$fam.logits.safetensors $IDS --base $F --reference $F/reference.safetensors lora/adamw/ 2>&1 | grep -v -i "warn\|Loading weights"
done
