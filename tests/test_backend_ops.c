/*
 * test_backend_ops.c - one list of ops, walked on every device backend and
 * compared with the CPU on the same inputs (ggml's test-backend-ops; issue 41).
 *
 * A backend is an adapter (ggml's ggml_backend_i's shape): a name, allocate /
 * copy / free, the model's operators as the registered backend's own table
 * (zr_gpt_backend_i.ops, ops_table.h: a NULL member is an op the backend
 * lacks, its rows then skipped and counted as such), and the engine's,
 * collectives' and products' kernels beside it. Today's one device backend is CUDA: the
 * GPU emulator's in suite emu, a real GPU in suite gpu; without a device the
 * program prints why and counts as skipped. The CPU is the other side of
 * every row, not a backend walked here: against itself it would be trivial.
 *
 * A row is (op, shape, storage type); the op carries the CPU function it is
 * compared with and the tolerance per precision (fp32, bf16) with its
 * reason; tolerances are relative to the largest |reference| of the output,
 * or SAME_BITS / SAME_NAN (NaN payloads aside). Where the hand-written tests
 * the table took its rows from (test_gpu_ops, test_gpu_quant's elementwise
 * and optimizer cases, test_gpu_gemm_epi's epilogues, test_gpu_flash's
 * shapes) compared with an fp64 reference rather than the CPU operator, the
 * row keeps that reference and its bound. Shapes include 0 and 1, primes,
 * widths that are not multiples of the 16-byte vectors or of the tiles,
 * unaligned pointers, T = 1 and the largest a kernel handles (head size 256,
 * C over 1024, 2^22 + 5001 elements). The walk prints the rows and
 * comparisons each backend ran, and fails a row that compared nothing.
 * Adding an op to a backend = a member of its table (src/model/ops_table.h),
 * an op and its rows here.
 *
 * Inside a row where the op says so: scratch and outputs poisoned with NaN
 * first, a second run giving the same bits (column sums, the attention
 * backward), the fused cross-entropy pass the same bits as its two kernels.
 * Outside the table, as small tests of their own: the host's token buckets
 * and argument errors (NULL pointers, a CPU stream, a head size over 256,
 * a bad type).
 */
#include "test.h"
#include "zr/device.h"
#include "zr/gpt_engine.h"
#include "zr/model_cuda.h"
#include "zr/optim.h"
#include "zr/quant.h"
#include "zr/quant_cuda.h"

#include "../src/model/ops.h"       /* the CPU operators: internal to src/model */
#include "../src/model/ops_table.h" /* the devices' operators: internal to src/model */

/* ---- the backend adapter --------------------------------------------------------------------- */

typedef struct ops_backend {
    const char *name;
    zr_status (*open)(struct ops_backend *be); /* sets stream; fails when the device is absent */
    void (*close)(struct ops_backend *be);
    void *(*alloc)(size_t bytes);
    void (*put)(void *dst, const void *host, size_t bytes); /* host -> backend, synchronous */
    void (*get)(void *host, const void *src, size_t bytes); /* backend -> host, synchronous */
    void (*free)(void *p);
    zr_stream *stream;
    /* the model's operators (ops_table.h): the registered backend's table, set by open; a NULL
       member is an op the backend lacks */
    const zr_op_table *ops;
    /* the engine's, the collectives' and the products' kernels */
    zr_status (*bf16_from_f32)(zr_bf16 *, const float *, size_t, zr_stream *);
    zr_status (*bf16_to_f32)(float *, const zr_bf16 *, size_t, zr_stream *);
    zr_status (*add)(float *, const void *, zr_dtype, size_t, zr_stream *);
    zr_status (*sum_ranks)(float *, const void *, zr_dtype, int, size_t, size_t, float,
                           zr_stream *);
    zr_status (*adamw_update)(const zr_adamw *, float, int, float, int, float *, const float *,
                              float *, float *, size_t, zr_stream *);
    zr_status (*sumsq)(const float *, size_t, double *, double *, zr_stream *);
    /* products: a handle per storage type on the backend's stream */
    zr_status (*blas_create)(zr_stream *, zr_dtype, zr_blas **);
    void (*blas_destroy)(zr_blas *);
    zr_status (*gemm_epi)(zr_blas *, const zr_gemm *, const zr_gemm_epi *, const void *,
                          const void *, void *);
} ops_backend;

/* CUDA: the emulator's device or a real GPU, device 0, one stream. */
static zr_device cuda_dev;

static zr_status cuda_open(ops_backend *be)
{
    const zr_gpt_backend_i *gb; /* the CUDA backend, where the build registers one */
    ZR_CHECK(zr_gpt_backend_of(ZR_DEVICE_CUDA, &gb));
    be->ops = gb->ops;
    int n = 0;
    zr_status s = zr_device_cuda_count(&n);
    if (s == ZR_OK) {
        s = zr_device_open_cuda(0, &cuda_dev);
    }
    return s == ZR_OK ? zr_stream_create(&cuda_dev, &be->stream) : s;
}

