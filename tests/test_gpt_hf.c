/*
 * test_gpt_hf.c - GPT-2 from a Hugging Face folder (zr/model.h's
 * zr_gpt_read_hf_config / zr_gpt_read_hf_range) against what transformers
 * computed for tests/data/hf/gpt2 (scripts/hf_reference.py): logits, loss,
 * each tensor's gradient norm and 10 AdamW losses within 1e-5; every range
 * of a unit equal to the whole unit's part (Conv1D transposed, wte's
 * padding); zr's own safetensors file read back bit for bit; the mask
 * buffers of old files accepted; missing, extra, misshapen and non-finite
 * tensors and configurations zr's GPT-2 is not, refused naming them.
 */
#include "test.h"
#include "test_st.h"
#include "zr/file.h"
#include "zr/model.h"
#include "zr/optim.h"
#include "zr/pool.h"

#include <math.h>
#include <unistd.h>

static char tmp_dir[64];

static const char *gpt2_dir(void)
{
    static char dir[400];
    const char *r = getenv("ZR_HF_DATA");
    snprintf(dir, sizeof dir, "%s/gpt2", r != NULL ? r : "tests/data/hf");
    return dir;
}

/* A model, its units, their gradients and AdamW moments. */
typedef struct run {
    zr_gpt_config cfg;
    zr_gpt m;
    int units, B, T;
    float **p, **g, **mo, **vo;
    int in[64], tg[64];
} run;

static void run_free(run *r)
{
    for (int u = 0; r->p != NULL && u < r->units; u++) {
        free(r->p[u]), free(r->g[u]), free(r->mo[u]), free(r->vo[u]);
    }
    free(r->p), free(r->g), free(r->mo), free(r->vo);
    zr_gpt_free(&r->m);
}

/* The units of dir into fresh buffers (r->cfg set). */
static float **units_load(const zr_gpt_config *cfg, const char *dir)
{
    int n = zr_gpt_config_unit_count(cfg);
    float **p = calloc((size_t)n, sizeof *p);
    for (int u = 0; u < n; u++) {
        size_t k = zr_gpt_config_unit_numel(cfg, u);
        p[u] = malloc(k * sizeof(float));
        TEST_OK(zr_gpt_read_hf_range(dir, cfg, u, 0, k, p[u]));
    }
    return p;
}

static void units_free(const zr_gpt_config *cfg, float **p)
{
    for (int u = 0; u < zr_gpt_config_unit_count(cfg); u++) {
        free(p[u]);
    }
    free(p);
}

/* Whether two sets of units are the same bits. */
static int units_same(const zr_gpt_config *cfg, float *const *a, float *const *b)
{
    int same = 1;
    for (int u = 0; u < zr_gpt_config_unit_count(cfg); u++) {
        same &= memcmp(a[u], b[u], zr_gpt_config_unit_numel(cfg, u) * sizeof(float)) == 0;
    }
    return same;
}

static double num(const cJSON *o, const char *key)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}

/* reference.json, its tokens into r (inputs the first T of a row, targets the last T). */
static cJSON *ref_read(run *r)
{
    char path[512], *text = NULL;
    size_t n = 0;
    snprintf(path, sizeof path, "%s/reference.json", gpt2_dir());
    TEST_OK(zr_file_read_all(path, &text, &n));
    cJSON *ref = text != NULL ? cJSON_Parse(text) : NULL;
    zr_free(text);
    r->B = (int)num(ref, "B"), r->T = (int)num(ref, "T");
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(ref, "tokens");
    int ok = r->B * r->T <= 64 && cJSON_GetArraySize(rows) == r->B;
    for (int b = 0; ok && b < r->B; b++) {
        const cJSON *row = cJSON_GetArrayItem(rows, b);
        ok = cJSON_GetArraySize(row) == r->T + 1;
        for (int t = 0; ok && t < r->T; t++) {
            r->in[b * r->T + t] = cJSON_GetArrayItem(row, t)->valueint;
            r->tg[b * r->T + t] = cJSON_GetArrayItem(row, t + 1)->valueint;
        }
    }
    TEST_CHECKF(ok, "%s: no tokens of B x (T + 1)", path);
    return ref;
}

