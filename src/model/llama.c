/*
 * llama.c - the Llama family on the CPU (zr/llama.h): the units' tensor
 * tables, the activations, forward and backward per unit, composed from the
 * operators of ops.h (RMSNorm, rope, GQA attention, SwiGLU, fp32 products),
 * each on the pool; the embedding's row copies and its gradient's sums (in
 * token order) are the only loops of the main thread alone.
 */
#include "zr/llama.h"

#include "ops.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Tensor indices in a layer unit's full table (absent biases are skipped in m->desc). */
enum {
    L_LN1,
    L_QW,
    L_QB,
    L_KW,
    L_KB,
    L_VW,
    L_VB,
    L_OW,
    L_OB,
    L_LN2,
    L_GW,
    L_GB,
    L_UW,
    L_UB,
    L_DW,
    L_DB,
    L_COUNT
};

static const char *const layer_names[L_COUNT] = {
    "input_layernorm.weight", "self_attn.q_proj.weight",
    "self_attn.q_proj.bias",  "self_attn.k_proj.weight",
    "self_attn.k_proj.bias",  "self_attn.v_proj.weight",
    "self_attn.v_proj.bias",  "self_attn.o_proj.weight",
    "self_attn.o_proj.bias",  "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",   "mlp.gate_proj.bias",
    "mlp.up_proj.weight",     "mlp.up_proj.bias",
    "mlp.down_proj.weight",   "mlp.down_proj.bias"};

#define NAME_MAX_LEN 80

zr_status zr_llama_config_check(const zr_llama_config *c)
{
    const struct {
        const char *name;
        int v;
    } pos[] = {{"vocab_size", c->vocab},
               {"hidden_size", c->hidden},
               {"num_hidden_layers", c->layers},
               {"num_attention_heads", c->heads},
               {"num_key_value_heads", c->kv_heads},
               {"head_dim", c->head_dim},
               {"intermediate_size", c->intermediate}};
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++) {
        if (pos[i].v <= 0) {
            ZR_FAIL(ZR_ERR_INVALID, "Llama config: %s = %d, must be positive", pos[i].name,
                    pos[i].v);
        }
    }
    if (c->heads % c->kv_heads != 0) {
        ZR_FAIL(ZR_ERR_INVALID,
                "Llama config: num_key_value_heads %d does not divide num_attention_heads %d",
                c->kv_heads, c->heads);
    }
    if (c->head_dim % 2 != 0 || c->head_dim > ZR_ATT_MAX_HS) {
        ZR_FAIL(ZR_ERR_INVALID, "Llama config: head_dim %d is odd or above %d", c->head_dim,
                ZR_ATT_MAX_HS);
    }
    if (!(c->norm_eps > 0) || !(c->rope_theta > 0)) {
        ZR_FAIL(ZR_ERR_INVALID, "Llama config: rms_norm_eps and rope_theta must be positive");
    }
    return ZR_OK;
}

static void set_desc(zr_tensor_desc *d, const char *name, size_t *offset, int ndim, int s0, int s1)
{
    d->name = name;
    d->offset = *offset;
    d->ndim = ndim;
    d->shape[0] = s0;
    d->shape[1] = ndim > 1 ? s1 : 0;
    d->shape[2] = d->shape[3] = 0;
    d->numel = (size_t)s0 * (ndim > 1 ? (size_t)s1 : 1);
    d->decay = ndim >= 2;
    *offset += d->numel;
}

/* Whether tensor i of the full layer table exists in this configuration. */
static int layer_has(const zr_llama_config *c, int i)
{
    switch (i) {
    case L_QB:
    case L_KB:
    case L_VB:
        return c->qkv_bias;
    case L_OB:
        return c->o_bias;
    case L_GB:
    case L_UB:
    case L_DB:
        return c->mlp_bias;
    default:
        return 1;
    }
}

