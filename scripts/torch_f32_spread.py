#!/usr/bin/env python3
"""How far PyTorch's own f32 training lands from the fixtures' float64 AdamW references, in each of several
legitimate ways to run it: the fixture script's way (CPU, one thread, deterministic), the CPU with all its
threads, and CUDA (TF32 off). All run transformers' eager attention: its SDPA path is another computation for
some families (Gemma 2 drops the score soft-capping there).

The two damped AdamW steps turn each gradient's rounding error into a parameter error of about the same size,
and the embedding rows and projections whose gradients nearly cancel follow any change of summation order
upstream. One f32 run is one sample of that noise; the spread over these runs is the scale an f32 implementation
can be held to. tests/nn_train.rs bounds Hierarchos by 1.5x the largest of them (`tests/fixtures/torch_f32_spread.json`).

Usage (on a machine with CUDA, PyTorch and transformers as in tests/fixtures/README.md):
    python3 scripts/torch_f32_spread.py --fixtures tests/fixtures --out tests/fixtures/torch_f32_spread.json
"""
import argparse
import copy
import json
import sys
from pathlib import Path

import safetensors.torch
import torch
import transformers

sys.path.insert(0, str(Path(__file__).parent))
from make_fixtures import ADAMW, adamw_steps, eager, saved_names  # noqa: E402

PREFIX = "adamw_damped"


def configurations():
    """(name, device, CPU threads or None for all); the CUDA one only where CUDA is."""
    runs = [("cpu_1_thread", "cpu", 1), ("cpu_all_threads", "cpu", None)]
    if torch.cuda.is_available():
        runs.append(("cuda", "cuda", None))
    return runs


def spread(folder, threads_all):
    config = transformers.AutoConfig.from_pretrained(folder)
    reference = safetensors.torch.load_file(str(folder / "reference.safetensors"))
    saved = safetensors.torch.load_file(str(folder / "model.safetensors"))
    ids = reference["input_ids"]
    want = {n[len(PREFIX) + 7:]: saved[n[len(PREFIX) + 7:]].double() + d.double()
            for n, d in reference.items() if n.startswith(f"{PREFIX}_delta/")}
    out = {}
    for name, device, threads in configurations():
        torch.set_num_threads(threads or threads_all)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, **eager(config)).to(device).eval()
        params, _ = adamw_steps(model, ids.to(device), ADAMW[PREFIX])
        params = {n: p.cpu() for n, p in saved_names(copy.deepcopy(model).cpu(), params).items()}
        errors = {n: (params[n].double() - w).abs().max().item() for n, w in want.items()}
        worst = max(errors, key=errors.get)
        out[name] = {"max_abs_param_err": errors[worst], "at": worst}
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixtures", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", nargs="*")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    transformers.logging.set_verbosity_error()
    threads_all = torch.get_num_threads()
    names = args.only or sorted(p.name for p in args.fixtures.iterdir() if (p / "reference.safetensors").exists())
    report = {}
    for name in names:
        report[name] = spread(args.fixtures / name, threads_all)
        line = ", ".join(f"{k} {v['max_abs_param_err']:.2e}" for k, v in report[name].items())
        print(f"{name}: {line}", flush=True)
    meta = {"torch": torch.__version__, "transformers": transformers.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    args.out.write_text(json.dumps({"versions": meta, "fixtures": report}, indent=2) + "\n")


if __name__ == "__main__":
    main()
