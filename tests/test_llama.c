/*
 * test_llama.c - the Llama-family model (zr/llama.h) against what
 * transformers computed for the reference folders of tests/data/hf
 * (scripts/hf_reference.py): logits, loss, each tensor's gradient norm and
 * 10 AdamW steps, all within 1e-5; the same bits at 1 and 2 threads; F32,
 * BF16 and F16 read exactly, a BF16 folder loaded; the safetensors reader's
 * refusals of headers that lie, the loader's of missing, extra and
 * misshapen tensors, and the model's of what it cannot run.
 */
#include "test.h"
#include "zr/file.h"
#include "zr/llama.h"
#include "zr/optim.h"
#include "zr/pool.h"

#include "../src/model/safetensors.h" /* internal to src/model */

#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <unistd.h>

static const char *hf_root(void)
{
    const char *r = getenv("ZR_HF_DATA");
    return r != NULL ? r : "tests/data/hf";
}

/* A model, its units, their gradients and AdamW moments. */
typedef struct run {
    zr_llama m;
    int units;
    float **p, **g, **mo, **vo;
    int *in, *tg;
    int N;
} run;

static int run_open(run *r, const char *dir, int B, int T)
{
    zr_llama_config c;
    memset(r, 0, sizeof *r);
    TEST_OK(zr_llama_config_read(&c, dir));
    if (zr_test_failed_checks != 0) {
        return 0;
    }
    TEST_OK(zr_llama_init(&r->m, &c, B, T));
    r->units = zr_llama_unit_count(&r->m);
    r->N = B * T;
    r->p = calloc((size_t)r->units, sizeof *r->p);
    r->g = calloc((size_t)r->units, sizeof *r->g);
    r->mo = calloc((size_t)r->units, sizeof *r->mo);
    r->vo = calloc((size_t)r->units, sizeof *r->vo);
    r->in = calloc((size_t)r->N, sizeof *r->in);
    r->tg = calloc((size_t)r->N, sizeof *r->tg);
    for (int u = 0; u < r->units; u++) {
        size_t n = zr_llama_unit_numel(&r->m, u);
        r->p[u] = calloc(n, sizeof(float));
        r->g[u] = calloc(n, sizeof(float));
        r->mo[u] = calloc(n, sizeof(float));
        r->vo[u] = calloc(n, sizeof(float));
        TEST_OK(zr_llama_load_hf_unit(&r->m, dir, u, r->p[u]));
    }
    return zr_test_failed_checks == 0;
}

static void run_close(run *r)
{
    for (int u = 0; u < r->units; u++) {
        free(r->p[u]), free(r->g[u]), free(r->mo[u]), free(r->vo[u]);
    }
    free(r->p), free(r->g), free(r->mo), free(r->vo), free(r->in), free(r->tg);
    zr_llama_free(&r->m);
}

/* Every unit forward (targets NULL: logits only); the loss. */
static float run_forward(run *r, int with_targets)
{
    TEST_OK(zr_llama_forward_begin(&r->m, r->in, with_targets ? r->tg : NULL));
    for (int u = 0; u < r->units; u++) {
        TEST_OK(zr_llama_forward_unit(&r->m, u, r->p[u], r->p[0]));
    }
    return zr_llama_loss(&r->m);
}

/* Gradients zeroed, then every unit backward. */
static void run_backward(run *r)
{
    for (int u = 0; u < r->units; u++) {
        memset(r->g[u], 0, zr_llama_unit_numel(&r->m, u) * sizeof(float));
    }
    TEST_OK(zr_llama_backward_begin(&r->m));
    for (int u = r->units - 1; u >= 0; u--) {
        TEST_OK(zr_llama_backward_unit(&r->m, u, r->p[u], r->p[0], r->g[u], r->g[0]));
    }
}