int zr_llama_config_unit_tensors(const zr_llama_config *c, int u, zr_tensor_desc *out)
{
    const int C = c->hidden, Q = c->heads * c->head_dim, K = c->kv_heads * c->head_dim;
    const int IC = c->intermediate, L = c->layers;
    const int shape[L_COUNT][2] = {{C, 0},  {Q, C},  {Q, 0},  {K, C}, {K, 0},  {K, C},
                                   {K, 0},  {C, Q},  {C, 0},  {C, 0}, {IC, C}, {IC, 0},
                                   {IC, C}, {IC, 0}, {C, IC}, {C, 0}};
    size_t off = 0;
    int n = 0;
    if (u == 0) {
        set_desc(&out[n++], "model.embed_tokens.weight", &off, 2, c->vocab, C);
    } else if (u <= L) {
        for (int i = 0; i < L_COUNT; i++) {
            if (layer_has(c, i)) {
                set_desc(&out[n++], layer_names[i], &off, shape[i][1] > 0 ? 2 : 1, shape[i][0],
                         shape[i][1]);
            }
        }
    } else {
        set_desc(&out[n++], "model.norm.weight", &off, 1, C, 0);
        if (!c->tied) {
            set_desc(&out[n++], "lm_head.weight", &off, 2, c->vocab, C);
        }
    }
    return n;
}

size_t zr_llama_config_unit_numel(const zr_llama_config *c, int u)
{
    zr_tensor_desc d[ZR_LLAMA_MAX_UNIT_TENSORS];
    int n = zr_llama_config_unit_tensors(c, u, d);
    return d[n - 1].offset + d[n - 1].numel;
}

void zr_llama_config_hf_name(const zr_llama_config *c, int u, const zr_tensor_desc *d, char *out,
                             size_t n)
{
    if (u >= 1 && u <= c->layers) {
        snprintf(out, n, "model.layers.%d.%s", u - 1, d->name);
    } else {
        snprintf(out, n, "%s", d->name);
    }
}

/* The tables of every unit, with the Hugging Face names written into m->names. */
static void layout_tables(zr_llama *m)
{
    for (int u = 0; u < m->units; u++) {
        zr_tensor_desc *d = m->desc + (size_t)u * ZR_LLAMA_MAX_UNIT_TENSORS;
        char *names = m->names + (size_t)u * ZR_LLAMA_MAX_UNIT_TENSORS * NAME_MAX_LEN;
        int n = zr_llama_config_unit_tensors(&m->cfg, u, d);
        for (int k = 0; k < n; k++) {
            char *name = names + (size_t)k * NAME_MAX_LEN;
            zr_llama_config_hf_name(&m->cfg, u, &d[k], name, NAME_MAX_LEN);
            d[k].name = name;
        }
        m->ndesc[u] = n;
        m->numel[u] = d[n - 1].offset + d[n - 1].numel;
    }
}

/* *p = base + *at (base NULL: only counted), then *at moves past n floats, 64-byte aligned. */
static void carve(float **p, size_t n, float *base, size_t *at)
{
    if (base != NULL) {
        *p = base + *at;
    }
    *at += (n + 15) / 16 * 16;
}

