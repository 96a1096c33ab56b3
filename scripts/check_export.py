#!/usr/bin/env python3
"""Checks that a folder written by `hierarchos train` loads in transformers as it is and gives the logits
Hierarchos gives: loads FOLDER with AutoModelForCausalLM (f32 and float64), runs IDS through it, and compares with
LOGITS (a safetensors file from `hierarchos forward -m FOLDER --ids IDS -o LOGITS`).

Usage: python3 scripts/check_export.py FOLDER LOGITS IDS   (IDS comma-separated)
"""
import sys

import safetensors.torch
import torch
import transformers


def main():
    folder, logits_path, ids = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3].split(",")]
    ours = next(iter(safetensors.torch.load_file(logits_path).values())).double().reshape(len(ids), -1)
    x = torch.tensor([ids])
    for dtype in (torch.float32, torch.float64):
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
        with torch.no_grad():
            theirs = model(x).logits[0].double()
        print(f"transformers {dtype}: max |logits - Hierarchos| = {(theirs - ours).abs().max().item():.3e} "
              f"(largest logit {theirs.abs().max().item():.2f})")


if __name__ == "__main__":
    main()
