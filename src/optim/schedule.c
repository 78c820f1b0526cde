/*
 * schedule.c - DeepSpeed's learning-rate schedulers; the formulas and their
 * edge cases (warm-up of at least 2 steps, the decay denominator of at least
 * 1, the cosine held at its floor after total_num_steps) are DeepSpeed's, so
 * that a configuration moved from DeepSpeed trains with the same rates.
 * See include/zr/schedule.h.
 */
#include "zr/schedule.h"

#include <math.h>
#include <string.h>

zr_status zr_lr_kind_parse(const char *name, zr_lr_kind *out)
{
    static const struct {
        const char *name;
        zr_lr_kind kind;
    } kinds[] = {{"", ZR_LR_CONSTANT},
                 {"constant", ZR_LR_CONSTANT},
                 {"WarmupLR", ZR_LR_WARMUP},
                 {"WarmupDecayLR", ZR_LR_WARMUP_DECAY},
                 {"WarmupCosineLR", ZR_LR_WARMUP_COSINE}};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        if (name != NULL && strcmp(name, kinds[i].name) == 0) {
            *out = kinds[i].kind;
            return ZR_OK;
        }
    }
    ZR_FAIL(ZR_ERR_INVALID,
            "unknown scheduler type '%s' (WarmupLR, WarmupDecayLR, WarmupCosineLR, or none)",
            name != NULL ? name : "(null)");
}

zr_status zr_lr_warmup_parse(const char *name, zr_lr_warmup *out)
{
    if (name != NULL && strcmp(name, "log") == 0) {
        *out = ZR_WARMUP_LOG;
        return ZR_OK;
    }
    if (name != NULL && strcmp(name, "linear") == 0) {
        *out = ZR_WARMUP_LINEAR;
        return ZR_OK;
    }
    ZR_FAIL(ZR_ERR_INVALID, "unknown warmup_type '%s' (log or linear)",
            name != NULL ? name : "(null)");
}

/* DeepSpeed never warms up over fewer than 2 steps (log(1) would divide by 0). */
static int64_t warmup_steps(const zr_lr_schedule *s)
{
    return s->warmup_num_steps < 2 ? 2 : s->warmup_num_steps;
}

/* Warm-up progress in [0, 1) for step < warmup_steps(s). */
static double warmup_gamma(const zr_lr_schedule *s, int64_t step)
{
    double w = (double)warmup_steps(s);
    if (s->warmup == ZR_WARMUP_LINEAR) {
        return (double)step / w;
    }
    return log((double)step + 1.0) / log(w);
}

double zr_lr_at(const zr_lr_schedule *s, int64_t step)
{
    ZR_ASSERT(step >= 0);
    int64_t warm = warmup_steps(s);
    switch (s->kind) {
    case ZR_LR_CONSTANT:
        return s->lr;
    case ZR_LR_WARMUP:
    case ZR_LR_WARMUP_DECAY: {
        double gamma = 1.0;
        if (step < warm) {
            gamma = warmup_gamma(s, step);
        } else if (s->kind == ZR_LR_WARMUP_DECAY) {
            double span = (double)(s->total_num_steps - warm);
            gamma = (double)(s->total_num_steps - step) / (span > 1.0 ? span : 1.0);
            gamma = gamma > 0.0 ? gamma : 0.0;
        }
        return s->warmup_min_lr + (s->warmup_max_lr - s->warmup_min_lr) * gamma;
    }
    case ZR_LR_WARMUP_COSINE: {
        double ratio;
        if (step < warm) {
            ratio = s->warmup_min_ratio + (1.0 - s->warmup_min_ratio) * warmup_gamma(s, step);
        } else {
            double span = (double)(s->total_num_steps - warm);
            double progress = (double)(step - warm + 1) / (span > 1.0 ? span : 1.0);
            progress = progress < 1.0 ? progress : 1.0;
            double c = (1.0 + cos(3.14159265358979323846 * progress)) / 2.0;
            ratio = s->cos_min_ratio + (1.0 - s->cos_min_ratio) * c;
            ratio = ratio > 0.0 ? ratio : 0.0;
        }
        return s->lr * ratio;
    }
    }
    ZR_ASSERT(!"unknown schedule kind");
    return 0.0;
}
