#!/usr/bin/env python3
"""hf_reference.py - reference data for the Llama family and GPT-2 from transformers (issue 43).

Builds small random models with a fixed seed, saves each as a Hugging Face
folder (config.json + model.safetensors, fp32) under tests/data/hf/<name>/,
and records beside it what zr must reproduce, all computed in fp32 with the
eager attention:

  reference.json          the tokens (B rows of T + 1: inputs are the first T,
                          targets the last T), the mean cross-entropy loss, the
                          logits' fp64 sum and sum of squares, each parameter's
                          gradient norm (fp64 over the fp32 gradient), and the
                          losses of 10 torch.optim.AdamW steps on that batch
                          (hyper-parameters in the file)
  reference.safetensors   the logits [B, T, V], and (Llama models) layer 0's
                          intermediate values and their gradients (names
                          below), so that each operator can be checked alone

Layer 0's tensors ("l0." + name, [B, T, width] unless said):
  x          the layer's input (token embeddings)       dx: its gradient
  ln1        input_layernorm(x)                         ln1_w: the weight [C]
  q, k, v    the projections (bias included)            dq, dk, dv: gradients
  cos, sin   the rotary tables [T, head_dim]
  q_rot, k_rot  q and k with the rotary embedding, [B, T, heads * head_dim]
  att        attention's output (o_proj's input)        datt: its gradient
  h1         x + o_proj(att)                            dh1: its gradient
  ln2        post_attention_layernorm(h1)               ln2_w, dln2_w (weight, its grad)
  gate, up   the MLP's projections                      dgate, dup: gradients
  act        silu(gate) * up (down_proj's input)        dact: its gradient
  h2         the layer's output                         dh2: its gradient

Usage: scripts/hf_reference.py [--out tests/data/hf] (needs torch, transformers,
safetensors; fp32 on the CPU, deterministic).
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                          LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM)
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

B, T = 2, 16
ADAMW = {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
STEPS = 10


def models():
    """name -> (config class, model class, seed, config keywords)."""
    common = dict(num_hidden_layers=2, hidden_act="silu", max_position_embeddings=256,
                  initializer_range=0.02, torch_dtype="float32", use_cache=False)
    return {
        # GQA 4:1, untied, llama3 rope scaling on (original_max_position_embeddings small
        # enough that head_dim 8's four frequencies fall in all three of its bands)
        "llama_gqa": (LlamaConfig, LlamaForCausalLM, 4301, dict(
            common, vocab_size=256, hidden_size=64, intermediate_size=136,
            num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False,
            rms_norm_eps=1e-5, rope_scaling={
                "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64})),
        # MHA (kv heads = heads), tied embeddings, head_dim given (24, not hidden / heads)
        "llama_mha_tied": (LlamaConfig, LlamaForCausalLM, 4302, dict(
            common, vocab_size=320, hidden_size=64, intermediate_size=96,
            num_attention_heads=4, num_key_value_heads=4, head_dim=24,
            tie_word_embeddings=True, rms_norm_eps=1e-6,
            rope_scaling={"rope_type": "default", "rope_theta": 500000.0})),
        # Qwen2: q/k/v biases, GQA 2:1, tied
        "qwen2": (Qwen2Config, Qwen2ForCausalLM, 4303, dict(
            common, vocab_size=384, hidden_size=64, intermediate_size=176,
            num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
            rms_norm_eps=1e-6, use_sliding_window=False,
            rope_scaling={"rope_type": "default", "rope_theta": 1000000.0})),
        # GPT-2 (Conv1D weights stored [in, out], tied head, learned positions); dropout off,
        # as zr trains without it; token ids inside the small vocabulary
        "gpt2": (GPT2Config, GPT2LMHeadModel, 4304, dict(
            vocab_size=320, n_embd=64, n_layer=2, n_head=4, n_positions=64,
            activation_function="gelu_new", layer_norm_epsilon=1e-5, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
            initializer_range=0.02, use_cache=False)),
    }


def randomize(model, seed):
    """Weights whose effects are visible, as N(mean, variance): matrices
    N(0, 1/fan_in), embeddings N(0, 1/hidden) (logits of order 1, tied or not),
    norm weights 1 + N(0, 0.01), biases N(0, 0.01) (transformers' ones and
    zeros would hide mistakes). GPT-2's Conv1D weights are [in, out]: fan_in
    is their first size; its LayerNorms are ln_1, ln_2, ln_f."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                norm = name.endswith("norm.weight") or (".ln_" in name and name.endswith(".weight"))
                base = 1.0 if norm else 0.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
            elif name.startswith("transformer.h."):
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[0]))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))


