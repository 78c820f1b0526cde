#!/usr/bin/env bash
# check_hf.sh - `make check-hf` (issue 43): zr against transformers, live. Opt-in, never part of
# `make test`: it needs torch and transformers, which it installs from PyPI into a local venv.
#
#   1. the reference data: scripts/hf_reference.py regenerates tests/data/hf into a temporary
#      folder, which must equal the committed one byte for byte (README.md aside)
#   2. the round trip for GPT-2: `zr train` a few steps from scratch on a tiny shape,
#      `zr export --hf` as f32 (one file), bf16 (sharded) and f16, then transformers'
#      AutoModelForCausalLM.from_pretrained loads each folder and its next-token
#      distributions and loss on fixed tokens are compared with zr's. zr's side comes from
#      `test_hf_write --gpt2-probs` on the same checkpoint exported as an llm.c file (zr's GPT-2
#      gives probabilities, not logits: log-probabilities are compared)
#   3. the Llama family's config.json and names: each reference folder of tests/data/hf read
#      into zr's units and written back by zr (`test_hf_write --llama-copy`, f32 and bf16);
#      transformers loads each and its logits on the reference tokens must equal the
#      reference's (f32: bit for bit; bf16: within the rounding of the weights)
#   4. the Llama round trip: each reference folder trained 5 steps by `zr train --init` on 2
#      ranks, exported with `zr export --hf`; transformers loads it (no key missing or
#      unexpected) and its logits on fixed tokens equal zr's on the same folder
#      (`test_hf_write --llama-logits`) within 1e-5 of the largest, and have moved from the
#      folder's it started from (the training is in the export)
#
# Python: ZR_HF_PYTHON (one that has torch, transformers, safetensors and tokenizers: no
# install), else build/hfvenv (made with python3 -m venv and pip on the first run, reused
# after). ZR_BUILD: the zr build to check (default build/release, built by make check-hf).
# Prints one line per check and a summary; exits non-zero when any check fails.
set -u
cd "$(dirname "$0")/.." || exit 1
BUILD=${ZR_BUILD:-build/release}
ZR=$BUILD/zr
PROBE=$BUILD/tests/test_hf_write

if [ -n "${ZR_HF_PYTHON:-}" ]; then
    PY=$ZR_HF_PYTHON
else
    PY=build/hfvenv/bin/python
    if ! "$PY" -c 'import torch, transformers, safetensors, tokenizers' 2>/dev/null; then
        echo "check-hf: making build/hfvenv (torch, transformers, safetensors, tokenizers)"
        if ! { python3 -m venv build/hfvenv &&
            build/hfvenv/bin/pip install -q --upgrade pip &&
            build/hfvenv/bin/pip install -q torch transformers safetensors tokenizers; }; then
            echo "check-hf: FAILED: cannot install the Python packages (ZR_HF_PYTHON=... to" \
                "use a Python that has them)"
            exit 1
        fi
    fi
fi
for f in "$ZR" "$PROBE"; do
    [ -x "$f" ] || { echo "check-hf: FAILED: no $f (make check-hf builds it)"; exit 1; }
