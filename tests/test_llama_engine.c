/*
 * test_llama_engine.c - the Llama family trained through the ZeRO engine
 * (issue 43): each reference folder of tests/data/hf read by `zr train
 * --init`'s loader (each rank reading its shards), then the 10 AdamW steps
 * scripts/hf_reference.py recorded from torch.optim.AdamW, at every stage
 * and with ZeRO++, at the world size the test runs at (1, 2, and 4 ranks on
 * 2 emulated nodes).
 *
 * The reference batch has B = 2 rows. W ranks split it when W divides it;
 * at W = 4 rank r takes row r % 2, so that the global batch is the
 * reference's rows twice: the same mean loss and the same mean gradient.
 *
 * Bounds: fp32 on the wire (stages 0-3, hpZ) must give transformers'
 * losses within 1e-5 relative, what the issue asks (measured: 3.7e-7 at
 * most). qwZ gathers INT8 weights (blocks scaled by their largest
 * magnitude: an element's error up to max/254): every loss within 1e-2
 * (measured 6.8e-3 at most). qgZ reduces INT4 gradients: the loss before
 * the first step is exact (1e-5: qgZ changes nothing forward), and ten Adam
 * steps on one batch, which normalise every element's gradient and so
 * amplify the quantization of the small ones, must still bring the loss
 * down by at least 85% of what transformers' steps do (measured: 93% at
 * least), each loss within 15% of the reference's (measured 12.2% at most
 * at W = 4). test_zeropp holds ZeRO++ to 2% of ZeRO-3 over 300 steps.
 */
#define ZR_TEST_MPI
#include "test.h"

#include "zr/file.h"
#include "zr/gpt_engine.h"

#include <cJSON.h>
#include <math.h>
#include <stdlib.h>

#define STEPS 10

static int W, R;
static zr_comm comm;

static const char *data_dir(void)
{
    const char *r = getenv("ZR_HF_DATA");
    return r != NULL ? r : "tests/data/hf";
}

typedef struct ref {
    int B, T;
    int *in, *tg; /* [B, T] */
    double losses[STEPS];
} ref;

static int ref_read(const char *dir, ref *r)
{
    char path[1024], *text = NULL;
    size_t n = 0;
    snprintf(path, sizeof path, "%s/reference.json", dir);
    TEST_OK(zr_file_read_all(path, &text, &n));
    cJSON *j = text != NULL ? cJSON_Parse(text) : NULL;
    zr_free(text);
    TEST_CHECKF(j != NULL, "%s: not JSON", path);
    if (j == NULL) {
        return 0;
    }
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(j, "tokens");
    const cJSON *losses = cJSON_GetObjectItemCaseSensitive(j, "adamw_losses");
    r->B = cJSON_GetArraySize(rows);
    r->T = r->B > 0 ? cJSON_GetArraySize(cJSON_GetArrayItem(rows, 0)) - 1 : 0;
    int ok = r->B > 0 && r->T > 0 && cJSON_GetArraySize(losses) == STEPS;
    r->in = malloc(sizeof(int) * (size_t)(r->B > 0 ? r->B : 1) * (size_t)(r->T > 0 ? r->T : 1));
    r->tg = malloc(sizeof(int) * (size_t)(r->B > 0 ? r->B : 1) * (size_t)(r->T > 0 ? r->T : 1));
    for (int b = 0; ok && b < r->B; b++) {
        const cJSON *row = cJSON_GetArrayItem(rows, b);
        ok = cJSON_GetArraySize(row) == r->T + 1;
        for (int t = 0; ok && t < r->T; t++) {
            r->in[b * r->T + t] = cJSON_GetArrayItem(row, t)->valueint;
            r->tg[b * r->T + t] = cJSON_GetArrayItem(row, t + 1)->valueint;
        }
    }
    for (int i = 0; ok && i < STEPS; i++) {
        r->losses[i] = cJSON_GetArrayItem(losses, i)->valuedouble;
    }
    cJSON_Delete(j);
    TEST_CHECKF(ok, "%s: tokens or losses malformed", path);
    return ok;
}

typedef struct mode {
    const char *name;
    int stage, qwz, hpz, qgz;
    double bound; /* relative, against transformers' losses */
    double first; /* the same for the loss before the first step */
    double drop;  /* least fraction of transformers' fall of the loss over the steps */
} mode;

