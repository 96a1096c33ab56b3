#!/usr/bin/env python3
"""Makes the tiny reference models under tests/fixtures/ with Hugging Face transformers.

Each fixture is a random model of one supported family (2 layers, hidden 64, 4 query heads, 2 KV heads,
MLP 128, vocab 300) with a byte-level BPE tokenizer trained on the public-domain text below, saved the way
the Hub serves models, plus references computed in float64 on the CPU:

- reference.safetensors: `input_ids` [2, 24] i64, `logits` [2, 24, V] f64, `greedy_ids` [2, 12] i64,
  `greedy_logits` [2, 12, V] f64 (the logits each greedy token was picked from), and what two damped AdamW steps
  on the causal-LM loss (the first on `input_ids[0]`, batch A, the second on `input_ids[1]`, batch B) computed in
  float64 add to each saved parameter (`adamw_damped_delta/<name>`, f32: the saved value plus it is the float64
  result within 1e-10) with the loss before each step (`adamw_damped_losses`, [2] f64).
- reference.json: prompts, decoded greedy text, tokenizer round trips, a rendered chat template, diagnostics
  (among them how far PyTorch's own f32 lands from the references).
- lora/: a LoRA adapter made and trained with PEFT (random A and B, three AdamW steps; settings per family in
  LORA below), as `PeftModel.save_pretrained` writes it, and in reference.safetensors `lora/logits` (the model with the adapter),
  `lora/adamw/<PEFT tensor name>` (the adapter after two AdamW steps with torch's defaults and weight decay 0.01,
  batch A then batch B, the base frozen) and `lora/adamw_losses`, all float64.

transformers computes RMSNorm (Gemma's too), OLMo's LayerNorm, the attention softmax, RoPE's cos/sin and the loss in float32 even when the model
is float64, so the reference model replaces those four pieces with the same formulas in float64; the script
checks they agree with transformers' own float32 output.

Usage: python3 scripts/make_fixtures.py --out tests/fixtures
"""
import argparse
import copy
import json
import math
import platform
import sys
import types
from pathlib import Path

import peft
import safetensors.torch
import tokenizers
import torch
import torch.nn.functional as F
import transformers
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

VOCAB = 300
BOS, EOS = "<s>", "</s>"
PROMPT_LEN = 24
NEW_TOKENS = 12
# Smallest gap between the best and second-best logit allowed at a greedy step, so an f32 implementation
# (errors around 1e-5) cannot pick a different token.
MIN_MARGIN = 5e-3
# Fewest distinct tokens in a greedy continuation: one token repeated would hide cache and position bugs.
MIN_DISTINCT = 4
# Smallest gap between the probabilities of a token's last chosen expert and its best unchosen one, in every
# float64 forward pass of a fixture with experts, so an f32 router (probabilities off by ~1e-7) cannot choose
# other experts.
MIN_ROUTING_MARGIN = 1e-5
# Scale of the projections that write into the residual stream: the layers must outweigh the input embedding,
# or a tied model's logits favour repeating the last token.
RESIDUAL_GAIN = 2.0
ADAMW = {
    "adamw_damped": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-3, weight_decay=0.1),
}

# The adapter of each family's fixture: different targets, ranks, scalings and patterns, so that each of PEFT's
# settings Hierarchos reads is exercised. Dropout is 0 so that training is deterministic.
LORA = {
    "llama": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    "llama3_tied": dict(r=8, lora_alpha=16, target_modules="all-linear", use_rslora=True),
    "mistral": dict(r=4, lora_alpha=6, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                    rank_pattern={"v_proj": 2}, alpha_pattern={"o_proj": 3}),
    "qwen2": dict(r=4, lora_alpha=8, layers_to_transform=[1],
                  target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    "qwen3": dict(r=2, lora_alpha=5, target_modules=r".*mlp\.(gate|up|down)_proj"),
    "granite": dict(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"]),
    "smollm3": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj"]),
    "gemma": dict(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    "olmo2": dict(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "o_proj", "up_proj", "down_proj"]),
    "exaone4": dict(r=4, lora_alpha=8, target_modules=["k_proj", "v_proj", "gate_proj", "down_proj"]),
    "olmo": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj", "gate_proj"]),
    "starcoder2": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "c_fc", "c_proj"]),
    "arcee": dict(r=4, lora_alpha=8, target_modules=["q_proj", "up_proj", "down_proj"]),
    "exaone4_hybrid": dict(r=4, lora_alpha=8, target_modules=["q_proj", "o_proj"]),
    "seed_oss": dict(r=4, lora_alpha=8, target_modules=["k_proj", "o_proj", "up_proj"]),
    "stablelm": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj"]),
    "stablelm_parallel": dict(r=4, lora_alpha=8, target_modules=["k_proj", "o_proj", "down_proj"]),
    # transformers 5 holds the routed experts as 3-D parameters, not linear modules: adapters target the rest.
    "mixtral": dict(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "o_proj"]),
    "qwen2_moe": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "shared_expert_gate"]),
    "qwen3_moe": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    "olmoe": dict(r=4, lora_alpha=8, target_modules=["k_proj", "o_proj"]),
    "ministral": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]),
    "nemotron": dict(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "up_proj"]),
    "olmo3": dict(r=4, lora_alpha=8, target_modules=["v_proj", "o_proj", "gate_proj"]),
    "gemma2": dict(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "up_proj"]),
    "gemma3_text": dict(r=4, lora_alpha=8, target_modules=["q_proj", "o_proj", "down_proj"]),
    "cohere": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj"]),
    "phi": dict(r=4, lora_alpha=8, target_modules=["q_proj", "dense", "fc1"]),
    "cohere_qk_norm": dict(r=4, lora_alpha=8, target_modules=["k_proj", "o_proj", "up_proj"]),
    # Not q_proj or k_proj: their LayerNorms cancel parts of the gradient, which AdamW (eps 1e-8) blows up from
    # float noise to steps of size lr.
    "phi_qk_layernorm": dict(r=4, lora_alpha=8, target_modules=["v_proj", "dense", "fc2"]),
    "phi3": dict(r=4, lora_alpha=8, target_modules=["qkv_proj", "gate_up_proj", "o_proj"]),
    "phi3_longrope": dict(r=4, lora_alpha=8, target_modules=["qkv_proj", "down_proj"]),
    "gpt_neox": dict(r=4, lora_alpha=8, target_modules=["query_key_value", "dense_4h_to_h"]),
    "gpt_neox_sequential": dict(r=4, lora_alpha=8, target_modules=["query_key_value", "dense"]),
    "gpt_neox_odd_rotary": dict(r=4, lora_alpha=8, target_modules=["query_key_value", "dense_h_to_4h"]),
    # PEFT turns fan_in_fan_out on for GPT-2's Conv1D layers.
    "gpt2": dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True),
    "gpt2_inverse_layer_scale": dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj"], fan_in_fan_out=True),
    "gpt_bigcode": dict(r=4, lora_alpha=8, target_modules=["c_proj", "c_fc"]),
    "gpt_neo": dict(r=4, lora_alpha=8, target_modules=["q_proj", "out_proj", "c_fc"]),
    "gptj": dict(r=4, lora_alpha=8, target_modules=["k_proj", "v_proj", "fc_out"]),
    "falcon": dict(r=4, lora_alpha=8, target_modules=["query_key_value", "dense_4h_to_h"]),
    "falcon_new": dict(r=4, lora_alpha=8, target_modules=["query_key_value", "dense"]),
    "falcon_alibi": dict(r=4, lora_alpha=8, target_modules=["query_key_value", "dense_h_to_4h"]),
    "bloom": dict(r=4, lora_alpha=8, target_modules=["query_key_value", "dense_4h_to_h"]),
    "opt": dict(r=4, lora_alpha=8, target_modules=["q_proj", "out_proj", "fc1"]),
    "glm": dict(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "gate_up_proj"]),
    "deepseek_v3": dict(r=4, lora_alpha=8, target_modules=["q_a_proj", "kv_b_proj", "o_proj"]),
    "deepseek_v3_lite": dict(r=8, lora_alpha=12, target_modules=["q_proj", "kv_a_proj_with_mqa", "o_proj"]),
}
LORA_ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)

