/*
 * gpt_engine_hf.c - a model from a Hugging Face folder into the ZeRO engine
 * (zr train --init DIR, issue 43): the shape from its config.json, the
 * parameters from its safetensors (one file or shards), each rank reading
 * only the part of every unit that its optimizer shard holds, so that no
 * rank ever holds a whole unit, let alone the model (a 7B model's 28 GB of
 * fp32 would otherwise be read by every rank). Every tensor's name and shape is checked against the
 * model on every rank before anything is read: a missing, extra or
 * misshapen tensor is the same error everywhere.
 */
#include "zr/gpt_engine.h"
#include "zr/llama.h"

#include "hf_config.h"
#include "safetensors.h"

#include <stdio.h>
#include <string.h>

zr_status zr_gpt_config_read_hf(const char *dir, zr_gpt_config *cfg)
{
    zr_hf_config h;
    memset(cfg, 0, sizeof *cfg);
    ZR_CHECK(zr_hf_config_read(&h, dir));
    if (h.family == ZR_HF_GPT2) {
        return zr_gpt_read_hf_config(dir, cfg);
    }
    zr_llama_config l;
    ZR_CHECK(zr_llama_config_read(&l, dir));
    *cfg = (zr_gpt_config){.max_t = h.max_pos,
                           .vocab = l.vocab,
                           .padded_vocab = l.vocab,
                           .layers = l.layers,
                           .heads = l.heads,
                           .channels = l.hidden,
                           .arch = ZR_ARCH_LLAMA,
                           .llama = l};
    return zr_gpt_config_check(cfg);
}

void zr_gpt_config_describe(const zr_gpt_config *c, char *out, size_t n)
{
    const zr_llama_config *l = &c->llama;
    if (c->arch != ZR_ARCH_LLAMA) {
        snprintf(out, n, "L=%d NH=%d C=%d V=%d max_seq_len=%d", c->layers, c->heads, c->channels,
                 c->vocab, c->max_t);
        return;
    }
    snprintf(out, n,
             "%s: L=%d NH=%d KV=%d head_dim=%d C=%d intermediate=%d V=%d max_seq_len=%d, %s "
             "embeddings",
             zr_hf_family_name((zr_hf_family)l->family), c->layers, c->heads, l->kv_heads,
             l->head_dim, c->channels, l->intermediate, c->vocab, c->max_t,
             l->tied ? "tied" : "untied");
}

#define HF_NAME_MAX 128

/* Whether the file's tensor `name` is one of cfg's (or a buffer transformers once saved aside). */
static int model_has(const zr_gpt_config *cfg, const char *name)
{
    size_t n = strlen(name), tail = strlen(".rotary_emb.inv_freq");
    if (n > tail && strcmp(name + n - tail, ".rotary_emb.inv_freq") == 0) {
        return 1;
    }
    for (int u = 0; u < zr_gpt_config_unit_count(cfg); u++) {
        zr_tensor_desc d[ZR_GPT_MAX_UNIT_TENSORS];
        int k = zr_gpt_config_unit_tensors(cfg, u, d);
        for (int i = 0; i < k; i++) {
            char full[HF_NAME_MAX];
            zr_llama_config_hf_name(&cfg->llama, u, &d[i], full, sizeof full);
            if (strcmp(full, name) == 0) {
                return 1;
            }
        }
    }
    return 0;
}

/* Tensor d of unit u in the folder's files, its shape checked. */
static zr_status find_tensor(const zr_hf_weights *w, const char *dir, const zr_gpt_config *cfg,
                             int u, const zr_tensor_desc *d, const zr_safetensors **file,
                             const zr_safetensors_tensor **out)
{
    char name[HF_NAME_MAX];
    zr_llama_config_hf_name(&cfg->llama, u, d, name, sizeof name);
    const zr_safetensors_tensor *t = zr_hf_weights_find(w, name, file);
    if (t == NULL) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: tensor %s is missing", dir, name);
    }
    int same = t->ndim == d->ndim;
    for (int i = 0; same && i < d->ndim; i++) {
        same = t->shape[i] == d->shape[i];
    }
    if (!same) {
        char got[96], want[96];
        int64_t mine[4] = {d->shape[0], d->shape[1], d->shape[2], d->shape[3]};
        zr_safetensors_shape_text(got, sizeof got, t->shape, t->ndim);
        zr_safetensors_shape_text(want, sizeof want, mine, d->ndim);
        ZR_FAIL(ZR_ERR_FORMAT, "%s: tensor %s has shape %s, the model's is %s", (*file)->path, name,
                got, want);
    }
    *out = t;
    return ZR_OK;
}

