/*
 * test_hf_write.c - Hugging Face folders written (src/model/hf_write.h,
 * issue 43): F32, BF16 and F16 rounded to nearest even (ties, subnormals,
 * F16's range), GPT-2's folder read back with zr's own safetensors and
 * config.json readers (bit for bit in F32, each value its dtype's rounding
 * otherwise, Conv1D transposed, wte cut to V), shards and their index, the
 * three Llama reference folders of tests/data/hf read, written and read
 * again unchanged, and refusals that leave nothing behind: an existing
 * folder, a value F16 cannot hold, a NaN.
 *
 * With --gpt2-probs MODEL.bin OUT.f32 it is the zr side of `make check-hf`
 * (scripts/check_hf.sh): the next-token probabilities of an llm.c model file
 * on fixed tokens (B 2 x T 16, token i = (i * 7919 + 13) % V), then the mean
 * cross-entropy of predicting token i + 1, as raw fp32 values. With
 * --llama-copy SRC DST DTYPE it reads the Llama-family folder SRC into zr's
 * units and writes them as the folder DST (check-hf loads DST in
 * transformers and compares its logits with SRC's reference).
 */
#define _DEFAULT_SOURCE /* mkdtemp */
#include "test.h"

#include "../src/model/hf_config.h"   /* internal to src/model */
#include "../src/model/hf_write.h"    /* internal to src/model */
#include "../src/model/safetensors.h" /* internal to src/model */
#include "zr/file.h"
#include "zr/llama.h"
#include "zr/model.h"

#include <cJSON.h>
#include <dirent.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];

static const char *hf_data(void)
{
    const char *r = getenv("ZR_HF_DATA");
    return r != NULL ? r : "tests/data/hf";
}

/* ---- rounding ------------------------------------------------------------------------ */

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static double f16_value(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? INFINITY : ldexp(1024 + m, e - 25);
    return h & 0x8000 ? -v : v;
}

