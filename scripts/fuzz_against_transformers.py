#!/usr/bin/env python3
"""Differential test of Hierarchos against transformers on random configurations: each case makes a tiny random
model of a family with random options (attention layout, head_dim, biases, activations, rope types and scalings,
partial rotary, sliding windows, soft-capping, family switches), saves it with `save_pretrained`, runs
`hierarchos forward` on random ids, and compares the logits with transformers' in float64 and float32 (eager
attention). A case diverges when Hierarchos is more than 1e-4 from both; transformers' own f32 error on these
models is about 1e-5 (a few badly conditioned draws, Gemma's and Granite's sharp softmaxes, come near 1e-4).
Refusals (an error from Hierarchos) are listed, not failures.

Usage (CPU is enough; transformers and torch as in tests/fixtures/README.md):
    cargo build --release -p hierarchos-cli
    python3 scripts/fuzz_against_transformers.py target/release/hierarchos --seed 1 --count 100 [--families llama,phi3]
Session 36 ran 1,090 cases over all 31 families this way; the one divergence it found is fixed.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import CONFIG_MAPPING, AutoModelForCausalLM  # noqa: E402

TOLERANCE = 1e-4
DENSE_FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3_text", "phi3", "gpt_neox", "falcon",
            "stablelm", "starcoder2", "cohere", "nemotron", "olmo2", "olmo3", "granite", "exaone4", "glm", "smollm3",
            "seed_oss", "arcee", "phi", "gpt2"]


def randomize(model, seed, std=0.5):
    """Every parameter random (norm weights around 1), so that every path of the forward matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            parts = n.lower().split(".")
            is_norm = p.dim() == 1 and n.endswith("weight") and any("norm" in q or q.startswith("ln") for q in parts)
            p.copy_((1 + 0.3 * noise if is_norm else std * noise).to(p.dtype))
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.copy_((0.3 * torch.randn(b.shape, generator=g, dtype=torch.float64)).to(b.dtype))


def run_case(cli, work, name, model_type, cfg, length, seed):
    """One case: the result as a dict (status OK, DIVERGE or refused, the largest differences)."""
    config = CONFIG_MAPPING[model_type](**cfg)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32,
                                             experts_implementation="eager").eval()
    randomize(model, seed)
    folder = work / name
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder, safe_serialization=True)
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, config.vocab_size, (length,), generator=g).tolist()
    x = torch.tensor([ids])
    with torch.no_grad():
        l32 = model(x).logits[0].double()
        model64 = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float64,
                                                       experts_implementation="eager").eval()
        l64 = model64(x).logits[0].double()
    out = folder / "hierarchos.safetensors"
    r = subprocess.run([cli, "forward", "-m", str(folder), "--ids", ",".join(map(str, ids)), "-o", str(out)],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, RUST_BACKTRACE="0"))
    result = dict(name=name, model_type=model_type, cfg=cfg, ids=ids, seed=seed)
    if r.returncode != 0:
        result.update(status="refused", message=" | ".join(r.stderr.strip().splitlines()[:4])[:400])
    else:
        logits = load_file(str(out))["logits"].double()
        d64 = (logits - l64).abs().max().item()
        d32 = (logits - l32).abs().max().item()
        result.update(status="OK" if min(d64, d32) <= TOLERANCE else "DIVERGE", vs_f64=d64, vs_f32=d32,
                      transformers_f32_vs_f64=(l32 - l64).abs().max().item())
    if result["status"] == "OK":
        shutil.rmtree(folder, ignore_errors=True)
    return result


