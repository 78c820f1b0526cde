/*
 * bench_model.c - "zr bench model": single-process training step speed.
 *
 * Measures forward + backward + AdamW on one rank for a small config and for
 * GPT-2 124M, at each requested thread count (zr_gpt_set_threads: zr's pool,
 * which also runs the matrix products), and sets the model's FLOP rate beside
 * OpenBLAS's own multi-threaded cblas_sgemm on a 2048^3 product at the same
 * thread count, taken in the same run (the ceiling the model could reach on
 * this machine), and both beside the cores' own FMA peak at that thread count
 * (zr_cpu_fma_peak: the physical limit, so that a BLAS running weak kernels
 * cannot hide behind a ratio to itself: sgemm_vs_peak, flops_vs_peak; a
 * warning when sgemm is under half the peak). The BLAS's kernels are in the
 * header line and in --json (blas_core). Reports medians, since the machine
 * may be shared, with the forward / backward / AdamW split. With --seq T1,T2,... it runs 124M at
 * those sequence lengths instead (ascending), printing the activation bytes and the process's peak
 * RSS after each, which shows how memory grows with T.
 * --device cuda measures GPT-2 124M on a GPU instead (bench_model_cuda.c).
 */
#define _POSIX_C_SOURCE 200809L

#include "../src/cli/cli.h"
#include "zr/gpt_engine.h"
#include "zr/model.h"
#include "zr/optim.h"
#include "zr/pool.h"

#include "../src/base/blas.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

typedef struct bench_result {
    const char *name;
    const char *products; /* the matrix products' inputs: "fp32" or "bf16" */
    int threads, B, T;
    double ms_step, tokens_per_s, gflops, fwd_ms, bwd_ms, adam_ms;
    double sgemm_gflops, act_mb, rss_mb; /* rss_mb: the process's peak after this run */
    double peak_gflops, sgemm_vs_peak, vs_peak_lo, vs_peak_hi; /* the ceiling's, per thread count */
} bench_result;

/* The ceilings at one thread count: OpenBLAS's sgemm and the cores' FMA peak. */
typedef struct ceiling {
    double sgemm, peak;     /* GFLOP/s, medians */
    double vs_peak, lo, hi; /* sgemm / peak: the median of the pairs, the lowest, highest */
    const char *isa;        /* the peak loop's instructions */
} ceiling;

static double peak_rss_mb(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) {
        return -1;
    }
    return ru.ru_maxrss / 1024.0; /* Linux reports KiB */
}

/*
 * The ceilings at `threads`: reps pairs, each the cores' FMA peak (zr_cpu_fma_peak, 0.1 s)
 * then one 2048^3 sgemm on OpenBLAS's own threads, after one sgemm to warm up. The ratio
 * is taken pair by pair, so a machine that slows down for a while moves both sides.
 */
static int measure_ceiling(int threads, int reps, ceiling *c)
{
    const int n = 2048;
    const zr_blas *blas = zr_blas_get();
    size_t nn = (size_t)n * n;
    float *a = NULL;
    if (zr_alloc_at((void **)&a, 3 * nn * sizeof *a, __FILE__, __LINE__) != ZR_OK) {
        return 0;
    }
    float *b = a + nn, *out = b + nn;
    for (size_t i = 0; i < nn; i++) {
        a[i] = (float)(i % 13) * 0.01f;
        b[i] = (float)(i % 7) * 0.02f;
    }
    zr_blas_set_threads(threads);
    double sg[16], pk[16], ratio[16];
    reps = reps < 1 ? 1 : reps > 16 ? 16 : reps;
    for (int r = -1; r < reps; r++) {
        double t0 = zr_now();
        blas->cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n,
                          0.0f, out, n);
        double t = zr_now() - t0;
        if (r >= 0) {
            sg[r] = 2.0 * n * n * (double)n / t * 1e-9;
            pk[r] = zr_cpu_fma_peak(threads, 0.1, 0, &c->isa);
            ratio[r] = sg[r] / pk[r];
        }
    }
    zr_free(a);
    c->lo = c->hi = ratio[0];
    for (int r = 1; r < reps; r++) {
        c->lo = ratio[r] < c->lo ? ratio[r] : c->lo;
        c->hi = ratio[r] > c->hi ? ratio[r] : c->hi;
    }
    c->sgemm = zr_median(sg, reps);
    c->peak = zr_median(pk, reps);
    c->vs_peak = zr_median(ratio, reps);
    return 1;
}

