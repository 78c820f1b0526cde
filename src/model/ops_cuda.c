/*
 * ops_cuda.c - the C API of GPT-2's and the Llama family's CUDA operators (ops_table.h: the
 * instance zr_ops_cuda): argument checks, where 16-byte accesses are allowed, the attention's
 * lane count and kernels (tensor cores or scalar), and launch errors as zr_status. The kernels
 * are ops_cuda.cu, norm_cuda.cu, xent_cuda.cu, attention_cuda.cu, attention_flash.cu and
 * llama_cuda.cu, seen only through their launchers (ops_cuda_impl.h).
 *
 * Compiled only where CUDA is built; a build without compiles
 * model_nocuda.c instead. zr_token_buckets, the host half of the
 * embedding's deterministic backward, is plain C in every build (cuda_host.c).
 */
#include "ops_table.h"

#include "../base/device_impl.h"
#include "ops_cuda_impl.h"

#include <math.h>
#include <string.h>

/* The CUDA stream of s and the storage type, or a message naming the operator. */
static zr_status setup(const char *what, zr_dtype t, zr_stream *s, cudaStream_t *cs)
{
    *cs = NULL;
    if (s == NULL || zr_stream_device(s)->kind != ZR_DEVICE_CUDA) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: needs a stream of a CUDA device, got %s", what,
                s == NULL ? "none" : "a CPU stream");
    }
    if (t != ZR_DTYPE_F32 && t != ZR_DTYPE_BF16) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: storage type %d is neither fp32 nor bf16", what, (int)t);
    }
    *cs = zr_stream_cuda(s);
    return ZR_OK;
}

static zr_status dims_ok(const char *what, int a, int b)
{
    if (a < 1 || b < 1) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: sizes must be >= 1 (got %d and %d)", what, a, b);
    }
    return ZR_OK;
}

static zr_status ptrs_ok(const char *what, const void *const *p, int n)
{
    for (int i = 0; i < n; i++) {
        if (p[i] == NULL) {
            ZR_FAIL(ZR_ERR_INVALID, "%s: pointer argument %d is NULL", what, i + 1);
        }
    }
    return ZR_OK;
}

/* 16-byte accesses to rows of `row` elements: every pointer (NULLs aside) aligned. */
static int vec_ok(int row, const void *const *p, int n)
{
    if (row % 8 != 0) {
        return 0;
    }
    for (int i = 0; i < n; i++) {
        if (p[i] != NULL && (uintptr_t)p[i] % 16 != 0) {
            return 0;
        }
    }
    return 1;
}

#define NPTR(a) ((int)(sizeof(a) / sizeof(a[0])))

static int is_bf16(zr_dtype t)
{
    return t == ZR_DTYPE_BF16;
}

static zr_status cuda_encoder_fwd(zr_dtype t, void *out, const int *inp, const void *wte,
                                  const void *wpe, int B, int T, int C, zr_stream *s)
{
    const char *what = "cuda encoder forward";
    cudaStream_t cs;
    ZR_CHECK(setup(what, t, s, &cs));
    ZR_CHECK(dims_ok(what, B * T, C));
    const void *p[] = {out, inp, wte, wpe};
    ZR_CHECK(ptrs_ok(what, p, NPTR(p)));
    const void *v[] = {out, wte, wpe};
    ZR_CUDA_CHECK(zr_op_k_launch_encoder_fwd(is_bf16(t), out, inp, wte, wpe, B, T, C,
                                             vec_ok(C, v, NPTR(v)), cs));
    return ZR_OK;
}