/* reference.json, its tokens into r->in / r->tg (inputs the first T of a row, targets the last). */
static cJSON *ref_read(const char *dir, run *r, int *B, int *T)
{
    char path[512], *text = NULL;
    size_t n = 0;
    snprintf(path, sizeof path, "%s/reference.json", dir);
    TEST_OK(zr_file_read_all(path, &text, &n));
    cJSON *ref = text != NULL ? cJSON_Parse(text) : NULL;
    zr_free(text);
    TEST_CHECKF(ref != NULL, "%s: not JSON", path);
    *B = cJSON_GetObjectItemCaseSensitive(ref, "B") != NULL
             ? cJSON_GetObjectItemCaseSensitive(ref, "B")->valueint
             : 0;
    *T = cJSON_GetObjectItemCaseSensitive(ref, "T") != NULL
             ? cJSON_GetObjectItemCaseSensitive(ref, "T")->valueint
             : 0;
    if (r == NULL) {
        return ref;
    }
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(ref, "tokens");
    int ok = cJSON_GetArraySize(rows) == *B;
    for (int b = 0; ok && b < *B; b++) {
        const cJSON *row = cJSON_GetArrayItem(rows, b);
        ok = cJSON_GetArraySize(row) == *T + 1;
        for (int t = 0; ok && t < *T; t++) {
            r->in[b * *T + t] = cJSON_GetArrayItem(row, t)->valueint;
            r->tg[b * *T + t] = cJSON_GetArrayItem(row, t + 1)->valueint;
        }
    }
    TEST_CHECKF(ok, "%s: tokens are not %d rows of %d", path, *B, *T + 1);
    return ref;
}

static double num(const cJSON *o, const char *key)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}

/* The worst of each kind of comparison over the models, printed at the end. */
static double worst_logits, worst_loss, worst_grad, worst_adamw;

static void check_logits(run *r, const char *dir, const char *model)
{
    char path[512];
    zr_safetensors s = {0};
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    TEST_OK(zr_safetensors_open(&s, path));
    const zr_safetensors_tensor *t = zr_safetensors_find(&s, "logits");
    const size_t n = (size_t)r->N * r->m.cfg.vocab;
    TEST_CHECKF(t != NULL && t->numel == n, "%s: no logits of %zu values", path, n);
    float *want = t != NULL && t->numel == n ? malloc(n * sizeof *want) : NULL;
    if (want != NULL) {
        TEST_OK(zr_safetensors_read_f32(&s, t, want));
        run_forward(r, 0);
        const float *got = zr_llama_logits(&r->m);
        TEST_CHECK(got != NULL);
        double big = 0, diff = 0;
        for (size_t i = 0; got != NULL && i < n; i++) {
            big = fmax(big, fabs(want[i]));
            diff = fmax(diff, fabs((double)got[i] - want[i]));
        }
        double e = got != NULL ? diff / big : INFINITY;
        worst_logits = fmax(worst_logits, e);
        printf("  %-15s logits: max |zr - transformers| / max |transformers| = %.3g\n", model, e);
        TEST_CHECKF(e <= 1e-5, "%s: logits differ by %.3g of the largest (bound 1e-5)", model, e);
    }
    free(want);
    zr_safetensors_close(&s);
}

/* The loss and each tensor's gradient norm (a tied head's in the embedding's). */
static void check_grads(run *r, const cJSON *ref, const char *model)
{
    double loss = run_forward(r, 1), want = num(ref, "loss");
    double e = fabs(loss - want) / fabs(want);
    worst_loss = fmax(worst_loss, e);
    printf("  %-15s loss %.9g, transformers %.9g: relative %.3g\n", model, loss, want, e);
    TEST_CHECKF(e <= 1e-5, "%s: loss %.9g vs %.9g", model, loss, want);
    run_backward(r);
    const cJSON *norms = cJSON_GetObjectItemCaseSensitive(ref, "grad_norms");
    int count = 0;
    double worst = 0;
    for (int u = 0; u < r->units; u++) {
        const zr_tensor_desc *d = NULL;
        int k = zr_llama_unit_tensors(&r->m, u, &d);
        for (int i = 0; i < k; i++, count++) {
            double w = num(norms, d[i].name),
                   got = sqrt(zr_sumsq(r->g[u] + d[i].offset, d[i].numel));
            double ei = fabs(got - w) / w;
            TEST_CHECKF(ei <= 1e-5, "%s: gradient norm of %s %.9g, transformers %.9g", model,
                        d[i].name, got, w);
            worst = fmax(worst, isnan(ei) ? INFINITY : ei);
        }
    }
    TEST_EQ_INT(count, cJSON_GetArraySize(norms));
    worst_grad = fmax(worst_grad, worst);
    printf("  %-15s %d gradient norms: worst relative difference %.3g\n", model, count, worst);
}

