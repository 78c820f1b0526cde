#!/usr/bin/env python3
"""torch_gpt.py - the PyTorch reference for `zr bench model` on the CPU (issue 40).

The training step zr's bench times, in PyTorch on the CPU: forward, backward and
AdamW on one process, at the thread counts given (torch.set_num_threads), with
fp32 products and with bf16 ones (torch.autocast("cpu", dtype=torch.bfloat16)
over fp32 weights: oneDNN's bf16 matmul, AMX where the CPU has it).

The model is bench/gpu/torch_gpt2.py's GPT (GPT-2 layout: learned positional
embeddings, pre-LayerNorm, tanh GELU, biases, classifier tied to the token
embedding, F.scaled_dot_product_attention), in zr bench model's two CPU configs:

    small   L 4, C 256, 4 heads, V = Vp = 256, B 4, T 256, 7 timed steps
    124M    L 12, C 768, 12 heads, V 50257, Vp 50304, B 1, T 1024, 3 timed steps

As in zr: the token embedding has Vp rows, its padded rows start at 0, the
classifier runs over Vp and the loss over the real V; init N(0, 0.02), the
projections N(0, 0.02 / sqrt(2 L)); AdamW lr 1e-4, betas 0.9/0.95, eps 1e-8,
weight decay 0.1 on every tensor (the bench's zr_adamw_update has decay 1 for all
units), fused=True (PyTorch's fastest CPU AdamW); tokens from zr's xorshift
stream, so the step-0 loss is on the same tokens as zr's (about ln V at init).
One warm-up step, then the median wall time of the timed steps; tokens/s = B T
over it; GFLOP/s by zr_gpt_flops_per_step's count (src/model/gpt.c).

The kernels: one small probe process with MKL_VERBOSE and ONEDNN_VERBOSE set runs
one Linear forward + backward per products mode and reports what ran (e.g.
"brg_matmul:avx10_1_512_amx" for bf16, "mkl:sgemm ..." for fp32).

    python3 bench/cpu/torch_gpt.py [--configs small,124M] [--threads 1,2]
        [--products fp32,bf16] [--steps N] [--warmup N] [--quick] [--json]

Prints one line per run and, with --json, one JSON object per run.
"""
import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.dont_write_bytecode = True  # no __pycache__ beside bench/gpu/torch_gpt2.py
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpu"))
from torch_gpt2 import GPT  # noqa: E402  (the same module as the GPU reference)

# name: (L, heads, C, V, Vp, max_t, B, T, timed steps), as in bench/bench_model.c
CONFIGS = {
    "small": (4, 4, 256, 256, 256, 256, 4, 256, 7),
    "124M": (12, 12, 768, 50257, 50304, 1024, 1, 1024, 3),
}


def flops_per_step(L, C, V, B, T):
    """zr_gpt_flops_per_step: matmuls and causal attention, backward = two forwards."""
    N = B * T
    fwd = 2.0 * N * (L * 12.0 * C * C + V * C) + 2.0 * L * N * (T / 2.0) * 2.0 * C
    return 3.0 * fwd


def zr_tokens(V, n):
    """bench_model.c's inputs and targets: its xorshift64 stream."""
    s, m = 88172645463325252, (1 << 64) - 1
    inp, tgt = [], []
    for _ in range(n):
        s ^= (s << 13) & m
        s ^= s >> 7
        s ^= (s << 17) & m
        inp.append(s % V)
        tgt.append((s >> 20) % V)
    return inp, tgt


def loss_fn(model, idx, tgt, V):
    """GPT.forward with zr's loss: softmax over the real V columns of the Vp logits."""
    T = idx.shape[1]
    x = model.wte(idx) + model.wpe(torch.arange(T))
    for b in model.blocks:
        x = b(x)
    logits = F.linear(model.lnf(x), model.wte.weight)
    return F.cross_entropy(logits[..., :V].float().reshape(-1, V), tgt.view(-1))


