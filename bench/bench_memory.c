/*
 * bench_memory.c - "zr bench memory": what one rank of GPT training really
 * holds, as the operating system counts it, next to what zr says it needs.
 *
 * Each rank trains a GPT (synthetic tokens, V = 256) for a few steps through
 * the ZeRO engine and reads its own peak resident set at exit (getrusage's
 * ru_maxrss, the kernel's VmHWM); the table shows the maximum over ranks
 * beside the formula
 *
 *     model state   optimizer (fp32 master, Adam m, v) + gradients + working
 *                   parameters + hpZ secondary, as the engine's plan holds them
 *   + activations   the model's arena for one micro-batch (smaller with
 *                   activation checkpointing)
 *   + engine pool   gathered units, gradients in flight with their staging and
 *                   the collectives' workspaces: bounded by
 *                   stage3_max_live_parameters / stage3_prefetch_bucket_size and
 *                   reduce_bucket_size, decided in the first step
 *   + allowance     a fixed 64 MB for the program, MPI and OpenBLAS, the same
 *                   for every model size and rank count
 *
 * and rss / formula. zr's own counted peak and the call sites holding the
 * most at that peak (rank 0) show where the bytes go. Benchmarks never
 * assert; bench/memory/run.sh collects the runs.
 */
#define _DEFAULT_SOURCE /* getrusage */

#include "../src/cli/cli.h"

#include "zr/gpt_engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

/* Program text and libraries, MPI's shared-memory segments and OpenBLAS's
 * GEMM buffer: 17-20 MB per rank measured with a tiny model, up to ~25 MB more
 * with large matrices (bench/memory/README.md). The same figure as zr train's
 * start-up prediction. */
#define ALLOWANCE_BYTES ZR_MEM_ALLOWANCE

typedef struct opts {
    int json, steps, layers, channels, heads, T, B, stage, hpz, qwz, qgz, overlap, recompute;
    int sites;
    long long max_live, prefetch, reduce_bucket;
} opts;

static int usage(void)
{
    fprintf(stderr,
            "usage: mpirun -np N zr bench memory [--json] [--steps N] [--layers L] [--channels C]\n"
            "       [--heads H] [--seq T] [--micro-batch B] [--stage S] [--hpz] [--qwz] [--qgz]\n"
            "       [--no-overlap] [--max-live N] [--prefetch-bucket N] [--reduce-bucket N]\n"
            "       [--checkpoint] [--sites K]\n");
    return 2;
}

static size_t peak_rss_bytes(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) {
        return 0;
    }
    return (size_t)ru.ru_maxrss * 1024; /* Linux: kilobytes */
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

typedef struct result {
    size_t state, acts, pool, zr_peak, predicted;
    double step_s;
} result;