done
if [ "$(id -u)" = 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export TRANSFORMERS_VERBOSITY=error HF_HUB_DISABLE_PROGRESS_BARS=1
work=$(mktemp -d /tmp/zr-check-hf-XXXXXX) || exit 1
failed=0
fail() {
    echo "check-hf: FAILED: $*"
    failed=1
}
versions=$("$PY" -c 'import torch, transformers; print(f"torch {torch.__version__}, transformers {transformers.__version__}")' 2>&1)
echo "check-hf: $PY ($versions)"

# ---- 1. the reference data ----------------------------------------------------------------
if "$PY" scripts/hf_reference.py --out "$work/ref" >"$work/ref.log" 2>&1; then
    if diff -r -q -x README.md tests/data/hf "$work/ref" >"$work/ref.diff" 2>&1; then
        echo "reference   tests/data/hf regenerated: byte-identical ($(find "$work/ref" -type f | wc -l) files)"
    else
        fail "tests/data/hf differs from what scripts/hf_reference.py writes now" \
            "(tests/data/hf/README.md names the versions it was made with):"
        cat "$work/ref.diff"
    fi
else
    fail "scripts/hf_reference.py:"
    tail -20 "$work/ref.log"
fi

# ---- 2. GPT-2: zr train -> zr export --hf -> transformers ----------------------------------
run() {
    echo "+ $*" >>"$work/zr.log"
    "$@" >>"$work/zr.log" 2>&1 || {
        fail "$* (exit $?):"
        tail -20 "$work/zr.log"
        return 1
    }
}
shape="--layers 2 --channels 64 --heads 4 --seq-len 32 --micro-batch 2 --val-every 0"
# shellcheck disable=SC2086 # the shape is words
if run timeout -k 5 300 mpirun.openmpi -np 2 "$ZR" train $shape --steps 8 --warmup 2 \
    --lr 1e-2 --steps_per_print 1000 --ckpt-dir "$work/ck" &&
    run "$ZR" export --checkpoint "$work/ck" --llmc "$work/m.bin" --hf "$work/hf_f32" &&
    run "$ZR" export --checkpoint "$work/ck" --hf "$work/hf_bf16" --dtype bf16 \
        --max-shard-size 100KB &&
    run "$ZR" export --checkpoint "$work/ck" --hf "$work/hf_f16" --dtype f16 &&
    run "$PROBE" --gpt2-probs "$work/m.bin" "$work/zr_probs.f32"; then
    echo "zr          trained 8 steps on 2 ranks, exported f32, bf16 ($(find "$work/hf_bf16" -name 'model-*-of-*' | wc -l) shards) and f16"
    "$PY" - "$work" <<'EOF' || failed=1
import math, os, sys
import numpy as np
import torch
from transformers import AutoModelForCausalLM

work = sys.argv[1]
B, T = 2, 16
torch.set_num_threads(1)
model = AutoModelForCausalLM.from_pretrained(os.path.join(work, "hf_f32"))
V = model.config.vocab_size
ids = [[((b * (T + 1) + t) * 7919 + 13) % V for t in range(T + 1)] for b in range(B)]
ids = torch.tensor(ids)
zr = np.fromfile(os.path.join(work, "zr_probs.f32"), dtype=np.float32)
zr_probs, zr_loss = torch.from_numpy(zr[:-1].reshape(B, T, V).copy()).double(), float(zr[-1])
zr_logp = torch.log(zr_probs)
bad = 0
# (folder, bound on |log p| difference, bound on the loss's relative difference)
for name, lp_tol, loss_tol in (("hf_f32", 1e-4, 1e-5), ("hf_bf16", 0.1, 2e-2),
                               ("hf_f16", 5e-3, 2e-3)):
    m, info = AutoModelForCausalLM.from_pretrained(os.path.join(work, name), dtype=torch.float32,
                                                   output_loading_info=True)
    m.eval()
    keys = {k: list(v) for k, v in info.items() if k != "error_msgs" and len(v) > 0}
    with torch.no_grad():
        out = m(ids[:, :T], labels=None)
    logp = torch.log_softmax(out.logits.double(), dim=-1)
    loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, V).float(),
                                             ids[:, 1:].reshape(-1)).item()
    dlp = (logp - zr_logp).abs().max().item()
    dloss = abs(loss - zr_loss) / abs(zr_loss)
    ok = dlp <= lp_tol and dloss <= loss_tol and not keys
    bad += not ok
    print(f"{'transformers' if ok else 'FAILED':11s} {name:8s} {type(m).__name__}: "
          f"max |log p - zr's| {dlp:.2e} (bound {lp_tol:g}), loss {loss:.7f} vs zr's "
          f"{zr_loss:.7f}: relative {dloss:.2e} (bound {loss_tol:g}){keys or ''}")
sys.exit(1 if bad else 0)
EOF
fi

