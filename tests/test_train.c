/*
 * test_train.c - end to end on one process: a tiny GPT-2 trained with AdamW
 * on the bundled fortunes corpus (byte tokens) must reach a clearly lower
 * validation loss. Release suite only (a few seconds optimised; the threshold leaves a wide
 * margin).
 */
#include "test.h"
#include "zr/data.h"
#include "zr/model.h"
#include "zr/optim.h"
#include "zr/schedule.h"

enum { B = 8, T = 64, STEPS = 600, VAL_BATCHES = 8 };

static float val_loss(zr_gpt *m, const zr_dataset *ds, float **p)
{
    zr_loader v;
    TEST_OK(zr_loader_init(&v, ds, ZR_SPLIT_VAL, B, T, 0, 1));
    int in[B * T], tg[B * T];
    double sum = 0;
    for (int i = 0; i < VAL_BATCHES; i++) {
        zr_loader_next(&v, in, tg);
        TEST_OK(zr_gpt_forward_begin(m, in, tg));
        for (int u = 0; u < zr_gpt_unit_count(m); u++) {
            TEST_OK(zr_gpt_forward_unit(m, u, p[u], p[0]));
        }
        sum += zr_gpt_loss(m);
    }
    return (float)(sum / VAL_BATCHES);
}

static void test_train_fortunes(void)
{
    zr_dataset ds;
    TEST_OK(zr_dataset_load_fortunes(&ds, NULL));
    zr_gpt_config cfg = {T, 256, 256, 2, 4, 64};
    zr_gpt m;
    TEST_OK(zr_gpt_init(&m, &cfg, B, T));
    int nu = zr_gpt_unit_count(&m);
    float *p[4], *g[4], *mm[4], *vv[4];
    for (int u = 0; u < nu; u++) {
        size_t n = zr_gpt_unit_numel(&m, u);
        TEST_OK(zr_alloc_at((void **)&p[u], n * 4, __FILE__, __LINE__));
        TEST_OK(zr_alloc_at((void **)&g[u], n * 4, __FILE__, __LINE__));
        TEST_OK(zr_alloc_at((void **)&mm[u], n * 4, __FILE__, __LINE__));
        TEST_OK(zr_alloc_at((void **)&vv[u], n * 4, __FILE__, __LINE__));
        zr_gpt_unit_init_params(&m, u, p[u], 1234);
    }
    zr_loader tr;
    TEST_OK(zr_loader_init(&tr, &ds, ZR_SPLIT_TRAIN, B, T, 0, 1));
    float before = val_loss(&m, &ds, p);
    zr_adamw h = zr_adamw_default();
    /* linear warm-up over 20 steps to 3e-3, cosine down to a tenth of it */
    zr_lr_schedule sched = {.kind = ZR_LR_WARMUP_COSINE,
                            .warmup = ZR_WARMUP_LINEAR,
                            .lr = 3e-3,
                            .warmup_num_steps = 20,
                            .total_num_steps = STEPS,
                            .cos_min_ratio = 0.1};
    int in[B * T], tg[B * T];
    float loss = 0;
    for (int step = 0; step < STEPS; step++) {
        zr_loader_next(&tr, in, tg);
        for (int u = 0; u < nu; u++) {
            memset(g[u], 0, zr_gpt_unit_numel(&m, u) * 4);
        }
        TEST_OK(zr_gpt_forward_begin(&m, in, tg));
        for (int u = 0; u < nu; u++) {
            TEST_OK(zr_gpt_forward_unit(&m, u, p[u], p[0]));
        }
        loss = zr_gpt_loss(&m);
        TEST_OK(zr_gpt_backward_begin(&m));
        for (int u = nu - 1; u >= 0; u--) {
            TEST_OK(zr_gpt_backward_unit(&m, u, p[u], p[0], g[u], g[0]));
        }
        double ss = 0;
        for (int u = 0; u < nu; u++) {
            ss += zr_sumsq(g[u], zr_gpt_unit_numel(&m, u));
        }
        float scale = zr_clip_scale(sqrt(ss), 1.0f);
        float lr = (float)zr_lr_at(&sched, step);
        for (int u = 0; u < nu; u++) {
            const zr_tensor_desc *d;
            int nt = zr_gpt_unit_tensors(&m, u, &d);
            for (int i = 0; i < nt; i++) {
                size_t o = d[i].offset;
                zr_adamw_update(&h, lr, step + 1, scale, d[i].decay, p[u] + o, g[u] + o, mm[u] + o,
                                vv[u] + o, d[i].numel);
            }
        }
    }
    float after = val_loss(&m, &ds, p);
    printf("  val loss %.3f -> %.3f after %d steps (last train loss %.3f)\n", before, after, STEPS,
           loss);
    TEST_NEAR(before, log(256.0), 0.1);
    TEST_CHECKF(after < 3.0f, "validation loss %.3f did not fall below 3.0", after);
    for (int u = 0; u < nu; u++) {
        zr_free(p[u]);
        zr_free(g[u]);
        zr_free(mm[u]);
        zr_free(vv[u]);
    }
    zr_gpt_free(&m);
    zr_dataset_free(&ds);
}

int main(void)
{
    zr_gpt_set_threads(1);
    TEST_RUN(test_train_fortunes);
    return zr_test_finish();
}
