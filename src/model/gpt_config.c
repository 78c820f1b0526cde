/*
 * gpt_config.c - a decoder's shape (zr_gpt_config, zr/model.h) apart from
 * any model: its checks, its units' tensors and sizes, its FLOPs and its
 * initialisation from a seed, for GPT-2 and (arch ZR_ARCH_LLAMA) the Llama
 * family, whose tables llama.c keeps. What the engine, the checkpoints and
 * the planner size things by; no activation is allocated here.
 */
#include "zr/model.h"

#include "gpt_tensors.h"
#include "ops.h" /* ZR_ATT_MAX_HS */
#include "zr/llama.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* A Llama-family shape: its own checks, and the fields GPT-2 reads repeating it. */
static zr_status check_llama(const zr_gpt_config *cfg)
{
    const zr_llama_config *l = &cfg->llama;
    ZR_CHECK(zr_llama_config_check(l));
    if (cfg->vocab != l->vocab || cfg->padded_vocab != l->vocab || cfg->layers != l->layers ||
        cfg->heads != l->heads || cfg->channels != l->hidden) {
        ZR_FAIL(ZR_ERR_INVALID,
                "model config: vocab %d, padded_vocab %d, layers %d, heads %d, channels %d do not "
                "repeat the Llama shape's %d, %d, %d, %d, %d",
                cfg->vocab, cfg->padded_vocab, cfg->layers, cfg->heads, cfg->channels, l->vocab,
                l->vocab, l->layers, l->heads, l->hidden);
    }
    if (cfg->max_t <= 0 || cfg->max_t > (1 << 24) || l->vocab > (1 << 24) ||
        l->hidden > (1 << 24) || l->layers > (1 << 24) || l->intermediate > (1 << 24)) {
        ZR_FAIL(ZR_ERR_INVALID, "model config: a Llama size is out of range (1 .. 2^24)");
    }
    return ZR_OK;
}

zr_status zr_gpt_config_check(const zr_gpt_config *cfg)
{
    if (cfg == NULL) {
        ZR_FAIL(ZR_ERR_INVALID, "GPT config is NULL");
    }
    if (cfg->arch == ZR_ARCH_LLAMA) {
        return check_llama(cfg);
    }
    if (cfg->arch != ZR_ARCH_GPT2) {
        ZR_FAIL(ZR_ERR_INVALID, "model config: architecture %d is neither GPT-2 (0) nor Llama (1)",
                (int)cfg->arch);
    }
    const struct {
        const char *name;
        int value;
    } fields[] = {
        {"max_t", cfg->max_t},   {"vocab", cfg->vocab}, {"padded_vocab", cfg->padded_vocab},
        {"layers", cfg->layers}, {"heads", cfg->heads}, {"channels", cfg->channels}};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        if (fields[i].value <= 0 || fields[i].value > (1 << 24)) {
            ZR_FAIL(ZR_ERR_INVALID, "GPT config: %s = %d is out of range (1 .. 2^24)",
                    fields[i].name, fields[i].value);
        }
    }
    if (cfg->channels % cfg->heads != 0) {
        ZR_FAIL(ZR_ERR_INVALID, "GPT config: channels = %d is not a multiple of heads = %d",
                cfg->channels, cfg->heads);
    }
    if (cfg->channels / cfg->heads > ZR_ATT_MAX_HS) {
        ZR_FAIL(ZR_ERR_INVALID, "GPT config: head size channels / heads = %d is above %d",
                cfg->channels / cfg->heads, ZR_ATT_MAX_HS);
    }
    if (cfg->padded_vocab < cfg->vocab) {
        ZR_FAIL(ZR_ERR_INVALID, "GPT config: padded_vocab = %d is smaller than vocab = %d",
                cfg->padded_vocab, cfg->vocab);
    }
    return ZR_OK;
}

int zr_gpt_config_equal(const zr_gpt_config *a, const zr_gpt_config *b)
{
    const zr_llama_config *x = &a->llama, *y = &b->llama;
    int same = a->max_t == b->max_t && a->vocab == b->vocab && a->padded_vocab == b->padded_vocab &&
               a->layers == b->layers && a->heads == b->heads && a->channels == b->channels &&
               a->arch == b->arch;
    if (!same || a->arch != ZR_ARCH_LLAMA) {
        return same;
    }
    return x->family == y->family && x->vocab == y->vocab && x->hidden == y->hidden &&
           x->layers == y->layers && x->heads == y->heads && x->kv_heads == y->kv_heads &&
           x->head_dim == y->head_dim && x->intermediate == y->intermediate &&
           x->norm_eps == y->norm_eps && x->rope_theta == y->rope_theta &&
           x->rope_llama3 == y->rope_llama3 && x->rope_factor == y->rope_factor &&
           x->rope_low_freq_factor == y->rope_low_freq_factor &&
           x->rope_high_freq_factor == y->rope_high_freq_factor &&
           x->rope_original_max_pos == y->rope_original_max_pos && x->tied == y->tied &&
           x->qkv_bias == y->qkv_bias && x->o_bias == y->o_bias && x->mlp_bias == y->mlp_bias &&
           x->sliding_window == y->sliding_window;
}