# Public domain: Carroll (1865), Austen (1813), Lincoln (1863), Melville (1851), Shelley (1818).
CORPUS = [
    "Alice was beginning to get very tired of sitting by her sister on the bank, and of having nothing to do: "
    "once or twice she had peeped into the book her sister was reading, but it had no pictures or "
    "conversations in it, 'and what is the use of a book,' thought Alice 'without pictures or conversations?'",
    "So she was considering in her own mind (as well as she could, for the hot day made her feel very sleepy "
    "and stupid), whether the pleasure of making a daisy-chain would be worth the trouble of getting up and "
    "picking the daisies, when suddenly a White Rabbit with pink eyes ran close by her.",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in "
    "want of a wife. However little known the feelings or views of such a man may be on his first entering a "
    "neighbourhood, this truth is so well fixed in the minds of the surrounding families, that he is "
    "considered the rightful property of some one or other of their daughters.",
    "Four score and seven years ago our fathers brought forth on this continent, a new nation, conceived in "
    "Liberty, and dedicated to the proposition that all men are created equal. Now we are engaged in a great "
    "civil war, testing whether that nation, or any nation so conceived and so dedicated, can long endure.",
    "Call me Ishmael. Some years ago\u2014never mind how long precisely\u2014having little or no money in my "
    "purse, and nothing particular to interest me on shore, I thought I would sail about a little and see the "
    "watery part of the world.",
    "You will rejoice to hear that no disaster has accompanied the commencement of an enterprise which you "
    "have regarded with such evil forebodings. I arrived here yesterday, and my first task is to assure my "
    "dear sister of my welfare and increasing confidence in the success of my undertaking.",
]
PROMPT_SOURCES = [
    "Alice was beginning to get very tired of sitting by her sister on the bank, and of having nothing to do",
    "Call me Ishmael. Some years ago\u2014never mind how long precisely\u2014having little or no money",
]
ROUND_TRIPS = [
    "Hello, world!",
    "It is a truth universally acknowledged",
    "  two leading spaces,\ttabs\nand newlines\n",
    "na\u00efve caf\u00e9 \u2014 \u00fcn\u00efc\u00f6d\u00e9 \u2615",
    f"{BOS}Alice{EOS}",
    "",
]
CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Who was late?"},
    {"role": "assistant", "content": "The White Rabbit."},
    {"role": "user", "content": "Why?"},
]
CHAT_TEMPLATE = (
    "{% if bos_token %}{{ bos_token }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    hidden_act="silu",
    bos_token_id=0,
    eos_token_id=1,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
# GPT-NeoX's config takes no num_key_value_heads (its attention has as many key/value heads as query heads).
# The GPT-2-style configs of the small fixtures (GPT-2's keys, dropout off, untied: tied, every seed repeated tokens).
GPT2_SMALL = dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_inner=64, n_positions=256,
                  layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                  eos_token_id=1, pad_token_id=None, tie_word_embeddings=False)
NEOX = dict({k: v for k, v in COMMON.items() if k != "num_key_value_heads"}, hidden_act="gelu",
            max_position_embeddings=256, layer_norm_eps=1e-5, tie_word_embeddings=False, pad_token_id=None,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})
