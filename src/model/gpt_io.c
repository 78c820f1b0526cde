/*
 * gpt_io.c - GPT-2 parameters to and from files: llm.c's model file (read
 * and write) and a consolidated Hugging Face safetensors file (write, through
 * hf_write.c, which also writes whole Hugging Face folders; the read of a
 * Hugging Face folder is gpt_hf.c's).
 *
 * Both formats are whole-model files assembled from the per-unit buffers,
 * so a ZeRO run can hand over its gathered units without ever building one
 * flat parameter array, and a run can start from one unit at a time of an
 * llm.c file without ever holding the whole model. Files are written through
 * zr/file.h (temporary name, fsync, rename): a crash leaves either the old
 * file or the new one, never a torn one.
 */
#define _POSIX_C_SOURCE 200809L

#include "hf_write.h"
#include "zr/file.h"
#include "zr/model.h"

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

zr_status zr_gpt_write_safetensors(const char *path, const zr_gpt_config *cfg, float *const *units)
{
    zr_hf_tensor *t = NULL;
    int n = 0;
    ZR_CHECK(gpt2_only(cfg, path, "a safetensors file of GPT-2's names"));
    ZR_CHECK(zr_hf_gpt2_tensors(cfg, units, "", &t, &n));
    zr_status st = zr_hf_write_safetensors(path, NULL, t, n, ZR_HF_F32);
    zr_free(t);
    return st;
}