/* Times steps + 1 training steps (the first warms up): t[0..3][s] = fwd, bwd, adam, all. */
static zr_status timed_steps(zr_gpt_run *r, const zr_gpt_config *cfg, float **p, const int *in,
                             const int *tg, int steps, double t[4][32])
{
    const zr_gpt_backend_i *be = r->be;
    int nu = zr_gpt_config_unit_count(cfg);
    float **g = p + nu, **mm = p + 2 * nu, **vv = p + 3 * nu;
    zr_adamw h = zr_adamw_default();
    for (int step = 0; step <= steps; step++) {
        double t0 = zr_now();
        ZR_CHECK(be->forward_begin(r->model, in, tg));
        for (int u = 0; u < nu; u++) {
            ZR_CHECK(be->forward_unit(r->model, u, p[u], p[0]));
        }
        double t1 = zr_now();
        for (int u = 0; u < nu; u++) {
            memset(g[u], 0, zr_gpt_config_unit_numel(cfg, u) * 4);
        }
        ZR_CHECK(be->backward_begin(r->model));
        for (int u = nu - 1; u >= 0; u--) {
            ZR_CHECK(be->backward_unit(r->model, u, p[u], p[0], g[u], g[0]));
        }
        double t2 = zr_now();
        for (int u = 0; u < nu; u++) {
            zr_adamw_update(&h, 1e-4f, step + 1, 1.0f, 1, p[u], g[u], mm[u], vv[u],
                            zr_gpt_config_unit_numel(cfg, u));
        }
        double t3 = zr_now();
        if (step > 0) {
            t[0][step - 1] = t1 - t0;
            t[1][step - 1] = t2 - t1;
            t[2][step - 1] = t3 - t2;
            t[3][step - 1] = t3 - t0;
        }
    }
    return ZR_OK;
}

/* The model of cfg on the CPU's backend for its architecture, its products' inputs set. */
static zr_status open_model(zr_gpt_run *r, const zr_gpt_config *cfg, int B, int T, int bf16)
{
    zr_device cpu = zr_device_cpu();
    zr_gpt_shape shape = {B, T, 0, ZR_DTYPE_F32};
    zr_engine_config ec = zr_engine_config_default();
    ZR_CHECK(zr_gpt_run_init(r, &cpu, cfg, &shape, &ec));
    char why[256] = "this model's products are fp32 only";
    int got =
        r->be->set_products != NULL ? r->be->set_products(r->model, bf16, why, sizeof why) : 0;
    if (got != bf16) {
        zr_gpt_run_free(r);
        ZR_FAIL(ZR_ERR_INVALID, "--products %s: %s", bf16 ? "bf16" : "fp32", why);
    }
    return ZR_OK;
}

