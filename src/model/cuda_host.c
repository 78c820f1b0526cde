/*
 * cuda_host.c - the plain-C halves of the model's CUDA path, built in every
 * build (with CUDA or without) and tested on the CPU: the plan that turns a
 * row-major product into cuBLAS's column-major call (blas_cuda.c says why it
 * is right), the size of the cuBLASLt workspace a model reserves, and the
 * token buckets of the embedding's deterministic backward, and the row
 * ranges of the column sums' first pass, which size the device model's
 * scratch in every build (ops_table.h, ops_cuda_impl.h).
 */
#include "zr/model_cuda.h"

#include "gpt_backend_impl.h"
#include "ops_table.h"

#include <string.h>

#define PART_ROWS 16  /* the fewest rows of a column sum's row range */
#define MAX_PARTS 256 /* row ranges of a column sum (blocks to fill a GPU) */

/* Declared for the kernels in ops_cuda_impl.h, which needs the CUDA runtime's header. */
int zr_op_k_colsum_parts(int N);

int zr_op_k_colsum_parts(int N)
{
    int p = (N + PART_ROWS - 1) / PART_ROWS;
    return p < 1 ? 1 : p > MAX_PARTS ? MAX_PARTS : p;
}

size_t zr_op_colsum_scratch(int N, int C)
{
    return (size_t)zr_op_k_colsum_parts(N) * (size_t)C * 2;
}

void zr_gpt_cuda_slot_numel(const zr_gpt_config *cfg, size_t n[3])
{
    n[0] = zr_gpt_config_unit_numel(cfg, 0);
    n[1] = zr_gpt_config_unit_numel(cfg, 1); /* blocks are all alike */
    n[2] = zr_gpt_config_unit_numel(cfg, cfg->layers + 1);
}

void zr_gpt_cuda_buffer_kinds(zr_dtype type, const zr_engine_config *ecfg, int *params, int *grads)
{
    *params = zr_engine_param_type(ecfg) != type;
    *grads = zr_engine_grad_type(ecfg) != type;
}

size_t zr_gpt_cuda_engine_bytes(const zr_gpt_config *cfg, const zr_gpt_shape *s,
                                const zr_engine_config *ecfg)
{
    size_t n[3];
    zr_gpt_cuda_slot_numel(cfg, n);
    int params, grads;
    zr_gpt_cuda_buffer_kinds(s->compute, ecfg, &params, &grads);
    size_t act = zr_gpt_cuda_activation_bytes(cfg, s->B, s->T, s->compute);
    return act + (size_t)(params + grads) * (n[0] + n[1] + n[2]) * zr_dtype_size(s->compute);
}

int zr_token_buckets(const int *inp, int n, int V, int *token, int *start, int *pos, int *count)
{
    memset(count, 0, (size_t)V * sizeof *count);
    for (int i = 0; i < n; i++) {
        count[inp[i]]++;
    }
    int nb = 0, at = 0;
    for (int v = 0; v < V; v++) {
        if (count[v] > 0) {
            token[nb] = v;
            start[nb++] = at;
            int c = count[v];
            count[v] = at; /* from here on: where the token's next position goes */
            at += c;
        }
    }
    start[nb] = at;
    for (int i = 0; i < n; i++) {
        pos[count[inp[i]]++] = i;
    }
    return nb;
}

zr_status zr_gemm_plan_make(const zr_gemm *g, zr_gemm_plan *p)
{
    memset(p, 0, sizeof *p);
    if (g->M < 0 || g->N < 0 || g->K < 0 || g->batch < 1) {
        ZR_FAIL(ZR_ERR_INVALID, "gemm: M %d, N %d, K %d must be >= 0 and batch %d >= 1", g->M, g->N,
                g->K, g->batch);
    }
    /* the length of one stored row of each operand */
    int arow = g->ta ? g->M : g->K, brow = g->tb ? g->K : g->N;
    if (g->lda < (arow > 1 ? arow : 1) || g->ldb < (brow > 1 ? brow : 1) ||
        g->ldc < (g->N > 1 ? g->N : 1)) {
        ZR_FAIL(ZR_ERR_INVALID,
                "gemm: leading dimensions lda %d, ldb %d, ldc %d are shorter than a stored row "
                "(%d, %d, %d elements)",
                g->lda, g->ldb, g->ldc, arow, brow, g->N);
    }
    if (g->stride_a < 0 || g->stride_b < 0 || g->stride_c < 0) {
        ZR_FAIL(ZR_ERR_INVALID, "gemm: batch strides must be >= 0 (%lld, %lld, %lld)", g->stride_a,
                g->stride_b, g->stride_c);
    }
    p->transa = g->tb != 0;
    p->transb = g->ta != 0;
    p->m = g->N;
    p->n = g->M;
    p->k = g->K;
    p->lda = g->ldb;
    p->ldb = g->lda;
    p->ldc = g->ldc;
    p->stride_a = g->stride_b;
    p->stride_b = g->stride_a;
    p->stride_c = g->stride_c;
    p->batch = g->batch;
    p->alpha = g->alpha;
    p->beta = g->beta;
    return ZR_OK;
}

size_t zr_blas_epi_workspace_bytes(void)
{
    return ZR_BLAS_LT_WORKSPACE;
}
