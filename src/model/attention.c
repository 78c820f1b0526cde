/*
 * attention.c - causal self-attention on the CPU, streamed over key blocks
 * (the FlashAttention-2 recurrence): the T x T scores are never stored.
 * GPT-2's packed qkv and the Llama family's separate q, k, v with grouped
 * key/value heads run the same code (att_args' strides and group).
 *
 * Forward, for one head and a tile of ZR_ATT_BQ query rows, key blocks of
 * ZR_ATT_BK in order, each query i holding a running max m, a running sum l
 * and an unnormalised output y:
 *
 *     s_j  = (q_i . k_j) * scale                   keys j of the block, j <= i
 *     m'   = max(m, max_j s_j)                      (m starts at -inf)
 *     c    = exp(m - m')                            (0 while m is -inf)
 *     p_j  = exp(s_j - m')
 *     l    = l c + p_j0 + p_j0+1 + ...              (added one at a time, in j order)
 *     y    = y c + sum_j p_j v_j
 *
 * and at the end y / l is the output, lse = m + log(l) is kept: the backward
 * recomputes every probability as p_j = exp(s_j - lse) block by block, with
 * D_i = dO_i . O_i:
 *
 *     dp_j = dO_i . v_j        ds_j = p_j (dp_j - D_i) scale
 *     dV_j += p_j dO_i         dQ_i += ds_j k_j        dK_j += ds_j q_i
 *
 * The arithmetic is defined by the scalar code here: each dot product and
 * each sum of products (over d for the scores, over keys for y and dQ, over
 * queries for dV and dK) is one chain of fmaf in increasing index order
 * (the tile product of attention_impl.h), exp is zr_exp_approx, D uses the
 * fixed 16 lanes of ops_math.h. The vector kernels (attention_x86.c, and the
 * loops below compiled for AVX2 / AVX-512) reproduce it bit for bit, so the
 * result depends on ZR_ATT_BK (where the forward rescales) and on nothing
 * else: not the vector width, the tile height, or the thread count. A GPU
 * kernel checked against this code should use the same key blocks, or a
 * tolerance.
 *
 * Layout: the forward computes a block's scores transposed (keys by
 * queries, from the query tile transposed once), so that every per-query
 * step above runs across queries in vector lanes. The backward takes one
 * key block at a time (its keys and values transposed once) against every
 * query tile that sees it.
 *
 * Threads: the forward splits (batch, head, query tile) tasks, the
 * backward (batch, key/value head), which owns its columns of dK and dV and
 * those of dQ of the query heads that read them (GPT-2: one head; grouped
 * KV heads: NH / NKV of them, in order), so no sum is ever split. Tiles
 * live on the stack (ZR_ATT_MAX_HS bounds them).
 */
#include "attention_impl.h"
#include "ops.h"
#include "ops_math.h"
#include "zr/base.h"
#include "zr/pool.h"

#include <math.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define ZR_ATT_X86 1
#define T256       __attribute__((target("avx2,fma")))
#define T512       __attribute__((target("avx512f,avx2,fma")))
#else
#define ZR_ATT_X86 0
#endif

#define BQ ZR_ATT_BQ
#define BK ZR_ATT_BK

/* ---- the reference tile product ------------------------------------------- */

void zr_att_gemm_scalar(int m, int n, int k, const float *a, size_t ars, size_t aps, const float *b,
                        size_t ldb, float *c, size_t ldc, int acc)
{
    for (int i = 0; i < m; i++) {
        for (int j = 0; j < n; j++) {
            float s = acc ? c[i * ldc + j] : 0.0f;
            for (int p = 0; p < k; p++) {
                s = fmaf(a[i * ars + p * aps], b[p * ldb + j], s);
            }
            c[i * ldc + j] = s;
        }
    }
}

/* ---- steps across queries, compiled once per vector width ------------------ */

/*
 * Forward, one key block: st holds s = q . k transposed (row j: key j0 + j,
 * column r: query i0 + r, stride BQ). Scales it, updates m and l, sets
 * corr (the factor y must be multiplied by) and leaves p in st, 0 where
 * the key comes after the query.
 */