static void cuda_close(ops_backend *be)
{
    zr_stream_destroy(be->stream);
    be->stream = NULL;
}

static void *cuda_alloc(size_t bytes)
{
    void *d = NULL;
    TEST_OK(zr_device_alloc_at(&cuda_dev, &d, bytes + 16, __FILE__, __LINE__));
    return d;
}

static zr_stream *cuda_st; /* the copies' stream: the one cuda_open made */

static void cuda_put(void *dst, const void *host, size_t bytes)
{
    TEST_OK(zr_memcpy_async(dst, host, bytes, cuda_st));
    TEST_OK(zr_stream_sync(cuda_st));
}

static void cuda_get(void *host, const void *src, size_t bytes)
{
    TEST_OK(zr_memcpy_async(host, src, bytes, cuda_st));
    TEST_OK(zr_stream_sync(cuda_st));
}

static void cuda_free(void *p)
{
    zr_device_free(&cuda_dev, p);
}

static ops_backend backends[] = {
    {
        .name = "cuda",
        .open = cuda_open,
        .close = cuda_close,
        .alloc = cuda_alloc,
        .put = cuda_put,
        .get = cuda_get,
        .free = cuda_free,
        .bf16_from_f32 = zr_bf16_cuda_from_f32,
        .bf16_to_f32 = zr_bf16_cuda_to_f32,
        .add = zr_quant_cuda_add,
        .sum_ranks = zr_quant_cuda_sum_ranks,
        .adamw_update = zr_adamw_cuda_update,
        .sumsq = zr_sumsq_cuda,
        .blas_create = zr_blas_create,
        .blas_destroy = zr_blas_destroy,
        .gemm_epi = zr_blas_gemm_epi,
    },
};

/* ---- the table's types ----------------------------------------------------------------------- */

typedef struct ops_op ops_op;

#define SAME_BITS 0.0
#define SAME_NAN  (-1.0) /* NaNs made by arithmetic: each processor has its own payload */

typedef struct ops_row {
    const ops_op *op;
    int a, b, c, d; /* the shape, as the op names it */
    float amp;      /* inputs uniform in [-amp, amp] */
    zr_dtype t;
    int x; /* the op's own: attention 1 = the backward twice; gemm_epi: ta * 2 + tb */
} ops_row;

struct ops_op {
    const char *name;
    const char *cpu; /* what the backend is compared with */
    double tol[2];   /* fp32, bf16; SAME_BITS, or SAME_NAN: the same bits or both NaN */
    const char *why;
    /* one row on one backend: 0 when the backend lacks the op */
    int (*run)(const ops_op *op, const ops_row *r, ops_backend *be);
};

static double row_tol(const ops_op *op, const ops_row *r)
{
    return op->tol[r->t == ZR_DTYPE_BF16];
}

/* ---- buffers and comparisons ----------------------------------------------------------------- */

static int ops_cases; /* comparisons made */

/* A backend copy of x[0..n-1] in storage type t (bf16: rounded). */
static void *bput(ops_backend *be, const float *x, size_t n, zr_dtype t)
{
    size_t es = zr_dtype_size(t);
    void *d = be->alloc(n * es), *h = malloc(n * es + 1);
    if (t == ZR_DTYPE_BF16) {
        zr_bf16_from_f32_n(h, x, n);
    } else {
        memcpy(h, x, n * es);
    }
    be->put(d, h, n * es);
    free(h);
    return d;
}

static void *bput_int(ops_backend *be, const int *x, size_t n)
{
    void *d = be->alloc(n * sizeof(int));
    be->put(d, x, n * sizeof(int));
    return d;
}

/* x[0..n-1] = the backend buffer, widened to fp32. */
static void bget(ops_backend *be, float *x, const void *d, size_t n, zr_dtype t)
{
    size_t es = zr_dtype_size(t);
    void *h = malloc(n * es + 1);
    be->get(h, d, n * es);
    if (t == ZR_DTYPE_BF16) {
        zr_bf16_to_f32_n(x, h, n);
    } else {
        memcpy(x, h, n * es);
    }
    free(h);
}

/* A NaN in every float of d[0..n-1] (scratch the kernels must write before they read). */
static void *bpoison(ops_backend *be, size_t n)
{
    float *h = malloc(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; i++) {
        h[i] = NAN;
    }
    void *d = bput(be, h, n, ZR_DTYPE_F32);
    free(h);
    return d;
}

static void bfree_n(ops_backend *be, void **d, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        be->free(d[k]);
    }
}

static void round_bf16(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        x[i] = zr_bf16_to_f32(zr_bf16_from_f32(x[i]));
    }
}

