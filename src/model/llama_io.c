/*
 * llama_io.c - a Llama-family model from a Hugging Face folder (zr/llama.h):
 * its config.json through hf_config.c, its model.safetensors through the
 * safetensors reader, every name and shape checked against the units.
 */
#include "hf_config.h"
#include "safetensors.h"
#include "zr/llama.h"

#include <stdio.h>
#include <string.h>

zr_status zr_llama_config_read(zr_llama_config *cfg, const char *path)
{
    zr_hf_config h;
    ZR_CHECK(zr_hf_config_read(&h, path));
    if (h.family == ZR_HF_GPT2) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: %s is GPT-2, not a Llama-family model", path,
                zr_hf_family_name(h.family));
    }
    *cfg = (zr_llama_config){.family = (int)h.family,
                             .vocab = h.vocab,
                             .hidden = h.hidden,
                             .layers = h.layers,
                             .heads = h.heads,
                             .kv_heads = h.kv_heads,
                             .head_dim = h.head_dim,
                             .intermediate = h.intermediate,
                             .norm_eps = h.norm_eps,
                             .rope_theta = h.rope_theta,
                             .rope_llama3 = h.rope.llama3,
                             .rope_factor = h.rope.factor,
                             .rope_low_freq_factor = h.rope.low_freq_factor,
                             .rope_high_freq_factor = h.rope.high_freq_factor,
                             .rope_original_max_pos = h.rope.original_max_pos,
                             .tied = h.tied,
                             .qkv_bias = h.qkv_bias,
                             .o_bias = h.o_bias,
                             .mlp_bias = h.mlp_bias,
                             .sliding_window = h.sliding_window};
    return zr_llama_config_check(cfg);
}

/* Whether name is one of the model's tensors (buffers transformers once saved aside). */
static int model_has(const zr_llama *m, const char *name)
{
    size_t n = strlen(name), tail = strlen(".rotary_emb.inv_freq");
    if (n > tail && strcmp(name + n - tail, ".rotary_emb.inv_freq") == 0) {
        return 1;
    }
    for (int u = 0; u < zr_llama_unit_count(m); u++) {
        const zr_tensor_desc *d = NULL;
        int k = zr_llama_unit_tensors(m, u, &d);
        for (int i = 0; i < k; i++) {
            if (strcmp(d[i].name, name) == 0) {
                return 1;
            }
        }
    }
    return 0;
}

/* Tensor d from the file into out, its shape checked. */
static zr_status load_tensor(const zr_safetensors *s, const zr_tensor_desc *d, float *out)
{
    const zr_safetensors_tensor *t = zr_safetensors_find(s, d->name);
    if (t == NULL) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: tensor %s is missing", s->path, d->name);
    }
    int same = t->ndim == d->ndim;
    for (int i = 0; same && i < d->ndim; i++) {
        same = t->shape[i] == d->shape[i];
    }
    if (!same) {
        char want[64], got[96];
        int w = snprintf(want, sizeof want, "[%d", d->shape[0]);
        for (int i = 1; i < d->ndim; i++) {
            w += snprintf(want + w, sizeof want - (size_t)w, ", %d", d->shape[i]);
        }
        snprintf(want + w, sizeof want - (size_t)w, "]");
        int g = snprintf(got, sizeof got, "[");
        for (int i = 0; i < t->ndim && g < 80; i++) {
            g += snprintf(got + g, sizeof got - (size_t)g, "%s%lld", i ? ", " : "",
                          (long long)t->shape[i]);
        }
        snprintf(got + g, sizeof got - (size_t)g, "]");
        ZR_FAIL(ZR_ERR_FORMAT, "%s: tensor %s has shape %s, the model's is %s", s->path, d->name,
                got, want);
    }
    return zr_safetensors_read_f32(s, t, out);
}

zr_status zr_llama_load_hf_unit(const zr_llama *m, const char *dir, int u, float *out)
{
    zr_status st = ZR_OK;
    zr_safetensors s = {0};
    char path[4096];
    if (u < 0 || u >= zr_llama_unit_count(m)) {
        ZR_FAIL(ZR_ERR_INVALID, "Llama load: unit %d of %d", u, zr_llama_unit_count(m));
    }
    if (snprintf(path, sizeof path, "%s/model.safetensors", dir) >= (int)sizeof path) {
        ZR_FAIL(ZR_ERR_INVALID, "Llama load: folder name too long");
    }
    ZR_CHECK_GOTO(zr_safetensors_open(&s, path), st, done);
    for (int i = 0; i < s.count; i++) {
        if (!model_has(m, s.tensors[i].name)) {
            ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT,
                         "%s: tensor %s is not one of the model's (%d layers, %s head%s)", path,
                         s.tensors[i].name, m->cfg.layers, m->cfg.tied ? "tied" : "untied",
                         m->cfg.tied ? ": no lm_head.weight" : "");
        }
    }
    const zr_tensor_desc *d = NULL;
    int k = zr_llama_unit_tensors(m, u, &d);
    for (int i = 0; i < k; i++) {
        ZR_CHECK_GOTO(load_tensor(&s, &d[i], out + d[i].offset), st, done);
    }
done:
    zr_safetensors_close(&s);
    return st;
}