static inline __attribute__((always_inline)) void fwd_step_body(float *st, int nk, int nq, int i0,
                                                                int j0, float scale, float *m,
                                                                float *l, float *corr)
{
    float mb[BQ];
    for (int r = 0; r < nq; r++) {
        mb[r] = -INFINITY;
    }
    for (int j = 0; j < nk; j++) {
        float *sj = st + (size_t)j * BQ;
        for (int r = 0; r < nq; r++) {
            float s = sj[r] * scale;
            sj[r] = s;
            s = j0 + j <= i0 + r ? s : -INFINITY;
            mb[r] = s > mb[r] ? s : mb[r];
        }
    }
    for (int r = 0; r < nq; r++) {
        float mo = m[r], mn = mb[r] > mo ? mb[r] : mo;
        corr[r] = mo == -INFINITY ? 0.0f : zr_exp_approx(mo - mn);
        l[r] *= corr[r];
        m[r] = mn;
    }
    for (int j = 0; j < nk; j++) {
        float *sj = st + (size_t)j * BQ;
        for (int r = 0; r < nq; r++) {
            float p = zr_exp_approx(sj[r] - m[r]);
            p = j0 + j <= i0 + r ? p : 0.0f;
            sj[r] = p;
            l[r] += p;
        }
    }
}

/*
 * Backward, one (query tile, key block) pair: p holds q . k and ds holds
 * dO . v (row r: query i0 + r, stride BK); p becomes the probabilities (0
 * where masked) and ds the score gradients, scale included.
 */
static inline __attribute__((always_inline)) void bwd_step_body(float *p, float *ds, int nq, int nk,
                                                                int i0, int j0, float scale,
                                                                const float *lse, const float *dlt)
{
    for (int r = 0; r < nq; r++) {
        float *pr = p + (size_t)r * BK, *dr = ds + (size_t)r * BK;
        float lr = lse[r], dd = dlt[r];
        for (int j = 0; j < nk; j++) {
            float pv = zr_exp_approx(pr[j] * scale - lr);
            pv = j0 + j <= i0 + r ? pv : 0.0f;
            pr[j] = pv;
            dr[j] = pv * (dr[j] - dd) * scale;
        }
    }
}

/* D_r = dO_r . O_r in the fixed 16 lanes, for rows r < nq (row stride ld). */
static inline __attribute__((always_inline)) void
delta_body(float *dlt, const float *dout, const float *out, size_t ld, int nq, int hs)
{
    for (int r = 0; r < nq; r++) {
        const float *a = dout + r * ld, *b = out + r * ld;
        float acc[ZR_LANES] = {0};
        int d = 0;
        for (; d + ZR_LANES <= hs; d += ZR_LANES) {
            for (int k = 0; k < ZR_LANES; k++) {
                acc[k] += a[d + k] * b[d + k];
            }
        }
        for (int k = 0; d < hs; d++, k++) {
            acc[k] += a[d] * b[d];
        }
        dlt[r] = zr_lanes_total(acc);
    }
}

#define FWD_PARAMS                                                                                 \
    (float *st, int nk, int nq, int i0, int j0, float scale, float *m, float *l, float *corr)
#define FWD_ARGS (st, nk, nq, i0, j0, scale, m, l, corr)
#define BWD_PARAMS                                                                                 \
    (float *p, float *ds, int nq, int nk, int i0, int j0, float scale, const float *lse,           \
     const float *dlt)
#define BWD_ARGS     (p, ds, nq, nk, i0, j0, scale, lse, dlt)
#define DELTA_PARAMS (float *dlt, const float *dout, const float *out, size_t ld, int nq, int hs)
#define DELTA_ARGS   (dlt, dout, out, ld, nq, hs)

typedef void(*fwd_step_fn) FWD_PARAMS;
typedef void(*bwd_step_fn) BWD_PARAMS;
typedef void(*delta_fn) DELTA_PARAMS;