static zr_status run(zr_comm *c, const opts *o, const zr_gpt_config *cfg, result *out)
{
    int R = c->rank[ZR_GROUP_WORLD];
    zr_engine_config ec = zr_engine_config_default();
    ec.stage = o->stage;
    ec.hpz = o->hpz;
    ec.qwz = o->qwz;
    ec.qgz = o->qgz;
    ec.overlap = o->overlap;
    ec.max_live = (size_t)o->max_live;
    ec.prefetch_bucket = (size_t)o->prefetch;
    ec.reduce_bucket = (size_t)o->reduce_bucket;
    zr_gpt m;
    zr_gpt_specs sp;
    zr_engine e;
    int *in = NULL, *tg = NULL;
    size_t BT = (size_t)o->B * (size_t)o->T;
    memset(&e, 0, sizeof e);
    memset(&sp, 0, sizeof sp);
    zr_status st = zr_gpt_init_ex(&m, cfg, o->B, o->T, o->recompute);
    if (st == ZR_OK) {
        st = zr_gpt_specs_init(&sp, cfg);
    }
    if (st == ZR_OK) {
        st = zr_alloc_at((void **)&in, 2 * BT * sizeof(int), __FILE__, __LINE__);
    }
    ZR_CHECK_GOTO(zr_comm_agree(c, st), st, done);
    tg = in + BT;
    ZR_CHECK_GOTO(zr_engine_init(&e, c, &ec, sp.nunits, sp.units), st, done);
    ZR_CHECK_GOTO(zr_comm_agree(c, zr_gpt_engine_init_params(&e, &m.cfg, 1)), st, done);
    zr_memory mem = zr_engine_memory(&e);
    out->state = mem.optim + mem.grads + mem.params + mem.secondary;
    out->acts = zr_gpt_activation_bytes(&m);
    zr_gpt_memory_prediction pr;
    ZR_CHECK_GOTO(zr_gpt_engine_predict(cfg, o->B, o->T, o->recompute, &ec, c, &pr), st, done);
    out->predicted = pr.total;
    zr_gpt_run run = zr_gpt_run_host(&m);
    uint64_t seed = 0x9e3779b97f4a7c15ull ^ (uint64_t)(R + 1);
    double t_sum = 0;
    for (int s = 0; s < o->steps; s++) {
        for (size_t i = 0; i < BT; i++) {
            in[i] = (int)(rng_next(&seed) % (uint64_t)cfg->vocab);
            tg[i] = (int)(rng_next(&seed) % (uint64_t)cfg->vocab);
        }
        double t0 = zr_now();
        float loss;
        zr_step_stats sst;
        ZR_CHECK_GOTO(zr_gpt_engine_micro(&run, &e, in, tg, &loss), st, done);
        ZR_CHECK_GOTO(zr_engine_step(&e, 1e-4f, &sst), st, done);
        t_sum += zr_now() - t0;
    }
    out->step_s = t_sum / o->steps;
    out->pool = zr_engine_memory(&e).pool_peak;
    out->zr_peak = zr_mem_peak();
done:
    zr_engine_free(&e);
    zr_gpt_specs_free(&sp);
    zr_gpt_free(&m);
    zr_free(in);
    return st;
}

static int parse(int argc, char **argv, opts *o)
{
    *o = (opts){0, 1, 12, 768, 12, 64, 1, 3, 0, 0, 0, 1, 0, 8, 0, 0, 0};
    zr_engine_config d = zr_engine_config_default();
    o->max_live = (long long)d.max_live;
    o->prefetch = (long long)d.prefetch_bucket;
    o->reduce_bucket = (long long)d.reduce_bucket;
    /* the whole-number flags (atoi read "8x" as 8 and "x" as 0) */
    const zr_cli_int_flag f[] = {
        {"--steps", &o->steps, NULL, 1, 1e6},
        {"--layers", &o->layers, NULL, 1, 1 << 16},
        {"--channels", &o->channels, NULL, 1, 1 << 20},
        {"--heads", &o->heads, NULL, 1, 1 << 16},
        {"--seq", &o->T, NULL, 1, 1 << 24},
        {"--micro-batch", &o->B, NULL, 1, 1 << 20},
        {"--stage", &o->stage, NULL, 0, 3},
        {"--sites", &o->sites, NULL, 0, 64},
        {"--max-live", NULL, &o->max_live, 1, 1e15},
        {"--prefetch-bucket", NULL, &o->prefetch, 0, 1e15},
        {"--reduce-bucket", NULL, &o->reduce_bucket, 1, 1e15},
    };
    int got;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (strcmp(a, "--json") == 0) {
            o->json = 1;
        } else if (strcmp(a, "--hpz") == 0) {
            o->hpz = 1;
        } else if (strcmp(a, "--qwz") == 0) {
            o->qwz = 1;
        } else if (strcmp(a, "--qgz") == 0) {
            o->qgz = 1;
        } else if (strcmp(a, "--no-overlap") == 0) {
            o->overlap = 0;
        } else if (strcmp(a, "--checkpoint") == 0) {
            o->recompute = 1;
        } else if (has && (got = zr_cli_int_flags("memory", f, sizeof f / sizeof f[0], a,
                                                  argv[i + 1])) != 0) {
            if (got < 0) {
                return usage();
            }
            i++;
        } else {
            zr_cli_bad_arg("bench memory", argc, argv, i);
            return usage();
        }
    }
    if (o->steps < 1 || o->B < 1 || o->T < 1 || o->max_live < 1 || o->prefetch < 0 ||
        o->reduce_bucket < 1 || o->sites < 0 || o->sites > 64) {
        return usage();
    }
    return 0;
}

