/*
 * gpt.c - GPT-2 forward and backward, one parameter unit at a time.
 *
 * The unit split (embedding, L blocks, final LayerNorm + tied LM head) is
 * what lets the ZeRO engine keep only the unit it is working on gathered:
 * every function here takes the unit's flat buffer as an argument and keeps
 * no pointer to it after returning. Activations of all layers stay in one
 * arena owned by zr_gpt, allocated once in zr_gpt_init.
 *
 * Activation checkpointing (recompute): each block keeps only its output
 * (res3, the next block's input); the block's other activations live in one
 * set shared by all blocks, which the forward overwrites block by block and
 * the backward refills by running the block's forward again from its saved
 * input before differentiating it. The recomputation runs the same ops on
 * the same inputs and parameters, so the gradients are bit-identical; the
 * cost is one more block forward per block (except the last, whose
 * activations are still in the shared set when the backward reaches it).
 */
#include "zr/model.h"

#include "gpt_tensors.h"
#include "zr/llama.h" /* zr_llama_config_activation_bytes */
#include "ops.h"
#include "zr/pool.h"

#include "../base/blas.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- init / free ---------------------------------------------------------- */

/* Carves the arena; with base == NULL only counts floats. */
static size_t layout_acts(zr_gpt *m, float *base)
{
    const size_t B = (size_t)m->B, T = (size_t)m->T, C = (size_t)m->cfg.channels;
    const size_t NH = (size_t)m->cfg.heads, Vp = (size_t)m->cfg.padded_vocab;
    const size_t BT = B * T;
    size_t off = 0;
#define CARVE(ptr, n)                                                                              \
    do {                                                                                           \
        if (base != NULL) {                                                                        \
            (ptr) = base + off;                                                                    \
        }                                                                                          \
        off += zr_round_up((n), ZR_ALIGN / sizeof(float));                                         \
    } while (0)
    CARVE(m->encoded, BT * C);
    for (int l = 0; l < m->cfg.layers; l++) {
        zr_gpt_layer_acts *a = base != NULL ? &m->layers[l] : NULL;
        float *dummy;
#define CARVE_L(field, n) CARVE(*(a != NULL ? &a->field : &dummy), (n))
        CARVE_L(res3, BT * C);
        if (m->recompute && l > 0) {
            if (a != NULL) {
                float *res3 = a->res3;
                *a = m->layers[0]; /* the shared set */
                a->res3 = res3;
            }
            continue;
        }
        CARVE_L(ln1, BT * C);
        CARVE_L(ln1_mean, BT);
        CARVE_L(ln1_rstd, BT);
        CARVE_L(qkv, BT * 3 * C);
        CARVE_L(atty, BT * C);
        CARVE_L(att_lse, B * NH * T);
        CARVE_L(res2, BT * C);
        CARVE_L(ln2, BT * C);
        CARVE_L(ln2_mean, BT);
        CARVE_L(ln2_rstd, BT);
        CARVE_L(fch, BT * 4 * C);
        CARVE_L(fch_gelu, BT * 4 * C);
#undef CARVE_L
        (void)dummy;
    }
    CARVE(m->lnf, BT * C);
    CARVE(m->lnf_mean, BT);
    CARVE(m->lnf_rstd, BT);
    CARVE(m->probs, BT * Vp);
    CARVE(m->losses, BT);
    CARVE(m->dres, BT * C);
    CARVE(m->dln, BT * C);
    CARVE(m->datty, BT * C);
    CARVE(m->dbig, BT * 4 * C);
    CARVE(m->att_delta, B * NH * T);
    CARVE(m->tmp, BT * C);
#undef CARVE
    return off;
}

zr_status zr_gpt_init(zr_gpt *m, const zr_gpt_config *cfg, int B, int T)
{
    return zr_gpt_init_ex(m, cfg, B, T, 0);
}