/* The activation buffers carved from base (NULL: only counted); returns the floats. */
static size_t layout_acts(zr_llama *m, float *base)
{
    const zr_llama_config *c = &m->cfg;
    const size_t N = (size_t)m->B * m->T, C = (size_t)c->hidden, V = (size_t)c->vocab;
    const size_t Q = (size_t)c->heads * c->head_dim, K = (size_t)c->kv_heads * c->head_dim;
    const size_t IC = (size_t)c->intermediate, lse = N * (size_t)c->heads;
    const size_t half = (size_t)m->T * (size_t)c->head_dim / 2;
    size_t at = 0;
    carve(&m->cosines, half, base, &at);
    carve(&m->sines, half, base, &at);
    carve(&m->encoded, N * C, base, &at);
    carve(&m->zeros, C, base, &at);
    for (int l = 0; l < c->layers; l++) {
        zr_llama_layer_acts dummy, *a = base != NULL ? &m->layers[l] : &dummy;
        float **per[] = {&a->ln1, &a->res2, &a->ln2, &a->res3, &a->rstd1, &a->rstd2, &a->q,
                         &a->att, &a->k,    &a->v,   &a->lse,  &a->gate,  &a->up,    &a->act};
        const size_t n[] = {N * C, N * C, N * C, N * C, N,      N,      N * Q,
                            N * Q, N * K, N * K, lse,   N * IC, N * IC, N * IC};
        for (size_t i = 0; i < sizeof n / sizeof n[0]; i++) {
            carve(per[i], n[i], base, &at);
        }
    }
    float **top[] = {&m->lnf,    &m->dres,  &m->dln, &m->tmp,  &m->rstdf,
                     &m->losses, &m->probs, &m->dq,  &m->datt, &m->dk,
                     &m->dv,     &m->dgate, &m->dup, &m->dact, &m->att_delta};
    const size_t n[] = {N * C, N * C, N * C, N * C,  N,      N,      N * V, N * Q,
                        N * Q, N * K, N * K, N * IC, N * IC, N * IC, lse};
    for (size_t i = 0; i < sizeof n / sizeof n[0]; i++) {
        carve(top[i], n[i], base, &at);
    }
    return at;
}

zr_status zr_llama_init(zr_llama *m, const zr_llama_config *cfg, int B, int T)
{
    zr_status st = ZR_OK;
    memset(m, 0, sizeof *m);
    ZR_CHECK(zr_llama_config_check(cfg));
    if (B <= 0 || T <= 0) {
        ZR_FAIL(ZR_ERR_INVALID, "Llama model: B %d and T %d must be positive", B, T);
    }
    if (cfg->sliding_window > 0 && cfg->sliding_window < T) {
        ZR_FAIL(ZR_ERR_INVALID,
                "Llama model: sliding_window %d is shorter than the sequence length %d (zr's "
                "attention sees every earlier token)",
                cfg->sliding_window, T);
    }
    m->cfg = *cfg;
    m->B = B;
    m->T = T;
    m->units = cfg->layers + 2;
    const size_t tabs = (size_t)m->units * ZR_LLAMA_MAX_UNIT_TENSORS;
    ZR_ALLOC_GOTO(m->desc, tabs, st, fail);
    ZR_ALLOC_GOTO(m->names, tabs * NAME_MAX_LEN, st, fail);
    ZR_ALLOC_GOTO(m->ndesc, (size_t)m->units, st, fail);
    ZR_ALLOC_GOTO(m->numel, (size_t)m->units, st, fail);
    layout_tables(m);
    ZR_ALLOC_GOTO(m->inputs, (size_t)B * T, st, fail);
    ZR_ALLOC_GOTO(m->targets, (size_t)B * T, st, fail);
    ZR_ALLOC_GOTO(m->layers, (size_t)cfg->layers, st, fail);
    m->arena_floats = layout_acts(m, NULL);
    ZR_ALLOC_GOTO(m->arena, m->arena_floats, st, fail);
    layout_acts(m, m->arena);
    float inv[ZR_ATT_MAX_HS / 2];
    zr_op_rope_scaling sc = {cfg->rope_llama3, cfg->rope_factor, cfg->rope_low_freq_factor,
                             cfg->rope_high_freq_factor, cfg->rope_original_max_pos};
    zr_op_rope_inv_freq(inv, cfg->head_dim, cfg->rope_theta, &sc);
    zr_op_rope_table(m->cosines, m->sines, inv, T, cfg->head_dim);
    m->loss = NAN;
    m->fwd_next = -1;
    m->bwd_next = -1;
    return ZR_OK;
fail:
    zr_llama_free(m);
    return st;
}