int zr_bench_memory(int argc, char **argv)
{
    opts o;
    int rc = parse(argc, argv, &o);
    if (rc != 0) {
        return rc;
    }
    MPI_Init(&argc, &argv);
    zr_comm c;
    ZR_TRY(zr_comm_init(&c, MPI_COMM_WORLD, NULL), "check ZR_RANKS_PER_NODE");
    zr_gpt_set_threads(1);
    int R = c.rank[ZR_GROUP_WORLD], W = c.size[ZR_GROUP_WORLD];
    zr_gpt_config cfg = {o.T, 256, 256, o.layers, o.heads, o.channels};
    result r;
    memset(&r, 0, sizeof r);
    ZR_TRY(run(&c, &o, &cfg, &r), "zr bench memory --help lists the options");

    /* every rank's numbers, reduced to the worst rank */
    double v[7] = {(double)peak_rss_bytes(), (double)r.state, (double)r.acts,     (double)r.pool,
                   (double)r.zr_peak,        r.step_s,        (double)r.predicted};
    MPI_Allreduce(MPI_IN_PLACE, v, 7, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    zr_mem_site sites[64];
    int nsites = zr_mem_sites(sites, o.sites, 1);
    if (R == 0) {
        double formula = v[1] + v[2] + v[3] + (double)ALLOWANCE_BYTES;
        double ratio = v[0] / formula;
        char desc[256];
        zr_comm_describe(&c, desc, sizeof desc);
        size_t P = zr_gpt_config_param_count(&cfg);
        printf("zr bench memory: %s; GPT L=%d C=%d T=%d B=%d, %zu parameters, stage %d%s%s%s%s, "
               "%d step(s)\n",
               desc, o.layers, o.channels, o.T, o.B, P, o.stage, o.hpz ? " +hpZ" : "",
               o.qwz ? " +qwZ" : "", o.qgz ? " +qgZ" : "",
               o.recompute ? ", activation checkpointing" : "", o.steps);
        printf("  peak RSS per rank (OS, max over ranks) %10.1f MB\n", v[0] / 1e6);
        printf("  formula                                %10.1f MB = model state %.1f + "
               "activations %.1f + engine pool %.1f + allowance %.1f\n",
               formula / 1e6, v[1] / 1e6, v[2] / 1e6, v[3] / 1e6, (double)ALLOWANCE_BYTES / 1e6);
        printf("  rss / formula                          %10.3f\n", ratio);
        printf("  predicted at start-up (zr train)       %10.1f MB (engine pool bounded from the "
               "budgets)\n",
               v[6] / 1e6);
        printf("  zr counted peak (max over ranks)       %10.1f MB; step %.2f s\n", v[4] / 1e6,
               v[5]);
        if (nsites > 0) {
            printf("  at the counted peak, rank 0 (bytes by allocation site):\n");
            for (int i = 0; i < nsites; i++) {
                printf("    %10.1f MB %5zu blocks  %s:%d\n", (double)sites[i].bytes / 1e6,
                       sites[i].blocks, sites[i].file, sites[i].line);
            }
        }
        if (o.json) {
            printf("{\"bench\": \"memory\", \"ranks\": %d, \"nodes\": %d, \"params\": %zu, "
                   "\"layers\": %d, \"channels\": %d, \"seq\": %d, \"micro_batch\": %d, "
                   "\"stage\": %d, \"hpz\": %d, \"qwz\": %d, \"qgz\": %d, \"checkpoint\": %d, "
                   "\"steps\": %d, \"rss_peak_bytes\": %.0f, \"state_bytes\": %.0f, "
                   "\"activation_bytes\": %.0f, \"pool_peak_bytes\": %.0f, "
                   "\"allowance_bytes\": %zu, \"formula_bytes\": %.0f, \"rss_over_formula\": %.4f, "
                   "\"zr_peak_bytes\": %.0f, \"step_s\": %.4f, \"predicted_bytes\": %.0f}\n",
                   W, c.n_nodes, P, o.layers, o.channels, o.T, o.B, o.stage, o.hpz, o.qwz, o.qgz,
                   o.recompute, o.steps, v[0], v[1], v[2], v[3], ALLOWANCE_BYTES, formula, ratio,
                   v[4], v[5], v[6]);
        }
        fflush(stdout);
    }
    zr_comm_free(&c);
    MPI_Finalize();
    return 0;
}
