/*
 * hf_config.h - a Hugging Face config.json read into the shape of a model
 * zr trains (issue 43): the Llama family (LlamaForCausalLM,
 * MistralForCausalLM, Qwen2ForCausalLM) and GPT-2 (GPT2LMHeadModel).
 * Internal to src/model and the layers above it.
 *
 * Every key that changes the model is read and checked; a key zr does not
 * know, an architecture it does not train, a value it does not implement
 * (another rope scaling, activation or bias layout) or a malformed value
 * is an error naming the file and the key. Keys that only describe the
 * file or training-time options zr does not use (token ids, dtype, dropout
 * rates: zr trains without dropout) are accepted and ignored. Absent keys
 * take transformers' defaults for the family, except the shapes (vocab,
 * hidden, intermediate, layers, heads), which must be given.
 */
#ifndef ZR_MODEL_HF_CONFIG_H
#define ZR_MODEL_HF_CONFIG_H

#include "ops.h" /* zr_op_rope_scaling */
#include "zr/base.h"

typedef enum zr_hf_family {
    ZR_HF_LLAMA = 1, /* LlamaForCausalLM */
    ZR_HF_MISTRAL,   /* MistralForCausalLM */
    ZR_HF_QWEN2,     /* Qwen2ForCausalLM */
    ZR_HF_GPT2       /* GPT2LMHeadModel */
} zr_hf_family;

/* The largest vocabulary zr reads (the 256K). */
#define ZR_HF_MAX_VOCAB 262144

typedef struct zr_hf_config {
    zr_hf_family family;
    int vocab, hidden, layers, heads, kv_heads, head_dim, intermediate, max_pos;
    double norm_eps;   /* rms_norm_eps; GPT-2: layer_norm_epsilon */
    double rope_theta; /* 0 for GPT-2 (learned positions) */
    zr_op_rope_scaling rope;
    int tied;                       /* tie_word_embeddings */
    int qkv_bias, o_bias, mlp_bias; /* Llama: attention_bias, mlp_bias; Qwen2: q/k/v only */
    int sliding_window;             /* attention window in tokens; 0: none */
} zr_hf_config;

/*
 * Reads path: a config.json, or a folder holding one. ZR_ERR_IO when it
 * cannot be read, ZR_ERR_FORMAT for text that is not a JSON object,
 * ZR_ERR_INVALID for an architecture, key or value zr refuses.
 */
zr_status zr_hf_config_read(zr_hf_config *c, const char *path);
/* The same from text; messages call it `name`. */
zr_status zr_hf_config_parse(zr_hf_config *c, const char *json, const char *name);
/*
 * Whether sequences of T tokens train as transformers computes them:
 * refuses a sliding window shorter than T (zr's attention is full causal).
 */
zr_status zr_hf_config_check_seq(const zr_hf_config *c, const char *name, int T);
/* "LlamaForCausalLM" etc. */
const char *zr_hf_family_name(zr_hf_family f);

#endif