/* 10 AdamW steps on the batch (zr_adamw_update per tensor, decay on matrices): the losses. */
static void check_adamw(run *r, const cJSON *ref, const char *model)
{
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(ref, "adamw");
    const cJSON *betas = cJSON_GetObjectItemCaseSensitive(h, "betas");
    const cJSON *losses = cJSON_GetObjectItemCaseSensitive(ref, "adamw_losses");
    zr_adamw hp = {(float)num(h, "lr"), (float)cJSON_GetArrayItem(betas, 0)->valuedouble,
                   (float)cJSON_GetArrayItem(betas, 1)->valuedouble, (float)num(h, "eps"),
                   (float)num(h, "weight_decay")};
    double worst = 0;
    for (int step = 1; step <= cJSON_GetArraySize(losses); step++) {
        double loss = run_forward(r, 1), want = cJSON_GetArrayItem(losses, step - 1)->valuedouble;
        double e = fabs(loss - want) / fabs(want);
        worst = fmax(worst, isnan(e) ? INFINITY : e);
        TEST_CHECKF(e <= 1e-5, "%s: AdamW loss %d: %.9g, transformers %.9g", model, step - 1, loss,
                    want);
        run_backward(r);
        for (int u = 0; u < r->units; u++) {
            const zr_tensor_desc *d = NULL;
            int k = zr_llama_unit_tensors(&r->m, u, &d);
            for (int i = 0; i < k; i++) {
                size_t o = d[i].offset;
                zr_adamw_update(&hp, hp.lr, step, 1.0f, d[i].decay, r->p[u] + o, r->g[u] + o,
                                r->mo[u] + o, r->vo[u] + o, d[i].numel);
            }
        }
    }
    worst_adamw = fmax(worst_adamw, worst);
    printf("  %-15s %d AdamW losses: worst relative difference %.3g\n", model,
           cJSON_GetArraySize(losses), worst);
}

static void vs_transformers(const char *model)
{
    char dir[400];
    snprintf(dir, sizeof dir, "%s/%s", hf_root(), model);
    int B = 0, T = 0;
    cJSON_Delete(ref_read(dir, NULL, &B, &T));
    run r;
    if (B > 0 && run_open(&r, dir, B, T)) {
        cJSON *ref = ref_read(dir, &r, &B, &T);
        check_logits(&r, dir, model);
        check_grads(&r, ref, model);
        check_adamw(&r, ref, model);
        cJSON_Delete(ref);
    }
    run_close(&r);
}

static void test_vs_transformers(void)
{
    vs_transformers("llama_gqa");
    vs_transformers("llama_mha_tied");
    vs_transformers("qwen2");
    printf("  worst over the three models: logits %.3g, loss %.3g, gradient norms %.3g, AdamW "
           "losses %.3g (bounds 1e-5)\n",
           worst_logits, worst_loss, worst_grad, worst_adamw);
}

/* 1 and 2 threads: the same loss and gradients, bit for bit. */
static void test_threads_same_bits(void)
{
    char dir[400];
    snprintf(dir, sizeof dir, "%s/qwen2", hf_root());
    int B = 0, T = 0;
    run r[2];
    for (int k = 0; k < 2; k++) {
        TEST_OK(zr_threads_set(k == 0 ? 1 : 2));
        cJSON_Delete(ref_read(dir, NULL, &B, &T));
        if (B <= 0 || !run_open(&r[k], dir, B, T)) {
            break;
        }
        cJSON_Delete(ref_read(dir, &r[k], &B, &T));
        run_forward(&r[k], 1);
        run_backward(&r[k]);
    }
    TEST_OK(zr_threads_set(1));
    int same = zr_test_failed_checks == 0 && zr_llama_loss(&r[0].m) == zr_llama_loss(&r[1].m);
    for (int u = 0; same && u < r[0].units; u++) {
        same = memcmp(r[0].g[u], r[1].g[u], zr_llama_unit_numel(&r[0].m, u) * sizeof(float)) == 0;
    }
    TEST_CHECKF(same, "1 and 2 threads give different losses or gradients");
    run_close(&r[0]);
    run_close(&r[1]);
}

/* The loss of r's batch (a forward with targets). */
static double fd_loss(run *r)
{
    return run_forward(r, 1);
}

/*
 * A random model of config c against central differences of its own loss:
 * in every tensor, the element of the largest gradient and two others.
 */