void zr_llama_free(zr_llama *m)
{
    zr_free(m->desc), zr_free(m->names), zr_free(m->ndesc), zr_free(m->numel);
    zr_free(m->inputs), zr_free(m->targets), zr_free(m->layers), zr_free(m->arena);
    memset(m, 0, sizeof *m);
}

size_t zr_llama_activation_bytes(const zr_llama *m)
{
    return m->arena_floats * sizeof(float) + 2 * (size_t)m->B * m->T * sizeof(int);
}

size_t zr_llama_config_activation_bytes(const zr_llama_config *cfg, int B, int T)
{
    zr_llama m = {.cfg = *cfg, .B = B, .T = T};
    return layout_acts(&m, NULL) * sizeof(float) + 2 * (size_t)B * T * sizeof(int);
}

int zr_llama_unit_count(const zr_llama *m)
{
    return m->units;
}

size_t zr_llama_unit_numel(const zr_llama *m, int u)
{
    return u >= 0 && u < m->units ? m->numel[u] : 0;
}

int zr_llama_unit_tensors(const zr_llama *m, int u, const zr_tensor_desc **out)
{
    *out = u >= 0 && u < m->units ? m->desc + (size_t)u * ZR_LLAMA_MAX_UNIT_TENSORS : NULL;
    return u >= 0 && u < m->units ? m->ndesc[u] : 0;
}

/* ---- forward ------------------------------------------------------------------------ */

zr_status zr_llama_forward_begin(zr_llama *m, const int *inputs, const int *targets)
{
    const size_t N = (size_t)m->B * m->T;
    for (size_t i = 0; i < N; i++) {
        if (inputs[i] < 0 || inputs[i] >= m->cfg.vocab ||
            (targets != NULL && (targets[i] < 0 || targets[i] >= m->cfg.vocab))) {
            ZR_FAIL(ZR_ERR_INVALID, "Llama forward: %s token %d at position %zu is outside [0, %d)",
                    inputs[i] < 0 || inputs[i] >= m->cfg.vocab ? "input" : "target",
                    inputs[i] < 0 || inputs[i] >= m->cfg.vocab ? inputs[i] : targets[i], i,
                    m->cfg.vocab);
        }
    }
    memcpy(m->inputs, inputs, N * sizeof *inputs);
    if (targets != NULL) {
        memcpy(m->targets, targets, N * sizeof *targets);
    }
    m->has_targets = targets != NULL;
    m->loss = NAN;
    m->fwd_next = 0;
    m->bwd_next = -1;
    return ZR_OK;
}

/* Where layer tensor i lies in unit u's buffer (SIZE_MAX when the configuration lacks it). */
static size_t loff(const zr_llama *m, int u, int i)
{
    if (!layer_has(&m->cfg, i)) {
        return SIZE_MAX;
    }
    int k = 0;
    for (int j = 0; j < i; j++) {
        k += layer_has(&m->cfg, j);
    }
    return m->desc[(size_t)u * ZR_LLAMA_MAX_UNIT_TENSORS + k].offset;
}

/* Layer tensor i in a parameter buffer (NULL when absent). */
static const float *lp(const zr_llama *m, int u, const float *p, int i)
{
    size_t o = loff(m, u, i);
    return o != SIZE_MAX ? p + o : NULL;
}

/* The same in a gradient buffer. */
static float *lg(const zr_llama *m, int u, float *g, int i)
{
    size_t o = loff(m, u, i);
    return o != SIZE_MAX ? g + o : NULL;
}

static const float *layer_input(const zr_llama *m, int l)
{
    return l == 0 ? m->encoded : m->layers[l - 1].res3;
}

/* x = a + b by rows on the pool (x may alias a). */
static void add_rows(const zr_llama *m, float *x, const float *a, const float *b)
{
    zr_op_residual_fwd(x, a, b, m->zeros, m->B * m->T, m->cfg.hidden);
}

