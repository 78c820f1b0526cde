#!/usr/bin/env python3
"""hf_random_model.py - a Hugging Face folder of a real model's shape with random weights.

zr's acceptance runs (issue 43) train a model shaped like SmolLM2-135M without
downloading it: this writes its config (as published: 30 layers, hidden 576,
9 heads, 3 KV heads, intermediate 1536, vocabulary 49152, tied embeddings,
rope_theta 100000) and weights drawn by transformers' own initialisation
(seed 0) with save_pretrained, in fp32 unless --dtype says otherwise.

Usage: scripts/hf_random_model.py OUT_DIR [--shape smollm2-135m|tiny] [--dtype float32|bfloat16]
       [--layers N] (needs torch and transformers)
"""
import argparse
import os
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SHAPES = {
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
                         tie_word_embeddings=True, bos_token_id=0, eos_token_id=0),
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                 rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--layers", type=int, default=0, help="override num_hidden_layers")
    a = ap.parse_args()
    if os.path.exists(a.out):
        sys.exit(f"{a.out} exists: give a new folder")
    kw = dict(SHAPES[a.shape])
    if a.layers > 0:
        kw["num_hidden_layers"] = a.layers
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_act="silu", initializer_range=0.02, use_cache=False, **kw)
    model = LlamaForCausalLM(cfg).to(getattr(torch, a.dtype))
    model.save_pretrained(a.out, safe_serialization=True, max_shard_size="100GB")
    n = sum(p.numel() for p in model.parameters())
    print(f"{a.out}: {a.shape}, {n / 1e6:.1f}M parameters, {a.dtype}")


if __name__ == "__main__":
    main()