static zr_status cuda_encoder_bwd(zr_dtype t, void *dwte, void *dwpe, const void *dout,
                                  const int *btoken, const int *bstart, const int *bpos,
                                  int nbuckets, int B, int T, int C, zr_stream *s)
{
    const char *what = "cuda encoder backward";
    cudaStream_t cs;
    ZR_CHECK(setup(what, t, s, &cs));
    ZR_CHECK(dims_ok(what, B * T, C));
    const void *p[] = {dwte, dwpe, dout, btoken, bstart, bpos};
    ZR_CHECK(ptrs_ok(what, p, NPTR(p)));
    if (nbuckets < 0 || nbuckets > B * T || nbuckets > 2147483647 / 2) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: %d token buckets for %d positions", what, nbuckets, B * T);
    }
    const void *v[] = {dwte, dwpe, dout};
    ZR_CUDA_CHECK(zr_op_k_launch_encoder_bwd(is_bf16(t), dwte, dwpe, dout, btoken, bstart, bpos,
                                             nbuckets, B, T, C, vec_ok(C, v, NPTR(v)), cs));
    return ZR_OK;
}

static zr_status layernorm(const char *what, zr_dtype t, const zr_op_k_ln *a, zr_stream *s)
{
    cudaStream_t cs;
    ZR_CHECK(setup(what, t, s, &cs));
    ZR_CHECK(dims_ok(what, a->N, a->C));
    const void *p[] = {a->out, a->mean, a->rstd, a->inp, a->w, a->b};
    ZR_CHECK(ptrs_ok(what, p, NPTR(p)));
    if (a->res != NULL && a->x == NULL) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: the residual add needs its second term", what);
    }
    zr_op_k_ln k = *a;
    const void *v[] = {a->out, a->res, a->inp, a->x, a->xbias, a->w, a->b};
    k.vec = vec_ok(a->C, v, NPTR(v));
    ZR_CUDA_CHECK(zr_op_k_launch_layernorm_fwd(is_bf16(t), &k, cs));
    return ZR_OK;
}

static zr_status cuda_layernorm_fwd(zr_dtype t, void *out, float *mean, float *rstd,
                                    const void *inp, const void *w, const void *b, int N, int C,
                                    zr_stream *s)
{
    zr_op_k_ln a = {out, NULL, mean, rstd, inp, NULL, NULL, w, b, N, C, 0};
    return layernorm("cuda layernorm forward", t, &a, s);
}

static zr_status cuda_residual_layernorm_fwd(zr_dtype t, void *res, void *out, float *mean,
                                             float *rstd, const void *a, const void *x,
                                             const void *xbias, const void *w, const void *b, int N,
                                             int C, zr_stream *s)
{
    if (res == NULL) {
        ZR_FAIL(ZR_ERR_INVALID, "cuda residual layernorm forward: NULL residual output");
    }
    zr_op_k_ln k = {out, res, mean, rstd, a, x, xbias, w, b, N, C, 0};
    return layernorm("cuda residual layernorm forward", t, &k, s);
}

static zr_status cuda_residual_fwd(zr_dtype t, void *res, const void *a, const void *x,
                                   const void *xbias, int N, int C, zr_stream *s)
{
    const char *what = "cuda residual forward";
    cudaStream_t cs;
    ZR_CHECK(setup(what, t, s, &cs));
    ZR_CHECK(dims_ok(what, N, C));
    const void *p[] = {res, a, x};
    ZR_CHECK(ptrs_ok(what, p, NPTR(p)));
    const void *v[] = {res, a, x, xbias};
    ZR_CUDA_CHECK(
        zr_op_k_launch_residual(is_bf16(t), res, a, x, xbias, N, C, vec_ok(C, v, NPTR(v)), cs));
    return ZR_OK;
}

static zr_status cuda_layernorm_bwd(zr_dtype t, void *dinp, void *dw, void *db, const void *dout,
                                    const void *inp, const void *w, const float *mean,
                                    const float *rstd, int N, int C, int accumulate, float *scratch,
                                    zr_stream *s)
{
    const char *what = "cuda layernorm backward";
    cudaStream_t cs;
    ZR_CHECK(setup(what, t, s, &cs));
    ZR_CHECK(dims_ok(what, N, C));
    const void *p[] = {dinp, dw, db, dout, inp, w, mean, rstd, scratch};
    ZR_CHECK(ptrs_ok(what, p, NPTR(p)));
    const void *v[] = {dinp, dout, inp, w};
    ZR_CUDA_CHECK(zr_op_k_launch_layernorm_bwd(is_bf16(t), dinp, dw, db, dout, inp, w, mean, rstd,
                                               N, C, accumulate != 0, scratch,
                                               vec_ok(C, v, NPTR(v)), cs));
    return ZR_OK;
}

