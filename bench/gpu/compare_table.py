#!/usr/bin/env python3
"""compare_table.py - the side-by-side table of scripts/gpu_remote.sh's compare stage.

Reads what the stage printed (compare.txt: for each zr build a "-- PATH" line, then
zr bench model / quant --device cuda --json; then bench/gpu/torch_gpt2.py --json) and
prints, for zr old, zr new, PyTorch eager and PyTorch compiled: ms/step, tokens/s,
the speed against PyTorch compiled, flops_vs_gemm (PyTorch's TFLOP/s over zr's bf16
GEMM rate measured in the same call: the two count FLOPs alike), and with a profile
(scripts/ncu_steps.py's table of the new build) attention's GPU ms a step (kernels
att_* and flash_*) and the rest. Then zr's phases, old and new, next to the roofline
of the new build (zr bench model's roofline_ms, where it prints them), and the
codecs' ratios to the device copy, old and new.

    python3 bench/gpu/compare_table.py compare.txt [--profile profile.txt]

A build that did not run (no "-- PATH" block, or no JSON in it) is a row of "-".
"""
import argparse
import json
import re
import sys

PHASES = ["fwd_embed", "fwd_blocks", "fwd_head", "bwd_head", "bwd_blocks", "bwd_embed", "optim"]


def read_compare(path):
    """{'new': model, 'old': model, 'quant_new', 'quant_old', 'eager', 'compile'} from the log."""
    out, side = {}, None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if line.startswith("-- "):
                side = "old" if ("/old/" in line or "zr-old" in line) else "new"
                continue
            if not line.startswith("{"):
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue
            b = d.get("bench")
            if b == "model" and side:
                out[side] = d
            elif b == "quant" and side:
                out["quant_" + side] = d
            elif b == "torch_gpt2":
                out[d.get("mode", "?")] = d
    return out


def read_profile(path):
    """(attention ms, all kernels' ms) a step from scripts/ncu_steps.py's table."""
    att, total = 0.0, None
    row = re.compile(r"^(.*?)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%$")
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.search(r"kernels' GPU time ([\d.]+) ms a step", line)
            if m:
                total = float(m.group(1))
                continue
            m = row.match(line.rstrip())
            if m and re.match(r"(att_|flash_)", m.group(1).strip()):
                att += float(m.group(3))
    return att, total


def fmt(v, spec, suffix=""):
    """v in spec ("9.2f"), "-" in its width when there is none."""
    width = int(re.match(r"\d*", spec).group(0) or 0)
    return ("-" if v is None else format(v, spec.lstrip("0123456789")) + suffix).rjust(width)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("compare")
    ap.add_argument("--profile")
    a = ap.parse_args()
    r = read_compare(a.compare)
    new = r.get("new")
    gemm = new.get("gemm_tflops") if new else None
    best = r.get("compile") or r.get("eager")
    att = None
    if a.profile:
        try:
            att = read_profile(a.profile)
        except OSError as e:
            print(f"compare_table: {e}", file=sys.stderr)
    shape = next((d for d in (new, r.get("old"), best) if d), None)
    if shape is None:
        print("compare_table: no zr or PyTorch JSON line in", a.compare)
        return 1
    gpu = (new or r.get("old") or {}).get("device") or shape.get("gpu", "?")
    model = "GPT-2 124M" if (new or shape).get("config", "124M") == "124M" else "GPT (--quick)"
    print(f"\nside by side: {gpu}, {model}, B {shape['B']} x T {shape['T']}, bf16"
          + (f", zr's bf16 GEMM {gemm:.1f} TFLOP/s" if gemm else ""))
    print(f"{'':18} {'B':>3} {'ms/step':>9} {'tokens/s':>10} {'vs compiled':>11} "
          f"{'flops_vs_gemm':>13} {'attention ms':>12} {'other ms':>9}")
    rows = [("zr old", r.get("old")), ("zr new", new), ("PyTorch eager", r.get("eager")),
            ("PyTorch compiled", r.get("compile"))]
    for name, d in rows:
        ms = d.get("ms_per_step") if d else None
        tok = d.get("tokens_per_s") if d else None
        # tokens/s, not ms: the builds may have run at different micro-batches
        vs = tok / best["tokens_per_s"] if (d and best) else None
        fvg = d.get("flops_vs_gemm") if d else None
        if d and fvg is None and gemm and d.get("tflops"):
            fvg = d["tflops"] / gemm
        a_ms = o_ms = None
        if name == "zr new" and att and d:
            a_ms = att[0]
            o_ms = (att[1] if att[1] is not None else ms) - a_ms
        print(f"{name:18} {fmt(d.get('B') if d else None, '3d')} {fmt(ms, '9.2f')} "
              f"{fmt(tok, '10.0f')} {fmt(vs, '11.2f', 'x')} "
              f"{fmt(fvg, '13.3f')} {fmt(a_ms, '12.1f')} {fmt(o_ms, '9.1f')}")
    if new or r.get("old"):
        roof = (new or {}).get("roofline_ms", {})
        bo, bn = (r.get("old") or {}).get("B", "-"), (new or {}).get("B", "-")
        print(f"\nzr's phases (ms a step, B {bo} old, {bn} new) {'zr old':>9} {'zr new':>9} "
              f"{'roofline':>9} {'new/roofline':>12}")
        for p in PHASES + ["step"]:
            get = (lambda d: d.get("ms_per_step")) if p == "step" else \
                (lambda d, p=p: d.get("phases_ms", {}).get(p))
            o = get(r["old"]) if r.get("old") else None
            n = get(new) if new else None
            rf = (new or {}).get("roofline_step_ms") if p == "step" else roof.get(p)
            ratio = n / rf if (n is not None and rf) else None
            print(f"{p:27} {fmt(o, '9.3f')} {fmt(n, '9.3f')} {fmt(rf, '9.3f')} "
                  f"{fmt(ratio, '12.1f', 'x')}")
    qn, qo = r.get("quant_new"), r.get("quant_old")
    if qn or qo:
        print(f"\ncodecs (x the device copy){'':4} {'zr old':>7} {'zr new':>7}")
        ops = [x["op"] for x in (qn or qo)["results"]]
        for op in ops:
            v = [next((x["ratio"] for x in q["results"] if x["op"] == op), None) if q else None
                 for q in (qo, qn)]
            print(f"{op:30} {fmt(v[0], '7.2f')} {fmt(v[1], '7.2f')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
