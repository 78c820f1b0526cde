/*
 * bench_model_cuda.c - "zr bench model --device cuda": one GPU training
 * step of GPT-2 124M (T = 1024) in bf16 mixed precision against a cuBLAS
 * bf16 GEMM of the model's largest shape, measured in the same run.
 *
 *   zr bench model --device cuda[:N] [--json] [--quick]
 *
 * A step is the device model's forward and backward (zr/model_cuda.h, bf16
 * weights and activations, fp32 accumulation) and AdamW on fp32 master
 * weights with the bf16 copy refreshed, everything on one stream and timed
 * with CUDA events (median of the timed steps after one warm-up), then as
 * many steps again with an event between phases (the embedding, the blocks
 * and the head each way, the optimizer: where a step's time goes, without
 * a profiler). The micro-batch is the largest of a ladder whose activations
 * and model state fit in the GPU's free memory (cudaMemGetInfo) and that the
 * device model takes (zr_gpt_cuda_max_batch: B T rows up to 2^30, B heads
 * attention blocks up to 65535; 64 on an H200 at T = 1024), backing off when
 * the allocation fails anyway. Model FLOP/s counts 6 x params x tokens +
 * attention (zr_gpt_flops_per_step); flops_vs_gemm divides it by the rate
 * of one bf16 GEMM of the LM head's shape (B T x Vp x C). --quick runs a
 * small model at T = 64 (a smoke test, e.g. on the emulator: its numbers
 * mean nothing). Without a GPU it exits with status 1 at once, saying so.
 *
 * The roofline (zr/roofline.h): each phase's FLOPs and fewest bytes from the
 * shapes, at the bf16 GEMM rate above and the copy rate of one large
 * device-to-device copy measured in the same run (read + written bytes a
 * second): per phase max(FLOPs / GEMM rate, bytes / copy rate), summed over
 * the operations, printed next to the measured phase (roofline_ms), with the
 * step's total and the measured step over it (vs_roofline), and the kernel
 * launches and GEMM calls the ledger counts a step.
 */
#include "../src/cli/cli.h"
#include "zr/model_cuda.h"
#include "zr/optim.h"
#include "zr/quant_cuda.h"
#include "zr/roofline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_UNITS 64

/* The phases of a step, each timed by the events on its two sides (the table's second line):
 * the ledger's phases (zr/roofline.h). */
enum {
    PH_FWD_EMBED = ZR_ROOFLINE_FWD_EMBED,
    PH_FWD_BLOCKS = ZR_ROOFLINE_FWD_BLOCKS,
    PH_FWD_HEAD = ZR_ROOFLINE_FWD_HEAD,
    PH_BWD_HEAD = ZR_ROOFLINE_BWD_HEAD,
    PH_BWD_BLOCKS = ZR_ROOFLINE_BWD_BLOCKS,
    PH_BWD_EMBED = ZR_ROOFLINE_BWD_EMBED,
    PH_OPTIM = ZR_ROOFLINE_OPTIM,
    NPH = ZR_ROOFLINE_PHASES
};
static const char *const ph_name[NPH] = {"fwd_embed",  "fwd_blocks", "fwd_head", "bwd_head",
                                         "bwd_blocks", "bwd_embed",  "optim"};

typedef struct gstate {
    zr_device dev;
    zr_stream *s;
    zr_event *e0, *e1;
    zr_event *ph[NPH + 1]; /* ph[k], ph[k + 1]: around phase k */
    zr_gpt_cuda m;
    int nu;
    size_t numel[MAX_UNITS];
    zr_bf16 *p[MAX_UNITS], *g[MAX_UNITS];
    float *master[MAX_UNITS], *mom[MAX_UNITS], *var[MAX_UNITS];
    float *g32; /* one unit's gradient in fp32, for AdamW */
    int *in, *tg;
} gstate;

/* Device bytes of the model state: bf16 params and grads, fp32 master, m, v, one fp32 grad. */
static size_t state_bytes(const zr_gpt_config *cfg)
{
    int nu = cfg->layers + 2;
    size_t total = 0, big = 0;
    for (int u = 0; u < nu; u++) {
        size_t n = zr_gpt_config_unit_numel(cfg, u);
        total += n * (2 + 2 + 12);
        big = n > big ? n : big;
    }
    return total + big * 4;
}

