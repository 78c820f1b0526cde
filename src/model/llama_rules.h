/*
 * llama_rules.h - the per-element arithmetic of the Llama family's
 * operators (RMSNorm, rotary embeddings, SwiGLU) as ops_llama.c computes it
 * on the CPU, written once for the CUDA kernels (llama_cuda.cu) so that
 * they give the CPU's bits in fp32 (src/base/hd.h).
 *
 * Each line is one correctly rounded IEEE operation in the order written,
 * in the order of ops_llama.c's lines: the CPU builds with
 * -ffp-contract=off and llama_cuda.cu with --fmad=false (the Makefile), and
 * neither with fast-math, so sqrtf and the divisions are exact on both.
 * SiLU's exp is the CPU's own zr_exp_approx (exp_rules.h, the one
 * definition both include), so it needs no transcendental that differs
 * between processors. Only a NaN's payload may differ.
 */
#ifndef ZR_LLAMA_RULES_H
#define ZR_LLAMA_RULES_H

#include "../base/hd.h"
#include "exp_rules.h"
#include <math.h>
#include <stdint.h>

/* RMSNorm's 1 / sqrt(mean(x^2) + eps) from the row's sum of squares. */
ZR_HD float zr_llama_rms_rstd(float sumsq, int C, float eps)
{
    return 1.0f / sqrtf(sumsq / (float)C + eps);
}

/* The forward's element: w * (x * rstd). */
ZR_HD float zr_llama_rms_out(float x, float w, float rs)
{
    return w * (x * rs);
}

/* The backward's term of the row's sum: (w dout) (x rstd). */
ZR_HD float zr_llama_rms_dot(float x, float w, float d, float rs)
{
    return (w * d) * (x * rs);
}

/* The input gradient's element from the row's mean m of the terms above. */
ZR_HD float zr_llama_rms_dx(float x, float w, float d, float rs, float m)
{
    return (w * d - (x * rs) * m) * rs;
}

/*
 * Rotary embedding of the pair (x1, x2) = (x[j], x[j + hd/2]) by cos c and
 * sin s (s already negated for the backward): y1 = x1 c - x2 s, y2 = x2 c + x1 s.
 */
ZR_HD void zr_llama_rope(float x1, float x2, float c, float s, float *y1, float *y2)
{
    *y1 = x1 * c + (-x2) * s;
    *y2 = x2 * c + x1 * s;
}

/* SwiGLU forward: silu(g) u, silu(g) = g / (1 + exp(-g)). */
ZR_HD float zr_llama_swiglu(float g, float u)
{
    float silu = g / (1.0f + zr_exp_approx(-g));
    return silu * u;
}

/* SwiGLU backward: sigma = 1 / (1 + exp(-g)), d silu / dg = sigma (1 + g (1 - sigma)). */
ZR_HD void zr_llama_swiglu_bwd(float g, float u, float d, float *dg, float *du)
{
    float sig = 1.0f / (1.0f + zr_exp_approx(-g));
    *dg = d * u * (sig * (1.0f + g * (1.0f - sig)));
    *du = d * (g * sig);
}

#endif /* ZR_LLAMA_RULES_H */