zr_status zr_gpt_init_ex(zr_gpt *m, const zr_gpt_config *cfg, int B, int T, int recompute)
{
    memset(m, 0, sizeof *m);
    m->recompute = recompute != 0;
    ZR_CHECK(zr_gpt_config_check(cfg));
    if (cfg->arch != ZR_ARCH_GPT2) {
        ZR_FAIL(ZR_ERR_INVALID, "the GPT-2 model cannot compute a Llama-family shape (zr/llama.h)");
    }
    const zr_blas *blas = NULL; /* the products' library, opened before the first one */
    ZR_CHECK(zr_blas_load(&blas));
    if (B <= 0 || T <= 0 || T > cfg->max_t) {
        ZR_FAIL(ZR_ERR_INVALID, "GPT batch: B = %d, T = %d (need B >= 1, 1 <= T <= max_t = %d)", B,
                T, cfg->max_t);
    }
    m->cfg = *cfg;
    m->B = B;
    m->T = T;
    zr_gpt_config_unit_tensors(cfg, 0, m->unit0_desc);
    zr_gpt_config_unit_tensors(cfg, 1, m->block_desc);
    zr_gpt_config_unit_tensors(cfg, cfg->layers + 1, m->final_desc);
    m->unit0_numel = zr_gpt_config_unit_numel(cfg, 0);
    m->block_numel = zr_gpt_config_unit_numel(cfg, 1);
    m->final_numel = zr_gpt_config_unit_numel(cfg, cfg->layers + 1);

    zr_status st = ZR_OK;
    size_t BT = (size_t)B * T;
    ZR_ALLOC_GOTO(m->inputs, BT, st, fail);
    ZR_ALLOC_GOTO(m->targets, BT, st, fail);
    ZR_ALLOC_GOTO(m->layers, (size_t)cfg->layers, st, fail);
    m->arena_floats = layout_acts(m, NULL);
    ZR_ALLOC_GOTO(m->arena, m->arena_floats, st, fail);
    layout_acts(m, m->arena);
    m->acts_layer = -1;
    m->fwd_next = -1;
    m->bwd_next = -1;
    m->loss = NAN;
    return ZR_OK;
fail:
    zr_gpt_free(m);
    return st;
}

void zr_gpt_free(zr_gpt *m)
{
    if (m == NULL) {
        return;
    }
    zr_free(m->inputs);
    zr_free(m->targets);
    zr_free(m->layers);
    zr_free(m->arena);
    zr_op_products_free(m->products);
    zr_free(m->products);
    memset(m, 0, sizeof *m);
}

size_t zr_gpt_activation_bytes(const zr_gpt *m)
{
    return m->arena_floats * sizeof(float) + 2 * (size_t)m->B * (size_t)m->T * sizeof(int) +
           zr_op_products_bytes(m->products);
}

size_t zr_gpt_config_activation_bytes(const zr_gpt_config *cfg, int B, int T, int recompute)
{
    if (cfg->arch == ZR_ARCH_LLAMA) {
        return zr_llama_config_activation_bytes(&cfg->llama, B, T); /* keeps every activation */
    }
    zr_gpt m;
    memset(&m, 0, sizeof m);
    m.cfg = *cfg;
    m.B = B;
    m.T = T;
    m.recompute = recompute != 0;
    m.arena_floats = layout_acts(&m, NULL);
    return zr_gpt_activation_bytes(&m);
}

void zr_gpt_set_threads(int threads)
{
    threads = threads < 1 ? 1 : threads > ZR_POOL_MAX_THREADS ? ZR_POOL_MAX_THREADS : threads;
    /* matrix products run on the pool too, one single-threaded OpenBLAS call per thread */
    zr_blas_set_threads(1);
    /* cannot fail in range; a pool short of threads gives the same results */
    (void)zr_threads_set(threads);
}

/*
 * The bf16 products' scratch, sized for the largest of the model's products:
 * B up to the classifier's V x C or the fc projection's input BT x 4C, a
 * band of op(A) up to ZR_GEMM_BF16_ROWS x the longest summed dimension (V in
 * the classifier's input gradient, BT in the weight gradients, 4C).
 */
static void products_size(const zr_gpt_config *c, int B, int T, size_t *a_per, size_t *b)
{
    size_t C = (size_t)c->channels, V = (size_t)c->vocab, BT = (size_t)B * (size_t)T;
    size_t k = V > BT ? V : BT;
    k = k > 4 * C ? k : 4 * C;
    *a_per = ZR_GEMM_BF16_ROWS * k;
    *b = V * C > BT * 4 * C ? V * C : BT * 4 * C;
}

size_t zr_gpt_config_products_bytes(const zr_gpt_config *cfg, int B, int T, int threads)
{
    size_t a_per, b;
    products_size(cfg, B, T, &a_per, &b);
    return ((size_t)(threads < 1 ? 1 : threads) * a_per + b) * sizeof(uint16_t);
}