static void state_free(gstate *b)
{
    if (b->s != NULL) {
        (void)zr_stream_sync(b->s);
    }
    zr_gpt_cuda_free(&b->m);
    for (int u = 0; u < b->nu; u++) {
        zr_device_free(&b->dev, b->p[u]);
        zr_device_free(&b->dev, b->g[u]);
        zr_device_free(&b->dev, b->master[u]);
        zr_device_free(&b->dev, b->mom[u]);
        zr_device_free(&b->dev, b->var[u]);
    }
    zr_device_free(&b->dev, b->g32);
    zr_free(b->in);
    zr_free(b->tg);
    b->nu = 0;
    b->g32 = NULL;
    b->in = b->tg = NULL;
}

/* The model for B x T and its state on the device, parameters from the GPT-2 init. */
static zr_status state_init(gstate *b, const zr_gpt_config *cfg, int B, int T)
{
    ZR_CHECK(zr_gpt_cuda_init(&b->m, cfg, B, T, ZR_DTYPE_BF16, b->s));
    zr_gpt host;
    ZR_CHECK(zr_gpt_init(&host, cfg, 1, 1)); /* the unit table and the init only */
    b->nu = zr_gpt_unit_count(&host);
    ZR_ASSERT(b->nu <= MAX_UNITS);
    size_t big = 0;
    zr_status st = ZR_OK;
    float *tmp = NULL;
    for (int u = 0; u < b->nu && st == ZR_OK; u++) {
        size_t n = b->numel[u] = zr_gpt_unit_numel(&host, u);
        big = n > big ? n : big;
        ZR_CHECK_GOTO(zr_device_alloc_at(&b->dev, (void **)&b->p[u], n * 2, __FILE__, __LINE__), st,
                      done);
        ZR_CHECK_GOTO(zr_device_alloc_at(&b->dev, (void **)&b->g[u], n * 2, __FILE__, __LINE__), st,
                      done);
        ZR_CHECK_GOTO(
            zr_device_alloc_at(&b->dev, (void **)&b->master[u], n * 4, __FILE__, __LINE__), st,
            done);
        ZR_CHECK_GOTO(zr_device_alloc_at(&b->dev, (void **)&b->mom[u], n * 4, __FILE__, __LINE__),
                      st, done);
        ZR_CHECK_GOTO(zr_device_alloc_at(&b->dev, (void **)&b->var[u], n * 4, __FILE__, __LINE__),
                      st, done);
        ZR_CHECK_GOTO(zr_alloc_at((void **)&tmp, n * 4, __FILE__, __LINE__), st, done);
        zr_gpt_unit_init_params(&host, u, tmp, 1);
        ZR_CHECK_GOTO(zr_memcpy_async(b->master[u], tmp, n * 4, b->s), st, done);
        ZR_CHECK_GOTO(zr_stream_sync(b->s), st, done);
        zr_free(tmp);
        tmp = NULL;
        ZR_CHECK_GOTO(zr_bf16_cuda_from_f32(b->p[u], b->master[u], n, b->s), st, done);
        ZR_CHECK_GOTO(zr_memset_async(b->mom[u], 0, n * 4, b->s), st, done);
        ZR_CHECK_GOTO(zr_memset_async(b->var[u], 0, n * 4, b->s), st, done);
    }
    ZR_CHECK_GOTO(zr_device_alloc_at(&b->dev, (void **)&b->g32, big * 4, __FILE__, __LINE__), st,
                  done);
    ZR_CHECK_GOTO(zr_alloc_at((void **)&b->in, sizeof(int) * (size_t)B * T, __FILE__, __LINE__), st,
                  done);
    ZR_CHECK_GOTO(zr_alloc_at((void **)&b->tg, sizeof(int) * (size_t)B * T, __FILE__, __LINE__), st,
                  done);
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < B * T; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        b->in[i] = (int)(x % (uint64_t)cfg->vocab);
        b->tg[i] = (int)((x >> 20) % (uint64_t)cfg->vocab);
    }
done:
    zr_free(tmp);
    zr_gpt_free(&host);
    return st;
}

/* Record phase boundary k on the stream when the step is timed by phases. */
static zr_status mark(gstate *b, int timed, int k)
{
    return timed ? zr_event_record(b->ph[k], b->s) : ZR_OK;
}

/*
 * One step queued on the stream: forward, backward, AdamW on every unit;
 * timed: with an event at each phase boundary (the embedding, the blocks and
 * the head each way, the optimizer).
 */