/* name##_base, and on x86 name##_avx2 and name##_avx512, from name##_body. */
#if ZR_ATT_X86
#define VARIANTS(name, params, args)                                                               \
    static void name##_base params                                                                 \
    {                                                                                              \
        name##_body args;                                                                          \
    }                                                                                              \
    static T256 void name##_avx2 params                                                            \
    {                                                                                              \
        name##_body args;                                                                          \
    }                                                                                              \
    static T512 void name##_avx512 params                                                          \
    {                                                                                              \
        name##_body args;                                                                          \
    }
#else
#define VARIANTS(name, params, args)                                                               \
    static void name##_base params                                                                 \
    {                                                                                              \
        name##_body args;                                                                          \
    }
#endif
VARIANTS(fwd_step, FWD_PARAMS, FWD_ARGS)
VARIANTS(bwd_step, BWD_PARAMS, BWD_ARGS)
VARIANTS(delta, DELTA_PARAMS, DELTA_ARGS)

typedef struct att_kernels {
    zr_att_gemm_fn gemm;
    fwd_step_fn fwd_step;
    bwd_step_fn bwd_step;
    delta_fn delta;
} att_kernels;

/* The kernels for zr_ops_isa() (0 scalar, 1 AVX2, 2 AVX-512); main thread only. */
static att_kernels kernels(void)
{
    att_kernels k = {zr_att_gemm_scalar, fwd_step_base, bwd_step_base, delta_base};
#if ZR_ATT_X86
    int isa = zr_ops_isa();
    zr_att_gemm_fn g512 = isa >= 2 ? zr_att_gemm_avx512() : NULL;
    zr_att_gemm_fn g256 = isa >= 1 ? zr_att_gemm_avx2() : NULL;
    if (g512 != NULL) {
        k = (att_kernels){g512, fwd_step_avx512, bwd_step_avx512, delta_avx512};
    } else if (g256 != NULL) {
        k = (att_kernels){g256, fwd_step_avx2, bwd_step_avx2, delta_avx2};
    }
#endif
    return k;
}

/* ---- the tiles ------------------------------------------------------------------ */

/*
 * One call's tensors: q, key and v (and their gradients dq, dk, dv, laid
 * out the same) have rows of lq, lk and lv floats per token, out and dout
 * rows of lo; query head h reads key and value head h / group. GPT-2's
 * packed qkv is q = qkv, key = qkv + C, v = qkv + 2C, all rows 3C, group 1.
 */
typedef struct att_args {
    att_kernels k;
    int B, T, NH, group, hs, tiles;
    size_t lq, lk, lv, lo;
    float scale;
    float *out, *lse, *dq, *dk, *dv, *dlt;
    const float *q, *key, *v, *dout, *fwd_out, *fwd_lse;
} att_args;

/* dst[d * ldd + j] = src[j * ld + d]: n rows of hs values become hs rows of n. */
static void transpose_rows(float *dst, size_t ldd, const float *src, size_t ld, int n, int hs)
{
    for (int d = 0; d < hs; d++) {
        for (int j = 0; j < n; j++) {
            dst[d * ldd + j] = src[j * ld + d];
        }
    }
}

/*
 * A key block that reaches past the first query of a tile meets the causal
 * diagonal: there the products run DIAG rows at a time and skip what lies
 * wholly beyond it (whole DIAG-row steps of masked scores, whose
 * probabilities are 0). A skipped score is set to 0 instead of computed; a
 * skipped term of a sum would have been a product with a 0 probability.
 */
#define DIAG 16