static void fd_case(const zr_llama_config *c, const char *what)
{
    run r;
    memset(&r, 0, sizeof r);
    const int B = 2, T = 5;
    TEST_OK(zr_llama_init(&r.m, c, B, T));
    if (zr_test_failed_checks != 0) {
        return;
    }
    r.units = zr_llama_unit_count(&r.m);
    r.N = B * T;
    r.p = calloc((size_t)r.units, sizeof *r.p);
    r.g = calloc((size_t)r.units, sizeof *r.g);
    r.mo = calloc((size_t)r.units, sizeof *r.mo);
    r.vo = calloc((size_t)r.units, sizeof *r.vo);
    r.in = calloc((size_t)r.N, sizeof *r.in);
    r.tg = calloc((size_t)r.N, sizeof *r.tg);
    zr_test_rng rng = {0x5eed};
    for (int i = 0; i < r.N; i++) {
        r.in[i] = (int)(zr_test_rng_next(&rng) % (uint64_t)c->vocab);
        r.tg[i] = (int)(zr_test_rng_next(&rng) % (uint64_t)c->vocab);
    }
    for (int u = 0; u < r.units; u++) {
        const zr_tensor_desc *d = NULL;
        int k = zr_llama_unit_tensors(&r.m, u, &d);
        r.p[u] = calloc(zr_llama_unit_numel(&r.m, u), sizeof(float));
        r.g[u] = calloc(zr_llama_unit_numel(&r.m, u), sizeof(float));
        for (int i = 0; i < k; i++) {
            int norm = strstr(d[i].name, "norm") != NULL;
            for (size_t j = 0; j < d[i].numel; j++) {
                double x = (double)(zr_test_rng_next(&rng) >> 11) / 9007199254740992.0 - 0.5;
                r.p[u][d[i].offset + j] = (float)(norm ? 1.0 + 0.2 * x : 0.6 * x);
            }
        }
    }
    fd_loss(&r);
    run_backward(&r);
    double worst = 0;
    for (int u = 0; u < r.units; u++) {
        const zr_tensor_desc *d = NULL;
        int k = zr_llama_unit_tensors(&r.m, u, &d);
        for (int i = 0; i < k; i++) {
            size_t big = 0, pick[3];
            for (size_t j = 0; j < d[i].numel; j++) {
                big = fabsf(r.g[u][d[i].offset + j]) > fabsf(r.g[u][d[i].offset + big]) ? j : big;
            }
            pick[0] = big, pick[1] = d[i].numel / 3, pick[2] = d[i].numel - 1;
            for (int s = 0; s < 3; s++) {
                float *x = &r.p[u][d[i].offset + pick[s]], x0 = *x;
                const float h = 1e-2f;
                *x = x0 + h;
                double lp = fd_loss(&r);
                *x = x0 - h;
                double lm = fd_loss(&r);
                *x = x0;
                double fd = (lp - lm) / (2.0 * h), g = r.g[u][d[i].offset + pick[s]];
                double e = fabs(fd - g) / (1e-3 + fabs(g));
                worst = fmax(worst, e);
                TEST_CHECKF(fabs(fd - g) <= 1e-3 + 0.05 * fabs(g),
                            "%s: %s[%zu]: gradient %.6g, central difference %.6g", what, d[i].name,
                            pick[s], g, fd);
            }
        }
    }
    printf("  %-36s worst |difference| / (1e-3 + |gradient|) = %.3g\n", what, worst);
    run_close(&r);
}

/* The layouts the reference folders lack: every bias (Llama's attention_bias, mlp_bias), MQA. */
static void test_central_differences(void)
{
    zr_llama_config c = {.family = 1,
                         .vocab = 32,
                         .hidden = 16,
                         .layers = 2,
                         .heads = 4,
                         .kv_heads = 2,
                         .head_dim = 4,
                         .intermediate = 24,
                         .norm_eps = 1e-5,
                         .rope_theta = 10000,
                         .qkv_bias = 1,
                         .o_bias = 1,
                         .mlp_bias = 1};
    fd_case(&c, "all biases, GQA 2:1, untied");
    c.qkv_bias = c.o_bias = c.mlp_bias = 0;
    c.kv_heads = 1;
    c.tied = 1;
    c.head_dim = 8;
    c.rope_llama3 = 1;
    c.rope_factor = 8, c.rope_low_freq_factor = 1, c.rope_high_freq_factor = 4;
    c.rope_original_max_pos = 4;
    fd_case(&c, "MQA, tied, head_dim 8 given, llama3");
}