static void fill(zr_test_rng *rng, float *x, size_t n, float amp)
{
    for (size_t i = 0; i < n; i++) {
        x[i] = amp * zr_test_rng_uniform(rng);
    }
}

/* The row's inputs: uniform in [-amp, amp], rounded to bf16 in a bf16 row (the CPU sees them too).
 */
static void fill_t(zr_test_rng *rng, float *x, size_t n, float amp, zr_dtype t)
{
    fill(rng, x, n, amp);
    if (t == ZR_DTYPE_BF16) {
        round_bf16(x, n);
    }
}

static double max_abs(const float *x, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        m = fabs(x[i]) > m ? fabs(x[i]) : m;
    }
    return m;
}

/*
 * Every |got - want| <= tol * (largest |want|, or 1 when that is 0), or the
 * same bits (SAME_BITS, SAME_NAN); the first miss printed with the row.
 */
static void check(const char *what, const ops_row *r, const float *got, const float *want, size_t n,
                  double tol)
{
    double scale = max_abs(want, n), worst = 0.0;
    scale = scale > 0.0 ? scale : 1.0;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - (double)want[i]);
        int ok = tol > 0.0 ? err <= tol * scale
                           : memcmp(&got[i], &want[i], sizeof(float)) == 0 ||
                                 (tol < 0.0 && isnan(got[i]) && isnan(want[i]));
        first = !ok && bad++ == 0 ? i : first;
        worst = err > worst ? err : worst;
    }
    ops_cases++;
    TEST_CHECKF(bad == 0,
                "%s %s [%d %d %d %d] amp %g %s: %zu of %zu beyond %.2g x %.3g (first at %zu: "
                "%.9g vs %.9g), worst %.3g",
                r->op->name, what, r->a, r->b, r->c, r->d, r->amp, zr_dtype_name(r->t), bad, n, tol,
                scale, first, bad ? got[first] : 0.0, bad ? want[first] : 0.0, worst);
}

#include "backend_ops_model.h"
#include "backend_ops_quant.h"

/* ---- the ops and their rows ------------------------------------------------------------------ */

static const ops_op OP_ENCODER = {
    "encoder",
    "zr_op_encoder_fwd, zr_op_encoder_bwd",
    {1e-6, 0},
    "forward: one addition, the same bits; backward: repeated tokens summed in another order "
    "(fp32 only)",
    run_encoder};
static const ops_op OP_LAYERNORM = {
    "layernorm_fwd",
    "zr_op_layernorm_fwd",
    {2e-6, 8e-3},
    "a row's mean and variance summed in another order (fp32); bf16: one rounding of the output",
    run_layernorm};
static const ops_op OP_RESIDUAL_LAYERNORM = {
    "residual_layernorm_fwd",
    "zr_op_residual_layernorm_fwd, zr_op_residual_fwd",
    {2e-6, 8e-3},
    "as layernorm_fwd; the residual itself two additions, the same bits",
    run_residual_layernorm};
static const ops_op OP_LAYERNORM_BWD = {"layernorm_bwd",
                                        "zr_op_layernorm_bwd_acc",
                                        {2e-6, 0},
                                        "row and column reductions in another order (fp32 only)",
                                        run_layernorm_bwd};
static const ops_op OP_BIAS_ADD = {
    "bias_add", "x + bias", {SAME_BITS, SAME_BITS}, "one addition: the same bits", run_bias_add};
static const ops_op OP_COLSUM = {
    "colsum_acc",
    "an fp64 column sum",
    {1e-6, 1e-6},
    "of the sum of magnitudes: another order of fp32 additions; bf16 plus 2^-8 of the result",
    run_colsum};
static const ops_op OP_GELU = {
    "bias_gelu_fwd, gelu_bwd",
    "fp64 tanh GELU",
    {1e-6, 0},
    "the tanh form 1 - 2/(exp(2u) + 1) (the CPU's too); the backward 3x: off by ~2^-24 near u = 0; "
    "fp32 only",
    run_gelu};
static const ops_op OP_ATTENTION = {
    "attention",
    "an fp64 causal softmax(QK^T/sqrt(hs)) V and its gradients",
    {4e-6, 1e-2},
    "fp32: the score, softmax and products' roundings (more with large logits: see its case); "
    "bf16: the probabilities and products in bf16",
    run_attention};
static const ops_op OP_BF16_CASTS = {"bf16 casts",
                                     "zr_bf16_from_f32_n, zr_bf16_to_f32_n",
                                     {SAME_BITS, SAME_BITS},
                                     "rounding by rule",
                                     run_bf16_casts};
static const ops_op OP_ADD = {"add",
                              "acc[i] += x[i]",
                              {SAME_NAN, SAME_NAN},
                              "one addition (bf16 x widened exactly)",
                              run_add};
