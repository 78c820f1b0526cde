/*
 * hf_config.c - config.json of a Hugging Face model into zr_hf_config (see
 * hf_config.h for what is read, refused and ignored).
 *
 * Each family has a table of the keys zr reads; a small table of keys that
 * only describe the file or training options zr does not use is shared.
 * Any other key is refused: a model is never trained as something it is
 * not because a key was skipped. Defaults are transformers' (configuration
 * _llama.py, _mistral.py, _qwen2.py, _gpt2.py).
 */
#define _POSIX_C_SOURCE 200809L /* stat */
#include "hf_config.h"

#include "zr/file.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define LIST_END NULL

/* Keys read for the Llama family (Llama, Mistral, Qwen2). */
static const char *const llama_keys[] = {"vocab_size",
                                         "hidden_size",
                                         "intermediate_size",
                                         "num_hidden_layers",
                                         "num_attention_heads",
                                         "num_key_value_heads",
                                         "head_dim",
                                         "hidden_act",
                                         "max_position_embeddings",
                                         "rms_norm_eps",
                                         "rope_theta",
                                         "rope_scaling",
                                         "rope_parameters",
                                         "partial_rotary_factor",
                                         "rope_interleaved",
                                         "tie_word_embeddings",
                                         "attention_bias",
                                         "mlp_bias",
                                         "sliding_window",
                                         "use_sliding_window",
                                         "max_window_layers",
                                         "layer_types",
                                         LIST_END};

/* Keys read for GPT-2. */
static const char *const gpt2_keys[] = {"vocab_size",
                                        "n_embd",
                                        "n_layer",
                                        "n_head",
                                        "n_positions",
                                        "n_ctx",
                                        "n_inner",
                                        "activation_function",
                                        "layer_norm_epsilon",
                                        "tie_word_embeddings",
                                        "scale_attn_weights",
                                        "scale_attn_by_inverse_layer_idx",
                                        "reorder_and_upcast_attn",
                                        "add_cross_attention",
                                        LIST_END};

/* Keys that describe the file or options zr does not use (zr trains without dropout). */
static const char *const ignored_keys[] = {"architectures",
                                           "model_type",
                                           "transformers_version",
                                           "torch_dtype",
                                           "dtype",
                                           "bos_token_id",
                                           "eos_token_id",
                                           "pad_token_id",
                                           "use_cache",
                                           "initializer_range",
                                           "attention_dropout",
                                           "pretraining_tp",
                                           "tokenizer_class",
                                           "is_llama_config",
                                           "transformers.js_config",
                                           "attn_pdrop",
                                           "embd_pdrop",
                                           "resid_pdrop",
                                           "summary_activation",
                                           "summary_first_dropout",
                                           "summary_proj_to_labels",
                                           "summary_type",
                                           "summary_use_proj",
                                           "task_specific_params",
                                           "output_attentions",
                                           "output_hidden_states",
                                           "return_dict",
                                           "id2label",
                                           "label2id",
                                           "decoder_start_token_id",
                                           "sep_token_id",
                                           LIST_END};

static const struct {
    const char *arch, *model_type;
    zr_hf_family family;
} families[] = {{"LlamaForCausalLM", "llama", ZR_HF_LLAMA},
                {"MistralForCausalLM", "mistral", ZR_HF_MISTRAL},
                {"Qwen2ForCausalLM", "qwen2", ZR_HF_QWEN2},
                {"GPT2LMHeadModel", "gpt2", ZR_HF_GPT2}};
#define N_FAMILIES (sizeof families / sizeof families[0])

const char *zr_hf_family_name(zr_hf_family f)
{
    for (size_t i = 0; i < N_FAMILIES; i++) {
        if (families[i].family == f) {
            return families[i].arch;
        }
    }
    return "unknown";
}

static int in_list(const char *const *list, const char *key)
{
    for (; *list != NULL; list++) {
        if (strcmp(*list, key) == 0) {
            return 1;
        }
    }
    return 0;
}

/* ---- typed keys ------------------------------------------------------------------- */

static const cJSON *item(const cJSON *o, const char *key)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNull(x) ? NULL : x;
}

/* An integer in [lo, hi]: *out = dflt when absent (or null), or an error when required. */
static zr_status get_int(const cJSON *o, const char *name, const char *key, int required, int dflt,
                         int lo, int hi, int *out)
{
    const cJSON *x = item(o, key);
    if (x == NULL) {
        if (required) {
            ZR_FAIL(ZR_ERR_INVALID, "%s: key \"%s\" is missing", name, key);
        }
        *out = dflt;
        return ZR_OK;
    }
    if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < lo ||
        x->valuedouble > hi) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: key \"%s\" must be an integer in [%d, %d]", name, key, lo, hi);
    }
    *out = (int)x->valuedouble;
    return ZR_OK;
}