def random_rope(R, allow):
    """A random rope scaling block of one of the kinds in `allow` (\"none\": no block)."""
    ch = R.choice
    k = ch(allow)
    omp = ch([4, 8, 16])
    if k=="none": return None
    if k=="linear": return {"rope_type":"linear","factor":ch([2.0,4.0,0.5])}
    if k=="dynamic":
        return {"rope_type":"dynamic","factor":ch([2.0,3.0])}
    if k=="yarn":
        d={"rope_type":"yarn","factor":ch([2.0,4.0,8.0]),"original_max_position_embeddings":omp}
        if R.random()<0.3: d["attention_factor"]=ch([0.7,1.2])
        if R.random()<0.3: d["beta_fast"]=ch([8.0,16.0]); d["beta_slow"]=ch([0.5,2.0])
        if R.random()<0.2: d["mscale"]=ch([0.7,1.0]); d["mscale_all_dim"]=ch([0.5,1.0])
        return d
    if k=="llama3":
        return {"rope_type":"llama3","factor":ch([4.0,8.0]),"low_freq_factor":ch([1.0,2.0]),"high_freq_factor":ch([4.0,8.0]),"original_max_position_embeddings":omp}
    if k=="longrope":
        return {"rope_type":"longrope","original_max_position_embeddings":omp}  # factors filled later