static const ops_op OP_SUM_RANKS = {"sum_ranks",
                                    "the ranks' sum in rank order, / k",
                                    {SAME_NAN, SAME_NAN},
                                    "the same additions in the same order",
                                    run_sum_ranks};
static const ops_op OP_ADAMW = {"adamw",
                                "zr_adamw_update (scalar)",
                                {SAME_NAN, SAME_NAN},
                                "the same operations in the same order",
                                run_adamw};
static const ops_op OP_SUMSQ = {
    "sumsq",
    "zr_sumsq_cuda_order; zr_sumsq",
    {1e-12, 0},
    "the same bits as the CPU in the device's order; 1e-12 of zr_sumsq: another order in double",
    run_sumsq};
static const ops_op OP_GEMM_EPI = {
    "gemm_epi",
    "zr_op_sgemm, then + bias, zr_op_bias_gelu_fwd, zr_op_gelu_bwd",
    {1e-5, 1e-2},
    "fp32: K products added in another order; bf16 (inputs rounded for the CPU too): one rounding "
    "of C and of aux, 2^-9, and fp32 accumulation",
    run_gemm_epi};
static const ops_op OP_XENT = {"softmax_xent",
                               "zr_op_softmax_xent_fwd, zr_op_softmax_xent_bwd",
                               {1e-6, 8e-3},
                               "losses: the log-sum-exp in another order; dlogits: see its case",
                               run_xent};

