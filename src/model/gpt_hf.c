/*
 * gpt_hf.c - GPT-2 from a Hugging Face folder (zr/model.h): config.json
 * (GPT2LMHeadModel) through hf_config.c, the weights through the folder
 * reader of safetensors.h, one unit or any range of a unit's elements, so
 * that a rank reads only its own shard. Conv1D weights are stored [in, out]
 * there and [out, in] in zr (transposed as read); wte has V rows there, Vp
 * here (the padding rows zero); the head is tied (no lm_head.weight).
 */
#include "hf_config.h"
#include "safetensors.h"
#include "zr/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Hugging Face names of a block's tensors, in zr's (llm.c's) order. */
static const char *const block_names[ZR_GPT_BLOCK_TENSORS] = {
    "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
    "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};

int zr_gpt_config_hf_name(const zr_gpt_config *cfg, int u, int i, char *out, size_t n)
{
    static const char *const ends[4] = {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"};
    const int L = cfg->layers;
    if (u < 0 || u > L + 1 || i < 0 || i >= (u == 0 || u == L + 1 ? 2 : ZR_GPT_BLOCK_TENSORS)) {
        snprintf(out, n, "?");
        return -1;
    }
    if (u == 0 || u == L + 1) {
        snprintf(out, n, "%s", ends[(u == 0 ? 0 : 2) + i]);
        return 0;
    }
    snprintf(out, n, "h.%d.%s", u - 1, block_names[i]);
    zr_tensor_desc d[ZR_GPT_MAX_UNIT_TENSORS];
    zr_gpt_config_unit_tensors(cfg, u, d);
    return d[i].ndim == 2; /* every block matrix is a Conv1D */
}

zr_status zr_gpt_read_hf_config(const char *dir, zr_gpt_config *cfg)
{
    zr_hf_config h;
    ZR_CHECK(zr_hf_config_read(&h, dir));
    if (h.family != ZR_HF_GPT2) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: %s is not GPT-2 (GPT2LMHeadModel)", dir,
                zr_hf_family_name(h.family));
    }
    if (h.intermediate != 4 * h.hidden) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: key \"n_inner\" is %d; zr's GPT-2 MLP is 4 x n_embd = %d", dir,
                h.intermediate, 4 * h.hidden);
    }
    if (h.norm_eps != 1e-5) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: key \"layer_norm_epsilon\" is %g; zr's GPT-2 uses 1e-5", dir,
                h.norm_eps);
    }
    if (!h.tied) {
        ZR_FAIL(ZR_ERR_INVALID,
                "%s: key \"tie_word_embeddings\" is false; zr's GPT-2 head is tied to wte", dir);
    }
    zr_gpt_config c = {.max_t = h.max_pos,
                       .vocab = h.vocab,
                       .padded_vocab = (int)zr_round_up((size_t)h.vocab, 128),
                       .layers = h.layers,
                       .heads = h.heads,
                       .channels = h.hidden};
    ZR_CHECK(zr_gpt_config_check(&c));
    *cfg = c;
    return ZR_OK;
}

/* Whether name (the folder's prefix removed) is one of GPT-2's tensors or buffers. */
static int gpt2_has(const zr_gpt_config *cfg, const char *name)
{
    static const char *const top[] = {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"};
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++) {
        if (strcmp(name, top[i]) == 0) {
            return 1;
        }
    }
    if (strncmp(name, "h.", 2) != 0 || name[2] < '0' || name[2] > '9') {
        return 0;
    }
    char *end = NULL;
    long l = strtol(name + 2, &end, 10);
    if (l >= cfg->layers || *end != '.' || (name[2] == '0' && end != name + 3)) {
        return 0;
    }
    /* old files carry the attention's mask buffers: accepted, never read */
    if (strcmp(end + 1, "attn.bias") == 0 || strcmp(end + 1, "attn.masked_bias") == 0) {
        return 1;
    }
    for (int i = 0; i < ZR_GPT_BLOCK_TENSORS; i++) {
        if (strcmp(end + 1, block_names[i]) == 0) {
            return 1;
        }
    }
    return 0;
}

/* The folder's names carry "transformer." (save_pretrained) or not (older files, zr's own). */
static zr_status check_names(const zr_gpt_config *cfg, const zr_hf_weights *w, const char **prefix)
{
    *prefix = zr_hf_weights_find(w, "transformer.wte.weight", NULL) != NULL ? "transformer." : "";
    size_t pl = strlen(*prefix);
    for (int i = 0; i < zr_hf_weights_count(w); i++) {
        const zr_safetensors *s = NULL;
        const zr_safetensors_tensor *t = zr_hf_weights_tensor(w, i, &s);
        if (strncmp(t->name, *prefix, pl) != 0 || !gpt2_has(cfg, t->name + pl)) {
            ZR_FAIL(ZR_ERR_FORMAT,
                    "%s: tensor %s is not one of GPT-2's (%d layers, names %s\"transformer.\", "
                    "the head tied to wte: no lm_head.weight)",
                    s->path, t->name, cfg->layers, pl > 0 ? "with " : "without ");
        }
    }
    return ZR_OK;
}

/* The tensor's shape in the folder: zr's, Conv1D's transposed, wte's V rows rather than Vp. */
static void file_shape(const zr_gpt_config *cfg, const zr_tensor_desc *d, int conv, int u,
                       int64_t *shape)
{
    shape[0] = conv ? d->shape[1] : u == 0 && d->offset == 0 ? cfg->vocab : d->shape[0];
    shape[1] = conv ? d->shape[0] : d->shape[1];
}