static void layer_forward(zr_llama *m, int l, const float *p)
{
    const zr_llama_config *c = &m->cfg;
    const int B = m->B, T = m->T, N = B * T, C = c->hidden, NH = c->heads, NKV = c->kv_heads;
    const int hd = c->head_dim, Q = NH * hd, K = NKV * hd, IC = c->intermediate, u = l + 1;
    zr_llama_layer_acts *a = &m->layers[l];
    const float *x = layer_input(m, l);
    zr_op_rmsnorm_fwd(a->ln1, a->rstd1, x, lp(m, u, p, L_LN1), (float)c->norm_eps, N, C);
    zr_op_matmul_fwd(NULL, a->q, a->ln1, lp(m, u, p, L_QW), lp(m, u, p, L_QB), N, C, Q);
    zr_op_matmul_fwd(NULL, a->k, a->ln1, lp(m, u, p, L_KW), lp(m, u, p, L_KB), N, C, K);
    zr_op_matmul_fwd(NULL, a->v, a->ln1, lp(m, u, p, L_VW), lp(m, u, p, L_VB), N, C, K);
    zr_op_rope_fwd(a->q, a->q, m->cosines, m->sines, B, T, NH, hd);
    zr_op_rope_fwd(a->k, a->k, m->cosines, m->sines, B, T, NKV, hd);
    zr_op_attention_gqa_fwd(a->att, a->lse, a->q, a->k, a->v, B, T, NH, NKV, hd);
    zr_op_matmul_fwd(NULL, m->tmp, a->att, lp(m, u, p, L_OW), lp(m, u, p, L_OB), N, Q, C);
    add_rows(m, a->res2, x, m->tmp);
    zr_op_rmsnorm_fwd(a->ln2, a->rstd2, a->res2, lp(m, u, p, L_LN2), (float)c->norm_eps, N, C);
    zr_op_matmul_fwd(NULL, a->gate, a->ln2, lp(m, u, p, L_GW), lp(m, u, p, L_GB), N, C, IC);
    zr_op_matmul_fwd(NULL, a->up, a->ln2, lp(m, u, p, L_UW), lp(m, u, p, L_UB), N, C, IC);
    zr_op_swiglu_fwd(a->act, a->gate, a->up, N, IC, IC);
    zr_op_matmul_fwd(NULL, m->tmp, a->act, lp(m, u, p, L_DW), lp(m, u, p, L_DB), N, IC, C);
    add_rows(m, a->res3, a->res2, m->tmp);
}

/* The final norm, the head's logits and (with targets) the loss. */
static void head_forward(zr_llama *m, const float *p, const float *unit0)
{
    const int N = m->B * m->T, C = m->cfg.hidden, V = m->cfg.vocab;
    const zr_tensor_desc *d = m->desc + (size_t)(m->units - 1) * ZR_LLAMA_MAX_UNIT_TENSORS;
    const float *head = m->cfg.tied ? unit0 : p + d[1].offset;
    zr_op_rmsnorm_fwd(m->lnf, m->rstdf, layer_input(m, m->cfg.layers), p + d[0].offset,
                      (float)m->cfg.norm_eps, N, C);
    zr_op_matmul_fwd(NULL, m->probs, m->lnf, head, NULL, N, C, V);
    if (m->has_targets) {
        zr_op_softmax_xent_fwd(m->probs, m->losses, m->targets, N, V, V);
        double sum = 0.0;
        for (int i = 0; i < N; i++) {
            sum += m->losses[i];
        }
        m->loss = (float)(sum / N);
    }
}

