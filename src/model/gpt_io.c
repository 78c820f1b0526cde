/*
 * gpt_io.c - GPT-2 parameters to and from files: llm.c's model file (read
 * and write) and a consolidated Hugging Face safetensors file (write).
 *
 * Both formats are whole-model files assembled from the per-unit buffers,
 * so a ZeRO run can hand over its gathered units without ever building one
 * flat parameter array. Files are written to "<path>.tmp", fsynced and
 * renamed: a crash leaves either the old file or the new one, never a torn
 * one.
 */
#define _POSIX_C_SOURCE 200809L

#include "zr/model.h"

#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ZR_LLMC_HEADER_INTS 256

/* ---- file helpers ----------------------------------------------------------- */

static zr_status open_tmp(const char *path, char *tmp, size_t cap, FILE **f)
{
    if (snprintf(tmp, cap, "%s.tmp", path) >= (int)cap) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: path too long", path);
    }
    *f = fopen(tmp, "wb");
    if (*f == NULL) {
        ZR_FAIL(ZR_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    }
    return ZR_OK;
}

static zr_status write_all(FILE *f, const char *path, const void *data, size_t bytes)
{
    if (bytes > 0 && fwrite(data, 1, bytes, f) != bytes) {
        ZR_FAIL(ZR_ERR_IO, "%s: write of %zu bytes failed: %s", path, bytes, strerror(errno));
    }
    return ZR_OK;
}

/* Finish a temporary file: on success fsync + rename, else remove it. */
static zr_status finish_tmp(FILE *f, const char *tmp, const char *path, zr_status st)
{
    if (st == ZR_OK && (fflush(f) != 0 || fsync(fileno(f)) != 0)) {
        st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__, "%s: flush/fsync failed: %s", tmp,
                         strerror(errno));
    }
    if (fclose(f) != 0 && st == ZR_OK) {
        st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__, "%s: close failed: %s", tmp,
                         strerror(errno));
    }
    if (st == ZR_OK && rename(tmp, path) != 0) {
        st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__, "rename %s -> %s failed: %s", tmp, path,
                         strerror(errno));
    }
    if (st != ZR_OK) {
        remove(tmp);
    }
    return st;
}

/* ---- llm.c model file ---------------------------------------------------- */

static void llmc_header(const zr_gpt_config *cfg, int32_t *h)
{
    memset(h, 0, ZR_LLMC_HEADER_INTS * sizeof *h);
    h[0] = ZR_LLMC_MODEL_MAGIC;
    h[1] = ZR_LLMC_MODEL_VERSION_FP32;
    h[2] = cfg->max_t;
    h[3] = cfg->vocab;
    h[4] = cfg->layers;
    h[5] = cfg->heads;
    h[6] = cfg->channels;
    h[7] = cfg->padded_vocab;
}

/*
 * Visits every tensor in llm.c's file order (wte, wpe, then each block
 * tensor stacked over layers, then lnfw, lnfb), calling fn on its range.
 */
typedef zr_status (*tensor_fn)(void *ctx, float *data, size_t numel);

static zr_status llmc_walk(const zr_gpt_config *cfg, float *const *units, tensor_fn fn,
                           void *ctx)
{
    zr_tensor_desc d[ZR_GPT_MAX_UNIT_TENSORS];
    int L = cfg->layers;
    int n = zr_gpt_config_unit_tensors(cfg, 0, d);
    for (int i = 0; i < n; i++) {
        ZR_CHECK(fn(ctx, units[0] + d[i].offset, d[i].numel));
    }
    n = zr_gpt_config_unit_tensors(cfg, 1, d);
    for (int i = 0; i < n; i++) {
        for (int l = 0; l < L; l++) {
            ZR_CHECK(fn(ctx, units[1 + l] + d[i].offset, d[i].numel));
        }
    }
    n = zr_gpt_config_unit_tensors(cfg, L + 1, d);
    for (int i = 0; i < n; i++) {
        ZR_CHECK(fn(ctx, units[L + 1] + d[i].offset, d[i].numel));
    }
    return ZR_OK;
}

typedef struct io_ctx {
    FILE *f;
    const char *path;
} io_ctx;

static zr_status write_tensor(void *ctx, float *data, size_t numel)
{
    io_ctx *c = ctx;
    return write_all(c->f, c->path, data, numel * sizeof *data);
}

static zr_status read_tensor(void *ctx, float *data, size_t numel)
{
    io_ctx *c = ctx;
    if (numel > 0 && fread(data, sizeof *data, numel, c->f) != numel) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: truncated while reading parameters", c->path);
    }
    return ZR_OK;
}

zr_status zr_gpt_write_llmc(const char *path, const zr_gpt_config *cfg, float *const *units)
{
    ZR_CHECK(zr_gpt_config_check(cfg));
    char tmp[4096];
    FILE *f;
    ZR_CHECK(open_tmp(path, tmp, sizeof tmp, &f));
    int32_t h[ZR_LLMC_HEADER_INTS];
    llmc_header(cfg, h);
    zr_status st = write_all(f, tmp, h, sizeof h);
    if (st == ZR_OK) {
        io_ctx c = {f, tmp};
        st = llmc_walk(cfg, units, write_tensor, &c);
    }
    return finish_tmp(f, tmp, path, st);
}