static int run_open(run *r, cJSON **ref)
{
    memset(r, 0, sizeof *r);
    *ref = ref_read(r);
    TEST_OK(zr_gpt_read_hf_config(gpt2_dir(), &r->cfg));
    if (zr_test_failed_checks != 0) {
        return 0;
    }
    TEST_OK(zr_gpt_init(&r->m, &r->cfg, r->B, r->T));
    r->units = zr_gpt_config_unit_count(&r->cfg);
    r->p = units_load(&r->cfg, gpt2_dir());
    r->g = calloc((size_t)r->units, sizeof *r->g);
    r->mo = calloc((size_t)r->units, sizeof *r->mo);
    r->vo = calloc((size_t)r->units, sizeof *r->vo);
    for (int u = 0; u < r->units; u++) {
        size_t n = zr_gpt_config_unit_numel(&r->cfg, u);
        r->g[u] = calloc(n, sizeof(float));
        r->mo[u] = calloc(n, sizeof(float));
        r->vo[u] = calloc(n, sizeof(float));
    }
    return zr_test_failed_checks == 0;
}

static float run_forward(run *r, int with_targets)
{
    TEST_OK(zr_gpt_forward_begin(&r->m, r->in, with_targets ? r->tg : NULL));
    for (int u = 0; u < r->units; u++) {
        TEST_OK(zr_gpt_forward_unit(&r->m, u, r->p[u], r->p[0]));
    }
    return zr_gpt_loss(&r->m);
}

static void run_backward(run *r)
{
    for (int u = 0; u < r->units; u++) {
        memset(r->g[u], 0, zr_gpt_config_unit_numel(&r->cfg, u) * sizeof(float));
    }
    TEST_OK(zr_gpt_backward_begin(&r->m));
    for (int u = r->units - 1; u >= 0; u--) {
        TEST_OK(zr_gpt_backward_unit(&r->m, u, r->p[u], r->p[0], r->g[u], r->g[0]));
    }
}

/* The logits (the final LayerNorm's output times wte, in fp64) against transformers'. */
static void check_logits(run *r)
{
    char path[512];
    zr_safetensors s = {0};
    snprintf(path, sizeof path, "%s/reference.safetensors", gpt2_dir());
    TEST_OK(zr_safetensors_open(&s, path));
    const zr_safetensors_tensor *t = zr_safetensors_find(&s, "logits");
    const int N = r->B * r->T, V = r->cfg.vocab, C = r->cfg.channels;
    TEST_CHECKF(t != NULL && t->numel == (size_t)N * V, "%s: no logits [%d, %d]", path, N, V);
    float *want = t != NULL && t->numel == (size_t)N * V ? malloc(t->numel * sizeof *want) : NULL;
    if (want != NULL) {
        TEST_OK(zr_safetensors_read_f32(&s, t, want));
        run_forward(r, 0);
        double big = 0, diff = 0;
        for (int n = 0; n < N; n++) {
            for (int v = 0; v < V; v++) {
                double x = 0;
                for (int c = 0; c < C; c++) {
                    x += (double)r->m.lnf[(size_t)n * C + c] * r->p[0][(size_t)v * C + c];
                }
                big = fmax(big, fabs(want[(size_t)n * V + v]));
                diff = fmax(diff, fabs(x - want[(size_t)n * V + v]));
            }
        }
        printf("  logits: max |zr - transformers| / max |transformers| = %.3g\n", diff / big);
        TEST_CHECKF(diff <= 1e-5 * big, "logits differ by %.3g of the largest", diff / big);
    }
    free(want);
    zr_safetensors_close(&s);
}

