/*
 * roofline.c - the roofline ledger of a GPT training step (zr/roofline.h):
 * per operation, the FLOPs and the fewest bytes from the shapes, and the
 * launches the device model makes for it.
 */
#include "zr/roofline.h"

#include <string.h>

/*
 * Kernel launches and GEMM calls per occurrence of each row, as gpt_cuda.c,
 * ops_cuda.c and zr bench model's optimizer make them today. THE ONE PLACE to
 * update when a kernel is fused, split, added or removed: tests/test_roofline.c
 * counts the launches of a step in the GPU emulator and compares them with
 * these sums. Today (bf16, the cuBLASLt epilogues on: ZR_GEMM_EPILOGUE=0
 * adds bias_add, bias_gelu and gelu_bwd back to each block), per block 21
 * kernels and 12 GEMM calls; once per step 10 kernels and 3 GEMM calls; 3
 * kernels per parameter unit in the optimizer: 16 + 24 L kernels and
 * 3 + 12 L GEMM calls a step (GPT-2 124M: 304 + 147, and cuBLAS's split-K
 * reductions on a GPU on top).
 */
static const struct {
    const char *name;
    int kernels, gemms;
} launch_table[] = {
    {"fwd.encoder", 1, 0},         /* encoder_fwd */
    {"fwd.ln1", 1, 0},             /* layernorm_fwd */
    {"fwd.qkv", 0, 1},             /* GEMM, bias in its epilogue (cuBLASLt) */
    {"fwd.attention", 1, 0},       /* flash_fwd (bf16), att_fwd */
    {"fwd.attproj", 0, 1},         /* GEMM */
    {"fwd.residual1", 1, 0},       /* residual + bias + LayerNorm 2, one kernel */
    {"fwd.ln2", 0, 0},             /* in fwd.residual1's kernel */
    {"fwd.fc", 0, 1},              /* GEMM, bias + GELU in its epilogue */
    {"fwd.gelu", 0, 0},            /* in fwd.fc's epilogue */
    {"fwd.fcproj", 0, 1},          /* GEMM */
    {"fwd.residual2", 1, 0},       /* residual + bias */
    {"fwd.lnf", 1, 0},             /* layernorm_fwd */
    {"fwd.classifier", 0, 1},      /* GEMM over Vp */
    {"fwd.xent", 2, 0},            /* xent_fwd, mean */
    {"bwd.xent", 1, 0},            /* xent_bwd, in place */
    {"bwd.classifier_dinp", 0, 1}, /* GEMM */
    {"bwd.classifier_dw", 0, 1},   /* GEMM */
    {"bwd.lnf", 3, 0},             /* layernorm_bwd_rows, colsum_part, colsum_final */
    {"bwd.fcproj_dinp", 0, 1},     /* GEMM, GELU's backward in its epilogue */
    {"bwd.fcproj_dw", 2, 1},       /* GEMM; bias: colsum_part, colsum_final */
    {"bwd.gelu", 0, 0},            /* in bwd.fcproj_dinp's epilogue */
    {"bwd.fc_dinp", 0, 1},         /* GEMM */
    {"bwd.fc_dw", 2, 1},           /* GEMM; bias: colsum_part, colsum_final */
    {"bwd.ln2", 3, 0},             /* layernorm_bwd_rows, colsum_part, colsum_final */
    {"bwd.attproj_dinp", 0, 1},    /* GEMM */
    {"bwd.attproj_dw", 2, 1},      /* GEMM; bias: colsum_part, colsum_final */
    {"bwd.attention", 3, 0},       /* fa_delta, flash_bwd_dkv, flash_bwd_dq (bf16; att_* fp32) */
    {"bwd.qkv_dinp", 0, 1},        /* GEMM */
    {"bwd.qkv_dw", 2, 1},          /* GEMM; bias: colsum_part, colsum_final */
    {"bwd.ln1", 3, 0},             /* layernorm_bwd_rows, colsum_part, colsum_final */
    {"bwd.encoder", 2, 0},         /* encoder_bwd_wte, encoder_bwd_wpe */
    {"optim.adamw", 3, 0},         /* per unit: to fp32, adamw_kernel, to bf16 */
};