/* Opens path and validates header and size; on success *f is positioned at the parameters. */
static zr_status llmc_open(const char *path, zr_gpt_config *cfg, FILE **out)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        ZR_FAIL(ZR_ERR_IO, "%s: cannot open model file: %s", path, strerror(errno));
    }
    zr_status st = ZR_OK;
    struct stat sb;
    int32_t h[ZR_LLMC_HEADER_INTS];
    if (fstat(fileno(f), &sb) != 0) {
        st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__, "%s: stat failed: %s", path,
                         strerror(errno));
        goto fail;
    }
    size_t size = (size_t)sb.st_size;
    if (size < sizeof h || fread(h, sizeof h, 1, f) != 1) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                         "%s: truncated model header (%zu bytes, need %zu)", path, size,
                         sizeof h);
        goto fail;
    }
    if (h[0] != ZR_LLMC_MODEL_MAGIC) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                         "%s: not an llm.c GPT-2 model file: magic %d, expected %d", path, h[0],
                         ZR_LLMC_MODEL_MAGIC);
        goto fail;
    }
    if (h[1] != ZR_LLMC_MODEL_VERSION_FP32) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                         "%s: model file version %d%s; only version %d (fp32) is supported",
                         path, h[1], h[1] == 5 ? " (bf16)" : "", ZR_LLMC_MODEL_VERSION_FP32);
        goto fail;
    }
    zr_gpt_config c = {.max_t = h[2],
                       .vocab = h[3],
                       .layers = h[4],
                       .heads = h[5],
                       .channels = h[6],
                       .padded_vocab = h[7]};
    if (zr_gpt_config_check(&c) != ZR_OK) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__, "%s: bad model header: %s", path,
                         zr_error_message());
        goto fail;
    }
    size_t want = sizeof h + zr_gpt_config_param_count(&c) * sizeof(float);
    if (size != want) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                         "%s: file has %zu bytes, the header (L=%d C=%d Vp=%d maxT=%d) needs %zu "
                         "(truncated or corrupt)",
                         path, size, c.layers, c.channels, c.padded_vocab, c.max_t, want);
        goto fail;
    }
    *cfg = c;
    *out = f;
    return ZR_OK;
fail:
    fclose(f);
    return st;
}

zr_status zr_gpt_read_llmc_config(const char *path, zr_gpt_config *cfg)
{
    FILE *f;
    ZR_CHECK(llmc_open(path, cfg, &f));
    fclose(f);
    return ZR_OK;
}

zr_status zr_gpt_read_llmc(const char *path, const zr_gpt_config *cfg, float *const *units)
{
    zr_gpt_config fc;
    FILE *f;
    ZR_CHECK(llmc_open(path, &fc, &f));
    if (memcmp(&fc, cfg, sizeof fc) != 0) {
        fclose(f);
        ZR_FAIL(ZR_ERR_FORMAT,
                "%s: model is maxT=%d V=%d Vp=%d L=%d NH=%d C=%d, expected maxT=%d V=%d Vp=%d "
                "L=%d NH=%d C=%d",
                path, fc.max_t, fc.vocab, fc.padded_vocab, fc.layers, fc.heads, fc.channels,
                cfg->max_t, cfg->vocab, cfg->padded_vocab, cfg->layers, cfg->heads,
                cfg->channels);
    }
    io_ctx c = {f, path};
    zr_status st = llmc_walk(cfg, units, read_tensor, &c);
    fclose(f);
    return st;
}

/* ---- safetensors ------------------------------------------------------------ */