static double bf16_value(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

static void test_rounding(void)
{
    int over = 0;
    /* bf16: ties go to the even neighbour, anything past the tie away from it */
    TEST_EQ_INT(zr_hf_bf16_from_f32(1.0f + 0x1p-8f), 0x3f80);
    TEST_EQ_INT(zr_hf_bf16_from_f32(1.0f + 3 * 0x1p-8f), 0x3f82);
    TEST_EQ_INT(zr_hf_bf16_from_f32(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    TEST_EQ_INT(zr_hf_bf16_from_f32(-2.0f), 0xc000);
    /* f16: ties, the largest value, the range's end, subnormals */
    TEST_EQ_INT(zr_hf_f16_from_f32(1.0f + 0x1p-11f, &over), 0x3c00);
    TEST_EQ_INT(zr_hf_f16_from_f32(1.0f + 3 * 0x1p-11f, &over), 0x3c02);
    TEST_EQ_INT(zr_hf_f16_from_f32(65504.0f, &over), 0x7bff);
    TEST_EQ_INT(over, 0);
    TEST_EQ_INT(zr_hf_f16_from_f32(65519.99f, &over), 0x7bff);
    TEST_EQ_INT(over, 0);
    zr_hf_f16_from_f32(-65520.0f, &over);
    TEST_EQ_INT(over, 1);
    TEST_EQ_INT(zr_hf_f16_from_f32(0x1p-14f, &over), 0x0400);
    TEST_EQ_INT(zr_hf_f16_from_f32(0x1p-24f, &over), 0x0001);
    TEST_EQ_INT(zr_hf_f16_from_f32(0x1p-25f, &over), 0x0000);
    TEST_EQ_INT(zr_hf_f16_from_f32(0x1p-25f + 0x1p-40f, &over), 0x0001);
    TEST_EQ_INT(zr_hf_f16_from_f32(3 * 0x1p-25f, &over), 0x0002);
    TEST_EQ_INT(zr_hf_f16_from_f32(-0x1p-30f, &over), 0x8000);
    /* every other value: the nearest of the two neighbours (the even one on a tie) */
    zr_test_rng r = {12345};
    int bad = 0;
    for (int i = 0; i < 200000; i++) {
        float x = bits_f32((uint32_t)(zr_test_rng_next(&r) >> 32));
        if (!isfinite(x) || fabsf(x) >= 65520.0f) {
            continue;
        }
        uint16_t h = zr_hf_f16_from_f32(x, &over), b = zr_hf_bf16_from_f32(x);
        double dh = fabs(f16_value(h) - x), db = fabs(bf16_value(b) - x);
        uint16_t hs[2] = {(uint16_t)(h - 1), (uint16_t)(h + 1)}, bs[2] = {hs[0], hs[1]};
        bs[0] = (uint16_t)(b - 1);
        bs[1] = (uint16_t)(b + 1);
        for (int k = 0; k < 2; k++) {
            double oh = fabs(f16_value(hs[k]) - x), ob = fabs(bf16_value(bs[k]) - x);
            bad += (h & 0x7fff) != 0 && (oh < dh || (oh == dh && (h & 1)));
            bad +=
                (b & 0x7fff) != 0 && (b & 0x7f80) != 0x7f80 && (ob < db || (ob == db && (b & 1)));
        }
    }
    TEST_EQ_INT(bad, 0);
}

/* ---- GPT-2 ----------------------------------------------------------------------------- */

static const zr_gpt_config gcfg = {
    .max_t = 64, .vocab = 100, .padded_vocab = 128, .layers = 2, .heads = 4, .channels = 32};

typedef struct units {
    int n;
    float *p[8];
} units;

static void units_make(units *u, const zr_gpt_config *cfg, uint64_t seed)
{
    u->n = zr_gpt_config_unit_count(cfg);
    for (int i = 0; i < u->n; i++) {
        u->p[i] = malloc(zr_gpt_config_unit_numel(cfg, i) * sizeof(float));
        TEST_CHECK(u->p[i] != NULL);
        zr_gpt_config_unit_init(cfg, i, u->p[i], seed);
    }
}

static void units_free(units *u)
{
    for (int i = 0; i < u->n; i++) {
        free(u->p[i]);
    }
}

/* What t should read back as in dtype d: element i as written (transposed or not). */
static float expected(const zr_hf_tensor *t, size_t i, zr_hf_dtype d)
{
    size_t r = t->transpose ? i % (size_t)t->rows : i / (size_t)t->cols;
    size_t c = t->transpose ? i / (size_t)t->rows : i % (size_t)t->cols;
    float x = t->data[r * (size_t)t->cols + c];
    int over;
    return d == ZR_HF_F32    ? x
           : d == ZR_HF_BF16 ? (float)bf16_value(zr_hf_bf16_from_f32(x))
                             : (float)f16_value(zr_hf_f16_from_f32(x, &over));
}

/* Tensor t in the open file s: its shape as written and every value as expected. */
static void check_tensor(const zr_safetensors *s, const zr_hf_tensor *t, zr_hf_dtype d)
{
    const zr_safetensors_tensor *f = zr_safetensors_find(s, t->name);
    TEST_CHECKF(f != NULL, "%s: no %s", s->path, t->name);
    if (f == NULL) {
        return;
    }
    static const char *const names[] = {"F32", "BF16", "F16"};
    TEST_CHECKF(strcmp(f->dtype, names[d]) == 0, "%s: %s is %s", s->path, t->name, f->dtype);
    TEST_EQ_INT(f->ndim, t->ndim);
    TEST_EQ_INT(f->shape[0], t->transpose ? t->cols : t->rows);
    if (t->ndim == 2) {
        TEST_EQ_INT(f->shape[1], t->transpose ? t->rows : t->cols);
    }
    float *got = malloc(f->numel * sizeof *got);
    TEST_CHECK(got != NULL && f->numel == (size_t)t->rows * (size_t)t->cols);
    if (got != NULL && f->numel == (size_t)t->rows * (size_t)t->cols) {
        TEST_OK(zr_safetensors_read_f32(s, f, got));
        size_t bad = 0;
        for (size_t i = 0; i < f->numel; i++) {
            float e = expected(t, i, d);
            bad += memcmp(&got[i], &e, sizeof e) != 0;
        }
        TEST_CHECKF(bad == 0, "%s: %zu values of %s differ", s->path, bad, t->name);
    }
    free(got);
}

/* The file's header holds __metadata__ {"format": "pt"}, and t[0..n) in that order. */
static void check_header(const char *path, const zr_hf_tensor *t, int n)
{
    zr_safetensors s = {0};
    TEST_OK(zr_safetensors_open(&s, path));
    TEST_EQ_INT(s.count, n);
    for (int i = 0; i < n && i < s.count; i++) {
        TEST_CHECKF(strcmp(s.tensors[i].name, t[i].name) == 0, "%s: tensor %d is %s, not %s", path,
                    i, s.tensors[i].name, t[i].name);
    }
    zr_safetensors_close(&s);
    FILE *f = fopen(path, "rb");
    uint64_t len = 0;
    char buf[8192] = {0};
    TEST_CHECK(f != NULL && fread(&len, 8, 1, f) == 1 && len < sizeof buf &&
               fread(buf, 1, len, f) == len);
    if (f != NULL) {
        fclose(f);
    }
    cJSON *h = cJSON_Parse(buf);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(h, "__metadata__");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(m, "format");
    TEST_CHECK(cJSON_IsString(fmt) && strcmp(fmt->valuestring, "pt") == 0);
    TEST_EQ_INT(len % 8, 0);
    cJSON_Delete(h);
}

static void gpt2_folder(zr_hf_dtype d, const char *name)
{
    units u;
    units_make(&u, &gcfg, 7);
    char out[512], file[600];
    snprintf(out, sizeof out, "%s/%s", dir, name);
    zr_hf_write_opts o = {.dtype = d};
    TEST_OK(zr_hf_write_gpt2(out, &gcfg, u.p, &o));
    zr_hf_tensor *t = NULL;
    int n = 0;
    TEST_OK(zr_hf_gpt2_tensors(&gcfg, u.p, "transformer.", &t, &n));
    TEST_EQ_INT(n, 4 + 12 * gcfg.layers);
    snprintf(file, sizeof file, "%s/model.safetensors", out);
    check_header(file, t, n);
    zr_safetensors s = {0};
    TEST_OK(zr_safetensors_open(&s, file));
    for (int i = 0; i < n; i++) {
        check_tensor(&s, &t[i], d);
    }
    TEST_CHECK(zr_safetensors_find(&s, "lm_head.weight") == NULL); /* tied */
    const zr_safetensors_tensor *wte = zr_safetensors_find(&s, "transformer.wte.weight");
    TEST_CHECK(wte != NULL && wte->shape[0] == gcfg.vocab);
    zr_safetensors_close(&s);
    /* config.json says the model: zr's own reader agrees */
    zr_hf_config c;
    TEST_OK(zr_hf_config_read(&c, out));
    TEST_EQ_INT(c.family, ZR_HF_GPT2);
    TEST_CHECK(c.vocab == gcfg.vocab && c.hidden == gcfg.channels && c.layers == gcfg.layers);
    TEST_CHECK(c.heads == gcfg.heads && c.max_pos == gcfg.max_t && c.tied == 1);
    TEST_CHECK(c.intermediate == 4 * gcfg.channels && c.norm_eps == 1e-5);
    zr_free(t);
    units_free(&u);
}

static void test_gpt2_f32(void)
{
    gpt2_folder(ZR_HF_F32, "gpt2_f32");
}

static void test_gpt2_bf16_f16(void)
{
    gpt2_folder(ZR_HF_BF16, "gpt2_bf16");
    gpt2_folder(ZR_HF_F16, "gpt2_f16");
}

/* Small shards: N files named k-of-N, an index whose map and total agree with them. */
static void test_shards(void)
{
    units u;
    units_make(&u, &gcfg, 11);
    char out[512], file[700];
    snprintf(out, sizeof out, "%s/sharded", dir);
    const uint64_t max = 20000;
    zr_hf_write_opts o = {.dtype = ZR_HF_BF16, .max_shard_bytes = max};
    TEST_OK(zr_hf_write_gpt2(out, &gcfg, u.p, &o));
    zr_hf_tensor *t = NULL;
    int n = 0;
    TEST_OK(zr_hf_gpt2_tensors(&gcfg, u.p, "transformer.", &t, &n));
    snprintf(file, sizeof file, "%s/model.safetensors.index.json", out);
    char *text = NULL;
    size_t len = 0;
    TEST_OK(zr_file_read_all(file, &text, &len));
    cJSON *idx = cJSON_Parse(text);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(idx, "weight_map");
    const cJSON *total = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(idx, "metadata"), "total_size");
    TEST_EQ_INT(cJSON_GetArraySize(map), n);
    double sum = 0;
    int shards = 0;
    for (int i = 0; i < n; i++) {
        sum += 2.0 * t[i].rows * t[i].cols;
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(map, t[i].name);
        int k = 0, of = 0;
        TEST_CHECK(cJSON_IsString(f) &&
                   sscanf(f->valuestring, "model-%5d-of-%5d.safetensors", &k, &of) == 2);
        TEST_CHECKF(k >= 1 && k <= of && (shards == 0 || of == shards), "%s", f->valuestring);
        shards = of;
        snprintf(file, sizeof file, "%s/%s", out, f->valuestring);
        zr_safetensors s = {0};
        TEST_OK(zr_safetensors_open(&s, file));
        check_tensor(&s, &t[i], ZR_HF_BF16);
        /* no shard past the size, unless one tensor alone is */
        TEST_CHECK(s.size - s.data0 <= max || s.count == 1);
        zr_safetensors_close(&s);
    }
    TEST_CHECK(cJSON_IsNumber(total) && total->valuedouble == sum);
    TEST_CHECK(shards > 2);
    /* the folder holds config.json, the index and exactly the shards */
    int files = 0;
    DIR *d = opendir(out);
    for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;) {
        files += e->d_name[0] != '.';
    }
    if (d != NULL) {
        closedir(d);
    }
    TEST_EQ_INT(files, shards + 2);
    printf("  %d tensors in %d shards of at most %llu bytes\n", n, shards, (unsigned long long)max);
    cJSON_Delete(idx);
    zr_free(text);
    zr_free(t);
    units_free(&u);
}

/* Entries of dir whose name starts with prefix (a temporary folder left behind). */
static int leftovers(const char *prefix)
{
    int k = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;) {
        k += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    }
    if (d != NULL) {
        closedir(d);
    }
    return k;
}

