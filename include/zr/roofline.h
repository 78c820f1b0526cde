/*
 * zr/roofline.h - the roofline ledger of one GPT training step (issue 42):
 * for each operation of a step, the FLOPs it must do and the fewest bytes it
 * must move, computed from the shapes alone, and the kernel launches and GEMM
 * calls zr's device model makes for it today.
 *
 * FLOPs: the matrix products and causal attention only (2 per multiply-add;
 * attention over the (T + 1) / 2 keys a query sees on average, its backward
 * twice its forward, without the forward's recomputation). Element-wise
 * arithmetic is not counted: it is far below the bytes' time. The classifier
 * counts the V real tokens, not the padded Vp.
 * Bytes: each input read once and each output written once at its storage
 * type (es: 2 for bf16 activations and weights on the GPU, 4 for fp32; means,
 * rstds and log-sum-exps fp32, tokens int32); an accumulated gradient is read
 * and written; a bias goes into its GEMM (epilogue) and a bias gradient into
 * the weight gradient's GEMM; scratch that a fused kernel would not write
 * (attention's delta, split column sums) is not counted. The optimizer is one
 * fused AdamW pass: bf16 gradient in, fp32 master and moments read and
 * written, bf16 parameters out.
 *
 * Launches: kernel launches (zr's own kernels) and GEMM calls (cuBLAS, each at
 * least one kernel on a GPU, more where cuBLAS splits K) of the device model
 * (zr/model_cuda.h) and of zr bench model's optimizer (a cast to fp32, AdamW,
 * a cast to bf16 per unit). They are a table at the top of
 * src/model/roofline.c, the one place to update when a kernel is fused or
 * split; tests/test_roofline.c counts them in the GPU emulator.
 */
#ifndef ZR_ROOFLINE_H
#define ZR_ROOFLINE_H

#include "zr/model.h"

/* The phases of a step, as zr bench model --device cuda times them. */
typedef enum zr_roofline_phase {
    ZR_ROOFLINE_FWD_EMBED,
    ZR_ROOFLINE_FWD_BLOCKS,
    ZR_ROOFLINE_FWD_HEAD,
    ZR_ROOFLINE_BWD_HEAD,
    ZR_ROOFLINE_BWD_BLOCKS,
    ZR_ROOFLINE_BWD_EMBED,
    ZR_ROOFLINE_OPTIM,
    ZR_ROOFLINE_PHASES
} zr_roofline_phase;

/* One operation: figures for one occurrence; count occurrences a step (L for a block's). */
typedef struct zr_roofline_row {
    const char *name; /* "fwd.qkv", "bwd.attention", ... */
    zr_roofline_phase phase;
    int count;
    double flops; /* at the GEMM rate: products and attention (tensor-core work) */
    double bytes; /* at the copy rate */
    int kernels;  /* zr kernel launches */
    int gemms;    /* GEMM calls */
} zr_roofline_row;

/* A step's or a phase's sums (rows times their counts). */
typedef struct zr_roofline_sum {
    double flops, bytes;
    long kernels, gemms;
} zr_roofline_sum;

/* Most rows a ledger has. */
#define ZR_ROOFLINE_MAX_ROWS 48

/* Fills rows (ZR_ROOFLINE_MAX_ROWS entries) for one step of cfg on B x T tokens with activations
 * and weights of element size es (2: bf16, 4: fp32); returns the row count. */
int zr_roofline_ledger(const zr_gpt_config *cfg, int B, int T, int es, zr_roofline_row *rows);

/* The sums of the rows of phase (ZR_ROOFLINE_PHASES: of every phase). */
zr_roofline_sum zr_roofline_sum_phase(const zr_roofline_row *rows, int n, int phase);

/* Milliseconds at the roofline: max(flops / GEMM rate, bytes / copy rate), rates in TFLOP/s and
 * GB/s (read + written bytes per second); summed row by row, each bound by its own limit. */
double zr_roofline_ms(const zr_roofline_row *rows, int n, int phase, double gemm_tflops,
                      double copy_gbs);

#endif /* ZR_ROOFLINE_H */