zr_status zr_llama_forward_unit(zr_llama *m, int u, const float *params, const float *unit0_params)
{
    const int L = m->cfg.layers, C = m->cfg.hidden;
    if (m->fwd_next != u) {
        ZR_FAIL(ZR_ERR_INVALID,
                "Llama forward: unit %d called, expected %d (call forward_begin, then units "
                "0..%d in order)",
                u, m->fwd_next, L + 1);
    }
    if (params == NULL || (u == L + 1 && m->cfg.tied && unit0_params == NULL)) {
        ZR_FAIL(ZR_ERR_INVALID, "Llama forward: unit %d needs its parameters%s", u,
                u == L + 1 && m->cfg.tied ? " and unit 0's (tied LM head)" : "");
    }
    if (u == 0) {
        for (int i = 0; i < m->B * m->T; i++) {
            memcpy(m->encoded + (size_t)i * C, params + (size_t)m->inputs[i] * C,
                   (size_t)C * sizeof *params);
        }
    } else if (u <= L) {
        layer_forward(m, u - 1, params);
    } else {
        head_forward(m, params, unit0_params);
    }
    m->fwd_next = u + 1;
    return ZR_OK;
}

float zr_llama_loss(const zr_llama *m)
{
    return m->loss;
}

const float *zr_llama_logits(const zr_llama *m)
{
    return m->fwd_next == m->units && !m->has_targets ? m->probs : NULL;
}

/* ---- backward ----------------------------------------------------------------------- */

zr_status zr_llama_backward_begin(zr_llama *m)
{
    if (m->fwd_next != m->units || !m->has_targets) {
        ZR_FAIL(ZR_ERR_INVALID, "Llama backward: needs a complete forward pass with targets first");
    }
    m->bwd_next = m->units - 1;
    m->fwd_next = -1; /* probs become dlogits: no second backward on this forward */
    return ZR_OK;
}

/* The MLP's half of layer l's backward: m->dres holds d(res3) and gains the norm's input part. */
static void mlp_backward(zr_llama *m, int l, const float *p, float *g)
{
    const zr_llama_config *c = &m->cfg;
    const int N = m->B * m->T, C = c->hidden, IC = c->intermediate, u = l + 1;
    const zr_llama_layer_acts *a = &m->layers[l];
    zr_op_matmul_bwd(NULL, m->dact, lg(m, u, g, L_DW), lg(m, u, g, L_DB), m->dres, a->act,
                     lp(m, u, p, L_DW), N, IC, C);
    zr_op_swiglu_bwd(m->dgate, m->dup, m->dact, a->gate, a->up, N, IC, IC);
    zr_op_matmul_bwd(NULL, m->dln, lg(m, u, g, L_GW), lg(m, u, g, L_GB), m->dgate, a->ln2,
                     lp(m, u, p, L_GW), N, C, IC);
    zr_op_matmul_bwd(NULL, m->tmp, lg(m, u, g, L_UW), lg(m, u, g, L_UB), m->dup, a->ln2,
                     lp(m, u, p, L_UW), N, C, IC);
    add_rows(m, m->dln, m->dln, m->tmp);
    zr_op_rmsnorm_bwd_acc(m->dres, lg(m, u, g, L_LN2), m->dln, a->res2, lp(m, u, p, L_LN2),
                          a->rstd2, N, C);
}