def legacy_rope(path):
    """Write the rope keys as most folders in the wild have them (transformers < 5:
    rope_theta at the top, rope_scaling null), so that both forms are covered."""
    with open(path) as f:
        cfg = json.load(f)
    rp = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rp["rope_theta"]
    cfg["rope_scaling"] = None
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def reload_check(d, inputs, logits):
    """The folder as transformers loads it gives the same logits, bit for bit."""
    model = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager",
                                                 dtype=torch.float32)
    with torch.no_grad():
        again = model(input_ids=inputs).logits
    if not torch.equal(again, logits):
        raise SystemExit(f"{d}: reloaded model's logits differ by "
                         f"{(again - logits).abs().max().item():.3g}")


def loss_of(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def layer0_dump(model, inputs):
    """Layer 0's intermediate values and gradients (see the module docstring)."""
    layer = model.model.layers[0]
    saved = {}

    def keep(name, t):
        t.retain_grad()
        saved[name] = t

    hooks = [
        layer.register_forward_pre_hook(lambda m, a: keep("x", a[0])),
        layer.input_layernorm.register_forward_hook(lambda m, a, o: keep("ln1", o)),
        layer.self_attn.q_proj.register_forward_hook(lambda m, a, o: keep("q", o)),
        layer.self_attn.k_proj.register_forward_hook(lambda m, a, o: keep("k", o)),
        layer.self_attn.v_proj.register_forward_hook(lambda m, a, o: keep("v", o)),
        layer.self_attn.o_proj.register_forward_pre_hook(lambda m, a: keep("att", a[0])),
        layer.post_attention_layernorm.register_forward_pre_hook(lambda m, a: keep("h1", a[0])),
        layer.post_attention_layernorm.register_forward_hook(lambda m, a, o: keep("ln2", o)),
        layer.mlp.gate_proj.register_forward_hook(lambda m, a, o: keep("gate", o)),
        layer.mlp.up_proj.register_forward_hook(lambda m, a, o: keep("up", o)),
        layer.mlp.down_proj.register_forward_pre_hook(lambda m, a: keep("act", a[0])),
        layer.register_forward_hook(
            lambda m, a, o: keep("h2", o[0] if isinstance(o, tuple) else o)),
    ]
    logits = model(input_ids=inputs).logits
    for h in hooks:
        h.remove()
    return logits, saved


def rotary(model, saved):
    """q and k with the rotary embedding, by transformers' own functions."""
    cfg = model.config
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    pos = torch.arange(T)[None, :]
    cos, sin = model.model.rotary_emb(saved["x"], pos)
    q = saved["q"].detach().view(B, T, -1, hd).transpose(1, 2)
    k = saved["k"].detach().view(B, T, -1, hd).transpose(1, 2)
    qr, kr = apply_rotary_pos_emb(q, k, cos, sin)
    flat = lambda t: t.transpose(1, 2).reshape(B, T, -1).contiguous()
    return cos[0].contiguous(), sin[0].contiguous(), flat(qr), flat(kr)


def build(name, cfg_cls, model_cls, seed, kw, out, dump_layer0):
    torch.manual_seed(seed)
    rope = kw.pop("rope_scaling", None)
    cfg = cfg_cls(**kw, attn_implementation="eager")
    # transformers >= 5 keeps theta and scaling in rope_parameters; older ones in
    # rope_theta + rope_scaling. Set whichever this version has.
    if rope is None:
        pass
    elif hasattr(cfg, "rope_parameters"):
        cfg.rope_parameters = dict(rope)
    else:
        cfg.rope_theta = rope["rope_theta"]
        cfg.rope_scaling = None if rope["rope_type"] == "default" else {
            k: v for k, v in rope.items() if k != "rope_theta"}
    model = model_cls(cfg).float()
    randomize(model, seed)
    model.train()  # no dropout in these families; train() for the optimizer steps
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    if rope is not None and rope["rope_type"] == "default":
        legacy_rope(os.path.join(d, "config.json"))

    g = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=g)
    inputs, targets = tokens[:, :T], tokens[:, 1:]

    gpt2 = rope is None
    logits, saved = (model(input_ids=inputs).logits, {}) if gpt2 else layer0_dump(model, inputs)
    reload_check(d, inputs, logits.detach())
    loss = loss_of(logits, targets)
    loss.backward()
    grad_norms = {n: math.sqrt(p.grad.double().pow(2).sum().item())
                  for n, p in model.named_parameters()}
    tensors = {"logits": logits.detach().contiguous()}
    if dump_layer0:
        cos, sin, q_rot, k_rot = rotary(model, saved)
        layer = model.model.layers[0]
        tensors.update({
            "l0.cos": cos, "l0.sin": sin, "l0.q_rot": q_rot, "l0.k_rot": k_rot,
            "l0.ln1_w": layer.input_layernorm.weight.detach().clone(),
            "l0.ln2_w": layer.post_attention_layernorm.weight.detach().clone(),
            "l0.dln2_w": layer.post_attention_layernorm.weight.grad.detach().clone()})
    for key, t in (saved if dump_layer0 else {}).items():
        tensors["l0." + key] = t.detach().contiguous()
        if key in ("x", "q", "k", "v", "att", "h1", "ln2", "gate", "up", "act", "h2"):
            tensors["l0.d" + key] = t.grad.detach().contiguous()
    save_file({k: v.float().contiguous() for k, v in tensors.items()},
              os.path.join(d, "reference.safetensors"))
    lg = logits.detach().double()
    ref = {
        "generator": "scripts/hf_reference.py",
        "transformers": transformers.__version__, "torch": torch.__version__,
        "architecture": type(model).__name__, "seed": seed, "B": B, "T": T,
        "tokens": tokens.tolist(),
        "loss": loss.item(),
        "logits_shape": list(logits.shape),
        "logits_sum": lg.sum().item(), "logits_sumsq": lg.pow(2).sum().item(),
        "grad_norms": grad_norms,
    }

    # AdamW on the same batch, fresh from the saved weights: decay on tensors of
    # two or more dimensions (matrices, embeddings), none on norms and biases
    model.zero_grad(set_to_none=True)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": ADAMW["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=ADAMW["lr"], betas=tuple(ADAMW["betas"]), eps=ADAMW["eps"],
                            foreach=False, fused=False)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        step_loss = loss_of(model(input_ids=inputs).logits, targets)
        step_loss.backward()
        losses.append(step_loss.item())
        opt.step()
    ref["adamw"] = dict(ADAMW, steps=STEPS, decay="tensors with dim >= 2 only",
                        note="losses[i] is the loss before step i+1, on the same batch")
    ref["adamw_losses"] = losses
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    print(f"{name}: loss {loss.item():.6f}, after {STEPS} AdamW steps "
          f"{losses[-1]:.6f}, {size / 1024:.0f} KiB in {d}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests",
                                                  "data", "hf"))
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    for name, (cfg_cls, model_cls, seed, kw) in models().items():
        # layer 0's values for the Llama models only (Qwen2's differ by biases, which
        # the operators do not see): each folder stays well under 1 MB
        build(name, cfg_cls, model_cls, seed, dict(kw), args.out, name.startswith("llama"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