static void test_refusals(void)
{
    units u;
    units_make(&u, &gcfg, 3);
    char out[512];
    zr_hf_write_opts o = {.dtype = ZR_HF_F16};
    /* an existing folder, empty or not, and a file: refused by name, untouched */
    snprintf(out, sizeof out, "%s/exists", dir);
    TEST_CHECK(mkdir(out, 0755) == 0);
    TEST_FAILS(zr_hf_write_gpt2(out, &gcfg, u.p, &o), ZR_ERR_INVALID, "exists already exists");
    snprintf(out, sizeof out, "%s/exists/", dir);
    TEST_FAILS(zr_hf_write_gpt2(out, &gcfg, u.p, &o), ZR_ERR_INVALID, "already exists");
    snprintf(out, sizeof out, "%s/afile", dir);
    zr_test_write_file(out, "keep", 4);
    TEST_FAILS(zr_hf_write_gpt2(out, &gcfg, u.p, &o), ZR_ERR_INVALID, "afile already exists");
    struct stat sb;
    TEST_CHECK(stat(out, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size == 4);
    /* a value F16 cannot hold: named, nothing written, nothing left beside */
    const int L = gcfg.layers;
    zr_tensor_desc d[ZR_GPT_MAX_UNIT_TENSORS];
    zr_gpt_config_unit_tensors(&gcfg, L + 1, d);
    u.p[L + 1][d[0].offset + 5] = 70000.0f;
    snprintf(out, sizeof out, "%s/big", dir);
    TEST_FAILS(zr_hf_write_gpt2(out, &gcfg, u.p, &o), ZR_ERR_INVALID,
               "transformer.ln_f.weight element 5 (70000) is out of F16's range");
    TEST_CHECK(stat(out, &sb) != 0);
    TEST_EQ_INT(leftovers("big"), 0);
    o.dtype = ZR_HF_BF16; /* BF16 holds it */
    TEST_OK(zr_hf_write_gpt2(out, &gcfg, u.p, &o));
    /* and not a float past its largest value (which would round to its infinity) */
    u.p[L + 1][d[0].offset + 5] = -3.4e38f;
    snprintf(out, sizeof out, "%s/bigbf", dir);
    TEST_FAILS(zr_hf_write_gpt2(out, &gcfg, u.p, &o), ZR_ERR_INVALID,
               "element 5 (-3.4e+38) is out of BF16's range");
    TEST_EQ_INT(leftovers("bigbf"), 0);
    /* a NaN, in any dtype */
    u.p[L + 1][d[0].offset + 5] = NAN;
    o.dtype = ZR_HF_F32;
    snprintf(out, sizeof out, "%s/nan", dir);
    TEST_FAILS(zr_hf_write_gpt2(out, &gcfg, u.p, &o), ZR_ERR_INVALID,
               "would hold a non-finite weight (nan) in transformer.ln_f.weight, element 5");
    TEST_EQ_INT(leftovers("nan"), 0);
    /* the options' spellings */
    zr_hf_dtype dt;
    uint64_t size = 0;
    TEST_OK(zr_hf_dtype_parse("bfloat16", &dt));
    TEST_EQ_INT(dt, ZR_HF_BF16);
    TEST_FAILS(zr_hf_dtype_parse("fp8", &dt), ZR_ERR_INVALID, "\"fp8\"");
    TEST_OK(zr_hf_size_parse("5GB", &size));
    TEST_CHECK(size == 5000000000ull);
    TEST_OK(zr_hf_size_parse("200MiB", &size));
    TEST_CHECK(size == 200ull << 20);
    TEST_FAILS(zr_hf_size_parse("0MB", &size), ZR_ERR_INVALID, "\"0MB\"");
    TEST_FAILS(zr_hf_size_parse("5TB", &size), ZR_ERR_INVALID, "\"5TB\"");
    units_free(&u);
}

/* ---- the Llama family ------------------------------------------------------------------- */

static int same_config(const zr_llama_config *a, const zr_llama_config *b)
{
    return a->family == b->family && a->vocab == b->vocab && a->hidden == b->hidden &&
           a->layers == b->layers && a->heads == b->heads && a->kv_heads == b->kv_heads &&
           a->head_dim == b->head_dim && a->intermediate == b->intermediate &&
           a->norm_eps == b->norm_eps && a->rope_theta == b->rope_theta &&
           a->rope_llama3 == b->rope_llama3 && a->rope_factor == b->rope_factor &&
           a->rope_low_freq_factor == b->rope_low_freq_factor &&
           a->rope_high_freq_factor == b->rope_high_freq_factor &&
           a->rope_original_max_pos == b->rope_original_max_pos && a->tied == b->tied &&
           a->qkv_bias == b->qkv_bias && a->o_bias == b->o_bias && a->mlp_bias == b->mlp_bias &&
           a->sliding_window == b->sliding_window;
}

/* A reference folder read, written by zr, read again: the same configuration, the same bits. */
static void llama_roundtrip(const char *model)
{
    char src[512], out[512];
    snprintf(src, sizeof src, "%s/%s", hf_data(), model);
    snprintf(out, sizeof out, "%s/%s", dir, model);
    zr_llama_config cfg, back;
    TEST_OK(zr_llama_config_read(&cfg, src));
    zr_llama m = {0}, m2 = {0};
    TEST_OK(zr_llama_init(&m, &cfg, 1, 1));
    int U = zr_llama_unit_count(&m);
    float *p[16] = {0};
    for (int u = 0; u < U && u < 16; u++) {
        p[u] = malloc(zr_llama_unit_numel(&m, u) * sizeof(float));
        TEST_CHECK(p[u] != NULL);
        TEST_OK(zr_llama_load_hf_unit(&m, src, u, p[u]));
    }
    zr_hf_write_opts o = {.dtype = ZR_HF_F32, .max_pos = 256};
    TEST_OK(zr_hf_write_llama(out, &cfg, p, &o));
    TEST_OK(zr_llama_config_read(&back, out));
    TEST_CHECKF(same_config(&cfg, &back), "%s: config.json read back differs", model);
    TEST_OK(zr_llama_init(&m2, &back, 1, 1));
    size_t bad = 0;
    for (int u = 0; u < U && u < 16; u++) {
        size_t k = zr_llama_unit_numel(&m, u);
        float *q = malloc(k * sizeof *q);
        TEST_CHECK(q != NULL);
        if (q != NULL) {
            TEST_OK(zr_llama_load_hf_unit(&m2, out, u, q));
            bad += memcmp(q, p[u], k * sizeof *q) != 0;
        }
        free(q);
    }
    TEST_CHECKF(bad == 0, "%s: %zu units differ after the round trip", model, bad);
    /* the file holds the same tensors as transformers' (same names, shapes and bits) */
    zr_hf_tensor *t = NULL;
    int n = 0;
    TEST_OK(zr_hf_llama_tensors(&cfg, p, &t, &n));
    snprintf(src + strlen(src), sizeof src - strlen(src), "/model.safetensors");
    zr_safetensors s = {0};
    TEST_OK(zr_safetensors_open(&s, src));
    TEST_EQ_INT(s.count, n);
    for (int i = 0; i < n; i++) {
        check_tensor(&s, &t[i], ZR_HF_F32);
    }
    zr_safetensors_close(&s);
    printf("  %-15s %d tensors, config and weights read back unchanged\n", model, n);
    zr_free(t);
    for (int u = 0; u < U && u < 16; u++) {
        free(p[u]);
    }
    zr_llama_free(&m);
    zr_llama_free(&m2);
}

static void test_llama_folders(void)
{
    llama_roundtrip("llama_gqa");
    llama_roundtrip("llama_mha_tied");
    llama_roundtrip("qwen2");
}

/* Mistral's and a sliding Qwen2's config.json, and biases a family cannot say. */
static void test_llama_configs(void)
{
    zr_llama_config c = {.family = ZR_HF_MISTRAL,
                         .vocab = 64,
                         .hidden = 32,
                         .layers = 1,
                         .heads = 4,
                         .kv_heads = 1,
                         .head_dim = 8,
                         .intermediate = 64,
                         .norm_eps = 1e-6,
                         .rope_theta = 1e6,
                         .sliding_window = 4096};
    zr_hf_write_opts o = {.dtype = ZR_HF_BF16};
    for (int f = ZR_HF_MISTRAL; f <= ZR_HF_QWEN2; f++) {
        c.family = f;
        c.qkv_bias = f == ZR_HF_QWEN2;
        char *json = NULL, name[64];
        TEST_OK(zr_hf_llama_config_json(&c, &o, &json));
        zr_hf_config h;
        snprintf(name, sizeof name, "family %d", f);
        TEST_OK(zr_hf_config_parse(&h, json ? json : "", name));
        TEST_CHECK((int)h.family == f && h.sliding_window == 4096 && h.qkv_bias == c.qkv_bias);
        TEST_CHECK(h.kv_heads == 1 && h.head_dim == 8 && h.rope_theta == 1e6 && !h.tied);
        TEST_CHECKF(json != NULL && strstr(json, "\"bfloat16\"") != NULL, "%s", json);
        zr_free(json);
    }
    c.family = ZR_HF_MISTRAL;
    c.qkv_bias = 1;
    char *json = NULL;
    TEST_FAILS(zr_hf_llama_config_json(&c, &o, &json), ZR_ERR_INVALID,
               "MistralForCausalLM cannot hold biases");
}

/* ---- make check-hf's zr side ------------------------------------------------------------ */

static int gpt2_probs(const char *model, const char *out)
{
    zr_gpt_config cfg;
    enum { B = 2, T = 16 };
    if (zr_gpt_read_llmc_config(model, &cfg) != ZR_OK) {
        fprintf(stderr, "%s\n", zr_error_message());
        return 1;
    }
    units u;
    u.n = zr_gpt_config_unit_count(&cfg);
    for (int i = 0; i < u.n; i++) {
        u.p[i] = malloc(zr_gpt_config_unit_numel(&cfg, i) * sizeof(float));
    }
    int in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) {
        int b = i / T, k = b * (T + 1) + i % T; /* rows of T + 1 tokens */
        in[i] = (int)(((long)k * 7919 + 13) % cfg.vocab);
        tg[i] = (int)(((long)(k + 1) * 7919 + 13) % cfg.vocab);
    }
    zr_gpt m;
    int rc = zr_gpt_read_llmc(model, &cfg, u.p) != ZR_OK, made = 0;
    rc = rc || !(made = zr_gpt_init(&m, &cfg, B, T) == ZR_OK);
    rc = rc || zr_gpt_forward_begin(&m, in, tg) != ZR_OK;
    for (int i = 0; !rc && i < u.n; i++) {
        rc = zr_gpt_forward_unit(&m, i, u.p[i], u.p[0]) != ZR_OK;
    }
    FILE *f = rc ? NULL : fopen(out, "wb");
    for (int i = 0; f != NULL && i < B * T; i++) {
        rc |= fwrite(zr_gpt_probs(&m) + (size_t)i * cfg.padded_vocab, sizeof(float),
                     (size_t)cfg.vocab, f) != (size_t)cfg.vocab;
    }
    float loss = rc ? 0 : zr_gpt_loss(&m);
    rc |= f == NULL || fwrite(&loss, sizeof loss, 1, f) != 1;
    rc |= f != NULL && fclose(f) != 0;
    if (rc) {
        fprintf(stderr, "--gpt2-probs %s: %s\n", model, zr_error_message());
    }
    if (made) {
        zr_gpt_free(&m);
    }
    units_free(&u);
    return rc;
}