/* The rows being filled, and the step's shapes as doubles. */
typedef struct ledger {
    zr_roofline_row *rows;
    int n;
    zr_roofline_phase phase;
    int count;
    double N, T, C, NH, V, e; /* N = B T tokens, e the element size */
} ledger;

static void add(ledger *g, const char *name, double flops, double bytes)
{
    zr_roofline_row *r = &g->rows[g->n++];
    ZR_ASSERT(g->n <= ZR_ROOFLINE_MAX_ROWS);
    memset(r, 0, sizeof *r);
    r->name = name;
    r->phase = g->phase;
    r->count = g->count;
    r->flops = flops;
    r->bytes = bytes;
    for (size_t i = 0; i < sizeof launch_table / sizeof launch_table[0]; i++) {
        if (strcmp(launch_table[i].name, name) == 0) {
            r->kernels = launch_table[i].kernels;
            r->gemms = launch_table[i].gemms;
            return;
        }
    }
    ZR_ASSERT(!"every ledger row has a line in launch_table");
}

/* A LayerNorm forward: x and (w, b) in, y, mean, rstd out. */
static void ln_fwd(ledger *g, const char *name)
{
    add(g, name, 0, g->e * (2 * g->N * g->C + 2 * g->C) + 4 * 2 * g->N);
}

/* A LayerNorm backward: dy, x, w, mean, rstd in; dx written (accumulate: read too); dw, db
 * accumulated. */
static void ln_bwd(ledger *g, const char *name, int accumulate)
{
    double NC = g->N * g->C;
    add(g, name, 0, g->e * ((3 + accumulate) * NC + g->C + 4 * g->C) + 4 * 2 * g->N);
}

/* out[N, O] = in[N, K] w[O, K]^T (+ bias[O]). */
static void gemm_fwd(ledger *g, const char *name, double K, double O, int bias)
{
    add(g, name, 2 * g->N * K * O, g->e * (g->N * K + O * K + (bias ? O : 0) + g->N * O));
}

/* din[N, K] = dout[N, O] w[O, K]. */
static void gemm_dinp(ledger *g, const char *name, double K, double O)
{
    add(g, name, 2 * g->N * K * O, g->e * (g->N * O + O * K + g->N * K));
}

/* dw[O, K] += dout[N, O]^T in[N, K] (and db[O] += its column sums). */
static void gemm_dw(ledger *g, const char *name, double K, double O, int bias)
{
    add(g, name, 2 * g->N * K * O, g->e * (g->N * O + g->N * K + 2 * O * K + (bias ? 2 * O : 0)));
}

/* Causal attention's forward FLOPs: Q K^T and P V over the (T + 1) / 2 keys a query sees. */
static double att_flops(const ledger *g)
{
    return 2.0 * 2.0 * g->N * (g->T + 1) / 2.0 * g->C;
}

static void blocks_fwd(ledger *g)
{
    double N = g->N, C = g->C, e = g->e;
    ln_fwd(g, "fwd.ln1");
    gemm_fwd(g, "fwd.qkv", C, 3 * C, 1);
    add(g, "fwd.attention", att_flops(g), e * (3 * N * C + N * C) + 4 * g->NH * N);
    gemm_fwd(g, "fwd.attproj", C, C, 1);
    add(g, "fwd.residual1", 0, e * 3 * N * C);
    ln_fwd(g, "fwd.ln2");
    gemm_fwd(g, "fwd.fc", C, 4 * C, 1);
    add(g, "fwd.gelu", 0, e * 2 * N * 4 * C);
    gemm_fwd(g, "fwd.fcproj", 4 * C, C, 1);
    add(g, "fwd.residual2", 0, e * 3 * N * C);
}

static void blocks_bwd(ledger *g)
{
    double N = g->N, C = g->C, e = g->e;
    gemm_dinp(g, "bwd.fcproj_dinp", 4 * C, C);
    gemm_dw(g, "bwd.fcproj_dw", 4 * C, C, 1);
    add(g, "bwd.gelu", 0, e * 3 * N * 4 * C);
    gemm_dinp(g, "bwd.fc_dinp", C, 4 * C);
    gemm_dw(g, "bwd.fc_dw", C, 4 * C, 1);
    ln_bwd(g, "bwd.ln2", 1);
    gemm_dinp(g, "bwd.attproj_dinp", C, C);
    gemm_dw(g, "bwd.attproj_dw", C, C, 1);
    /* dO, q k v, O (for the row sums of dO O) and the lse in; dq dk dv out */
    add(g, "bwd.attention", 2 * att_flops(g),
        e * (N * C + 3 * N * C + N * C + 3 * N * C) + 4 * g->NH * N);
    gemm_dinp(g, "bwd.qkv_dinp", C, 3 * C);
    gemm_dw(g, "bwd.qkv_dw", C, 3 * C, 1);
    ln_bwd(g, "bwd.ln1", 1);
}

