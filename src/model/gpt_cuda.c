/*
 * gpt_cuda.c - GPT-2 forward and backward on a CUDA device, one parameter
 * unit at a time (zr/model_cuda.h), the device twin of gpt.c.
 *
 * The units, their tensors and the call order are the CPU model's, so the
 * ZeRO engine drives both alike: each call takes the unit's device buffer
 * and keeps no pointer to it. Every activation, the backward's scratch, the
 * token arrays and the control buffer live in one device allocation carved
 * once at init. A step talks to the host twice: forward_begin copies the
 * tokens (inputs, targets and the embedding backward's token buckets, built
 * here on the host) in one transfer, and the last forward unit copies the
 * control buffer (the mean loss, computed on the device) back in one
 * transfer; zr_gpt_cuda_loss waits for that copy only.
 *
 * A block, forward (tmp holds a projection before its residual add):
 *   ln1 = LN(x); qkv = ln1 W_qkv^T + b; atty = attention(qkv) (+ lse)
 *   tmp = atty W_proj^T; res2 = x + (tmp + b_proj), ln2 = LN(res2)   (fused)
 *   fch = ln2 W_fc^T; fch += b_fc, fch_gelu = GELU(fch)             (fused)
 *   tmp = fch_gelu W_fcproj^T; res3 = res2 + (tmp + b_fcproj)
 * and backward in reverse, dres carrying d(res3) down to d(x) in place. The
 * matrix products are cuBLAS' (blas_cuda.c), the rest the CUDA operators' kernels (ops_table.h,
 * m->ops).
 */
#include "zr/model_cuda.h"

#include "../base/device_impl.h"
#include "gpt_tensors.h"
#include "zr/gpt_engine.h"

#include "ops_table.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CARVE_ALIGN 256

/* ---- layout ---------------------------------------------------------------------------- */

/* Carves the arena (base == NULL: only counts bytes). */
static size_t layout(zr_gpt_cuda *m, char *base)
{
    const size_t B = (size_t)m->B, T = (size_t)m->T, C = (size_t)m->cfg.channels;
    const size_t NH = (size_t)m->cfg.heads, Vp = (size_t)m->cfg.padded_vocab;
    const size_t BT = B * T, es = m->es, f = sizeof(float);
    size_t off = 0;
#define CARVE(ptr, bytes)                                                                          \
    do {                                                                                           \
        if (base != NULL) {                                                                        \
            (ptr) = (void *)(base + off);                                                          \
        }                                                                                          \
        off += zr_round_up((bytes), CARVE_ALIGN);                                                  \
    } while (0)
    CARVE(m->encoded, BT * C * es);
    for (int l = 0; l < m->cfg.layers; l++) {
        zr_gpt_cuda_layer dummy, *a = base != NULL ? &m->layers[l] : &dummy;
        CARVE(a->ln1, BT * C * es);
        CARVE(a->ln1_mean, BT * f);
        CARVE(a->ln1_rstd, BT * f);
        CARVE(a->qkv, BT * 3 * C * es);
        CARVE(a->atty, BT * C * es);
        CARVE(a->att_lse, B * NH * T * f);
        CARVE(a->res2, BT * C * es);
        CARVE(a->ln2, BT * C * es);
        CARVE(a->ln2_mean, BT * f);
        CARVE(a->ln2_rstd, BT * f);
        CARVE(a->fch, BT * 4 * C * es);
        CARVE(a->fch_gelu, BT * 4 * C * es);
        CARVE(a->res3, BT * C * es);
    }
    CARVE(m->lnf, BT * C * es);
    CARVE(m->lnf_mean, BT * f);
    CARVE(m->lnf_rstd, BT * f);
    CARVE(m->logits, BT * Vp * es);
    CARVE(m->losses, BT * f);
    CARVE(m->xent_lse, BT * f);
    CARVE(m->dres, BT * C * es);
    CARVE(m->dln, BT * C * es);
    CARVE(m->datty, BT * C * es);
    CARVE(m->dbig, BT * 4 * C * es);
    CARVE(m->tmp, BT * C * es);
    CARVE(m->att_delta, B * NH * T * f);
    CARVE(m->colsum, zr_op_colsum_scratch((int)BT, 4 * (int)C) * f);
    CARVE(m->tokens, (5 * BT + 1) * sizeof(int));
    CARVE(m->ctrl, ZR_GPT_CUDA_CTRL * f);
#undef CARVE
    return off;
}