/* A finite number > 0: dflt when absent, or an error when dflt < 0 (required). */
static zr_status get_pos(const cJSON *o, const char *name, const char *key, double dflt,
                         double *out)
{
    const cJSON *x = item(o, key);
    if (x == NULL) {
        if (dflt < 0) {
            ZR_FAIL(ZR_ERR_INVALID, "%s: key \"%s\" is missing", name, key);
        }
        *out = dflt;
        return ZR_OK;
    }
    if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) || x->valuedouble <= 0) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: key \"%s\" must be a positive number", name, key);
    }
    *out = x->valuedouble;
    return ZR_OK;
}

static zr_status get_bool(const cJSON *o, const char *name, const char *key, int dflt, int *out)
{
    const cJSON *x = item(o, key);
    if (x == NULL) {
        *out = dflt;
        return ZR_OK;
    }
    if (!cJSON_IsBool(x)) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: key \"%s\" must be true or false", name, key);
    }
    *out = cJSON_IsTrue(x);
    return ZR_OK;
}

/* A key zr implements only at one value (a string, or a bool when want is NULL). */
static zr_status need(const cJSON *o, const char *name, const char *key, const char *want,
                      const char *want2, int want_bool)
{
    const cJSON *x = item(o, key);
    if (x == NULL) {
        return ZR_OK;
    }
    if (want == NULL) {
        if (!cJSON_IsBool(x) || cJSON_IsTrue(x) != want_bool) {
            ZR_FAIL(ZR_ERR_INVALID, "%s: key \"%s\": zr implements only %s", name, key,
                    want_bool ? "true" : "false");
        }
        return ZR_OK;
    }
    if (!cJSON_IsString(x) ||
        (strcmp(x->valuestring, want) != 0 && (want2 == NULL || strcmp(x->valuestring, want2)))) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: key \"%s\": zr implements only \"%s\"", name, key, want);
    }
    return ZR_OK;
}

/* ---- the architecture, and keys nobody reads ---------------------------------------- */

/* The keys of o in none of the lists (and not "_..."), comma-separated into buf. */
static int unknown_keys(const cJSON *o, const char *const *a, const char *const *b, char *buf,
                        size_t n)
{
    int count = 0;
    size_t used = 0;
    buf[0] = '\0';
    for (const cJSON *x = o->child; x != NULL; x = x->next) {
        if (x->string[0] == '_' || in_list(a, x->string) || in_list(b, x->string) ||
            in_list(ignored_keys, x->string)) {
            continue;
        }
        int w = snprintf(buf + used, n - used, "%s\"%s\"", count ? ", " : "", x->string);
        used = w > 0 && used + (size_t)w < n ? used + (size_t)w : used;
        count++;
    }
    return count;
}

/* A string, or NULL with *bad set when the key holds something else. */
static const char *str_of(const cJSON *x, int *bad)
{
    *bad |= x != NULL && !cJSON_IsString(x);
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

static zr_status family_of(const cJSON *r, const char *name, zr_hf_family *f)
{
    const cJSON *archs = item(r, "architectures");
    int bad = archs != NULL && (!cJSON_IsArray(archs) || cJSON_GetArraySize(archs) != 1);
    const char *arch = bad ? NULL : str_of(cJSON_GetArrayItem(archs, 0), &bad);
    if (bad) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: key \"architectures\" must be a list of one name", name);
    }
    const char *type = str_of(item(r, "model_type"), &bad);
    if (bad || (arch == NULL && type == NULL)) {
        ZR_FAIL(ZR_ERR_INVALID,
                "%s: key \"%s\" must name the model (\"architectures\" or "
                "\"model_type\")",
                name, bad ? "model_type" : "architectures");
    }
    for (size_t i = 0; i < N_FAMILIES; i++) {
        if (strcmp(arch != NULL ? arch : type,
                   arch != NULL ? families[i].arch : families[i].model_type) != 0) {
            continue;
        }
        if (type != NULL && strcmp(type, families[i].model_type) != 0) {
            ZR_FAIL(ZR_ERR_INVALID, "%s: key \"model_type\" is \"%s\", but %s is \"%s\"", name,
                    type, families[i].arch, families[i].model_type);
        }
        *f = families[i].family;
        return ZR_OK;
    }
    char keys[512];
    int n = unknown_keys(r, llama_keys, gpt2_keys, keys, sizeof keys);
    ZR_FAIL(ZR_ERR_INVALID,
            "%s: architecture \"%s\" is not one zr trains (LlamaForCausalLM, MistralForCausalLM, "
            "Qwen2ForCausalLM, GPT2LMHeadModel)%s%s",
            name, arch != NULL ? arch : type, n ? "; keys zr does not know: " : "", keys);
}