static char tmp_dir[64];

/* A safetensors file at tmp_dir/name: header, then `data` bytes (zeros when data is NULL). */
static void write_st(const char *name, const char *header, const void *data, size_t bytes)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    size_t hl = strlen(header), n = 8 + hl + bytes;
    unsigned char *buf = calloc(n, 1);
    for (int i = 0; i < 8; i++) {
        buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    }
    memcpy(buf + 8, header, hl);
    if (data != NULL) {
        memcpy(buf + 8 + hl, data, bytes);
    }
    zr_test_write_file(path, buf, n);
    free(buf);
}

/* Opening tmp_dir/name fails with ZR_ERR_FORMAT and a message holding each of want[]. */
static void refused(const char *name, const char *want1, const char *want2)
{
    char path[128];
    zr_safetensors s = {0};
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    TEST_FAILS(zr_safetensors_open(&s, path), ZR_ERR_FORMAT, want1);
    TEST_CHECKF(strstr(zr_error_message(), want2) != NULL, "\"%s\" lacks \"%s\"",
                zr_error_message(), want2);
    printf("  %s\n", zr_error_message());
    zr_safetensors_close(&s);
}

/* Headers that lie: each refused, naming the file and the tensor. */
static void test_safetensors_refused(void)
{
    write_st("past.safetensors",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", NULL, 8);
    refused("past.safetensors", "tensor a", "past the end");
    write_st("overlap.safetensors",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
             NULL, 24);
    refused("overlap.safetensors", "tensors a [0, 16] and b [8, 24] overlap", "overlap.");
    write_st("bytes.safetensors",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}", NULL, 16);
    refused("bytes.safetensors", "tensor a: 16 bytes for 3 elements of F32", "bytes.");
    write_st("dtype.safetensors",
             "{\"a\":{\"dtype\":\"F33\",\"shape\":[4],\"data_offsets\":[0,16]}}", NULL, 16);
    refused("dtype.safetensors", "tensor a: dtype F33", "dtype.");
    write_st("shape.safetensors",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[-4],\"data_offsets\":[0,16]}}", NULL, 16);
    refused("shape.safetensors", "tensor a: shape[0]", "shape.");
    write_st("json.safetensors", "[1, 2]", NULL, 0);
    refused("json.safetensors", "not a JSON object", "json.");
    char path[128];
    snprintf(path, sizeof path, "%s/short.safetensors", tmp_dir);
    const unsigned char big[12] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' '};
    zr_test_write_file(path, big, sizeof big);
    refused("short.safetensors", "not a safetensors file", "short.");
}

/* F32, BF16 and F16 read exactly (F16's subnormals and infinities too). */
static void test_safetensors_dtypes(void)
{
    const float f[3] = {1.5f, -2.0f, 3e-5f};
    unsigned char data[12 + 4 + 8];
    const uint16_t b[2] = {0x3fc0, 0xc000}, h[4] = {0x3e00, 0xc000, 0x0001, 0x7c00};
    memcpy(data, f, 12), memcpy(data + 12, b, 4), memcpy(data + 16, h, 8);
    write_st("dtypes.safetensors",
             "{\"__metadata__\":{\"format\":\"pt\"},"
             "\"f\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},"
             "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[12,16]},"
             "\"h\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[16,24]}}",
             data, sizeof data);
    char path[128];
    zr_safetensors s = {0};
    snprintf(path, sizeof path, "%s/dtypes.safetensors", tmp_dir);
    TEST_OK(zr_safetensors_open(&s, path));
    TEST_EQ_INT(s.count, 3);
    float out[4] = {0};
    const float want_b[2] = {1.5f, -2.0f}, want_h[4] = {1.5f, -2.0f, 0x1p-24f, INFINITY};
    TEST_OK(zr_safetensors_read_f32(&s, zr_safetensors_find(&s, "f"), out));
    TEST_CHECK(memcmp(out, f, sizeof f) == 0);
    TEST_OK(zr_safetensors_read_f32(&s, zr_safetensors_find(&s, "b"), out));
    TEST_CHECK(memcmp(out, want_b, sizeof want_b) == 0);
    TEST_OK(zr_safetensors_read_f32(&s, zr_safetensors_find(&s, "h"), out));
    TEST_CHECK(memcmp(out, want_h, sizeof want_h) == 0);
    TEST_CHECK(zr_safetensors_find(&s, "__metadata__") == NULL);
    zr_safetensors_close(&s);
}

