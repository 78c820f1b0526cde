/*
 * test_gpt_io.c - llm.c model files (round trip to identical bytes, header
 * and size validation) and the safetensors export (header parsed with
 * cJSON, names, shapes, offsets, and the Conv1D transposes); weights that
 * are not numbers refused by every reader and writer (test_nonfinite).
 */
#define _POSIX_C_SOURCE 200809L

#include "test.h"
#include "zr/model.h"

#include <cJSON.h>
#include <unistd.h>

static char dir[256];
static const zr_gpt_config cfg = {16, 30, 32, 2, 2, 8};

typedef struct model_units {
    int n;
    float *p[8];
} model_units;

static void alloc_units(model_units *mu, uint64_t seed)
{
    zr_gpt m;
    TEST_OK(zr_gpt_init(&m, &cfg, 1, 4));
    mu->n = zr_gpt_unit_count(&m);
    zr_test_rng r = {seed};
    for (int u = 0; u < mu->n; u++) {
        size_t n = zr_gpt_unit_numel(&m, u);
        TEST_OK(zr_alloc_at((void **)&mu->p[u], n * sizeof(float), __FILE__, __LINE__));
        for (size_t j = 0; j < n; j++) {
            mu->p[u][j] = zr_test_rng_uniform(&r); /* every value distinct-ish */
        }
    }
    zr_gpt_free(&m);
}

static void free_units(model_units *mu)
{
    for (int u = 0; u < mu->n; u++) {
        zr_free(mu->p[u]);
    }
}

static long read_file(const char *path, unsigned char **out)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *out = malloc((size_t)n + 1);
    if (*out == NULL || fread(*out, 1, (size_t)n, f) != (size_t)n) {
        n = -1;
    }
    fclose(f);
    return n;
}

static void test_llmc_roundtrip(void)
{
    char p1[512], p2[512];
    snprintf(p1, sizeof p1, "%s/a.bin", dir);
    snprintf(p2, sizeof p2, "%s/b.bin", dir);
    model_units a, b;
    alloc_units(&a, 1);
    alloc_units(&b, 2);
    TEST_OK(zr_gpt_write_llmc(p1, &cfg, a.p));
    zr_gpt_config rc;
    TEST_OK(zr_gpt_read_llmc_config(p1, &rc));
    TEST_CHECK(memcmp(&rc, &cfg, sizeof rc) == 0);
    TEST_OK(zr_gpt_read_llmc(p1, &cfg, b.p));
    for (int u = 0; u < a.n; u++) {
        TEST_CHECK(memcmp(a.p[u], b.p[u], zr_gpt_config_unit_numel(&cfg, u) * 4) == 0);
    }
    TEST_OK(zr_gpt_write_llmc(p2, &cfg, b.p));
    unsigned char *x = NULL, *y = NULL;
    long nx = read_file(p1, &x), ny = read_file(p2, &y);
    TEST_EQ_INT(nx, 1024 + 4 * (long)zr_gpt_config_param_count(&cfg));
    TEST_CHECK(nx == ny && x != NULL && y != NULL && memcmp(x, y, (size_t)nx) == 0);

    /* llm.c order: the header, wte, wpe, then ln1w of layer 0, ln1w of layer 1, ... */
    const int32_t *h = (const int32_t *)x;
    TEST_EQ_INT(h[0], 20240326);
    TEST_EQ_INT(h[1], 3);
    TEST_EQ_INT(h[2], 16);
    TEST_EQ_INT(h[3], 30);
    TEST_EQ_INT(h[4], 2);
    TEST_EQ_INT(h[5], 2);
    TEST_EQ_INT(h[6], 8);
    TEST_EQ_INT(h[7], 32);
    const float *params = (const float *)(x + 1024);
    size_t u0 = zr_gpt_config_unit_numel(&cfg, 0);
    TEST_CHECK(memcmp(params, a.p[0], u0 * 4) == 0);
    TEST_CHECK(memcmp(params + u0, a.p[1], 8 * 4) == 0);     /* ln1w, layer 0 */
    TEST_CHECK(memcmp(params + u0 + 8, a.p[2], 8 * 4) == 0); /* ln1w, layer 1 */
    size_t total = zr_gpt_config_param_count(&cfg);
    TEST_CHECK(memcmp(params + total - 16, a.p[3], 16 * 4) == 0); /* lnfw, lnfb last */

    /* corrupt and truncated files */
    char p3[512];
    snprintf(p3, sizeof p3, "%s/bad.bin", dir);
    zr_test_write_file(p3, x, (size_t)nx - 4);
    TEST_FAILS(zr_gpt_read_llmc(p3, &cfg, b.p), ZR_ERR_FORMAT, "bad.bin: file has");
    zr_test_write_file(p3, x, 1000);
    TEST_FAILS(zr_gpt_read_llmc_config(p3, &rc), ZR_ERR_FORMAT, "bad.bin: truncated model header");
    int32_t *hm = (int32_t *)x;
    hm[0] = 20240520;
    zr_test_write_file(p3, x, (size_t)nx);
    TEST_FAILS(zr_gpt_read_llmc(p3, &cfg, b.p), ZR_ERR_FORMAT, "not an llm.c GPT-2 model file");
    hm[0] = 20240326;
    hm[1] = 5;
    zr_test_write_file(p3, x, (size_t)nx);
    TEST_FAILS(zr_gpt_read_llmc(p3, &cfg, b.p), ZR_ERR_FORMAT, "version 5 (bf16)");
    hm[1] = 3;
    hm[5] = 3; /* C = 8 not divisible by 3 heads */
    zr_test_write_file(p3, x, (size_t)nx);
    TEST_FAILS(zr_gpt_read_llmc(p3, &cfg, b.p), ZR_ERR_FORMAT, "bad model header");
    hm[5] = 2;
    hm[4] = 3; /* 3 layers: size no longer matches */
    zr_test_write_file(p3, x, (size_t)nx);
    TEST_FAILS(zr_gpt_read_llmc(p3, &cfg, b.p), ZR_ERR_FORMAT, "truncated or corrupt");
    zr_gpt_config other = cfg;
    other.max_t = 8;
    TEST_FAILS(zr_gpt_read_llmc(p1, &other, b.p), ZR_ERR_FORMAT, "expected maxT=8");
    TEST_FAILS(zr_gpt_read_llmc_config("/nonexistent.bin", &rc), ZR_ERR_IO, "nonexistent.bin");
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", p1);
    TEST_CHECK(access(tmp, F_OK) != 0);
    free(x);
    free(y);
    free_units(&a);
    free_units(&b);
}

