/*
 * hf_export.c - what a Hugging Face folder of a zr model holds (see
 * hf_write.h): GPT-2's and the Llama family's tensors named and shaped as
 * transformers saves them, and their config.json, with every key that
 * hf_config.c reads back (so a folder zr writes is one zr reads).
 */
#include "hf_config.h"
#include "hf_write.h"

#include <cJSON.h>
#include <stdio.h>
#include <string.h>

/* ---- GPT-2 ----------------------------------------------------------------------------- */

static zr_hf_tensor gpt2_tensor(const char *prefix, const char *name, const float *data,
                                const zr_tensor_desc *d, int rows, int transpose)
{
    zr_hf_tensor t = {.data = data, .ndim = d->ndim, .rows = rows, .transpose = transpose};
    t.cols = d->ndim == 2 ? d->shape[1] : 1;
    snprintf(t.name, sizeof t.name, "%s%s", prefix, name);
    return t;
}

zr_status zr_hf_gpt2_tensors(const zr_gpt_config *cfg, float *const *units, const char *prefix,
                             zr_hf_tensor **out, int *count)
{
    ZR_CHECK(zr_gpt_config_check(cfg));
    int L = cfg->layers, n = 0;
    zr_hf_tensor *t;
    ZR_ALLOC(t, 4 + (size_t)ZR_GPT_BLOCK_TENSORS * (size_t)L);
    /* in llm.c's order: the embeddings, each block, the final LayerNorm; names and which
       matrices are Conv1D ([in, out] in the file, [out, in] in zr) from gpt_hf.c's table */
    for (int u = 0; u < L + 2; u++) {
        zr_tensor_desc d[ZR_GPT_MAX_UNIT_TENSORS];
        int k = zr_gpt_config_unit_tensors(cfg, u, d);
        for (int i = 0; i < k; i++) {
            char name[64];
            int conv = zr_gpt_config_hf_name(cfg, u, i, name, sizeof name);
            /* wte: the padded rows are zr's, not the model's */
            int rows = u == 0 && i == 0 ? cfg->vocab : d[i].shape[0];
            t[n++] = gpt2_tensor(prefix, name, units[u] + d[i].offset, &d[i], rows, conv == 1);
        }
    }
    *out = t;
    *count = n;
    return ZR_OK;
}

/* cJSON's building calls fail only without memory: one check at the end. */
static zr_status finish(cJSON *root, int ok, const char *what, char **out)
{
    char *s = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    char *copy = NULL;
    size_t n = s != NULL ? strlen(s) + 2 : 0;
    zr_status st = s != NULL ? ZR_ALLOC_STATUS(copy, n) : ZR_ERR_NOMEM;
    if (st != ZR_OK) {
        cJSON_free(s);
        ZR_FAIL(ZR_ERR_NOMEM, "cannot build %s", what);
    }
    snprintf(copy, n, "%s\n", s);
    cJSON_free(s);
    *out = copy;
    return ZR_OK;
}

static int add_arch(cJSON *root, const char *arch, const char *model_type, zr_hf_dtype dtype)
{
    cJSON *a = cJSON_AddArrayToObject(root, "architectures");
    cJSON *s = cJSON_CreateString(arch);
    int ok = a != NULL && s != NULL && cJSON_AddItemToArray(a, s);
    if (!ok) {
        cJSON_Delete(s);
    }
    ok = ok && cJSON_AddStringToObject(root, "model_type", model_type) != NULL;
    /* transformers >= 4.56 reads "dtype", older ones "torch_dtype" */
    ok = ok && cJSON_AddStringToObject(root, "dtype", zr_hf_dtype_torch(dtype)) != NULL;
    return ok && cJSON_AddStringToObject(root, "torch_dtype", zr_hf_dtype_torch(dtype)) != NULL;
}

static int add_num(cJSON *o, const char *key, double v)
{
    return cJSON_AddNumberToObject(o, key, v) != NULL;
}

static int add_bool(cJSON *o, const char *key, int v)
{
    return cJSON_AddBoolToObject(o, key, v) != NULL;
}

