/*
 * llama_io.c - a Llama-family model from a Hugging Face folder (zr/llama.h):
 * its config.json through hf_config.c, its model.safetensors (or shards)
 * through the folder reader of safetensors.h, every name and shape checked
 * against the units; a unit whole or any range of its elements.
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

/*
 * Elements [first, first + count) of tensor d's place in its unit, where they
 * overlap the tensor, into out (out[0] is the unit's element first); the
 * tensor found in the folder with d's shape. out NULL: the checks only.
 */
static zr_status load_tensor(const zr_hf_weights *w, const char *where, const zr_tensor_desc *d,
                             size_t first, size_t count, float *out)
{
    const zr_safetensors *s = NULL;
    const zr_safetensors_tensor *t = zr_hf_weights_find(w, d->name, &s);
    if (t == NULL) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: tensor %s is missing", where, d->name);
    }
    int same = t->ndim == d->ndim;
    for (int i = 0; same && i < d->ndim; i++) {
        same = t->shape[i] == d->shape[i];
    }
    if (!same) {
        char want[96], got[96];
        int64_t ws[4];
        for (int i = 0; i < d->ndim; i++) {
            ws[i] = d->shape[i];
        }
        zr_safetensors_shape_text(want, sizeof want, ws, d->ndim);
        zr_safetensors_shape_text(got, sizeof got, t->shape, t->ndim);
        ZR_FAIL(ZR_ERR_FORMAT, "%s: tensor %s has shape %s, the model's is %s", s->path, d->name,
                got, want);
    }
    if (out == NULL) {
        return ZR_OK;
    }
    size_t lo = first > d->offset ? first : d->offset;
    size_t hi = first + count < d->offset + d->numel ? first + count : d->offset + d->numel;
    if (lo >= hi) {
        return ZR_OK;
    }
    return zr_safetensors_read_f32_range(s, t, lo - d->offset, hi - lo, out + (lo - first));
}

zr_status zr_llama_load_hf_range(const zr_llama *m, const char *dir, int u, size_t first,
                                 size_t count, float *out)
{
    zr_status st = ZR_OK;
    zr_hf_weights w = {0};
    if (u < 0 || u >= zr_llama_unit_count(m)) {
        ZR_FAIL(ZR_ERR_INVALID, "Llama load: unit %d of %d", u, zr_llama_unit_count(m));
    }
    size_t numel = zr_llama_unit_numel(m, u);
    if (first > numel || count > numel - first) {
        ZR_FAIL(ZR_ERR_INVALID, "Llama load: elements [%zu, %zu + %zu) of unit %d's %zu", first,
                first, count, u, numel);
    }
    ZR_CHECK_GOTO(zr_hf_weights_open(&w, dir), st, done);
    const char *where = w.index != NULL ? w.index : w.files[0].path;
    for (int i = 0; i < zr_hf_weights_count(&w); i++) {
        const zr_safetensors *s = NULL;
        const zr_safetensors_tensor *t = zr_hf_weights_tensor(&w, i, &s);
        if (!model_has(m, t->name)) {
            ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT,
                         "%s: tensor %s is not one of the model's (%d layers, %s head%s)", s->path,
                         t->name, m->cfg.layers, m->cfg.tied ? "tied" : "untied",
                         m->cfg.tied ? ": no lm_head.weight" : "");
        }
    }
    const zr_tensor_desc *d = NULL;
    int k = zr_llama_unit_tensors(m, u, &d);
    /* every tensor checked before out is touched */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            memset(out, 0, count * sizeof *out);
        }
        for (int i = 0; i < k; i++) {
            ZR_CHECK_GOTO(load_tensor(&w, where, &d[i], first, count, pass ? out : NULL), st, done);
        }
    }
done:
    zr_hf_weights_close(&w);
    return st;
}

zr_status zr_llama_load_hf_unit(const zr_llama *m, const char *dir, int u, float *out)
{
    if (u < 0 || u >= zr_llama_unit_count(m)) {
        ZR_FAIL(ZR_ERR_INVALID, "Llama load: unit %d of %d", u, zr_llama_unit_count(m));
    }
    return zr_llama_load_hf_range(m, dir, u, 0, zr_llama_unit_numel(m, u), out);
}