static zr_status cuda_bias_add(zr_dtype t, void *x, const void *bias, int N, int OC, zr_stream *s)
{
    const char *what = "cuda bias add";
    cudaStream_t cs;
    ZR_CHECK(setup(what, t, s, &cs));
    ZR_CHECK(dims_ok(what, N, OC));
    const void *p[] = {x, bias};
    ZR_CHECK(ptrs_ok(what, p, NPTR(p)));
    ZR_CUDA_CHECK(zr_op_k_launch_bias_add(is_bf16(t), x, bias, N, OC, vec_ok(OC, p, NPTR(p)), cs));
    return ZR_OK;
}

static zr_status cuda_colsum_acc(zr_dtype t, void *db, const void *d, int N, int OC, float *scratch,
                                 zr_stream *s)
{
    const char *what = "cuda column sum";
    cudaStream_t cs;
    ZR_CHECK(setup(what, t, s, &cs));
    ZR_CHECK(dims_ok(what, N, OC));
    const void *p[] = {db, d, scratch};
    ZR_CHECK(ptrs_ok(what, p, NPTR(p)));
    const void *v[] = {d};
    ZR_CUDA_CHECK(
        zr_op_k_launch_colsum(is_bf16(t), db, d, N, OC, scratch, vec_ok(OC, v, NPTR(v)), cs));
    return ZR_OK;
}

static zr_status cuda_bias_gelu_fwd(zr_dtype t, void *out, void *pre, const void *bias, int N,
                                    int OC, zr_stream *s)
{
    const char *what = "cuda bias gelu forward";
    cudaStream_t cs;
    ZR_CHECK(setup(what, t, s, &cs));
    ZR_CHECK(dims_ok(what, N, OC));
    const void *p[] = {out, pre};
    ZR_CHECK(ptrs_ok(what, p, NPTR(p)));
    const void *v[] = {out, pre, bias};
    ZR_CUDA_CHECK(
        zr_op_k_launch_bias_gelu(is_bf16(t), out, pre, bias, N, OC, vec_ok(OC, v, NPTR(v)), cs));
    return ZR_OK;
}

static zr_status cuda_gelu_bwd(zr_dtype t, void *dinp, const void *inp, const void *dout, size_t n,
                               zr_stream *s)
{
    const char *what = "cuda gelu backward";
    cudaStream_t cs;
    ZR_CHECK(setup(what, t, s, &cs));
    if (n == 0) {
        return ZR_OK;
    }
    const void *p[] = {dinp, inp, dout};
    ZR_CHECK(ptrs_ok(what, p, NPTR(p)));
    ZR_CUDA_CHECK(
        zr_op_k_launch_gelu_bwd(is_bf16(t), dinp, inp, dout, n, vec_ok(8, p, NPTR(p)), cs));
    return ZR_OK;
}

/* The attention's shape checks and lane count: the smallest power of two g with 16 g >= hs. */
static zr_status attention_args(const char *what, zr_op_k_att *a)
{
    if (a->B < 1 || a->T < 1 || a->C < 1 || a->NH < 1 || a->C % a->NH != 0) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: B %d, T %d, C %d, NH %d (C a multiple of NH, all >= 1)", what,
                a->B, a->T, a->C, a->NH);
    }
    int hs = a->C / a->NH;
    if (hs > 256 || a->B * a->NH > 65535) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: head size %d (at most 256), B * NH = %d (at most 65535)", what,
                hs, a->B * a->NH);
    }
    a->g = 1;
    while (16 * a->g < hs) {
        a->g *= 2;
    }
    a->scale = 1.0f / sqrtf((float)hs);
    const void *v[] = {a->out, a->dqkv, a->qkv, a->dout, a->o};
    a->vec = hs % 8 == 0 && vec_ok(a->C, v, NPTR(v));
    return ZR_OK;
}

