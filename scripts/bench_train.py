#!/usr/bin/env python3
"""Full-parameter training tokens/s and peak memory of a Llama-shaped model (random f32 weights, AdamW, clipping at
1.0) in Hierarchos and in PyTorch eager (HF transformers' LlamaForCausalLM, TF32 off) on the same GPU.

Usage: python3 scripts/bench_train.py PATH_TO_HIERARCHOS_BINARY [--batch-size 8] [--seq-len 512] [--steps 5]
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
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--steps", type=int, default=5)
    a = p.parse_args()
    shape = dict(hidden=768, layers=12, heads=12, intermediate=3072, vocab=32000)

    cmd = [a.binary, "bench", "train", "--json", "--batch-size", str(a.batch_size), "--seq-len", str(a.seq_len),
           "--steps", str(a.steps)]
    ours = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=shape["hidden"], num_hidden_layers=shape["layers"],
                         num_attention_heads=shape["heads"], num_key_value_heads=shape["heads"],
                         intermediate_size=shape["intermediate"], vocab_size=shape["vocab"],
                         max_position_embeddings=a.seq_len, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).cuda().float().train()
    params = sum(t.numel() for t in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = [torch.randint(0, shape["vocab"], (a.batch_size, a.seq_len), device="cuda") for _ in range(a.steps + 1)]

    def step(ids):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    step(batches[0])
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for ids in batches[1:]:
        step(ids)
    torch.cuda.synchronize()
    torch_tps = a.steps * a.batch_size * a.seq_len / (time.perf_counter() - t0)
    torch_peak = torch.cuda.max_memory_allocated()

    mib = 1 << 20
    print(f"Llama shape {shape}, {params / 1e6:.1f}M parameters (Hierarchos {ours['params'] / 1e6:.1f}M), "
          f"batch {a.batch_size} x {a.seq_len}, f32, AdamW, clip 1.0, {a.steps} timed steps")
    print("| | Hierarchos | PyTorch eager | ratio |")
    print("|---|---|---|---|")
    print(f"| training tokens/s | {ours['tokens_per_sec']:.0f} | {torch_tps:.0f} | {ours['tokens_per_sec'] / torch_tps:.2f} |")
    print(f"| peak memory in tensors | {ours['peak_bytes'] / mib:.0f} MiB | {torch_peak / mib:.0f} MiB | "
          f"{ours['peak_bytes'] / torch_peak:.2f} |")


if __name__ == "__main__":
    main()