static void check_grads(run *r, const cJSON *ref)
{
    double loss = run_forward(r, 1), want = num(ref, "loss");
    printf("  loss %.9g, transformers %.9g\n", loss, want);
    TEST_CHECKF(fabs(loss - want) <= 1e-5 * fabs(want), "loss %.9g vs %.9g", loss, want);
    run_backward(r);
    const cJSON *norms = cJSON_GetObjectItemCaseSensitive(ref, "grad_norms");
    int count = 0;
    double worst = 0;
    for (int u = 0; u < r->units; u++) {
        zr_tensor_desc d[ZR_GPT_MAX_UNIT_TENSORS];
        int k = zr_gpt_config_unit_tensors(&r->cfg, u, d);
        for (int i = 0; i < k; i++, count++) {
            char name[64] = "transformer.";
            zr_gpt_config_hf_name(&r->cfg, u, i, name + 12, sizeof name - 12);
            double w = num(norms, name), got = sqrt(zr_sumsq(r->g[u] + d[i].offset, d[i].numel));
            double e = fabs(got - w) / w;
            worst = fmax(worst, isnan(e) ? INFINITY : e);
            TEST_CHECKF(e <= 1e-5, "gradient norm of %s %.9g, transformers %.9g", name, got, w);
        }
    }
    TEST_EQ_INT(count, cJSON_GetArraySize(norms));
    printf("  %d gradient norms: worst relative difference %.3g\n", count, worst);
}

static void check_adamw(run *r, const cJSON *ref)
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
        TEST_CHECKF(e <= 1e-5, "AdamW loss %d: %.9g, transformers %.9g", step - 1, loss, want);
        run_backward(r);
        for (int u = 0; u < r->units; u++) {
            zr_tensor_desc d[ZR_GPT_MAX_UNIT_TENSORS];
            int k = zr_gpt_config_unit_tensors(&r->cfg, u, d);
            for (int i = 0; i < k; i++) {
                size_t o = d[i].offset;
                zr_adamw_update(&hp, hp.lr, step, 1.0f, d[i].decay, r->p[u] + o, r->g[u] + o,
                                r->mo[u] + o, r->vo[u] + o, d[i].numel);
            }
        }
    }
    printf("  %d AdamW losses: worst relative difference %.3g\n", cJSON_GetArraySize(losses),
           worst);
}

static void test_vs_transformers(void)
{
    run r;
    cJSON *ref = NULL;
    if (run_open(&r, &ref)) {
        const zr_gpt_config *c = &r.cfg;
        TEST_CHECKF(c->max_t == 64 && c->vocab == 320 && c->padded_vocab == 384 && c->layers == 2 &&
                        c->heads == 4 && c->channels == 64,
                    "config maxT %d V %d Vp %d L %d NH %d C %d", c->max_t, c->vocab,
                    c->padded_vocab, c->layers, c->heads, c->channels);
        check_logits(&r);
        check_grads(&r, ref);
        check_adamw(&r, ref);
    }
    cJSON_Delete(ref);
    run_free(&r);
}

