/*
 * test_schedule.c - DeepSpeed's learning-rate schedulers against values
 * worked out by hand from DeepSpeed's formulas (deepspeed/runtime/
 * lr_schedules.py): each expected value below is the formula with the
 * numbers put in, so a change of formula or of an edge case fails here.
 */
#include "test.h"

#include "zr/schedule.h"

/* log(5) / log(10), cos(pi / 100) */
#define LOG5_LOG10 0.698970004336018805
#define COS_PI_100 0.999506560365731715

static zr_lr_schedule sched(zr_lr_kind kind, zr_lr_warmup warmup, int64_t warm, int64_t total)
{
    zr_lr_schedule s;
    memset(&s, 0, sizeof s);
    s.kind = kind;
    s.warmup = warmup;
    s.lr = 1e-3;
    s.warmup_min_lr = 1e-4;
    s.warmup_max_lr = 1e-3;
    s.warmup_num_steps = warm;
    s.total_num_steps = total;
    s.warmup_min_ratio = 0.0;
    s.cos_min_ratio = 0.1;
    return s;
}

#define LR_IS(s, step, want) TEST_NEAR(zr_lr_at(&(s), (step)), (want), 1e-15)

static void test_warmup_lr(void)
{
    zr_lr_schedule s = sched(ZR_LR_WARMUP, ZR_WARMUP_LOG, 10, 0);
    LR_IS(s, 0, 1e-4);                     /* log(1) = 0: starts at min_lr */
    LR_IS(s, 4, 1e-4 + 9e-4 * LOG5_LOG10); /* log(5) / log(10) of the way */
    LR_IS(s, 9, 1e-3);                     /* log(10) / log(10) = 1 */
    LR_IS(s, 10, 1e-3);                    /* then stays at max_lr */
    LR_IS(s, 1000000, 1e-3);
    s.warmup = ZR_WARMUP_LINEAR;
    LR_IS(s, 4, 1e-4 + 9e-4 * 0.4); /* 4 / 10 */
    LR_IS(s, 9, 1e-4 + 9e-4 * 0.9);
    /* warmup_num_steps below 2 is raised to 2 (log(1) would divide by zero) */
    s = sched(ZR_LR_WARMUP, ZR_WARMUP_LOG, 1, 0);
    LR_IS(s, 0, 1e-4);
    LR_IS(s, 1, 1e-3);
    s = sched(ZR_LR_WARMUP, ZR_WARMUP_LINEAR, 0, 0);
    LR_IS(s, 0, 1e-4);
    LR_IS(s, 1, 1e-4 + 9e-4 * 0.5); /* 1 / 2 */
    LR_IS(s, 2, 1e-3);
}

static void test_warmup_decay_lr(void)
{
    zr_lr_schedule s = sched(ZR_LR_WARMUP_DECAY, ZR_WARMUP_LINEAR, 10, 110);
    LR_IS(s, 5, 1e-4 + 9e-4 * 0.5);
    LR_IS(s, 10, 1e-3);              /* (110 - 10) / (110 - 10) */
    LR_IS(s, 60, 1e-4 + 9e-4 * 0.5); /* (110 - 60) / 100 */
    LR_IS(s, 109, 1e-4 + 9e-4 * 0.01);
    LR_IS(s, 110, 1e-4); /* gamma 0: min_lr */
    LR_IS(s, 500, 1e-4); /* clamped at 0, never negative */
    /* total <= warmup: the denominator is max(1, total - warmup) */
    s = sched(ZR_LR_WARMUP_DECAY, ZR_WARMUP_LINEAR, 10, 10);
    LR_IS(s, 10, 1e-4);
}

static void test_warmup_cosine_lr(void)
{
    zr_lr_schedule s = sched(ZR_LR_WARMUP_COSINE, ZR_WARMUP_LINEAR, 10, 110);
    LR_IS(s, 0, 0.0); /* warmup_min_ratio 0 */
    LR_IS(s, 5, 1e-3 * 0.5);
    /* first step after warm-up: (1 + cos(pi * 1/100)) / 2 of the way down */
    LR_IS(s, 10, 1e-3 * (0.1 + 0.9 * (1.0 + COS_PI_100) / 2.0));
    LR_IS(s, 59, 1e-3 * (0.1 + 0.9 * 0.5)); /* 50 / 100: half way */
    LR_IS(s, 109, 1e-3 * 0.1);              /* cos(pi): the floor */
    LR_IS(s, 500, 1e-3 * 0.1);              /* held at the floor, no rise */
    s.warmup = ZR_WARMUP_LOG;
    s.warmup_min_ratio = 0.2;
    LR_IS(s, 4, 1e-3 * (0.2 + 0.8 * LOG5_LOG10));
    /* no decay window (total == warmup): every later step at the floor */
    s = sched(ZR_LR_WARMUP_COSINE, ZR_WARMUP_LINEAR, 10, 10);
    LR_IS(s, 10, 1e-3 * 0.1);
    LR_IS(s, 11, 1e-3 * 0.1);
}

static void test_constant_and_names(void)
{
    zr_lr_schedule s = sched(ZR_LR_CONSTANT, ZR_WARMUP_LOG, 10, 110);
    LR_IS(s, 0, 1e-3);
    LR_IS(s, 99, 1e-3);
    zr_lr_kind k;
    zr_lr_warmup w;
    TEST_OK(zr_lr_kind_parse("WarmupCosineLR", &k));
    TEST_EQ_INT(k, ZR_LR_WARMUP_COSINE);
    TEST_OK(zr_lr_kind_parse("", &k));
    TEST_EQ_INT(k, ZR_LR_CONSTANT);
    TEST_FAILS(zr_lr_kind_parse("OneCycle", &k), ZR_ERR_INVALID, "'OneCycle'");
    TEST_OK(zr_lr_warmup_parse("linear", &w));
    TEST_EQ_INT(w, ZR_WARMUP_LINEAR);
    TEST_FAILS(zr_lr_warmup_parse("exp", &w), ZR_ERR_INVALID, "'exp'");
}

int main(void)
{
    TEST_RUN(test_warmup_lr);
    TEST_RUN(test_warmup_decay_lr);
    TEST_RUN(test_warmup_cosine_lr);
    TEST_RUN(test_constant_and_names);
    return zr_test_finish();
}