static zr_status run_config(const char *name, const zr_gpt_config *cfg, int B, int T, int threads,
                            int steps, int bf16, bench_result *res)
{
    zr_gpt_run run;
    zr_gpt_set_threads(threads);
    ZR_CHECK(open_model(&run, cfg, B, T, bf16));
    res->products = bf16 ? "bf16" : "fp32";
    ZR_ASSERT(steps >= 1 && steps <= 32);
    int nu = zr_gpt_config_unit_count(cfg);
    zr_status st = ZR_OK;
    float **p = NULL;
    int *in = NULL, *tg = NULL;
    ZR_CHECK_GOTO(zr_alloc_at((void **)&p, sizeof *p * 4 * (size_t)nu, __FILE__, __LINE__), st,
                  done);
    ZR_CHECK_GOTO(zr_alloc_at((void **)&in, sizeof *in * (size_t)B * T, __FILE__, __LINE__), st,
                  done);
    ZR_CHECK_GOTO(zr_alloc_at((void **)&tg, sizeof *tg * (size_t)B * T, __FILE__, __LINE__), st,
                  done);
    /* p[u], then gradients, first and second moments at p[u + nu], p[u + 2 nu], p[u + 3 nu] */
    for (int u = 0; u < 4 * nu; u++) {
        size_t n = zr_gpt_config_unit_numel(cfg, u % nu);
        ZR_CHECK_GOTO(zr_alloc_at((void **)&p[u], n * 4, __FILE__, __LINE__), st, done);
    }
    for (int u = 0; u < nu; u++) {
        zr_gpt_config_unit_init(cfg, u, p[u], 1);
    }
    uint64_t s = 88172645463325252ull;
    for (int i = 0; i < B * T; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        in[i] = (int)(s % (uint64_t)cfg->vocab);
        tg[i] = (int)((s >> 20) % (uint64_t)cfg->vocab);
    }
    double t[4][32];
    ZR_CHECK_GOTO(timed_steps(&run, cfg, p, in, tg, steps, t), st, done);
    double sec = zr_median(t[3], steps);
    res->name = name;
    res->threads = threads;
    res->B = B;
    res->T = T;
    res->ms_step = sec * 1e3;
    res->tokens_per_s = (double)B * T / sec;
    res->gflops = zr_gpt_flops_per_step(cfg, B, T) / sec * 1e-9;
    res->fwd_ms = zr_median(t[0], steps) * 1e3;
    res->bwd_ms = zr_median(t[1], steps) * 1e3;
    res->adam_ms = zr_median(t[2], steps) * 1e3;
    zr_gpt_shape shape = {B, T, 0, bf16 ? ZR_DTYPE_BF16 : ZR_DTYPE_F32};
    zr_engine_config ec = zr_engine_config_default();
    res->act_mb = run.be->model_bytes(cfg, &shape, &ec) / 1048576.0;
done:
    if (p != NULL) {
        for (int u = 0; u < 4 * nu; u++) {
            zr_free(p[u]);
        }
    }
    zr_free(p);
    zr_free(in);
    zr_free(tg);
    zr_gpt_run_free(&run);
    return st;
}

/* Parses "1,2" into v[] (each in [lo, hi]); returns the count (0 on a bad list). */
static int parse_list(const char *s, int *v, int max, long lo, long hi)
{
    int n = 0;
    while (*s != '\0' && n < max) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || x < lo || x > hi || (*end != ',' && *end != '\0')) {
            return 0;
        }
        v[n++] = (int)x;
        s = *end == ',' ? end + 1 : end;
    }
    return *s == '\0' ? n : 0;
}

static void print_row(const bench_result *x)
{
    printf(
        "%-6s %4s %3d %4d %5d %10.1f %11.0f %8.1f %8.1f %8.1f %8.1f %9.1f %6.2f %8.1f %6.2f %6.2f "
        "%8.0f %8.0f\n",
        x->name, x->products, x->threads, x->B, x->T, x->ms_step, x->tokens_per_s, x->fwd_ms,
        x->bwd_ms, x->adam_ms, x->gflops, x->sgemm_gflops, x->gflops / x->sgemm_gflops,
        x->peak_gflops, x->sgemm_vs_peak, x->gflops / x->peak_gflops, x->act_mb, x->rss_mb);
    fflush(stdout);
}

