/*
 * gpt_io.c - GPT-2 parameters to and from files: llm.c's model file (read
 * and write) and a consolidated Hugging Face safetensors file (write; the
 * read of a Hugging Face folder is gpt_hf.c's).
 *
 * Both formats are whole-model files assembled from the per-unit buffers,
 * so a ZeRO run can hand over its gathered units without ever building one
 * flat parameter array, and a run can start from one unit at a time of an
 * llm.c file without ever holding the whole model. Files are written through
 * zr/file.h (temporary name, fsync, rename): a crash leaves either the old
 * file or the new one, never a torn one.
 */
#define _POSIX_C_SOURCE 200809L

#include "zr/model.h"
#include "zr/file.h"

#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#define ZR_LLMC_HEADER_INTS 256

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
 * tensor stacked over layers, then lnfw, lnfb), calling fn with the unit it
 * belongs to, its offset in that unit and its size (floats).
 */
typedef zr_status (*tensor_fn)(void *ctx, int u, size_t offset, size_t numel);

static zr_status llmc_walk(const zr_gpt_config *cfg, tensor_fn fn, void *ctx)
{
    zr_tensor_desc d[ZR_GPT_MAX_UNIT_TENSORS];
    int L = cfg->layers;
    int n = zr_gpt_config_unit_tensors(cfg, 0, d);
    for (int i = 0; i < n; i++) {
        ZR_CHECK(fn(ctx, 0, d[i].offset, d[i].numel));
    }
    n = zr_gpt_config_unit_tensors(cfg, 1, d);
    for (int i = 0; i < n; i++) {
        for (int l = 0; l < L; l++) {
            ZR_CHECK(fn(ctx, 1 + l, d[i].offset, d[i].numel));
        }
    }
    n = zr_gpt_config_unit_tensors(cfg, L + 1, d);
    for (int i = 0; i < n; i++) {
        ZR_CHECK(fn(ctx, L + 1, d[i].offset, d[i].numel));
    }
    return ZR_OK;
}

typedef struct io_ctx {
    zr_file_tmp *out; /* writing */
    FILE *in;         /* reading */
    const char *path;
    const zr_gpt_config *cfg;
    float *const *units; /* every unit (write, read all) */
    int only;            /* read only this unit (-1: all) */
    float *dst;          /* its buffer */
    long long pos;       /* file offset of the tensor being visited */
} io_ctx;

/* Elements read (and checked while in cache) at once: 256 KiB. */
#define IO_CHUNK ((size_t)1 << 16)

/*
 * x (n elements of unit u from element at) is finite, or the error names the
 * file, the tensor and the element: weights that are not numbers train
 * nothing, and a file holding them was damaged or came from a diverged run.
 */
static zr_status check_finite(const zr_gpt_config *cfg, const char *path, const char *verb, int u,
                              size_t at, const float *x, size_t n)
{
    size_t i = zr_first_nonfinite(x, n);
    if (i < n) {
        char where[160];
        zr_gpt_config_element_name(cfg, u, at + i, where, sizeof where);
        /* a file read is malformed; weights to write are a caller's bad argument */
        ZR_FAIL(strcmp(verb, "holds") == 0 ? ZR_ERR_FORMAT : ZR_ERR_INVALID,
                "%s %s a non-finite weight (%g) in %s: the weights are damaged or come from a "
                "diverged run",
                path, verb, (double)x[i], where);
    }
    return ZR_OK;
}

static zr_status write_tensor(void *ctx, int u, size_t offset, size_t numel)
{
    io_ctx *c = ctx;
    const float *x = c->units[u] + offset;
    for (size_t a = 0; a < numel; a += IO_CHUNK) {
        size_t n = numel - a < IO_CHUNK ? numel - a : IO_CHUNK;
        ZR_CHECK(check_finite(c->cfg, c->path, "would hold", u, offset + a, x + a, n));
        ZR_CHECK(zr_file_tmp_write(c->out, x + a, n * sizeof(float)));
    }
    return ZR_OK;
}

static zr_status read_tensor(void *ctx, int u, size_t offset, size_t numel)
{
    io_ctx *c = ctx;
    long long at = c->pos;
    c->pos += (long long)(numel * sizeof(float));
    if (c->only >= 0 && u != c->only) {
        return ZR_OK;
    }
    float *dst = c->only >= 0 ? c->dst + offset : c->units[u] + offset;
    /* reading one unit skips the other units' tensors, which lie in between */
    if (c->only >= 0 && fseeko(c->in, (off_t)at, SEEK_SET) != 0) {
        ZR_FAIL(ZR_ERR_IO, "cannot seek in %s: %s", c->path, strerror(errno));
    }
    /* each piece checked as it arrives, while it is in cache: no second pass */
    for (size_t a = 0; a < numel; a += IO_CHUNK) {
        size_t n = numel - a < IO_CHUNK ? numel - a : IO_CHUNK;
        if (fread(dst + a, sizeof *dst, n, c->in) != n) {
            ZR_FAIL(ZR_ERR_FORMAT, "%s: truncated while reading parameters", c->path);
        }
        ZR_CHECK(check_finite(c->cfg, c->path, "holds", u, offset + a, dst + a, n));
    }
    return ZR_OK;
}