/* shapes: a, b, c, d as each op names them; amp; storage type; x (the op's own) */
static const ops_row rows[] = {
    {&OP_ENCODER, 2, 5, 64, 11, 1, ZR_DTYPE_F32, 0},
    {&OP_ENCODER, 3, 4, 36, 7, 1, ZR_DTYPE_F32, 0}, /* C not a multiple of the 16-byte vector */
    {&OP_ENCODER, 1, 1, 8, 3, 1, ZR_DTYPE_F32, 0},  /* one token */
    {&OP_LAYERNORM, 7, 64, 0, 0, 2, ZR_DTYPE_F32, 0},
    {&OP_LAYERNORM, 7, 36, 0, 0, 2, ZR_DTYPE_F32, 0}, /* element by element */
    {&OP_LAYERNORM, 5, 64, 0, 0, 2, ZR_DTYPE_BF16, 0},
    {&OP_LAYERNORM, 7, 776, 0, 0, 2, ZR_DTYPE_F32, 0},  /* 4 chunks a lane, the last short */
    {&OP_LAYERNORM, 3, 300, 0, 0, 2, ZR_DTYPE_BF16, 0}, /* 2 chunks a lane, element by element */
    {&OP_LAYERNORM, 3, 1030, 0, 0, 2, ZR_DTYPE_F32, 0}, /* above 1024: the streaming kernel */
    {&OP_LAYERNORM, 3, 768, 0, 0, 2, ZR_DTYPE_BF16, 0}, /* GPT-2's: 3 chunks a lane */
    {&OP_LAYERNORM, 1, 1, 0, 0, 2, ZR_DTYPE_F32, 0},    /* one element */
    {&OP_RESIDUAL_LAYERNORM, 7, 64, 0, 0, 2, ZR_DTYPE_F32, 0},
    {&OP_RESIDUAL_LAYERNORM, 7, 36, 0, 0, 2, ZR_DTYPE_F32, 0},
    {&OP_RESIDUAL_LAYERNORM, 5, 64, 0, 0, 2, ZR_DTYPE_BF16, 0},
    {&OP_RESIDUAL_LAYERNORM, 7, 776, 0, 0, 2, ZR_DTYPE_F32, 0},
    {&OP_RESIDUAL_LAYERNORM, 3, 300, 0, 0, 2, ZR_DTYPE_BF16, 0},
    {&OP_RESIDUAL_LAYERNORM, 3, 1030, 0, 0, 2, ZR_DTYPE_F32, 0},
    {&OP_RESIDUAL_LAYERNORM, 3, 768, 0, 0, 2, ZR_DTYPE_BF16, 0},
    {&OP_LAYERNORM_BWD, 7, 64, 0, 0, 2, ZR_DTYPE_F32, 0},
    {&OP_LAYERNORM_BWD, 9, 36, 0, 0, 2, ZR_DTYPE_F32, 0},
    {&OP_LAYERNORM_BWD, 37, 264, 0, 0, 2, ZR_DTYPE_F32, 0}, /* two column blocks of dw, db */
    {&OP_LAYERNORM_BWD, 5, 1032, 0, 0, 2, ZR_DTYPE_F32, 0}, /* above 1024: streamed */
    {&OP_LAYERNORM_BWD, 5, 770, 0, 0, 2, ZR_DTYPE_F32, 0}, /* 4 chunks a lane, element by element */
    {&OP_LAYERNORM_BWD, 3, 768, 0, 0, 2, ZR_DTYPE_F32, 0}, /* GPT-2's */
    {&OP_BIAS_ADD, 1, 5, 0, 0, 1, ZR_DTYPE_F32, 0},
    {&OP_BIAS_ADD, 7, 40, 0, 0, 1, ZR_DTYPE_F32, 0},
    {&OP_BIAS_ADD, 100, 33, 0, 0, 1, ZR_DTYPE_F32, 0},
    {&OP_BIAS_ADD, 300, 16, 0, 0, 1, ZR_DTYPE_F32, 0},
    {&OP_BIAS_ADD, 333, 259, 0, 0, 1, ZR_DTYPE_F32, 0},
    {&OP_BIAS_ADD, 4103, 24, 0, 0, 1, ZR_DTYPE_F32, 0},
    {&OP_BIAS_ADD, 1000, 264, 0, 0, 1, ZR_DTYPE_F32, 0},
    {&OP_COLSUM, 1, 5, 0, 0, 1, ZR_DTYPE_F32, 0},
    {&OP_COLSUM, 7, 40, 0, 0, 1, ZR_DTYPE_F32, 0},
    {&OP_COLSUM, 100, 33, 0, 0, 1, ZR_DTYPE_F32, 0},
    {&OP_COLSUM, 300, 16, 0, 0, 1, ZR_DTYPE_F32, 0},
    {&OP_COLSUM, 1000, 264, 0, 0, 1, ZR_DTYPE_F32, 0}, /* two column blocks, the second 8 wide */
    {&OP_COLSUM, 333, 259, 0, 0, 1, ZR_DTYPE_F32, 0},  /* element by element, a short last chunk */
    {&OP_COLSUM, 4103, 24, 0, 0, 1, ZR_DTYPE_F32, 0},  /* 256 ranges of 17 rows, one short */
    {&OP_COLSUM, 301, 264, 0, 0, 1, ZR_DTYPE_BF16, 0},
    {&OP_GELU, 6, 45, 0, 0, 4, ZR_DTYPE_F32, 0},
    {&OP_GELU, 1, 7, 0, 0, 4, ZR_DTYPE_F32, 0},
    {&OP_ATTENTION, 2, 1, 64, 1, 1, ZR_DTYPE_F32, 0},     /* T = 1, head size 64 */
    {&OP_ATTENTION, 1, 37, 64, 1, 1, ZR_DTYPE_F32, 1},    /* two query blocks, T % 32 != 0 */
    {&OP_ATTENTION, 1, 33, 64, 2, 1, ZR_DTYPE_F32, 0},    /* hs 32 */
    {&OP_ATTENTION, 1, 20, 48, 2, 1, ZR_DTYPE_F32, 0},    /* hs 24: no 16-byte loads */
    {&OP_ATTENTION, 1, 130, 32, 2, 1, ZR_DTYPE_F32, 0},   /* hs 16: one lane a row, two blocks */
    {&OP_ATTENTION, 1, 17, 128, 1, 1, ZR_DTYPE_F32, 0},   /* hs 128 */
    {&OP_ATTENTION, 1, 9, 256, 1, 0.5f, ZR_DTYPE_F32, 0}, /* hs 256, the largest: 16-row tiles */
    {&OP_ATTENTION, 1, 19, 64, 1, 12, ZR_DTYPE_F32, 0},   /* large logits */
    {&OP_ATTENTION, 1, 20, 128, 2, 1, ZR_DTYPE_BF16, 0},
    /* the tensor-core kernels (bf16, head sizes 32, 64, 128): T 1, 15, 64, 100, 257 */
    {&OP_ATTENTION, 1, 1, 96, 3, 1, ZR_DTYPE_BF16, 0},
    {&OP_ATTENTION, 3, 1, 64, 1, 1, ZR_DTYPE_BF16, 0},
    {&OP_ATTENTION, 1, 1, 384, 3, 1, ZR_DTYPE_BF16, 0},
    {&OP_ATTENTION, 3, 15, 32, 1, 1, ZR_DTYPE_BF16, 0},
    {&OP_ATTENTION, 1, 15, 192, 3, 1, ZR_DTYPE_BF16, 0},
    {&OP_ATTENTION, 3, 15, 128, 1, 1, ZR_DTYPE_BF16, 0},
    {&OP_ATTENTION, 1, 64, 96, 3, 1, ZR_DTYPE_BF16, 0},
    {&OP_ATTENTION, 3, 64, 64, 1, 1, ZR_DTYPE_BF16, 0},
    {&OP_ATTENTION, 1, 64, 384, 3, 1, ZR_DTYPE_BF16, 0},
    {&OP_ATTENTION, 3, 100, 32, 1, 1, ZR_DTYPE_BF16, 0},
    {&OP_ATTENTION, 1, 100, 192, 3, 1, ZR_DTYPE_BF16, 0},
    {&OP_ATTENTION, 3, 100, 128, 1, 1, ZR_DTYPE_BF16, 0},
    {&OP_ATTENTION, 1, 257, 96, 3, 1, ZR_DTYPE_BF16, 0},
    {&OP_ATTENTION, 3, 257, 64, 1, 1, ZR_DTYPE_BF16, 0},
    {&OP_ATTENTION, 1, 257, 384, 3, 1, ZR_DTYPE_BF16, 0},
    {&OP_XENT, 7, 97, 112, 0, 1, ZR_DTYPE_F32, 0},    /* 16-byte accesses */
    {&OP_XENT, 5, 97, 100, 0, 3, ZR_DTYPE_F32, 0},    /* element by element */
    {&OP_XENT, 6, 97, 112, 0, 1000, ZR_DTYPE_F32, 0}, /* large logits */
    {&OP_XENT, 1, 1, 8, 0, 1, ZR_DTYPE_F32, 0},       /* one class */
    {&OP_XENT, 7, 97, 128, 0, 2, ZR_DTYPE_BF16, 0},
    {&OP_XENT, 3, 3001, 3008, 0, 2, ZR_DTYPE_F32, 0}, /* three chunks a thread, the last short */
    {&OP_XENT, 3, 2999, 3001, 0, 2, ZR_DTYPE_F32, 0}, /* element by element */
    {&OP_XENT, 2, 3001, 3008, 0, 4, ZR_DTYPE_BF16, 0},
    /* ta, tb: (0, 1) forward, (0, 0) dX, (1, 0) dW; N a multiple of 8 where there is an aux */
    {&OP_GEMM_EPI, 7, 13, 9, ZR_GEMM_EPI_NONE, 0, ZR_DTYPE_F32, 1},
    {&OP_GEMM_EPI, 7, 13, 9, ZR_GEMM_EPI_BIAS, 0, ZR_DTYPE_F32, 1},
    {&OP_GEMM_EPI, 33, 50, 19, ZR_GEMM_EPI_BIAS, 0, ZR_DTYPE_F32, 1},
    {&OP_GEMM_EPI, 5, 3, 1, ZR_GEMM_EPI_BIAS, 0, ZR_DTYPE_F32, 0},
    {&OP_GEMM_EPI, 19, 24, 7, ZR_GEMM_EPI_BIAS, 0, ZR_DTYPE_F32, 2},
    {&OP_GEMM_EPI, 5, 24, 7, ZR_GEMM_EPI_BIAS_GELU, 0, ZR_DTYPE_F32, 1},
    {&OP_GEMM_EPI, 33, 16, 19, ZR_GEMM_EPI_BIAS_GELU, 0, ZR_DTYPE_F32, 1},
    {&OP_GEMM_EPI, 1, 8, 1, ZR_GEMM_EPI_BIAS_GELU, 0, ZR_DTYPE_F32, 0},
    {&OP_GEMM_EPI, 7, 24, 5, ZR_GEMM_EPI_DGELU, 0, ZR_DTYPE_F32, 0},
    {&OP_GEMM_EPI, 33, 16, 19, ZR_GEMM_EPI_DGELU, 0, ZR_DTYPE_F32, 0},
    {&OP_GEMM_EPI, 19, 40, 33, ZR_GEMM_EPI_DGELU, 0, ZR_DTYPE_F32, 1},
    {&OP_GEMM_EPI, 7, 13, 9, ZR_GEMM_EPI_NONE, 0, ZR_DTYPE_BF16, 1},
    {&OP_GEMM_EPI, 7, 13, 9, ZR_GEMM_EPI_BIAS, 0, ZR_DTYPE_BF16, 1},
    {&OP_GEMM_EPI, 33, 50, 19, ZR_GEMM_EPI_BIAS, 0, ZR_DTYPE_BF16, 1},
    {&OP_GEMM_EPI, 5, 3, 1, ZR_GEMM_EPI_BIAS, 0, ZR_DTYPE_BF16, 0},
    {&OP_GEMM_EPI, 19, 24, 7, ZR_GEMM_EPI_BIAS, 0, ZR_DTYPE_BF16, 2},
    {&OP_GEMM_EPI, 5, 24, 7, ZR_GEMM_EPI_BIAS_GELU, 0, ZR_DTYPE_BF16, 1},
    {&OP_GEMM_EPI, 33, 16, 19, ZR_GEMM_EPI_BIAS_GELU, 0, ZR_DTYPE_BF16, 1},
    {&OP_GEMM_EPI, 1, 8, 1, ZR_GEMM_EPI_BIAS_GELU, 0, ZR_DTYPE_BF16, 0},
    {&OP_GEMM_EPI, 7, 24, 5, ZR_GEMM_EPI_DGELU, 0, ZR_DTYPE_BF16, 0},
    {&OP_GEMM_EPI, 33, 16, 19, ZR_GEMM_EPI_DGELU, 0, ZR_DTYPE_BF16, 0},
    {&OP_GEMM_EPI, 19, 40, 33, ZR_GEMM_EPI_DGELU, 0, ZR_DTYPE_BF16, 1},
    {&OP_BF16_CASTS, 65536 + 4096, 0, 0, 0, 0, ZR_DTYPE_F32, 0},     /* every bf16, random fp32 */
    {&OP_BF16_CASTS, 65536 + 4096 - 2, 2, 0, 0, 0, ZR_DTYPE_F32, 0}, /* not 16-byte aligned */
    {&OP_ADD, 0, 0, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_ADD, 0, 0, 0, 0, 0, ZR_DTYPE_BF16, 0},
    {&OP_ADD, 1, 1, 1, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_ADD, 1, 1, 1, 0, 0, ZR_DTYPE_BF16, 0},
    {&OP_ADD, 7, 0, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_ADD, 7, 0, 0, 0, 0, ZR_DTYPE_BF16, 0},
    {&OP_ADD, 8, 1, 1, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_ADD, 8, 1, 1, 0, 0, ZR_DTYPE_BF16, 0},
    {&OP_ADD, 9, 0, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_ADD, 9, 0, 0, 0, 0, ZR_DTYPE_BF16, 0},
    {&OP_ADD, 63, 1, 1, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_ADD, 63, 1, 1, 0, 0, ZR_DTYPE_BF16, 0},
    {&OP_ADD, 64, 0, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_ADD, 64, 0, 0, 0, 0, ZR_DTYPE_BF16, 0},
    {&OP_ADD, 1001, 1, 1, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_ADD, 1001, 1, 1, 0, 0, ZR_DTYPE_BF16, 0},
    {&OP_SUM_RANKS, 0, 0, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_SUM_RANKS, 0, 0, 0, 0, 0, ZR_DTYPE_BF16, 0},
    {&OP_SUM_RANKS, 1, 3, 1, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_SUM_RANKS, 1, 3, 1, 0, 0, ZR_DTYPE_BF16, 0},
    {&OP_SUM_RANKS, 7, 0, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_SUM_RANKS, 7, 0, 0, 0, 0, ZR_DTYPE_BF16, 0},
    {&OP_SUM_RANKS, 8, 3, 1, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_SUM_RANKS, 8, 3, 1, 0, 0, ZR_DTYPE_BF16, 0},
    {&OP_SUM_RANKS, 9, 0, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_SUM_RANKS, 9, 0, 0, 0, 0, ZR_DTYPE_BF16, 0},
    {&OP_SUM_RANKS, 63, 3, 1, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_SUM_RANKS, 63, 3, 1, 0, 0, ZR_DTYPE_BF16, 0},
    {&OP_SUM_RANKS, 64, 0, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_SUM_RANKS, 64, 0, 0, 0, 0, ZR_DTYPE_BF16, 0},
    {&OP_SUM_RANKS, 1000, 3, 1, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_SUM_RANKS, 1000, 3, 1, 0, 0, ZR_DTYPE_BF16, 0},
    {&OP_ADAMW, 0, 0, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_ADAMW, 1, 1, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_ADAMW, 3, 0, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_ADAMW, 4, 1, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_ADAMW, 5, 0, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_ADAMW, 17, 1, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_ADAMW, 64, 0, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_ADAMW, 1000, 1, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_ADAMW, 4097, 0, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_SUMSQ, 0, 0, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_SUMSQ, 0, 1, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_SUMSQ, 1, 0, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_SUMSQ, 1, 1, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_SUMSQ, 5, 0, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_SUMSQ, 5, 1, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_SUMSQ, 4095, 0, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_SUMSQ, 4095, 1, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_SUMSQ, 4096, 0, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_SUMSQ, 4096, 1, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_SUMSQ, 4097, 0, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_SUMSQ, 4097, 1, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_SUMSQ, 70001, 0, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_SUMSQ, 70001, 1, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_SUMSQ, 1024 * 4096 + 5001, 0, 0, 0, 0, ZR_DTYPE_F32, 0},
    {&OP_SUMSQ, 10, 0, 1, 0, 0, ZR_DTYPE_F32, 0}, /* a NaN: NaN */
};