/* The attention's half: m->dres holds d(res2) and becomes d(input). */
static void attention_backward(zr_llama *m, int l, const float *p, float *g)
{
    const zr_llama_config *c = &m->cfg;
    const int B = m->B, T = m->T, N = B * T, C = c->hidden, NH = c->heads, NKV = c->kv_heads;
    const int hd = c->head_dim, Q = NH * hd, K = NKV * hd, u = l + 1;
    const zr_llama_layer_acts *a = &m->layers[l];
    zr_op_matmul_bwd(NULL, m->datt, lg(m, u, g, L_OW), lg(m, u, g, L_OB), m->dres, a->att,
                     lp(m, u, p, L_OW), N, Q, C);
    zr_op_attention_gqa_bwd(m->dq, m->dk, m->dv, m->att_delta, m->datt, a->q, a->k, a->v, a->att,
                            a->lse, B, T, NH, NKV, hd);
    zr_op_rope_bwd(m->dq, m->dq, m->cosines, m->sines, B, T, NH, hd);
    zr_op_rope_bwd(m->dk, m->dk, m->cosines, m->sines, B, T, NKV, hd);
    zr_op_matmul_bwd(NULL, m->dln, lg(m, u, g, L_QW), lg(m, u, g, L_QB), m->dq, a->ln1,
                     lp(m, u, p, L_QW), N, C, Q);
    zr_op_matmul_bwd(NULL, m->tmp, lg(m, u, g, L_KW), lg(m, u, g, L_KB), m->dk, a->ln1,
                     lp(m, u, p, L_KW), N, C, K);
    add_rows(m, m->dln, m->dln, m->tmp);
    zr_op_matmul_bwd(NULL, m->tmp, lg(m, u, g, L_VW), lg(m, u, g, L_VB), m->dv, a->ln1,
                     lp(m, u, p, L_VW), N, C, K);
    add_rows(m, m->dln, m->dln, m->tmp);
    zr_op_rmsnorm_bwd_acc(m->dres, lg(m, u, g, L_LN1), m->dln, layer_input(m, l),
                          lp(m, u, p, L_LN1), a->rstd1, N, C);
}

/* The loss, the head and the final norm: m->dres becomes d(last layer's output). */
static void head_backward(zr_llama *m, const float *p, const float *unit0, float *g, float *g0)
{
    const int N = m->B * m->T, C = m->cfg.hidden, V = m->cfg.vocab;
    const zr_tensor_desc *d = m->desc + (size_t)(m->units - 1) * ZR_LLAMA_MAX_UNIT_TENSORS;
    const float *head = m->cfg.tied ? unit0 : p + d[1].offset;
    float *dhead = m->cfg.tied ? g0 : g + d[1].offset;
    zr_op_softmax_xent_bwd(m->probs, m->targets, 1.0f / (float)N, N, V, V);
    zr_op_matmul_bwd(NULL, m->dln, dhead, NULL, m->probs, m->lnf, head, N, C, V);
    memset(m->dres, 0, (size_t)N * C * sizeof *m->dres);
    zr_op_rmsnorm_bwd_acc(m->dres, g + d[0].offset, m->dln, layer_input(m, m->cfg.layers),
                          p + d[0].offset, m->rstdf, N, C);
}

zr_status zr_llama_backward_unit(zr_llama *m, int u, const float *params, const float *unit0_params,
                                 float *grads, float *unit0_grads)
{
    const int L = m->cfg.layers, C = m->cfg.hidden;
    if (m->bwd_next != u) {
        ZR_FAIL(ZR_ERR_INVALID,
                "Llama backward: unit %d called, expected %d (call backward_begin, then units "
                "%d..0 in order)",
                u, m->bwd_next, L + 1);
    }
    int tied_head = u == L + 1 && m->cfg.tied;
    if (grads == NULL || (u > 0 && params == NULL) ||
        (tied_head && (unit0_params == NULL || unit0_grads == NULL))) {
        ZR_FAIL(ZR_ERR_INVALID, "Llama backward: unit %d is missing its parameters or gradients%s",
                u, tied_head ? " (the tied head also needs unit 0's)" : "");
    }
    if (u == L + 1) {
        head_backward(m, params, unit0_params, grads, unit0_grads);
    } else if (u >= 1) {
        mlp_backward(m, u - 1, params, grads);
        attention_backward(m, u - 1, params, grads);
    } else {
        /* the embedding's rows in token order: one sum order whatever the threads */
        for (int i = 0; i < m->B * m->T; i++) {
            float *row = grads + (size_t)m->inputs[i] * C;
            const float *d = m->dres + (size_t)i * C;
            for (int j = 0; j < C; j++) {
                row[j] += d[j];
            }
        }
    }
    m->bwd_next = u - 1;
    return ZR_OK;
}
