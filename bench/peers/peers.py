#!/usr/bin/env python3
"""bench/peers/peers.py - zr ZeRO-3 against PyTorch FSDP2 and DeepSpeed ZeRO-3 on the CPU.

The same GPT (GPT-2 style: learned positional embeddings, LayerNorm, tanh GELU,
tied embeddings, biases; byte vocabulary V = 256, the one zr uses for text),
the same shape, micro-batch, optimizer (AdamW, lr 1e-3, betas 0.9/0.95,
eps 1e-8, weight decay 0.1 on matrices, gradient clipping 1.0), fp32 compute
and fp32 collectives, 2 ranks x 1 thread, trained by:

  zr        mpirun -np 2 zr bench train --modes config --config <zr.json>
            (zr's trainer, ZeRO-3, bf16.enabled false)
  fsdp      torch.distributed.fsdp.fully_shard per block and at the root,
            gloo, 2 processes (torch.multiprocessing), torch.set_num_threads(1)
  ds        deepspeed.initialize with zero_optimization.stage 3,
            DS_ACCELERATOR=cpu, gloo, 2 processes, 1 thread each

The reps are interleaved (zr, fsdp, ds, zr, fsdp, ds, ...), each a fresh
launch; a rep's tokens/s is global tokens per step (2 x B x T) over the median
step time after the warm-up steps (the slowest rank's time for the torch
systems, as zr's bench does). Reported: per system the median over reps and
the min/max, the ratios zr/FSDP2 and zr/DeepSpeed (medians; and per rep),
a markdown table, and with --json the whole record.

Install: pip install torch deepspeed   (see bench/peers/README.md)
"""
import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
V = 256  # zr's vocabulary for text (and for its bundled corpus)


# ---------------------------------------------------------------- the model


def build_model(torch, L, C, H, T):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(C)
            self.qkv = nn.Linear(C, 3 * C)
            self.proj = nn.Linear(C, C)
            self.ln2 = nn.LayerNorm(C)
            self.fc = nn.Linear(C, 4 * C)
            self.fc_proj = nn.Linear(4 * C, C)

        def forward(self, x):
            B_, T_, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q, k, v = (t.view(B_, T_, H, C // H).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).contiguous().view(B_, T_, C))
            return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, C)
            self.wpe = nn.Embedding(T, C)
            self.blocks = nn.ModuleList([Block() for _ in range(L)])
            self.ln_f = nn.LayerNorm(C)
            self.lm_head = nn.Linear(C, V, bias=False)
            self.lm_head.weight = self.wte.weight  # tied
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    std = 0.02 / (2 * L) ** 0.5 if name.endswith("proj.weight") else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, idx, targets):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for b in self.blocks:
                x = b(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, V), targets.reshape(-1))

    return GPT()


def adamw(torch, model, lr):
    """AdamW with weight decay on matrices only (as zr: biases and norms are not decayed)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


# ---------------------------------------------------------------- one torch worker


def worker(rank, system, a, port, out_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(a.ranks), LOCAL_WORLD_SIZE=str(a.ranks))
    import torch
    import torch.distributed as dist

    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    model = build_model(torch, a.layers, a.channels, a.heads, a.seq)
    nparams = sum(p.numel() for p in model.parameters())  # the tied matrix once
    if system == "fsdp":
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
        for b in model.blocks:
            fully_shard(b)
        fully_shard(model)
        opt = adamw(torch, model, 1e-3)

        def step(x, y):
            loss = model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
    else:
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
        cfg = {"train_micro_batch_size_per_gpu": a.micro_batch, "gradient_accumulation_steps": 1,
               "train_batch_size": a.micro_batch * a.ranks, "gradient_clipping": 1.0,
               "zero_optimization": {"stage": 3}, "bf16": {"enabled": False},
               "fp16": {"enabled": False}, "zero_allow_untested_optimizer": True,
               "communication_data_type": "fp32", "steps_per_print": 1 << 30,
               "wall_clock_breakdown": False}
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=adamw(torch, model, 1e-3),
                                               config=cfg)

        def step(x, y):
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            return loss

    stage = engine.zero_optimization_stage() if system == "ds" else 3
    g = torch.Generator().manual_seed(1000 + rank)
    times, losses = [], []
    for s in range(a.warmup + a.steps):
        data = torch.randint(0, V, (a.micro_batch, a.seq + 1), generator=g)
        dist.barrier()
        t0 = time.perf_counter()
        loss = step(data[:, :-1], data[:, 1:])
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
        if s >= a.warmup:
            times.append(dt.item())
            losses.append(loss.detach().item())
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"times": times, "loss": statistics.mean(losses), "params": nparams,
                       "backend": dist.get_backend(), "zero_stage": stage}, f)
    dist.barrier()
    dist.destroy_process_group()


def run_torch(system, a):
    """One launch of FSDP2 or DeepSpeed: 2 spawned processes; returns (tokens/s, info)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tempfile.mktemp(prefix=f"peers-{system}-", suffix=".json")
    mp.spawn(worker, args=(system, a, port, out), nprocs=a.ranks, join=True)
    with open(out) as f:
        r = json.load(f)
    os.unlink(out)
    med = statistics.median(r["times"])
    info = {"step_ms": 1e3 * med, "loss": r["loss"], "params": r["params"],
            "backend": r["backend"], "zero_stage": r["zero_stage"]}
    return a.ranks * a.micro_batch * a.seq / med, info