static int clampi(int x, int lo, int hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

/* S^T = K Q^T for keys j0.. against queries i0..: key row j needs queries i0 + r >= j0 + j. */
static void fwd_scores(const att_args *a, float *st, const float *kj, const float *qt_, int nk,
                       int nq, int i0, int j0)
{
    const size_t lk = a->lk;
    if (j0 + nk <= i0 + 1) {
        a->k.gemm(nk, nq, a->hs, kj, lk, 1, qt_, BQ, st, BQ, 0);
        return;
    }
    for (int jb = 0; jb < nk; jb += DIAG) {
        int rows = clampi(nk - jb, 0, DIAG), c0 = clampi(j0 + jb - i0, 0, nq);
        for (int j = jb; j < jb + rows; j++) {
            for (int r = 0; r < c0; r++) {
                st[(size_t)j * BQ + r] = 0.0f;
            }
        }
        a->k.gemm(rows, nq - c0, a->hs, kj + jb * lk, lk, 1, qt_ + c0, BQ, st + jb * BQ + c0, BQ,
                  0);
    }
}

/* y += P V, p held transposed in st: query r sums keys j0 + j <= i0 + r. */
static void fwd_values(const att_args *a, float *y, const float *st, const float *vj, int nk,
                       int nq, int i0, int j0)
{
    const size_t lv = a->lv, lo = a->lo;
    if (j0 + nk <= i0 + 1) {
        a->k.gemm(nq, a->hs, nk, st, 1, BQ, vj, lv, y, lo, 1);
        return;
    }
    for (int rb = 0; rb < nq; rb += DIAG) {
        int rows = clampi(nq - rb, 0, DIAG), kk = clampi(i0 + rb + rows - j0, 0, nk);
        a->k.gemm(rows, a->hs, kk, st + rb, 1, BQ, vj, lv, y + rb * lo, lo, 1);
    }
}

static void fwd_tile(const att_args *a, int b, int h, int qt)
{
    _Alignas(64) float qt_[ZR_ATT_MAX_HS * BQ];
    _Alignas(64) float st[BK * BQ];
    float m[BQ], l[BQ], corr[BQ];
    const int T = a->T, hs = a->hs, kh = h / a->group;
    const size_t lo = a->lo;
    const float *q = a->q + (size_t)b * T * a->lq + (size_t)h * hs;
    const float *k = a->key + (size_t)b * T * a->lk + (size_t)kh * hs;
    const float *v = a->v + (size_t)b * T * a->lv + (size_t)kh * hs;
    const int i0 = qt * BQ, nq = T - i0 < BQ ? T - i0 : BQ;
    float *y = a->out + ((size_t)b * T + i0) * lo + (size_t)h * hs;
    transpose_rows(qt_, BQ, q + i0 * a->lq, a->lq, nq, hs);
    for (int r = 0; r < nq; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
        for (int d = 0; d < hs; d++) {
            y[r * lo + d] = 0.0f;
        }
    }
    for (int j0 = 0; j0 < i0 + nq; j0 += BK) {
        int nk = i0 + nq - j0 < BK ? i0 + nq - j0 : BK;
        fwd_scores(a, st, k + j0 * a->lk, qt_, nk, nq, i0, j0);
        a->k.fwd_step(st, nk, nq, i0, j0, a->scale, m, l, corr);
        for (int r = 0; r < nq; r++) {
            if (corr[r] != 1.0f) { /* multiplying by 1 changes nothing: skip it */
                for (int d = 0; d < hs; d++) {
                    y[r * lo + d] *= corr[r];
                }
            }
        }
        fwd_values(a, y, st, v + j0 * a->lv, nk, nq, i0, j0);
    }
    float *lse = a->lse + ((size_t)b * a->NH + h) * T + i0;
    for (int r = 0; r < nq; r++) {
        float inv = 1.0f / l[r];
        for (int d = 0; d < hs; d++) {
            y[r * lo + d] *= inv;
        }
        lse[r] = m[r] + logf(l[r]);
    }
}

static void fwd_task(void *arg, size_t t0, size_t t1, int thread)
{
    const att_args *a = arg;
    (void)thread;
    for (size_t t = t0; t < t1; t++) {
        int bh = (int)(t / (size_t)a->tiles), qt = (int)(t % (size_t)a->tiles);
        fwd_tile(a, bh / a->NH, bh % a->NH, qt);
    }
}

/* The shapes and strides of a call: q [B, T, NH hs] etc. as att_args says. */
static att_args args_for(int B, int T, int NH, int NKV, int hs, size_t lq, size_t lk, size_t lv,
                         size_t lo)
{
    ZR_ASSERT(hs <= ZR_ATT_MAX_HS && NKV > 0 && NH % NKV == 0);
    return (att_args){.k = kernels(),
                      .B = B,
                      .T = T,
                      .NH = NH,
                      .group = NH / NKV,
                      .hs = hs,
                      .tiles = (T + BQ - 1) / BQ,
                      .lq = lq,
                      .lk = lk,
                      .lv = lv,
                      .lo = lo,
                      .scale = 1.0f / sqrtf((float)hs)};
}

static void fwd_run(att_args *a, float *out, float *lse, const float *q, const float *k,
                    const float *v)
{
    a->out = out;
    a->lse = lse;
    a->q = q;
    a->key = k;
    a->v = v;
    zr_parallel_for((size_t)a->B * a->NH * a->tiles, 1, fwd_task, a);
}

void zr_op_attention_fwd(float *out, float *lse, const float *qkv, int B, int T, int C, int NH)
{
    const size_t C3 = 3 * (size_t)C;
    att_args a = args_for(B, T, NH, NH, C / NH, C3, C3, C3, (size_t)C);
    fwd_run(&a, out, lse, qkv, qkv + C, qkv + 2 * C);
}

void zr_op_attention_gqa_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                             int B, int T, int NH, int NKV, int hd)
{
    const size_t lq = (size_t)NH * hd, lkv = (size_t)NKV * hd;
    att_args a = args_for(B, T, NH, NKV, hd, lq, lkv, lkv, lq);
    fwd_run(&a, out, lse, q, k, v);
}

