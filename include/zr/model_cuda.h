/*
 * zr/model_cuda.h - GPT-2 on a CUDA device (issue 24): the matrix products
 * through cuBLAS, and the model's forward and backward over the same units
 * as the CPU model (zr/model.h), so that the ZeRO engine can gather one unit
 * at a time into device memory.
 *
 * Precision is a run-time choice, the compute type:
 *   ZR_DTYPE_F32   parameters, activations and gradients in fp32, cuBLAS in
 *                  pedantic fp32 (no TF32): the mode compared with the CPU
 *   ZR_DTYPE_BF16  bf16 parameters, activations and gradients; every product
 *                  and reduction accumulates in fp32; LayerNorm statistics,
 *                  the attention's log-sum-exp and the losses stay fp32
 * A unit's device buffer holds its tensors at the element offsets of
 * zr_gpt_config_unit_tensors, in the compute type.
 *
 * Nothing here knows ranks, MPI or the engine. In a build without CUDA
 * every device call fails with "built without CUDA"; the GEMM plan is plain
 * C and always works.
 */
#ifndef ZR_MODEL_CUDA_H
#define ZR_MODEL_CUDA_H

#include "zr/device.h"
#include "zr/model.h"
#include "zr/quant.h"

/* ---- matrix products ------------------------------------------------------------ */

/*
 * C = alpha * op(A) op(B) + beta * C on row-major matrices, batch of them at
 * the given strides: op(A) is M x K, op(B) is K x N, C is M x N. op(X) = X^T
 * when tX is set, X then being stored [cols of op(X), rows of op(X)]. Leading
 * dimensions count elements from one row to the next.
 */
typedef struct zr_gemm {
    int ta, tb;
    int M, N, K;
    int lda, ldb, ldc;
    long long stride_a, stride_b, stride_c; /* elements between batch entries */
    int batch;                              /* >= 1 */
    float alpha, beta;
} zr_gemm;

/*
 * The column-major (cuBLAS) call that computes a zr_gemm. A row-major matrix
 * is the column-major matrix of its transpose, so C^T = op(B)^T op(A)^T is
 * computed: cuBLAS's first operand is the row-major B, its second the
 * row-major A. transa/transb: 0 = CUBLAS_OP_N, 1 = CUBLAS_OP_T, for cuBLAS's
 * operands in its order.
 */
typedef struct zr_gemm_plan {
    int transa, transb;
    int m, n, k;
    int lda, ldb, ldc;
    long long stride_a, stride_b, stride_c;
    int batch;
    float alpha, beta;
} zr_gemm_plan;

/*
 * Checks g (sizes >= 0, batch >= 1, each leading dimension at least its
 * stored row length, strides >= 0) and fills p. ZR_ERR_INVALID naming the
 * bad field otherwise.
 */
zr_status zr_gemm_plan_make(const zr_gemm *g, zr_gemm_plan *p);

/* A cuBLAS handle bound to one stream, in one compute type. */
typedef struct zr_blas zr_blas;

/*
 * type: ZR_DTYPE_F32 (fp32 operands, CUBLAS_COMPUTE_32F_PEDANTIC: no TF32,
 * whatever NVIDIA_TF32_OVERRIDE says) or ZR_DTYPE_BF16 (bf16 operands,
 * CUBLAS_COMPUTE_32F: fp32 accumulation). s must be a CUDA stream; it must
 * outlive the handle.
 */
zr_status zr_blas_create(zr_stream *s, zr_dtype type, zr_blas **out);
void zr_blas_destroy(zr_blas *b);
/* Queues g on the handle's stream; A, B, C device memory of the handle's type. */
zr_status zr_blas_gemm(zr_blas *b, const zr_gemm *g, const void *A, const void *B, void *C);

/*
 * What a product does to its result before storing it (zr_blas_gemm_epi), in
 * the row-major terms of zr_gemm: P = alpha op(A) op(B), C [M, N].
 */
typedef enum zr_gemm_epilogue {
    ZR_GEMM_EPI_NONE = 0,  /* C = P + beta C */
    ZR_GEMM_EPI_BIAS,      /* C = P + bias[N] (broadcast over the M rows) */
    ZR_GEMM_EPI_BIAS_GELU, /* aux = P + bias (GELU's input, kept), C = GELU(aux), tanh form */
    ZR_GEMM_EPI_DGELU      /* C = P * GELU'(aux) (the backward through a GELU of input aux) */
} zr_gemm_epilogue;

typedef struct zr_gemm_epi {
    zr_gemm_epilogue kind;
    const void *bias; /* [N], the handle's type (BIAS, BIAS_GELU) */
    void *aux;        /* [M, N], row stride ldaux (BIAS_GELU writes it, DGELU reads it) */
    int ldaux;        /* >= N and a multiple of 8 (cuBLASLt's rule) */
} zr_gemm_epi;

/*
 * g with the epilogue e, through cuBLASLt (opened on first use): one call,
 * one pass over C, where the plain path needs a GEMM and an element-wise
 * kernel. Only batch 1; beta must be 0 unless e->kind is NONE. The handle
 * keeps a 32 MiB workspace and, per shape, transposes, epilogue and operand
 * alignment, the heuristic's algorithm (chosen once). fp32 handles compute
 * in plain fp32 (CUBLAS_COMPUTE_32F with fp32 operands: no TF32), bf16 ones
 * accumulate in fp32, the epilogue in fp32, one rounding of C and of aux.
 * Where cuBLASLt's heuristic has no algorithm for a shape (decided once per
 * shape), the product runs unfused: zr_blas_gemm and the element-wise
 * kernel (which needs ldc and ldaux equal to N).
 */