#include "backend_ops_llama.h" /* llama_rows: the Llama family's (issue 43) */

/* ---- the walk ------------------------------------------------------------------------------- */

/* Every row: GPT-2's and the rest (rows), then the Llama family's (llama_rows). */
#define NROWS (sizeof rows / sizeof rows[0] + sizeof llama_rows / sizeof llama_rows[0])
#define ROW_AT(i)                                                                                  \
    ((i) < sizeof rows / sizeof rows[0] ? &rows[i]                                                 \
                                        : &llama_rows[(i) - sizeof rows / sizeof rows[0]])

static int rows_run, rows_skipped;

static void test_rows(void)
{
    for (size_t b = 0; b < sizeof backends / sizeof backends[0]; b++) {
        ops_backend *be = &backends[b];
        int run = 0, skipped = 0, cases = ops_cases;
        for (size_t i = 0; i < NROWS; i++) {
            int before = zr_test_checks;
            const ops_row *row = ROW_AT(i);
            if (row->op->run(row->op, row, be)) {
                run++;
                TEST_CHECKF(zr_test_checks > before, "row %zu (%s) compared nothing", i,
                            row->op->name);
            } else {
                skipped++;
            }
        }
        printf("  backend %s: %d of %zu rows run (%d without the op), %d comparisons\n", be->name,
               run, NROWS, skipped, ops_cases - cases);
        rows_run += run;
        rows_skipped += skipped;
    }
}

