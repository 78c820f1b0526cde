#!/usr/bin/env python3
"""torch_gpt2.py - the PyTorch reference for `zr bench model --device cuda`.

One GPT-2 124M training step on one GPU, written for this comparison the way a
PyTorch user would write it: bf16 autocast over fp32 weights,
F.scaled_dot_product_attention (causal: the flash kernel on Hopper), the
classifier tied to the token embedding, fused AdamW, with and without
torch.compile. Same shapes as zr's bench: T 1024, the padded vocabulary
50304 (zr's classifier GEMM runs over Vp too), the micro-batch given (zr's
bench picks 32 on an H200). Timed with CUDA events, median of the timed
steps after the warm-up steps, on random tokens (never zeros).

    python3 bench/gpu/torch_gpt2.py [--batch 32] [--steps 10] [--modes eager,compile] [--json]

Prints one line per mode and, with --json, one JSON object per mode.
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, h):
        super().__init__()
        self.h = h
        self.ln1 = nn.LayerNorm(c)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.ln2 = nn.LayerNorm(c)
        self.fc = nn.Linear(c, 4 * c)
        self.fcproj = nn.Linear(4 * c, c)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers=12, heads=12, c=768, vocab=50304, tmax=1024):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(tmax, c)
        self.blocks = nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.lnf = nn.LayerNorm(c)
        for n, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if n.endswith(("proj.weight",)) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif n.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, tgt):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.lnf(x), self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), tgt.view(-1))


def run(mode, B, T, steps, warm):
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = GPT(tmax=T).to(dev)
    nparams = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    fwd = torch.compile(model) if mode == "compile" else model
    idx = torch.randint(0, 50257, (B, T), device=dev)
    tgt = torch.randint(0, 50257, (B, T), device=dev)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.time()
    for _ in range(warm):
        step()
    torch.cuda.synchronize()
    warm_s = time.time() - t0
    times = []
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(steps):
        e0.record()
        loss = step()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    ms = statistics.median(times)
    # zr_gpt_flops_per_step's count, so that TFLOP/s compare: forward multiply-adds of the
    # blocks (12 C^2 a token), the classifier over the real vocabulary (V C) and causal
    # attention (T/2 keys per query, 2 C each); the backward costs two forwards
    L, C, N = 12, 768, B * T
    flops = 3.0 * (2.0 * N * (L * 12.0 * C * C + 50257 * C) + 2.0 * L * N * (T / 2.0) * 2.0 * C)
    return {
        "bench": "torch_gpt2",
        "mode": mode,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
        "B": B,
        "T": T,
        "params": nparams,
        "ms_per_step": ms,
        "ms_spread": [min(times), max(times)],
        "tokens_per_s": B * T / (ms * 1e-3),
        "tflops": flops / (ms * 1e-3) * 1e-12,
        "warmup_s": warm_s,
        "loss": float(loss),
        "peak_mb": torch.cuda.max_memory_allocated() / 1e6,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    for mode in a.modes.split(","):
        r = run(mode, a.batch, a.seq, a.steps, a.warmup)
        print(f"torch {mode}: B {r['B']} x T {r['T']}: {r['ms_per_step']:.2f} ms/step, "
              f"{r['tokens_per_s']:.0f} tokens/s, {r['tflops']:.1f} TFLOP/s "
              f"(spread {r['ms_spread'][0]:.2f}-{r['ms_spread'][1]:.2f} ms, warm-up {r['warmup_s']:.0f} s)",
              flush=True)
        if a.json:
            print(json.dumps(r), flush=True)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


if __name__ == "__main__":
    main()