/* The JSON fields of one run (after its "config"). */
static void print_json_run(const bench_result *x)
{
    printf("\"products\":\"%s\",\"threads\":%d,\"B\":%d,\"T\":%d,\"ms_per_step\":%.2f,\"tokens_per_"
           "s\":%.1f,"
           "\"gflops\":%.2f,\"sgemm_gflops\":%.2f,\"flops_vs_sgemm\":%.3f,\"peak_gflops\":%.2f,"
           "\"sgemm_vs_peak\":%.3f,\"sgemm_vs_peak_min\":%.3f,\"sgemm_vs_peak_max\":%.3f,"
           "\"flops_vs_peak\":%.3f,\"fwd_ms\":%.2f,\"bwd_ms\":%.2f,\"adam_ms\":%.2f,"
           "\"activation_mb\":%.1f,\"peak_rss_mb\":%.0f",
           x->products, x->threads, x->B, x->T, x->ms_step, x->tokens_per_s, x->gflops,
           x->sgemm_gflops, x->gflops / x->sgemm_gflops, x->peak_gflops, x->sgemm_vs_peak,
           x->vs_peak_lo, x->vs_peak_hi, x->gflops / x->peak_gflops, x->fwd_ms, x->bwd_ms,
           x->adam_ms, x->act_mb, x->rss_mb);
}

/* s as a JSON string (a user's OPENBLAS_CORETYPE is in blas->how). */
static void print_json_str(const char *s)
{
    putchar('"');
    for (; *s != '\0'; s++) {
        if (*s == '"' || *s == '\\') {
            printf("\\%c", *s);
        } else if ((unsigned char)*s < 0x20) {
            printf("\\u%04x", (unsigned char)*s);
        } else {
            putchar(*s);
        }
    }
    putchar('"');
}

static void print_json(const bench_result *res, int nres, const char *isa, const char *bf16,
                       const char *headline)
{
    /* the headline: the large model's run in fp32 at the most threads measured (the last one) */
    const bench_result *b = NULL;
    for (int i = 0; i < nres; i++) {
        if (strcmp(res[i].name, headline) == 0 && strcmp(res[i].products, "fp32") == 0 &&
            (b == NULL || res[i].threads >= b->threads)) {
            b = &res[i];
        }
    }
    if (b == NULL) {
        b = &res[nres - 1];
    }
    const zr_blas *blas = zr_blas_get();
    printf("{\"bench\":\"model\",\"blas_core\":");
    print_json_str(blas->core);
    printf(",\"blas_reported\":");
    print_json_str(blas->reported);
    printf(",\"blas_how\":");
    print_json_str(blas->how);
    printf(",\"cpu_features\":\"%s\",\"peak_isa\":\"%s\",\"cores\":%d,\"bf16_products\":",
           blas->features, isa, zr_cpu_cores());
    print_json_str(bf16);
    printf(",\"config\":\"%s\",", b->name);
    print_json_run(b);
    printf(",\"runs\":[");
    for (int i = 0; i < nres; i++) {
        printf("%s{\"config\":\"%s\",", i ? "," : "", res[i].name);
        print_json_run(&res[i]);
        printf("}");
    }
    printf("]}\n");
}

typedef struct bench_opts {
    const char *device; /* "cpu", or a GPU (bench_model_cuda.c) */
    int json, quick, nthreads, nseq, nproducts;
    int llama; /* the Llama family's shapes (a small one, SmolLM2-135M's) instead of GPT-2's */
    int threads[8], seq[8], products[2]; /* products: 0 fp32, 1 bf16 */
} bench_opts;

