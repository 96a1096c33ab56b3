#!/usr/bin/env python3
"""Training tokens/s and peak memory of a Llama-shaped model (random f32 weights, AdamW, clipping at 1.0) in
Hierarchos and in PyTorch eager (HF transformers' LlamaForCausalLM, TF32 off) on the same GPU: full-parameter
training, and with --lora R also LoRA fine-tuning (rank R, alpha 2R, every linear layer but the head, no dropout)
beside HF PEFT, with Hierarchos' frozen base held in f32 and in bf16. With --mixed, also mixed precision:
Hierarchos' `--dtype f16` and `--dtype bf16` beside `torch.autocast` in f16 (with a GradScaler) and bf16.

With --profile, also the GPU time of one f32 step in each, kernel by kernel (`hierarchos bench --profile train`
and torch.profiler), summed into products, attention and the rest: where Hierarchos loses to PyTorch.

Usage: python3 scripts/bench_train.py PATH_TO_HIERARCHOS_BINARY [--batch-size 8] [--seq-len 512] [--steps 5]
    [--lora 16] [--mixed] [--profile]
The default shape is the ~110M Llama: hidden 768, 12 layers, 12 heads, MLP 3072, vocabulary 32000.
"""
import argparse
import json
import re
import subprocess
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SHAPE = dict(hidden=768, layers=12, heads=12, intermediate=3072, vocab=32000)
MIB = 1 << 20


def hierarchos(a, extra):
    cmd = [a.binary, "bench", "train", "--json", "--batch-size", str(a.batch_size), "--seq-len", str(a.seq_len),
           "--steps", str(a.steps), *extra]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])


def pytorch(a, lora, autocast=None, profile=False):
    """tokens/s, peak bytes, trained parameters of PyTorch eager (with PEFT's LoRA when `lora` is a rank; under
    torch.autocast in `autocast`, "f16" or "bf16", when given); with `profile`, the GPU time per step of each
    kernel instead, as {name: ms}, over the timed steps."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=SHAPE["hidden"], num_hidden_layers=SHAPE["layers"],
                         num_attention_heads=SHAPE["heads"], num_key_value_heads=SHAPE["heads"],
                         intermediate_size=SHAPE["intermediate"], vocab_size=SHAPE["vocab"],
                         max_position_embeddings=a.seq_len, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).cuda().float().train()
    if lora:
        import peft
        model = peft.get_peft_model(model, peft.LoraConfig(r=lora, lora_alpha=2 * lora, lora_dropout=0.0,
                                                             target_modules="all-linear", task_type="CAUSAL_LM"))
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=1e-4)
    batches = [torch.randint(0, SHAPE["vocab"], (a.batch_size, a.seq_len), device="cuda") for _ in range(a.steps + 1)]

    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}.get(autocast)
    scaler = torch.amp.GradScaler("cuda", enabled=autocast == "f16")

    def step(ids):
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = model(input_ids=ids, labels=ids).loss
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    step(batches[0])
    torch.cuda.synchronize()
    if profile:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for ids in batches[1:]:
                step(ids)
            torch.cuda.synchronize()
        del model, opt
        torch.cuda.empty_cache()
        return {e.key: e.device_time_total / a.steps / 1000 for e in prof.key_averages() if e.device_time_total > 0}
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for ids in batches[1:]:
        step(ids)
    torch.cuda.synchronize()
    tps = a.steps * a.batch_size * a.seq_len / (time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated()
    n = sum(p.numel() for p in trained)
    del model, opt
    torch.cuda.empty_cache()
    return tps, peak, n


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lora", type=int, help="also LoRA fine-tuning of this rank")
    p.add_argument("--mixed", action="store_true", help="also mixed precision (f16, bf16) against torch.autocast")
    p.add_argument("--profile", action="store_true", help="also the GPU time of an f32 step, by kind of kernel")
    a = p.parse_args()

    rows = [("full-parameter", hierarchos(a, []), pytorch(a, None))]
    if a.mixed:
        for dtype in ["f16", "bf16"]:
            rows.append((f"full-parameter, products in {dtype} (autocast)", hierarchos(a, ["--dtype", dtype]),
                         pytorch(a, None, dtype)))
    if a.lora:
        peft_run = pytorch(a, a.lora)
        lora = ["--lora-r", str(a.lora), "--lora-targets", "all-linear"]
        rows.append((f"LoRA r={a.lora}, base f32", hierarchos(a, lora), peft_run))
        rows.append((f"LoRA r={a.lora}, base bf16 (Hierarchos) / f32 (PEFT)",
                     hierarchos(a, lora + ["--base-dtype", "bf16"]), peft_run))
    print(f"Llama shape {SHAPE}, {rows[0][1]['params'] / 1e6:.1f}M parameters, batch {a.batch_size} x {a.seq_len}, "
          f"f32 activations, AdamW, clip 1.0, {a.steps} timed steps, PyTorch {torch.__version__} eager (TF32 off)")
    print("| run | trained parameters | Hierarchos tokens/s | PyTorch tokens/s | ratio | Hierarchos peak | "
          "PyTorch peak | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for name, ours, (tps, peak, n) in rows:
        print(f"| {name} | {ours['trainable_params'] / 1e6:.2f}M / {n / 1e6:.2f}M | {ours['tokens_per_sec']:.0f} | "
              f"{tps:.0f} | {ours['tokens_per_sec'] / tps:.2f} | {ours['peak_bytes'] / MIB:.0f} MiB | "
              f"{peak / MIB:.0f} MiB | {ours['peak_bytes'] / peak:.2f} |")
    if a.profile:
        profile_table(a)


def kernel_groups(kernels, product, attention):
    """{products, attention, rest: ms} from {kernel name: ms}, by the two predicates on the name."""
    groups = {"products": 0.0, "attention": 0.0, "rest": 0.0}
    for name, ms in kernels.items():
        groups["products" if product(name) else "attention" if attention(name) else "rest"] += ms
    return groups


def profile_table(a):
    cmd = [a.binary, "bench", "--profile", "train", "--batch-size", str(a.batch_size), "--seq-len", str(a.seq_len),
           "--steps", "2"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    # Lines of `print_profile`: "  28537.6 µs     85.0 launches  KERNEL KEY".
    lines = re.findall(r"^\s+([\d.]+) µs\s+[\d.]+ launches\s+(\S.*)$", out, re.M)
    ours = kernel_groups({key: float(us) / 1000 for us, key in lines}, lambda k: k.startswith("matmul"),
                         lambda k: k.startswith("flash_attention"))
    theirs = kernel_groups(pytorch(a, None, profile=True), lambda k: "gemm" in k or "splitKreduce" in k,
                           lambda k: "fmha" in k or "attention" in k.lower())
    print("| GPU time of an f32 step, ms | Hierarchos | PyTorch | ratio |")
    print("|---|---|---|---|")
    for group in [*ours, "total"]:
        o = sum(ours.values()) if group == "total" else ours[group]
        t = sum(theirs.values()) if group == "total" else theirs[group]
        print(f"| {group} | {o:.1f} | {t:.1f} | {o / t:.2f} |")


if __name__ == "__main__":
    main()