static zr_status step(gstate *b, int t, int timed)
{
    int L = b->nu - 1;
    zr_adamw h = zr_adamw_default();
    ZR_CHECK(mark(b, timed, PH_FWD_EMBED));
    ZR_CHECK(zr_gpt_cuda_forward_begin(&b->m, b->in, b->tg));
    for (int u = 0; u <= L; u++) {
        ZR_CHECK(mark(b, timed && (u == 1 || u == L), u == 1 ? PH_FWD_BLOCKS : PH_FWD_HEAD));
        ZR_CHECK(zr_gpt_cuda_forward_unit(&b->m, u, b->p[u], b->p[0]));
    }
    ZR_CHECK(mark(b, timed, PH_BWD_HEAD));
    ZR_CHECK(zr_gpt_cuda_backward_begin(&b->m));
    for (int u = 0; u <= L; u++) {
        ZR_CHECK(zr_memset_async(b->g[u], 0, b->numel[u] * 2, b->s));
    }
    for (int u = L; u >= 0; u--) {
        ZR_CHECK(mark(b, timed && (u == L - 1 || u == 0), u > 0 ? PH_BWD_BLOCKS : PH_BWD_EMBED));
        ZR_CHECK(
            zr_gpt_cuda_backward_unit(&b->m, u, u > 0 ? b->p[u] : NULL, b->p[0], b->g[u], b->g[0]));
    }
    ZR_CHECK(mark(b, timed, PH_OPTIM));
    for (int u = 0; u <= L; u++) {
        ZR_CHECK(zr_bf16_cuda_to_f32(b->g32, b->g[u], b->numel[u], b->s));
        ZR_CHECK(zr_adamw_cuda_update(&h, 1e-4f, t, 1.0f, 1, b->master[u], b->g32, b->mom[u],
                                      b->var[u], b->numel[u], b->s));
        ZR_CHECK(zr_bf16_cuda_from_f32(b->p[u], b->master[u], b->numel[u], b->s));
    }
    return mark(b, timed, NPH);
}

/* Milliseconds between two recorded events, as a double for zr_median. */
static zr_status elapsed(zr_event *from, zr_event *to, double *ms)
{
    float f = 0;
    ZR_CHECK(zr_event_elapsed_ms(from, to, &f));
    *ms = f;
    return ZR_OK;
}

/*
 * Median milliseconds of reps steps after one warm-up (*ms), then of reps
 * steps timed by phases (phase[k]): the events between the phases are kept
 * out of the first figure.
 */
static zr_status time_steps(gstate *b, int reps, double *ms, double phase[NPH], double *phased)
{
    double t[16], tp[NPH][16], tw[16];
    ZR_ASSERT(reps >= 1 && reps <= 16);
    ZR_CHECK(step(b, 1, 0));
    for (int r = 0; r < reps; r++) {
        ZR_CHECK(zr_event_record(b->e0, b->s));
        ZR_CHECK(step(b, r + 2, 0));
        ZR_CHECK(zr_event_record(b->e1, b->s));
        ZR_CHECK(zr_event_sync(b->e1));
        ZR_CHECK(elapsed(b->e0, b->e1, &t[r]));
    }
    for (int r = 0; r < reps; r++) {
        ZR_CHECK(step(b, reps + r + 2, 1));
        ZR_CHECK(zr_event_sync(b->ph[NPH]));
        for (int k = 0; k < NPH; k++) {
            ZR_CHECK(elapsed(b->ph[k], b->ph[k + 1], &tp[k][r]));
        }
        ZR_CHECK(elapsed(b->ph[0], b->ph[NPH], &tw[r]));
    }
    *ms = zr_median(t, reps);
    for (int k = 0; k < NPH; k++) {
        phase[k] = zr_median(tp[k], reps);
    }
    *phased = zr_median(tw, reps);
    return ZR_OK;
}