/* llm.c's file and the GPT-2 names hold a GPT-2 only. */
static zr_status gpt2_only(const zr_gpt_config *cfg, const char *path, const char *format)
{
    ZR_CHECK(zr_gpt_config_check(cfg));
    if (cfg->arch != ZR_ARCH_GPT2) {
        ZR_FAIL(ZR_ERR_INVALID,
                "%s: %s holds a GPT-2 only, and this model is of the Llama family: export it as a "
                "Hugging Face folder (zr export --hf DIR)",
                path, format);
    }
    return ZR_OK;
}

zr_status zr_gpt_write_llmc(const char *path, const zr_gpt_config *cfg, float *const *units)
{
    ZR_CHECK(gpt2_only(cfg, path, "llm.c's model file"));
    zr_file_tmp t;
    ZR_CHECK(zr_file_tmp_open(&t, path));
    int32_t h[ZR_LLMC_HEADER_INTS];
    llmc_header(cfg, h);
    io_ctx c = {.out = &t, .path = path, .cfg = cfg, .units = units, .only = -1};
    zr_status st;
    ZR_CHECK_GOTO(zr_file_tmp_write(&t, h, sizeof h), st, done);
    st = llmc_walk(cfg, write_tensor, &c);
done:
    return zr_file_tmp_commit(&t, st); /* removes the temporary file when st is an error */
}

/*
 * Bytes of a model file for header values that passed zr_gpt_config_check
 * (each up to 2^24, so the products are computed in double first: a hostile
 * header must not wrap around to the file's real size). 0 if absurd.
 */
static size_t llmc_bytes(const zr_gpt_config *c)
{
    double C = c->channels, L = c->layers;
    double n = ((double)c->padded_vocab + c->max_t) * C + L * (12.0 * C * C + 13.0 * C) + 2.0 * C;
    if (n * sizeof(float) > 1e18) {
        return 0;
    }
    return ZR_LLMC_HEADER_INTS * sizeof(int32_t) + zr_gpt_config_param_count(c) * sizeof(float);
}