/* The device token arrays, in the order of the one host-to-device copy. */
static int *dev_inputs(const zr_gpt_cuda *m)
{
    return m->tokens;
}
static int *dev_targets(const zr_gpt_cuda *m)
{
    return m->tokens + (size_t)m->B * m->T;
}
/* bucket tokens, starts (one more), positions */
static int *dev_buckets(const zr_gpt_cuda *m, int which)
{
    size_t BT = (size_t)m->B * m->T;
    return m->tokens + (2 + (size_t)which) * BT + (which == 2 ? 1 : 0);
}

/* Unit u's tensor i inside the device buffer p (compute type). */
static void *tensor(const zr_gpt_cuda *m, const zr_tensor_desc *d, int i, const void *p)
{
    return (char *)(uintptr_t)p + d[i].offset * m->es;
}

static const void *block_input(const zr_gpt_cuda *m, int l)
{
    return l == 0 ? m->encoded : m->layers[l - 1].res3;
}

/* ---- init / free ---------------------------------------------------------------------- */

int zr_gpt_cuda_max_batch(const zr_gpt_config *cfg, int T)
{
    ZR_ASSERT(T > 0);
    /* rows B T are int in the launchers (the token buckets' check takes 2^30); the attention
       kernels' grid has B NH blocks in y, at most 65535; offsets are 64-bit (ops_index.h) */
    long long rows = (1LL << 30) / T, grid = 65535 / cfg->heads;
    return (int)(rows < grid ? rows : grid);
}

static zr_status shape_ok(const zr_gpt_config *cfg, int B, int T, zr_dtype type, zr_stream *s)
{
    ZR_CHECK(zr_gpt_config_check(cfg));
    if (!zr_device_cuda_built()) {
        ZR_FAIL(ZR_ERR_DEVICE,
                "GPT on CUDA: zr was built without CUDA (make CUDA=0, or no nvcc at build time)");
    }
    if (s == NULL || zr_stream_device(s)->kind != ZR_DEVICE_CUDA) {
        ZR_FAIL(ZR_ERR_INVALID, "GPT on CUDA: needs a stream of a CUDA device");
    }
    if (type != ZR_DTYPE_F32 && type != ZR_DTYPE_BF16) {
        ZR_FAIL(ZR_ERR_INVALID, "GPT on CUDA: compute type %d is neither fp32 nor bf16", (int)type);
    }
    if (T <= 0 || T > cfg->max_t) {
        ZR_FAIL(ZR_ERR_INVALID, "GPT on CUDA: T = %d (need 1 <= T <= max_t = %d)", T, cfg->max_t);
    }
    int bmax = zr_gpt_cuda_max_batch(cfg, T);
    if (B <= 0 || B > bmax) {
        ZR_FAIL(ZR_ERR_INVALID,
                "GPT on CUDA: micro-batch B = %d at T = %d (need 1 <= B <= %d: the kernels take "
                "B T = %lld rows up to 2^30 and B heads = %lld attention blocks up to 65535)",
                B, T, bmax, (long long)B * T, (long long)B * cfg->heads);
    }
    if (cfg->channels % 8 != 0 || cfg->channels / cfg->heads > 256) {
        ZR_FAIL(ZR_ERR_INVALID,
                "GPT on CUDA: channels = %d must be a multiple of 8 and the head size %d at "
                "most 256",
                cfg->channels, cfg->channels / cfg->heads);
    }
    return ZR_OK;
}

static zr_status init_buffers(zr_gpt_cuda *m)
{
    const zr_device *dev = zr_stream_device(m->stream);
    size_t BT = (size_t)m->B * m->T;
    ZR_ALLOC(m->layers, (size_t)m->cfg.layers);
    m->arena_bytes = layout(m, NULL);
    ZR_CHECK(zr_device_alloc_at(dev, &m->arena, m->arena_bytes, __FILE__, __LINE__));
    layout(m, m->arena);
    ZR_CHECK(zr_host_alloc_pinned_at(dev, (void **)&m->host_tokens, (5 * BT + 1) * sizeof(int),
                                     __FILE__, __LINE__));
    ZR_CHECK(zr_host_alloc_pinned_at(dev, (void **)&m->host_ctrl, ZR_GPT_CUDA_CTRL * sizeof(float),
                                     __FILE__, __LINE__));
    ZR_ALLOC(m->bucket_count, (size_t)m->cfg.vocab);
    ZR_CHECK(zr_event_create(dev, &m->tokens_ev));
    ZR_CHECK(zr_event_create(dev, &m->ctrl_ev));
    ZR_CHECK(zr_blas_create(m->stream, m->type, &m->blas));
    m->host_ctrl[0] = NAN;
    return ZR_OK;
}

