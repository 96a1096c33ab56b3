#!/usr/bin/env python3
"""Checks that a folder written by `hierarchos train` loads in transformers (a model folder) or in PEFT (an adapter
folder, applied to BASE) as it is and gives the logits Hierarchos gives: loads FOLDER (f32 and float64), runs IDS
through it, and compares with LOGITS (a safetensors file from `hierarchos forward -m FOLDER --ids IDS -o LOGITS`,
or `-m BASE --adapter FOLDER` for an adapter). With --reference FILE PREFIX, also the adapter's tensors against
the float64 tensors FILE holds under PREFIX (the fixtures' `lora/adamw/`).

Usage: python3 scripts/check_export.py FOLDER LOGITS IDS [--base BASE] [--reference FILE PREFIX]
(IDS comma-separated)
"""
import argparse
from pathlib import Path

import safetensors.torch
import torch
import transformers


def main():
    p = argparse.ArgumentParser()
    p.add_argument("folder", type=Path)
    p.add_argument("logits")
    p.add_argument("ids")
    p.add_argument("--base", help="the base model of an adapter folder")
    p.add_argument("--reference", nargs=2, metavar=("FILE", "PREFIX"))
    a = p.parse_args()
    ids = [int(x) for x in a.ids.split(",")]
    ours = next(iter(safetensors.torch.load_file(a.logits).values())).double().reshape(len(ids), -1)
    x = torch.tensor([ids])
    adapter = (a.folder / "adapter_config.json").is_file()
    for dtype in (torch.float32, torch.float64):
        if adapter:
            import peft
            base = transformers.AutoModelForCausalLM.from_pretrained(a.base, dtype=dtype)
            model = peft.PeftModel.from_pretrained(base, a.folder).to(dtype).eval()
            what = f"PEFT {peft.__version__}"
        else:
            model = transformers.AutoModelForCausalLM.from_pretrained(a.folder, dtype=dtype).eval()
            what = "transformers"
        with torch.no_grad():
            theirs = model(x).logits[0].double()
        print(f"{what} {dtype}: max |logits - Hierarchos| = {(theirs - ours).abs().max().item():.3e} "
              f"(largest logit {theirs.abs().max().item():.2f})")
    if a.reference:
        saved = safetensors.torch.load_file(str(a.folder / "adapter_model.safetensors"))
        want = {k[len(a.reference[1]):]: v for k, v in safetensors.torch.load_file(a.reference[0]).items()
                if k.startswith(a.reference[1])}
        if set(saved) != set(want):
            raise SystemExit(f"tensor names differ: {sorted(set(saved) ^ set(want))}")
        worst = max((saved[k].double() - want[k]).abs().max().item() for k in want)
        print(f"{len(saved)} adapter tensors under PEFT's names; max |tensor - float64 reference| = {worst:.3e}")


if __name__ == "__main__":
    main()
