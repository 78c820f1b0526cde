#!/usr/bin/env bash
# check_tokenize.sh - scripts/tokenize.py end to end (opt-in: make check-hf, never make test).
#
# Trains a tiny BPE tokenizer with `tokenizers` (a Llama-style tokenizer_config.json naming
# <s> as bos_token), tokenises a text file and a JSONL file with a validation fraction and a
# small shard size, and checks every shard: the llm.c header (GPT-2 magic for this vocabulary),
# the token count, every document starting with the bos id, the documents' split, and the
# tokens decoding back to the text. Then a tokenizer of more than 65536 ids gives uint32
# (llama-3 header) shards, an eos-only tokenizer_config (GPT-2, Qwen2) delimits with eos,
# and, where a zr binary is built, zr trains 2 steps on the shards by pattern with the
# validation file.
#
# Usage: scripts/check_tokenize.sh [PYTHON] (default $PYTHON, else /tmp/hfvenv/bin/python;
#        it needs tokenizers and numpy). ZR=path/to/zr (default build/release/zr).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-${PYTHON:-/tmp/hfvenv/bin/python}}
ZR=${ZR:-build/release/zr}
if ! "$PY" -c 'import tokenizers, numpy' 2>/dev/null; then
    echo "check_tokenize: $PY lacks tokenizers/numpy (make check-hf installs them)" >&2
    exit 1
fi
work=$(mktemp -d /tmp/zr-check-tokenize-XXXXXX)
trap 'rm -rf "$work"' EXIT

"$PY" - "$work" <<'EOF'
import json, os, sys
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
work = sys.argv[1]
docs = [f"Document {i}: the quick brown fox {i * 7} jumps over the lazy dog number {i}."
        + " More words follow here." * (i % 5) for i in range(200)]
with open(f"{work}/a.txt", "w") as f:
    f.write("A plain text file is one document.\nIt has two lines.\n")
with open(f"{work}/b.jsonl", "w") as f:
    for d in docs:
        f.write(json.dumps({"text": d, "id": len(d)}) + "\n")