/* The GEMM epilogues unless ZR_GEMM_EPILOGUE=0 (read at each init). */
static int epilogues_on(void)
{
    const char *epi = getenv("ZR_GEMM_EPILOGUE");
    return epi == NULL || strcmp(epi, "0") != 0;
}

zr_status zr_gpt_cuda_init(zr_gpt_cuda *m, const zr_gpt_config *cfg, int B, int T, zr_dtype type,
                           zr_stream *s)
{
    memset(m, 0, sizeof *m);
    ZR_CHECK(shape_ok(cfg, B, T, type, s));
    const zr_gpt_backend_i *be; /* "built without CUDA" in a build without */
    ZR_CHECK(zr_gpt_backend_of(ZR_DEVICE_CUDA, &be));
    m->ops = be->ops;
    m->cfg = *cfg;
    m->B = B;
    m->T = T;
    m->type = type;
    m->es = zr_dtype_size(type);
    m->stream = s;
    m->fused = epilogues_on();
    zr_gpt_config_unit_tensors(cfg, 0, m->unit0_desc);
    zr_gpt_config_unit_tensors(cfg, 1, m->block_desc);
    zr_gpt_config_unit_tensors(cfg, cfg->layers + 1, m->final_desc);
    m->fwd_next = m->bwd_next = -1;
    zr_status st = init_buffers(m);
    if (st != ZR_OK) {
        zr_gpt_cuda_free(m);
    }
    return st;
}

void zr_gpt_cuda_free(zr_gpt_cuda *m)
{
    if (m == NULL || m->stream == NULL) {
        return;
    }
    const zr_device *dev = zr_stream_device(m->stream);
    (void)zr_stream_sync(m->stream); /* nothing queued may still use what goes now */
    zr_blas_destroy(m->blas);
    zr_event_destroy(m->tokens_ev);
    zr_event_destroy(m->ctrl_ev);
    zr_free(m->bucket_count);
    zr_host_free_pinned(dev, m->host_ctrl);
    zr_host_free_pinned(dev, m->host_tokens);
    zr_device_free(dev, m->arena);
    zr_free(m->layers);
    memset(m, 0, sizeof *m);
}

size_t zr_gpt_cuda_activation_bytes(const zr_gpt_config *cfg, int B, int T, zr_dtype type)
{
    zr_gpt_cuda m;
    memset(&m, 0, sizeof m);
    m.cfg = *cfg;
    m.B = B;
    m.T = T;
    m.es = zr_dtype_size(type);
    /* the fused GEMMs' first call gives the model's cuBLAS handle its cuBLASLt workspace */
    return layout(&m, NULL) + (epilogues_on() ? zr_blas_epi_workspace_bytes() : 0);
}

/* ---- matrix products ------------------------------------------------------------------- */

/* One row-major product on the model's stream: C = op(A) op(B) + beta C (zr_gemm's fields). */
static zr_status mm(zr_gpt_cuda *m, int ta, int tb, int M, int N, int K, int lda, int ldb, int ldc,
                    float beta, const void *A, const void *B, void *C)
{
    zr_gemm g = {ta, tb, M, N, K, lda, ldb, ldc, 0, 0, 0, 1, 1.0f, beta};
    return zr_blas_gemm(m->blas, &g, A, B, C);
}

/* out[N, OC] (row stride ldo) = inp[N, K] w[OC, K]^T */
static zr_status mm_fwd(zr_gpt_cuda *m, void *out, const void *inp, const void *w, int N, int K,
                        int OC, int ldo)
{
    return mm(m, 0, 1, N, OC, K, K, K, ldo, 0.0f, inp, w, out);
}