static int llama_copy(const char *src, const char *dst, const char *dtype)
{
    zr_llama_config cfg;
    zr_llama m = {0};
    zr_hf_write_opts o = {.max_pos = 256};
    float *p[64] = {0};
    int made = 0, U = 0;
    zr_status st = zr_hf_dtype_parse(dtype, &o.dtype);
    st = st == ZR_OK ? zr_llama_config_read(&cfg, src) : st;
    st = st == ZR_OK ? zr_llama_init(&m, &cfg, 1, 1) : st;
    made = st == ZR_OK;
    U = made ? zr_llama_unit_count(&m) : 0;
    st = st == ZR_OK && U > 64 ? ZR_ERR_INVALID : st;
    for (int u = 0; st == ZR_OK && u < U; u++) {
        st = ZR_ALLOC_STATUS(p[u], zr_llama_unit_numel(&m, u));
        st = st == ZR_OK ? zr_llama_load_hf_unit(&m, src, u, p[u]) : st;
    }
    st = st == ZR_OK ? zr_hf_write_llama(dst, &cfg, p, &o) : st;
    if (st != ZR_OK) {
        fprintf(stderr, "--llama-copy %s %s: %s\n", src, dst, zr_error_message());
    }
    for (int u = 0; u < U && u < 64; u++) {
        zr_free(p[u]);
    }
    if (made) {
        zr_llama_free(&m);
    }
    return st != ZR_OK;
}