def run(cfg, threads, products, steps, warm):
    L, H, C, V, Vp, tmax, B, T, csteps = CONFIGS[cfg]
    steps = steps or csteps
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = GPT(layers=L, heads=H, c=C, vocab=Vp, tmax=tmax)
    with torch.no_grad():
        model.wte.weight[V:].zero_()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=True)
    inp, tgt = zr_tokens(V, B * T)
    idx = torch.tensor(inp).view(B, T)
    tgt = torch.tensor(tgt).view(B, T)
    bf16 = products == "bf16"

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(model, idx, tgt, V)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    t0 = time.perf_counter()
    loss0 = step()
    for _ in range(warm - 1):
        step()
    warm_s = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = step()
        times.append((time.perf_counter() - t0) * 1e3)
    ms = statistics.median(times)
    return {
        "bench": "torch_cpu_gpt",
        "system": "torch",
        "torch": torch.__version__,
        "config": cfg,
        "threads": threads,
        "products": products,
        "B": B,
        "T": T,
        "params": sum(p.numel() for p in model.parameters()),
        "ms_per_step": round(ms, 2),
        "ms_spread": [round(min(times), 2), round(max(times), 2)],
        "tokens_per_s": round(B * T / (ms * 1e-3), 1),
        "gflops": round(flops_per_step(L, C, V, B, T) / (ms * 1e-3) * 1e-9, 2),
        "steps": steps,
        "warmup_s": round(warm_s, 2),
        "loss0": round(loss0, 4),
        "ln_V": round(math.log(V), 4),
        "loss": round(loss, 4),
    }


PROBE = r"""
import sys, torch
torch.set_num_threads(1)
lin = torch.nn.Linear(768, 3072)
x = torch.randn(64, 768, requires_grad=True)
for mode in ("fp32", "bf16"):
    print("PROBE", mode, flush=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "bf16"):
        y = lin(x)
    y.float().sum().backward()
    sys.stdout.flush()
"""


def probe_kernels():
    """{products: kernel} from one Linear forward + backward under MKL/oneDNN verbose."""
    env = dict(os.environ, MKL_VERBOSE="1", ONEDNN_VERBOSE="1")
    try:
        out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                             text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return {"fp32": f"? ({e})", "bf16": f"? ({e})"}
    mkl_isa, mode, seen = "", None, {"fp32": [], "bf16": []}
    for line in out.splitlines():
        if line.startswith("MKL_VERBOSE oneMKL"):
            mkl_isa = "avx512" if "AVX-512" in line else "avx2" if "AVX2" in line else "?"
        elif line.startswith("PROBE "):
            mode = line.split()[1]
        elif mode and line.startswith("MKL_VERBOSE "):
            name = "mkl:" + line.split()[1].split("(")[0].lower()
            seen[mode].append(f"{name} ({mkl_isa} code path)" if mkl_isa else name)
        elif mode and ",exec,cpu," in line:
            f = line.split(",")
            seen[mode].append(f[f.index("exec") + 3])  # matmul's or inner_product's impl
    kern = {}
    for mode, names in seen.items():
        names = sorted(set(names), key=names.index)
        kern[mode] = ", ".join(names) if names else "? (no MKL or oneDNN call seen)"
    return kern


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="small,124M")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--products", default="fp32,bf16")
    ap.add_argument("--steps", type=int, default=0, help="timed steps (default: zr's per config)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="small config only, 2 timed steps")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.configs, a.steps = "small", a.steps or 2
    configs = a.configs.split(",")
    for c in configs:
        if c not in CONFIGS:
            ap.error(f"unknown config {c!r} (known: {', '.join(CONFIGS)})")
    products = a.products.split(",")
    kern = probe_kernels()
    print(f"torch {torch.__version__} on {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs; bf16 supported by oneDNN here: "
          f"{torch.ops.mkldnn._is_mkldnn_bf16_supported()}; kernels: "
          + "; ".join(f"{p} {kern[p]}" for p in products), flush=True)
    # the order of zr bench model: threads outer, configs inner (then the products)
    for th in (int(t) for t in a.threads.split(",")):
        for cfg in configs:
            for prod in products:
                r = run(cfg, th, prod, a.steps, max(1, a.warmup))
                r["products_kernel"] = kern[prod]
                print(f"torch {cfg} {prod} thr {th}: B {r['B']} x T {r['T']}: "
                      f"{r['ms_per_step']:.1f} ms/step (spread {r['ms_spread'][0]:.1f}-"
                      f"{r['ms_spread'][1]:.1f}), {r['tokens_per_s']:.0f} tokens/s, "
                      f"{r['gflops']:.1f} GFLOP/s; step-0 loss {r['loss0']:.4f} "
                      f"(ln V {r['ln_V']:.4f})", flush=True)
                if a.json:
                    print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