/* out[N, OC] = epilogue(inp[N, K] w[OC, K]^T) with bias [OC] and aux [N, OC] (zr_gemm_epi) */
static zr_status mm_fwd_epi(zr_gpt_cuda *m, void *out, const void *inp, const void *w, int N, int K,
                            int OC, zr_gemm_epilogue kind, const void *bias, void *aux)
{
    zr_gemm g = {0, 1, N, OC, K, K, K, OC, 0, 0, 0, 1, 1.0f, 0.0f};
    zr_gemm_epi e = {kind, bias, aux, OC};
    return zr_blas_gemm_epi(m->blas, &g, &e, inp, w, out);
}

/* dinp[N, K] = (dout[N, OC] (row stride ldd) w[OC, K]) * GELU'(pre[N, K]) */
static zr_status mm_dinp_dgelu(zr_gpt_cuda *m, void *dinp, const void *dout, const void *w,
                               const void *pre, int N, int K, int OC, int ldd)
{
    zr_gemm g = {0, 0, N, K, OC, ldd, K, K, 0, 0, 0, 1, 1.0f, 0.0f};
    zr_gemm_epi e = {ZR_GEMM_EPI_DGELU, NULL, (void *)pre, K};
    return zr_blas_gemm_epi(m->blas, &g, &e, dout, w, dinp);
}

/* dinp[N, K] = dout[N, OC] (row stride ldd) w[OC, K] */
static zr_status mm_dinp(zr_gpt_cuda *m, void *dinp, const void *dout, const void *w, int N, int K,
                         int OC, int ldd)
{
    return mm(m, 0, 0, N, K, OC, ldd, K, K, 0.0f, dout, w, dinp);
}

/* dw[OC, K] += dout[N, OC]^T (row stride ldd) inp[N, K] */
static zr_status mm_dw(zr_gpt_cuda *m, void *dw, const void *dout, const void *inp, int N, int K,
                       int OC, int ldd)
{
    return mm(m, 1, 0, OC, K, N, ldd, K, K, 1.0f, dout, inp, dw);
}

/* ---- forward ---------------------------------------------------------------------------- */

zr_status zr_gpt_cuda_forward_begin(zr_gpt_cuda *m, const int *inputs, const int *targets)
{
    const int BT = m->B * m->T, V = m->cfg.vocab;
    for (int i = 0; i < BT; i++) {
        if (inputs[i] < 0 || inputs[i] >= V ||
            (targets != NULL && (targets[i] < 0 || targets[i] >= V))) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "GPT on CUDA: token %d (input) / %d (target) at position %d is outside "
                    "[0, %d)",
                    inputs[i], targets != NULL ? targets[i] : 0, i, V);
        }
    }
    /* the previous step's copy must have read the pinned buffer before it changes */
    ZR_CHECK(zr_event_sync(m->tokens_ev));
    int *h = m->host_tokens;
    memcpy(h, inputs, (size_t)BT * sizeof *h);
    if (targets != NULL) {
        memcpy(h + BT, targets, (size_t)BT * sizeof *h);
    } else {
        memset(h + BT, 0, (size_t)BT * sizeof *h);
    }
    m->nbuckets =
        zr_token_buckets(inputs, BT, V, h + 2 * BT, h + 3 * BT, h + 4 * BT + 1, m->bucket_count);
    ZR_CHECK(zr_memcpy_async(m->tokens, h, (5 * (size_t)BT + 1) * sizeof *h, m->stream));
    ZR_CHECK(zr_event_record(m->tokens_ev, m->stream));
    m->has_targets = targets != NULL;
    m->loss_pending = 0;
    m->fwd_next = 0;
    m->bwd_next = -1;
    return ZR_OK;
}