/* A missing, extra or misshapen tensor: refused naming it. */
static void test_load_refused(void)
{
    char dir[400], hdr[512];
    snprintf(dir, sizeof dir, "%s/llama_gqa", hf_root());
    zr_llama_config c;
    zr_llama m = {0};
    TEST_OK(zr_llama_config_read(&c, dir));
    TEST_OK(zr_llama_init(&m, &c, 1, 4));
    const size_t n = zr_llama_unit_numel(&m, 0);
    float *buf = calloc(n, sizeof *buf);
    const char *emb = "\"model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[%s],"
                      "\"data_offsets\":[0,%zu]}%s}";
    const struct {
        const char *shape, *extra, *want;
    } cases[] = {
        {"256, 64",
         ",\"model.layers.2.mlp.up_proj.weight\":{\"dtype\":\"F32\",\"shape\":[0],"
         "\"data_offsets\":[0,0]}",
         "tensor model.layers.2.mlp.up_proj.weight is not one of the model's"},
        {"64, 256", "",
         "tensor model.embed_tokens.weight has shape [64, 256], the model's is "
         "[256, 64]"},
        {"256, 64",
         ",\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[256,64],"
         "\"data_offsets\":[0,0]}",
         "lm_head.weight: 0 bytes"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int k = snprintf(hdr, sizeof hdr, "{");
        snprintf(hdr + k, sizeof hdr - (size_t)k, emb, cases[i].shape, n * 4, cases[i].extra);
        write_st("model.safetensors", hdr, NULL, n * 4);
        TEST_FAILS(zr_llama_load_hf_unit(&m, tmp_dir, 0, buf), ZR_ERR_FORMAT, cases[i].want);
        printf("  %s\n", zr_error_message());
    }
    snprintf(hdr, sizeof hdr, "{");
    snprintf(hdr + 1, sizeof hdr - 1, emb, "256, 64", n * 4, "");
    write_st("model.safetensors", hdr, NULL, n * 4);
    TEST_OK(zr_llama_load_hf_unit(&m, tmp_dir, 0, buf));
    TEST_FAILS(zr_llama_load_hf_unit(&m, tmp_dir, 1, buf), ZR_ERR_FORMAT,
               "tensor model.layers.0.input_layernorm.weight is missing");
    printf("  %s\n", zr_error_message());
    free(buf);
    zr_llama_free(&m);
    zr_error_clear();
}

static uint16_t to_bf16(float x)
{
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

/* src's tensors (all F32) rounded to BF16 into dst, in the same order. */
static void write_bf16_copy(const char *src, const char *dst)
{
    zr_safetensors s = {0};
    TEST_OK(zr_safetensors_open(&s, src));
    cJSON *hdr = cJSON_CreateObject();
    size_t at = 0;
    for (int i = 0; i < s.count; i++) {
        const zr_safetensors_tensor *t = &s.tensors[i];
        cJSON *e = cJSON_AddObjectToObject(hdr, t->name),
              *shape = cJSON_AddArrayToObject(e, "shape");
        cJSON *off = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddStringToObject(e, "dtype", "BF16");
        for (int d = 0; d < t->ndim; d++) {
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        }
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)at));
        at += 2 * t->numel;
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)at));
    }
    char *text = cJSON_PrintUnformatted(hdr);
    unsigned char *data = malloc(at + 1);
    for (int i = 0, o = 0; i < s.count; i++) {
        const zr_safetensors_tensor *t = &s.tensors[i];
        float *x = malloc(t->numel * sizeof *x + 1);
        TEST_OK(zr_safetensors_read_f32(&s, t, x));
        for (size_t k = 0; k < t->numel; k++, o += 2) {
            uint16_t h = to_bf16(x[k]);
            memcpy(data + o, &h, 2);
        }
        free(x);
    }
    char *slash = strrchr(dst, '/');
    *slash = '\0';
    write_st(slash + 1, text, data, at);
    *slash = '/';
    free(data);
    cJSON_free(text);
    cJSON_Delete(hdr);
    zr_safetensors_close(&s);
}