/* TFLOP/s of one bf16 GEMM [M x K] [K x N] on the stream (median of reps). */
static zr_status gemm_rate(gstate *b, int M, int N, int K, int reps, double *tflops)
{
    zr_blas *blas = NULL;
    void *A = NULL, *B = NULL, *C = NULL;
    zr_status st = zr_blas_create(b->s, ZR_DTYPE_BF16, &blas);
    double t[16];
    ZR_ASSERT(reps >= 1 && reps <= 16);
    if (st != ZR_OK) {
        goto done;
    }
    ZR_CHECK_GOTO(zr_device_alloc_at(&b->dev, &A, (size_t)M * K * 2, __FILE__, __LINE__), st, done);
    ZR_CHECK_GOTO(zr_device_alloc_at(&b->dev, &B, (size_t)N * K * 2, __FILE__, __LINE__), st, done);
    ZR_CHECK_GOTO(zr_device_alloc_at(&b->dev, &C, (size_t)M * N * 2, __FILE__, __LINE__), st, done);
    ZR_CHECK_GOTO(zr_memset_async(A, 0x3c, (size_t)M * K * 2, b->s), st, done);
    ZR_CHECK_GOTO(zr_memset_async(B, 0x3c, (size_t)N * K * 2, b->s), st, done);
    /* the LM head's product: C[M, N] = A[M, K] B[N, K]^T */
    zr_gemm g = {0, 1, M, N, K, K, K, N, 0, 0, 0, 1, 1.0f, 0.0f};
    ZR_CHECK_GOTO(zr_blas_gemm(blas, &g, A, B, C), st, done);
    for (int r = 0; r < reps; r++) {
        ZR_CHECK_GOTO(zr_event_record(b->e0, b->s), st, done);
        ZR_CHECK_GOTO(zr_blas_gemm(blas, &g, A, B, C), st, done);
        ZR_CHECK_GOTO(zr_event_record(b->e1, b->s), st, done);
        ZR_CHECK_GOTO(zr_event_sync(b->e1), st, done);
        ZR_CHECK_GOTO(elapsed(b->e0, b->e1, &t[r]), st, done);
    }
    *tflops = 2.0 * M * N * (double)K / (zr_median(t, reps) * 1e-3) * 1e-12;
done:
    if (b->s != NULL) {
        (void)zr_stream_sync(b->s);
    }
    zr_blas_destroy(blas);
    zr_device_free(&b->dev, A);
    zr_device_free(&b->dev, B);
    zr_device_free(&b->dev, C);
    return st;
}

/* GB/s of one device-to-device copy of bytes (read + written bytes a second, median of reps). */
static zr_status copy_rate(gstate *b, size_t bytes, int reps, double *gbs)
{
    void *src = NULL, *dst = NULL;
    double t[16];
    zr_status st = ZR_OK;
    ZR_ASSERT(reps >= 1 && reps <= 16);
    ZR_CHECK_GOTO(zr_device_alloc_at(&b->dev, &src, bytes, __FILE__, __LINE__), st, done);
    ZR_CHECK_GOTO(zr_device_alloc_at(&b->dev, &dst, bytes, __FILE__, __LINE__), st, done);
    ZR_CHECK_GOTO(zr_memset_async(src, 0x3c, bytes, b->s), st, done);
    ZR_CHECK_GOTO(zr_memcpy_async(dst, src, bytes, b->s), st, done);
    for (int r = 0; r < reps; r++) {
        ZR_CHECK_GOTO(zr_event_record(b->e0, b->s), st, done);
        ZR_CHECK_GOTO(zr_memcpy_async(dst, src, bytes, b->s), st, done);
        ZR_CHECK_GOTO(zr_event_record(b->e1, b->s), st, done);
        ZR_CHECK_GOTO(zr_event_sync(b->e1), st, done);
        ZR_CHECK_GOTO(elapsed(b->e0, b->e1, &t[r]), st, done);
    }
    *gbs = 2.0 * (double)bytes / (zr_median(t, reps) * 1e-3) * 1e-9;
done:
    if (b->s != NULL) {
        (void)zr_stream_sync(b->s);
    }
    zr_device_free(&b->dev, src);
    zr_device_free(&b->dev, dst);
    return st;
}

/*
 * The roofline of a step next to the measured phases: prints a line of the table and writes
 * the JSON line's fields (",\"copy_gbs\":...", from copy_gbs to launches) into js.
 */