int zr_gpt_set_products(zr_gpt *m, int bf16, char *why, size_t n)
{
    zr_op_products_free(m->products);
    zr_free(m->products);
    m->products = NULL;
    const char *kernel = NULL;
    if (!bf16) {
        snprintf(why, n, "fp32 products (OpenBLAS %s)", zr_blas_get()->core);
        return 0;
    }
    if (!zr_blas_bf16_here(&kernel, why, n)) {
        return 0;
    }
    size_t a_per, b;
    products_size(&m->cfg, m->B, m->T, &a_per, &b);
    zr_status st = ZR_OK;
    ZR_ALLOC_GOTO(m->products, 1, st, fail);
    ZR_CHECK_GOTO(zr_op_products_reserve(m->products, zr_threads_get(), a_per, b), st, fail);
    m->products->bf16 = 1;
    char reason[128];
    snprintf(reason, sizeof reason, "%s", why);
    snprintf(why, n, "bf16 products, fp32 accumulation: %s (%s)", kernel, reason);
    return 1;
fail:
    zr_free(m->products);
    m->products = NULL;
    snprintf(why, n, "bf16 products' scratch: %s", zr_error_message());
    return -1;
}

const char *zr_gpt_kernels_name(void)
{
    return zr_ops_impl_name();
}

/* ---- units ------------------------------------------------------------------ */

int zr_gpt_unit_count(const zr_gpt *m)
{
    return m->cfg.layers + 2;
}

size_t zr_gpt_unit_numel(const zr_gpt *m, int u)
{
    ZR_ASSERT(u >= 0 && u <= m->cfg.layers + 1);
    if (u == 0) {
        return m->unit0_numel;
    }
    return u == m->cfg.layers + 1 ? m->final_numel : m->block_numel;
}

int zr_gpt_unit_tensors(const zr_gpt *m, int u, const zr_tensor_desc **out)
{
    ZR_ASSERT(u >= 0 && u <= m->cfg.layers + 1);
    if (u == 0) {
        *out = m->unit0_desc;
        return 2;
    }
    if (u == m->cfg.layers + 1) {
        *out = m->final_desc;
        return 2;
    }
    *out = m->block_desc;
    return ZR_GPT_BLOCK_TENSORS;
}

void zr_gpt_unit_init_params(const zr_gpt *m, int u, float *params, uint64_t seed)
{
    zr_gpt_config_unit_init(&m->cfg, u, params, seed);
}

/* ---- forward ---------------------------------------------------------------- */

zr_status zr_gpt_forward_begin(zr_gpt *m, const int *inputs, const int *targets)
{
    const size_t BT = (size_t)m->B * m->T;
    for (size_t i = 0; i < BT; i++) {
        if (inputs[i] < 0 || inputs[i] >= m->cfg.vocab) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "GPT forward: input token %d at position %zu is outside [0, %d)", inputs[i], i,
                    m->cfg.vocab);
        }
        if (targets != NULL && (targets[i] < 0 || targets[i] >= m->cfg.vocab)) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "GPT forward: target token %d at position %zu is outside [0, %d)", targets[i],
                    i, m->cfg.vocab);
        }
    }
    memcpy(m->inputs, inputs, BT * sizeof *inputs);
    if (targets != NULL) {
        memcpy(m->targets, targets, BT * sizeof *targets);
    }
    m->has_targets = targets != NULL;
    m->loss = NAN;
    m->fwd_next = 0;
    m->bwd_next = -1;
    return ZR_OK;
}

static const float *block_input(const zr_gpt *m, int l)
{
    return l == 0 ? m->encoded : m->layers[l - 1].res3;
}