zr_status zr_hf_gpt2_config_json(const zr_gpt_config *cfg, zr_hf_dtype dtype, char **out)
{
    ZR_CHECK(zr_gpt_config_check(cfg));
    cJSON *r = cJSON_CreateObject();
    int ok = r != NULL && add_arch(r, "GPT2LMHeadModel", "gpt2", dtype);
    ok = ok && cJSON_AddStringToObject(r, "activation_function", "gelu_new") != NULL;
    ok = ok && add_num(r, "vocab_size", cfg->vocab) && add_num(r, "n_embd", cfg->channels);
    ok = ok && add_num(r, "n_layer", cfg->layers) && add_num(r, "n_head", cfg->heads);
    ok = ok && add_num(r, "n_positions", cfg->max_t) && cJSON_AddNullToObject(r, "n_inner");
    ok = ok && add_num(r, "layer_norm_epsilon", 1e-5); /* zr's LayerNorm (ops.c) */
    ok = ok && add_bool(r, "scale_attn_weights", 1);
    ok = ok && add_bool(r, "scale_attn_by_inverse_layer_idx", 0);
    ok = ok && add_bool(r, "reorder_and_upcast_attn", 0);
    ok = ok && add_bool(r, "add_cross_attention", 0) && add_bool(r, "tie_word_embeddings", 1);
    ok = ok && add_bool(r, "use_cache", 1);
    /* GPT-2's end of text, where the vocabulary has it (transformers' default otherwise) */
    for (int i = 0; i < 2; i++) {
        const char *key = i ? "eos_token_id" : "bos_token_id";
        ok = ok &&
             (cfg->vocab > 50256 ? add_num(r, key, 50256) : cJSON_AddNullToObject(r, key) != NULL);
    }
    return finish(r, ok, "config.json", out);
}

zr_status zr_hf_write_gpt2(const char *dir, const zr_gpt_config *cfg, float *const *units,
                           const zr_hf_write_opts *o)
{
    zr_hf_tensor *t = NULL;
    char *json = NULL;
    int n = 0;
    zr_status st;
    ZR_CHECK_GOTO(zr_hf_gpt2_tensors(cfg, units, "transformer.", &t, &n), st, done);
    ZR_CHECK_GOTO(zr_hf_gpt2_config_json(cfg, o->dtype, &json), st, done);
    st = zr_hf_write_folder(dir, json, t, n, o);
done:
    zr_free(json);
    zr_free(t);
    return st;
}

/* ---- the Llama family ----------------------------------------------------------------- */

zr_status zr_hf_llama_tensors(const zr_llama_config *cfg, float *const *units, zr_hf_tensor **out,
                              int *count)
{
    /* the units' descriptions; B = T = 1 keeps the activations small */
    zr_llama m;
    ZR_CHECK(zr_llama_init(&m, cfg, 1, 1));
    zr_status st = ZR_OK;
    int U = zr_llama_unit_count(&m), n = 0;
    zr_hf_tensor *t;
    ZR_ALLOC_GOTO(t, (size_t)U * ZR_LLAMA_MAX_UNIT_TENSORS, st, done);
    for (int u = 0; u < U; u++) {
        const zr_tensor_desc *d = NULL;
        int k = zr_llama_unit_tensors(&m, u, &d);
        for (int i = 0; i < k; i++) {
            zr_hf_tensor *x = &t[n++];
            *x = (zr_hf_tensor){.data = units[u] + d[i].offset, .ndim = d[i].ndim};
            x->rows = d[i].shape[0];
            x->cols = d[i].ndim == 2 ? d[i].shape[1] : 1;
            snprintf(x->name, sizeof x->name, "%s", d[i].name);
        }
    }
    *out = t;
    *count = n;
done:
    zr_llama_free(&m);
    return st;
}

/* The biases the family's config.json can say (Llama: attention_bias = q, k, v and o). */
static zr_status check_biases(const zr_llama_config *c)
{
    int f = c->family, ok = f == ZR_HF_LLAMA   ? c->qkv_bias == c->o_bias
                            : f == ZR_HF_QWEN2 ? c->qkv_bias && !c->o_bias && !c->mlp_bias
                                               : !c->qkv_bias && !c->o_bias && !c->mlp_bias;
    if (!ok) {
        ZR_FAIL(ZR_ERR_INVALID,
                "%s cannot hold biases q/k/v %d, o %d, mlp %d: no config.json of it says so",
                zr_hf_family_name((zr_hf_family)f), c->qkv_bias, c->o_bias, c->mlp_bias);
    }
    return ZR_OK;
}

