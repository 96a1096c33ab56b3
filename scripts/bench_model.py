#!/usr/bin/env python3
"""Prefill and decode tokens/s of a Llama-shaped model (random f32 weights) in Hierarchos and in HF transformers on
the same GPU, with the memory-bandwidth roofline for decode.

Usage: python3 scripts/bench_model.py PATH_TO_HIERARCHOS_BINARY [--prefill 512] [--decode 128]
The default shape is the ~110M Llama: hidden 768, 12 layers, 12 heads, MLP 3072, vocabulary 32000.
"""
import argparse
import json
import subprocess
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary")
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--decode", type=int, default=128)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--hbm-gbs", type=float, default=4300.0, help="measured device copy bandwidth, GB/s")
    a = p.parse_args()
    shape = dict(hidden=768, layers=12, heads=12, intermediate=3072, vocab=32000)

    cmd = [a.binary, "bench", "model", "--json", "--prefill", str(a.prefill), "--decode", str(a.decode),
           "--iters", str(a.iters)]
    # Each side runs `repeats` times and keeps its best figures (decode timings vary by +-20% run to run).
    runs = [json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
            for _ in range(a.repeats)]
    ours = {k: max(r[k] for r in runs) for k in runs[0]}
    ours["dispatches_per_token"] = runs[0]["dispatches_per_token"]

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=shape["hidden"], num_hidden_layers=shape["layers"],
                         num_attention_heads=shape["heads"], num_key_value_heads=shape["heads"],
                         intermediate_size=shape["intermediate"], vocab_size=shape["vocab"],
                         max_position_embeddings=2048, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).cuda().float().eval()
    params = sum(t.numel() for t in model.parameters())
    ids = torch.randint(0, shape["vocab"], (1, a.prefill), device="cuda")
    short = ids[:, :16]

    prefill_tps, decode_tps = 0.0, 0.0
    gen = dict(max_new_tokens=a.decode, min_new_tokens=a.decode, do_sample=False, pad_token_id=0)
    # Prefill as generation runs it, on both sides: the prompt's keys and values cached and the logits of the last
    # position only (Hierarchos' `forward_last`; transformers' `logits_to_keep=1`, which `generate` passes).
    with torch.no_grad():
        model(ids, logits_to_keep=1)
        model.generate(short, **gen)
        for _ in range(a.repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(a.iters):
                model(ids, logits_to_keep=1)
            torch.cuda.synchronize()
            prefill_tps = max(prefill_tps, a.prefill * a.iters / (time.perf_counter() - t0))

            t0 = time.perf_counter()
            model(short)
            torch.cuda.synchronize()
            t_prompt = time.perf_counter() - t0
            t0 = time.perf_counter()
            model.generate(short, **gen)
            torch.cuda.synchronize()
            decode_tps = max(decode_tps, a.decode / (time.perf_counter() - t0 - t_prompt))

    roofline = a.hbm_gbs * 1e9 / (params * 4)
    print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"transformers {__import__('transformers').__version__} (attention: {model.config._attn_implementation})")
    print(f"model: {params / 1e6:.1f}M parameters, f32 (Hierarchos counts {ours['params'] / 1e6:.1f}M)")
    print("| phase | Hierarchos | HF transformers | ratio | roofline |")
    print("|---|---|---|---|---|")
    print(f"| prefill {a.prefill} tokens | {ours['prefill_tok_s']:.0f} tok/s | {prefill_tps:.0f} tok/s | "
          f"{ours['prefill_tok_s'] / prefill_tps:.2f} | |")
    print(f"| decode {a.decode} tokens | {ours['decode_tok_s']:.1f} tok/s | {decode_tps:.1f} tok/s | "
          f"{ours['decode_tok_s'] / decode_tps:.2f} | {roofline:.0f} tok/s (weights once per token at "
          f"{a.hbm_gbs:.0f} GB/s) |")
    print(f"Hierarchos kernel launches per decoded token: {ours['dispatches_per_token']:.0f}")


if __name__ == "__main__":
    main()