/* GPT-2's operands: q, k, v (dq, dk, dv) the thirds of each qkv (dqkv) row, one key head a head. */
static zr_op_k_qkv qkv_thirds(zr_dtype t, const void *qkv, void *dqkv, int C)
{
    const size_t third = (size_t)C * zr_dtype_size(t);
    const char *q = qkv;
    char *dq = dqkv;
    return (zr_op_k_qkv){q,
                         q + third,
                         q + 2 * third,
                         dq,
                         dq == NULL ? NULL : dq + third,
                         dq == NULL ? NULL : dq + 2 * third,
                         3 * C,
                         3 * C,
                         1};
}

static int cuda_attention_tensor_cores(zr_dtype t, int hd, int group)
{
    return is_bf16(t) && (hd == 32 || hd == 64 || (hd == 128 && group == 1));
}

/* bf16 with a head size the tensor-core kernels take, unless the scalar kernels (variant -1) */
static int attention_flash(zr_dtype t, const zr_op_k_att *a)
{
    return a->variant >= 0 && cuda_attention_tensor_cores(t, a->C / a->NH, a->x.group);
}

static zr_status attention_fwd(zr_dtype t, void *out, float *lse, const void *qkv, int B, int T,
                               int C, int NH, zr_stream *s, int variant)
{
    const char *what = "cuda attention forward";
    cudaStream_t cs;
    ZR_CHECK(setup(what, t, s, &cs));
    const void *p[] = {out, lse, qkv};
    ZR_CHECK(ptrs_ok(what, p, NPTR(p)));
    zr_op_k_att a = {
        .out = out, .lse = lse, .qkv = qkv, .B = B, .T = T, .C = C, .NH = NH, .variant = variant};
    ZR_CHECK(attention_args(what, &a));
    a.x = qkv_thirds(t, qkv, NULL, C);
    if (attention_flash(t, &a)) {
        ZR_CUDA_CHECK(zr_op_k_launch_flash_fwd(&a, cs));
    } else {
        ZR_CUDA_CHECK(zr_op_k_launch_attention_fwd(is_bf16(t), &a, cs));
    }
    return ZR_OK;
}

static zr_status attention_bwd(zr_dtype t, void *dqkv, float *delta, const void *dout,
                               const void *qkv, const void *out, const float *lse, int B, int T,
                               int C, int NH, zr_stream *s, int variant, int part)
{
    const char *what = "cuda attention backward";
    cudaStream_t cs;
    ZR_CHECK(setup(what, t, s, &cs));
    const void *p[] = {dqkv, delta, dout, qkv, out, lse};
    ZR_CHECK(ptrs_ok(what, p, NPTR(p)));
    zr_op_k_att a = {.dqkv = dqkv,
                     .lse = (float *)lse,
                     .delta = delta,
                     .qkv = qkv,
                     .dout = dout,
                     .o = out,
                     .B = B,
                     .T = T,
                     .C = C,
                     .NH = NH,
                     .variant = variant,
                     .part = part};
    ZR_CHECK(attention_args(what, &a));
    a.x = qkv_thirds(t, qkv, dqkv, C);
    if (variant >= ZR_OP_CUDA_ATT_VARIANTS || part < 0 || part > 3) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: variant %d, part %d", what, variant, part);
    }
    if (attention_flash(t, &a)) {
        ZR_CUDA_CHECK(zr_op_k_launch_flash_bwd(&a, cs));
    } else {
        ZR_CUDA_CHECK(zr_op_k_launch_attention_bwd(is_bf16(t), &a, cs));
    }
    return ZR_OK;
}

static zr_status cuda_attention_fwd(zr_dtype t, void *out, float *lse, const void *qkv, int B,
                                    int T, int C, int NH, zr_stream *s)
{
    return attention_fwd(t, out, lse, qkv, B, T, C, NH, s, 0);
}