/* One unit at a time (zr train --init): the same values as the whole-model read. */
static void test_llmc_unit(void)
{
    char p1[512], p3[512];
    snprintf(p1, sizeof p1, "%s/u.bin", dir);
    snprintf(p3, sizeof p3, "%s/hostile.bin", dir);
    model_units a;
    alloc_units(&a, 4);
    TEST_OK(zr_gpt_write_llmc(p1, &cfg, a.p));
    for (int u = 0; u < a.n; u++) {
        size_t n = zr_gpt_config_unit_numel(&cfg, u);
        float *buf = calloc(n, sizeof *buf);
        TEST_CHECK(buf != NULL);
        if (buf == NULL) {
            break;
        }
        TEST_OK(zr_gpt_read_llmc_unit(p1, &cfg, u, buf));
        TEST_CHECKF(memcmp(buf, a.p[u], n * 4) == 0, "unit %d differs", u);
        free(buf);
    }
    float one;
    TEST_FAILS(zr_gpt_read_llmc_unit(p1, &cfg, a.n, &one), ZR_ERR_INVALID, "unit 4 does not exist");
    zr_gpt_config other = cfg;
    other.layers = 3;
    TEST_FAILS(zr_gpt_read_llmc_unit(p1, &other, 0, &one), ZR_ERR_FORMAT, "expected maxT=16");
    /* not a regular file: refused before it is opened */
    zr_gpt_config rc;
    TEST_FAILS(zr_gpt_read_llmc_config(dir, &rc), ZR_ERR_INVALID, "is a directory");
    /* a header whose size would wrap around 64 bits is refused, not read (heads 2^16:
     * the largest head size the model accepts, 256, so the size check is what fails) */
    int32_t h[256] = {20240326, 3, 1 << 24, 1 << 24, 1 << 24, 1 << 16, 1 << 24, 1 << 24};
    zr_test_write_file(p3, h, sizeof h);
    TEST_FAILS(zr_gpt_read_llmc_config(p3, &rc), ZR_ERR_FORMAT, "larger than any file");
    free_units(&a);
}

