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
 * --seconds, timing each piece. Any piece slower than the fast ones is time
 * the core was not the thread's at full speed (another tenant of the host,
 * the hypervisor, the clock, an interrupt), since the work never changes. It
 * reports the fast piece (the 5th percentile over every thread, or the
 * calibration's fastest try where faster) in ms, which compares runs on one
 * machine, and per thread and over all: the mean piece over the fast one,
 * the share of the time spent in pieces at least 1.2x the fast one, and the
 * best and worst one-second windows' mean piece over the fast one (a burst
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

enum { NOISE_N = 1 << 14, NOISE_MAX_THREADS = 256, NOISE_MAX_SECONDS = 3600 };

/*
 * A thread keeps no list of its pieces (an hour on 256 cores would be 460
 * million of them): their times go into bins 1% apart from 10 us to 1.5 s,
 * count and seconds per bin, and into one-second windows.
 */
enum { NOISE_BINS = 1200 };
#define NOISE_BIN0 1e-5
#define NOISE_STEP 1.01

/* where the calibration's results go, so that its pieces are computed */
static volatile float noise_sink;

typedef struct worker {
    pthread_t th;
    double seconds, t0; /* run until t0 + seconds (zr_now) */
    long reps;          /* passes over the array per piece */
    long count[NOISE_BINS];
    double time[NOISE_BINS]; /* seconds of the pieces in each bin */
    float *a;                /* the array its pieces update (allocated by the main thread: zr's
                                accounting allocator is not for threads) */
    double *wsum;            /* per one-second window: seconds of its pieces, and how many */
    long *wn;
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

static int bin_of(double d)
{
    double b = d > NOISE_BIN0 ? floor(log(d / NOISE_BIN0) / log(NOISE_STEP)) : 0;
    return b < NOISE_BINS - 1 ? (int)b : NOISE_BINS - 1;
}

/* the lower edge of bin b, seconds */
static double bin_low(int b)
{
    return NOISE_BIN0 * pow(NOISE_STEP, b);
}

static void *run(void *arg)
{
    worker *w = arg;
    float *a = w->a;
    for (int i = 0; i < NOISE_N; i++) {
        a[i] = (float)i * 1e-6f;
    }
    double t;
    while ((t = zr_now() - w->t0) < w->seconds) {
        double s = zr_now();
        w->sink += piece(a, w->reps);
        double d = zr_now() - s;
        int b = bin_of(d), k = (int)t;
        w->count[b]++;
        w->time[b] += d;
        w->wsum[k] += d;
        w->wn[k]++;
    }
    return NULL;
}

/* What one thread (or all) measured, against the machine's fast piece. */
typedef struct noise_stats {
    long pieces;
    double mean, slow_share, worst_window, best_window; /* over fast */
} noise_stats;

/* The fast piece: the 5th percentile of every thread's pieces, to the bins' 1% (the work is the
   same on every core, and a core runs it that fast when nothing else takes it). */
static double fast_piece(const worker *w, int k)
{
    long n = 0, seen = 0;
    for (int t = 0; t < k; t++) {
        for (int b = 0; b < NOISE_BINS; b++) {
            n += w[t].count[b];
        }
    }
    for (int b = 0; b < NOISE_BINS; b++) {
        for (int t = 0; t < k; t++) {
            seen += w[t].count[b];
        }
        if (n > 0 && seen > n / 20) {
            return bin_low(b);
        }
    }
    return 0;
}

/* Workers w[0..k) against the fast piece; the one-second windows the run covered (9/10 of the
   last at least), per thread. */
static void stats_of(const worker *w, int k, double fast, noise_stats *o)
{
    memset(o, 0, sizeof *o);
    o->best_window = INFINITY;
    double total = 0, slow = 0;
    int slow_bin = bin_of(1.2 * fast);
    for (int t = 0; t < k && fast > 0; t++) {
        for (int b = 0; b < NOISE_BINS; b++) {
            o->pieces += w[t].count[b];
            total += w[t].time[b];
            slow += b >= slow_bin ? w[t].time[b] : 0;
        }
        for (int i = 0; i + 0.9 <= w[t].seconds; i++) {
            if (w[t].wn[i] > 0) {
                double m = w[t].wsum[i] / (double)w[t].wn[i] / fast;
                o->worst_window = fmax(o->worst_window, m);
                o->best_window = fmin(o->best_window, m);
            }
        }
    }
    o->mean = o->pieces > 0 ? total / (double)o->pieces / fast : 0;
    o->slow_share = total > 0 ? slow / total : 0;
    o->best_window = isfinite(o->best_window) ? o->best_window : 0;
}

static int usage(void)
{
    fprintf(stderr,
            "usage: zr bench noise [--json] [--seconds S (default 10)] [--threads N "
            "(default: one per online core, at most %d)]\n",
            NOISE_MAX_THREADS);
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
    /* a tenth of a second first: a core that was idle runs slower until its clock is up */
    for (double t0 = zr_now(); zr_now() - t0 < 0.1;) {
        noise_sink += piece(a, 10);
    }
    double best = INFINITY;
    for (int i = 0; i < 50; i++) {
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
        printf("{\"who\": \"%s\", \"pieces\": %ld, \"mean_over_fast\": %.3f, \"slow_share\": "
               "%.3f, \"best_window\": %.3f, \"worst_window\": %.3f}",
               who, s->pieces, s->mean, s->slow_share, s->best_window, s->worst_window);
    } else {
        printf("%-8s %7ld %10.2f %11.1f%% %12.2f %12.2f\n", who, s->pieces, s->mean,
               100 * s->slow_share, s->best_window, s->worst_window);
    }
}

/* Runs threads workers for seconds (each with its windows); *started: how many ran. */
static int run_workers(worker *w, int threads, double seconds, long reps, int *started)
{
    int rc = 0, nwin = (int)seconds + 1;
    for (int t = 0; t < threads; t++) {
        w[t].wsum = calloc((size_t)nwin, sizeof *w[t].wsum);
        w[t].wn = calloc((size_t)nwin, sizeof *w[t].wn);
        w[t].a = calloc(NOISE_N, sizeof *w[t].a);
        if (w[t].wsum == NULL || w[t].wn == NULL || w[t].a == NULL) {
            fprintf(stderr, "zr bench noise: no memory\n");
            return 1;
        }
    }
    double t0 = zr_now();
    for (*started = 0; *started < threads; (*started)++) {
        worker *x = &w[*started];
        x->seconds = seconds, x->t0 = t0, x->reps = reps;
        if (pthread_create(&x->th, NULL, run, x) != 0) {
            fprintf(stderr, "zr bench noise: cannot start thread %d\n", *started);
            rc = 1;
            break;
        }
    }
    for (int t = 0; t < *started; t++) {
        pthread_join(w[t].th, NULL);
    }
    return rc;
}

static void report(const worker *w, int started, double seconds, double fast, int json)
{
    noise_stats s;
    printf("zr bench noise: %d thread%s, %g s, each repeating the same arithmetic on its core's "
           "cache (no zr, no MPI), %.2f ms a piece when fast (the 5th percentile, or the "
           "calibration's fastest try where faster): a slower piece is time the core was not the "
           "thread's\n\n",
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
        printf("{\"bench\": \"noise\", \"threads\": %d, \"seconds\": %g, \"fast_piece_ms\": %.4f, "
               "\"all\": ",
               started, seconds, 1e3 * fast);
        print(&s, "all", 1);
        printf("}\n");
    }
}

int zr_bench_noise(int argc, char **argv)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int json = 0, threads = cores < 1                   ? 1
                            : cores > NOISE_MAX_THREADS ? NOISE_MAX_THREADS
                                                        : (int)cores;
    double seconds = 10;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (i + 1 < argc && strcmp(argv[i], "--seconds") == 0) {
            /* text that is not all a number is out of range (atof read "5x" as 5) */
            if (zr_cli_number("--seconds", argv[++i], 1, NOISE_MAX_SECONDS, 0, &seconds) != ZR_OK) {
                seconds = -1;
            }
        } else if (i + 1 < argc && strcmp(argv[i], "--threads") == 0) {
            double v;
            zr_status st = zr_cli_number("--threads", argv[++i], 1, NOISE_MAX_THREADS, 1, &v);
            threads = st == ZR_OK ? (int)v : -1;
        } else {
            zr_cli_bad_arg("bench noise", argc, argv, i);
            return usage();
        }
    }
    if (!(seconds >= 1 && seconds <= NOISE_MAX_SECONDS) || threads < 1 ||
        threads > NOISE_MAX_THREADS) {
        fprintf(stderr, "zr bench noise: --seconds is 1-%d, --threads 1-%d\n", NOISE_MAX_SECONDS,
                NOISE_MAX_THREADS);
        return 2;
    }
    worker *w = calloc((size_t)threads, sizeof *w);
    if (w == NULL) {
        fprintf(stderr, "zr bench noise: no memory\n");
        return 1;
    }
    double fast_cal = 0;
    long reps = calibrate_reps(&fast_cal);
    int started = 0;
    int rc = run_workers(w, threads, seconds, reps, &started);
    if (rc == 0) {
        /* where every core ran slow all along, the calibration's tries may have been faster */
        double fast = fast_piece(w, started);
        report(w, started, seconds, fast_cal > 0 && fast_cal < fast ? fast_cal : fast, json);
    }
    for (int t = 0; t < threads; t++) {
        free(w[t].wsum);
        free(w[t].wn);
        free(w[t].a);
    }
    free(w);
    return rc;
}
