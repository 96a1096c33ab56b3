#!/usr/bin/env python3
"""Makes the embedded default model folder `assets/tiny-llama/` for training from scratch.

The corpus `assets/tinyshakespeare.txt` is Shakespeare (public domain) as collected in the "tiny shakespeare"
file of Karpathy's char-rnn (1,115,394 bytes). This script trains a byte-level BPE tokenizer on it (GPT-2 style:
no text is lost, no token added around documents, so the training stream is the file itself) and writes a small
Llama-shaped `config.json` beside it; the folder has no weights, so `hierarchos train` starts from random weights.

Usage: python3 scripts/make_assets.py  (needs `pip install tokenizers`; the output is committed)
"""
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "assets" / "tinyshakespeare.txt"
OUT = ROOT / "assets" / "tiny-llama"
VOCAB = 2048
SPECIAL = "<|endoftext|>"
CONTEXT = 256


def main():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[SPECIAL],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(CORPUS)], trainer)
    OUT.mkdir(parents=True, exist_ok=True)
    tok.save(str(OUT / "tokenizer.json"))
    (OUT / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIAL,
        "eos_token": SPECIAL,
        "unk_token": SPECIAL,
        "model_max_length": CONTEXT,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
    }, indent=2) + "\n")
    (OUT / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": tok.get_vocab_size(),
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": CONTEXT,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": tok.token_to_id(SPECIAL),
        "eos_token_id": tok.token_to_id(SPECIAL),
        "dtype": "float32",
    }, indent=2) + "\n")
    text = CORPUS.read_text(encoding="utf-8")
    ids = tok.encode(text).ids
    assert tok.decode(ids) == text, "the tokenizer does not round-trip the corpus"
    print(f"{len(text)} characters -> {len(ids)} tokens ({len(text) / len(ids):.2f} per token), vocab {tok.get_vocab_size()}")


if __name__ == "__main__":
    main()