static zr_status block_forward(zr_gpt_cuda *m, int l, const void *p)
{
    const int B = m->B, T = m->T, C = m->cfg.channels, NH = m->cfg.heads, BT = B * T;
    const zr_dtype t = m->type;
    const zr_tensor_desc *d = m->block_desc;
    zr_stream *s = m->stream;
    zr_gpt_cuda_layer *a = &m->layers[l];
    const void *inp = block_input(m, l);
#define W(i) tensor(m, d, (i), p)
    ZR_CHECK(m->ops->layernorm_fwd(t, a->ln1, a->ln1_mean, a->ln1_rstd, inp, W(T_LN1W), W(T_LN1B),
                                   BT, C, s));
    if (m->fused) {
        ZR_CHECK(mm_fwd_epi(m, a->qkv, a->ln1, W(T_QKVW), BT, C, 3 * C, ZR_GEMM_EPI_BIAS, W(T_QKVB),
                            NULL));
    } else {
        ZR_CHECK(mm_fwd(m, a->qkv, a->ln1, W(T_QKVW), BT, C, 3 * C, 3 * C));
        ZR_CHECK(m->ops->bias_add(t, a->qkv, W(T_QKVB), BT, 3 * C, s));
    }
    ZR_CHECK(m->ops->attention_fwd(t, a->atty, a->att_lse, a->qkv, B, T, C, NH, s));
    ZR_CHECK(mm_fwd(m, m->tmp, a->atty, W(T_ATTPROJW), BT, C, C, C));
    ZR_CHECK(m->ops->residual_layernorm_fwd(t, a->res2, a->ln2, a->ln2_mean, a->ln2_rstd, inp,
                                            m->tmp, W(T_ATTPROJB), W(T_LN2W), W(T_LN2B), BT, C, s));
    if (m->fused) { /* fch keeps GELU's input for the backward */
        ZR_CHECK(mm_fwd_epi(m, a->fch_gelu, a->ln2, W(T_FCW), BT, C, 4 * C, ZR_GEMM_EPI_BIAS_GELU,
                            W(T_FCB), a->fch));
    } else {
        ZR_CHECK(mm_fwd(m, a->fch, a->ln2, W(T_FCW), BT, C, 4 * C, 4 * C));
        ZR_CHECK(m->ops->bias_gelu_fwd(t, a->fch_gelu, a->fch, W(T_FCB), BT, 4 * C, s));
    }
    ZR_CHECK(mm_fwd(m, m->tmp, a->fch_gelu, W(T_FCPROJW), BT, 4 * C, C, C));
    ZR_CHECK(m->ops->residual_fwd(t, a->res3, a->res2, m->tmp, W(T_FCPROJB), BT, C, s));
#undef W
    return ZR_OK;
}

/* Final LayerNorm, tied LM head, and (with targets) the losses, their mean, its copy home. */
static zr_status final_forward(zr_gpt_cuda *m, const void *p, const void *p0)
{
    const int BT = m->B * m->T, C = m->cfg.channels, V = m->cfg.vocab, Vp = m->cfg.padded_vocab;
    const zr_dtype t = m->type;
    zr_stream *s = m->stream;
    ZR_CHECK(m->ops->layernorm_fwd(t, m->lnf, m->lnf_mean, m->lnf_rstd,
                                   block_input(m, m->cfg.layers), tensor(m, m->final_desc, 0, p),
                                   tensor(m, m->final_desc, 1, p), BT, C, s));
    /* logits over the aligned Vp (cuBLAS's fast kernels want N % 8 == 0; at N = V = 50257 it
       ran sm_75 CUTLASS kernels, ~15x slower on an H200): columns V..Vp come from wte's padded
       rows, whatever they hold; the loss never reads them and the backward zeroes them */
    ZR_CHECK(mm_fwd(m, m->logits, m->lnf, tensor(m, m->unit0_desc, 0, p0), BT, C, Vp, Vp));
    if (!m->has_targets) {
        return ZR_OK;
    }
    ZR_CHECK(m->ops->xent_fwd(t, m->losses, m->xent_lse, m->logits, dev_targets(m), BT, V, Vp, s));
    ZR_CHECK(m->ops->mean(m->ctrl, m->losses, BT, s));
    ZR_CHECK(zr_memcpy_async(m->host_ctrl, m->ctrl, ZR_GPT_CUDA_CTRL * sizeof(float), s));
    ZR_CHECK(zr_event_record(m->ctrl_ev, s));
    m->loss_pending = 1;
    return ZR_OK;
}

