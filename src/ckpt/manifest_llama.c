/*
 * manifest_llama.c - a Llama-family model's shape in a checkpoint's
 * manifest ("model.arch": "llama", "model.llama": {...}), so that a resume,
 * zr export and a reshard rebuild exactly the model that was saved: every
 * field of zr_llama_config under its own name, read back strictly (every key
 * present, of its kind and range, no other key).
 */
#include "ckpt_impl.h"

#include <cJSON.h>

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

typedef struct field {
    const char *key;
    size_t at;   /* offsetof in zr_llama_config */
    int is_real; /* double (1) or int (0) */
    double lo, hi;
} field;

#define INT_F(k, f, lo, hi)                                                                        \
    {                                                                                              \
        k, offsetof(zr_llama_config, f), 0, lo, hi                                                 \
    }
#define REAL_F(k, f, lo, hi)                                                                       \
    {                                                                                              \
        k, offsetof(zr_llama_config, f), 1, lo, hi                                                 \
    }

static const field fields[] = {
    INT_F("family", family, 1, 3),
    INT_F("vocab", vocab, 1, 1 << 24),
    INT_F("hidden", hidden, 1, 1 << 24),
    INT_F("layers", layers, 1, 1 << 16),
    INT_F("heads", heads, 1, 1 << 16),
    INT_F("kv_heads", kv_heads, 1, 1 << 16),
    INT_F("head_dim", head_dim, 1, 1 << 16),
    INT_F("intermediate", intermediate, 1, 1 << 24),
    REAL_F("norm_eps", norm_eps, 0, 1),
    REAL_F("rope_theta", rope_theta, 0, 1e300),
    INT_F("rope_llama3", rope_llama3, 0, 1),
    REAL_F("rope_factor", rope_factor, 0, 1e300),
    REAL_F("rope_low_freq_factor", rope_low_freq_factor, 0, 1e300),
    REAL_F("rope_high_freq_factor", rope_high_freq_factor, 0, 1e300),
    REAL_F("rope_original_max_pos", rope_original_max_pos, 0, 1e300),
    INT_F("tied", tied, 0, 1),
    INT_F("qkv_bias", qkv_bias, 0, 1),
    INT_F("o_bias", o_bias, 0, 1),
    INT_F("mlp_bias", mlp_bias, 0, 1),
    INT_F("sliding_window", sliding_window, 0, 1 << 30),
};

#define NFIELDS ((int)(sizeof fields / sizeof fields[0]))

cJSON *zr_ckpt_llama_json(const zr_llama_config *l)
{
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; i < NFIELDS; i++) {
        const char *p = (const char *)l + fields[i].at;
        double v = fields[i].is_real ? *(const double *)(const void *)p
                                     : (double)*(const int *)(const void *)p;
        cJSON_AddNumberToObject(o, fields[i].key, v);
    }
    return o;
}

zr_status zr_ckpt_llama_read(const cJSON *o, const char *mpath, zr_llama_config *l)
{
    memset(l, 0, sizeof *l);
    if (!cJSON_IsObject(o)) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: \"model.llama\" must be an object", mpath);
    }
    for (const cJSON *it = o->child; it != NULL; it = it->next) {
        int known = 0;
        for (int i = 0; i < NFIELDS && !known; i++) {
            known = strcmp(it->string, fields[i].key) == 0;
        }
        if (!known) {
            ZR_FAIL(ZR_ERR_FORMAT, "%s: \"model.llama.%.64s\" is not a key zr writes", mpath,
                    it->string);
        }
    }
    for (int i = 0; i < NFIELDS; i++) {
        const field *f = &fields[i];
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, f->key);
        double v = cJSON_IsNumber(it) ? it->valuedouble : NAN;
        if (!(v >= f->lo && v <= f->hi) || (!f->is_real && v != floor(v))) {
            ZR_FAIL(ZR_ERR_FORMAT, "%s: \"model.llama.%s\" must be %s in [%g, %g]", mpath, f->key,
                    f->is_real ? "a number" : "an integer", f->lo, f->hi);
        }
        char *p = (char *)l + f->at;
        if (f->is_real) {
            *(double *)(void *)p = v;
        } else {
            *(int *)(void *)p = (int)v;
        }
    }
    return ZR_OK;
}