/* Ranges around every tensor's start and the unit's end, of odd lengths: the whole unit's parts. */
static void test_ranges(void)
{
    zr_gpt_config cfg;
    TEST_OK(zr_gpt_read_hf_config(gpt2_dir(), &cfg));
    if (zr_test_failed_checks != 0) {
        return;
    }
    float **p = units_load(&cfg, gpt2_dir());
    long ranges = 0, wrong = 0;
    zr_test_rng rng = {0x9b7};
    for (int u = 0; u < zr_gpt_config_unit_count(&cfg); u++) {
        size_t n = zr_gpt_config_unit_numel(&cfg, u);
        float *r = malloc((n + 1) * sizeof *r);
        zr_tensor_desc d[ZR_GPT_MAX_UNIT_TENSORS];
        int k = zr_gpt_config_unit_tensors(&cfg, u, d);
        size_t at[ZR_GPT_MAX_UNIT_TENSORS + 2];
        for (int i = 0; i < k; i++) {
            at[i] = d[i].offset;
        }
        at[k] = n;
        at[k + 1] = (size_t)cfg.vocab * cfg.channels; /* unit 0: where wte's padding starts */
        for (int i = 0; i < k + 2; i++) {
            const size_t back[4] = {0, 1, 67, 1000}, counts[4] = {1, 7, 131, 4099};
            for (int j = 0; j < 16; j++, ranges++) {
                size_t f0 = at[i] > back[j / 4] ? at[i] - back[j / 4] : 0;
                f0 = f0 < n ? f0 : n - 1;
                size_t cn = counts[j % 4] < n - f0 ? counts[j % 4] : n - f0;
                r[cn] = 7.0f;
                TEST_OK(zr_gpt_read_hf_range(gpt2_dir(), &cfg, u, f0, cn, r));
                wrong += memcmp(r, p[u] + f0, cn * sizeof *r) != 0 || r[cn] != 7.0f;
            }
        }
        for (int j = 0; j < 8; j++, ranges++) {
            size_t f0 = zr_test_rng_next(&rng) % n, cn = 1 + zr_test_rng_next(&rng) % (n - f0);
            TEST_OK(zr_gpt_read_hf_range(gpt2_dir(), &cfg, u, f0, cn, r));
            wrong += memcmp(r, p[u] + f0, cn * sizeof *r) != 0;
        }
        free(r);
    }
    /* wte's padding rows are zero, the rows before them not */
    size_t pad0 = (size_t)cfg.vocab * cfg.channels, pad1 = (size_t)cfg.padded_vocab * cfg.channels;
    int zeros = 1;
    for (size_t i = pad0; i < pad1; i++) {
        zeros &= p[0][i] == 0.0f;
    }
    TEST_CHECK(zeros && p[0][pad0 - 1] != 0.0f);
    printf("  %ld ranges of %d units: %ld wrong\n", ranges, zr_gpt_config_unit_count(&cfg), wrong);
    TEST_CHECK(wrong == 0);
    float x;
    TEST_FAILS(zr_gpt_read_hf_range(gpt2_dir(), &cfg, 3, 126, 5, &x), ZR_ERR_INVALID,
               "elements [126, 126 + 5) of unit 3's 128");
    TEST_FAILS(zr_gpt_read_hf_range(gpt2_dir(), &cfg, 4, 0, 1, &x), ZR_ERR_INVALID,
               "unit 4 does not exist");
    units_free(&cfg, p);
    zr_error_clear();
}

/* A folder holding config.json and the given tensors (tmp_dir/name). */
static const char *folder(const char *name, const test_st_tensor *t, int n)
{
    static char dir[128];
    char path[256], src[512], *text = NULL;
    size_t len = 0;
    snprintf(dir, sizeof dir, "%s/%s", tmp_dir, name);
    snprintf(path, sizeof path, "mkdir -p %s", dir);
    TEST_CHECK(system(path) == 0);
    snprintf(src, sizeof src, "%s/config.json", gpt2_dir());
    TEST_OK(zr_file_read_all(src, &text, &len));
    snprintf(path, sizeof path, "%s/config.json", dir);
    zr_test_write_file(path, text, len);
    zr_free(text);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (t != NULL) {
        test_st_write(path, NULL, t, n);
    }
    return dir;
}

/* zr's own safetensors file (names without "transformer.") reads back bit for bit. */
static void test_round_trip(void)
{
    zr_gpt_config cfg;
    char path[256];
    TEST_OK(zr_gpt_read_hf_config(gpt2_dir(), &cfg));
    if (zr_test_failed_checks != 0) {
        return;
    }
    float **p = units_load(&cfg, gpt2_dir());
    const char *dir = folder("zr_written", NULL, 0);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    TEST_OK(zr_gpt_write_safetensors(path, &cfg, p));
    float **q = units_load(&cfg, dir);
    TEST_CHECKF(units_same(&cfg, p, q), "zr's safetensors file reads back different weights");
    units_free(&cfg, q);
    units_free(&cfg, p);
}

/* Index of the tensor called name in c (-1: none). */
static int find(const test_st_copy *c, const char *name)
{
    for (int i = 0; i < c->n; i++) {
        if (strcmp(c->names[i], name) == 0) {
            return i;
        }
    }
    return -1;
}

/* Loading unit u of the folder fails with ZR_ERR_FORMAT and a message holding want. */
static void load_refused(const char *dir, const zr_gpt_config *cfg, int u, const char *want)
{
    size_t n = zr_gpt_config_unit_numel(cfg, u);
    float *x = malloc(n * sizeof *x);
    TEST_FAILS(zr_gpt_read_hf_range(dir, cfg, u, 0, n, x), ZR_ERR_FORMAT, want);
    printf("  %s\n", zr_error_message() + strlen(tmp_dir) + 1);
    free(x);
}