/*
 * The backward's products for query tile i0.. against key block j0..:
 * S = Q K^T and dP = dO V^T (query r needs keys j0 + j <= i0 + r), then,
 * from P and dS, dV += P^T dO and dK += dS^T Q (key j sums queries
 * i0 + r >= j0 + j) and dQ += dS K (query r sums keys j0 + j <= i0 + r).
 */
typedef struct bwd_pair {
    const float *qi, *doi, *kj;
    float *dq, *dkj, *dvj;
    int nq, nk, i0, j0;
} bwd_pair;

static void bwd_scores(const att_args *a, const bwd_pair *x, float *p, float *ds, const float *kt,
                       const float *vt)
{
    const size_t lq = a->lq, lo = a->lo;
    const int hs = a->hs, nk = x->nk;
    if (x->j0 + nk <= x->i0 + 1) {
        a->k.gemm(x->nq, nk, hs, x->qi, lq, 1, kt, BK, p, BK, 0);
        a->k.gemm(x->nq, nk, hs, x->doi, lo, 1, vt, BK, ds, BK, 0);
        return;
    }
    for (int rb = 0; rb < x->nq; rb += DIAG) {
        int rows = clampi(x->nq - rb, 0, DIAG), n = clampi(x->i0 + rb + rows - x->j0, 0, nk);
        for (int r = rb; r < rb + rows; r++) {
            for (int j = n; j < nk; j++) {
                p[(size_t)r * BK + j] = ds[(size_t)r * BK + j] = 0.0f;
            }
        }
        a->k.gemm(rows, n, hs, x->qi + rb * lq, lq, 1, kt, BK, p + rb * BK, BK, 0);
        a->k.gemm(rows, n, hs, x->doi + rb * lo, lo, 1, vt, BK, ds + rb * BK, BK, 0);
    }
}