# ---- 3. the Llama family: HF folder -> zr's units -> zr's folder -> transformers ------------
for name in llama_gqa llama_mha_tied qwen2; do
    for dt in f32 bf16; do
        run "$PROBE" --llama-copy "tests/data/hf/$name" "$work/${name}_$dt" "$dt" || continue
        "$PY" - "$work/${name}_$dt" "tests/data/hf/$name" "$dt" <<'EOF' || failed=1
import json, os, sys
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

out, ref, dt = sys.argv[1:4]
torch.set_num_threads(1)
r = json.load(open(os.path.join(ref, "reference.json")))
want = load_file(os.path.join(ref, "reference.safetensors"))["logits"].double()
m, info = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                               attn_implementation="eager",
                                               output_loading_info=True)
m.eval()
keys = {k: list(v) for k, v in info.items() if k != "error_msgs" and len(v) > 0}
ids = torch.tensor(r["tokens"])[:, :r["T"]]
with torch.no_grad():
    got = m(ids).logits.double()
e = ((got - want).abs().max() / want.abs().max()).item()
bound = 0.0 if dt == "f32" else 0.05
ok = e <= bound and not keys
print(f"{'transformers' if ok else 'FAILED':11s} {os.path.basename(out):20s} "
      f"{type(m).__name__}: max |logits - reference| / max |reference| {e:.2e} (bound {bound:g})"
      f"{keys or ''}")
sys.exit(0 if ok else 1)
EOF
    done
done

# ---- 4. the round trip: HF folder -> zr train --init (2 ranks) -> zr export --hf -> transformers
for name in llama_gqa llama_mha_tied qwen2; do
    V=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "tests/data/hf/$name/config.json")
    run timeout -k 5 300 mpirun.openmpi -np 2 "$ZR" train --init "tests/data/hf/$name" \
        --vocab-size "$V" --seq-len 16 --micro-batch 2 --val-every 0 --steps 5 --warmup 2 \
        --steps_per_print 1000 --ckpt-dir "$work/ft_$name" &&
        run "$ZR" export --checkpoint "$work/ft_$name" --hf "$work/ft_${name}_hf" &&
        run "$PROBE" --llama-logits "$work/ft_${name}_hf" "$work/ft_${name}.f32" || {
        failed=1
        continue
    }
    "$PY" - "$work/ft_${name}_hf" "$work/ft_${name}.f32" "tests/data/hf/$name" <<'EOF' || failed=1
import os, sys
import numpy as np
import torch
from transformers import AutoModelForCausalLM

out, zr_file, ref = sys.argv[1:4]
B, T = 2, 16
torch.set_num_threads(1)
m, info = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                               attn_implementation="eager",
                                               output_loading_info=True)
base = AutoModelForCausalLM.from_pretrained(ref, dtype=torch.float32, attn_implementation="eager")
m.eval(), base.eval()
keys = {k: list(v) for k, v in info.items() if k != "error_msgs" and len(v) > 0}
V = m.config.vocab_size
ids = torch.tensor([[((b * (T + 1) + t) * 7919 + 13) % V for t in range(T)] for b in range(B)])
with torch.no_grad():
    got, before = m(ids).logits.double(), base(ids).logits.double()
zr = torch.from_numpy(np.fromfile(zr_file, dtype=np.float32).reshape(B, T, V).copy()).double()
e = ((got - zr).abs().max() / zr.abs().max()).item()
moved = ((got - before).abs().max() / before.abs().max()).item()
ok = e <= 1e-5 and moved > 1e-3 and not keys
print(f"{'round trip' if ok else 'FAILED':11s} {os.path.basename(ref):14s} {type(m).__name__}: "
      f"trained 5 steps on 2 ranks, exported, loaded: max |logits - zr's| / max {e:.2e} "
      f"(bound 1e-05); moved {moved:.2e} from the folder it started from{keys or ''}")
sys.exit(0 if ok else 1)
EOF
done

if [ "$failed" = 0 ]; then
    echo "check-hf: ok"
    rm -rf "$work"
else
    echo "check-hf: FAILED (files kept in $work)"
fi
exit "$failed"