/* Returns -1 to go on, or the exit code. */
static int parse_args(int argc, char **argv, bench_opts *o)
{
    *o = (bench_opts){.device = "cpu", .nthreads = 2, .threads = {1, 2}, .nproducts = 1};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            o->json = 1;
        } else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
            o->device = argv[++i];
        } else if (strcmp(argv[i], "--quick") == 0) {
            o->quick = 1;
        } else if (strcmp(argv[i], "--llama") == 0) {
            o->llama = 1;
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            o->nthreads = parse_list(argv[++i], o->threads, 8, 1, ZR_POOL_MAX_THREADS);
            if (o->nthreads == 0) {
                fprintf(stderr, "zr bench model: bad --threads list '%s' (e.g. 1,2)\n", argv[i]);
                return 2;
            }
        } else if (strcmp(argv[i], "--products") == 0 && i + 1 < argc) {
            const char *v = argv[++i];
            o->nproducts = strcmp(v, "fp32") == 0        ? (o->products[0] = 0, 1)
                           : strcmp(v, "bf16") == 0      ? (o->products[0] = 1, 1)
                           : strcmp(v, "fp32,bf16") == 0 ? (o->products[1] = 1, 2)
                                                         : 0;
            if (o->nproducts == 0) {
                fprintf(stderr, "zr bench model: bad --products '%s' (fp32, bf16 or fp32,bf16)\n",
                        v);
                return 2;
            }
        } else if (strcmp(argv[i], "--seq") == 0 && i + 1 < argc) {
            o->nseq = parse_list(argv[++i], o->seq, 8, 1, 1 << 16);
            for (int k = 1; k < o->nseq; k++) {
                o->nseq = o->seq[k] > o->seq[k - 1] ? o->nseq : 0;
            }
            if (o->nseq == 0) {
                fprintf(stderr, "zr bench model: bad --seq list '%s' (ascending, e.g. 1024,4096)\n",
                        argv[i]);
                return 2;
            }
        } else {
            if (strcmp(argv[i], "--help") != 0) {
                zr_cli_bad_arg("bench model", argc, argv, i);
            }
            fprintf(stderr,
                    "usage: zr bench model [--json] [--threads 1,2] [--quick] "
                    "[--seq 1024,2048,4096] [--products fp32,bf16] [--device cpu|cuda|cuda:N] "
                    "[--llama]\n");
            return strcmp(argv[i], "--help") == 0 ? 0 : 2;
        }
    }
    return -1;
}

/* One configuration the bench times. */
typedef struct run_spec {
    const char *name;
    const zr_gpt_config *cfg;
    int B, T, steps;
} run_spec;

/* The configurations: the small model and GPT-2 124M, or 124M at each --seq; their count. */
static int plan_runs(const bench_opts *o, const zr_gpt_config *small, zr_gpt_config *gpt2,
                     run_spec runs[8])
{
    const int quick = o->quick, nseq = o->nseq;
    gpt2->max_t = nseq > 0 && o->seq[nseq - 1] > gpt2->max_t ? o->seq[nseq - 1] : gpt2->max_t;
    const int T124 = quick ? 256 : 1024, steps_small = quick ? 3 : 7, steps_124 = quick ? 1 : 3;
    const char *big = o->llama ? "135M" : "124M";
    runs[0] = (run_spec){"small", small, 4, 256, steps_small};
    runs[1] = (run_spec){big, gpt2, 1, T124, steps_124};
    if (nseq == 0) {
        return 2;
    }
    for (int k = 0; k < nseq; k++) {
        runs[k] = (run_spec){big, gpt2, 1, o->seq[k], quick ? 1 : 2};
    }
    return nseq;
}

/* The header: the kernels, what bf16 products run on here (into bf16), the columns. */
static void print_header(const zr_gpt_config *small, char bf16[256])
{
    const zr_blas *blas = zr_blas_get();
    /* what bf16 products run on here (the kernel), or why they would not */
    zr_gpt probe;
    ZR_TRY(zr_gpt_init(&probe, small, 1, 1), "");
    (void)zr_gpt_set_products(&probe, 1, bf16, 256);
    zr_gpt_free(&probe);
    printf("zr bench model: forward + backward + AdamW on one rank, medians (%s kernels; BLAS %s "
           "kernels, %s; %d cores)\n",
           zr_gpt_kernels_name(), blas->core, blas->how, zr_cpu_cores());
    printf("bf16 products (--products bf16): %s\n", bf16);
    printf("%-6s %4s %3s %4s %5s %10s %11s %8s %8s %8s %8s %9s %6s %8s %6s %6s %8s %8s\n", "model",
           "prod", "thr", "B", "T", "ms/step", "tokens/s", "fwd ms", "bwd ms", "adam ms", "GFLOP/s",
           "sgemm GF", "ratio", "peak GF", "sg/pk", "vs pk", "act MiB", "RSS MiB");
}

