/*
 * bench_quant.c - "zr bench quant": throughput of the block codecs against
 * memcpy, and their error by group size.
 *
 *   zr bench quant [--json] [--sizes 1M,16M,64M] [--impl auto|scalar|avx2|avx512]
 *                  [--group G] [--reps N] [--threads N] [--device cpu|cuda|cuda:N]
 *
 * --device cuda runs the GPU kernels instead (bench_quant_cuda.c: against a
 * device-to-device copy, 64M elements = 256 MiB of fp32 by default).
 *
 * For each size (M = 2^20 elements) it times quantize (fp32 and bf16 input)
 * and dequantize (to fp32 and bf16) at int8 and int4, and memcpy of the
 * same input bytes in the same run; every number is the median of several
 * repetitions because the machine is shared. GB/s count the bytes of the
 * uncompressed side (input of quantize, output of dequantize), so "x memcpy"
 * is how the codec compares with merely copying the tensor.
 *
 * The error table sweeps the group size on Gaussian data: RMS error relative
 * to the RMS of the data, the int8 quantize throughput and the wire overhead
 * of the scales; it is the measurement behind ZR_QUANT_DEFAULT_GROUP.
 *
 * --threads N (default 1): the codecs on N threads of the process's pool, as
 * a rank with zr.train.threads N runs them; each row is then also timed on
 * one thread in the same run ("x 1 thread"), and memcpy stays one thread.
 *
 * --json prints one JSON object on the last line; quant_int8_vs_memcpy is
 * int8 quantize of fp32 at the largest size, input bytes/s over memcpy bytes/s
 * (at --threads), quant_int8_vs_1thread the same codec at --threads over 1.
 */
#include "../src/cli/cli.h"
#include "zr/pool.h"
#include "zr/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SIZES 8
#define MAX_ROWS  64

typedef struct bench_row {
    const char *op;
    int bits;
    zr_dtype dtype;
    size_t n;
    double gbps, memcpy_gbps, gbps_1thread;
} bench_row;

/* Cheap deterministic data: uniform-ish noise (throughput does not depend on it). */
static void fill_noise(float *x, size_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((int32_t)(s >> 32)) * (1.0f / 2147483648.0f);
    }
}

static void fill_gauss(float *x, size_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 7;
    for (size_t i = 0; i < n; i += 2) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        double u1 = ((double)(s >> 11) + 1.0) / 9007199254740993.0;
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        double u2 = (double)(s >> 11) / 9007199254740992.0;
        double rad = sqrt(-2.0 * log(u1));
        x[i] = (float)(rad * cos(6.283185307179586 * u2));
        if (i + 1 < n) {
            x[i + 1] = (float)(rad * sin(6.283185307179586 * u2));
        }
    }
}

enum { OP_MEMCPY, OP_QUANT, OP_DEQUANT };

typedef struct bench_ctx {
    const float *x;
    const zr_bf16 *xh;
    void *block;
    void *out;
    void *copy;
    size_t n;
} bench_ctx;

/* Median seconds of reps runs of one operation (after one warm-up run). */
static double time_op(const bench_ctx *c, int op, const zr_quant_params *p, zr_dtype t, int reps)
{
    double ts[64];
    reps = reps > 64 ? 64 : reps;
    for (int r = -1; r < reps; r++) {
        double t0 = zr_now();
        switch (op) {
        case OP_MEMCPY:
            memcpy(c->copy, t == ZR_DTYPE_BF16 ? (const void *)c->xh : (const void *)c->x,
                   c->n * zr_dtype_size(t));
            break;
        case OP_QUANT:
            ZR_TRY(zr_quant_encode(p, t,
                                   t == ZR_DTYPE_BF16 ? (const void *)c->xh : (const void *)c->x,
                                   c->n, 1.0f, NULL, c->block, NULL),
                   "bench quant");
            break;
        case OP_DEQUANT:
            ZR_TRY(zr_quant_decode(c->block, t, c->out, c->n), "bench quant");
            break;
        }
        if (r >= 0) {
            ts[r] = zr_now() - t0;
        }
    }
    return zr_median(ts, reps);
}