/* Every tensor of the files known to cfg, and every tensor of cfg in them with its shape. */
static zr_status check_names(const zr_hf_weights *w, const char *dir, const zr_gpt_config *cfg)
{
    for (int i = 0; i < zr_hf_weights_count(w); i++) {
        const zr_safetensors *f;
        const zr_safetensors_tensor *t = zr_hf_weights_tensor(w, i, &f);
        if (!model_has(cfg, t->name)) {
            ZR_FAIL(ZR_ERR_FORMAT, "%s: tensor %s is not one of the model's (%d layers, %s head%s)",
                    f->path, t->name, cfg->layers, cfg->llama.tied ? "tied" : "untied",
                    cfg->llama.tied ? ": no lm_head.weight" : "");
        }
    }
    for (int u = 0; u < zr_gpt_config_unit_count(cfg); u++) {
        zr_tensor_desc d[ZR_GPT_MAX_UNIT_TENSORS];
        int k = zr_gpt_config_unit_tensors(cfg, u, d);
        for (int i = 0; i < k; i++) {
            const zr_safetensors *f;
            const zr_safetensors_tensor *t;
            ZR_CHECK(find_tensor(w, dir, cfg, u, &d[i], &f, &t));
        }
    }
    return ZR_OK;
}

/* Elements [first, first + count) of tensor t of file f into out, refusing a non-finite one. */
static zr_status read_range(const zr_safetensors *f, const zr_safetensors_tensor *t, size_t first,
                            size_t count, float *out)
{
    ZR_CHECK(zr_safetensors_read_f32_range(f, t, first, count, out));
    size_t bad = zr_first_nonfinite(out, count);
    if (bad < count) {
        ZR_FAIL(ZR_ERR_FORMAT,
                "%s: tensor %s holds a non-finite value (%g) at element %zu: the weights are "
                "damaged",
                f->path, t->name, (double)out[bad], first + bad);
    }
    return ZR_OK;
}

/*
 * This rank's optimizer shard of unit u ([r S, (r + 1) S) of the padded
 * unit) from the folder: the parts of the tensors that overlap it, only.
 */
static zr_status load_shard(zr_engine *e, const zr_hf_weights *w, const char *dir,
                            const zr_gpt_config *cfg, int u, float *shard)
{
    size_t S = zr_engine_shard(e, u), lo = (size_t)e->comm->rank[ZR_GROUP_WORLD] * S;
    size_t numel = zr_gpt_config_unit_numel(cfg, u);
    memset(shard, 0, S * sizeof *shard); /* the padding */
    if (cfg->arch == ZR_ARCH_GPT2) {
        /* every rank reads (and so checks) every unit, an empty range where it holds none */
        size_t first = lo < numel ? lo : numel, count = numel - first < S ? numel - first : S;
        ZR_CHECK(zr_gpt_read_hf_range(dir, cfg, u, first, count, shard));
    } else {
        zr_tensor_desc d[ZR_GPT_MAX_UNIT_TENSORS];
        int k = zr_gpt_config_unit_tensors(cfg, u, d);
        for (int i = 0; i < k; i++) {
            size_t a = d[i].offset > lo ? d[i].offset : lo;
            size_t b = d[i].offset + d[i].numel < lo + S ? d[i].offset + d[i].numel : lo + S;
            if (a < b) {
                const zr_safetensors *f;
                const zr_safetensors_tensor *t;
                ZR_CHECK(find_tensor(w, dir, cfg, u, &d[i], &f, &t));
                ZR_CHECK(read_range(f, t, a - d[i].offset, b - a, shard + (a - lo)));
            }
        }
    }
    return zr_engine_optim_write(e, u, ZR_OPTIM_MASTER, 0, S, shard);
}

zr_status zr_gpt_engine_load_hf(zr_engine *e, const zr_gpt_config *cfg, const char *dir)
{
    zr_status st = ZR_OK;
    zr_hf_weights w = {0};
    float *shard = NULL;
    int n = zr_gpt_config_unit_count(cfg);
    ZR_ASSERT(n == e->nunits);
    if (cfg->arch == ZR_ARCH_LLAMA) {
        ZR_CHECK_GOTO(zr_hf_weights_open(&w, dir), st, done);
        ZR_CHECK_GOTO(check_names(&w, dir, cfg), st, done);
    }
    size_t most = 0;
    for (int u = 0; u < n; u++) {
        most = zr_engine_shard(e, u) > most ? zr_engine_shard(e, u) : most;
    }
    ZR_ALLOC_GOTO(shard, most, st, done);
    for (int u = 0; u < n; u++) {
        ZR_CHECK_GOTO(load_shard(e, &w, dir, cfg, u, shard), st, done);
    }
done:
    zr_free(shard);
    zr_hf_weights_close(&w);
    /* every rank gets here, loaded or not: the first failure is every rank's before the
       collective rebuild of the working parameters */
    ZR_CHECK(zr_comm_agree(e->comm, st));
    return zr_engine_sync_from_shards(e);
}