/* The mask buffers accepted; extra, missing, misshapen and non-finite tensors refused. */
static void test_tensors_refused(void)
{
    char src[512];
    zr_gpt_config cfg;
    TEST_OK(zr_gpt_read_hf_config(gpt2_dir(), &cfg));
    snprintf(src, sizeof src, "%s/model.safetensors", gpt2_dir());
    test_st_copy c;
    test_st_copy_open(&c, src);
    const int n = c.n;
    test_st_tensor *t = calloc((size_t)n + 2, sizeof *t);
    if (zr_test_failed_checks != 0 || find(&c, "transformer.h.0.attn.c_attn.weight") < 0) {
        TEST_CHECK(0);
        goto done;
    }
    float **p = units_load(&cfg, gpt2_dir());
    /* old files' buffers: accepted, the weights the same */
    memcpy(t, c.t, (size_t)n * sizeof *t);
    t[n] = (test_st_tensor){"transformer.h.0.attn.bias", "U8", 4, {1, 1, 64, 64}, NULL, 4096};
    t[n + 1] = (test_st_tensor){"transformer.h.1.attn.masked_bias", "F32", 0, {0}, NULL, 4};
    float **q = units_load(&cfg, folder("buffers", t, n + 2));
    TEST_CHECKF(units_same(&cfg, p, q), "a folder with attn.bias buffers loads other weights");
    units_free(&cfg, q);
    units_free(&cfg, p);
    const struct {
        const char *name, *dtype, *want;
        int ndim;
        int64_t shape[2];
    } extra[] = {
        {"lm_head.weight",
         "F32",
         "tensor lm_head.weight is not one of GPT-2's (2 layers, names with \"transformer.\", the "
         "head tied to wte",
         2,
         {320, 64}},
        {"transformer.h.2.ln_1.weight",
         "F32",
         "tensor transformer.h.2.ln_1.weight is not one of GPT-2's",
         1,
         {64}},
        {"transformer.h.01.ln_1.weight",
         "F32",
         "tensor transformer.h.01.ln_1.weight is not",
         1,
         {64}},
        {"h.0.ln_1.weight", "F32", "tensor h.0.ln_1.weight is not one of GPT-2's", 1, {64}},
        {"transformer.h.0.attn.c_attn.weight_scale",
         "F32",
         "tensor transformer.h.0.attn.c_attn.weight_scale is not",
         1,
         {64}},
    };
    for (size_t k = 0; k < sizeof extra / sizeof extra[0]; k++) {
        memcpy(t, c.t, (size_t)n * sizeof *t);
        size_t bytes =
            4 * (size_t)extra[k].shape[0] * (size_t)(extra[k].ndim > 1 ? extra[k].shape[1] : 1);
        t[n] = (test_st_tensor){extra[k].name, extra[k].dtype,
                                extra[k].ndim, {extra[k].shape[0], extra[k].shape[1]},
                                NULL,          bytes};
        load_refused(folder("extra", t, n + 1), &cfg, 3, extra[k].want);
    }
    /* missing: refused by the unit that needs it only */
    memcpy(t, c.t, (size_t)n * sizeof *t);
    int fcb = find(&c, "transformer.h.1.mlp.c_fc.bias");
    t[fcb] = t[n - 1];
    const char *dir = folder("missing", t, n - 1);
    float *x = malloc(zr_gpt_config_unit_numel(&cfg, 0) * sizeof *x);
    TEST_OK(zr_gpt_read_hf_range(dir, &cfg, 0, 0, zr_gpt_config_unit_numel(&cfg, 0), x));
    free(x);
    load_refused(dir, &cfg, 2,
                 "model.safetensors: tensor transformer.h.1.mlp.c_fc.bias is missing");
    /* misshapen: Conv1D stored as zr's [out, in], wte padded, a vector as a matrix */
    const struct {
        const char *name;
        int ndim;
        int64_t shape[2];
        int unit;
        const char *want;
    } shapes[] = {
        {"transformer.h.0.attn.c_attn.weight",
         2,
         {192, 64},
         1,
         "tensor transformer.h.0.attn.c_attn.weight has shape [192, 64], GPT-2's is [64, "
         "192]"},
        {"transformer.wte.weight",
         2,
         {384, 64},
         0,
         "tensor transformer.wte.weight has shape [384, 64], GPT-2's is [320, 64]"},
        {"transformer.ln_f.bias",
         2,
         {1, 64},
         3,
         "tensor transformer.ln_f.bias has shape [1, 64], GPT-2's is [64]"},
    };
    float *zeros = calloc(384 * 64, sizeof *zeros);
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        memcpy(t, c.t, (size_t)n * sizeof *t);
        int i = find(&c, shapes[k].name);
        t[i].ndim = shapes[k].ndim;
        t[i].shape[0] = shapes[k].shape[0], t[i].shape[1] = shapes[k].shape[1];
        t[i].data = zeros;
        t[i].bytes = 4 * (size_t)(shapes[k].shape[0] * shapes[k].shape[1]);
        load_refused(folder("shape", t, n), &cfg, shapes[k].unit, shapes[k].want);
    }
    free(zeros);
    /* a weight that is not a number */
    memcpy(t, c.t, (size_t)n * sizeof *t);
    int cp = find(&c, "transformer.h.1.mlp.c_proj.weight");
    float *nan = malloc(t[cp].bytes);
    memcpy(nan, t[cp].data, t[cp].bytes);
    nan[5] = NAN;
    t[cp].data = nan;
    load_refused(folder("nan", t, n), &cfg, 2,
                 "tensor transformer.h.1.mlp.c_proj.weight holds a non-finite weight (nan)");
    free(nan);
