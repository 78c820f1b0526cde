/*
 * bench_noise.c - "zr bench noise": how steady the machine itself is, with
 * nothing of zr's running: no MPI, no BLAS, no memory traffic beyond a core's
 * own cache.
 *
 * Every other benchmark compares two things measured in the same run, and
 * the comparison is only as good as the machine's steadiness over the run.
 * On the 2-core VM of bench/cluster/README.md a launch of one configuration
 * varied 10-15% from the next; this says how much of that is the machine:
 * one thread per core (or --threads N) repeats a fixed piece of arithmetic
 * (an update of a 64 KB array, about 2 ms, the same work every time) for
 * --seconds, timing each piece. Any piece slower than the fastest ones is
 * time the core was not the thread's (another tenant of the host, the
 * hypervisor, an interrupt), since the work never changes. It reports per
 * thread and over all: the median piece, the 90th percentile over the
 * median, the share of the time spent in pieces at least 1.2x the median,
 * and the worst one-second window's mean piece over the median (a burst
 * that would slow a whole training step). Benchmarks never assert.
 */
#define _POSIX_C_SOURCE 200809L

#include "../src/cli/cli.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { NOISE_N = 1 << 14, NOISE_MAX_THREADS = 256 };

/* where the calibration's results go, so that its pieces are computed */
static volatile float noise_sink;

typedef struct worker {
    pthread_t th;
    double seconds, t0; /* run until t0 + seconds (zr_now) */
    long reps;          /* passes over the array per piece */
    double *start, *dur;
    int n, cap;
    zr_status st;
    float sink;
} worker;

/* One piece: reps passes of a dependent update over a cache-resident array. */
__attribute__((noinline)) static float piece(float *a, long reps)
{
    for (long r = 0; r < reps; r++) {
        for (int i = 0; i < NOISE_N; i++) {
            a[i] = a[i] * 0.999f + 1.0f;
        }
    }
    return a[NOISE_N / 3];
}

static void *run(void *arg)
{
    worker *w = arg;
    float *a = NULL;
    w->st = ZR_ALLOC_STATUS(a, NOISE_N);
    for (int i = 0; w->st == ZR_OK && i < NOISE_N; i++) {
        a[i] = (float)i * 1e-6f;
    }
    while (w->st == ZR_OK && zr_now() - w->t0 < w->seconds) {
        if (w->n == w->cap) {
            int cap = w->cap ? 2 * w->cap : 1024;
            double *s = realloc(w->start, (size_t)cap * sizeof *s);
            double *d = s != NULL ? realloc(w->dur, (size_t)cap * sizeof *d) : NULL;
            w->start = s != NULL ? s : w->start;
            w->dur = d != NULL ? d : w->dur;
            if (s == NULL || d == NULL) {
                w->st = zr_error_at(ZR_ERR_NOMEM, __FILE__, __LINE__, "zr bench noise: no memory");
                break;
            }
            w->cap = cap;
        }
        double s = zr_now();
        w->sink += piece(a, w->reps);
        w->start[w->n] = s - w->t0;
        w->dur[w->n++] = zr_now() - s;
    }
    zr_free(a);
    return NULL;
}

/* What one thread (or all) measured, against the machine's fast piece. */
typedef struct noise_stats {
    int pieces;
    double mean, slow_share, worst_window, best_window; /* over fast */
} noise_stats;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The fast piece: the 5th percentile of every thread's pieces (the work is the same on every
   core, and a core runs it that fast when nothing else takes it). */
static zr_status fast_piece(const worker *w, int k, double *fast)
{
    int n = 0;
    for (int t = 0; t < k; t++) {
        n += w[t].n;
    }
    double *v = NULL;
    ZR_ALLOC(v, n > 0 ? (size_t)n : 1);
    for (int t = 0, m = 0; t < k; t++) {
        memcpy(v + m, w[t].dur, (size_t)w[t].n * sizeof *v);
        m += w[t].n;
    }
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    *fast = n > 0 ? v[n / 20] : 0;
    zr_free(v);
    return ZR_OK;
}

/* Workers w[0..k) against the fast piece; windows of one second, per thread. */
static void stats_of(const worker *w, int k, double fast, noise_stats *o)
{
    memset(o, 0, sizeof *o);
    o->best_window = INFINITY;
    double total = 0, slow = 0;
    for (int t = 0; t < k && fast > 0; t++) {
        double wsum = 0;
        int wn = 0, win = 0;
        for (int i = 0; i <= w[t].n; i++) {
            /* a window closes at the next second's first piece, or at the end (if it ran a
               whole second: the last one is cut short by the end of the run) */
            int next = i < w[t].n ? (int)w[t].start[i] : -1;
            if (next != win && wn > 0) {
                if (next >= 0 || w[t].start[i - 1] - win > 0.9) {
                    o->worst_window = fmax(o->worst_window, wsum / wn / fast);
                    o->best_window = fmin(o->best_window, wsum / wn / fast);
                }
                win = next, wsum = 0, wn = 0;
            }
            if (i == w[t].n) {
                break;
            }
            double x = w[t].dur[i];
            total += x;
            slow += x >= 1.2 * fast ? x : 0;
            wsum += x, wn++;
            o->pieces++;
        }
    }
    o->mean = o->pieces > 0 ? total / o->pieces / fast : 0;
    o->slow_share = total > 0 ? slow / total : 0;
    o->best_window = isfinite(o->best_window) ? o->best_window : 0;
}