/*
 * --llama-logits DIR OUT.f32: zr's logits of the Llama-family folder DIR on
 * the fixed tokens of --gpt2-probs (B x T), [B, T, V] fp32 into OUT: the zr
 * side of check-hf's round trip (a folder zr trained and exported).
 */
static int llama_logits(const char *dir, const char *out)
{
    enum { LB = 2, LT = 16 };
    zr_llama_config cfg;
    zr_llama m = {0};
    float *p[64] = {0};
    int in[LB * LT], made = 0, U = 0;
    zr_status st = zr_llama_config_read(&cfg, dir);
    st = st == ZR_OK ? zr_llama_init(&m, &cfg, LB, LT) : st;
    made = st == ZR_OK;
    U = made ? zr_llama_unit_count(&m) : 0;
    st = st == ZR_OK && U > 64 ? ZR_ERR_INVALID : st;
    for (int u = 0; st == ZR_OK && u < U; u++) {
        st = ZR_ALLOC_STATUS(p[u], zr_llama_unit_numel(&m, u));
        st = st == ZR_OK ? zr_llama_load_hf_unit(&m, dir, u, p[u]) : st;
    }
    for (int i = 0; i < LB * LT; i++) {
        int k = i / LT * (LT + 1) + i % LT; /* rows of T + 1 tokens, as --gpt2-probs */
        in[i] = made ? (int)(((long)k * 7919 + 13) % cfg.vocab) : 0;
    }
    st = st == ZR_OK ? zr_llama_forward_begin(&m, in, NULL) : st;
    for (int u = 0; st == ZR_OK && u < U; u++) {
        st = zr_llama_forward_unit(&m, u, p[u], p[0]);
    }
    FILE *f = st == ZR_OK ? fopen(out, "wb") : NULL;
    size_t n = (size_t)LB * LT * (size_t)cfg.vocab;
    int rc = st != ZR_OK || f == NULL || fwrite(zr_llama_logits(&m), sizeof(float), n, f) != n;
    rc |= f != NULL && fclose(f) != 0;
    if (rc) {
        fprintf(stderr, "--llama-logits %s: %s\n", dir, zr_error_message());
    }
    for (int u = 0; u < U && u < 64; u++) {
        zr_free(p[u]);
    }
    if (made) {
        zr_llama_free(&m);
    }
    return rc;
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--llama-logits") == 0) {
        return llama_logits(argv[2], argv[3]);
    }
    if (argc == 4 && strcmp(argv[1], "--gpt2-probs") == 0) {
        return gpt2_probs(argv[2], argv[3]);
    }
    if (argc == 5 && strcmp(argv[1], "--llama-copy") == 0) {
        return llama_copy(argv[2], argv[3], argv[4]);
    }
    snprintf(dir, sizeof dir, "/tmp/zr_test_hf_write_XXXXXX");
    if (mkdtemp(dir) == NULL) {
        return 1;
    }
    TEST_RUN(test_rounding);
    TEST_RUN(test_gpt2_f32);
    TEST_RUN(test_gpt2_bf16_f16);
    TEST_RUN(test_shards);
    TEST_RUN(test_refusals);
    TEST_RUN(test_llama_folders);
    TEST_RUN(test_llama_configs);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (zr_test_failed == 0 && system(cmd) != 0) {
        fprintf(stderr, "cannot remove %s\n", dir);
    }
    return zr_test_finish();
}