static zr_status cuda_attention_fwd_variant(int variant, zr_dtype t, void *out, float *lse,
                                            const void *qkv, int B, int T, int C, int NH,
                                            zr_stream *s)
{
    if (variant < -1 || variant >= ZR_OP_CUDA_ATT_VARIANTS) {
        ZR_FAIL(ZR_ERR_INVALID, "cuda attention forward: variant %d", variant);
    }
    return attention_fwd(t, out, lse, qkv, B, T, C, NH, s, variant);
}

static zr_status cuda_attention_fwd_scalar(zr_dtype t, void *out, float *lse, const void *qkv,
                                           int B, int T, int C, int NH, zr_stream *s)
{
    return attention_fwd(t, out, lse, qkv, B, T, C, NH, s, -1);
}

static zr_status cuda_attention_bwd(zr_dtype t, void *dqkv, float *delta, const void *dout,
                                    const void *qkv, const void *out, const float *lse, int B,
                                    int T, int C, int NH, zr_stream *s)
{
    return attention_bwd(t, dqkv, delta, dout, qkv, out, lse, B, T, C, NH, s, 0, 0);
}

static zr_status cuda_attention_bwd_variant(int variant, int part, zr_dtype t, void *dqkv,
                                            float *delta, const void *dout, const void *qkv,
                                            const void *out, const float *lse, int B, int T, int C,
                                            int NH, zr_stream *s)
{
    if (variant < -1) {
        ZR_FAIL(ZR_ERR_INVALID, "cuda attention backward: variant %d", variant);
    }
    return attention_bwd(t, dqkv, delta, dout, qkv, out, lse, B, T, C, NH, s, variant, part);
}

static zr_status cuda_attention_bwd_scalar(zr_dtype t, void *dqkv, float *delta, const void *dout,
                                           const void *qkv, const void *out, const float *lse,
                                           int B, int T, int C, int NH, zr_stream *s)
{
    return attention_bwd(t, dqkv, delta, dout, qkv, out, lse, B, T, C, NH, s, -1, 0);
}

/* Grouped heads: the shape checks, and q, k, v (dq, dk, dv) as three tensors. */
static zr_status gqa_args(const char *what, zr_op_k_att *a, int NKV, int hd, const void *q,
                          const void *k, const void *v, void *dq, void *dk, void *dv)
{
    if (hd < 1 || NKV < 1 || a->NH % NKV != 0 || a->NH > 2147483647 / hd) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: NH %d, NKV %d, head size %d (NKV must divide NH)", what, a->NH,
                NKV, hd);
    }
    a->C = a->NH * hd;
    ZR_CHECK(attention_args(what, a));
    a->x = (zr_op_k_qkv){q, k, v, dq, dk, dv, a->C, NKV * hd, a->NH / NKV};
    const void *p[] = {q, k, v, dq, dk, dv, a->out, a->dout, a->o};
    a->vec = hd % 8 == 0 && vec_ok(hd, p, NPTR(p));
    return ZR_OK;
}

static zr_status cuda_attention_gqa_fwd(int variant, zr_dtype t, void *out, float *lse,
                                        const void *q, const void *k, const void *v, int B, int T,
                                        int NH, int NKV, int hd, zr_stream *s)
{
    const char *what = "cuda grouped-head attention forward";
    cudaStream_t cs;
    ZR_CHECK(setup(what, t, s, &cs));
    const void *p[] = {out, lse, q, k, v};
    ZR_CHECK(ptrs_ok(what, p, NPTR(p)));
    if (variant < -1 || variant >= ZR_OP_CUDA_ATT_VARIANTS) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: variant %d", what, variant);
    }
    zr_op_k_att a = {.out = out, .lse = lse, .B = B, .T = T, .NH = NH, .variant = variant};
    ZR_CHECK(gqa_args(what, &a, NKV, hd, q, k, v, NULL, NULL, NULL));
    if (attention_flash(t, &a)) {
        ZR_CUDA_CHECK(zr_op_k_launch_flash_fwd(&a, cs));
    } else {
        ZR_CUDA_CHECK(zr_op_k_launch_attention_fwd(is_bf16(t), &a, cs));
    }
    return ZR_OK;
}

