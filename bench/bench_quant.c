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

int zr_bench_quant(int argc, char **argv)
{
    int json = 0, group = ZR_QUANT_DEFAULT_GROUP, reps_arg = 0, threads = 1;
    size_t sizes[MAX_SIZES] = {1u << 20, 16u << 20, 64u << 20};
    int nsizes = 3;
    zr_quant_impl impl = ZR_QUANT_IMPL_AUTO;
    const char *device = "cpu";
    int sizes_given = 0, got;
    /* whole numbers in range, or the flag is named (atoi took "8x" for 8) */
    const zr_cli_int_flag nums[3] = {{"--group", &group, NULL, 32, 65536},
                                     {"--reps", &reps_arg, NULL, 1, 64},
                                     {"--threads", &threads, NULL, 1, ZR_POOL_MAX_THREADS}};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
            char buf[256];
            snprintf(buf, sizeof buf, "%s", argv[++i]);
            nsizes = 0;
            sizes_given = 1;
            for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
                if (nsizes == MAX_SIZES || strlen(argv[i]) >= sizeof buf ||
                    !zr_cli_size("quant", "--sizes", tok, 1, (double)(1ull << 32),
                                 &sizes[nsizes])) {
                    return usage();
                }
                nsizes++;
            }
            if (nsizes == 0) {
                return usage();
            }
        } else if (strcmp(argv[i], "--impl") == 0 && i + 1 < argc) {
            const char *s = argv[++i];
            static const char *const names[] = {"auto", "scalar", "avx2", "avx512"};
            int k = 0;
            while (k < 4 && strcmp(s, names[k]) != 0) {
                k++;
            }
            impl = (zr_quant_impl)k; /* the enum's order: auto, scalar, avx2, avx512 */
            if (k == 4) {
                fprintf(stderr,
                        "zr bench quant: --impl \"%.40s\" is not auto, scalar, avx2 or "
                        "avx512\n",
                        s);
                return usage();
            }
        } else if (i + 1 < argc &&
                   (got = zr_cli_int_flags("quant", nums, 3, argv[i], argv[i + 1])) != 0) {
            if (got < 0) {
                return usage();
            }
            i++;
        } else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
            device = argv[++i];
        } else {
            zr_cli_bad_arg("bench quant", argc, argv, i);
            return usage();
        }
    }
    if (strcmp(device, "cpu") != 0) {
        size_t gpu_default = (size_t)64 << 20;
        return zr_bench_quant_cuda(device, json, sizes_given ? sizes : &gpu_default,
                                   sizes_given ? nsizes : 1, group, reps_arg > 0 ? reps_arg : 20);
    }
    zr_quant_params p8 = {8, group, ZR_QUANT_SYM}, p4 = {4, group, ZR_QUANT_SYM};
    /* a request this CPU or the codec cannot run is the caller's: exit 2 with the reason */
    if (zr_quant_set_impl(impl) != ZR_OK || zr_quant_params_check(&p8) != ZR_OK) {
        fprintf(stderr, "zr bench quant: %s\n", zr_error_message());
        return 2;
    }

    size_t nmax = 0;
    for (int s = 0; s < nsizes; s++) {
        nmax = sizes[s] > nmax ? sizes[s] : nmax;
    }
    float *x, *out, *copy;
    zr_bf16 *xh;
    uint8_t *block;
    ZR_TRY(zr_alloc_at((void **)&x, nmax * 4, __FILE__, __LINE__), "out of memory");
    ZR_TRY(zr_alloc_at((void **)&xh, nmax * 2, __FILE__, __LINE__), "out of memory");
    ZR_TRY(zr_alloc_at((void **)&out, nmax * 4, __FILE__, __LINE__), "out of memory");
    ZR_TRY(zr_alloc_at((void **)&copy, nmax * 4, __FILE__, __LINE__), "out of memory");
    ZR_TRY(zr_alloc_at((void **)&block,
                       zr_quant_block_bytes(&(zr_quant_params){8, 32, ZR_QUANT_ASYM}, nmax),
                       __FILE__, __LINE__),
           "out of memory");
    fill_noise(x, nmax, 1);
    zr_bf16_from_f32_n(xh, x, nmax);

    ZR_TRY(zr_threads_set(threads), "bench quant");
    threads = zr_threads_get(); /* the pool may have started fewer */
    printf("zr bench quant: impl %s, group %d, %d thread%s (memcpy: 1), median of repetitions, "
           "GB/s of the uncompressed side\n\n",
           zr_quant_impl_name(zr_quant_get_impl()), group, threads, threads > 1 ? "s" : "");
    printf("%-10s %-5s %-5s %9s %10s %12s %9s%s\n", "op", "bits", "type", "elements", "GB/s",
           "memcpy GB/s", "x memcpy", threads > 1 ? "  x 1 thread" : "");
    bench_row rows[MAX_ROWS];
    char cb[2][32]; /* element counts as text */
    int nrows = 0;
    double headline = 0, headline_threads = 1;
    for (int s = 0; s < nsizes; s++) {
        size_t n = sizes[s];
        int reps = reps_arg > 0 ? reps_arg : n <= (1u << 20) ? 31 : n <= (16u << 20) ? 9 : 5;
        bench_ctx c = {x, xh, block, out, copy, n};
        double mc[2];
        for (int t = 0; t < 2; t++) {
            mc[t] = (double)(n * zr_dtype_size((zr_dtype)t)) /
                    time_op(&c, OP_MEMCPY, NULL, (zr_dtype)t, reps) / 1e9;
        }
        for (int op = OP_QUANT; op <= OP_DEQUANT; op++) {
            for (int bits = 8; bits >= 4; bits -= 4) {
                const zr_quant_params *p = bits == 8 ? &p8 : &p4;
                for (int t = 0; t < 2; t++) {
                    if (op == OP_DEQUANT) {
                        /* decode needs a block of these parameters */
                        ZR_TRY(zr_quant_encode(p, ZR_DTYPE_F32, x, n, 1.0f, NULL, block, NULL),
                               "bench quant");
                    }
                    double sec = time_op(&c, op, p, (zr_dtype)t, reps), sec1 = sec;
                    if (threads > 1) { /* the baseline: the same codec on one thread */
                        ZR_TRY(zr_threads_set(1), "bench quant");
                        sec1 = time_op(&c, op, p, (zr_dtype)t, reps);
                        ZR_TRY(zr_threads_set(threads), "bench quant");
                    }
                    bench_row *r = &rows[nrows++];
                    r->op = op == OP_QUANT ? "quantize" : "dequantize";
                    r->bits = bits;
                    r->dtype = (zr_dtype)t;
                    r->n = n;
                    r->gbps = (double)(n * zr_dtype_size((zr_dtype)t)) / sec / 1e9;
                    r->memcpy_gbps = mc[t];
                    r->gbps_1thread = (double)(n * zr_dtype_size((zr_dtype)t)) / sec1 / 1e9;
                    printf("%-10s int%-2d %-5s %9s %10.2f %12.2f %9.2f", r->op, bits,
                           zr_dtype_name(r->dtype), count_text(n, cb[0]), r->gbps, r->memcpy_gbps,
                           r->gbps / r->memcpy_gbps);
                    printf(threads > 1 ? "  %11.2f\n" : "\n", r->gbps / r->gbps_1thread);
                    if (op == OP_QUANT && bits == 8 && t == 0 && s == nsizes - 1) {
                        headline = r->gbps / r->memcpy_gbps;
                        headline_threads = r->gbps / r->gbps_1thread;
                    }
                }
            }
        }
    }

    /* group-size sweep: error on Gaussian data, int8 quantize speed, scale overhead */
    static const int sweep[] = {32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536};
    size_t ne = nmax < (4u << 20) ? nmax : (4u << 20);
    size_t nt = nmax < (16u << 20) ? nmax : (16u << 20);
    fill_gauss(x, ne, 2);
    printf("\nerror by group size: Gaussian data (%s elements), RMS error / RMS of data;\n"
           "int8 quantize of fp32 at %s; scale bytes as %% of the int4 payload\n\n",
           count_text(ne, cb[0]), count_text(nt, cb[1]));
    printf("%7s %11s %11s %11s %11s %12s %10s\n", "group", "int8 sym", "int4 sym", "int8 asym",
           "int4 asym", "int8 q GB/s", "int4 ovh%");
    double err[sizeof sweep / sizeof sweep[0]][4];
    double speed[sizeof sweep / sizeof sweep[0]];
    for (size_t g = 0; g < sizeof sweep / sizeof sweep[0]; g++) {
        for (int v = 0; v < 4; v++) {
            zr_quant_params p = {v % 2 ? 4 : 8, sweep[g], v >= 2 ? ZR_QUANT_ASYM : ZR_QUANT_SYM};
            err[g][v] = rms_rel_error(&p, x, ne, out, block);
        }
        zr_quant_params p = {8, sweep[g], ZR_QUANT_SYM};
        bench_ctx c = {x, xh, block, out, copy, nt};
        speed[g] = (double)(nt * 4) / time_op(&c, OP_QUANT, &p, ZR_DTYPE_F32, 7) / 1e9;
        printf("%7d %11.3e %11.3e %11.3e %11.3e %12.2f %10.3f\n", sweep[g], err[g][0], err[g][1],
               err[g][2], err[g][3], speed[g], 100.0 * 4.0 / (0.5 * sweep[g]));
    }
    printf("\nquant_int8_vs_memcpy (fp32, %s): %.2f", count_text(sizes[nsizes - 1], cb[0]),
           headline);
    printf(threads > 1 ? "; quant_int8_vs_1thread at %d threads: %.2f\n" : "\n", threads,
           headline_threads);

    if (json) {
        printf("{\"bench\":\"quant\",\"impl\":\"%s\",\"group\":%d,\"default_group\":%d,"
               "\"threads\":%d,\"results\":[",
               zr_quant_impl_name(zr_quant_get_impl()), group, ZR_QUANT_DEFAULT_GROUP, threads);
        for (int i = 0; i < nrows; i++) {
            printf("%s{\"op\":\"%s\",\"bits\":%d,\"dtype\":\"%s\",\"n\":%zu,\"gbps\":%.3f,"
                   "\"memcpy_gbps\":%.3f,\"ratio\":%.3f,\"gbps_1thread\":%.3f}",
                   i ? "," : "", rows[i].op, rows[i].bits, zr_dtype_name(rows[i].dtype), rows[i].n,
                   rows[i].gbps, rows[i].memcpy_gbps, rows[i].gbps / rows[i].memcpy_gbps,
                   rows[i].gbps_1thread);
        }
        printf("],\"error\":[");
        for (size_t g = 0; g < sizeof sweep / sizeof sweep[0]; g++) {
            printf("%s{\"group\":%d,\"int8_sym\":%.4e,\"int4_sym\":%.4e,\"int8_asym\":%.4e,"
                   "\"int4_asym\":%.4e,\"int8_quant_gbps\":%.3f}",
                   g ? "," : "", sweep[g], err[g][0], err[g][1], err[g][2], err[g][3], speed[g]);
        }
        printf("],\"quant_int8_vs_memcpy\":%.3f,\"quant_int8_vs_1thread\":%.3f}\n", headline,
               headline_threads);
    }
    zr_free(x);
    zr_free(xh);
    zr_free(out);
    zr_free(copy);
    zr_free(block);
    zr_quant_set_impl(ZR_QUANT_IMPL_AUTO);
    ZR_TRY(zr_threads_set(1), "bench quant");
    return 0;
}