static zr_status refuse_unknown(const cJSON *r, const char *name, zr_hf_family f)
{
    char keys[512];
    int n =
        unknown_keys(r, f == ZR_HF_GPT2 ? gpt2_keys : llama_keys, ignored_keys, keys, sizeof keys);
    if (n > 0) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: %s with key%s zr does not understand: %s", name,
                zr_hf_family_name(f), n > 1 ? "s" : "", keys);
    }
    return ZR_OK;
}

/* ---- the Llama family ------------------------------------------------------------------ */

static const char *const rope_keys[] = {"rope_type",
                                        "type",
                                        "rope_theta",
                                        "factor",
                                        "low_freq_factor",
                                        "high_freq_factor",
                                        "original_max_position_embeddings",
                                        "partial_rotary_factor",
                                        LIST_END};

/* partial_rotary_factor, where present, must be 1 (every dimension rotates). */
static zr_status full_rotary(const cJSON *o, const char *name)
{
    double prf = 1.0;
    ZR_CHECK(get_pos(o, name, "partial_rotary_factor", 1.0, &prf));
    if (prf != 1.0) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: key \"partial_rotary_factor\": zr implements only 1", name);
    }
    return ZR_OK;
}

/* rope_theta and the scaling: transformers >= 5's rope_parameters, or rope_scaling. */
static zr_status rope_read(const cJSON *r, const char *name, zr_hf_config *c)
{
    const char *key = item(r, "rope_parameters") != NULL ? "rope_parameters" : "rope_scaling";
    const cJSON *rp = item(r, key);
    char sub[400];
    snprintf(sub, sizeof sub, "%s: key \"%s\"", name, key);
    ZR_CHECK(get_pos(r, name, "rope_theta", 10000.0, &c->rope_theta));
    ZR_CHECK(full_rotary(r, name));
    c->rope = (zr_op_rope_scaling){0};
    if (rp == NULL) {
        return ZR_OK;
    }
    char keys[512];
    if (!cJSON_IsObject(rp)) {
        ZR_FAIL(ZR_ERR_INVALID, "%s must be an object or null", sub);
    }
    if (unknown_keys(rp, rope_keys, rope_keys, keys, sizeof keys) > 0) {
        ZR_FAIL(ZR_ERR_INVALID, "%s has keys zr does not understand: %s", sub, keys);
    }
    int bad = 0;
    const char *type = str_of(item(rp, "rope_type"), &bad);
    type = type != NULL ? type : str_of(item(rp, "type"), &bad);
    ZR_CHECK(get_pos(rp, sub, "rope_theta", c->rope_theta, &c->rope_theta));
    ZR_CHECK(full_rotary(rp, sub));
    if (bad || (type != NULL && strcmp(type, "default") != 0 && strcmp(type, "llama3") != 0)) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: rope type %s%s%s is not one zr implements (default, llama3)",
                sub, type != NULL ? "\"" : "", type != NULL ? type : "(not a string)",
                type != NULL ? "\"" : "");
    }
    if (type == NULL || strcmp(type, "default") == 0) {
        return ZR_OK;
    }
    zr_op_rope_scaling *s = &c->rope;
    s->llama3 = 1;
    ZR_CHECK(get_pos(rp, sub, "factor", -1, &s->factor));
    ZR_CHECK(get_pos(rp, sub, "low_freq_factor", -1, &s->low_freq_factor));
    ZR_CHECK(get_pos(rp, sub, "high_freq_factor", -1, &s->high_freq_factor));
    ZR_CHECK(get_pos(rp, sub, "original_max_position_embeddings", -1, &s->original_max_pos));
    if (!(s->high_freq_factor > s->low_freq_factor)) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: key \"high_freq_factor\" must exceed \"low_freq_factor\"",
                sub);
    }
    return ZR_OK;
}