static zr_status cuda_attention_gqa_bwd(int variant, zr_dtype t, void *dq, void *dk, void *dv,
                                        float *delta, const void *dout, const void *q,
                                        const void *k, const void *v, const void *out,
                                        const float *lse, int B, int T, int NH, int NKV, int hd,
                                        zr_stream *s)
{
    const char *what = "cuda grouped-head attention backward";
    cudaStream_t cs;
    ZR_CHECK(setup(what, t, s, &cs));
    const void *p[] = {dq, dk, dv, delta, dout, q, k, v, out, lse};
    ZR_CHECK(ptrs_ok(what, p, NPTR(p)));
    if (variant < -1 || variant >= ZR_OP_CUDA_ATT_VARIANTS) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: variant %d", what, variant);
    }
    zr_op_k_att a = {.lse = (float *)lse,
                     .delta = delta,
                     .dout = dout,
                     .o = out,
                     .B = B,
                     .T = T,
                     .NH = NH,
                     .variant = variant};
    ZR_CHECK(gqa_args(what, &a, NKV, hd, q, k, v, dq, dk, dv));
    if (attention_flash(t, &a)) {
        ZR_CUDA_CHECK(zr_op_k_launch_flash_bwd(&a, cs));
    } else {
        ZR_CUDA_CHECK(zr_op_k_launch_attention_bwd(is_bf16(t), &a, cs));
    }
    return ZR_OK;
}

/* ---- the Llama family's other operators (llama_cuda.cu) ------------------------------- */

static zr_status cuda_rmsnorm_fwd(zr_dtype t, void *out, float *rstd, const void *inp,
                                  const void *w, float eps, int N, int C, zr_stream *s)
{
    const char *what = "cuda rmsnorm forward";
    cudaStream_t cs;
    ZR_CHECK(setup(what, t, s, &cs));
    ZR_CHECK(dims_ok(what, N, C));
    const void *p[] = {out, rstd, inp, w};
    ZR_CHECK(ptrs_ok(what, p, NPTR(p)));
    if (!(eps >= 0.0f)) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: eps %g (must be >= 0)", what, (double)eps);
    }
    zr_op_k_rms a = {.out = out, .rstd = rstd, .inp = inp, .w = w, .eps = eps, .N = N, .C = C};
    ZR_CUDA_CHECK(zr_op_k_launch_rmsnorm_fwd(is_bf16(t), &a, cs));
    return ZR_OK;
}

static zr_status cuda_rmsnorm_bwd(zr_dtype t, void *dinp, void *dw, const void *dout,
                                  const void *inp, const void *w, const float *rstd, int N, int C,
                                  int accumulate, float *scratch, zr_stream *s)
{
    const char *what = "cuda rmsnorm backward";
    cudaStream_t cs;
    ZR_CHECK(setup(what, t, s, &cs));
    ZR_CHECK(dims_ok(what, N, C));
    const void *p[] = {dinp, dw, dout, inp, w, rstd, scratch};
    ZR_CHECK(ptrs_ok(what, p, NPTR(p)));
    const void *v[] = {dout, inp};
    zr_op_k_rms a = {.dinp = dinp,
                     .dw = dw,
                     .rstd = (float *)rstd,
                     .scratch = scratch,
                     .inp = inp,
                     .w = w,
                     .dout = dout,
                     .N = N,
                     .C = C,
                     .accumulate = accumulate != 0,
                     .vec = vec_ok(C, v, NPTR(v))};
    ZR_CUDA_CHECK(zr_op_k_launch_rmsnorm_bwd(is_bf16(t), &a, cs));
    return ZR_OK;
}