static double rms_rel_error(const zr_quant_params *p, const float *x, size_t n, float *y,
                            void *block)
{
    ZR_TRY(zr_quant_encode(p, ZR_DTYPE_F32, x, n, 1.0f, NULL, block, NULL), "bench quant");
    ZR_TRY(zr_quant_decode(block, ZR_DTYPE_F32, y, n), "bench quant");
    double se = 0, sx = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i] - (double)y[i];
        se += d * d;
        sx += (double)x[i] * (double)x[i];
    }
    return sqrt(se / sx);
}

/* An element count as the sizes are given: 64M, 256K, or the number; in buf. */
static const char *count_text(size_t n, char buf[32])
{
    if (n % (1u << 20) == 0) {
        snprintf(buf, 32, "%zuM", n >> 20);
    } else if (n % 1024 == 0) {
        snprintf(buf, 32, "%zuK", n >> 10);
    } else {
        snprintf(buf, 32, "%zu", n);
    }
    return buf;
}

static int usage(void)
{
    fprintf(stderr, "usage: zr bench quant [--json] [--sizes 1M,16M,64M] "
                    "[--impl auto|scalar|avx2|avx512] [--group G] [--reps 1-64] "
                    "[--threads N] [--device cpu|cuda|cuda:N]\n");
    return 2;
}

/* What the command line asked for. */
typedef struct quant_opts {
    int json, group, reps, threads; /* reps 0: by size */
    size_t sizes[MAX_SIZES];
    int nsizes, sizes_given;
    zr_quant_impl impl;
    const char *device;
} quant_opts;

/* --sizes LIST into o->sizes; 0, or usage()'s code. */
static int parse_sizes(const char *arg, quant_opts *o)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", arg);
    o->nsizes = 0;
    o->sizes_given = 1;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (o->nsizes == MAX_SIZES || strlen(arg) >= sizeof buf ||
            !zr_cli_size("quant", "--sizes", tok, 1, (double)(1ull << 32), &o->sizes[o->nsizes])) {
            return usage();
        }
        o->nsizes++;
    }
    return o->nsizes == 0 ? usage() : 0;
}

/* --impl NAME into o->impl; 0, or usage()'s code. */
static int parse_impl(const char *s, quant_opts *o)
{
    static const char *const names[] = {"auto", "scalar", "avx2", "avx512"};
    int k = 0;
    while (k < 4 && strcmp(s, names[k]) != 0) {
        k++;
    }
    o->impl = (zr_quant_impl)k; /* the enum's order: auto, scalar, avx2, avx512 */
    if (k == 4) {
        fprintf(stderr,
                "zr bench quant: --impl \"%.40s\" is not auto, scalar, avx2 or "
                "avx512\n",
                s);
        return usage();
    }
    return 0;
}

/* The command line into o; 0, or the exit code (usage()'s). */
static int parse_args(int argc, char **argv, quant_opts *o)
{
    *o = (quant_opts){.group = ZR_QUANT_DEFAULT_GROUP,
                      .threads = 1,
                      .sizes = {1u << 20, 16u << 20, 64u << 20},
                      .nsizes = 3,
                      .impl = ZR_QUANT_IMPL_AUTO,
                      .device = "cpu"};
    int got, rc = 0;
    /* whole numbers in range, or the flag is named (atoi took "8x" for 8) */
    const zr_cli_int_flag nums[3] = {{"--group", &o->group, NULL, 32, 65536},
                                     {"--reps", &o->reps, NULL, 1, 64},
                                     {"--threads", &o->threads, NULL, 1, ZR_POOL_MAX_THREADS}};
    for (int i = 1; i < argc && rc == 0; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            o->json = 1;
        } else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
            rc = parse_sizes(argv[++i], o);
        } else if (strcmp(argv[i], "--impl") == 0 && i + 1 < argc) {
            rc = parse_impl(argv[++i], o);
        } else if (i + 1 < argc &&
                   (got = zr_cli_int_flags("quant", nums, 3, argv[i], argv[i + 1])) != 0) {
            if (got < 0) {
                return usage();
            }
            i++;
        } else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
            o->device = argv[++i];
        } else {
            zr_cli_bad_arg("bench quant", argc, argv, i);
            return usage();
        }
    }
    return rc;
}