/* Opens path and validates header and size; on success *f is positioned at the parameters. */
static zr_status llmc_open(const char *path, zr_gpt_config *cfg, FILE **out)
{
    FILE *f;
    ZR_CHECK(zr_file_open_read(path, &f));
    zr_status st = ZR_OK;
    struct stat sb;
    int32_t h[ZR_LLMC_HEADER_INTS];
    if (fstat(fileno(f), &sb) != 0) {
        ZR_FAIL_GOTO(st, fail, ZR_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
    }
    size_t size = (size_t)sb.st_size;
    if (size < sizeof h || fread(h, sizeof h, 1, f) != 1) {
        ZR_FAIL_GOTO(st, fail, ZR_ERR_FORMAT, "%s: truncated model header (%zu bytes, need %zu)",
                     path, size, sizeof h);
    }
    if (h[0] != ZR_LLMC_MODEL_MAGIC) {
        ZR_FAIL_GOTO(st, fail, ZR_ERR_FORMAT,
                     "%s: not an llm.c GPT-2 model file: magic %d, expected %d", path, h[0],
                     ZR_LLMC_MODEL_MAGIC);
    }
    if (h[1] != ZR_LLMC_MODEL_VERSION_FP32) {
        ZR_FAIL_GOTO(st, fail, ZR_ERR_FORMAT,
                     "%s: model file version %d%s; only version %d (fp32) is supported", path, h[1],
                     h[1] == 5 ? " (bf16)" : "", ZR_LLMC_MODEL_VERSION_FP32);
    }
    zr_gpt_config c = {.max_t = h[2],
                       .vocab = h[3],
                       .layers = h[4],
                       .heads = h[5],
                       .channels = h[6],
                       .padded_vocab = h[7]};
    if (zr_gpt_config_check(&c) != ZR_OK) {
        ZR_FAIL_GOTO(st, fail, ZR_ERR_FORMAT, "%s: bad model header: %s", path, zr_error_message());
    }
    size_t want = llmc_bytes(&c);
    if (want == 0) {
        ZR_FAIL_GOTO(st, fail, ZR_ERR_FORMAT,
                     "%s: bad model header: L=%d C=%d Vp=%d maxT=%d describe a model larger "
                     "than any file",
                     path, c.layers, c.channels, c.padded_vocab, c.max_t);
    }
    if (size != want) {
        ZR_FAIL_GOTO(st, fail, ZR_ERR_FORMAT,
                     "%s: file has %zu bytes, the header (L=%d C=%d Vp=%d maxT=%d) needs %zu "
                     "(truncated or corrupt)",
                     path, size, c.layers, c.channels, c.padded_vocab, c.max_t, want);
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

/* Opens path, whose header must match cfg. */
static zr_status llmc_open_as(const char *path, const zr_gpt_config *cfg, FILE **f)
{
    zr_gpt_config fc;
    ZR_CHECK(llmc_open(path, &fc, f));
    if (!zr_gpt_config_equal(&fc, cfg)) {
        fclose(*f);
        *f = NULL;
        ZR_FAIL(ZR_ERR_FORMAT,
                "%s: model is maxT=%d V=%d Vp=%d L=%d NH=%d C=%d, expected maxT=%d V=%d Vp=%d "
                "L=%d NH=%d C=%d",
                path, fc.max_t, fc.vocab, fc.padded_vocab, fc.layers, fc.heads, fc.channels,
                cfg->max_t, cfg->vocab, cfg->padded_vocab, cfg->layers, cfg->heads, cfg->channels);
    }
    return ZR_OK;
}

zr_status zr_gpt_read_llmc(const char *path, const zr_gpt_config *cfg, float *const *units)
{
    FILE *f;
    ZR_CHECK(llmc_open_as(path, cfg, &f));
    io_ctx c = {.in = f, .path = path, .cfg = cfg, .units = units, .only = -1};
    zr_status st = llmc_walk(cfg, read_tensor, &c);
    fclose(f);
    return st;
}

zr_status zr_gpt_read_llmc_unit(const char *path, const zr_gpt_config *cfg, int u, float *out)
{
    if (u < 0 || u >= zr_gpt_config_unit_count(cfg)) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: unit %d does not exist (the model has %d)", path, u,
                zr_gpt_config_unit_count(cfg));
    }
    FILE *f;
    ZR_CHECK(llmc_open_as(path, cfg, &f));
    io_ctx c = {.in = f,
                .path = path,
                .cfg = cfg,
                .only = u,
                .dst = out,
                .pos = ZR_LLMC_HEADER_INTS * (long long)sizeof(int32_t)};
    zr_status st = llmc_walk(cfg, read_tensor, &c);
    fclose(f);
    return st;
}

/* ---- safetensors ------------------------------------------------------------ */

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
            x->transpose = zr_gpt_config_hf_name(cfg, 1 + l, i, x->name, sizeof x->name) == 1;
            x->data = units[1 + l] + d[i].offset;
            x->rows = d[i].shape[0];
            x->cols = d[i].ndim == 2 ? d[i].shape[1] : 0;
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

/* Tensor t holds only numbers: a file must never carry weights that train nothing. */
static zr_status st_finite(const st_tensor *t, const char *path)
{
    size_t bad = zr_first_nonfinite(t->data, st_numel(t));
    if (bad < st_numel(t)) {
        ZR_FAIL(ZR_ERR_INVALID,
                "%s would hold a non-finite weight (%g) in %s, element %zu: the weights are "
                "damaged or come from a diverged run",
                path, (double)t->data[bad], t->name, bad);
    }
    return ZR_OK;
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

zr_status zr_gpt_write_safetensors(const char *path, const zr_gpt_config *cfg, float *const *units)
{
    ZR_CHECK(gpt2_only(cfg, path, "a safetensors file of GPT-2's names"));
    int count = 4 + ZR_GPT_BLOCK_TENSORS * cfg->layers;
    st_tensor *t;
    ZR_ALLOC(t, (size_t)count);
    int n = st_tensors(cfg, units, t);
    ZR_ASSERT(n == count);
    zr_status st = ZR_OK;
    char *json = NULL;
    float *buf = NULL;
    zr_file_tmp f;
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
    ZR_ALLOC_GOTO(buf, maxnumel, st, done);
    ZR_CHECK_GOTO(zr_file_tmp_open(&f, path), st, done);
    /* safetensors is little-endian; so are the machines zr runs on */
    st = zr_file_tmp_write(&f, &hlen64, sizeof hlen64);
    if (st == ZR_OK) {
        st = zr_file_tmp_write(&f, json, jlen);
    }
    for (size_t k = jlen; st == ZR_OK && k < hlen; k++) {
        st = zr_file_tmp_write(&f, " ", 1);
    }
    for (int i = 0; st == ZR_OK && i < n; i++) {
        const float *src = t[i].data;
        st = st_finite(&t[i], path);
        if (st == ZR_OK && t[i].transpose) {
            /* [rows=out, cols=in] -> Conv1D [in, out] */
            for (int r = 0; r < t[i].rows; r++) {
                for (int c = 0; c < t[i].cols; c++) {
                    buf[(size_t)c * t[i].rows + r] = src[(size_t)r * t[i].cols + c];
                }
            }
            src = buf;
        }
        if (st == ZR_OK) {
            st = zr_file_tmp_write(&f, src, st_numel(&t[i]) * sizeof(float));
        }
    }
    st = zr_file_tmp_commit(&f, st);
done:
    cJSON_free(json);
    zr_free(buf);
    zr_free(t);
    return st;
}