/* ---- arguments ------------------------------------------------------------------------------ */

static void test_arguments(void)
{
    ops_backend *be = &backends[0];
    float x[4] = {0};
    void *d = bput(be, x, 4, ZR_DTYPE_F32);
    zr_stream *st = be->stream;
    TEST_FAILS(be->ops->layernorm_fwd(ZR_DTYPE_F32, d, NULL, d, d, d, d, 1, 4, st), ZR_ERR_INVALID,
               "pointer argument 2 is NULL");
    TEST_FAILS(be->ops->attention_fwd(ZR_DTYPE_F32, d, d, d, 1, 1, 1024, 2, st), ZR_ERR_INVALID,
               "head size 512");
    TEST_FAILS(be->ops->attention_fwd(ZR_DTYPE_F32, d, d, d, 1, 1, 30, 4, st), ZR_ERR_INVALID,
               "a multiple of NH");
    TEST_FAILS(be->ops->xent_fwd(ZR_DTYPE_F32, d, d, d, NULL, 1, 9, 8, st), ZR_ERR_INVALID,
               "Vp >= V");
    TEST_FAILS(be->ops->attention_gqa_fwd(0, ZR_DTYPE_F32, d, d, d, d, d, 1, 1, 4, 3, 8, st),
               ZR_ERR_INVALID, "NKV must divide NH");
    TEST_FAILS(be->ops->rope_fwd(ZR_DTYPE_F32, d, d, d, d, 1, 1, 1, 3, st), ZR_ERR_INVALID,
               "head size 3");
    TEST_FAILS(be->ops->swiglu_fwd(ZR_DTYPE_F32, d, d, d, 1, 4, 3, st), ZR_ERR_INVALID,
               "row stride 3");
    TEST_FAILS(be->ops->bias_add((zr_dtype)9, d, d, 1, 1, st), ZR_ERR_INVALID,
               "neither fp32 nor bf16");
    TEST_FAILS(zr_quant_cuda_add(d, d, (zr_dtype)7, 4, st), ZR_ERR_INVALID, "dtype");
    zr_device cpu = zr_device_cpu();
    zr_stream *cs = NULL;
    TEST_OK(zr_stream_create(&cpu, &cs));
    TEST_FAILS(be->ops->gelu_bwd(ZR_DTYPE_F32, d, d, d, 4, cs), ZR_ERR_INVALID, "got a CPU stream");
    zr_stream_destroy(cs);
    be->free(d);
}