zr_status zr_gpt_cuda_forward_unit(zr_gpt_cuda *m, int u, const void *params,
                                   const void *unit0_params)
{
    const int L = m->cfg.layers;
    if (m->fwd_next != u) {
        ZR_FAIL(ZR_ERR_INVALID,
                "GPT on CUDA forward: unit %d called, expected %d (call forward_begin, then units "
                "0..%d in order)",
                u, m->fwd_next, L + 1);
    }
    if (params == NULL || (u == L + 1 && unit0_params == NULL)) {
        ZR_FAIL(ZR_ERR_INVALID, "GPT on CUDA forward: unit %d needs its parameters%s", u,
                u == L + 1 ? " and unit 0's (tied LM head)" : "");
    }
    if (u == 0) {
        ZR_CHECK(m->ops->encoder_fwd(
            m->type, m->encoded, dev_inputs(m), tensor(m, m->unit0_desc, 0, params),
            tensor(m, m->unit0_desc, 1, params), m->B, m->T, m->cfg.channels, m->stream));
    } else if (u <= L) {
        ZR_CHECK(block_forward(m, u - 1, params));
    } else {
        ZR_CHECK(final_forward(m, params, unit0_params));
    }
    m->fwd_next = u + 1;
    return ZR_OK;
}

zr_status zr_gpt_cuda_loss(zr_gpt_cuda *m, float *loss)
{
    *loss = NAN;
    if (!m->loss_pending) {
        return ZR_OK;
    }
    ZR_CHECK(zr_event_sync(m->ctrl_ev));
    *loss = m->host_ctrl[0];
    return ZR_OK;
}

/* ---- backward --------------------------------------------------------------------------- */

zr_status zr_gpt_cuda_backward_begin(zr_gpt_cuda *m)
{
    if (m->fwd_next != m->cfg.layers + 2 || !m->has_targets) {
        ZR_FAIL(ZR_ERR_INVALID,
                "GPT on CUDA backward: needs a complete forward pass with targets first");
    }
    m->bwd_next = m->cfg.layers + 1;
    m->fwd_next = -1; /* the logits become dlogits: no second backward on this forward */
    return ZR_OK;
}

static zr_status final_backward(zr_gpt_cuda *m, const void *p, const void *p0, void *g, void *g0)
{
    const int BT = m->B * m->T, C = m->cfg.channels, V = m->cfg.vocab, Vp = m->cfg.padded_vocab;
    const zr_dtype t = m->type;
    zr_stream *s = m->stream;
    ZR_CHECK(m->ops->xent_bwd(t, m->logits, m->xent_lse, dev_targets(m), 1.0f / (float)BT, BT, V,
                              Vp, s));
    /* over Vp: dlogits' padded columns are exactly 0 (xent_bwd writes them), so they add
       nothing to dln and the padded rows of wte's gradient get + 0 (they stay 0, as on the CPU) */
    ZR_CHECK(mm_dinp(m, m->dln, m->logits, tensor(m, m->unit0_desc, 0, p0), BT, C, Vp, Vp));
    ZR_CHECK(mm_dw(m, tensor(m, m->unit0_desc, 0, g0), m->logits, m->lnf, BT, C, Vp, Vp));
    /* dres is written here (not accumulated): the residual stream's gradient starts */
    return m->ops->layernorm_bwd(t, m->dres, tensor(m, m->final_desc, 0, g),
                                 tensor(m, m->final_desc, 1, g), m->dln,
                                 block_input(m, m->cfg.layers), tensor(m, m->final_desc, 0, p),
                                 m->lnf_mean, m->lnf_rstd, BT, C, 0, m->colsum, s);
}

/* The MLP half of block l's backward: dres = d(res3) becomes d(res2). */
static zr_status block_backward_mlp(zr_gpt_cuda *m, int l, const void *p, void *g)
{
    const int BT = m->B * m->T, C = m->cfg.channels;
    const zr_dtype t = m->type;
    const zr_tensor_desc *d = m->block_desc;
    zr_stream *s = m->stream;
    const zr_gpt_cuda_layer *a = &m->layers[l];
#define W(i) tensor(m, d, (i), p)
#define G(i) tensor(m, d, (i), g)
    if (m->fused) {
        ZR_CHECK(mm_dinp_dgelu(m, m->dbig, m->dres, W(T_FCPROJW), a->fch, BT, 4 * C, C, C));
    } else {
        ZR_CHECK(mm_dinp(m, m->dbig, m->dres, W(T_FCPROJW), BT, 4 * C, C, C));
    }
    ZR_CHECK(mm_dw(m, G(T_FCPROJW), m->dres, a->fch_gelu, BT, 4 * C, C, C));
    ZR_CHECK(m->ops->colsum_acc(t, G(T_FCPROJB), m->dres, BT, C, m->colsum, s));
    if (!m->fused) {
        ZR_CHECK(m->ops->gelu_bwd(t, m->dbig, a->fch, m->dbig, (size_t)BT * 4 * C, s));
    }
    ZR_CHECK(m->ops->colsum_acc(t, G(T_FCB), m->dbig, BT, 4 * C, m->colsum, s));
    ZR_CHECK(mm_dinp(m, m->dln, m->dbig, W(T_FCW), BT, C, 4 * C, 4 * C));
    ZR_CHECK(mm_dw(m, G(T_FCW), m->dbig, a->ln2, BT, C, 4 * C, 4 * C));
    return m->ops->layernorm_bwd(t, m->dres, G(T_LN2W), G(T_LN2B), m->dln, a->res2, W(T_LN2W),
                                 a->ln2_mean, a->ln2_rstd, BT, C, 1, m->colsum, s);
}