static void head(ledger *g, int backward)
{
    double N = g->N, C = g->C, V = g->V, e = g->e;
    if (!backward) {
        ln_fwd(g, "fwd.lnf");
        gemm_fwd(g, "fwd.classifier", C, V, 0);
        /* logits and targets in; losses and the lse out */
        add(g, "fwd.xent", 0, e * N * V + 4 * N + 4 * 2 * N);
        return;
    }
    /* logits, lse, targets in; dlogits out */
    add(g, "bwd.xent", 0, e * 2 * N * V + 4 * 2 * N);
    gemm_dinp(g, "bwd.classifier_dinp", C, V);
    gemm_dw(g, "bwd.classifier_dw", C, V, 0);
    ln_bwd(g, "bwd.lnf", 0);
}

int zr_roofline_ledger(const zr_gpt_config *cfg, int B, int T, int es, zr_roofline_row *rows)
{
    ledger g = {rows,          0, ZR_ROOFLINE_FWD_EMBED, 1,
                (double)B * T, T, cfg->channels,         cfg->heads,
                cfg->vocab,    es};
    const double N = g.N, C = g.C, e = g.e, L = cfg->layers;
    /* the wte rows the tokens touch: at most min(N, V), each read once */
    const double R = N < g.V ? N : g.V;
    add(&g, "fwd.encoder", 0, 4 * N + e * (R * C + T * C + N * C));
    g.phase = ZR_ROOFLINE_FWD_BLOCKS;
    g.count = (int)L;
    blocks_fwd(&g);
    g.phase = ZR_ROOFLINE_FWD_HEAD;
    g.count = 1;
    head(&g, 0);
    g.phase = ZR_ROOFLINE_BWD_HEAD;
    head(&g, 1);
    g.phase = ZR_ROOFLINE_BWD_BLOCKS;
    g.count = (int)L;
    blocks_bwd(&g);
    g.phase = ZR_ROOFLINE_BWD_EMBED;
    g.count = 1;
    /* dres and the tokens in; the touched wte rows and wpe's T rows accumulated */
    add(&g, "bwd.encoder", 0, 4 * N + e * (N * C + 2 * R * C + 2 * T * C));
    /* AdamW per unit (the bytes: a unit's mean): gradient in, fp32 master, m, v read and
     * written, parameters out */
    g.phase = ZR_ROOFLINE_OPTIM;
    g.count = cfg->layers + 2;
    double P = (double)zr_gpt_config_param_count(cfg);
    add(&g, "optim.adamw", 0, (e + 24 + e) * P / g.count);
    return g.n;
}

zr_roofline_sum zr_roofline_sum_phase(const zr_roofline_row *rows, int n, int phase)
{
    zr_roofline_sum s = {0, 0, 0, 0};
    for (int i = 0; i < n; i++) {
        if (phase == ZR_ROOFLINE_PHASES || (int)rows[i].phase == phase) {
            s.flops += rows[i].count * rows[i].flops;
            s.bytes += rows[i].count * rows[i].bytes;
            s.kernels += (long)rows[i].count * rows[i].kernels;
            s.gemms += (long)rows[i].count * rows[i].gemms;
        }
    }
    return s;
}

double zr_roofline_ms(const zr_roofline_row *rows, int n, int phase, double gemm_tflops,
                      double copy_gbs)
{
    double ms = 0;
    for (int i = 0; i < n; i++) {
        if (phase != ZR_ROOFLINE_PHASES && (int)rows[i].phase != phase) {
            continue;
        }
        double f = gemm_tflops > 0 ? rows[i].flops / (gemm_tflops * 1e12) : 0;
        double b = copy_gbs > 0 ? rows[i].bytes / (copy_gbs * 1e9) : 0;
        ms += rows[i].count * (f > b ? f : b) * 1e3;
    }
    return ms;
}