int zr_gpt_config_unit_count(const zr_gpt_config *cfg)
{
    return cfg->layers + 2;
}

static void set_desc(zr_tensor_desc *d, const char *name, size_t *offset, int decay, int ndim,
                     int s0, int s1)
{
    d->name = name;
    d->offset = *offset;
    d->ndim = ndim;
    d->shape[0] = s0;
    d->shape[1] = ndim > 1 ? s1 : 0;
    d->shape[2] = d->shape[3] = 0;
    d->numel = (size_t)s0 * (size_t)(ndim > 1 ? s1 : 1);
    d->decay = decay;
    *offset += d->numel;
}

int zr_gpt_config_unit_tensors(const zr_gpt_config *cfg, int u, zr_tensor_desc *out)
{
    if (cfg->arch == ZR_ARCH_LLAMA) {
        return zr_llama_config_unit_tensors(&cfg->llama, u, out);
    }
    const int C = cfg->channels, L = cfg->layers;
    size_t off = 0;
    if (u == 0) {
        set_desc(&out[0], "wte", &off, 1, 2, cfg->padded_vocab, C);
        set_desc(&out[1], "wpe", &off, 1, 2, cfg->max_t, C);
        return 2;
    }
    if (u == L + 1) {
        set_desc(&out[0], "lnfw", &off, 0, 1, C, 0);
        set_desc(&out[1], "lnfb", &off, 0, 1, C, 0);
        return 2;
    }
    ZR_ASSERT(u >= 1 && u <= L);
    set_desc(&out[T_LN1W], "ln1w", &off, 0, 1, C, 0);
    set_desc(&out[T_LN1B], "ln1b", &off, 0, 1, C, 0);
    set_desc(&out[T_QKVW], "qkvw", &off, 1, 2, 3 * C, C);
    set_desc(&out[T_QKVB], "qkvb", &off, 0, 1, 3 * C, 0);
    set_desc(&out[T_ATTPROJW], "attprojw", &off, 1, 2, C, C);
    set_desc(&out[T_ATTPROJB], "attprojb", &off, 0, 1, C, 0);
    set_desc(&out[T_LN2W], "ln2w", &off, 0, 1, C, 0);
    set_desc(&out[T_LN2B], "ln2b", &off, 0, 1, C, 0);
    set_desc(&out[T_FCW], "fcw", &off, 1, 2, 4 * C, C);
    set_desc(&out[T_FCB], "fcb", &off, 0, 1, 4 * C, 0);
    set_desc(&out[T_FCPROJW], "fcprojw", &off, 1, 2, C, 4 * C);
    set_desc(&out[T_FCPROJB], "fcprojb", &off, 0, 1, C, 0);
    return ZR_GPT_BLOCK_TENSORS;
}

size_t zr_gpt_config_unit_numel(const zr_gpt_config *cfg, int u)
{
    zr_tensor_desc d[ZR_GPT_MAX_UNIT_TENSORS];
    int n = zr_gpt_config_unit_tensors(cfg, u, d);
    return d[n - 1].offset + d[n - 1].numel;
}

void zr_gpt_config_element_name(const zr_gpt_config *cfg, int u, size_t i, char *out, size_t n)
{
    zr_tensor_desc d[ZR_GPT_MAX_UNIT_TENSORS];
    int k = u >= 0 && u < zr_gpt_config_unit_count(cfg) ? zr_gpt_config_unit_tensors(cfg, u, d) : 0;
    char layer[32] = "";
    if (u >= 1 && u <= cfg->layers) {
        snprintf(layer, sizeof layer, " of layer %d", u - 1);
    }
    for (int j = 0; j < k; j++) {
        if (i >= d[j].offset && i - d[j].offset < d[j].numel) {
            snprintf(out, n, "%s%s (unit %d), element %zu", d[j].name, layer, u, i - d[j].offset);
            return;
        }
    }
    snprintf(out, n, "the padding of unit %d, element %zu", u, i);
}

size_t zr_gpt_config_param_count(const zr_gpt_config *cfg)
{
    size_t total = 0;
    for (int u = 0; u < zr_gpt_config_unit_count(cfg); u++) {
        total += zr_gpt_config_unit_numel(cfg, u);
    }
    return total;
}