/* Checks one safetensors entry; returns its data or NULL. */
static const float *st_entry(cJSON *root, const unsigned char *data, const char *name, int d0,
                             int d1)
{
    cJSON *e = cJSON_GetObjectItemCaseSensitive(root, name);
    TEST_CHECKF(e != NULL, "safetensors: no tensor %s", name);
    if (e == NULL) {
        return NULL;
    }
    cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    TEST_CHECK(cJSON_IsString(dt) && strcmp(dt->valuestring, "F32") == 0);
    cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    int nd = d1 > 0 ? 2 : 1;
    TEST_CHECKF(cJSON_GetArraySize(sh) == nd, "%s: rank %d", name, cJSON_GetArraySize(sh));
    TEST_EQ_INT(cJSON_GetArrayItem(sh, 0)->valuedouble, d0);
    if (nd == 2) {
        TEST_EQ_INT(cJSON_GetArrayItem(sh, 1)->valuedouble, d1);
    }
    cJSON *of = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    double begin = cJSON_GetArrayItem(of, 0)->valuedouble;
    double end = cJSON_GetArrayItem(of, 1)->valuedouble;
    TEST_EQ_INT(end - begin, 4.0 * d0 * (nd == 2 ? d1 : 1));
    return (const float *)(data + (size_t)begin);
}

static void test_safetensors(void)
{
    char p[512];
    snprintf(p, sizeof p, "%s/m.safetensors", dir);
    model_units a;
    alloc_units(&a, 3);
    TEST_OK(zr_gpt_write_safetensors(p, &cfg, a.p));
    unsigned char *x = NULL;
    long n = read_file(p, &x);
    TEST_CHECK(n > 8);
    uint64_t hlen;
    memcpy(&hlen, x, 8);
    TEST_EQ_INT(hlen % 8, 0);
    TEST_CHECK(8 + hlen < (uint64_t)n);
    cJSON *root = cJSON_ParseWithLength((const char *)x + 8, hlen);
    TEST_CHECK(root != NULL);
    if (root == NULL) {
        free(x);
        free_units(&a);
        return;
    }
    const unsigned char *data = x + 8 + hlen;
    int C = cfg.channels;
    /* every byte of the data section belongs to exactly one tensor */
    size_t covered = 0, ntensors = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, root)
    {
        if (strcmp(e->string, "__metadata__") == 0) {
            continue;
        }
        cJSON *of = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        covered += (size_t)(cJSON_GetArrayItem(of, 1)->valuedouble -
                            cJSON_GetArrayItem(of, 0)->valuedouble);
        ntensors++;
    }
    TEST_EQ_INT(ntensors, 4 + 12 * cfg.layers);
    TEST_EQ_INT(covered, (size_t)n - 8 - hlen);
    TEST_EQ_INT(covered,
                4 * (zr_gpt_config_param_count(&cfg) - (size_t)(cfg.padded_vocab - cfg.vocab) * C));

    const float *wte = st_entry(root, data, "wte.weight", cfg.vocab, C);
    TEST_CHECK(wte != NULL && memcmp(wte, a.p[0], (size_t)cfg.vocab * C * 4) == 0);
    const float *wpe = st_entry(root, data, "wpe.weight", cfg.max_t, C);
    TEST_CHECK(wpe != NULL &&
               memcmp(wpe, a.p[0] + (size_t)cfg.padded_vocab * C, (size_t)cfg.max_t * C * 4) == 0);
    /* Conv1D weights are [in, out]: element [i][o] = zr's [o][i] */
    zr_tensor_desc d[ZR_GPT_MAX_UNIT_TENSORS];
    zr_gpt_config_unit_tensors(&cfg, 2, d);
    const struct {
        const char *name;
        int idx, in, out;
    } mats[] = {{"h.1.attn.c_attn.weight", 2, C, 3 * C},
                {"h.1.attn.c_proj.weight", 4, C, C},
                {"h.1.mlp.c_fc.weight", 8, C, 4 * C},
                {"h.1.mlp.c_proj.weight", 10, 4 * C, C}};
    for (int k = 0; k < 4; k++) {
        const float *w = st_entry(root, data, mats[k].name, mats[k].in, mats[k].out);
        const float *src = a.p[2] + d[mats[k].idx].offset;
        int ok = w != NULL;
        for (int i = 0; ok && i < mats[k].in; i++) {
            for (int o = 0; o < mats[k].out; o++) {
                ok &= w[(size_t)i * mats[k].out + o] == src[(size_t)o * mats[k].in + i];
            }
        }
        TEST_CHECKF(ok, "%s is not the transpose of zr's [out, in]", mats[k].name);
    }
    const float *b = st_entry(root, data, "h.1.attn.c_attn.bias", 3 * C, 0);
    TEST_CHECK(b != NULL && memcmp(b, a.p[2] + d[3].offset, 3 * C * 4) == 0);
    const float *ln = st_entry(root, data, "h.0.ln_2.weight", C, 0);
    zr_gpt_config_unit_tensors(&cfg, 1, d);
    TEST_CHECK(ln != NULL && memcmp(ln, a.p[1] + d[6].offset, C * 4) == 0);
    const float *lnfb = st_entry(root, data, "ln_f.bias", C, 0);
    TEST_CHECK(lnfb != NULL && memcmp(lnfb, a.p[3] + C, C * 4) == 0);
    cJSON_Delete(root);
    free(x);
    free_units(&a);
}