/* --list: every op once, with what it is compared with, its tolerances and their reason. */
static int list_ops(void)
{
    const ops_op *seen[64];
    int n = 0;
    for (size_t i = 0; i < NROWS; i++) {
        const ops_op *op = ROW_AT(i)->op;
        int k = 0, count = 0;
        while (k < n && seen[k] != op) {
            k++;
        }
        for (size_t j = 0; j < NROWS; j++) {
            count += ROW_AT(j)->op == op;
        }
        if (k == n && n < 64) {
            seen[n++] = op;
            printf("%-24s %3d rows  fp32 %-8.2g bf16 %-8.2g vs %s: %s\n", op->name, count,
                   op->tol[0], op->tol[1], op->cpu, op->why);
        }
    }
    printf("%d ops, %zu rows (tolerance 0: the same bits; -1: the same bits or both NaN)\n", n,
           NROWS);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--list") == 0) {
        return list_ops();
    }
    ops_backend *be = &backends[0];
    if (be->open(be) != ZR_OK) {
        return zr_test_skip("%s", zr_error_message());
    }
    zr_error_clear();
    cuda_st = be->stream;
    char line[256];
    zr_device_describe(&cuda_dev, line, sizeof line);
    printf("  device %s\n", line);
    if (be->stream != NULL) {
        TEST_RUN(test_rows);
        TEST_RUN(test_token_buckets);
        TEST_RUN(test_arguments);
    }
    be->close(be);
    return zr_test_finish();
}
