/*
 * zr/llama.h - the Llama family (LlamaForCausalLM, MistralForCausalLM,
 * Qwen2ForCausalLM) on the CPU in fp32, cut into units the ZeRO engine can
 * gather and free one at a time as it does GPT-2's (zr/model.h), read from
 * a Hugging Face folder (issue 43).
 *
 * Units, each a flat fp32 buffer the caller owns, tensors named as in
 * Hugging Face's files:
 *     unit 0       model.embed_tokens.weight [V, C]
 *     unit 1..L    model.layers.{l}.input_layernorm.weight, self_attn.{q,k,v,o}_proj
 *                  (weights [out, in]; biases where the family has them: Qwen2's
 *                  q/k/v, Llama's attention_bias / mlp_bias),
 *                  post_attention_layernorm.weight, mlp.{gate,up,down}_proj
 *     unit L + 1   model.norm.weight, lm_head.weight [V, C] (untied only: a
 *                  tied head reads, and accumulates into, unit 0's embedding)
 * Weight decay (zr_tensor_desc.decay) on the tensors of two dimensions, as
 * transformers' recipes and scripts/hf_reference.py apply it.
 *
 * A zr_llama owns the activations of one B x T micro-batch for every layer
 * (no recomputation yet), never parameters. Calls come in order:
 *     forward_begin, forward_unit 0 .. L+1, [backward_begin,
 *     backward_unit L+1 .. 0]
 * A forward without targets leaves the logits (zr_llama_logits); with
 * targets, the loss (transformers' mean cross-entropy) and the way to the
 * backward. Every loop runs on zr's pool (zr_gpt_set_threads) as GPT-2's
 * do: the thread count changes no bit.
 */
#ifndef ZR_LLAMA_H
#define ZR_LLAMA_H

#include "zr/base.h"
#include "zr/model.h" /* zr_tensor_desc */

#include <stddef.h>

/* zr_llama_config: in zr/model.h (zr_gpt_config carries it). */

/* Tensors per layer unit at most (2 norms, 7 weights, 7 biases). */
#define ZR_LLAMA_MAX_UNIT_TENSORS 16

/*
 * Unit u's tensors from the configuration alone (no model): out holds
 * ZR_LLAMA_MAX_UNIT_TENSORS; returns the count. Names are static: a layer's
 * without its "model.layers.{l}." prefix (zr_llama_config_hf_name adds it).
 */
int zr_llama_config_unit_tensors(const zr_llama_config *cfg, int u, zr_tensor_desc *out);
size_t zr_llama_config_unit_numel(const zr_llama_config *cfg, int u);
/* Tensor d of unit u by its Hugging Face name ("model.layers.3.mlp.up_proj.weight"). */
void zr_llama_config_hf_name(const zr_llama_config *cfg, int u, const zr_tensor_desc *d, char *out,
                             size_t n);
/* zr_llama_activation_bytes of a model of cfg for B x T, before any exists. */
size_t zr_llama_config_activation_bytes(const zr_llama_config *cfg, int B, int T);

/*
 * The configuration of a Hugging Face folder (or its config.json): the
 * Llama family only (GPT-2's folder is refused here, naming it).
 */
zr_status zr_llama_config_read(zr_llama_config *cfg, const char *path);
/* Shapes positive, heads % kv_heads == 0, head_dim even and <= 256; names the bad field. */
zr_status zr_llama_config_check(const zr_llama_config *cfg);

typedef struct zr_llama_layer_acts {
    float *ln1, *rstd1;     /* [N, C], [N] */
    float *q, *k, *v;       /* [N, NH hd], [N, NKV hd] x 2; q and k rotated */
    float *att, *lse;       /* [N, NH hd], [B, NH, T] */
    float *res2;            /* [N, C] after the attention's residual add */
    float *ln2, *rstd2;     /* [N, C], [N] */
    float *gate, *up, *act; /* [N, IC] */
    float *res3;            /* [N, C] the layer's output */
} zr_llama_layer_acts;

/* Fields are read-only for callers; use the functions below. Products in fp32. */
typedef struct zr_llama {
    zr_llama_config cfg;
    int B, T;
    int units;
    zr_tensor_desc *desc; /* [units][ZR_LLAMA_MAX_UNIT_TENSORS] */
    int *ndesc;           /* [units] */
    size_t *numel;        /* [units] */
    char *names;          /* the descriptions' names */
    int *inputs, *targets;
    int has_targets;
    float *cosines, *sines; /* [T, hd / 2] */
    float *encoded;         /* [N, C] */
    zr_llama_layer_acts *layers;
    float *lnf, *rstdf;
    float *probs; /* [N, V]: logits, then probabilities, then dlogits */
    float *losses;
    float loss;
    float *dres, *dln, *tmp, *dq, *dk, *dv, *datt, *dgate, *dup, *dact, *att_delta;
    float *zeros; /* [C]: the residual adds' bias */
    int fwd_next, bwd_next;
    float *arena; /* owns every buffer above */
    size_t arena_floats;
} zr_llama;

/* Activations for B x T; sliding windows shorter than T refused. Free with zr_llama_free. */
zr_status zr_llama_init(zr_llama *m, const zr_llama_config *cfg, int B, int T);
void zr_llama_free(zr_llama *m);
size_t zr_llama_activation_bytes(const zr_llama *m);

int zr_llama_unit_count(const zr_llama *m);
size_t zr_llama_unit_numel(const zr_llama *m, int u);
/* Descriptions owned by m (valid until zr_llama_free); returns the count. */
int zr_llama_unit_tensors(const zr_llama *m, int u, const zr_tensor_desc **out);

/*
 * Unit u's parameters from the folder's model.safetensors or its shards
 * (model.safetensors.index.json; F32, BF16 or F16): every tensor of the
 * unit present with its shape, and (checked on every call) no tensor in the
 * files that the model lacks; a missing, extra or misshapen tensor is
 * ZR_ERR_FORMAT naming it and the file.
 */
zr_status zr_llama_load_hf_unit(const zr_llama *m, const char *dir, int u, float *out);
/*
 * The same for elements [first, first + count) of unit u only (into
 * out[0 .. count)), reading only their bytes: a rank loads its own shard of
 * every unit. The checks are those of zr_llama_load_hf_unit, whatever the range.
 */
zr_status zr_llama_load_hf_range(const zr_llama *m, const char *dir, int u, size_t first,
                                 size_t count, float *out);

/* Tokens in [0, V); targets NULL: logits only. */
zr_status zr_llama_forward_begin(zr_llama *m, const int *inputs, const int *targets);
/* params: unit u's buffer; unit0_params: unit 0's, read by u = L+1 when tied. */
zr_status zr_llama_forward_unit(zr_llama *m, int u, const float *params, const float *unit0_params);
float zr_llama_loss(const zr_llama *m);
/* [N, V] logits after a forward without targets (NULL otherwise). */
const float *zr_llama_logits(const zr_llama *m);

zr_status zr_llama_backward_begin(zr_llama *m);
/* Accumulates (+=) into grads; u = L+1 of a tied model also into unit0_grads. */
zr_status zr_llama_backward_unit(zr_llama *m, int u, const float *params, const float *unit0_params,
                                 float *grads, float *unit0_grads);

#endif /* ZR_LLAMA_H */