/* The attention window: Mistral's sliding_window; Qwen2's where layers use it. */
static zr_status window_read(const cJSON *r, const char *name, zr_hf_config *c)
{
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(r, "sliding_window");
    int window = 0, use = c->family == ZR_HF_MISTRAL, mwl = 28;
    if (!cJSON_IsNull(sw)) { /* absent: transformers' 4096 */
        ZR_CHECK(get_int(r, name, "sliding_window", 0, 4096, 1, 1 << 30, &window));
    }
    if (c->family == ZR_HF_QWEN2) {
        ZR_CHECK(get_bool(r, name, "use_sliding_window", 0, &use));
        ZR_CHECK(get_int(r, name, "max_window_layers", 0, 28, 0, 1 << 30, &mwl));
        use = use && mwl < c->layers;
        const cJSON *lt = item(r, "layer_types");
        if (lt != NULL) {
            int ok = cJSON_IsArray(lt) && cJSON_GetArraySize(lt) == c->layers, slide = 0;
            for (const cJSON *x = ok ? lt->child : NULL; x != NULL; x = x->next) {
                ok &= cJSON_IsString(x) && (strcmp(x->valuestring, "full_attention") == 0 ||
                                            strcmp(x->valuestring, "sliding_attention") == 0);
                slide |= ok && strcmp(x->valuestring, "sliding_attention") == 0;
            }
            if (!ok) {
                ZR_FAIL(ZR_ERR_INVALID,
                        "%s: key \"layer_types\" must list \"full_attention\" or "
                        "\"sliding_attention\" for each of the %d layers",
                        name, c->layers);
            }
            use = slide;
        }
    }
    c->sliding_window = c->family != ZR_HF_LLAMA && use ? window : 0;
    return ZR_OK;
}

/* The biases: Llama's attention_bias (q, k, v, o) and mlp_bias; Qwen2's q/k/v, fixed. */
static zr_status bias_read(const cJSON *r, const char *name, zr_hf_config *c)
{
    int ab = 0, mb = 0;
    ZR_CHECK(get_bool(r, name, "attention_bias", 0, &ab));
    ZR_CHECK(get_bool(r, name, "mlp_bias", 0, &mb));
    if (c->family != ZR_HF_LLAMA && (ab || mb)) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: key \"%s\": %s has no such bias", name,
                ab ? "attention_bias" : "mlp_bias", zr_hf_family_name(c->family));
    }
    c->qkv_bias = c->family == ZR_HF_QWEN2 || ab;
    c->o_bias = ab;
    c->mlp_bias = mb;
    return ZR_OK;
}

static zr_status llama_read(const cJSON *r, const char *name, zr_hf_config *c)
{
    const zr_hf_family f = c->family;
    ZR_CHECK(get_int(r, name, "vocab_size", 1, 0, 1, ZR_HF_MAX_VOCAB, &c->vocab));
    ZR_CHECK(get_int(r, name, "hidden_size", 1, 0, 1, 1 << 20, &c->hidden));
    ZR_CHECK(get_int(r, name, "intermediate_size", 1, 0, 8, 1 << 24, &c->intermediate));
    if (c->intermediate % 8 != 0) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: key \"intermediate_size\" must be a multiple of 8", name);
    }
    ZR_CHECK(get_int(r, name, "num_hidden_layers", 1, 0, 1, 1 << 16, &c->layers));
    ZR_CHECK(get_int(r, name, "num_attention_heads", 1, 0, 1, 1 << 16, &c->heads));
    ZR_CHECK(get_int(r, name, "num_key_value_heads", 0, c->heads, 1, c->heads, &c->kv_heads));
    if (c->heads % c->kv_heads != 0) {
        ZR_FAIL(ZR_ERR_INVALID,
                "%s: key \"num_key_value_heads\" (%d) must divide num_attention_heads (%d)", name,
                c->kv_heads, c->heads);
    }
    if (item(r, "head_dim") == NULL && c->hidden % c->heads != 0) {
        ZR_FAIL(ZR_ERR_INVALID,
                "%s: key \"num_attention_heads\" must divide hidden_size when "
                "head_dim is not given",
                name);
    }
    ZR_CHECK(get_int(r, name, "head_dim", 0, c->hidden / c->heads, 2, ZR_ATT_MAX_HS, &c->head_dim));
    if (c->head_dim % 2 != 0) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: key \"head_dim\" must be even (rotary pairs)", name);
    }
    int max_pos = f == ZR_HF_MISTRAL ? 131072 : f == ZR_HF_QWEN2 ? 32768 : 2048;
    ZR_CHECK(get_int(r, name, "max_position_embeddings", 0, max_pos, 1, 1 << 30, &c->max_pos));
    ZR_CHECK(get_pos(r, name, "rms_norm_eps", 1e-6, &c->norm_eps));
    ZR_CHECK(need(r, name, "hidden_act", "silu", NULL, 0));
    ZR_CHECK(need(r, name, "rope_interleaved", NULL, NULL, 0));
    ZR_CHECK(get_bool(r, name, "tie_word_embeddings", 0, &c->tied));
    ZR_CHECK(bias_read(r, name, c));
    ZR_CHECK(rope_read(r, name, c));
    return window_read(r, name, c);
}