/* Hugging Face name of block tensor i (llm.c order) and whether it is a Conv1D weight. */
static const char *const hf_block_names[ZR_GPT_BLOCK_TENSORS] = {
    "ln_1.weight",      "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
    "mlp.c_fc.weight",  "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};

typedef struct st_tensor {
    char name[64];
    const float *data;
    int rows, cols; /* as stored in zr ([out, in] for matrices); cols = 0 for vectors */
    int transpose;  /* write [cols, rows] */
} st_tensor;

/* The tensors of the safetensors file, in data order. Returns the count. */
static int st_tensors(const zr_gpt_config *cfg, float *const *units, st_tensor *t)
{
    zr_tensor_desc d[ZR_GPT_MAX_UNIT_TENSORS];
    int n = 0, C = cfg->channels, L = cfg->layers;
    zr_gpt_config_unit_tensors(cfg, 0, d);
    t[n++] = (st_tensor){"wte.weight", units[0] + d[0].offset, cfg->vocab, C, 0};
    t[n++] = (st_tensor){"wpe.weight", units[0] + d[1].offset, cfg->max_t, C, 0};
    zr_gpt_config_unit_tensors(cfg, 1, d);
    for (int l = 0; l < L; l++) {
        for (int i = 0; i < ZR_GPT_BLOCK_TENSORS; i++) {
            st_tensor *x = &t[n++];
            snprintf(x->name, sizeof x->name, "h.%d.%s", l, hf_block_names[i]);
            x->data = units[1 + l] + d[i].offset;
            x->rows = d[i].shape[0];
            x->cols = d[i].ndim == 2 ? d[i].shape[1] : 0;
            x->transpose = d[i].ndim == 2; /* every block matrix is a Conv1D */
        }
    }
    zr_gpt_config_unit_tensors(cfg, L + 1, d);
    t[n++] = (st_tensor){"ln_f.weight", units[L + 1] + d[0].offset, C, 0, 0};
    t[n++] = (st_tensor){"ln_f.bias", units[L + 1] + d[1].offset, C, 0, 0};
    return n;
}

static size_t st_numel(const st_tensor *t)
{
    return (size_t)t->rows * (size_t)(t->cols > 0 ? t->cols : 1);
}

/* Builds the JSON header; *out is malloc'd by cJSON (free with cJSON_free). */
static zr_status st_header(const st_tensor *t, int n, char **out)
{
    cJSON *root = cJSON_CreateObject();
    if (root == NULL) {
        ZR_FAIL(ZR_ERR_NOMEM, "safetensors: cannot build the JSON header");
    }
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    int ok = meta != NULL && cJSON_AddStringToObject(meta, "format", "pt") != NULL;
    size_t off = 0;
    for (int i = 0; ok && i < n; i++) {
        cJSON *e = cJSON_AddObjectToObject(root, t[i].name);
        ok = e != NULL && cJSON_AddStringToObject(e, "dtype", "F32") != NULL;
        double shape[2];
        int nd = 1;
        if (t[i].cols > 0) {
            nd = 2;
            shape[0] = t[i].transpose ? t[i].cols : t[i].rows;
            shape[1] = t[i].transpose ? t[i].rows : t[i].cols;
        } else {
            shape[0] = t[i].rows;
        }
        size_t end = off + st_numel(&t[i]) * sizeof(float);
        double offs[2] = {(double)off, (double)end};
        cJSON *sh = cJSON_CreateDoubleArray(shape, nd);
        cJSON *of = cJSON_CreateDoubleArray(offs, 2);
        ok = ok && sh != NULL && of != NULL;
        if (ok) {
            cJSON_AddItemToObject(e, "shape", sh);
            cJSON_AddItemToObject(e, "data_offsets", of);
        } else {
            cJSON_Delete(sh);
            cJSON_Delete(of);
        }
        off = end;
    }
    char *s = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (s == NULL) {
        ZR_FAIL(ZR_ERR_NOMEM, "safetensors: cannot build the JSON header");
    }
    *out = s;
    return ZR_OK;
}

zr_status zr_gpt_write_safetensors(const char *path, const zr_gpt_config *cfg,
                                   float *const *units)
{
    ZR_CHECK(zr_gpt_config_check(cfg));
    int count = 4 + ZR_GPT_BLOCK_TENSORS * cfg->layers;
    st_tensor *t;
    ZR_ALLOC(t, (size_t)count);
    int n = st_tensors(cfg, units, t);
    ZR_ASSERT(n == count);
    zr_status st = ZR_OK;
    char *json = NULL;
    float *buf = NULL;
    FILE *f = NULL;
    char tmp[4096];
    ZR_CHECK_GOTO(st_header(t, n, &json), st, done);
    size_t jlen = strlen(json);
    /* pad the header with spaces so the data starts 8-byte aligned */
    size_t hlen = zr_round_up(jlen, 8);
    uint64_t hlen64 = hlen;
    size_t maxnumel = 0;
    for (int i = 0; i < n; i++) {
        if (t[i].transpose && st_numel(&t[i]) > maxnumel) {
            maxnumel = st_numel(&t[i]);
        }
    }
    ZR_CHECK_GOTO(zr_alloc_at((void **)&buf, maxnumel * sizeof *buf, __FILE__, __LINE__), st,
                  done);
    ZR_CHECK_GOTO(open_tmp(path, tmp, sizeof tmp, &f), st, done);
    /* safetensors is little-endian; so are the machines zr runs on */
    st = write_all(f, tmp, &hlen64, sizeof hlen64);
    if (st == ZR_OK) {
        st = write_all(f, tmp, json, jlen);
    }
    for (size_t k = jlen; st == ZR_OK && k < hlen; k++) {
        st = write_all(f, tmp, " ", 1);
    }
    for (int i = 0; st == ZR_OK && i < n; i++) {
        const float *src = t[i].data;
        if (t[i].transpose) {
            /* [rows=out, cols=in] -> Conv1D [in, out] */
            for (int r = 0; r < t[i].rows; r++) {
                for (int c = 0; c < t[i].cols; c++) {
                    buf[(size_t)c * t[i].rows + r] = src[(size_t)r * t[i].cols + c];
                }
            }
            src = buf;
        }
        st = write_all(f, tmp, src, st_numel(&t[i]) * sizeof(float));
    }
    st = finish_tmp(f, tmp, path, st);
done:
    cJSON_free(json);
    zr_free(buf);
    zr_free(t);
    return st;
}