static zr_status rope(const char *what, zr_dtype t, void *out, const void *inp,
                      const float *cosines, const float *sines, int B, int T, int NH, int hd,
                      float sign, zr_stream *s)
{
    cudaStream_t cs;
    ZR_CHECK(setup(what, t, s, &cs));
    ZR_CHECK(dims_ok(what, B * T, NH));
    const void *p[] = {out, inp, cosines, sines};
    ZR_CHECK(ptrs_ok(what, p, NPTR(p)));
    if (hd < 2 || hd % 2 != 0) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: head size %d (even, >= 2)", what, hd);
    }
    ZR_CUDA_CHECK(
        zr_op_k_launch_rope(is_bf16(t), out, inp, cosines, sines, B, T, NH, hd, sign, cs));
    return ZR_OK;
}

static zr_status cuda_rope_fwd(zr_dtype t, void *out, const void *inp, const float *cosines,
                               const float *sines, int B, int T, int NH, int hd, zr_stream *s)
{
    return rope("cuda rope forward", t, out, inp, cosines, sines, B, T, NH, hd, 1.0f, s);
}

static zr_status cuda_rope_bwd(zr_dtype t, void *dinp, const void *dout, const float *cosines,
                               const float *sines, int B, int T, int NH, int hd, zr_stream *s)
{
    return rope("cuda rope backward", t, dinp, dout, cosines, sines, B, T, NH, hd, -1.0f, s);
}

static zr_status swiglu_args(const char *what, zr_dtype t, zr_stream *s, int N, int IC, int ld,
                             cudaStream_t *cs)
{
    ZR_CHECK(setup(what, t, s, cs));
    ZR_CHECK(dims_ok(what, N, IC));
    if (ld < IC) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: row stride %d below the width %d", what, ld, IC);
    }
    return ZR_OK;
}

static zr_status cuda_swiglu_fwd(zr_dtype t, void *out, const void *gate, const void *up, int N,
                                 int IC, int ld, zr_stream *s)
{
    const char *what = "cuda swiglu forward";
    cudaStream_t cs;
    ZR_CHECK(swiglu_args(what, t, s, N, IC, ld, &cs));
    const void *p[] = {out, gate, up};
    ZR_CHECK(ptrs_ok(what, p, NPTR(p)));
    ZR_CUDA_CHECK(
        zr_op_k_launch_swiglu(is_bf16(t), NULL, NULL, out, NULL, gate, up, N, IC, ld, cs));
    return ZR_OK;
}

static zr_status cuda_swiglu_bwd(zr_dtype t, void *dgate, void *dup, const void *dout,
                                 const void *gate, const void *up, int N, int IC, int ld,
                                 zr_stream *s)
{
    const char *what = "cuda swiglu backward";
    cudaStream_t cs;
    ZR_CHECK(swiglu_args(what, t, s, N, IC, ld, &cs));
    const void *p[] = {dgate, dup, dout, gate, up};
    ZR_CHECK(ptrs_ok(what, p, NPTR(p)));
    ZR_CUDA_CHECK(
        zr_op_k_launch_swiglu(is_bf16(t), dgate, dup, NULL, dout, gate, up, N, IC, ld, cs));
    return ZR_OK;
}

static zr_status xent_args(const char *what, zr_dtype t, zr_stream *s, int N, int V, int Vp,
                           cudaStream_t *cs)
{
    ZR_CHECK(setup(what, t, s, cs));
    if (N < 1 || V < 1 || Vp < V) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: N %d, V %d, Vp %d (need N, V >= 1 and Vp >= V)", what, N, V,
                Vp);
    }
    return ZR_OK;
}

static zr_status cuda_xent_fwd(zr_dtype t, float *losses, float *lse, const void *logits,
                               const int *targets, int N, int V, int Vp, zr_stream *s)
{
    const char *what = "cuda softmax cross-entropy forward";
    cudaStream_t cs;
    ZR_CHECK(xent_args(what, t, s, N, V, Vp, &cs));
    const void *p[] = {lse, logits};
    ZR_CHECK(ptrs_ok(what, p, NPTR(p)));
    if (targets != NULL && losses == NULL) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: targets without a losses output", what);
    }
    const void *v[] = {logits};
    ZR_CUDA_CHECK(zr_op_k_launch_xent_fwd(is_bf16(t), losses, lse, logits, targets, N, V, Vp,
                                          vec_ok(Vp, v, NPTR(v)), cs));
    return ZR_OK;
}