static int usage(void)
{
    fprintf(stderr, "usage: zr bench noise [--json] [--seconds S (default 10)] [--threads N "
                    "(default: one per online core)]\n");
    return 2;
}

/* Passes per piece for about 2 ms on this core (the fastest of a few tries); *fast: the
   piece's time at that speed. */
static long calibrate_reps(double *fast)
{
    float *a = NULL;
    if (ZR_ALLOC_STATUS(a, NOISE_N) != ZR_OK) {
        return 1;
    }
    memset(a, 0, NOISE_N * sizeof *a);
    double best = INFINITY;
    for (int i = 0; i < 20; i++) {
        double s = zr_now();
        noise_sink += piece(a, 10);
        best = fmin(best, zr_now() - s);
    }
    zr_free(a);
    long reps = best > 0 ? (long)(2e-3 / (best / 10)) : 100;
    reps = reps < 1 ? 1 : reps;
    *fast = best * (double)reps / 10;
    return reps;
}

static void print(const noise_stats *s, const char *who, int json)
{
    if (json) {
        printf("{\"who\": \"%s\", \"pieces\": %d, \"mean_over_fast\": %.3f, \"slow_share\": "
               "%.3f, \"best_window\": %.3f, \"worst_window\": %.3f}",
               who, s->pieces, s->mean, s->slow_share, s->best_window, s->worst_window);
    } else {
        printf("%-8s %7d %10.2f %11.1f%% %12.2f %12.2f\n", who, s->pieces, s->mean,
               100 * s->slow_share, s->best_window, s->worst_window);
    }
}

int zr_bench_noise(int argc, char **argv)
{
    int json = 0, threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    double seconds = 10;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (i + 1 < argc && strcmp(argv[i], "--seconds") == 0) {
            seconds = atof(argv[++i]);
        } else if (i + 1 < argc && strcmp(argv[i], "--threads") == 0) {
            threads = atoi(argv[++i]);
        } else {
            return usage();
        }
    }
    if (!(seconds >= 1 && seconds <= 3600) || threads < 1 || threads > NOISE_MAX_THREADS) {
        fprintf(stderr, "zr bench noise: --seconds is 1-3600, --threads 1-%d\n", NOISE_MAX_THREADS);
        return 2;
    }
    worker *w = calloc((size_t)threads, sizeof *w);
    if (w == NULL) {
        fprintf(stderr, "zr bench noise: no memory\n");
        return 1;
    }
    double fast_cal = 0;
    long reps = calibrate_reps(&fast_cal);
    double t0 = zr_now();
    int started = 0, rc = 0;
    for (; started < threads; started++) {
        w[started] = (worker){.seconds = seconds, .t0 = t0, .reps = reps};
        if (pthread_create(&w[started].th, NULL, run, &w[started]) != 0) {
            fprintf(stderr, "zr bench noise: cannot start thread %d\n", started);
            rc = 1;
            break;
        }
    }
    for (int t = 0; t < started; t++) {
        pthread_join(w[t].th, NULL);
        if (w[t].st != ZR_OK && rc == 0) {
            fprintf(stderr, "%s\n", zr_error_message());
            rc = 1;
        }
    }
    double fast = 0;
    if (rc == 0 && fast_piece(w, started, &fast) != ZR_OK) {
        fprintf(stderr, "%s\n", zr_error_message());
        rc = 1;
    }
    /* where every core ran slow all along, the calibration's tries may have been faster */
    fast = fast_cal > 0 && fast_cal < fast ? fast_cal : fast;
    if (rc == 0) {
        noise_stats s;
        printf("zr bench noise: %d thread%s, %.0f s, each repeating the same arithmetic on its "
               "core's cache (no zr, no MPI), %.2f ms a piece when fast (the 5th percentile, or "
               "the calibration's fastest try where faster): a "
               "slower piece is time the core was not the thread's\n\n",
               started, started == 1 ? "" : "s", seconds, 1e3 * fast);
        printf("thread    pieces  mean/fast  time >=1.2x  best 1-s/fast  worst 1-s/fast\n");
        for (int t = 0; t < started; t++) {
            char who[16];
            snprintf(who, sizeof who, "%d", t);
            stats_of(&w[t], 1, fast, &s);
            print(&s, who, 0);
        }
        stats_of(w, started, fast, &s);
        print(&s, "all", 0);
        if (json) {
            printf("{\"bench\": \"noise\", \"threads\": %d, \"seconds\": %.0f, \"fast_piece_ms\": "
                   "%.4f, \"all\": ",
                   started, seconds, 1e3 * fast);
            print(&s, "all", 1);
            printf("}\n");
        }
    }
    for (int t = 0; t < threads; t++) {
        free(w[t].start);
        free(w[t].dur);
    }
    free(w);
    return rc;
}