static void bwd_grads(const att_args *a, const bwd_pair *x, const float *p, const float *ds)
{
    const size_t lq = a->lq, lk = a->lk, lv = a->lv, lo = a->lo;
    const int hs = a->hs, nq = x->nq, nk = x->nk;
    if (x->j0 + nk <= x->i0 + 1) {
        a->k.gemm(nk, hs, nq, p, 1, BK, x->doi, lo, x->dvj, lv, 1);
        a->k.gemm(nq, hs, nk, ds, BK, 1, x->kj, lk, x->dq, lq, 1);
        a->k.gemm(nk, hs, nq, ds, 1, BK, x->qi, lq, x->dkj, lk, 1);
        return;
    }
    for (int jb = 0; jb < nk; jb += DIAG) {
        int rows = clampi(nk - jb, 0, DIAG), r0 = clampi(x->j0 + jb - x->i0, 0, nq);
        const float *pj = p + (size_t)r0 * BK + jb, *dsj = ds + (size_t)r0 * BK + jb;
        a->k.gemm(rows, hs, nq - r0, pj, 1, BK, x->doi + r0 * lo, lo, x->dvj + jb * lv, lv, 1);
        a->k.gemm(rows, hs, nq - r0, dsj, 1, BK, x->qi + r0 * lq, lq, x->dkj + jb * lk, lk, 1);
    }
    for (int rb = 0; rb < nq; rb += DIAG) {
        int rows = clampi(nq - rb, 0, DIAG), kk = clampi(x->i0 + rb + rows - x->j0, 0, nk);
        a->k.gemm(rows, hs, kk, ds + (size_t)rb * BK, BK, 1, x->kj, lk, x->dq + rb * lq, lq, 1);
    }
}

/* Query head h of batch b: its rows, its key and value head's, and its lse and D. */
typedef struct head_ptrs {
    const float *q, *k, *v, *dO, *O, *lse;
    float *dq, *dk, *dv, *dlt;
} head_ptrs;

static head_ptrs head_at(const att_args *a, int b, int h)
{
    const size_t T = (size_t)a->T, hs = (size_t)a->hs, kh = (size_t)(h / a->group);
    const size_t oq = b * T * a->lq + h * hs, ok = b * T * a->lk + kh * hs;
    const size_t ov = b * T * a->lv + kh * hs, oo = b * T * a->lo + h * hs;
    const size_t ol = ((size_t)b * a->NH + h) * T;
    return (head_ptrs){a->q + oq,       a->key + ok, a->v + ov,  a->dout + oo, a->fwd_out + oo,
                       a->fwd_lse + ol, a->dq + oq,  a->dk + ok, a->dv + ov,   a->dlt + ol};
}

static void zero_rows(float *x, size_t ld, int T, int hs)
{
    for (int t = 0; t < T; t++) {
        for (int d = 0; d < hs; d++) {
            x[t * ld + d] = 0.0f;
        }
    }
}

/*
 * One (batch, key/value head): its columns of dK and dV, and of dQ for the
 * query heads that share it (one head for GPT-2). Key blocks outer, then
 * the group's query heads in order, query tiles inner: every sum into dK
 * and dV runs over those in that order whatever the thread count.
 */
static void bwd_group(const att_args *a, int b, int g)
{
    _Alignas(64) float kt[ZR_ATT_MAX_HS * BK], vt[ZR_ATT_MAX_HS * BK];
    _Alignas(64) float p[BQ * BK], ds[BQ * BK];
    const int T = a->T, hs = a->hs, h0 = g * a->group, h1 = h0 + a->group;
    const size_t lq = a->lq, lk = a->lk, lv = a->lv, lo = a->lo;
    const head_ptrs kv = head_at(a, b, h0);
    for (int h = h0; h < h1; h++) {
        head_ptrs x = head_at(a, b, h);
        a->k.delta(x.dlt, x.dO, x.O, lo, T, hs);
        zero_rows(x.dq, lq, T, hs);
    }
    zero_rows(kv.dk, lk, T, hs);
    zero_rows(kv.dv, lv, T, hs);
    for (int j0 = 0; j0 < T; j0 += BK) {
        int nk = T - j0 < BK ? T - j0 : BK;
        transpose_rows(kt, BK, kv.k + j0 * lk, lk, nk, hs);
        transpose_rows(vt, BK, kv.v + j0 * lv, lv, nk, hs);
        for (int h = h0; h < h1; h++) {
            head_ptrs x = head_at(a, b, h);
            for (int i0 = j0 / BQ * BQ; i0 < T; i0 += BQ) {
                bwd_pair y = {.qi = x.q + i0 * lq,
                              .doi = x.dO + i0 * lo,
                              .kj = x.k + j0 * lk,
                              .dq = x.dq + i0 * lq,
                              .dkj = x.dk + j0 * lk,
                              .dvj = x.dv + j0 * lv,
                              .nq = T - i0 < BQ ? T - i0 : BQ,
                              .nk = nk,
                              .i0 = i0,
                              .j0 = j0};
                bwd_scores(a, &y, p, ds, kt, vt);
                a->k.bwd_step(p, ds, y.nq, nk, i0, j0, a->scale, x.lse + i0, x.dlt + i0);
                bwd_grads(a, &y, p, ds);
            }
        }
    }
}