zr_status zr_blas_gemm_epi(zr_blas *b, const zr_gemm *g, const zr_gemm_epi *e, const void *A,
                           const void *B, void *C);
/* The device bytes of the workspace a handle allocates at its first zr_blas_gemm_epi. */
size_t zr_blas_epi_workspace_bytes(void);

/* ---- the model on the device -------------------------------------------------------- */

/* Where one block's activations live in the device arena (byte offsets are pointers). */
typedef struct zr_gpt_cuda_layer {
    void *ln1, *qkv, *atty, *res2, *ln2, *fch, *fch_gelu, *res3; /* compute type */
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;            /* [BT] */
    float *att_lse;                                              /* [B, NH, T] */
} zr_gpt_cuda_layer;

/* Fields are read-only for callers; use the functions below. */
typedef struct zr_gpt_cuda {
    zr_gpt_config cfg;
    int B, T;
    zr_dtype type;
    size_t es; /* bytes per element of the compute type */
    zr_tensor_desc unit0_desc[2], block_desc[ZR_GPT_BLOCK_TENSORS], final_desc[2];
    zr_stream *stream;             /* every kernel and GEMM runs on it; not owned */
    const struct zr_op_table *ops; /* its operators: the CUDA backend's (src/model/ops_table.h) */
    zr_blas *blas;
    /* 1: bias, bias + GELU and GELU's backward are GEMM epilogues (cuBLASLt), 0: a plain GEMM
       and the element-wise kernels; read from ZR_GEMM_EPILOGUE ("0" = unfused) at init */
    int fused;

    void *arena; /* device: every activation, scratch buffer and token array */
    size_t arena_bytes;
    void *encoded; /* [BT, C] */
    zr_gpt_cuda_layer *layers;
    void *lnf, *logits;                             /* [BT, C], [BT, Vp] (dlogits in backward) */
    float *lnf_mean, *lnf_rstd, *losses, *xent_lse; /* [BT] */
    void *dres, *dln, *datty, *dbig, *tmp;          /* backward scratch; tmp: projections */
    float *att_delta;                               /* [B, NH, T] */
    float *colsum;                                  /* column-sum partials */
    int *tokens;  /* device: inputs, targets, bucket tokens, starts, positions */
    float *ctrl;  /* device: the control buffer (ZR_GPT_CUDA_CTRL floats) */
    int nbuckets; /* distinct input tokens of the micro-batch */

    int *host_tokens;    /* pinned: the tokens' host side, copied with one transfer */
    int *bucket_count;   /* host scratch of V ints for the token buckets */
    float *host_ctrl;    /* pinned: the control buffer's host copy */
    zr_event *tokens_ev; /* the token copy has been read: host_tokens may change */
    zr_event *ctrl_ev;   /* the control buffer's copy has landed */
    int has_targets, fwd_next, bwd_next, loss_pending;
} zr_gpt_cuda;

/* Floats of the control buffer copied to the host once per forward: [0] the mean loss. */
#define ZR_GPT_CUDA_CTRL 16

/*
 * Activations for B x T tokens on s's device in compute type `type`. The
 * configuration must pass zr_gpt_config_check, have channels a multiple of
 * 8 and a head size of at most 256. Free with zr_gpt_cuda_free. The
 * environment variable ZR_GEMM_EPILOGUE=0 selects the unfused GEMMs (for
 * timing both); anything else, or unset, the fused ones.
 */
zr_status zr_gpt_cuda_init(zr_gpt_cuda *m, const zr_gpt_config *cfg, int B, int T, zr_dtype type,
                           zr_stream *s);
/* Safe on a zeroed struct and after a failed init; waits for the stream. */
void zr_gpt_cuda_free(zr_gpt_cuda *m);
/* Device bytes the model allocates for this shape (cfg must be valid): its activations, and
   with the GEMM epilogues on (ZR_GEMM_EPILOGUE) its handle's cuBLASLt workspace. */
size_t zr_gpt_cuda_activation_bytes(const zr_gpt_config *cfg, int B, int T, zr_dtype type);
/*
 * The largest micro-batch zr_gpt_cuda_init accepts at T (0 when none): B T
 * rows at most 2^30 and B heads attention blocks at most 65535; element
 * offsets are 64-bit (GPT-2 124M at T = 1024: 5461, memory permitting).
 * cfg must be valid and 1 <= T <= max_t.
 */
int zr_gpt_cuda_max_batch(const zr_gpt_config *cfg, int T);

/*
 * Same call order and meaning as the CPU model's (zr/model.h): forward_begin
 * (host tokens, checked and copied with one transfer), forward_unit 0 ..
 * L+1, backward_begin, backward_unit L+1 .. 0. params and grads are device
 * buffers in the compute type; backward accumulates (+=) into grads, unit
 * L+1 also into unit0_grads (the tied LM head). Everything is queued on the
 * stream; nothing waits for the device except zr_gpt_cuda_loss.
 */
zr_status zr_gpt_cuda_forward_begin(zr_gpt_cuda *m, const int *inputs, const int *targets);
zr_status zr_gpt_cuda_forward_unit(zr_gpt_cuda *m, int u, const void *params,
                                   const void *unit0_params);
zr_status zr_gpt_cuda_backward_begin(zr_gpt_cuda *m);
zr_status zr_gpt_cuda_backward_unit(zr_gpt_cuda *m, int u, const void *params,
                                    const void *unit0_params, void *grads, void *unit0_grads);
/*
 * The mean cross-entropy of the last complete forward with targets (NaN
 * otherwise): waits for the control buffer's copy, not for the stream.
 */
zr_status zr_gpt_cuda_loss(zr_gpt_cuda *m, float *loss);

#endif /* ZR_MODEL_CUDA_H */