/* A BF16 folder loads into exactly the rounded weights, and the model runs on them. */
static void test_load_bf16(void)
{
    char dir[400], src[512], dst[128];
    snprintf(dir, sizeof dir, "%s/llama_gqa", hf_root());
    snprintf(src, sizeof src, "%s/model.safetensors", dir);
    snprintf(dst, sizeof dst, "%s/model.safetensors", tmp_dir);
    write_bf16_copy(src, dst);
    int B = 0, T = 0;
    run r;
    cJSON_Delete(ref_read(dir, NULL, &B, &T));
    if (B <= 0 || !run_open(&r, dir, B, T)) {
        return;
    }
    cJSON *ref = ref_read(dir, &r, &B, &T);
    double f32_loss = num(ref, "loss");
    cJSON_Delete(ref);
    int exact = 1;
    for (int u = 0; u < r.units; u++) {
        size_t n = zr_llama_unit_numel(&r.m, u);
        float *b = calloc(n, sizeof *b);
        TEST_OK(zr_llama_load_hf_unit(&r.m, tmp_dir, u, b));
        for (size_t i = 0; i < n; i++) {
            uint32_t bits = (uint32_t)to_bf16(r.p[u][i]) << 16;
            float want;
            memcpy(&want, &bits, sizeof want);
            exact &= b[i] == want;
        }
        memcpy(r.p[u], b, n * sizeof *b);
        free(b);
    }
    TEST_CHECKF(exact, "BF16 weights are not the F32 ones rounded to nearest even");
    double loss = run_forward(&r, 1);
    printf("  llama_gqa in BF16: loss %.9g, transformers' in F32 %.9g\n", loss, f32_loss);
    /* weights rounded by at most 2^-9 relative move the loss far less than 1% */
    TEST_CHECKF(fabs(loss - f32_loss) <= 1e-2 * f32_loss, "BF16 loss %.9g", loss);
    run_close(&r);
}

/* GPT-2's folder, a window shorter than T, tokens outside the vocabulary, units out of order. */
static void test_model_refusals(void)
{
    char path[128];
    zr_llama_config c;
    zr_llama m = {0};
    const char *gpt2 = "{\"architectures\":[\"GPT2LMHeadModel\"],\"model_type\":\"gpt2\","
                       "\"vocab_size\":64,\"n_embd\":32,\"n_layer\":1,\"n_head\":2,"
                       "\"n_positions\":16}";
    snprintf(path, sizeof path, "%s/config.json", tmp_dir);
    zr_test_write_file(path, gpt2, strlen(gpt2));
    TEST_FAILS(zr_llama_config_read(&c, tmp_dir), ZR_ERR_INVALID, "GPT-2");
    printf("  %s\n", zr_error_message());
    char dir[400];
    snprintf(dir, sizeof dir, "%s/llama_gqa", hf_root());
    TEST_OK(zr_llama_config_read(&c, dir));
    c.sliding_window = 8;
    TEST_FAILS(zr_llama_init(&m, &c, 1, 16), ZR_ERR_INVALID, "sliding_window 8");
    printf("  %s\n", zr_error_message());
    c.sliding_window = 16;
    TEST_OK(zr_llama_init(&m, &c, 1, 16));
    int in[16] = {0}, tg[16] = {0};
    tg[5] = c.vocab;
    TEST_FAILS(zr_llama_forward_begin(&m, in, tg), ZR_ERR_INVALID, "target token 256");
    TEST_OK(zr_llama_forward_begin(&m, in, NULL));
    float *p = calloc(zr_llama_unit_numel(&m, 1), sizeof *p);
    TEST_FAILS(zr_llama_forward_unit(&m, 1, p, p), ZR_ERR_INVALID, "expected 0");
    TEST_FAILS(zr_llama_backward_begin(&m), ZR_ERR_INVALID, "complete forward pass with targets");
    free(p);
    zr_llama_free(&m);
    zr_error_clear();
}

int main(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/zr_test_llama_%d", (int)getpid());
    char cmd[128];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", tmp_dir);
    if (system(cmd) != 0) {
        return 1;
    }
    TEST_OK(zr_threads_set(1));
    TEST_RUN(test_vs_transformers);
    TEST_RUN(test_threads_same_bits);
    TEST_RUN(test_central_differences);
    TEST_RUN(test_safetensors_refused);
    TEST_RUN(test_safetensors_dtypes);
    TEST_RUN(test_load_refused);
    TEST_RUN(test_load_bf16);
    TEST_RUN(test_model_refusals);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "cannot remove %s\n", tmp_dir);
    }
    return zr_test_finish();
}