static void bwd_task(void *arg, size_t t0, size_t t1, int thread)
{
    const att_args *a = arg;
    const int groups = a->NH / a->group;
    (void)thread;
    for (size_t t = t0; t < t1; t++) {
        bwd_group(a, (int)t / groups, (int)t % groups);
    }
}

static void bwd_run(att_args *a, float *dq, float *dk, float *dv, float *scratch, const float *dout,
                    const float *q, const float *k, const float *v, const float *out,
                    const float *lse)
{
    a->dq = dq;
    a->dk = dk;
    a->dv = dv;
    a->dlt = scratch;
    a->dout = dout;
    a->q = q;
    a->key = k;
    a->v = v;
    a->fwd_out = out;
    a->fwd_lse = lse;
    zr_parallel_for((size_t)a->B * (a->NH / a->group), 1, bwd_task, a);
}

void zr_op_attention_bwd(float *dqkv, float *scratch, const float *dout, const float *qkv,
                         const float *out, const float *lse, int B, int T, int C, int NH)
{
    const size_t C3 = 3 * (size_t)C;
    att_args a = args_for(B, T, NH, NH, C / NH, C3, C3, C3, (size_t)C);
    bwd_run(&a, dqkv, dqkv + C, dqkv + 2 * C, scratch, dout, qkv, qkv + C, qkv + 2 * C, out, lse);
}

void zr_op_attention_gqa_bwd(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                             const float *q, const float *k, const float *v, const float *out,
                             const float *lse, int B, int T, int NH, int NKV, int hd)
{
    const size_t lq = (size_t)NH * hd, lkv = (size_t)NKV * hd;
    att_args a = args_for(B, T, NH, NKV, hd, lq, lkv, lkv, lq);
    bwd_run(&a, dq, dk, dv, scratch, dout, q, k, v, out, lse);
}

/* ---- the double-precision reference --------------------------------------------- */

void zr_op_attention_fwd_ref64(double *out, const float *qkv, int B, int T, int C, int NH)
{
    const int hs = C / NH;
    const size_t C3 = 3 * (size_t)C;
    const double scale = 1.0 / sqrt((double)hs);
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
            for (int i = 0; i < T; i++) {
                double *y = out + ((size_t)b * T + i) * C + (size_t)h * hs;
                double mx = -INFINITY, l = 0.0;
                for (int pass = 0; pass < 2; pass++) { /* max, then the sums */
                    for (int j = 0; j <= i; j++) {
                        double s = 0.0;
                        for (int d = 0; d < hs; d++) {
                            s += (double)q[i * C3 + d] * k[j * C3 + d];
                        }
                        s *= scale;
                        if (pass == 0) {
                            mx = s > mx ? s : mx;
                            continue;
                        }
                        double p = exp(s - mx);
                        l += p;
                        for (int d = 0; d < hs; d++) {
                            y[d] = (j == 0 ? 0.0 : y[d]) + p * v[j * C3 + d];
                        }
                    }
                }
                for (int d = 0; d < hs; d++) {
                    y[d] /= l;
                }
            }
        }
    }
}
