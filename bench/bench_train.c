/*
 * bench_train.c - "zr bench train": training steps of the GPT through the
 * ZeRO engine in each ZeRO++ mode, on whatever layout mpirun gives (the
 * reference layout is 4 ranks as 2 emulated nodes: ZR_RANKS_PER_NODE=2).
 *
 * For ZeRO-3 bf16, +qwZ, +hpZ, +qgZ and all three: median step time,
 * tokens/s, the split into compute / exposed communication / optimizer, and
 * the intra- and inter-node bytes per step from zr's exact counters. The
 * ZeRO-3 row is the baseline measured in the same run.
 */
#include "../src/cli/cli.h"

#include "zr/data.h"
#include "zr/gpt_engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct mode {
    const char *name;
    int qwz, hpz, qgz;
} mode;

static const mode modes[] = {
    {"zero3_bf16", 0, 0, 0}, {"qwz", 1, 0, 0}, {"hpz", 0, 1, 0},
    {"qgz", 0, 0, 1},        {"zeropp", 1, 1, 1},
};
enum { NMODES = sizeof modes / sizeof modes[0] };

typedef struct row {
    double t_med, t_min, compute, comm, optim, tok_s, inter, intra, loss;
} row;

/* Is name one of the comma-separated modes in list? */
static int has_mode(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; p != NULL && *p != '\0';) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) {
            return 1;
        }
        p = end ? end + 1 : NULL;
    }
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static zr_status run_mode(zr_comm *c, const zr_dataset *data, const zr_gpt_config *cfg, int B,
                          int steps, const mode *md, row *out)
{
    int W = c->size[ZR_GROUP_WORLD], R = c->rank[ZR_GROUP_WORLD];
    zr_engine_config ec = zr_engine_config_default();
    ec.qwz = md->qwz;
    ec.hpz = md->hpz;
    ec.qgz = md->qgz;
    zr_gpt m;
    zr_gpt_specs sp;
    zr_engine e;
    zr_loader ld;
    ZR_CHECK(zr_gpt_init(&m, cfg, B, cfg->max_t));
    ZR_CHECK(zr_gpt_specs_init(&sp, cfg));
    ZR_CHECK(zr_engine_init(&e, c, &ec, sp.nunits, sp.units));
    ZR_CHECK(zr_gpt_engine_init_params(&e, &m, 1));
    ZR_CHECK(zr_loader_init(&ld, data, ZR_SPLIT_TRAIN, B, cfg->max_t, R, W));
    int *in = malloc(sizeof(int) * (size_t)B * cfg->max_t);
    int *tg = malloc(sizeof(int) * (size_t)B * cfg->max_t);
    double *t = malloc(sizeof(double) * (size_t)steps);
    if (in == NULL || tg == NULL || t == NULL) {
        ZR_FAIL(ZR_ERR_NOMEM, "out of memory");
    }
    double sum[6] = {0};
    int counted = 0;
    for (int s = -1; s < steps; s++) { /* step -1 warms up (and has no hpZ secondaries) */
        float local;
        zr_loader_next(&ld, in, tg);
        ZR_CHECK(zr_comm_barrier(c));
        ZR_CHECK(zr_gpt_engine_micro(&m, &e, in, tg, &local));
        zr_step_stats st;
        ZR_CHECK(zr_engine_step(&e, 1e-3f, &st));
        /* the slowest rank sets the pace; bytes are summed over ranks */
        double v[6] = {st.t_total - st.t_comm - st.t_optim, st.t_comm, st.t_optim, 0, 0, local};
        for (int k = 0; k < ZR_KIND_COUNT; k++) {
            v[3] += (double)st.traffic.kind[k].bytes_inter;
            v[4] += (double)st.traffic.kind[k].bytes_intra;
        }
        double tmax = st.t_total;
        MPI_Allreduce(MPI_IN_PLACE, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        ZR_CHECK(zr_comm_allreduce_sum_f64(c, ZR_GROUP_WORLD, v, 6));
        if (s >= 0) {
            t[s] = tmax;
            for (int k = 0; k < 6; k++) {
                sum[k] += v[k];
            }
            counted++;
        }
    }
    qsort(t, (size_t)steps, sizeof(double), cmp_double);
    out->t_med = t[steps / 2];
    out->t_min = t[0];
    out->compute = sum[0] / W / counted;
    out->comm = sum[1] / W / counted;
    out->optim = sum[2] / W / counted;
    out->inter = sum[3] / counted;
    out->intra = sum[4] / counted;
    out->loss = sum[5] / W / counted;
    out->tok_s = (double)W * B * cfg->max_t / out->t_med;
    free(in);
    free(tg);
    free(t);
    zr_engine_free(&e);
    zr_gpt_specs_free(&sp);
    zr_gpt_free(&m);
    return ZR_OK;
}

int zr_bench_train(int argc, char **argv)
{
    int json = 0, steps = 10, layers = 4, channels = 256, heads = 4, T = 128, B = 4;
    const char *only = NULL; /* comma list of modes to run; NULL = all */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
            steps = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--layers") == 0 && i + 1 < argc) {
            layers = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--channels") == 0 && i + 1 < argc) {
            channels = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--seq") == 0 && i + 1 < argc) {
            T = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--heads") == 0 && i + 1 < argc) {
            heads = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--micro-batch") == 0 && i + 1 < argc) {
            B = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--modes") == 0 && i + 1 < argc) {
            only = argv[++i];
        } else {
            fprintf(stderr, "usage: mpirun -np N zr bench train [--json] [--steps N] [--layers L] "
                            "[--channels C] [--heads H] [--seq T] [--micro-batch B]\n"
                            "       [--modes zero3_bf16,qwz,hpz,qgz,zeropp]\n");
            return 2;
        }
    }
    if (steps < 1) {
        steps = 1;
    }
    MPI_Init(&argc, &argv);
    zr_comm c;
    ZR_TRY(zr_comm_init(&c, MPI_COMM_WORLD, NULL), "check ZR_RANKS_PER_NODE");
    zr_gpt_set_threads(1);
    zr_dataset data;
    ZR_TRY(zr_comm_agree(&c, zr_dataset_load_fortunes(&data, NULL)), "run make setup");
    zr_gpt_config cfg = {T, data.vocab, (int)zr_round_up((size_t)data.vocab, 128), layers, heads,
                         channels};
    int R = c.rank[ZR_GROUP_WORLD];
    char desc[256];
    zr_comm_describe(&c, desc, sizeof desc);
    if (R == 0) {
        printf("zr bench train: %s; GPT L=%d C=%d T=%d, %zu parameters, micro-batch %d per rank, "
               "%d steps per mode (median)\n\n",
               desc, layers, channels, T, zr_gpt_config_param_count(&cfg), B, steps);
        printf("%-11s %9s %9s %9s %9s %8s %8s %11s %11s %9s\n", "mode", "step ms", "min ms",
               "tok/s", "compute", "comm", "optim", "inter MB", "intra MB", "mean loss");
    }
    row rows[NMODES];
    int ran[NMODES] = {0};
    for (int i = 0; i < NMODES; i++) {
        if (only != NULL && !has_mode(only, modes[i].name)) {
            continue;
        }
        ran[i] = 1;
        ZR_TRY(run_mode(&c, &data, &cfg, B, steps, &modes[i], &rows[i]), "");
        row *r = &rows[i];
        if (R == 0) {
            printf("%-11s %9.1f %9.1f %9.0f %9.1f %8.1f %8.1f %11.3f %11.3f %9.4f\n", modes[i].name,
                   1e3 * r->t_med, 1e3 * r->t_min, r->tok_s, 1e3 * r->compute, 1e3 * r->comm,
                   1e3 * r->optim, r->inter / 1e6, r->intra / 1e6, r->loss);
            fflush(stdout);
        }
    }
    if (R == 0) {
        printf("\n(inter/intra MB: bytes per step summed over all ranks, from zr's exact counters;"
               " compute/comm/optim: ms per step averaged over ranks)\n");
        int both = ran[0] && ran[NMODES - 1];
        double ratio = both && rows[0].inter > 0 ? rows[NMODES - 1].inter / rows[0].inter : 0.0;
        double speedup = both ? rows[NMODES - 1].tok_s / rows[0].tok_s : 0.0;
        if (both) {
            printf("ZeRO++ inter-node bytes per step / ZeRO-3 bf16: %.3f; throughput ZeRO++ / "
                   "ZeRO-3: %.2fx\n",
                   ratio, speedup);
        }
        if (json) {
            printf("{\"bench\": \"train\", \"ranks\": %d, \"nodes\": %d, \"steps\": %d",
                   c.size[ZR_GROUP_WORLD], c.n_nodes, steps);
            if (both) {
                printf(", \"inter_bytes_ratio_zeropp\": %.4f, \"speedup_zeropp\": %.3f", ratio,
                       speedup);
            }
            printf(", \"modes\": {");
            for (int i = 0, first = 1; i < NMODES; i++) {
                if (!ran[i]) {
                    continue;
                }
                printf("%s\"%s\": {\"step_ms\": %.3f, \"tokens_per_s\": %.1f, \"inter_bytes\": %.0f, "
                       "\"intra_bytes\": %.0f, \"compute_ms\": %.3f, \"comm_ms\": %.3f, "
                       "\"min_step_ms\": %.3f, \"optim_ms\": %.3f, \"mean_loss\": %.5f}",
                       first ? "" : ", ", modes[i].name, 1e3 * rows[i].t_med, rows[i].tok_s,
                       rows[i].inter, rows[i].intra, 1e3 * rows[i].compute, 1e3 * rows[i].comm,
                       1e3 * rows[i].t_min, 1e3 * rows[i].optim, rows[i].loss);
                first = 0;
            }
            printf("}}\n");
        }
    }
    zr_dataset_free(&data);
    zr_comm_free(&c);
    MPI_Finalize();
    return 0;
}