def random_case(R, families):
    """A family, a random configuration of it and a sequence length."""
    ch = R.choice
    mt = ch(families or DENSE_FAMILIES)
    nh = ch([2,4]); nkv = ch([k for k in [1,2,4] if nh % k == 0])
    hid = ch([32, 48])
    c = dict(vocab_size=ch([128,256,300]), hidden_size=hid, intermediate_size=ch([40,64]), num_hidden_layers=ch([1,2,3]),
             num_attention_heads=nh, max_position_embeddings=ch([8,16,64]), pad_token_id=0)
    if mt not in ("gpt_neox","falcon","phi","gpt2"): c["num_key_value_heads"]=nkv
    if mt in ("llama","qwen2","qwen3","mistral","gemma","gemma2","gemma3_text","olmo2","olmo3","granite","exaone4","glm","smollm3","seed_oss","arcee","cohere","nemotron","starcoder2","phi3"):
        if R.random()<0.5 or mt.startswith("gemma") or mt=="glm": c["head_dim"]=ch([8,12,16,24])
    hd = c.get("head_dim", hid//nh)
    if R.random()<0.5: c["tie_word_embeddings"]=ch([True,False])
    if mt=="phi" : c["tie_word_embeddings"]=False
    if R.random()<0.4: c["rope_theta"]=ch([100.0,1e6,500.0])
    if mt in ("llama","granite","olmo2","arcee","seed_oss","smollm3","exaone4","olmo3") and R.random()<0.4:
        c["attention_bias"]=True
    if mt in ("llama","granite","arcee","seed_oss","nemotron") and R.random()<0.4:
        c["mlp_bias"]=True
    if mt in ("llama","qwen2","qwen3","mistral","granite","arcee","olmo2","seed_oss","exaone4","smollm3","cohere","glm","stablelm","starcoder2","falcon","gpt_neox","phi3","phi","olmo3","ministral") and R.random()<0.6:
        rs = random_rope(R, ("none","longrope") if mt=="phi3" else ("none","linear","dynamic","yarn","llama3") + (("longrope",) if mt=="llama" else ()))
        if rs and rs["rope_type"]=="longrope":
            rd = hd if mt!="phi3" else hd
            prf = 1.0
            if mt=="phi3" and R.random()<0.5:
                prf = ch([f for f in (0.5,0.75) if (hd*f) % 2 == 0]); c["partial_rotary_factor"]=prf
            n = int(hd*prf)//2
            rs["short_factor"]=[round(1+R.random()*2,3) for _ in range(n)]
            rs["long_factor"]=[round(1+R.random()*8,3) for _ in range(n)]
            if mt=="phi3": c["original_max_position_embeddings"]=rs.pop("original_max_position_embeddings")
            if R.random()<0.3: rs["attention_factor"]=ch([0.9,1.3])
        if rs: c["rope_scaling"]=rs
    if mt in ("qwen2","qwen3","smollm3") and R.random()<0.5:
        c.update(use_sliding_window=True, sliding_window=ch([2,4,7]), max_window_layers=ch([0,1,2]))
    if mt in ("mistral","starcoder2","phi3") and R.random()<0.5: c["sliding_window"]=ch([2,4,7])
    if mt in ("gemma2","gemma3_text","olmo3","exaone4"):
        if R.random()<0.7:
            c["sliding_window"]=ch([2,4,7])
            c["layer_types"]=[ch(["sliding_attention","full_attention"]) for _ in range(c["num_hidden_layers"])]
    if mt in ("gemma2","gemma3_text"):
        if R.random()<0.5: c["query_pre_attn_scalar"]=ch([4,16,256])
        if mt=="gemma2" and R.random()<0.5: c["attn_logit_softcapping"]=ch([None,3.0,50.0])
        if R.random()<0.5: c["final_logit_softcapping"]=ch([None,5.0,30.0])
    if mt in ("phi3","stablelm","phi","nemotron","glm","gpt_neox") and R.random()<0.6 and "partial_rotary_factor" not in c and "rope_scaling" not in c:
        opts=[f for f in (0.25,0.5,0.75,1.0) if (hd*f)%2==0 and hd*f>0]
        k = "rotary_pct" if (mt=="gpt_neox" and R.random()<0.5) else "partial_rotary_factor"
        c[k]=ch(opts)
    if mt=="stablelm":
        if R.random()<0.5: c["use_qkv_bias"]=True
        if R.random()<0.5: c["qk_layernorm"]=True
        if R.random()<0.5: c["use_parallel_residual"]=True
    if mt=="cohere":
        c["logit_scale"]=ch([1.0,0.5]); 
        if R.random()<0.5: c["use_qk_norm"]=True
        if R.random()<0.5: c["attention_bias"]=True
    if mt=="gpt_neox":
        c["intermediate_size"]=64
        if R.random()<0.5: c["use_parallel_residual"]=False
        if R.random()<0.3: c["attention_bias"]=False
    if mt=="granite":
        c.update(embedding_multiplier=ch([1.0,4.0]), residual_multiplier=ch([1.0,0.3]), attention_multiplier=ch([0.125,0.3]), logits_scaling=ch([1.0,3.0]))
    if mt=="starcoder2" and R.random()<0.4: c["use_bias"]=False
    if mt=="falcon":
        new = R.random()<0.5
        c["new_decoder_architecture"]=new
        if new:
            c["num_kv_heads"]=nkv
            if R.random()<0.5: c["num_ln_in_parallel_attn"]=ch([1,2])
            if R.random()<0.5: c["ffn_hidden_size"]=ch([40,64])
        else:
            c["multi_query"]=ch([True,False]); c["parallel_attn"]=ch([True,False])
        c["bias"]=ch([True,False])
    if mt=="gpt2":
        c = dict(vocab_size=c["vocab_size"], n_embd=hid, n_layer=c["num_hidden_layers"], n_head=nh, n_positions=64,
                 activation_function=ch(["gelu_new","gelu","relu"]), tie_word_embeddings=ch([True,False]))
        if R.random()<0.3: c["n_inner"]=ch([40,64])
        if R.random()<0.2: c["scale_attn_weights"]=False
    if mt=="smollm3" and R.random()<0.5:
        c["no_rope_layers"]=[ch([0,1]) for _ in range(c["num_hidden_layers"])]
    if mt not in ("gemma","gemma2","gemma3_text","gpt2","phi","gpt_neox","falcon") and R.random()<0.3:
        c["hidden_act"]=ch(["silu","gelu","gelu_pytorch_tanh","relu"])
    T = ch([1,3,8,13,17,24])
    return mt, c, T


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cli", help="the hierarchos binary")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=50)
    parser.add_argument("--families", help="comma-separated model_types (default: 24 dense families)")
    parser.add_argument("--keep", type=Path, help="folder for the models of diverging cases (default: a temporary one)")
    args = parser.parse_args()
    R = random.Random(args.seed)
    families = args.families.split(",") if args.families else None
    work = args.keep or Path(tempfile.mkdtemp(prefix="hierarchos-fuzz-"))
    counts = {}
    for i in range(args.count):
        model_type, cfg, length = random_case(R, families)
        result = run_case(args.cli, work, f"s{args.seed}_{i}_{model_type}", model_type, cfg, length, R.randrange(1000))
        counts[result["status"]] = counts.get(result["status"], 0) + 1
        print(json.dumps(result), flush=True)
    print(f"{counts} (diverging models kept under {work})", file=sys.stderr)
    sys.exit(1 if counts.get("DIVERGE") else 0)


if __name__ == "__main__":
    main()