# ---------------------------------------------------------------- zr


def zr_config(a, path):
    cfg = {"train_micro_batch_size_per_gpu": a.micro_batch, "gradient_accumulation_steps": 1,
           "gradient_clipping": 1.0, "bf16": {"enabled": False},
           "communication_data_type": "fp32", "zero_optimization": {"stage": 3},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95],
                                                     "eps": 1e-8, "weight_decay": 0.1}},
           "zr": {"model": {"layers": a.layers, "channels": a.channels, "heads": a.heads,
                            "seq_len": a.seq, "max_seq_len": a.seq, "vocab_size": V}}}
    with open(path, "w") as f:
        json.dump(cfg, f)


def mpirun_cmd(a):
    return ["mpirun", "-np", str(a.ranks)] + a.mpirun_args.split()


def run_zr(a, cfg_path):
    """One launch of zr bench train (zr's trainer); tokens/s from its --json line."""
    # zr's bench runs steps + 1 steps, the first a warm-up; the rest of our warm-up rides in
    # the median (zr's bench takes the median over its steps, as here)
    # the shape flags too: the header's parameter count follows them, not the config file
    cmd = mpirun_cmd(a) + [a.zr, "bench", "train", "--modes", "config", "--config", cfg_path,
                           "--layers", str(a.layers), "--channels", str(a.channels),
                           "--heads", str(a.heads), "--seq", str(a.seq), "--micro-batch",
                           str(a.micro_batch), "--steps", str(a.steps), "--threads",
                           str(a.threads), "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    if p.returncode != 0:
        raise RuntimeError(f"zr failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}{p.stderr}")
    line = [ln for ln in p.stdout.splitlines() if ln.startswith('{"bench"')][-1]
    m = json.loads(line)["modes"]["config"]
    n = re.search(r"(\d+) parameters", p.stdout)
    return m["tokens_per_s"], {"step_ms": m["step_ms"], "loss": m["mean_loss"],
                               "params": int(n.group(1)) if n else None, "backend": "MPI",
                               "zero_stage": 3}


def zr_blas_core(a):
    """The OpenBLAS core zr chose (its ZR_DEBUG=info line), from a 1-step run."""
    env = dict(os.environ, ZR_DEBUG="info")
    cmd = mpirun_cmd(a)[:2] + ["1"] + a.mpirun_args.split() + [
        a.zr, "bench", "train", "--modes", "zero3_bf16", "--steps", "1", "--layers", "1",
        "--channels", "64", "--seq", "16"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, env=env)
    except subprocess.TimeoutExpired:
        return "unknown (timed out)"
    lines = [ln.strip() for ln in (p.stdout + p.stderr).splitlines()
             if re.search(r"openblas|blas", ln, re.I)]
    return lines[0] if lines else "unknown (no BLAS line at ZR_DEBUG=info)"


# ---------------------------------------------------------------- the driver


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                if ln.startswith("model name"):
                    return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def versions():
    v = {"python": platform.python_version()}
    for mod in ("torch", "deepspeed"):
        try:
            v[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001 - any import failure is reported, not fatal
            v[mod] = f"unavailable: {type(e).__name__}: {e}"
    return v


def spread(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "reps": xs}


def table(res):
    s = res["systems"]
    names = {"zr": "zr ZeRO-3", "fsdp": "PyTorch FSDP2", "ds": "DeepSpeed ZeRO-3"}
    out = ["| system | tokens/s median | min | max | step ms (median) | mean loss | zr / system "
           "(medians) | zr / system (best launches) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for k in ("zr", "fsdp", "ds"):
        if k not in s:
            continue
        t = s[k]["tokens_per_s"]
        r = res["ratios"].get(f"zr_over_{k}")
        ratio = "1 | 1" if k == "zr" else (f"**{r['median']:.2f}** | {r['best']:.2f}" if r
                                           else "- | -")
        out.append(f"| {names[k]} | {t['median']:.0f} | {t['min']:.0f} | {t['max']:.0f} | "
                   f"{statistics.median(s[k]['step_ms']):.0f} | {statistics.median(s[k]['loss']):.3f}"
                   f" | {ratio} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--systems", default="zr,fsdp,ds", help="comma list of zr, fsdp, ds")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8, help="timed steps per launch")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per torch launch")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--channels", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--zr", default=os.path.join(ROOT, "build/release/zr"))
    ap.add_argument("--mpirun-args", default="--bind-to none",
                    help="extra mpirun options for zr (default: unbound, as the torch processes)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", action="store_true", help="print the whole record as JSON last")
    ap.add_argument("--out", help="also write the JSON record to this file")
    a = ap.parse_args()
    systems = a.systems.split(",")
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.exit("peers.py: PyTorch is missing: pip install torch deepspeed "
                 "(see bench/peers/README.md)")
    if "zr" in systems and not os.access(a.zr, os.X_OK):
        sys.exit(f"peers.py: {a.zr} is not built: run make in {ROOT}")
    if "zr" in systems and shutil.which("mpirun") is None:
        sys.exit("peers.py: mpirun not found (zr needs MPI; . scripts/mpienv.sh)")
    if "ds" in systems:
        os.environ["DS_ACCELERATOR"] = "cpu"
        try:
            import deepspeed  # noqa: F401
        except Exception as e:  # noqa: BLE001
            print(f"peers.py: DeepSpeed unavailable, left out: {type(e).__name__}: {e}",
                  file=sys.stderr)
            systems.remove("ds")
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(a.threads))
    res = {"bench": "peers", "cpu": cpu_model(), "nproc": os.cpu_count(),
           "versions": versions(), "load_before": os.getloadavg(),
           "config": {k: getattr(a, k) for k in ("layers", "channels", "heads", "seq",
                                                 "micro_batch", "ranks", "threads", "steps",
                                                 "warmup", "reps", "mpirun_args")},
           "vocab": V, "precision": "fp32 compute and collectives", "systems": {},
           "errors": {}}
    res["config"]["tokens_per_step"] = a.ranks * a.micro_batch * a.seq
    if "zr" in systems:
        res["blas_core"] = zr_blas_core(a)
    tmp = tempfile.mkdtemp(prefix="peers-")
    cfg_path = os.path.join(tmp, "zr.json")
    zr_config(a, cfg_path)
    per = {k: {"tokens_per_s": [], "step_ms": [], "loss": []} for k in systems}
    for rep in range(a.reps):
        for k in systems:
            t0 = time.time()
            try:
                tok, info = run_zr(a, cfg_path) if k == "zr" else run_torch(k, a)
            except Exception as e:  # noqa: BLE001 - recorded, the others still run
                res["errors"].setdefault(k, []).append(f"{type(e).__name__}: {e}"[-2000:])
                print(f"rep {rep} {k}: FAILED {type(e).__name__}: {str(e)[-400:]}",
                      file=sys.stderr, flush=True)
                continue
            per[k]["tokens_per_s"].append(tok)
            per[k]["step_ms"].append(info["step_ms"])
            per[k]["loss"].append(info["loss"])
            res.setdefault("launch", {})[k] = {x: info[x] for x in ("params", "backend",
                                                                     "zero_stage")}
            print(f"rep {rep} {k:5s} {tok:8.0f} tokens/s  step {info['step_ms']:7.1f} ms  "
                  f"loss {info['loss']:.3f}  ({time.time() - t0:.0f} s with launch, "
                  f"load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    res["load_after"] = os.getloadavg()
    for k, r in per.items():
        if r["tokens_per_s"]:
            res["systems"][k] = dict(r, tokens_per_s=spread(r["tokens_per_s"]))
    res["ratios"] = {}
    z = per.get("zr", {}).get("tokens_per_s", [])
    for k in ("fsdp", "ds"):
        o = per.get(k, {}).get("tokens_per_s", [])
        if z and o:
            pairs = [x / y for x, y in zip(z, o)]  # same rep: launched back to back
            res["ratios"][f"zr_over_{k}"] = {
                "median": statistics.median(z) / statistics.median(o), "per_rep": pairs,
                "min": min(pairs), "max": max(pairs),
                # the best launch of each: the one the neighbours disturbed least
                "best": max(z) / max(o)}
    print(f"\nGPT L={a.layers} C={a.channels} T={a.seq} V={V}, micro-batch {a.micro_batch} x "
          f"{a.ranks} ranks x {a.threads} thread, fp32, AdamW; {a.reps} interleaved reps of "
          f"{a.steps} timed steps\nCPU: {res['cpu']}; torch {res['versions']['torch']}, "
          f"deepspeed {res['versions']['deepspeed']}\nzr BLAS: {res.get('blas_core', '-')}\n"
          f"load average before {res['load_before'][0]:.1f}, after {res['load_after'][0]:.1f}\n")
    for k, v in res.get("launch", {}).items():
        print(f"{k}: {v['params']} parameters, ZeRO stage {v['zero_stage']}, {v['backend']}")
    print()
    print(table(res))
    for k, r in res["ratios"].items():
        print(f"{k}: {r['median']:.2f} of the medians, {r['best']:.2f} of the best launches "
              f"(per rep {', '.join(f'{x:.2f}' for x in r['per_rep'])})")
    if a.json:
        print(json.dumps(res))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 1 if res["errors"] and not res["systems"] else 0


if __name__ == "__main__":
    sys.exit(main())