/*
 * Elements [lo, hi) of a Conv1D weight in zr's order ([out, in]) from the
 * file's [in, out]: for each of the file's rows, the columns of zr's rows
 * lo / in .. (hi - 1) / in, one read each; out[0] is element lo.
 */
static zr_status read_conv(const zr_safetensors *s, const zr_safetensors_tensor *t, size_t lo,
                           size_t hi, float *out)
{
    zr_status st = ZR_OK;
    float *row = NULL;
    const size_t in = (size_t)t->shape[0], outs = (size_t)t->shape[1];
    const size_t r0 = lo / in, nr = (hi - 1) / in - r0 + 1;
    ZR_ALLOC_GOTO(row, nr, st, done);
    for (size_t c = 0; c < in; c++) {
        ZR_CHECK_GOTO(zr_safetensors_read_f32_range(s, t, c * outs + r0, nr, row), st, done);
        for (size_t j = 0; j < nr; j++) {
            size_t at = (r0 + j) * in + c;
            if (at >= lo && at < hi) {
                out[at - lo] = row[j];
            }
        }
    }
done:
    zr_free(row);
    return st;
}

/*
 * Unit u's tensor i where it overlaps [first, first + count) of the unit,
 * into out (out[0] is the unit's element first): found, its shape checked,
 * its values finite. out NULL: the checks of the name and shape only.
 */
static zr_status load_tensor(const zr_gpt_config *cfg, const zr_hf_weights *w, const char *prefix,
                             int u, int i, size_t first, size_t count, float *out)
{
    zr_tensor_desc d[ZR_GPT_MAX_UNIT_TENSORS];
    char short_name[48], name[64];
    zr_gpt_config_unit_tensors(cfg, u, d);
    int conv = zr_gpt_config_hf_name(cfg, u, i, short_name, sizeof short_name);
    snprintf(name, sizeof name, "%s%s", prefix, short_name);
    const zr_safetensors *s = NULL;
    const zr_safetensors_tensor *t = zr_hf_weights_find(w, name, &s);
    if (t == NULL) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: tensor %s is missing",
                w->index != NULL ? w->index : w->files[0].path, name);
    }
    int64_t want[2];
    file_shape(cfg, &d[i], conv, u, want);
    if (t->ndim != d[i].ndim || t->shape[0] != want[0] ||
        (d[i].ndim == 2 && t->shape[1] != want[1])) {
        char got_s[96], want_s[96];
        zr_safetensors_shape_text(got_s, sizeof got_s, t->shape, t->ndim);
        zr_safetensors_shape_text(want_s, sizeof want_s, want, d[i].ndim);
        ZR_FAIL(ZR_ERR_FORMAT, "%s: tensor %s has shape %s, GPT-2's is %s", s->path, name, got_s,
                want_s);
    }
    if (out == NULL) {
        return ZR_OK;
    }
    /* the part of [first, first + count) in this tensor; wte's padding rows lie past t's */
    size_t lo = first > d[i].offset ? first : d[i].offset;
    size_t hi = first + count < d[i].offset + d[i].numel ? first + count : d[i].offset + d[i].numel;
    size_t file_hi = d[i].offset + t->numel < hi ? d[i].offset + t->numel : hi;
    if (lo >= file_hi) {
        return ZR_OK;
    }
    float *dst = out + (lo - first);
    if (conv) {
        ZR_CHECK(read_conv(s, t, lo - d[i].offset, file_hi - d[i].offset, dst));
    } else {
        ZR_CHECK(zr_safetensors_read_f32_range(s, t, lo - d[i].offset, file_hi - lo, dst));
    }
    size_t bad = zr_first_nonfinite(dst, file_hi - lo);
    if (bad < file_hi - lo) {
        ZR_FAIL(ZR_ERR_FORMAT,
                "%s: tensor %s holds a non-finite weight (%g) at element %zu of zr's order",
                s->path, name, (double)dst[bad], lo - d[i].offset + bad);
    }
    return ZR_OK;
}

zr_status zr_gpt_read_hf_range(const char *dir, const zr_gpt_config *cfg, int u, size_t first,
                               size_t count, float *out)
{
    ZR_CHECK(zr_gpt_config_check(cfg));
    if (u < 0 || u >= zr_gpt_config_unit_count(cfg)) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: unit %d does not exist (the model has %d)", dir, u,
                zr_gpt_config_unit_count(cfg));
    }
    size_t numel = zr_gpt_config_unit_numel(cfg, u);
    if (first > numel || count > numel - first) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: elements [%zu, %zu + %zu) of unit %d's %zu", dir, first, first,
                count, u, numel);
    }
    zr_status st = ZR_OK;
    zr_hf_weights w = {0};
    const char *prefix = "";
    ZR_CHECK_GOTO(zr_hf_weights_open(&w, dir), st, done);
    ZR_CHECK_GOTO(check_names(cfg, &w, &prefix), st, done);
    zr_tensor_desc d[ZR_GPT_MAX_UNIT_TENSORS];
    int n = zr_gpt_config_unit_tensors(cfg, u, d);
    /* every tensor checked before out is touched */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            memset(out, 0, count * sizeof *out);
        }
        for (int i = 0; i < n; i++) {
            ZR_CHECK_GOTO(load_tensor(cfg, &w, prefix, u, i, first, count, pass ? out : NULL), st,
                          done);
        }
    }
done:
    zr_hf_weights_close(&w);
    return st;
}