static int add_rope(cJSON *r, const zr_llama_config *c)
{
    int ok = add_num(r, "rope_theta", c->rope_theta);
    if (!c->rope_llama3) {
        return ok && cJSON_AddNullToObject(r, "rope_scaling") != NULL;
    }
    cJSON *s = cJSON_AddObjectToObject(r, "rope_scaling");
    ok = ok && s != NULL && cJSON_AddStringToObject(s, "rope_type", "llama3") != NULL;
    ok = ok && add_num(s, "factor", c->rope_factor);
    ok = ok && add_num(s, "low_freq_factor", c->rope_low_freq_factor);
    ok = ok && add_num(s, "high_freq_factor", c->rope_high_freq_factor);
    return ok && add_num(s, "original_max_position_embeddings", c->rope_original_max_pos);
}

/* The family's own keys: biases (Llama), the attention window (Mistral, Qwen2). */
static int add_family_keys(cJSON *r, const zr_llama_config *c)
{
    int w = c->sliding_window, ok = 1;
    if (c->family == ZR_HF_LLAMA) {
        return add_bool(r, "attention_bias", c->qkv_bias) && add_bool(r, "mlp_bias", c->mlp_bias);
    }
    ok = w > 0 ? add_num(r, "sliding_window", w)
               : cJSON_AddNullToObject(r, "sliding_window") != NULL;
    if (c->family == ZR_HF_QWEN2) {
        /* every layer slides from max_window_layers on */
        ok = ok && add_bool(r, "use_sliding_window", w > 0) && add_num(r, "max_window_layers", 0);
    }
    return ok;
}

zr_status zr_hf_llama_config_json(const zr_llama_config *c, const zr_hf_write_opts *o, char **out)
{
    ZR_CHECK(zr_llama_config_check(c));
    ZR_CHECK(check_biases(c));
    static const char *const types[] = {"", "llama", "mistral", "qwen2"};
    int f = c->family, max_pos = o->max_pos > 0       ? o->max_pos
                                 : f == ZR_HF_MISTRAL ? 131072
                                 : f == ZR_HF_QWEN2   ? 32768
                                                      : 2048;
    cJSON *r = cJSON_CreateObject();
    int ok = r != NULL && add_arch(r, zr_hf_family_name((zr_hf_family)f), types[f], o->dtype);
    ok = ok && add_num(r, "vocab_size", c->vocab) && add_num(r, "hidden_size", c->hidden);
    ok = ok && add_num(r, "intermediate_size", c->intermediate);
    ok = ok && add_num(r, "num_hidden_layers", c->layers);
    ok = ok && add_num(r, "num_attention_heads", c->heads);
    ok = ok && add_num(r, "num_key_value_heads", c->kv_heads);
    ok = ok && add_num(r, "head_dim", c->head_dim);
    ok = ok && cJSON_AddStringToObject(r, "hidden_act", "silu") != NULL;
    ok = ok && add_num(r, "max_position_embeddings", max_pos);
    ok = ok && add_num(r, "rms_norm_eps", c->norm_eps) && add_rope(r, c);
    ok = ok && add_bool(r, "tie_word_embeddings", c->tied) && add_family_keys(r, c);
    ok = ok && add_bool(r, "use_cache", 1);
    return finish(r, ok, "config.json", out);
}

zr_status zr_hf_write_llama(const char *dir, const zr_llama_config *cfg, float *const *units,
                            const zr_hf_write_opts *o)
{
    zr_hf_tensor *t = NULL;
    char *json = NULL;
    int n = 0;
    zr_status st;
    ZR_CHECK_GOTO(zr_hf_llama_config_json(cfg, o, &json), st, done);
    ZR_CHECK_GOTO(zr_hf_llama_tensors(cfg, units, &t, &n), st, done);
    st = zr_hf_write_folder(dir, json, t, n, o);
done:
    zr_free(json);
    zr_free(t);
    return st;
}

zr_status zr_hf_write_model(const char *dir, const zr_gpt_config *cfg, float *const *units,
                            const zr_hf_write_opts *o)
{
    if (cfg->arch != ZR_ARCH_LLAMA) {
        return zr_hf_write_gpt2(dir, cfg, units, o);
    }
    zr_hf_write_opts lo = *o;
    lo.max_pos = cfg->max_t;
    return zr_hf_write_llama(dir, &cfg->llama, units, &lo);
}