double zr_gpt_flops_per_step(const zr_gpt_config *cfg, int B, int T)
{
    const double C = cfg->channels, L = cfg->layers, V = cfg->vocab, N = (double)B * T;
    /* forward multiply-adds per token: a block's matrices (GPT-2: 12 C^2; Llama: q and o
     * C x heads*head_dim, k and v C x kv_heads*head_dim, gate, up and down C x intermediate),
     * the LM head V C, causal attention QK^T and AV about T/2 keys per query, 2 x the query
     * width each */
    double block = 12.0 * C * C, width = C;
    if (cfg->arch == ZR_ARCH_LLAMA) {
        const zr_llama_config *l = &cfg->llama;
        double q = (double)l->heads * l->head_dim, kv = (double)l->kv_heads * l->head_dim;
        block = 2.0 * C * q + 2.0 * C * kv + 3.0 * C * l->intermediate;
        width = q;
    }
    double fwd = 2.0 * N * (L * block + V * C) + 2.0 * L * N * (T / 2.0) * 2.0 * width;
    return 3.0 * fwd; /* backward costs two forwards */
}

/* ---- initialisation from a seed ------------------------------------------------ */

/* splitmix64: tiny, well mixed, and the same on every platform */
static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Fills x with N(0, std) by Box-Muller in double precision. */
static void fill_normal(float *x, size_t n, double std, uint64_t *s)
{
    for (size_t i = 0; i < n; i += 2) {
        double u1 = ((double)(splitmix64(s) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
        double u2 = (double)(splitmix64(s) >> 11) * (1.0 / 9007199254740992.0);
        double r = sqrt(-2.0 * log(u1)) * std;
        x[i] = (float)(r * cos(6.283185307179586 * u2));
        if (i + 1 < n) {
            x[i + 1] = (float)(r * sin(6.283185307179586 * u2));
        }
    }
}

/*
 * A Llama-family unit as transformers initialises one (initializer_range
 * 0.02): matrices and the embedding N(0, 0.02), RMSNorm weights 1, biases 0.
 */
static void llama_unit_init(const zr_gpt_config *cfg, int u, float *params, uint64_t seed)
{
    zr_tensor_desc d[ZR_GPT_MAX_UNIT_TENSORS];
    int n = zr_gpt_config_unit_tensors(cfg, u, d);
    for (int i = 0; i < n; i++) {
        uint64_t s = seed ^ 0x5a5a5a5a5a5a5a5aull;
        s = splitmix64(&s) ^ ((uint64_t)u * 0x100000001b3ull + (uint64_t)i);
        float *p = params + d[i].offset;
        size_t len = strlen(d[i].name);
        if (d[i].ndim == 2) {
            fill_normal(p, d[i].numel, 0.02, &s);
        } else {
            float v = len > 4 && strcmp(d[i].name + len - 4, "bias") == 0 ? 0.0f : 1.0f;
            for (size_t j = 0; j < d[i].numel; j++) {
                p[j] = v;
            }
        }
    }
}

void zr_gpt_config_unit_init(const zr_gpt_config *cfg, int u, float *params, uint64_t seed)
{
    if (cfg->arch == ZR_ARCH_LLAMA) {
        llama_unit_init(cfg, u, params, seed);
        return;
    }
    zr_tensor_desc d[ZR_GPT_MAX_UNIT_TENSORS];
    int n = zr_gpt_config_unit_tensors(cfg, u, d);
    const double std = 0.02, proj_std = 0.02 / sqrt(2.0 * cfg->layers);
    for (int i = 0; i < n; i++) {
        /* one stream per (seed, unit, tensor): independent of any other unit */
        uint64_t s = seed ^ 0x5a5a5a5a5a5a5a5aull;
        s = splitmix64(&s) ^ ((uint64_t)u * 0x100000001b3ull + (uint64_t)i);
        float *p = params + d[i].offset;
        const char *name = d[i].name;
        if (d[i].ndim == 2) {
            int proj = strcmp(name, "attprojw") == 0 || strcmp(name, "fcprojw") == 0;
            size_t numel = d[i].numel;
            if (u == 0 && i == 0) {
                numel = (size_t)cfg->vocab * cfg->channels; /* padded rows stay 0 */
                memset(p + numel, 0, (d[i].numel - numel) * sizeof *p);
            }
            fill_normal(p, numel, proj ? proj_std : std, &s);
        } else {
            /* LayerNorm weights are the only 1-d tensors named "...w" */
            float v = name[strlen(name) - 1] == 'w' ? 1.0f : 0.0f;
            for (size_t j = 0; j < d[i].numel; j++) {
                p[j] = v;
            }
        }
    }
}
