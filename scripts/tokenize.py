#!/usr/bin/env python3
"""tokenize.py - text or JSONL into llm.c token shards with a model's own tokenizer.

Reads documents, tokenises them with the `tokenizers` library and the model's
tokenizer.json, and writes llm.c token shards (dev/data/data_common.py's
layout, which zr reads: a header of 256 int32 = magic, version, token count,
then the tokens):

  uint16 tokens, GPT-2 magic 20240520 version 1     when every id fits (vocabulary <= 65536)
  uint32 tokens, llama-3 magic 20240801 version 7   otherwise

Documents: a .jsonl file is one document per line (the string at --field,
default "text"; a line without it is an error naming the file and line); any
other file is one document, or one per non-empty line with --lines.

Between documents: every document starts with the family's delimiter token,
as llm.c's fineweb.py does (<|endoftext|> for GPT-2, <|begin_of_text|> for
llama-3): the tokenizer's bos_token where its tokenizer_config.json (or
config.json's bos_token_id) has one -- Llama 2/3, Mistral, SmolLM2 -- else its
eos_token -- GPT-2 ("<|endoftext|>" is both), Qwen2 (no bos). --delimiter
TOKEN picks another; the choice is printed.

Validation: --val-docs N sends the first N documents to the validation
shards; --val-fraction F sends a document there whenever the running count
floor((i + 1) F) steps (exactly F of them, spread over the input, decided
without knowing the total). Output: PREFIX_train_000000.bin, ... and
PREFIX_val_000000.bin, ..., each at most --shard-size tokens, written
atomically (a temporary file renamed).

Usage:
  scripts/tokenize.py --tokenizer DIR|tokenizer.json --out PREFIX [--field text]
                      [--lines] [--val-fraction F | --val-docs N]
                      [--shard-size TOKENS] [--delimiter TOKEN] FILE...
Needs: tokenizers, numpy.
"""
import os
import sys

# this file's name is the standard library's tokenize (imported by inspect, linecache): its own
# directory must not shadow it for the imports below
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

import argparse  # noqa: E402
import json  # noqa: E402

import numpy as np  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

GPT2_MAGIC, GPT2_VERSION = 20240520, 1
LLAMA3_MAGIC, LLAMA3_VERSION = 20240801, 7
HEADER_INTS = 256