/*
 * Weights that are not numbers: a model file holding one is refused as it
 * is read (whole, or the unit that holds it), naming the file, the tensor
 * and the element; the writers refuse to put one in a file, and leave none.
 */
static void test_nonfinite(void)
{
    char p[512], out[512];
    snprintf(p, sizeof p, "%s/nan.bin", dir);
    model_units a, b;
    alloc_units(&a, 3);
    alloc_units(&b, 4);
    TEST_OK(zr_gpt_write_llmc(p, &cfg, a.p));
    /* llm.c order: wte (256), wpe (128), ln1w and ln1b of both layers (8 each), qkvw of layer 0
       (192), then qkvw of layer 1: its element 5 */
    FILE *f = fopen(p, "r+b");
    float nan_value = NAN;
    TEST_CHECK(f != NULL && fseek(f, 1024 + 4 * (256 + 128 + 32 + 192 + 5), SEEK_SET) == 0 &&
               fwrite(&nan_value, sizeof nan_value, 1, f) == 1);
    if (f != NULL) {
        fclose(f);
    }
    TEST_FAILS(zr_gpt_read_llmc(p, &cfg, b.p), ZR_ERR_FORMAT,
               "nan.bin holds a non-finite weight (nan) in qkvw of layer 1 (unit 2), element 5");
    TEST_FAILS(zr_gpt_read_llmc_unit(p, &cfg, 2, b.p[2]), ZR_ERR_FORMAT,
               "qkvw of layer 1 (unit 2), element 5");
    TEST_OK(zr_gpt_read_llmc_unit(p, &cfg, 1, b.p[1])); /* layer 0 is sound */
    /* the last unit: lnfw (8), lnfb (8) */
    a.p[3][12] = INFINITY;
    snprintf(out, sizeof out, "%s/inf.bin", dir);
    TEST_FAILS(zr_gpt_write_llmc(out, &cfg, a.p), ZR_ERR_INVALID,
               "inf.bin would hold a non-finite weight (inf) in lnfb (unit 3), element 4");
    TEST_CHECK(access(out, F_OK) != 0);
    snprintf(out, sizeof out, "%s/inf.safetensors", dir);
    TEST_FAILS(zr_gpt_write_safetensors(out, &cfg, a.p), ZR_ERR_INVALID,
               "inf.safetensors would hold a non-finite weight (inf) in ln_f.bias, element 4");
    TEST_CHECK(access(out, F_OK) != 0);
    free_units(&a);
    free_units(&b);
    zr_error_clear();
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/zr_test_gpt_io_%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    if (system(cmd) != 0) {
        return 1;
    }
    TEST_RUN(test_llmc_roundtrip);
    TEST_RUN(test_llmc_unit);
    TEST_RUN(test_safetensors);
    TEST_RUN(test_nonfinite);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "cannot remove %s\n", dir);
    }
    return zr_test_finish();
}