/* Forward of block l (unit l + 1): its activations from its input and parameters. */
static void block_forward(zr_gpt *m, int l, const float *params)
{
    const int B = m->B, T = m->T, C = m->cfg.channels, NH = m->cfg.heads;
    const int BT = B * T;
    const zr_tensor_desc *d = m->block_desc;
    zr_gpt_layer_acts *a = &m->layers[l];
    const float *inp = block_input(m, l);
    zr_op_layernorm_fwd(a->ln1, a->ln1_mean, a->ln1_rstd, inp, params + d[T_LN1W].offset,
                        params + d[T_LN1B].offset, BT, C);
    zr_op_matmul_fwd(m->products, a->qkv, a->ln1, params + d[T_QKVW].offset,
                     params + d[T_QKVB].offset, BT, C, 3 * C);
    zr_op_attention_fwd(a->atty, a->att_lse, a->qkv, B, T, C, NH);
    /* the projections' biases are added in the residual and GELU passes that follow */
    zr_op_matmul_fwd(m->products, m->tmp, a->atty, params + d[T_ATTPROJW].offset, NULL, BT, C, C);
    zr_op_residual_layernorm_fwd(a->res2, a->ln2, a->ln2_mean, a->ln2_rstd, inp, m->tmp,
                                 params + d[T_ATTPROJB].offset, params + d[T_LN2W].offset,
                                 params + d[T_LN2B].offset, BT, C);
    zr_op_matmul_fwd(m->products, a->fch, a->ln2, params + d[T_FCW].offset, NULL, BT, C, 4 * C);
    zr_op_bias_gelu_fwd(a->fch_gelu, a->fch, params + d[T_FCB].offset, BT, 4 * C);
    zr_op_matmul_fwd(m->products, m->tmp, a->fch_gelu, params + d[T_FCPROJW].offset, NULL, BT,
                     4 * C, C);
    /* recomputing writes the same bits into res3 again, harmless */
    zr_op_residual_fwd(a->res3, a->res2, m->tmp, params + d[T_FCPROJB].offset, BT, C);
    m->acts_layer = l;
}

zr_status zr_gpt_forward_unit(zr_gpt *m, int u, const float *params, const float *unit0_params)
{
    const int B = m->B, T = m->T, C = m->cfg.channels, L = m->cfg.layers;
    const int BT = B * T;
    if (m->fwd_next != u) {
        ZR_FAIL(ZR_ERR_INVALID,
                "GPT forward: unit %d called, expected %d (call forward_begin, "
                "then units 0..%d in order)",
                u, m->fwd_next, L + 1);
    }
    if (params == NULL || (u == L + 1 && unit0_params == NULL)) {
        ZR_FAIL(ZR_ERR_INVALID, "GPT forward: unit %d needs its parameters%s", u,
                u == L + 1 ? " and unit 0's (tied LM head)" : "");
    }
    if (u == 0) {
        const float *wte = params + m->unit0_desc[0].offset;
        const float *wpe = params + m->unit0_desc[1].offset;
        zr_op_encoder_fwd(m->encoded, m->inputs, wte, wpe, B, T, C);
    } else if (u <= L) {
        block_forward(m, u - 1, params);
    } else {
        const int V = m->cfg.vocab, Vp = m->cfg.padded_vocab;
        const float *wte = unit0_params + m->unit0_desc[0].offset;
        zr_op_layernorm_fwd(m->lnf, m->lnf_mean, m->lnf_rstd, block_input(m, L),
                            params + m->final_desc[0].offset, params + m->final_desc[1].offset, BT,
                            C);
        /* logits for the V real tokens only; the padded rows of wte are never read */
        zr_op_gemm(m->products, 0, 1, BT, V, C, m->lnf, C, wte, C, 0.0f, m->probs, Vp);
        zr_op_softmax_xent_fwd(m->probs, m->losses, m->has_targets ? m->targets : NULL, BT, V, Vp);
        if (m->has_targets) {
            double sum = 0.0;
            for (int i = 0; i < BT; i++) {
                sum += m->losses[i];
            }
            m->loss = (float)(sum / BT);
        }
    }
    m->fwd_next = u + 1;
    return ZR_OK;
}

float zr_gpt_loss(const zr_gpt *m)
{
    return m->loss;
}

const float *zr_gpt_probs(const zr_gpt *m)
{
    return m->probs;
}

/* ---- backward --------------------------------------------------------------- */

zr_status zr_gpt_backward_begin(zr_gpt *m)
{
    if (m->fwd_next != m->cfg.layers + 2 || !m->has_targets) {
        ZR_FAIL(ZR_ERR_INVALID, "GPT backward: needs a complete forward pass with targets first");
    }
    m->bwd_next = m->cfg.layers + 1;
    m->fwd_next = -1; /* probs become dlogits: no second backward on this forward */
    return ZR_OK;
}