/* ---- GPT-2 ------------------------------------------------------------------------------ */

static zr_status gpt2_read(const cJSON *r, const char *name, zr_hf_config *c)
{
    ZR_CHECK(get_int(r, name, "vocab_size", 1, 0, 1, ZR_HF_MAX_VOCAB, &c->vocab));
    ZR_CHECK(get_int(r, name, "n_embd", 1, 0, 1, 1 << 20, &c->hidden));
    ZR_CHECK(get_int(r, name, "n_layer", 1, 0, 1, 1 << 16, &c->layers));
    ZR_CHECK(get_int(r, name, "n_head", 1, 0, 1, 1 << 16, &c->heads));
    if (c->hidden % c->heads != 0 || c->hidden / c->heads > ZR_ATT_MAX_HS) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: key \"n_head\" must divide n_embd into heads of at most %d",
                name, ZR_ATT_MAX_HS);
    }
    c->kv_heads = c->heads;
    c->head_dim = c->hidden / c->heads;
    ZR_CHECK(get_int(r, name, "n_positions", 0, 1024, 1, 1 << 30, &c->max_pos));
    ZR_CHECK(get_int(r, name, "n_inner", 0, 4 * c->hidden, 1, 1 << 24, &c->intermediate));
    ZR_CHECK(get_pos(r, name, "layer_norm_epsilon", 1e-5, &c->norm_eps));
    ZR_CHECK(need(r, name, "activation_function", "gelu_new", "gelu_pytorch_tanh", 0));
    ZR_CHECK(need(r, name, "scale_attn_weights", NULL, NULL, 1));
    ZR_CHECK(need(r, name, "scale_attn_by_inverse_layer_idx", NULL, NULL, 0));
    ZR_CHECK(need(r, name, "add_cross_attention", NULL, NULL, 0));
    ZR_CHECK(get_bool(r, name, "tie_word_embeddings", 1, &c->tied));
    c->qkv_bias = c->o_bias = c->mlp_bias = 1;
    return ZR_OK;
}

/* ---- entry points ---------------------------------------------------------------------- */

zr_status zr_hf_config_parse(zr_hf_config *c, const char *json, const char *name)
{
    zr_status st = ZR_OK;
    cJSON *root = cJSON_Parse(json);
    memset(c, 0, sizeof *c);
    if (!cJSON_IsObject(root)) {
        ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT, "%s: not a JSON object", name);
    }
    ZR_CHECK_GOTO(family_of(root, name, &c->family), st, done);
    ZR_CHECK_GOTO(refuse_unknown(root, name, c->family), st, done);
    if (c->family == ZR_HF_GPT2) {
        ZR_CHECK_GOTO(gpt2_read(root, name, c), st, done);
    } else {
        ZR_CHECK_GOTO(llama_read(root, name, c), st, done);
    }
done:
    cJSON_Delete(root);
    return st;
}

zr_status zr_hf_config_read(zr_hf_config *c, const char *path)
{
    zr_status st = ZR_OK;
    char *text = NULL, *file = NULL;
    size_t n = 0;
    struct stat sb;
    const size_t len = strlen(path) + sizeof "/config.json";
    ZR_ALLOC_GOTO(file, len, st, done);
    snprintf(file, len, stat(path, &sb) == 0 && S_ISDIR(sb.st_mode) ? "%s/config.json" : "%s",
             path);
    ZR_CHECK_GOTO(zr_file_read_all(file, &text, &n), st, done);
    ZR_CHECK_GOTO(zr_hf_config_parse(c, text, file), st, done);
done:
    zr_free(text);
    zr_free(file);
    return st;
}

zr_status zr_hf_config_check_seq(const zr_hf_config *c, const char *name, int T)
{
    if (c->sliding_window > 0 && c->sliding_window < T) {
        ZR_FAIL(ZR_ERR_INVALID,
                "%s: key \"sliding_window\" (%d) is shorter than the sequence length %d: zr's "
                "attention sees every earlier token, so it would train another model; use "
                "sequences of at most %d tokens",
                name, c->sliding_window, T, c->sliding_window);
    }
    return ZR_OK;
}