static void print_roofline(const zr_gpt_config *cfg, int B, int T, double gemm, double copy,
                           double ms, const double phase[NPH], char *js, size_t cap)
{
    zr_roofline_row rows[ZR_ROOFLINE_MAX_ROWS];
    int n = zr_roofline_ledger(cfg, B, T, 2, rows);
    double total = zr_roofline_ms(rows, n, ZR_ROOFLINE_PHASES, gemm, copy);
    zr_roofline_sum all = zr_roofline_sum_phase(rows, n, ZR_ROOFLINE_PHASES);
    size_t off = (size_t)snprintf(js, cap, ",\"copy_gbs\":%.1f,\"roofline_ms\":{", copy);
    printf("roofline (ms at bf16 GEMM %.1f TFLOP/s and copy %.0f GB/s; measured / roofline):", gemm,
           copy);
    for (int k = 0; k < NPH; k++) {
        double roof = zr_roofline_ms(rows, n, k, gemm, copy);
        printf("%s %s %.3f (%.1fx)", k > 0 ? "," : "", ph_name[k], roof,
               roof > 0 ? phase[k] / roof : 0.0);
        off += (size_t)snprintf(js + off, off < cap ? cap - off : 0, "%s\"%s\":%.4f",
                                k > 0 ? "," : "", ph_name[k], roof);
    }
    printf("; step %.3f, measured %.3f = %.2fx; %.1f GFLOP, %.2f GB, %ld kernel launches + %ld "
           "GEMM calls a step (the ledger's)\n",
           total, ms, total > 0 ? ms / total : 0.0, all.flops * 1e-9, all.bytes * 1e-9, all.kernels,
           all.gemms);
    snprintf(js + off, off < cap ? cap - off : 0,
             "},\"roofline_step_ms\":%.4f,\"vs_roofline\":%.3f,\"ledger_gflop\":%.3f,"
             "\"ledger_gb\":%.4f,\"launches\":{\"kernels\":%ld,\"gemms\":%ld}",
             total, total > 0 ? ms / total : 0.0, all.flops * 1e-9, all.bytes * 1e-9, all.kernels,
             all.gemms);
}

/* The largest micro-batch of the ladder that is predicted to fit and then does. */
static zr_status fit_batch(gstate *b, const zr_gpt_config *cfg, int T, int quick, int *B)
{
    static const int ladder[] = {64, 48, 32, 24, 16, 12, 8, 6, 4, 3, 2, 1};
    size_t free_b = 0, total_b = 0;
    ZR_CHECK(zr_device_mem_info(&b->dev, &free_b, &total_b));
    size_t state = state_bytes(cfg);
    for (size_t i = quick ? sizeof ladder / sizeof ladder[0] - 2 : 0;
         i < sizeof ladder / sizeof ladder[0]; i++) {
        size_t need =
            state + zr_gpt_cuda_activation_bytes(cfg, ladder[i], T, ZR_DTYPE_BF16) + (64u << 20);
        if (ladder[i] > zr_gpt_cuda_max_batch(cfg, T) || (double)need > 0.92 * (double)free_b) {
            continue;
        }
        zr_status st = state_init(b, cfg, ladder[i], T);
        if (st == ZR_OK) {
            *B = ladder[i];
            return ZR_OK;
        }
        state_free(b);
        if (st != ZR_ERR_NOMEM && st != ZR_ERR_DEVICE) {
            return st;
        }
        zr_error_clear();
    }
    ZR_FAIL(ZR_ERR_NOMEM,
            "GPT-2 at T = %d does not fit in %.2f GB of free GPU memory even at B = 1", T,
            (double)free_b / 1e9);
}

/* What one run measured. */
typedef struct gresult {
    int B;
    double ms, phase[NPH], phased; /* a step, its phases, the step timed by phases */
    double gemm, copy;             /* bf16 GEMM TFLOP/s, copy GB/s */
} gresult;

/* The stream and events, the largest batch that fits, its steps, then the GEMM and copy
   rates; everything but the device freed again. */
static zr_status measure_all(gstate *b, const zr_gpt_config *cfg, int quick, int reps, gresult *r)
{
    const int T = cfg->max_t;
    zr_status st = zr_stream_create(&b->dev, &b->s);
    if (st == ZR_OK) {
        st = zr_event_create(&b->dev, &b->e0);
    }
    if (st == ZR_OK) {
        st = zr_event_create(&b->dev, &b->e1);
    }
    for (int k = 0; k <= NPH && st == ZR_OK; k++) {
        st = zr_event_create(&b->dev, &b->ph[k]);
    }
    if (st == ZR_OK) {
        st = fit_batch(b, cfg, T, quick, &r->B);
    }
    if (st == ZR_OK) {
        st = time_steps(b, reps, &r->ms, r->phase, &r->phased);
    }
    state_free(b);
    if (st == ZR_OK) {
        st = gemm_rate(b, r->B * T, cfg->padded_vocab, cfg->channels, reps, &r->gemm);
    }
    if (st == ZR_OK) {
        st = copy_rate(b, quick ? (size_t)8 << 20 : (size_t)1 << 30, reps, &r->copy);
    }
    zr_event_destroy(b->e0);
    zr_event_destroy(b->e1);
    for (int k = 0; k <= NPH; k++) {
        zr_event_destroy(b->ph[k]);
    }
    zr_stream_destroy(b->s);
    return st;
}