for name, special, cfg in (("llama", ["<s>", "</s>"], {"bos_token": "<s>", "eos_token": "</s>"}),
                           ("gpt2", ["<|endoftext|>"], {"bos_token": None,
                                                        "eos_token": "<|endoftext|>"})):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(docs, trainers.BpeTrainer(
        vocab_size=300, special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    os.makedirs(f"{work}/{name}")
    tok.save(f"{work}/{name}/tokenizer.json")
    with open(f"{work}/{name}/tokenizer_config.json", "w") as f:
        json.dump(cfg, f)
    if name == "llama":  # the same with > 65536 ids: uint32 shards
        tok.add_special_tokens([f"<extra_{i}>" for i in range(66000)])
        os.makedirs(f"{work}/wide")
        tok.save(f"{work}/wide/tokenizer.json")
        with open(f"{work}/wide/tokenizer_config.json", "w") as f:
            json.dump(cfg, f)
EOF

"$PY" scripts/tokenize.py --tokenizer "$work/llama" --out "$work/t" --val-fraction 0.1 \
    --shard-size 2000 "$work/a.txt" "$work/b.jsonl"
"$PY" scripts/tokenize.py --tokenizer "$work/wide" --out "$work/w" --val-docs 3 \
    "$work/b.jsonl"
"$PY" scripts/tokenize.py --tokenizer "$work/gpt2/tokenizer.json" --out "$work/g" \
    "$work/b.jsonl"
# a JSONL line without the field is an error naming the file and line
printf '{"text": "x"}\n{"body": "y"}\n' > "$work/bad.jsonl"
if "$PY" scripts/tokenize.py --tokenizer "$work/llama" --out "$work/bad" "$work/bad.jsonl" \
    2> "$work/err"; then
    echo "check_tokenize: a JSONL line without \"text\" was accepted" >&2
    exit 1
fi
grep -q 'bad.jsonl:2: no string field' "$work/err"

"$PY" - "$work" <<'EOF'
import glob, json, sys
import numpy as np
from tokenizers import Tokenizer
work = sys.argv[1]

def shards(pattern, magic, version, dtype):
    out = []
    for p in sorted(glob.glob(pattern)):
        raw = open(p, "rb").read()
        h = np.frombuffer(raw[:1024], dtype=np.int32)
        assert (h[0], h[1]) == (magic, version), (p, h[:3])
        toks = np.frombuffer(raw[1024:], dtype=dtype)
        assert h[2] == len(toks), (p, h[2], len(toks))
        out.append(toks)
    assert out, pattern
    return out

def split_docs(toks, delim):
    assert toks[0] == delim, "a shard stream must start with the delimiter"
    cuts = list(np.flatnonzero(toks == delim)) + [len(toks)]
    return [toks[a + 1:b] for a, b in zip(cuts, cuts[1:])]

docs = [open(f"{work}/a.txt").read()] + [json.loads(l)["text"] for l in open(f"{work}/b.jsonl")]
tok = Tokenizer.from_file(f"{work}/llama/tokenizer.json")
bos = tok.token_to_id("<s>")
tr = shards(f"{work}/t_train_*.bin", 20240520, 1, np.uint16)
va = shards(f"{work}/t_val_*.bin", 20240520, 1, np.uint16)
assert len(tr) > 1 and all(len(s) <= 2000 for s in tr), [len(s) for s in tr]
got_tr = split_docs(np.concatenate(tr), bos)
got_va = split_docs(np.concatenate(va), bos)
want_va = [d for i, d in enumerate(docs) if int((i + 1) * 0.1) > int(i * 0.1)]
want_tr = [d for i, d in enumerate(docs) if not int((i + 1) * 0.1) > int(i * 0.1)]
assert len(got_va) == len(want_va) == 20 and len(got_tr) == len(want_tr), (len(got_va), len(got_tr))
for got, want in zip(got_tr + got_va, want_tr + want_va):
    assert tok.decode(got.tolist(), skip_special_tokens=False) == want, (got[:10], want[:40])
wide = Tokenizer.from_file(f"{work}/wide/tokenizer.json")
w_tr = shards(f"{work}/w_train_*.bin", 20240801, 7, np.uint32)
w_va = shards(f"{work}/w_val_*.bin", 20240801, 7, np.uint32)
assert len(split_docs(np.concatenate(w_va), wide.token_to_id("<s>"))) == 3
assert len(split_docs(np.concatenate(w_tr), wide.token_to_id("<s>"))) == 197
g = Tokenizer.from_file(f"{work}/gpt2/tokenizer.json")
g_tr = shards(f"{work}/g_train_*.bin", 20240520, 1, np.uint16)
assert len(split_docs(np.concatenate(g_tr), g.token_to_id("<|endoftext|>"))) == 200
print(f"check_tokenize: {len(tr)} + {len(va)} GPT-2 shards ({len(got_tr)} + {len(got_va)} "
      f"documents, each decoded back), uint32 shards past 65536 ids, eos-delimited GPT-2: ok")
EOF

if [ -x "$ZR" ]; then
    "$ZR" train --layers 1 --channels 32 --heads 2 --seq-len 16 --micro-batch 2 --steps 2 \
        --val-every 2 --vocab-size 300 --steps_per_print 1000 --shuffle \
        --data "$work/t_train_*.bin" --val-data "$work/t_val_*.bin" > "$work/zr.out" 2>&1 ||
        { cat "$work/zr.out" >&2; exit 1; }
    grep -q 'done: 2 steps' "$work/zr.out" || { cat "$work/zr.out" >&2; exit 1; }
    echo "check_tokenize: zr trained 2 steps on the shards by pattern with the validation file"
else
    echo "check_tokenize: no $ZR: zr's own run skipped" >&2
fi
echo "check_tokenize: ok"
