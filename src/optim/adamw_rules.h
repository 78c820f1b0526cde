/*
 * adamw_rules.h - one AdamW element update, shared by the CPU reference
 * (optim.c's scalar kernel and the tails of its vector kernels) and the CUDA
 * kernel (adamw_cuda.cu), so both give the same bits (src/base/hd.h).
 *
 * Each line is one correctly rounded IEEE operation in the order written: the
 * CPU builds with -ffp-contract=off and nvcc with --fmad=false (no fused
 * multiply-add), neither with fast-math, so sqrtf and the division are exact
 * on both. The step's constants are computed once on the host (in double,
 * with pow) and passed in, so no transcendental runs per element. Only a
 * NaN's payload may differ between processors (each propagates its own).
 */
#ifndef ZR_ADAMW_RULES_H
#define ZR_ADAMW_RULES_H

#include "../base/hd.h"

#include <math.h>

/* The step's constants, in float as the element rule uses them. */
typedef struct zr_adamw_k {
    float gs, b1, nb1, b2, nb2, c1, c2, eps, wd, lr;
} zr_adamw_k;

/* One element: updates *p, *m, *v from the gradient g. */
ZR_HD void zr_adamw_elem(const zr_adamw_k *k, float *p, float g, float *m, float *v)
{
    float gi = g * k->gs;
    float mi = k->b1 * *m + k->nb1 * gi;
    float vi = k->b2 * *v + k->nb2 * (gi * gi);
    float den = sqrtf(vi * k->c2);
    float upd = (mi * k->c1) / (den + k->eps) + k->wd * *p;
    *m = mi;
    *v = vi;
    *p = *p - k->lr * upd;
}

/*
 * The constants of step t (>= 1), on the host: bias corrections in double,
 * rounded once to float. Shared by the CPU entry point and the CUDA one.
 */
static inline zr_adamw_k zr_adamw_consts(float beta1, float beta2, float eps, float weight_decay,
                                         float lr, int t, float grad_scale, int decay)
{
    zr_adamw_k k;
    k.gs = grad_scale;
    k.b1 = beta1;
    k.nb1 = 1.0f - beta1;
    k.b2 = beta2;
    k.nb2 = 1.0f - beta2;
    k.c1 = (float)(1.0 / (1.0 - pow((double)beta1, (double)t)));
    k.c2 = (float)(1.0 / (1.0 - pow((double)beta2, (double)t)));
    k.eps = eps;
    k.wd = decay ? weight_decay : 0.0f;
    k.lr = lr;
    return k;
}

#endif /* ZR_ADAMW_RULES_H */