def fail(msg):
    print(f"tokenize.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def token_text(v):
    """A tokenizer_config.json token entry: a string or {"content": ...}."""
    if isinstance(v, dict):
        return v.get("content")
    return v


def load_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: {e}")


def load_tokenizer(where):
    """The Tokenizer and the configs beside it (tokenizer_config.json, config.json)."""
    d = where if os.path.isdir(where) else os.path.dirname(where) or "."
    path = os.path.join(where, "tokenizer.json") if os.path.isdir(where) else where
    if not os.path.isfile(path):
        fail(f"{path}: no tokenizer.json (pass a Hugging Face folder or the file)")
    tok = Tokenizer.from_file(path)
    cfgs = [os.path.join(d, n) for n in ("tokenizer_config.json", "config.json")]
    tcfg, mcfg = [load_json(p) if os.path.isfile(p) else {} for p in cfgs]
    return tok, tcfg, mcfg


def pick_delimiter(tok, tcfg, mcfg, asked):
    """(token text, id, why): the family's document delimiter."""
    if asked is not None:
        tid = tok.token_to_id(asked)
        if tid is None:
            fail(f"--delimiter {asked!r} is not a token of this tokenizer")
        return asked, tid, "--delimiter"
    for key in ("bos_token", "eos_token"):
        text = token_text(tcfg.get(key))
        if text and tok.token_to_id(text) is not None:
            return text, tok.token_to_id(text), f"tokenizer_config.json's {key}"
        tid = mcfg.get(key + "_id")
        if isinstance(tid, list):
            tid = tid[0] if tid else None
        if isinstance(tid, int) and tok.id_to_token(tid) is not None:
            return tok.id_to_token(tid), tid, f"config.json's {key}_id"
    fail("the tokenizer names no bos_token or eos_token (tokenizer_config.json, config.json): "
         "pass --delimiter TOKEN")


def documents(paths, field, lines):
    """(source, text) for every document, in order."""
    for path in paths:
        try:
            f = open(path, encoding="utf-8")
        except OSError as e:
            fail(f"{path}: {e}")
        with f:
            if path.endswith(".jsonl"):
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        rec = json.loads(line)
                    except ValueError as e:
                        fail(f"{path}:{n}: not JSON: {e}")
                    if not isinstance(rec, dict) or not isinstance(rec.get(field), str):
                        fail(f"{path}:{n}: no string field {field!r} (--field)")
                    yield f"{path}:{n}", rec[field]
            elif lines:
                for n, line in enumerate(f, 1):
                    if line.strip():
                        yield f"{path}:{n}", line.rstrip("\n")
            else:
                yield path, f.read()


class ShardWriter:
    """Tokens into PREFIX_<split>_NNNNNN.bin shards of at most size tokens."""

    def __init__(self, prefix, split, size, dtype):
        self.prefix, self.split, self.size, self.dtype = prefix, split, size, dtype
        self.buf = np.empty(size, dtype=dtype)
        self.n = 0
        self.shards = []
        self.tokens = 0

    def add(self, ids):
        ids = np.asarray(ids, dtype=self.dtype)
        while len(ids) > 0:
            k = min(len(ids), self.size - self.n)
            self.buf[self.n:self.n + k] = ids[:k]
            self.n += k
            ids = ids[k:]
            if self.n == self.size:
                self.flush()

    def flush(self):
        if self.n == 0:
            return
        path = f"{self.prefix}_{self.split}_{len(self.shards):06d}.bin"
        header = np.zeros(HEADER_INTS, dtype=np.int32)
        wide = self.dtype == np.uint32
        header[0] = LLAMA3_MAGIC if wide else GPT2_MAGIC
        header[1] = LLAMA3_VERSION if wide else GPT2_VERSION
        header[2] = self.n
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(header.tobytes())
            f.write(self.buf[:self.n].tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self.shards.append(path)
        self.tokens += self.n
        self.n = 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", help="text or .jsonl files")
    ap.add_argument("--tokenizer", required=True, help="a Hugging Face folder or tokenizer.json")
    ap.add_argument("--out", required=True, help="output prefix: PREFIX_train_000000.bin ...")
    ap.add_argument("--field", default="text", help="the JSONL field holding the text")
    ap.add_argument("--lines", action="store_true", help="one document per non-empty line")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--val-fraction", type=float, default=0.0, help="fraction of documents")
    g.add_argument("--val-docs", type=int, default=0, help="the first N documents")
    ap.add_argument("--shard-size", type=int, default=100_000_000, help="tokens per shard")
    ap.add_argument("--delimiter", default=None, help="token starting each document")
    ap.add_argument("--batch", type=int, default=256, help="documents encoded at once")
    a = ap.parse_args()
    if not 0.0 <= a.val_fraction < 1.0:
        fail(f"--val-fraction {a.val_fraction} must be in [0, 1)")
    if a.val_docs < 0 or a.shard_size < 1 or a.shard_size > 2**31 - 1:
        fail("--val-docs must be >= 0 and --shard-size in [1, 2^31 - 1]")
    tok, tcfg, mcfg = load_tokenizer(a.tokenizer)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    dtype = np.uint16 if vocab <= 65536 else np.uint32
    text, delim, why = pick_delimiter(tok, tcfg, mcfg, a.delimiter)
    print(f"tokenize.py: vocabulary {vocab} -> {np.dtype(dtype).name} tokens "
          f"({'GPT-2' if dtype == np.uint16 else 'llama-3'} shard header); each document starts "
          f"with {text!r} (id {delim}, {why})", file=sys.stderr)
    out = {s: ShardWriter(a.out, s, a.shard_size, dtype) for s in ("train", "val")}
    docs = [0, 0]
    i = 0
    batch = []

    def encode(batch):
        for (split, _), enc in zip(batch, tok.encode_batch([t for _, t in batch],
                                                           add_special_tokens=False)):
            out[split].add([delim] + enc.ids)

    for src, doc in documents(a.files, a.field, a.lines):
        if a.val_docs:
            val = i < a.val_docs
        else:
            val = int((i + 1) * a.val_fraction) > int(i * a.val_fraction)
        docs[val] += 1
        i += 1
        batch.append(("val" if val else "train", doc))
        if len(batch) == a.batch:
            encode(batch)
            batch = []
    encode(batch)
    for w in out.values():
        w.flush()
    if not out["train"].shards:
        fail("no training documents")
    for s, k in (("train", 0), ("val", 1)):
        w = out[s]
        print(f"tokenize.py: {s}: {docs[k]} documents, {w.tokens} tokens in {len(w.shards)} "
              f"shard{'s' if len(w.shards) != 1 else ''}"
              + (f" ({w.shards[0]} ...)" if w.shards else ""), file=sys.stderr)
    print(f"tokenize.py: zr train --data '{a.out}_train_*.bin'"
          + (f" --val-data '{a.out}_val_*.bin'" if out["val"].shards else "")
          + f" --vocab-size {vocab} (or the model's own vocab_size with --init)", file=sys.stderr)


if __name__ == "__main__":
    main()