/* The buffers every table times into: nmax elements each (block: the largest block). */
typedef struct quant_bufs {
    float *x, *out, *copy;
    zr_bf16 *xh;
    uint8_t *block;
    size_t nmax;
} quant_bufs;

static void bufs_alloc(const quant_opts *o, quant_bufs *b)
{
    size_t nmax = 0;
    for (int s = 0; s < o->nsizes; s++) {
        nmax = o->sizes[s] > nmax ? o->sizes[s] : nmax;
    }
    b->nmax = nmax;
    ZR_TRY(zr_alloc_at((void **)&b->x, nmax * 4, __FILE__, __LINE__), "out of memory");
    ZR_TRY(zr_alloc_at((void **)&b->xh, nmax * 2, __FILE__, __LINE__), "out of memory");
    ZR_TRY(zr_alloc_at((void **)&b->out, nmax * 4, __FILE__, __LINE__), "out of memory");
    ZR_TRY(zr_alloc_at((void **)&b->copy, nmax * 4, __FILE__, __LINE__), "out of memory");
    ZR_TRY(zr_alloc_at((void **)&b->block,
                       zr_quant_block_bytes(&(zr_quant_params){8, 32, ZR_QUANT_ASYM}, nmax),
                       __FILE__, __LINE__),
           "out of memory");
    fill_noise(b->x, nmax, 1);
    zr_bf16_from_f32_n(b->xh, b->x, nmax);
}

static void bufs_free(quant_bufs *b)
{
    zr_free(b->x);
    zr_free(b->xh);
    zr_free(b->out);
    zr_free(b->copy);
    zr_free(b->block);
}

/* The speed table's rows and its headline numbers. */
typedef struct quant_speed {
    bench_row rows[MAX_ROWS];
    int nrows;
    double headline, headline_threads;
} quant_speed;

/* One row: op at bits on type t, n elements (c), at o->threads and on one thread; printed. */
static bench_row *time_row(const quant_opts *o, const bench_ctx *c, int op,
                           const zr_quant_params *p, int t, int reps, const double mc[2],
                           quant_speed *sp)
{
    size_t n = c->n;
    char cb[32];
    if (op == OP_DEQUANT) {
        /* decode needs a block of these parameters */
        ZR_TRY(zr_quant_encode(p, ZR_DTYPE_F32, c->x, n, 1.0f, NULL, c->block, NULL),
               "bench quant");
    }
    double sec = time_op(c, op, p, (zr_dtype)t, reps), sec1 = sec;
    if (o->threads > 1) { /* the baseline: the same codec on one thread */
        ZR_TRY(zr_threads_set(1), "bench quant");
        sec1 = time_op(c, op, p, (zr_dtype)t, reps);
        ZR_TRY(zr_threads_set(o->threads), "bench quant");
    }
    bench_row *r = &sp->rows[sp->nrows++];
    r->op = op == OP_QUANT ? "quantize" : "dequantize";
    r->bits = p->bits;
    r->dtype = (zr_dtype)t;
    r->n = n;
    r->gbps = (double)(n * zr_dtype_size((zr_dtype)t)) / sec / 1e9;
    r->memcpy_gbps = mc[t];
    r->gbps_1thread = (double)(n * zr_dtype_size((zr_dtype)t)) / sec1 / 1e9;
    printf("%-10s int%-2d %-5s %9s %10.2f %12.2f %9.2f", r->op, p->bits, zr_dtype_name(r->dtype),
           count_text(n, cb), r->gbps, r->memcpy_gbps, r->gbps / r->memcpy_gbps);
    printf(o->threads > 1 ? "  %11.2f\n" : "\n", r->gbps / r->gbps_1thread);
    return r;
}

