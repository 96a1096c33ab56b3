#!/usr/bin/env python3
"""Runs `hierarchos bench ops --json` and the same shapes in PyTorch on the same GPU; prints both and the ratio.

Usage: python3 scripts/bench_ops.py PATH_TO_HIERARCHOS_BINARY [--sizes 512,1024,2048,4096] [--rows-cols 8192,4096]
    [--linear 4096x768x768,...] [--attention 8x12x512x64,...]
Cases without a PyTorch counterpart (launch latency, decode attention) print Hierarchos' figure alone.
"""
import argparse
import json
import subprocess
import time

import torch


def bench(fn, iters):
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


def torch_cases(sizes, linear, rows, cols, attention, iters):
    out = {}
    dt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
    torch.backends.cuda.matmul.allow_tf32 = False
    for name, dtype in dt.items():
        for n in sizes:
            a = torch.randn(n, n, device="cuda", dtype=dtype)
            b = torch.randn(n, n, device="cuda", dtype=dtype)
            s = bench(lambda: a @ b, iters)
            out[("matmul", f"{n}x{n}x{n}", name)] = (s, 2 * n**3 / s / 1e12)
    for case in linear:
        tokens, inputs, outputs = (int(v) for v in case.split("x"))
        flops = 2 * tokens * inputs * outputs
        for name, dtype in dt.items():
            x = torch.randn(tokens, inputs, device="cuda", dtype=dtype)
            w = torch.randn(outputs, inputs, device="cuda", dtype=dtype)
            g = torch.randn(tokens, outputs, device="cuda", dtype=dtype)
            for op, fn in [("x@W.t", lambda: x @ w.t()), ("g@W", lambda: g @ w), ("g.t@x", lambda: g.t() @ x)]:
                s = bench(fn, iters)
                out[("linear", f"{case} {op}", name)] = (s, flops / s / 1e12)
    x = torch.randn(rows, cols, device="cuda")
    y = torch.randn(rows, cols, device="cuda")
    nbytes = rows * cols * 4
    shape = f"{rows}x{cols}"
    s = bench(lambda: torch.softmax(x, -1), iters)
    out[("softmax", shape, "f32")] = (s, 2 * nbytes / s / 1e9)
    s = bench(lambda: x + y, iters)
    out[("add", shape, "f32")] = (s, 3 * nbytes / s / 1e9)
    s = bench(lambda: x.sum(-1), iters)
    out[("sum", shape, "f32")] = (s, nbytes / s / 1e9)
    # Causal attention in training, as `hierarchos bench ops` times it (scaled_dot_product_attention picks its
    # fused f32 kernel).
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for case in attention:
        b, h, t, d = (int(v) for v in case.split("x"))
        q, k, v = (torch.randn(b, h, t, d, device="cuda", requires_grad=True) for _ in range(3))
        fwd = 2 * b * h * t * t * d
        with torch.no_grad():
            s = bench(lambda: sdpa(q, k, v, is_causal=True), iters)
        out[("attn_fwd", f"{case} causal", "f32")] = (s, fwd / s / 1e12)
        s = bench(lambda: sdpa(q, k, v, is_causal=True).sum().backward(), iters)
        out[("attn_fwd_bwd", f"{case} causal", "f32")] = (s, 3.5 * fwd / s / 1e12)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary")
    p.add_argument("--sizes", default="512,1024,2048,4096")
    p.add_argument("--rows-cols", default="8192,4096")
    p.add_argument("--linear", default="4096x768x768,4096x768x3072,4096x3072x768,4096x768x32000")
    p.add_argument("--attention", default="8x12x512x64")
    p.add_argument("--iters", type=int, default=10)
    a = p.parse_args()
    sizes = [int(v) for v in a.sizes.split(",")]
    rows, cols = (int(v) for v in a.rows_cols.split(","))
    cmd = [a.binary, "bench", "ops", "--json", "--sizes", a.sizes, "--rows-cols", a.rows_cols, "--linear", a.linear,
           "--attention", a.attention, "--iters", str(a.iters)]
    lines = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()
    ours = {}
    for line in lines:
        r = json.loads(line)
        ours[(r["op"], r["shape"], r["dtype"])] = (r["ms"] / 1e3, r["value"], r["unit"])
    theirs = torch_cases(sizes, a.linear.split(","), rows, cols, a.attention.split(","), a.iters)
    print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__} (TF32 off)")
    print(f"| op | shape | dtype | Hierarchos | PyTorch | ratio |")
    print(f"|---|---|---|---|---|---|")
    for key, (s, v, unit) in ours.items():
        if key not in theirs:
            print(f"| {key[0]} | {key[1]} | {key[2]} | {v:.1f} {unit} | | |")
            continue
        ts, tv = theirs[key]
        print(f"| {key[0]} | {key[1]} | {key[2]} | {v:.1f} {unit} | {tv:.1f} {unit} | {v / tv:.2f} |")


if __name__ == "__main__":
    main()