FALCON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_hidden_size=128,
              activation="gelu", layer_norm_epsilon=1e-5, max_position_embeddings=256, alibi=False,
              bos_token_id=0, eos_token_id=1, pad_token_id=None, tie_word_embeddings=False,
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
# name -> (config class name, config arguments, tokenizer adds BOS, what the fixture covers)
FIXTURES = {
    "llama": (
        "LlamaConfig",
        dict(COMMON, max_position_embeddings=256, rms_norm_eps=1e-5,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        True,
        "plain Llama: GQA 4/2, untied lm_head, default RoPE, `rope_parameters` block (transformers 5 format)",
    ),
    "llama3_tied": (
        "LlamaConfig",
        dict(COMMON, max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=True,
             rope_parameters=dict(LLAMA3_ROPE)),
        True,
        "Llama with llama3 RoPE scaling (factor 8, original context 64: head_dim 16 has frequencies in all three "
        "bands) and tied embeddings (no lm_head.weight in the file); config.json in the classic "
        "`rope_theta` + `rope_scaling` form of Llama 3.x checkpoints",
    ),
    "mistral": (
        "MistralConfig",
        dict(COMMON, max_position_embeddings=256, rms_norm_eps=1e-5, sliding_window=8,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        True,
        "Mistral with sliding_window 8: position i attends to keys j with i - 8 < j <= i, so the 24-token "
        "prompt and the greedy continuation use the window",
    ),
    "qwen2": (
        "Qwen2Config",
        dict(COMMON, max_position_embeddings=256, rms_norm_eps=1e-6, eos_token_id=[1],
             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        False,
        "Qwen2: q/k/v biases (always on for qwen2, no flag in config.json), no o_proj bias, rope_theta 1e6, "
        "sliding window off (use_sliding_window false), eos_token_id as a list, tokenizer adds no BOS",
    ),
    "qwen3": (
        "Qwen3Config",
        dict(COMMON, max_position_embeddings=256, rms_norm_eps=1e-6, head_dim=32, eos_token_id=[1],
             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        False,
        "Qwen3: per-head RMSNorm on q and k (q_norm/k_norm, weight [head_dim]) before RoPE, explicit head_dim 32 "
        "(q_proj is [128, 64], o_proj [64, 128]), no biases, eos_token_id as a list, tokenizer adds no BOS",
    ),
    "granite": (
        "GraniteConfig",
        dict(COMMON, max_position_embeddings=256, rms_norm_eps=1e-6, embedding_multiplier=4.0,
             residual_multiplier=0.5, attention_multiplier=0.125, logits_scaling=2.0,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        True,
        "Granite: embeddings times embedding_multiplier 4, attention and MLP outputs times residual_multiplier "
        "0.5 before each residual add, score scale attention_multiplier 0.125 (not 1/sqrt(16)), logits divided "
        "by logits_scaling 2",
    ),
    "smollm3": (
        "SmolLM3Config",
        dict(COMMON, max_position_embeddings=256, rms_norm_eps=1e-6, no_rope_layers=[1, 0],
             use_sliding_window=False, tie_word_embeddings=True, pad_token_id=None,
             rope_parameters={"rope_type": "default", "rope_theta": 2000000.0}),
        False,
        "SmolLM3: the second layer takes no rotary embedding (no_rope_layers [1, 0]), rope_theta 2e6, tied "
        "embeddings, tokenizer adds no BOS",
    ),
    "gemma": (
        "GemmaConfig",
        dict(COMMON, hidden_act="gelu_pytorch_tanh", head_dim=16, pad_token_id=None,
             max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        True,
        "Gemma: RMSNorm scaled by 1 + weight, embeddings times sqrt(64) = 8, gated tanh-GELU MLP, explicit "
        "head_dim 16; untied (tied, the embeddings scaled up by 8 made every greedy continuation repeat)",
    ),
    "olmo2": (
        "Olmo2Config",
        dict(COMMON, max_position_embeddings=256, rms_norm_eps=1e-6, pad_token_id=None,
             rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
        True,
        "OLMo 2: post-norm layers (attention and MLP outputs normed before their residual adds, no input norm), "
        "RMSNorm over the whole q and k projections (weights [64] and [32]) before the heads split, rope_theta 5e5",
    ),
    "exaone4": (
        "Exaone4Config",
        dict(COMMON, max_position_embeddings=256, rms_norm_eps=1e-5, head_dim=16, sliding_window=None,
             layer_types=["full_attention", "full_attention"], pad_token_id=None, tie_word_embeddings=False,
             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        True,
        "EXAONE 4: post-norm layers (as OLMo 2) with per-head RMSNorm on q and k (as Qwen3), every layer full "
        "attention (sliding_window null), rope_theta 1e6",
    ),
    "olmo": (
        "OlmoConfig",
        dict(COMMON, max_position_embeddings=256, clip_qkv=0.8, pad_token_id=None,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        True,
        "OLMo (1): LayerNorm without weight or bias (eps 1e-5, in float64 here) in place of RMSNorm, q, k and v "
        "clamped to [-0.8, 0.8] after their projections (clip_qkv; some entries of each are clamped)",
    ),
    "starcoder2": (
        "Starcoder2Config",
        dict(COMMON, hidden_act="gelu_pytorch_tanh", max_position_embeddings=256, norm_epsilon=1e-5, use_bias=True,
             sliding_window=8, tie_word_embeddings=True, pad_token_id=None,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        True,
        "StarCoder2: LayerNorm with weight and bias, plain MLP c_fc -> tanh GELU -> c_proj, biases on every "
        "projection, sliding_window 8 on every layer, tied embeddings",
    ),
    "arcee": (
        "ArceeConfig",
        dict(COMMON, hidden_act="relu2", max_position_embeddings=256, rms_norm_eps=1e-5, pad_token_id=None,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        True,
        "Arcee AFM: a plain MLP up_proj -> ReLU squared -> down_proj (no gate)",
    ),
    "exaone4_hybrid": (
        "Exaone4Config",
        dict(COMMON, max_position_embeddings=256, rms_norm_eps=1e-5, head_dim=16, sliding_window=8,
             layer_types=["sliding_attention", "full_attention"], pad_token_id=None, tie_word_embeddings=False,
             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        True,
        "EXAONE 4, hybrid as the 32B: layer 0 slides over 8 positions with RoPE, layer 1 attends to everything "
        "without RoPE",
    ),
    "seed_oss": (
        "SeedOssConfig",
        dict(COMMON, max_position_embeddings=256, rms_norm_eps=1e-6, head_dim=16, attention_bias=True,
             attention_out_bias=False, mlp_bias=False, attention_dropout=0.0, residual_dropout=0.0,
             pad_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 10000000.0}),
        True,
        "Seed-OSS: biases on q, k and v, none on the output projection (attention_out_bias false), rope_theta 1e7",
    ),
    "stablelm": (
        "StableLmConfig",
        dict(COMMON, max_position_embeddings=256, layer_norm_eps=1e-5, use_qkv_bias=True, partial_rotary_factor=0.5,
             qk_layernorm=False, use_parallel_residual=False, pad_token_id=None,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
        True,
        "StableLM: LayerNorm with weight and bias, rotary on the first half of each head (partial_rotary_factor "
        "0.5: 8 of 16 dimensions), biases on q, k and v (use_qkv_bias)",
    ),
    "stablelm_parallel": (
        "StableLmConfig",
        dict(COMMON, max_position_embeddings=256, layer_norm_eps=1e-5, use_qkv_bias=False, partial_rotary_factor=0.25,
             qk_layernorm=True, use_parallel_residual=True, pad_token_id=None,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}),
        True,
        "StableLM 2 12B's layout: parallel residual (attention and MLP read one LayerNorm), a LayerNorm of each "
        "query and key head with its own weight (q_layernorm.norms.N), rotary on a quarter of each head",
    ),
    "mixtral": (
        "MixtralConfig",
        dict(COMMON, max_position_embeddings=256, rms_norm_eps=1e-5, num_local_experts=4, num_experts_per_tok=2,
             sliding_window=None, pad_token_id=None,
             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        True,
        "Mixtral: a mixture of 4 gated SiLU experts (MLP 128) in place of each MLP, 2 per token (softmax, top 2, "
        "renormalized); experts saved as block_sparse_moe.experts.N.w1/w2/w3",
    ),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        dict(COMMON, max_position_embeddings=256, rms_norm_eps=1e-6, num_experts=4, num_experts_per_tok=2,
             moe_intermediate_size=32, shared_expert_intermediate_size=48, norm_topk_prob=False,
             mlp_only_layers=[1], pad_token_id=None,
             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        False,
        "Qwen2-MoE: layer 0 routes to 2 of 4 experts (MLP 32, probabilities not renormalized) plus a shared "
        "expert (MLP 48) scaled by a sigmoid gate; layer 1 a dense MLP (mlp_only_layers [1]); q/k/v biases",
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        dict(COMMON, max_position_embeddings=256, rms_norm_eps=1e-6, num_experts=8, num_experts_per_tok=3,
             moe_intermediate_size=32, norm_topk_prob=True, pad_token_id=None,
             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        False,
        "Qwen3-MoE: per-head q/k RMSNorm (as Qwen3), 3 of 8 experts (MLP 32) per token, renormalized "
        "(norm_topk_prob)",
    ),
    "olmoe": (
        "OlmoeConfig",
        dict(COMMON, max_position_embeddings=256, rms_norm_eps=1e-5, num_experts=4, num_experts_per_tok=2,
             norm_topk_prob=False, clip_qkv=1.5, pad_token_id=None,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        True,
        "OLMoE: RMSNorm over the whole q and k projections (as OLMo 2) in pre-norm layers, q, k and v clamped to "
        "[-1.5, 1.5] after those norms, 2 of 4 experts (MLP 128) per token, not renormalized",
    ),
    "ministral": (
        "MinistralConfig",
        dict(COMMON, max_position_embeddings=256, rms_norm_eps=1e-5, sliding_window=8, head_dim=16,
             layer_types=["sliding_attention", "full_attention"], pad_token_id=None,
             rope_parameters={"rope_type": "default", "rope_theta": 100000000.0}),
        True,
        "Ministral: layer 0 slides over 8 positions, layer 1 attends to everything (layer_types), rope_theta 1e8",
    ),
    "nemotron": (
        "NemotronConfig",
        dict(COMMON, hidden_act="relu2", max_position_embeddings=256, norm_eps=1e-5, pad_token_id=None,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
        True,
        "Nemotron: LayerNorm with bias scaled by 1 + weight (LayerNorm1P), rotary on the first half of each head "
        "(partial_rotary_factor 0.5), a plain MLP up_proj -> ReLU squared -> down_proj",
    ),
    "olmo3": (
        "Olmo3Config",
        dict(COMMON, max_position_embeddings=256, rms_norm_eps=1e-6, sliding_window=8,
             layer_types=["sliding_attention", "full_attention"], pad_token_id=None,
             rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                              "full_attention": {"rope_type": "default", "rope_theta": 500000.0}}),
        True,
        "OLMo 3: OLMo 2's post-norm layers and whole-projection q/k norms; layer 0 slides over 8 positions with "
        "rope_theta 1e4, layer 1 attends to everything with rope_theta 5e5 (rope_parameters per layer type)",
    ),
    "gemma2": (
        "Gemma2Config",
        dict(COMMON, hidden_activation="gelu_pytorch_tanh", head_dim=16, pad_token_id=None,
             max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False, query_pre_attn_scalar=32,
             attn_logit_softcapping=2.0, final_logit_softcapping=5.0, sliding_window=8,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        True,
        "Gemma 2: sandwich norms (input, post-attention, pre- and post-feedforward RMSNorms, all 1 + weight), "
        "attention scores soft-capped at 2 and logits at 5 (tanh), score scale 32^-1/2 (query_pre_attn_scalar), "
        "layer 0 slides over 8 positions, layer 1 attends to everything; untied as the Gemma fixture",
    ),
    "gemma3_text": (
        "Gemma3TextConfig",
        dict(COMMON, hidden_activation="gelu_pytorch_tanh", head_dim=16, pad_token_id=None,
             max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False, query_pre_attn_scalar=24,
             sliding_window=8, layer_types=["sliding_attention", "full_attention"],
             rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                              "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}),
        True,
        "Gemma 3 (text): Gemma 2's sandwich norms with per-head q/k RMSNorm (1 + weight), no soft-capping, score "
        "scale 24^-1/2; layer 0 slides over 8 positions with rope_theta 1e4, layer 1 attends to everything with "
        "rope_theta 1e6; untied",
    ),
    "cohere": (
        "CohereConfig",
        dict(COMMON, max_position_embeddings=256, layer_norm_eps=1e-5, logit_scale=0.5, use_qk_norm=False,
             tie_word_embeddings=True, pad_token_id=None,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        True,
        "Cohere (Command R): parallel block (attention and MLP read one LayerNorm of weight without bias), rotary "
        "on interleaved pairs, logits times logit_scale 0.5, tied embeddings",
    ),
    "cohere_qk_norm": (
        "CohereConfig",
        dict(COMMON, max_position_embeddings=256, layer_norm_eps=1e-5, logit_scale=0.5, use_qk_norm=True,
             tie_word_embeddings=True, pad_token_id=None,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        True,
        "Cohere with use_qk_norm (Command R+): a LayerNorm of each query and key head with its own weight "
        "(q_norm [4, 16], k_norm [2, 16]) before rotary",
    ),
    "phi": (
        "PhiConfig",
        dict(COMMON, hidden_act="gelu_new", max_position_embeddings=256, layer_norm_eps=1e-5, qk_layernorm=False,
             pad_token_id=None,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
        True,
        "Phi (1/1.5/2): parallel block with one LayerNorm (weight and bias), rotary on the first half of each head "
        "(partial_rotary_factor 0.5), biases on q, k, v, dense, fc1, fc2 and lm_head, plain MLP fc1 -> tanh GELU "
        "-> fc2, final_layernorm",
    ),
    "phi_qk_layernorm": (
        "PhiConfig",
        dict(COMMON, hidden_act="gelu_new", max_position_embeddings=256, layer_norm_eps=1e-5, qk_layernorm=True,
             pad_token_id=None, hidden_size=32, intermediate_size=64,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
        True,
        "Phi with qk_layernorm (hidden 32, MLP 64): one LayerNorm of head_dim (weight and bias, q_layernorm / "
        "k_layernorm) that every query head, and another that every key head, passes through before rotary",
    ),
    "phi3": (
        "Phi3Config",
        dict(COMMON, max_position_embeddings=256, original_max_position_embeddings=256, rms_norm_eps=1e-5,
             sliding_window=8, pad_token_id=None,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75}),
        True,
        "Phi-3: q, k and v in one matrix (qkv_proj), gate and up in another (gate_up_proj; the adapter targets "
        "both), sliding_window 8 on every layer, rotary on the first 12 of 16 dimensions (partial_rotary_factor "
        "0.75, as Phi-4-mini)",
    ),
    "phi3_longrope": (
        "Phi3Config",
        dict(COMMON, max_position_embeddings=64, original_max_position_embeddings=16, rms_norm_eps=1e-5,
             sliding_window=None, pad_token_id=None,
             rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                              "short_factor": [1.0, 1.02, 1.05, 1.1, 1.2, 1.4],
                              "long_factor": [1.0, 1.3, 2.1, 3.7, 5.9, 8.2]}),
        True,
        "Phi-3 with LongRoPE as Phi-3.5-mini and Phi-4-mini: pretraining length 16 (top-level "
        "original_max_position_embeddings) under max_position_embeddings 64, so the 24-token prompts rotate by the "
        "long factors (one per rotated pair, 6 of the 12 rotated dimensions) and cos/sin carry the attention factor "
        "sqrt(1 + ln 4 / ln 16)",
    ),
    "gpt_neox": (
        "GPTNeoXConfig",
        dict(NEOX, use_parallel_residual=True),
        True,
        "GPT-NeoX (Pythia): parallel residual (attention and MLP each read their own LayerNorm of the layer's "
        "input), q, k and v in one matrix with each head's rows together (query_key_value), rotary on the first "
        "quarter of each head (rotary_pct 0.25: 4 of 16), biases everywhere, exact GELU, embed_in / embed_out",
    ),
    "gpt_neox_sequential": (
        "GPTNeoXConfig",
        dict(NEOX, use_parallel_residual=False),
        True,
        "GPT-NeoX with use_parallel_residual false: the MLP's LayerNorm reads the stream after the attention's "
        "residual add",
    ),
    "gpt_neox_odd_rotary": (
        "GPTNeoXConfig",
        dict(NEOX, use_parallel_residual=True, hidden_size=32, intermediate_size=64,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.375}),
        True,
        "GPT-NeoX with an odd rotary dim (hidden 32, MLP 64): 0.375 of 8 is 3, whose frequencies (base^(-2i/3), "
        "i < 2) rotate 4 dimensions, as transformers' cos table is that wide",
    ),
    "gpt2": (
        "GPT2Config",
        dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_inner=128, n_positions=256,
             activation_function="gelu_new", layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0,
             attn_pdrop=0.0, bos_token_id=0, eos_token_id=1, pad_token_id=None, tie_word_embeddings=False),
        True,
        "GPT-2: learned absolute positions (wpe) and no rotary, LayerNorms ln_1 / ln_2 / ln_f with bias, Conv1D "
        "weights stored [in, out], q, k and v in one matrix (c_attn; the adapter targets it with PEFT's "
        "fan_in_fan_out), tanh-GELU MLP c_fc -> c_proj, the n_embd / n_layer / n_head keys; untied (tied, every "
        "seed repeated tokens)",
    ),
    "gpt2_inverse_layer_scale": (
        "GPT2Config",
        dict(GPT2_SMALL, activation_function="gelu_new", scale_attn_by_inverse_layer_idx=True),
        True,
        "GPT-2 with scale_attn_by_inverse_layer_idx (Stanford CRFM's GPT-2s; hidden 32, MLP 64): layer i's scores "
        "are further divided by i + 1",
    ),
    "gpt_bigcode": (
        "GPTBigCodeConfig",
        dict(GPT2_SMALL, activation_function="gelu_pytorch_tanh", multi_query=True),
        True,
        "GPT-BigCode (StarCoder 1, SantaCoder; hidden 32, MLP 64): GPT-2's layout with linear layers ([out, in]), "
        "multi-query attention (one key/value head; c_attn holds q [32], k [8] and v [8] as blocks), tanh-GELU MLP c_fc -> "
        "c_proj, learned positions wpe; untied (tied, every seed repeated tokens)",
    ),
    "gpt_neo": (
        "GPTNeoConfig",
        dict(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
             max_position_embeddings=256, window_size=8, attention_types=[[["global", "local"], 1]],
             activation_function="gelu_new", layer_norm_epsilon=1e-5, resid_dropout=0.0, embed_dropout=0.0,
             attention_dropout=0.0, bos_token_id=0, eos_token_id=1, pad_token_id=None, tie_word_embeddings=False),
        True,
        "GPT-Neo (hidden 32, MLP 64): learned positions wpe, scores not scaled, a global layer then a local one attending to the last 8 "
        "positions (window_size 8, attention_types), q, k and v without biases and out_proj with one "
        "(attn.attention), tanh-GELU MLP c_fc -> c_proj; untied (tied, every seed repeated tokens)",
    ),
    "gptj": (
        "GPTJConfig",
        dict(GPT2_SMALL, activation_function="gelu_new", rotary_dim=4),
        True,
        "GPT-J (hidden 32, MLP 64): a parallel block reading ln_1, rotary on interleaved pairs of the first 4 of 8 "
        "dimensions (rotary_dim 4), q, k, v and out_proj without biases, tanh-GELU MLP fc_in -> fc_out, a head "
        "with a bias",
    ),
    "falcon": (
        "FalconConfig",
        dict(FALCON, new_decoder_architecture=False, multi_query=True, parallel_attn=True, bias=False),
        True,
        "Falcon (7B layout): multi-query attention (one key/value head) with q, k and v in one matrix, a parallel "
        "block reading one LayerNorm, no biases",
    ),
    "falcon_new": (
        "FalconConfig",
        dict(FALCON, new_decoder_architecture=True, num_kv_heads=2, bias=True),
        True,
        "Falcon's new decoder architecture (40B/180B layout): q, k and v grouped by each of 2 key/value heads in "
        "one matrix, attention and MLP in parallel each with its LayerNorm (ln_attn, ln_mlp), biases everywhere",
    ),
    "falcon_alibi": (
        "FalconConfig",
        dict(FALCON, alibi=True, new_decoder_architecture=False, multi_query=False, parallel_attn=False, bias=True,
             hidden_size=48, num_attention_heads=12),
        True,
        "Falcon-RW: ALiBi in place of rotary (12 heads of 4: BLOOM's slopes, powers of 2^-1 and odd powers of "
        "2^-0.5, multiplied by the key's position in bf16 as transformers does), a sequential block, one key/value "
        "head per query head, biases everywhere; the reference runs transformers' SDPA attention, which adds ALiBi "
        "once (its eager Falcon attention adds it twice in 5.17)",
    ),
    "bloom": (
        "BloomConfig",
        dict(vocab_size=VOCAB, hidden_size=48, n_layer=2, n_head=12, layer_norm_epsilon=1e-5, bos_token_id=0,
             eos_token_id=1, pad_token_id=None, tie_word_embeddings=False),
        True,
        "BLOOM: ALiBi (12 heads of 4: slopes powers of 2^-1 and odd powers of 2^-0.5, times the key's position in "
        "f32, added after the score scale), a LayerNorm of the embeddings (word_embeddings_layernorm), q, k and v "
        "in one matrix with each head's rows together, LayerNorm with bias, biases everywhere, tanh-GELU MLP 4 x "
        "hidden, the n_layer / n_head keys; untied (tied, as BLOOM's checkpoints are, every seed repeated tokens)",
    ),
    "opt": (
        "OPTConfig",
        dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64,
             max_position_embeddings=256, bos_token_id=0, eos_token_id=1, pad_token_id=None,
             tie_word_embeddings=False),
        True,
        "OPT (125m layout; hidden 32, MLP 64): learned positions read at row position + 2 (embed_positions "
        "[258, 32]), pre-norm "
        "LayerNorms self_attn_layer_norm / final_layer_norm with bias, q, k, v and out_proj with biases, plain MLP "
        "fc1 -> ReLU -> fc2, the model.decoder.* names; untied (tied, as OPT's checkpoints are, every seed repeated "
        "tokens)",
    ),
    "glm": (
        "GlmConfig",
        dict(COMMON, head_dim=16, max_position_embeddings=256, attention_bias=True, pad_token_id=None,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
        True,
        "GLM-4: rotary on interleaved pairs of the first half of each head (partial_rotary_factor 0.5), biases on "
        "q, k and v only, gate and up in one matrix (gate_up_proj), RMSNorm eps 1.5625e-7 (the default)",
    ),
    "deepseek_v3": (
        "DeepseekV3Config",
        dict(COMMON, num_key_value_heads=4, max_position_embeddings=256, q_lora_rank=24, kv_lora_rank=16,
             qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=8, n_group=4, topk_group=2,
             num_experts_per_tok=3, moe_intermediate_size=32, n_shared_experts=2, first_k_dense_replace=1,
             routed_scaling_factor=2.5, norm_topk_prob=True, rope_interleave=True, pad_token_id=None,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        True,
        "DeepSeek-V3: multi-head latent attention (queries through rank 24 with an RMSNorm, keys and values "
        "expanded per head from a normed latent of 16, one rotary key of 8 shared by all heads, rotary on "
        "interleaved pairs, value heads of 12 beside query/key heads of 24); layer 0 a dense MLP "
        "(first_k_dense_replace 1), layer 1 a sigmoid router with a correction bias choosing 2 of 4 groups of 2 "
        "experts, then 3 experts (MLP 32) in them, renormalized and scaled by 2.5, plus 2 shared experts (MLP 64)",
    ),
    "deepseek_v3_lite": (
        "DeepseekV3Config",
        dict(COMMON, num_key_value_heads=4, max_position_embeddings=256, q_lora_rank=None, kv_lora_rank=16,
             qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=20, n_routed_experts=4, n_group=1, topk_group=1,
             num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=0,
             routed_scaling_factor=1.0, norm_topk_prob=False, rope_interleave=False, pad_token_id=None,
             rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                              "original_max_position_embeddings": 16, "mscale": 0.8, "mscale_all_dim": 0.6}),
        True,
        "DeepSeek-V2-Lite's layout in DeepSeek-V3: multi-head latent attention with one q_proj (no q_lora_rank), "
        "rotary on halves (rope_interleave false) with YaRN (factor 4, mscale 0.8, mscale_all_dim 0.6: cos/sin "
        "and the softmax scale both change), value heads of 20 wider than query/key heads of 16; every layer "
        "routes to 2 of 4 experts in one group, probabilities not renormalized, plus 1 shared expert",
    ),
}


def train_tokenizer(add_bos):
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    if tok.get_vocab_size() != VOCAB:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size()} tokens, wanted {VOCAB}")
    steps = [processors.ByteLevel(trim_offsets=False)]
    if add_bos:
        steps.append(processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, tok.token_to_id(BOS))]))
    tok.post_processor = processors.Sequence(steps)
    return tok


def prompt_ids(tok):
    """The shortest prefix of each source whose encoding is PROMPT_LEN tokens, so encode(text) == ids."""
    texts, ids = [], []
    for source in PROMPT_SOURCES:
        for end in range(1, len(source) + 1):
            enc = tok.encode(source[:end]).ids
            if len(enc) == PROMPT_LEN:
                texts.append(source[:end])
                ids.append(enc)
                break
        else:
            raise SystemExit(f"no prefix of {source!r} encodes to {PROMPT_LEN} tokens")
    return texts, torch.tensor(ids, dtype=torch.int64)


def unprintable_ids(tok):
    """Special tokens and tokens that are not whole printable ASCII text (e.g. one byte of a UTF-8 character)."""
    return [i for i in range(VOCAB)
            if not all(c == "\n" or " " <= c <= "~" for c in tok.decode([i], skip_special_tokens=True) or "\0")]


GEMMAS = ("gemma", "gemma2", "gemma3_text")


def randomize(model, seed, damped_rows):
    """Overwrites every parameter (HF's init leaves biases at 0 and norms at 1) with values that give
    well-separated logits, so greedy decoding is not decided by rounding. The output rows of `damped_rows`
    are shrunk so that greedy text is mostly readable."""
    gen = torch.Generator().manual_seed(seed)
    output = model.get_output_embeddings().weight
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if name.endswith("norm.weight") or (".ln_" in name and name.endswith(".weight")):
                # Gemma's and Nemotron's norms scale by 1 + weight.
                value = (0.0 if model.config.model_type in GEMMAS + ("nemotron",) else 1.0) + 0.2 * noise
            elif name.endswith(".bias"):
                value = 0.3 * noise
            elif "embed_tokens" in name and model.config.model_type in GEMMAS:
                # Gemma multiplies the embeddings by sqrt(hidden_size) on the way in.
                value = 0.25 * noise / math.sqrt(model.config.hidden_size)
            elif "embed_tokens" in name or name.startswith("lm_head") or name == "transformer.wte.weight":
                value = 0.25 * noise
            elif model.config.model_type == "gpt2" and name.endswith(".weight") and p.dim() == 2:
                # Conv1D weights are [in, out]; c_proj writes into the residual stream.
                gain = RESIDUAL_GAIN if name.endswith("c_proj.weight") else 1.0
                value = gain * noise / math.sqrt(p.shape[0])
            elif name.endswith(("o_proj.weight", "down_proj.weight", "experts.down_proj")):
                value = RESIDUAL_GAIN * noise / math.sqrt(p.shape[-1])
            else:
                value = noise / math.sqrt(p.shape[-1])
            if p is output:
                value[damped_rows] *= 0.25
            p.copy_(value.to(p.dtype))
        # DeepSeek-V3's routing correction is a buffer, not a parameter: set so that it changes the choices.
        for name, b in sorted(model.named_buffers()):
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=gen, dtype=torch.float64))


def rms_norm64(self, x):
    """Llama's RMSNorm in float64; Gemma's scales by 1 + weight and calls its epsilon `eps`."""
    if type(self).__name__.startswith("Gemma"):
        return (1.0 + self.weight) * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def layer_norm64(self, x):
    """OLMo's LayerNorm (no parameters; transformers runs it in float32) in float64."""
    return F.layer_norm(x, self.normalized_shape, None, None, eps=1e-5)


def cohere_layer_norm64(self, x):
    """Cohere's LayerNorm (weight, no bias; transformers runs it in float32) in float64."""
    mean = x.mean(-1, keepdim=True)
    variance = (x - mean).pow(2).mean(-1, keepdim=True)
    return self.weight * ((x - mean) * torch.rsqrt(variance + self.variance_epsilon))


ROUTING = {"margin": math.inf}


def router64(self, hidden_states):
    """A top-k softmax router in float64 (transformers' runs its softmax in float32), recording in ROUTING the
    smallest gap between a token's last chosen expert and its best unchosen one."""
    logits = F.linear(hidden_states.reshape(-1, self.hidden_dim), self.weight)
    probs = torch.softmax(logits, dim=-1)
    ranked = torch.sort(probs, dim=-1, descending=True).values
    if self.num_experts > self.top_k:
        gap = (ranked[:, self.top_k - 1] - ranked[:, self.top_k]).min().item()
        ROUTING["margin"] = min(ROUTING["margin"], gap)
    top, index = torch.topk(probs, self.top_k, dim=-1)
    # Mixtral's router always renormalizes (it has no norm_topk_prob).
    if getattr(self, "norm_topk_prob", True):
        top = top / top.sum(dim=-1, keepdim=True)
    return logits, top, index


def grouped_router64(self, hidden_states):
    """DeepSeek-V3's router in float64 (transformers' runs in float32): sigmoid scores plus the correction bias
    choose the `topk_group` groups with the best sums of their two best experts, then the `top_k` best experts in
    those groups; the chosen experts' scores (without the bias), renormalized when `norm_topk_prob`, times
    `routed_scaling_factor`, weight them. ROUTING records the smallest gap at either choice."""
    logits = F.linear(hidden_states.reshape(-1, self.hidden_dim), self.weight)
    scores = logits.sigmoid()
    choice = scores + self.e_score_correction_bias
    groups = choice.view(-1, self.num_group, self.num_experts // self.num_group).topk(2, dim=-1)[0].sum(dim=-1)
    if self.num_group > self.topk_group:
        ranked = groups.sort(dim=-1, descending=True).values
        gap = (ranked[:, self.topk_group - 1] - ranked[:, self.topk_group]).min().item()
        ROUTING["margin"] = min(ROUTING["margin"], gap)
    group_idx = groups.topk(self.topk_group, dim=-1)[1]
    allowed = torch.zeros_like(groups).scatter_(1, group_idx, 1).bool()
    allowed = allowed.unsqueeze(-1).expand(-1, -1, self.num_experts // self.num_group).reshape(-1, self.num_experts)
    choice = choice.masked_fill(~allowed, float("-inf"))
    if self.num_experts // self.num_group * self.topk_group > self.top_k:
        ranked = choice.sort(dim=-1, descending=True).values
        gap = (ranked[:, self.top_k - 1] - ranked[:, self.top_k]).min().item()
        ROUTING["margin"] = min(ROUTING["margin"], gap)
    index = choice.topk(self.top_k, dim=-1)[1]
    weights = scores.gather(1, index)
    if self.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return logits, weights * self.routed_scaling_factor, index


def saved_names(model, params):
    """`params` (by `named_parameters()` names) under the names `save_pretrained` writes: transformers 5 holds
    each MoE block's experts as 3-D tensors but saves one tensor per expert, as the Hub's checkpoints have them."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        saved = safetensors.torch.load_file(str(Path(tmp) / "model.safetensors"))
    # Buffers saved beside the parameters (DeepSeek-V3's routing correction) do not train.
    buffers = {n for n, _ in model.named_buffers()}
    saved = {n: t for n, t in saved.items() if n not in buffers}
    if set(saved) == set(params):
        return params
    if sum(t.numel() for t in saved.values()) != sum(p.numel() for p in params.values()):
        raise SystemExit("the saved tensors do not hold the trained parameters")
    return {n: t.to(torch.float64) for n, t in saved.items()}


def eager_attention64(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    groups = getattr(module, "num_key_value_groups", 1)  # GPT-NeoX: no grouped keys and values
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    softcap = kwargs.get("softcap")
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is None:
        if query.shape[2] > 1:
            raise RuntimeError("eager attention got no mask for several queries")
    elif attention_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attention_mask, float("-inf"))
    else:
        scores = scores + attention_mask
    weights = torch.softmax(scores, dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def inv_freq64(config, rope=None):
    rope = rope or config.rope_parameters
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    partial = rope.get("partial_rotary_factor") or getattr(config, "partial_rotary_factor", None) or 1.0
    dim = int(dim * partial)
    inv = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if rope["rope_type"] == "default":
        return inv
    if rope["rope_type"] == "longrope":
        # The short factors, as transformers starts with; rotary64 takes the long ones past the pretraining length.
        return inv / torch.tensor(rope["short_factor"], dtype=torch.float64)
    if rope["rope_type"] == "yarn":
        return yarn_inv_freq64(rope, dim)
    if rope["rope_type"] != "llama3":
        raise SystemExit(f"no float64 RoPE for {rope['rope_type']}")
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    return torch.where(medium, smoothed, scaled)


def yarn_inv_freq64(rope, dim):
    """YaRN's frequencies (transformers' _compute_yarn_parameters, truncated) in float64: interpolated by
    `factor` below the correction range, extrapolated above it, a linear ramp in between."""
    base, factor, old = rope["rope_theta"], rope["factor"], rope["original_max_position_embeddings"]
    if not rope.get("truncate", True):
        raise SystemExit("no float64 YaRN without truncation")

    def correction_dim(rotations):
        return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(rope.get("beta_fast") or 32)), 0)
    high = min(math.ceil(correction_dim(rope.get("beta_slow") or 1)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    pos = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    extrapolation = 1 - ramp
    return (1 / (factor * pos)) * (1 - extrapolation) + (1 / pos) * extrapolation


def rotary64(self, x, position_ids):
    inv_freq = self.inv_freq64
    rope = self.config.rope_parameters
    if rope["rope_type"] == "longrope" and position_ids.max() + 1 > rope["original_max_position_embeddings"]:
        inv_freq = inv_freq * torch.tensor(rope["short_factor"], dtype=torch.float64) / torch.tensor(
            rope["long_factor"], dtype=torch.float64)
    freqs = position_ids[:, :, None].to(torch.float64) * inv_freq[None, None, :]
    # Cohere rotates adjacent pairs: each frequency twice in a row.
    if type(self).__name__.startswith("Cohere"):
        emb = torch.repeat_interleave(freqs, 2, dim=-1)
    else:
        emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


def rotary64_per_layer_type(self, x, position_ids, layer_type):
    """rotary64 for rotary embeddings with settings per layer type (OLMo 3), which return float32 otherwise."""
    freqs = position_ids[:, :, None].to(torch.float64) * self.inv_freq64[layer_type][None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    scaling = getattr(self, f"{layer_type}_attention_scaling")
    return (emb.cos() * scaling).to(x.dtype), (emb.sin() * scaling).to(x.dtype)


def route_eager_attention(modeling):
    """Makes the family's eager attention call eager_attention64 for modules marked `float64_reference`,
    and transformers' own code for all others."""
    original = modeling.eager_attention_forward
    if getattr(original, "routes_float64", False):
        return

    def eager(module, *args, **kwargs):
        chosen = eager_attention64 if getattr(module, "float64_reference", False) else original
        return chosen(module, *args, **kwargs)

    eager.routes_float64 = True
    modeling.eager_attention_forward = eager


def float64_model(model32):
    """A float64 copy whose RMSNorm, softmax and RoPE also run in float64."""
    model = copy.deepcopy(model32).double().eval()
    for module in model.modules():
        kind = type(module).__name__
        # (Falcon's attention runs its own softmax in the model's dtype: float64 already.)
        if kind.endswith("Attention") and hasattr(sys.modules[type(module).__module__], "eager_attention_forward"):
            route_eager_attention(sys.modules[type(module).__module__])
            module.float64_reference = True
        elif kind.endswith("RMSNorm"):
            module.forward = types.MethodType(rms_norm64, module)
        elif kind == "OlmoLayerNorm":
            module.forward = types.MethodType(layer_norm64, module)
        elif kind == "CohereLayerNorm":
            module.forward = types.MethodType(cohere_layer_norm64, module)
        elif kind.endswith("TopKRouter"):
            module.forward = types.MethodType(router64, module)
        elif kind == "DeepseekV3TopkRouter":
            module.forward = types.MethodType(grouped_router64, module)
        elif kind.endswith("RotaryEmbedding") and hasattr(module, "layer_types"):
            module.inv_freq64 = {}
            for layer_type in module.layer_types:
                inv = inv_freq64(model.config, model.config.rope_parameters[layer_type])
                hf = getattr(module, f"{layer_type}_inv_freq").to(torch.float64)
                if not torch.allclose(inv, hf, rtol=1e-6, atol=0):
                    raise SystemExit(f"float64 RoPE frequencies {inv} disagree with transformers' {hf}")
                module.inv_freq64[layer_type] = inv
            module.forward = types.MethodType(rotary64_per_layer_type, module)
        elif kind.endswith("RotaryEmbedding"):
            inv = inv_freq64(model.config)
            # (original_inv_freq: a forward past the pretraining length switches LongRoPE's inv_freq.)
            hf = module.original_inv_freq.to(torch.float64)
            if not torch.allclose(inv, hf, rtol=1e-6, atol=0):
                raise SystemExit(f"float64 RoPE frequencies {inv} disagree with transformers' {hf}")
            module.inv_freq64 = inv
            module.forward = types.MethodType(rotary64, module)
    return model


def lm_loss(logits, ids):
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def greedy(model, ids):
    """Greedy decoding by recomputing the whole prefix at each step (no cache, no EOS stop)."""
    seq = ids
    picked, step_logits, margins = [], [], []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            last = model(seq, use_cache=False).logits[:, -1]
            top = last.topk(2, dim=-1).values
            margins.append((top[:, 0] - top[:, 1]).min().item())
            nxt = last.argmax(-1, keepdim=True)
            picked.append(nxt)
            step_logits.append(last)
            seq = torch.cat([seq, nxt], dim=1)
    return torch.cat(picked, 1), torch.stack(step_logits, 1), min(margins)


def adamw_steps(model, ids, settings):
    """Two torch.optim.AdamW steps on the parameters that require grad (all of a model; only the adapter of a
    PEFT model): batch A (the first prompt), then batch B (the second). Returns them by the names they are saved
    under (PEFT's adapter name `.default` dropped) and the loss before each step."""
    params = {n.replace(".default", ""): p for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW(params.values(), **settings)
    losses = []
    for batch in (ids[:1], ids[1:]):
        opt.zero_grad()
        loss = lm_loss(model(batch, use_cache=False).logits, batch)
        loss.backward()
        losses.append(loss.item())
        opt.step()
    return {n: p.detach().clone() for n, p in params.items()}, torch.tensor(losses, dtype=torch.float64)


def classic_rope_config(path):
    """Rewrites config.json the way Llama 3.x checkpoints spell RoPE: top-level rope_theta and rope_scaling."""
    cfg = json.loads(path.read_text())
    rope = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = rope.pop("rope_theta")
    cfg["rope_scaling"] = rope
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def save_tokenizer(tok, add_bos, eos_ids, out):
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS if add_bos else None,
        "eos_token": EOS,
        "pad_token": None,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 256,
        "chat_template": CHAT_TEMPLATE,
    }, indent=2) + "\n")
    transformers.GenerationConfig(
        bos_token_id=tok.token_to_id(BOS), eos_token_id=eos_ids, do_sample=False
    ).save_pretrained(out)


def tokenizer_report(tok, out):
    hf = transformers.AutoTokenizer.from_pretrained(out)
    checks = []
    for text in ROUND_TRIPS:
        ids = tok.encode(text).ids
        plain = tok.encode(text, add_special_tokens=False).ids
        checks.append({
            "text": text,
            "ids": ids,
            "ids_without_special_tokens": plain,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
            "transformers_agrees": hf(text)["input_ids"] == ids,
        })
    chat_text = hf.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    return checks, {
        "messages": CHAT,
        "add_generation_prompt": True,
        "rendered": chat_text,
        "ids": tok.encode(chat_text, add_special_tokens=False).ids,
    }


def eager(config):
    """Loading arguments for the plain PyTorch code paths, which also run in float64 (the default grouped-matmul
    experts do not)."""
    # transformers 5.17's eager Falcon attention adds ALiBi twice (its causal mask carries it too); SDPA adds it
    # once, as Falcon-RW was trained.
    attention = "sdpa" if getattr(config, "alibi", False) else "eager"
    kwargs = dict(attn_implementation=attention, dtype=torch.float32)
    if any(hasattr(config, k) for k in ("num_experts", "num_local_experts")):
        kwargs["experts_implementation"] = "eager"
    return kwargs


def make_fixture(name, out_root, tok_cache):
    config_class, args, add_bos, covers = FIXTURES[name]
    out = out_root / name
    out.mkdir(parents=True, exist_ok=True)
    if add_bos not in tok_cache:
        tok_cache[add_bos] = train_tokenizer(add_bos)
    tok = tok_cache[add_bos]
    texts, ids = prompt_ids(tok)
    config = getattr(transformers, config_class)(**args)

    seed = 1000
    while True:
        torch.manual_seed(seed)
        model32 = transformers.AutoModelForCausalLM.from_config(config, **eager(config)).eval()
        randomize(model32, seed, unprintable_ids(tok))
        model64 = float64_model(model32)
        ROUTING["margin"] = math.inf
        greedy_ids, greedy_logits, margin = greedy(model64, ids)
        special = {tok.token_to_id(BOS), tok.token_to_id(EOS)}
        varied = all(len(set(row)) >= MIN_DISTINCT for row in greedy_ids.tolist())
        routed = ROUTING["margin"] >= MIN_ROUTING_MARGIN
        if margin >= MIN_MARGIN and varied and routed and not special & set(greedy_ids.flatten().tolist()):
            break
        print(f"{name}: seed {seed} rejected (margin {margin:.2e}, varied {varied}, routing margin "
              f"{ROUTING['margin']:.2e})", flush=True)
        seed += 1
        if seed > 1050:
            raise SystemExit(f"{name}: no seed in 1000..1050 passes the greedy checks")

    with torch.no_grad():
        logits = model64(ids, use_cache=False).logits
        hf32 = model32(ids, use_cache=False).logits.double()
        hf64 = copy.deepcopy(model32).double()(ids, use_cache=False).logits
    if (hf32 - logits).abs().max() > 1e-4:
        raise SystemExit(f"{name}: float64 reference is {(hf32 - logits).abs().max():.2e} from transformers' f32")
    generated = model64.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                 min_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                                 pad_token_id=tok.token_to_id(EOS))
    cached_agrees = torch.equal(generated[:, PROMPT_LEN:], greedy_ids)

    model32.generation_config = transformers.GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, do_sample=False)
    model32.save_pretrained(out, safe_serialization=True)
    if name == "llama3_tied":
        classic_rope_config(out / "config.json")
    save_tokenizer(tok, add_bos, config.eos_token_id, out)

    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, **eager(config)).eval()
    # (GPT-2 has no rotary embedding.)
    if getattr(reloaded.config, "rope_parameters", None) != getattr(config, "rope_parameters", None):
        raise SystemExit(f"{name}: reloaded rope {reloaded.config.rope_parameters} != {config.rope_parameters}")
    with torch.no_grad():
        reload_err = (reloaded(ids, use_cache=False).logits.double() - hf32).abs().max().item()
    if reload_err != 0.0:
        raise SystemExit(f"{name}: the saved folder gives logits {reload_err:.2e} from the model it was saved from")

    tensors = {"input_ids": ids, "logits": logits, "greedy_ids": greedy_ids, "greedy_logits": greedy_logits}
    losses = {}
    adamw_f32 = {}
    saved = safetensors.torch.load_file(str(out / "model.safetensors"))
    for prefix, settings in ADAMW.items():
        trained = float64_model(model32)
        params, step_losses = adamw_steps(trained, ids, settings)
        for n, p in saved_names(trained, params).items():
            delta = (p - saved[n].to(torch.float64)).to(torch.float32)
            if (saved[n].to(torch.float64) + delta.to(torch.float64) - p).abs().max() > 1e-9:
                raise SystemExit(f"{name}: {n} does not keep its float64 result as an f32 step")
            tensors[f"{prefix}_delta/{n}"] = delta
        tensors[f"{prefix}_losses"] = step_losses
        losses[prefix] = step_losses.tolist()
        # PyTorch's own f32 training on the same steps, against the float64 truth: the scale of error an f32
        # implementation cannot be asked to beat.
        params32, losses32 = adamw_steps(copy.deepcopy(model32).eval(), ids, settings)
        adamw_f32[prefix] = {
            "max_abs_param_err": max((params32[n].double() - p).abs().max().item() for n, p in params.items()),
            "max_rel_loss_err": ((losses32 - step_losses).abs() / step_losses.abs()).max().item(),
        }
    lora_report = make_lora(name, out, model32, ids, tensors)
    if ROUTING["margin"] < MIN_ROUTING_MARGIN:
        raise SystemExit(f"{name}: a float64 pass routed with a margin of {ROUTING['margin']:.2e}")
    safetensors.torch.save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "reference.safetensors"))

    checks, chat = tokenizer_report(tok, out)
    report = {
        "fixture": name,
        "covers": covers,
        "seed": seed,
        "prompts": texts,
        "input_ids": ids.tolist(),
        "greedy_ids": greedy_ids.tolist(),
        "greedy_text": [tok.decode(g, skip_special_tokens=False) for g in greedy_ids.tolist()],
        "full_text": [tok.decode(s, skip_special_tokens=False) for s in torch.cat([ids, greedy_ids], 1).tolist()],
        "greedy_min_margin": margin,
        "routing_min_margin": ROUTING["margin"] if ROUTING["margin"] < math.inf else None,
        "tokenizer_adds_bos": add_bos,
        "tokenizer_round_trips": checks,
        "chat": chat,
        "adamw": {k: dict(ADAMW[k], betas=list(ADAMW[k]["betas"]), losses=losses[k]) for k in ADAMW},
        "loss": "mean cross-entropy of logits[:, t] against input_ids[:, t + 1] over all 2 x 23 positions",
        "lora": lora_report,
        "diagnostics": {
            "max_abs_logit": logits.abs().max().item(),
            "transformers_f32_max_abs_err": (hf32 - logits).abs().max().item(),
            "transformers_double_unpatched_max_abs_err": (hf64 - logits).abs().max().item(),
            "transformers_generate_with_cache_agrees": cached_agrees,
            "transformers_f32_adamw": adamw_f32,
        },
        "versions": versions(),
    }
    (out / "reference.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"{name}: seed {seed}, margin {margin:.3g}, f32 err {report['diagnostics']['transformers_f32_max_abs_err']:.2e}, "
          f"unpatched f64 err {report['diagnostics']['transformers_double_unpatched_max_abs_err']:.2e}, "
          f"generate agrees {cached_agrees}, {size} bytes", flush=True)
    return covers


def make_lora(name, out, model32, ids, tensors):
    """The family's PEFT adapter in out/lora and its float64 references in `tensors` (see the module docs)."""
    settings = LORA[name]
    torch.manual_seed(7)
    config = peft.LoraConfig(task_type="CAUSAL_LM", lora_dropout=0.0, init_lora_weights=False, **settings)
    made = peft.get_peft_model(copy.deepcopy(model32), config)
    # B starts random (init_lora_weights=False) so that the adapter changes the logits; scaled so it does not
    # drown the base model. Then PEFT trains it a little (f32, three AdamW steps on both prompts), so that the
    # adapter is one made and trained by PEFT.
    with torch.no_grad():
        for n, p in made.named_parameters():
            if "lora_B" in n:
                p.mul_(0.5)
    opt = torch.optim.AdamW([p for p in made.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        lm_loss(made(ids, use_cache=False).logits, ids).backward()
        opt.step()
    made.save_pretrained(out / "lora", safe_serialization=True)
    (out / "lora" / "README.md").unlink()  # PEFT's model card template

    def loaded(base):
        return peft.PeftModel.from_pretrained(base, out / "lora", is_trainable=True)

    model64 = loaded(float64_model(model32)).double()
    with torch.no_grad():
        logits = model64(ids, use_cache=False).logits
        logits32 = loaded(copy.deepcopy(model32)).eval()(ids, use_cache=False).logits.double()
        merged = loaded(float64_model(model32)).double().merge_and_unload()(ids, use_cache=False).logits
    if (logits32 - logits).abs().max() > 1e-4:
        raise SystemExit(f"{name}: LoRA float64 reference is {(logits32 - logits).abs().max():.2e} from PEFT's f32")
    tensors["lora/logits"] = logits
    params, losses = adamw_steps(model64, ids, LORA_ADAMW)
    params32, losses32 = adamw_steps(loaded(copy.deepcopy(model32)).eval(), ids, LORA_ADAMW)
    saved = set(safetensors.torch.load_file(str(out / "lora" / "adapter_model.safetensors")))
    if set(params) != saved:
        raise SystemExit(f"{name}: trained adapter names {sorted(params)} differ from the saved {sorted(saved)}")
    tensors.update({f"lora/adamw/{n}": p for n, p in params.items()})
    tensors["lora/adamw_losses"] = losses
    return {
        "settings": {k: (sorted(v) if isinstance(v, set) else v) for k, v in settings.items()},
        "adamw": dict(LORA_ADAMW, betas=list(LORA_ADAMW["betas"]), losses=losses.tolist()),
        "peft_f32_max_abs_logit_err": (logits32 - logits).abs().max().item(),
        "merge_and_unload_max_abs_logit_err": (merged - logits).abs().max().item(),
        "peft_f32_adamw_max_abs_param_err": max((params32[n].double() - p).abs().max().item()
                                                for n, p in params.items()),
        "peft_f32_adamw_max_rel_loss_err": ((losses32 - losses).abs() / losses.abs()).max().item(),
    }


def versions():
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "safetensors": getattr(safetensors, "__version__", "unknown"),
        "peft": peft.__version__,
    }


def write_readme(out_root, covered):
    v = versions()
    rows = "\n".join(f"| `{name}` | {text} |" for name, text in covered.items())
    (out_root / "README.md").write_text(f"""# Reference fixtures

Tiny random causal LMs, one per supported family, with references computed by Hugging Face transformers.
Made by `python3 scripts/make_fixtures.py --out tests/fixtures` (everything runs on the CPU) with Python
{v['python']}, torch {v['torch']}, transformers {v['transformers']}, tokenizers {v['tokenizers']}, safetensors
{v['safetensors']}, peft {v['peft']}. Rerunning it with these versions gives the same files, except that another
CPU may change the last bits of the float64 references (runs on the H200 machine and on a 2-core x86 box
differed by at most 2e-13); the model, tokenizer and adapter files come out byte for byte the same.

Every model: 2 layers, hidden 64 (or as its row says), 4 attention heads, 2 KV heads (GQA; GPT-2, GPT-NeoX and DeepSeek-V3 4, Falcon as its row says), MLP 128 (SiLU unless the row says otherwise; the MoE fixtures' experts as listed), vocab 300, f32 weights
(all parameters random, norms around 1, biases non-zero), and a byte-level BPE tokenizer (`<s>` = 0, `</s>` = 1)
trained on a few public-domain paragraphs.

| fixture | covers |
| --- | --- |
{rows}

Files in each folder:
- `config.json`, `model.safetensors` (f32), `generation_config.json`: as `save_pretrained` writes them.
- `tokenizer.json`, `tokenizer_config.json` (with a Jinja `chat_template`).
- `reference.safetensors`:
  - `input_ids` [2, 24] i64: two prompts; `encode(prompt)` of the tokenizer gives exactly these ids.
  - `logits` [2, 24, 300] f64: logits of every prompt position.
  - `greedy_ids` [2, 12] i64: 12 greedy tokens (argmax of the full-prefix logits; no EOS stop, and none of
    them is `<s>` or `</s>`); `greedy_logits` [2, 12, 300] f64: the logits each was picked from.
  - `adamw_damped_delta/<param>` f32: how far each parameter moved in two `torch.optim.AdamW` steps computed in
    float64 (lr 1e-3, betas (0.9, 0.999), eps 1e-3, weight decay 0.1 on every parameter), from its value in
    `model.safetensors`: that value plus the delta is the float64 result within 1e-10 (the change is stored in
    f32 to keep the fixtures small). Names as `save_pretrained` writes them (tied models have no
    `lm_head.weight`; MoE experts one tensor per expert). Step 1 trains on `input_ids[0]` (batch A), step 2 on
    `input_ids[1]` (batch B); the loss is the mean cross-entropy of `logits[:, t]` against `input_ids[:, t+1]` over
    the batch's 23 positions; `adamw_damped_losses` [2] f64 holds the loss before each step.
- `lora/`: a LoRA adapter made and trained by PEFT (`get_peft_model` with `init_lora_weights=False`, B scaled
  by 1/2, three f32 AdamW steps at lr 1e-2 on both prompts, then `save_pretrained`): `adapter_config.json` and
  `adapter_model.safetensors` as PEFT writes them. Each family's adapter uses other settings (`LORA` in the script; `lora.settings` in reference.json): targets by name list,
  `all-linear` and regular expression, rsLoRA, `rank_pattern` / `alpha_pattern`, `layers_to_transform`.
  `reference.safetensors` holds, in float64: `lora/logits` [2, 24, 300] (the model with the adapter, through
  `PeftModel.from_pretrained`), `lora/adamw/<tensor name as saved>` (the adapter after two `torch.optim.AdamW`
  steps with torch's defaults and weight decay 0.01, lr 1e-3, batch A then batch B, only the adapter training)
  and `lora/adamw_losses` [2]. reference.json's `lora` section says how far PEFT's own f32 lands (logits, trained
  adapter, losses) and how far `merge_and_unload` lands from the unmerged float64 logits.
- `reference.json`: prompt texts, decoded greedy text, tokenizer round trips (ids with and without special
  tokens, decoded text), the chat template rendered by transformers for a sample conversation (encode it without
  adding special tokens), and diagnostics: how far transformers' own f32 and its unpatched `model.double()` are
  from the reference, whether `generate()` with its KV cache picked the same tokens, and how far PyTorch's own
  f32 training lands from the AdamW references (`transformers_f32_adamw`: largest parameter error, largest
  relative loss error).

The references are true float64: transformers' Llama-family code computes RMSNorm (and OLMo's LayerNorm), the attention softmax, RoPE's
cos/sin and the loss in float32 even for a float64 model, so the script swaps in the same formulas in float64
(and checks them against transformers' f32 output, within 1e-4, and the RoPE frequencies within 1e-6).
In the MoE fixtures the router also runs in float64, and every float64 pass must route each token with a gap of at
least {MIN_ROUTING_MARGIN} between its last chosen expert's probability and the best unchosen one's
(`routing_min_margin` in reference.json). Seeds are fixed; a seed is skipped when a greedy step's top-2 logit gap is under {MIN_MARGIN}, when a greedy
token is special or when a continuation has fewer than {MIN_DISTINCT} distinct tokens (see `seed` and
`greedy_min_margin` in reference.json). Output-embedding rows of special tokens and of tokens that are not printable
ASCII are scaled by 1/4, so greedy text is mostly readable.
""", encoding="utf-8")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder that gets one subfolder per fixture")
    parser.add_argument("--only", nargs="*", choices=sorted(FIXTURES), help="make only these fixtures")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    tok_cache = {}
    names = args.only or list(FIXTURES)
    covered = {name: make_fixture(name, args.out, tok_cache) for name in names}
    if not args.only:
        write_readme(args.out, covered)


if __name__ == "__main__":
    main()