zr_status zr_gpt_backward_unit(zr_gpt *m, int u, const float *params, const float *unit0_params,
                               float *grads, float *unit0_grads)
{
    const int B = m->B, T = m->T, C = m->cfg.channels, NH = m->cfg.heads, L = m->cfg.layers;
    const int BT = B * T;
    if (m->bwd_next != u) {
        ZR_FAIL(ZR_ERR_INVALID,
                "GPT backward: unit %d called, expected %d (call backward_begin, "
                "then units %d..0 in order)",
                u, m->bwd_next, L + 1);
    }
    if (grads == NULL || (u > 0 && params == NULL) ||
        (u == L + 1 && (unit0_params == NULL || unit0_grads == NULL))) {
        ZR_FAIL(ZR_ERR_INVALID, "GPT backward: unit %d is missing its parameters or gradients%s", u,
                u == L + 1 ? " (the last unit also needs unit 0's)" : "");
    }
    if (u == L + 1) {
        const int V = m->cfg.vocab, Vp = m->cfg.padded_vocab;
        const float *wte = unit0_params + m->unit0_desc[0].offset;
        float *dwte = unit0_grads + m->unit0_desc[0].offset;
        zr_op_softmax_xent_bwd(m->probs, m->targets, 1.0f / (float)BT, BT, V, Vp);
        float *dlogits = m->probs;
        zr_op_gemm(m->products, 0, 0, BT, C, V, dlogits, Vp, wte, C, 0.0f, m->dln, C);
        zr_op_gemm(m->products, 1, 0, V, C, BT, dlogits, Vp, m->lnf, C, 1.0f, dwte, C);
        memset(m->dres, 0, (size_t)BT * C * sizeof *m->dres);
        zr_op_layernorm_bwd_acc(m->dres, grads + m->final_desc[0].offset,
                                grads + m->final_desc[1].offset, m->dln, block_input(m, L),
                                params + m->final_desc[0].offset, m->lnf_mean, m->lnf_rstd, BT, C);
    } else if (u >= 1) {
        const zr_tensor_desc *d = m->block_desc;
        const zr_gpt_layer_acts *a = &m->layers[u - 1];
        if (m->recompute && m->acts_layer != u - 1) {
            block_forward(m, u - 1, params);
        }
        const float *inp = block_input(m, u - 1);
        /* m->dres holds d(res3) and becomes d(inp) in place */
        zr_op_matmul_bwd(m->products, m->dbig, grads + d[T_FCPROJW].offset,
                         grads + d[T_FCPROJB].offset, m->dres, a->fch_gelu,
                         params + d[T_FCPROJW].offset, BT, 4 * C, C);
        /* the bias gradient of fc is summed in the GELU pass */
        zr_op_gelu_bwd(m->dbig, grads + d[T_FCB].offset, a->fch, m->dbig, BT, 4 * C);
        zr_op_matmul_bwd(m->products, m->dln, grads + d[T_FCW].offset, NULL, m->dbig, a->ln2,
                         params + d[T_FCW].offset, BT, C, 4 * C);
        zr_op_layernorm_bwd_acc(m->dres, grads + d[T_LN2W].offset, grads + d[T_LN2B].offset, m->dln,
                                a->res2, params + d[T_LN2W].offset, a->ln2_mean, a->ln2_rstd, BT,
                                C);
        zr_op_matmul_bwd(m->products, m->datty, grads + d[T_ATTPROJW].offset,
                         grads + d[T_ATTPROJB].offset, m->dres, a->atty,
                         params + d[T_ATTPROJW].offset, BT, C, C);
        zr_op_attention_bwd(m->dbig, m->att_delta, m->datty, a->qkv, a->atty, a->att_lse, B, T, C,
                            NH);
        zr_op_matmul_bwd(m->products, m->dln, grads + d[T_QKVW].offset, grads + d[T_QKVB].offset,
                         m->dbig, a->ln1, params + d[T_QKVW].offset, BT, C, 3 * C);
        zr_op_layernorm_bwd_acc(m->dres, grads + d[T_LN1W].offset, grads + d[T_LN1B].offset, m->dln,
                                inp, params + d[T_LN1W].offset, a->ln1_mean, a->ln1_rstd, BT, C);
    } else {
        zr_op_encoder_bwd(grads + m->unit0_desc[0].offset, grads + m->unit0_desc[1].offset, m->dres,
                          m->inputs, B, T, C);
    }
    m->bwd_next = u - 1;
    return ZR_OK;
}