done:
    free(t);
    test_st_copy_close(&c);
    zr_error_clear();
}

/* Configurations zr's GPT-2 is not: refused naming the key; a Llama folder naming its family. */
static void test_config_refused(void)
{
    char src[512], path[256], *text = NULL;
    size_t len = 0;
    zr_gpt_config cfg;
    snprintf(src, sizeof src, "%s/config.json", gpt2_dir());
    TEST_OK(zr_file_read_all(src, &text, &len));
    const struct {
        const char *from, *to, *want;
    } cases[] = {
        {"\"n_inner\": null", "\"n_inner\": 128",
         "key \"n_inner\" is 128; zr's GPT-2 MLP is 4 x n_embd = 256"},
        {"\"layer_norm_epsilon\": 1e-05", "\"layer_norm_epsilon\": 1e-06",
         "key \"layer_norm_epsilon\" is 1e-06"},
        {"\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false",
         "key \"tie_word_embeddings\" is false"},
    };
    for (size_t k = 0; text != NULL && k < sizeof cases / sizeof cases[0]; k++) {
        char *at = strstr(text, cases[k].from), *out = malloc(len + 64);
        TEST_CHECKF(at != NULL, "%s lacks %s", src, cases[k].from);
        if (at != NULL) {
            int w = snprintf(out, len + 64, "%.*s%s%s", (int)(at - text), text, cases[k].to,
                             at + strlen(cases[k].from));
            snprintf(path, sizeof path, "%s/config.json", tmp_dir);
            zr_test_write_file(path, out, (size_t)w);
            TEST_FAILS(zr_gpt_read_hf_config(tmp_dir, &cfg), ZR_ERR_INVALID, cases[k].want);
            printf("  %s\n", zr_error_message() + strlen(tmp_dir) + 1);
        }
        free(out);
    }
    zr_free(text);
    char llama[512];
    snprintf(llama, sizeof llama, "%s/../llama_gqa", gpt2_dir());
    TEST_FAILS(zr_gpt_read_hf_config(llama, &cfg), ZR_ERR_INVALID, "LlamaForCausalLM is not GPT-2");
    zr_error_clear();
}

int main(void)
{
    char cmd[128];
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/zr_test_gpt_hf_%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "mkdir -p %s", tmp_dir);
    if (system(cmd) != 0) {
        return 1;
    }
    TEST_OK(zr_threads_set(1));
    TEST_RUN(test_vs_transformers);
    TEST_RUN(test_ranges);
    TEST_RUN(test_round_trip);
    TEST_RUN(test_tensors_refused);
    TEST_RUN(test_config_refused);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "cannot remove %s\n", tmp_dir);
    }
    return zr_test_finish();
}