/* The speed table: every size, op, bit width and type, against memcpy of the same bytes. */
static void speed_table(const quant_opts *o, const quant_bufs *b, const zr_quant_params pq[2],
                        quant_speed *sp)
{
    printf("%-10s %-5s %-5s %9s %10s %12s %9s%s\n", "op", "bits", "type", "elements", "GB/s",
           "memcpy GB/s", "x memcpy", o->threads > 1 ? "  x 1 thread" : "");
    sp->nrows = 0;
    sp->headline = 0;
    sp->headline_threads = 1;
    for (int s = 0; s < o->nsizes; s++) {
        size_t n = o->sizes[s];
        int reps = o->reps > 0 ? o->reps : n <= (1u << 20) ? 31 : n <= (16u << 20) ? 9 : 5;
        bench_ctx c = {b->x, b->xh, b->block, b->out, b->copy, n};
        double mc[2];
        for (int t = 0; t < 2; t++) {
            mc[t] = (double)(n * zr_dtype_size((zr_dtype)t)) /
                    time_op(&c, OP_MEMCPY, NULL, (zr_dtype)t, reps) / 1e9;
        }
        for (int op = OP_QUANT; op <= OP_DEQUANT; op++) {
            for (int k = 0; k < 2; k++) { /* int8, then int4 */
                for (int t = 0; t < 2; t++) {
                    bench_row *r = time_row(o, &c, op, &pq[k], t, reps, mc, sp);
                    if (op == OP_QUANT && k == 0 && t == 0 && s == o->nsizes - 1) {
                        sp->headline = r->gbps / r->memcpy_gbps;
                        sp->headline_threads = r->gbps / r->gbps_1thread;
                    }
                }
            }
        }
    }
}

static const int sweep[] = {32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536};
#define NSWEEP ((int)(sizeof sweep / sizeof sweep[0]))

/* group-size sweep: error on Gaussian data, int8 quantize speed, scale overhead */
static void error_table(const quant_bufs *b, double err[NSWEEP][4], double speed[NSWEEP])
{
    char cb[2][32]; /* element counts as text */
    size_t nmax = b->nmax;
    size_t ne = nmax < (4u << 20) ? nmax : (4u << 20);
    size_t nt = nmax < (16u << 20) ? nmax : (16u << 20);
    fill_gauss(b->x, ne, 2);
    printf("\nerror by group size: Gaussian data (%s elements), RMS error / RMS of data;\n"
           "int8 quantize of fp32 at %s; scale bytes as %% of the int4 payload\n\n",
           count_text(ne, cb[0]), count_text(nt, cb[1]));
    printf("%7s %11s %11s %11s %11s %12s %10s\n", "group", "int8 sym", "int4 sym", "int8 asym",
           "int4 asym", "int8 q GB/s", "int4 ovh%");
    for (int g = 0; g < NSWEEP; g++) {
        for (int v = 0; v < 4; v++) {
            zr_quant_params p = {v % 2 ? 4 : 8, sweep[g], v >= 2 ? ZR_QUANT_ASYM : ZR_QUANT_SYM};
            err[g][v] = rms_rel_error(&p, b->x, ne, b->out, b->block);
        }
        zr_quant_params p = {8, sweep[g], ZR_QUANT_SYM};
        bench_ctx c = {b->x, b->xh, b->block, b->out, b->copy, nt};
        speed[g] = (double)(nt * 4) / time_op(&c, OP_QUANT, &p, ZR_DTYPE_F32, 7) / 1e9;
        printf("%7d %11.3e %11.3e %11.3e %11.3e %12.2f %10.3f\n", sweep[g], err[g][0], err[g][1],
               err[g][2], err[g][3], speed[g], 100.0 * 4.0 / (0.5 * sweep[g]));
    }
}