static zr_status cuda_xent_bwd(zr_dtype t, void *logits, const float *lse, const int *targets,
                               float dloss, int N, int V, int Vp, zr_stream *s)
{
    const char *what = "cuda softmax cross-entropy backward";
    cudaStream_t cs;
    ZR_CHECK(xent_args(what, t, s, N, V, Vp, &cs));
    const void *p[] = {logits, lse, targets};
    ZR_CHECK(ptrs_ok(what, p, NPTR(p)));
    const void *v[] = {logits};
    ZR_CUDA_CHECK(zr_op_k_launch_xent_bwd(is_bf16(t), logits, lse, targets, dloss, N, V, Vp,
                                          vec_ok(Vp, v, NPTR(v)), cs));
    return ZR_OK;
}

static zr_status cuda_xent_fused(zr_dtype t, float *losses, float *lse, void *logits,
                                 const int *targets, float dloss, int N, int V, int Vp,
                                 zr_stream *s)
{
    const char *what = "cuda softmax cross-entropy forward and backward";
    cudaStream_t cs;
    ZR_CHECK(xent_args(what, t, s, N, V, Vp, &cs));
    const void *p[] = {losses, lse, logits, targets};
    ZR_CHECK(ptrs_ok(what, p, NPTR(p)));
    const void *v[] = {logits};
    ZR_CUDA_CHECK(zr_op_k_launch_xent_fused(is_bf16(t), losses, lse, logits, targets, dloss, N, V,
                                            Vp, vec_ok(Vp, v, NPTR(v)), cs));
    return ZR_OK;
}

static zr_status cuda_mean(float *out, const float *x, int n, zr_stream *s)
{
    const char *what = "cuda mean";
    cudaStream_t cs;
    ZR_CHECK(setup(what, ZR_DTYPE_F32, s, &cs));
    const void *p[] = {out, x};
    ZR_CHECK(ptrs_ok(what, p, NPTR(p)));
    ZR_CHECK(dims_ok(what, n, 1));
    ZR_CUDA_CHECK(zr_op_k_launch_mean(out, x, n, cs));
    return ZR_OK;
}

const zr_op_table zr_ops_cuda = {
    .name = "cuda",
    .encoder_fwd = cuda_encoder_fwd,
    .encoder_bwd = cuda_encoder_bwd,
    .layernorm_fwd = cuda_layernorm_fwd,
    .residual_layernorm_fwd = cuda_residual_layernorm_fwd,
    .residual_fwd = cuda_residual_fwd,
    .layernorm_bwd = cuda_layernorm_bwd,
    .bias_add = cuda_bias_add,
    .colsum_acc = cuda_colsum_acc,
    .bias_gelu_fwd = cuda_bias_gelu_fwd,
    .gelu_bwd = cuda_gelu_bwd,
    .attention_fwd = cuda_attention_fwd,
    .attention_fwd_variant = cuda_attention_fwd_variant,
    .attention_fwd_scalar = cuda_attention_fwd_scalar,
    .attention_bwd = cuda_attention_bwd,
    .attention_bwd_variant = cuda_attention_bwd_variant,
    .attention_bwd_scalar = cuda_attention_bwd_scalar,
    .xent_fwd = cuda_xent_fwd,
    .xent_bwd = cuda_xent_bwd,
    .xent_fused = cuda_xent_fused,
    .mean = cuda_mean,
    .rmsnorm_fwd = cuda_rmsnorm_fwd,
    .rmsnorm_bwd = cuda_rmsnorm_bwd,
    .rope_fwd = cuda_rope_fwd,
    .rope_bwd = cuda_rope_bwd,
    .swiglu_fwd = cuda_swiglu_fwd,
    .swiglu_bwd = cuda_swiglu_bwd,
    .attention_gqa_fwd = cuda_attention_gqa_fwd,
    .attention_gqa_bwd = cuda_attention_gqa_bwd,
    .attention_tensor_cores = cuda_attention_tensor_cores,
};