/* The attention half: dres = d(res2) becomes d(block input). */
static zr_status block_backward_attn(zr_gpt_cuda *m, int l, const void *p, void *g)
{
    const int B = m->B, T = m->T, C = m->cfg.channels, NH = m->cfg.heads, BT = B * T;
    const zr_dtype t = m->type;
    const zr_tensor_desc *d = m->block_desc;
    zr_stream *s = m->stream;
    const zr_gpt_cuda_layer *a = &m->layers[l];
    ZR_CHECK(mm_dinp(m, m->datty, m->dres, W(T_ATTPROJW), BT, C, C, C));
    ZR_CHECK(mm_dw(m, G(T_ATTPROJW), m->dres, a->atty, BT, C, C, C));
    ZR_CHECK(m->ops->colsum_acc(t, G(T_ATTPROJB), m->dres, BT, C, m->colsum, s));
    ZR_CHECK(m->ops->attention_bwd(t, m->dbig, m->att_delta, m->datty, a->qkv, a->atty, a->att_lse,
                                   B, T, C, NH, s));
    ZR_CHECK(mm_dinp(m, m->dln, m->dbig, W(T_QKVW), BT, C, 3 * C, 3 * C));
    ZR_CHECK(mm_dw(m, G(T_QKVW), m->dbig, a->ln1, BT, C, 3 * C, 3 * C));
    ZR_CHECK(m->ops->colsum_acc(t, G(T_QKVB), m->dbig, BT, 3 * C, m->colsum, s));
    return m->ops->layernorm_bwd(t, m->dres, G(T_LN1W), G(T_LN1B), m->dln, block_input(m, l),
                                 W(T_LN1W), a->ln1_mean, a->ln1_rstd, BT, C, 1, m->colsum, s);
#undef W
#undef G
}

zr_status zr_gpt_cuda_backward_unit(zr_gpt_cuda *m, int u, const void *params,
                                    const void *unit0_params, void *grads, void *unit0_grads)
{
    const int L = m->cfg.layers;
    if (m->bwd_next != u) {
        ZR_FAIL(ZR_ERR_INVALID,
                "GPT on CUDA backward: unit %d called, expected %d (call backward_begin, then "
                "units %d..0 in order)",
                u, m->bwd_next, L + 1);
    }
    if (grads == NULL || (u > 0 && params == NULL) ||
        (u == L + 1 && (unit0_params == NULL || unit0_grads == NULL))) {
        ZR_FAIL(ZR_ERR_INVALID,
                "GPT on CUDA backward: unit %d is missing its parameters or gradients%s", u,
                u == L + 1 ? " (the last unit also needs unit 0's)" : "");
    }
    if (u == L + 1) {
        ZR_CHECK(final_backward(m, params, unit0_params, grads, unit0_grads));
    } else if (u >= 1) {
        ZR_CHECK(block_backward_mlp(m, u - 1, params, grads));
        ZR_CHECK(block_backward_attn(m, u - 1, params, grads));
    } else {
        ZR_CHECK(m->ops->encoder_bwd(m->type, tensor(m, m->unit0_desc, 0, grads),
                                     tensor(m, m->unit0_desc, 1, grads), m->dres, dev_buckets(m, 0),
                                     dev_buckets(m, 1), dev_buckets(m, 2), m->nbuckets, m->B, m->T,
                                     m->cfg.channels, m->stream));
    }
    m->bwd_next = u - 1;
    return ZR_OK;
}