/* Every run at one thread count, after its sgemm ceiling (into c): rows appended to res and
   printed. 0, or 1 (the message printed). */
static int run_at_threads(const bench_opts *o, int threads, const run_spec *runs, int nruns,
                          ceiling *c, bench_result *res, int *nres)
{
    /* the ceilings: OpenBLAS's own threads on one large product, the cores' FMA peak */
    if (!measure_ceiling(threads, o->quick ? 3 : 5, c)) {
        fprintf(stderr, "zr bench model: no memory for the sgemm ceiling\n");
        return 1;
    }
    if (c->vs_peak < 0.5) {
        fprintf(stderr,
                "zr bench model: warning: sgemm runs at %.2f of the FMA peak at %d thread(s) "
                "(%.1f of %.1f GFLOP/s; BLAS %s kernels): the BLAS is not using the CPU\n",
                c->vs_peak, threads, c->sgemm, c->peak, zr_blas_get()->core);
    }
    for (int r = 0; r < nruns * o->nproducts; r++) {
        bench_result *x = &res[*nres];
        int q = r % o->nproducts, rr = r / o->nproducts; /* fp32 and bf16 side by side */
        zr_status st = run_config(runs[rr].name, runs[rr].cfg, runs[rr].B, runs[rr].T, threads,
                                  runs[rr].steps, o->products[q], x);
        if (st != ZR_OK) {
            fprintf(stderr, "zr bench model: %s: %s\n", zr_status_str(st), zr_error_message());
            return 1;
        }
        x->sgemm_gflops = c->sgemm;
        x->peak_gflops = c->peak;
        x->sgemm_vs_peak = c->vs_peak;
        x->vs_peak_lo = c->lo;
        x->vs_peak_hi = c->hi;
        x->rss_mb = peak_rss_mb();
        (*nres)++;
        print_row(x);
    }
    return 0;
}

int zr_bench_model(int argc, char **argv)
{
    bench_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0) {
        return rc;
    }
    if (strcmp(o.device, "cpu") != 0) {
        return zr_bench_model_cuda(o.device, o.json, o.quick);
    }
    zr_gpt_config small = {256, 256, 256, 4, 4, 256};
    zr_gpt_config gpt2 = {1024, 50257, 50304, 12, 12, 768};
    if (o.llama) {
        /* a small Llama, GQA 2:1, and SmolLM2-135M's shape (tied, GQA 3:1, head_dim 64) */
        small = (zr_gpt_config){256, 256, 256, 4, 4, 256, ZR_ARCH_LLAMA};
        small.llama = (zr_llama_config){.family = 1, 256, 256, 4, 4, 2, 64, 688, 1e-5, 1e4};
        gpt2 = (zr_gpt_config){8192, 49152, 49152, 30, 9, 576, ZR_ARCH_LLAMA};
        gpt2.llama = (zr_llama_config){.family = 1, 49152, 576, 30, 9, 3, 64, 1536, 1e-5, 1e5};
        gpt2.llama.tied = 1;
    }
    run_spec runs[8];
    int nruns = plan_runs(&o, &small, &gpt2, runs);
    bench_result res[128];
    int nres = 0;
    char bf16[256];
    const zr_gpt_config gpt_small = {256, 256, 256, 4, 4, 256}; /* the header's bf16 probe */
    print_header(&gpt_small, bf16);
    ceiling c = {.isa = "?"};
    for (int k = 0; k < o.nthreads; k++) {
        if (run_at_threads(&o, o.threads[k], runs, nruns, &c, res, &nres) != 0) {
            return 1;
        }
    }
    printf("GFLOP/s counts matmuls and causal attention (6 x params x tokens + attention); "
           "ratio = GFLOP/s / sgemm GF; peak GF = the cores' FMA peak (%s), sg/pk = sgemm / "
           "peak (median of pairs), vs pk = GFLOP/s / peak; RSS = the process's peak so far\n",
           c.isa);
    if (o.json) {
        print_json(res, nres, c.isa, bf16, runs[nruns - 1].name);
    }
    return 0;
}