/* The step's lines, the roofline's, and --json's line. */
static void print_results(const char *dev_name, const zr_gpt_config *cfg, int quick, int reps,
                          int json, const gresult *r)
{
    const int B = r->B, T = cfg->max_t;
    const double ms = r->ms, gemm = r->gemm, *phase = r->phase;
    double tok_s = (double)B * T / (ms * 1e-3);
    double tflops = zr_gpt_flops_per_step(cfg, B, T) / (ms * 1e-3) * 1e-12;
    double peak_mb = (double)zr_mem_device_peak() / 1e6;
    printf("B %d x T %d: %.2f ms/step, %.0f tokens/s, model %.2f TFLOP/s, bf16 GEMM %d x %d x %d "
           "%.2f TFLOP/s, flops_vs_gemm %.3f, peak device memory %.0f MB\n",
           B, T, ms, tok_s, tflops, B * T, cfg->padded_vocab, cfg->channels, gemm,
           gemm > 0 ? tflops / gemm : 0.0, peak_mb);
    printf("phases (ms, median of %d steps timed with an event between each, %.3f a step): "
           "forward embedding %.3f, blocks %.3f (%.3f each), head %.3f; backward head %.3f (with "
           "zeroing the gradients), blocks %.3f (%.3f each), embedding %.3f; optimizer %.3f\n",
           reps, r->phased, phase[PH_FWD_EMBED], phase[PH_FWD_BLOCKS],
           phase[PH_FWD_BLOCKS] / cfg->layers, phase[PH_FWD_HEAD], phase[PH_BWD_HEAD],
           phase[PH_BWD_BLOCKS], phase[PH_BWD_BLOCKS] / cfg->layers, phase[PH_BWD_EMBED],
           phase[PH_OPTIM]);
    char js[1024];
    print_roofline(cfg, B, T, gemm, r->copy, ms, phase, js, sizeof js);
    if (json) {
        printf("{\"bench\":\"model\",\"device\":\"%s\",\"config\":\"%s\",\"dtype\":\"bf16\","
               "\"B\":%d,\"T\":%d,\"ms_per_step\":%.3f,\"tokens_per_s\":%.1f,\"tflops\":%.3f,"
               "\"gemm_tflops\":%.3f,\"flops_vs_gemm\":%.3f,\"peak_device_mb\":%.1f,\"phased_step_"
               "ms\":%.4f,\"phases_ms\":{",
               dev_name, quick ? "small" : "124M", B, T, ms, tok_s, tflops, gemm,
               gemm > 0 ? tflops / gemm : 0.0, peak_mb, r->phased);
        for (int k = 0; k < NPH; k++) {
            printf("%s\"%s\":%.4f", k > 0 ? "," : "", ph_name[k], phase[k]);
        }
        printf("}%s}\n", js);
    }
}

int zr_bench_model_cuda(const char *spec, int json, int quick)
{
    zr_device_kind kind;
    int ordinal;
    gstate b;
    memset(&b, 0, sizeof b);
    zr_status st = zr_device_parse(spec, &kind, &ordinal);
    if (st == ZR_OK) {
        st = zr_device_open_cuda(ordinal < 0 ? 0 : ordinal, &b.dev);
    }
    if (st != ZR_OK) {
        fprintf(stderr, "zr bench model: --device %s: %s\n", spec, zr_error_message());
        return 1;
    }
    const zr_gpt_config gpt2 = {1024, 50257, 50304, 12, 12, 768};
    const zr_gpt_config small = {64, 256, 256, 2, 4, 64};
    const zr_gpt_config *cfg = quick ? &small : &gpt2;
    const int T = cfg->max_t, reps = quick ? 1 : 5;
    char desc[256];
    zr_device_describe(&b.dev, desc, sizeof desc);
    printf("zr bench model: %s, GPT %s bf16 (fp32 master and AdamW) at T = %d, one GPU,\n"
           "median of %d steps timed with CUDA events%s\n",
           desc, quick ? "small (--quick)" : "124M", T, reps,
           quick ? "; --quick: a smoke test, not a measurement" : "");
    gresult r = {0};
    st = measure_all(&b, cfg, quick, reps, &r);
    if (st != ZR_OK) {
        fprintf(stderr, "zr bench model: %s: %s\n", zr_status_str(st), zr_error_message());
        return 1;
    }
    print_results(b.dev.name, cfg, quick, reps, json, &r);
    return 0;
}