/* The 10 losses of one mode; returns the largest relative error against the reference. */
static double train(const char *dir, const ref *rf, const mode *md, double losses[STEPS])
{
    zr_gpt_config cfg;
    TEST_OK(zr_gpt_config_read_hf(dir, &cfg));
    /* W <= B: rank r takes rows [r B/W, (r+1) B/W); W > B: row r % B */
    int rows = W <= rf->B ? rf->B / W : 1, first = W <= rf->B ? R * rows : R % rf->B;
    zr_engine_config ec = zr_engine_config_default();
    ec.stage = md->stage;
    ec.qwz = md->qwz;
    ec.hpz = md->hpz;
    ec.qgz = md->qgz;
    ec.param_wire.type = ZR_WIRE_F32;
    ec.grad_wire.type = ZR_WIRE_F32;
    ec.grad_clip = 0.0f; /* the reference does not clip */
    zr_gpt_specs sp;
    zr_engine e;
    zr_gpt_run run;
    zr_device cpu = zr_device_cpu();
    zr_gpt_shape shape = {rows, rf->T, 0, ZR_DTYPE_F32};
    TEST_OK(zr_gpt_specs_init(&sp, &cfg));
    TEST_OK(zr_engine_init(&e, &comm, &ec, sp.nunits, sp.units));
    TEST_OK(zr_gpt_engine_load_hf(&e, &cfg, dir));
    TEST_OK(zr_gpt_run_init(&run, &cpu, &cfg, &shape, &ec));
    double worst = 0;
    for (int s = 0; s < STEPS; s++) {
        float local = NAN;
        zr_step_stats st;
        const int *in = rf->in + (size_t)first * rf->T, *tg = rf->tg + (size_t)first * rf->T;
        TEST_OK(zr_gpt_engine_micro(&run, &e, in, tg, &local));
        TEST_OK(zr_engine_step(&e, 1e-3f, &st));
        double v = local;
        TEST_OK(zr_comm_allreduce_sum_f64(&comm, ZR_GROUP_WORLD, &v, 1));
        losses[s] = v / W;
        double rel = fabs(losses[s] - rf->losses[s]) / fabs(rf->losses[s]);
        worst = rel > worst ? rel : worst;
    }
    zr_gpt_run_free(&run);
    zr_engine_free(&e);
    zr_gpt_specs_free(&sp);
    return worst;
}

static const mode modes[] = {
    {"stage 0", 0, 0, 0, 0, 1e-5, 1e-5, 0.99},
    {"stage 1", 1, 0, 0, 0, 1e-5, 1e-5, 0.99},
    {"stage 2", 2, 0, 0, 0, 1e-5, 1e-5, 0.99},
    {"stage 3", 3, 0, 0, 0, 1e-5, 1e-5, 0.99},
    {"stage 3 + hpZ", 3, 0, 1, 0, 1e-5, 1e-5, 0.99},
    {"stage 3 + qwZ", 3, 1, 0, 0, 1e-2, 1e-2, 0.97},
    {"stage 3 + qgZ", 3, 0, 0, 1, 0.15, 1e-5, 0.85},
    {"ZeRO++ (all)", 3, 1, 1, 1, 0.15, 1e-2, 0.85},
};

static void test_model(const char *name)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", data_dir(), name);
    ref rf = {0};
    if (!ref_read(dir, &rf)) {
        free(rf.in), free(rf.tg);
        return;
    }
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        const mode *md = &modes[i];
        if (md->hpz && comm.n_nodes < 2) {
            continue; /* hpZ's secondary needs nodes; W = 1 and 2 run on one */
        }
        double losses[STEPS];
        double worst = train(dir, &rf, md, losses);
        double first = fabs(losses[0] - rf.losses[0]) / rf.losses[0];
        double drop = (losses[0] - losses[STEPS - 1]) / (rf.losses[0] - rf.losses[STEPS - 1]);
        if (R == 0) {
            printf("  %-15s %-14s W %d: losses %.6f .. %.6f, largest error %.2e (bound %.2g), "
                   "first %.2e, fall %.3f of transformers'\n",
                   name, md->name, W, losses[0], losses[STEPS - 1], worst, md->bound, first, drop);
        }
        TEST_CHECKF(worst <= md->bound,
                    "%s %s at W %d: a loss %.2e from transformers' (bound %.2g)", name, md->name, W,
                    worst, md->bound);
        TEST_CHECKF(first <= md->first, "%s %s at W %d: the first loss %.2e from transformers'",
                    name, md->name, W, first);
        TEST_CHECKF(drop >= md->drop,
                    "%s %s at W %d: the loss fell %.3f of transformers' (least %.2f)", name,
                    md->name, W, drop, md->drop);
    }
    free(rf.in);
    free(rf.tg);
}

static void test_llama_gqa(void)
{
    test_model("llama_gqa");
}

static void test_llama_mha_tied(void)
{
    test_model("llama_mha_tied");
}

static void test_qwen2(void)
{
    test_model("qwen2");
}

int main(int argc, char **argv)
{
    zr_test_mpi_init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    zr_gpt_set_threads(1);
    if (zr_comm_init(&comm, MPI_COMM_WORLD, NULL) != ZR_OK) {
        fprintf(stderr, "set-up: %s\n", zr_error_message());
        return 1;
    }
    TEST_RUN(test_llama_gqa);
    TEST_RUN(test_llama_mha_tied);
    TEST_RUN(test_qwen2);
    zr_comm_free(&comm);
    return zr_test_finish();
}