static void print_json(const quant_opts *o, const quant_speed *sp, double err[NSWEEP][4],
                       const double speed[NSWEEP])
{
    printf("{\"bench\":\"quant\",\"impl\":\"%s\",\"group\":%d,\"default_group\":%d,"
           "\"threads\":%d,\"results\":[",
           zr_quant_impl_name(zr_quant_get_impl()), o->group, ZR_QUANT_DEFAULT_GROUP, o->threads);
    for (int i = 0; i < sp->nrows; i++) {
        const bench_row *r = &sp->rows[i];
        printf("%s{\"op\":\"%s\",\"bits\":%d,\"dtype\":\"%s\",\"n\":%zu,\"gbps\":%.3f,"
               "\"memcpy_gbps\":%.3f,\"ratio\":%.3f,\"gbps_1thread\":%.3f}",
               i ? "," : "", r->op, r->bits, zr_dtype_name(r->dtype), r->n, r->gbps, r->memcpy_gbps,
               r->gbps / r->memcpy_gbps, r->gbps_1thread);
    }
    printf("],\"error\":[");
    for (int g = 0; g < NSWEEP; g++) {
        printf("%s{\"group\":%d,\"int8_sym\":%.4e,\"int4_sym\":%.4e,\"int8_asym\":%.4e,"
               "\"int4_asym\":%.4e,\"int8_quant_gbps\":%.3f}",
               g ? "," : "", sweep[g], err[g][0], err[g][1], err[g][2], err[g][3], speed[g]);
    }
    printf("],\"quant_int8_vs_memcpy\":%.3f,\"quant_int8_vs_1thread\":%.3f}\n", sp->headline,
           sp->headline_threads);
}

int zr_bench_quant(int argc, char **argv)
{
    quant_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc != 0) {
        return rc;
    }
    if (strcmp(o.device, "cpu") != 0) {
        size_t gpu_default = (size_t)64 << 20;
        return zr_bench_quant_cuda(o.device, o.json, o.sizes_given ? o.sizes : &gpu_default,
                                   o.sizes_given ? o.nsizes : 1, o.group, o.reps > 0 ? o.reps : 20);
    }
    zr_quant_params pq[2] = {{8, o.group, ZR_QUANT_SYM}, {4, o.group, ZR_QUANT_SYM}};
    /* a request this CPU or the codec cannot run is the caller's: exit 2 with the reason */
    if (zr_quant_set_impl(o.impl) != ZR_OK || zr_quant_params_check(&pq[0]) != ZR_OK) {
        fprintf(stderr, "zr bench quant: %s\n", zr_error_message());
        return 2;
    }
    quant_bufs b;
    bufs_alloc(&o, &b);
    ZR_TRY(zr_threads_set(o.threads), "bench quant");
    o.threads = zr_threads_get(); /* the pool may have started fewer */
    printf("zr bench quant: impl %s, group %d, %d thread%s (memcpy: 1), median of repetitions, "
           "GB/s of the uncompressed side\n\n",
           zr_quant_impl_name(zr_quant_get_impl()), o.group, o.threads, o.threads > 1 ? "s" : "");
    quant_speed sp;
    speed_table(&o, &b, pq, &sp);
    double err[NSWEEP][4], speed[NSWEEP];
    error_table(&b, err, speed);
    char cb[32];
    printf("\nquant_int8_vs_memcpy (fp32, %s): %.2f", count_text(o.sizes[o.nsizes - 1], cb),
           sp.headline);
    printf(o.threads > 1 ? "; quant_int8_vs_1thread at %d threads: %.2f\n" : "\n", o.threads,
           sp.headline_threads);
    if (o.json) {
        print_json(&o, &sp, err, speed);
    }
    bufs_free(&b);
    zr_quant_set_impl(ZR_QUANT_IMPL_AUTO);
    ZR_TRY(zr_threads_set(1), "bench quant");
    return 0;
}
