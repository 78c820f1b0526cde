/*
 * bench_train.c - "zr bench train": training steps of the GPT through the
 * ZeRO engine in each ZeRO++ mode, on whatever layout mpirun gives (the
 * reference layout is 4 ranks as 2 emulated nodes: ZR_RANKS_PER_NODE=2).
 *
 * For ZeRO-3 bf16, +qwZ, +hpZ, +qgZ and all three: median step time,
 * tokens/s, the split into compute / exposed communication / optimizer, and
 * the intra- and inter-node bytes per step from zr's exact counters. The
 * ZeRO-3 row is the baseline measured in the same run. --device cuda (or
 * auto) trains on the GPUs (zr.device), the CPU by default.
 */
#include "../src/cli/cli.h"

#include "zr/pool.h"
#include "zr/trainer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct mode {
    const char *name;
    int qwz, hpz, qgz;
} mode;

static const mode modes[] = {
    {"zero3_bf16", 0, 0, 0}, {"qwz", 1, 0, 0},    {"hpz", 0, 1, 0},
    {"qgz", 0, 0, 1},        {"zeropp", 1, 1, 1}, {"config", 0, 0, 0},
};
/* "config" runs only with --config FILE: whatever the file says (zr plan --write-config) */
enum { NMODES = sizeof modes / sizeof modes[0], ZEROPP = 4, CONFIG = 5 };

typedef struct row {
    double t_med, t_min, compute, comm, optim, tok_s, inter, intra, loss;
    double rss;   /* peak resident bytes, max over ranks */
    double alloc; /* peak bytes zr allocated (zr_mem_peak), max over ranks */
    double pool;  /* the engine's pool at its peak, max over ranks */
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

/* The shape every mode trains. */
typedef struct shape {
    int layers, channels, heads, T, B;
} shape;

/* The configuration of one mode: the bench's shape, ZeRO-3 with the mode's switches. */
static zr_status mode_config(const shape *sh, const mode *md, int W, zr_train_config *cfg)
{
    zr_config_defaults(cfg);
    cfg->stage = 3;
    cfg->layers = sh->layers;
    cfg->channels = sh->channels;
    cfg->heads = sh->heads;
    cfg->seq_len = sh->T;
    cfg->max_seq_len = sh->T;
    cfg->train_micro_batch_size_per_gpu = sh->B;
    cfg->gradient_accumulation_steps = 1;
    cfg->train_batch_size = 0;
    cfg->lr = 1e-3;
    cfg->zero_quantized_weights = md->qwz;
    cfg->zero_hpz_partition_size = md->hpz ? 0 : 1; /* 0: the node */
    cfg->zero_quantized_gradients = md->qgz;
    return zr_config_finalize(cfg, W);
}

/* A config file (zr plan --write-config) as the "config" mode: its shape, batch and sharding. */
static zr_status file_config(const char *path, int W, zr_train_config *cfg)
{
    zr_config_defaults(cfg);
    ZR_CHECK(zr_config_load_json(cfg, path, NULL, NULL));
    cfg->checkpoint_dir[0] = '\0';
    cfg->metrics_path[0] = '\0';
    cfg->resume = 0;
    cfg->resume_from[0] = '\0';
    cfg->init_path[0] = '\0';
    return zr_config_finalize(cfg, W);
}

/* Peak resident bytes of this process (VmHWM), 0 where /proc has none. */
static double rss_peak(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = 0;
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, "VmHWM:", 6) == 0) {
            kb = atof(line + 6);
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    return kb * 1024.0;
}

/*
 * One mode through the library's trainer (the loop zr train runs): steps + 1
 * steps of which the first warms up (and has no hpZ secondaries yet).
 */
static zr_status run_mode(zr_train_config *cfg, int steps, int threads, row *out)
{
    int W;
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    cfg->train_steps = steps + 1;
    cfg->val_every = 0;
    cfg->steps_per_print = cfg->train_steps;
    cfg->scheduler_type[0] = '\0';
    cfg->seed = 1;
    cfg->threads = threads;
    static zr_trainer t;
    zr_status st = zr_trainer_init(&t, MPI_COMM_WORLD, cfg, NULL, NULL);
    double *times = NULL;
    if (st == ZR_OK) {
        st = zr_alloc_at((void **)&times, sizeof(double) * (size_t)steps, __FILE__, __LINE__);
    }
    double sum[6] = {0};
    for (int s = -1; s < steps && st == ZR_OK; s++) {
        zr_step_record rec;
        MPI_Barrier(MPI_COMM_WORLD);
        st = zr_trainer_step(&t, &rec);
        if (st != ZR_OK) {
            break;
        }
        /* the slowest rank sets the pace; the split is averaged over ranks */
        double tmax = rec.t_step, split[3] = {rec.t_compute, rec.t_comm, rec.t_optim};
        MPI_Allreduce(MPI_IN_PLACE, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, split, 3, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        if (s >= 0) {
            times[s] = tmax;
            double v[6] = {split[0] / W,    split[1] / W,    split[2] / W,
                           rec.bytes_inter, rec.bytes_intra, rec.loss};
            for (int k = 0; k < 6; k++) {
                sum[k] += v[k];
            }
        }
    }
    if (st == ZR_OK) {
        out->t_med = zr_median(times, steps); /* sorts times */
        out->t_min = times[0];
        out->compute = sum[0] / steps;
        out->comm = sum[1] / steps;
        out->optim = sum[2] / steps;
        out->inter = sum[3] / steps;
        out->intra = sum[4] / steps;
        out->loss = sum[5] / steps;
        out->tok_s = (double)cfg->train_batch_size * cfg->seq_len / out->t_med;
        double mem[3] = {rss_peak(), (double)zr_mem_peak(),
                         (double)zr_trainer_memory(&t).pool_peak};
        MPI_Allreduce(MPI_IN_PLACE, mem, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        out->rss = mem[0];
        out->alloc = mem[1];
        out->pool = mem[2];
    }
    zr_free(times);
    st = zr_trainer_conclude(&t, st);
    zr_trainer_free(&t, st == ZR_OK ? 0 : 1);
    return st;
}

static int usage(void)
{
    fprintf(stderr, "usage: mpirun -np N zr bench train [--json] [--steps N] [--layers L] "
                    "[--channels C] [--heads H] [--seq T] [--micro-batch B] [--threads N]\n"
                    "       [--device cpu|cuda|auto (zr.device; default cpu)]\n"
                    "       [--modes zero3_bf16,qwz,hpz,qgz,zeropp] [--config FILE (mode "
                    "\"config\")]\n");
    return 2;
}

/* What the command line asked for. */
typedef struct train_opts {
    int json, steps, layers, channels, heads, T, B, threads;
    const char *only;     /* comma list of modes to run; NULL = all */
    const char *cfg_path; /* mode "config"'s file, or NULL */
    const char *device;   /* zr.device of every mode: the CPU unless asked */
} train_opts;

/* The command line into o; 0, or usage()'s code. */
static int parse_args(int argc, char **argv, train_opts *o)
{
    *o = (train_opts){.steps = 10,
                      .layers = 4,
                      .channels = 256,
                      .heads = 4,
                      .T = 128,
                      .B = 4,
                      .threads = 1,
                      .device = "cpu"};
    /* the whole-number flags: in range, or refused by name (atoi took "8x" for 8, "x" for 0) */
    const zr_cli_int_flag nums[] = {{"--steps", &o->steps, NULL, 1, 1e6},
                                    {"--layers", &o->layers, NULL, 1, 1 << 16},
                                    {"--channels", &o->channels, NULL, 1, 1 << 20},
                                    {"--seq", &o->T, NULL, 1, 1 << 24},
                                    {"--heads", &o->heads, NULL, 1, 1 << 16},
                                    {"--micro-batch", &o->B, NULL, 1, 1 << 20},
                                    {"--threads", &o->threads, NULL, 1, ZR_POOL_MAX_THREADS}};
    for (int i = 1; i < argc; i++) {
        int got = i + 1 < argc ? zr_cli_int_flags("train", nums, sizeof nums / sizeof nums[0],
                                                  argv[i], argv[i + 1])
                               : 0;
        if (got != 0) {
            if (got < 0) {
                return usage();
            }
            i++;
        } else if (strcmp(argv[i], "--json") == 0) {
            o->json = 1;
        } else if (strcmp(argv[i], "--config") == 0 && i + 1 < argc) {
            o->cfg_path = argv[++i];
        } else if (strcmp(argv[i], "--modes") == 0 && i + 1 < argc) {
            o->only = argv[++i];
        } else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc &&
                   (strcmp(argv[i + 1], "cpu") == 0 || strcmp(argv[i + 1], "cuda") == 0 ||
                    strcmp(argv[i + 1], "auto") == 0)) {
            o->device = argv[++i];
        } else {
            zr_cli_bad_arg("bench train", argc, argv, i);
            return usage();
        }
    }
    return 0;
}

/* Rank 0: what runs, and the table's header. */
static void print_header(const train_opts *o, const zr_comm *c)
{
    /* for the header's parameter count: the bundled corpus is byte text (V = 256) */
    zr_gpt_config cfg = {o->T, 256, 256, o->layers, o->heads, o->channels};
    char desc[256];
    zr_comm_describe(c, desc, sizeof desc);
    printf("zr bench train: %s; GPT L=%d C=%d T=%d, %zu parameters, micro-batch %d per rank, "
           "%d steps per mode (median), through zr's trainer, zr.device %s, %d thread%s per "
           "rank\n\n",
           desc, o->layers, o->channels, o->T, zr_gpt_config_param_count(&cfg), o->B, o->steps,
           o->device, o->threads, o->threads > 1 ? "s" : "");
    printf("%-11s %9s %9s %9s %9s %8s %8s %11s %11s %9s\n", "mode", "step ms", "min ms", "tok/s",
           "compute", "comm", "optim", "inter MB", "intra MB", "mean loss");
}

/* Every mode asked for, in the table's order: rows[i] and ran[i]; rank 0 prints each row. */
static void run_modes(const train_opts *o, const zr_comm *c, row rows[NMODES], int ran[NMODES])
{
    shape sh = {o->layers, o->channels, o->heads, o->T, o->B};
    int R = c->rank[ZR_GROUP_WORLD];
    for (int i = 0; i < NMODES; i++) {
        if ((o->only != NULL && !has_mode(o->only, modes[i].name)) ||
            (i == CONFIG && o->cfg_path == NULL)) {
            continue;
        }
        static zr_train_config mcfg;
        if (i == CONFIG) {
            ZR_TRY(file_config(o->cfg_path, c->size[ZR_GROUP_WORLD], &mcfg), o->cfg_path);
        } else {
            ZR_TRY(mode_config(&sh, &modes[i], c->size[ZR_GROUP_WORLD], &mcfg), "");
        }
        snprintf(mcfg.device, sizeof mcfg.device, "%s", o->device);
        ran[i] = 1;
        ZR_TRY(run_mode(&mcfg, o->steps, o->threads, &rows[i]), "");
        row *r = &rows[i];
        if (R == 0) {
            printf("%-11s %9.1f %9.1f %9.0f %9.1f %8.1f %8.1f %11.3f %11.3f %9.4f\n", modes[i].name,
                   1e3 * r->t_med, 1e3 * r->t_min, r->tok_s, 1e3 * r->compute, 1e3 * r->comm,
                   1e3 * r->optim, r->inter / 1e6, r->intra / 1e6, r->loss);
            fflush(stdout);
        }
    }
}

/* The JSON line: the run, ZeRO++ against ZeRO-3 (when both ran), every mode that ran. */
static void print_json(const train_opts *o, const zr_comm *c, const row rows[NMODES],
                       const int ran[NMODES], int both, double ratio, double speedup)
{
    printf("{\"bench\": \"train\", \"ranks\": %d, \"nodes\": %d, \"steps\": %d, "
           "\"threads\": %d",
           c->size[ZR_GROUP_WORLD], c->n_nodes, o->steps, o->threads);
    if (both) {
        printf(", \"inter_bytes_ratio_zeropp\": %.4f, \"speedup_zeropp\": %.3f", ratio, speedup);
    }
    printf(", \"modes\": {");
    for (int i = 0, first = 1; i < NMODES; i++) {
        if (!ran[i]) {
            continue;
        }
        printf("%s\"%s\": {\"step_ms\": %.3f, \"tokens_per_s\": %.1f, \"inter_bytes\": %.0f, "
               "\"intra_bytes\": %.0f, \"compute_ms\": %.3f, \"comm_ms\": %.3f, "
               "\"min_step_ms\": %.3f, \"optim_ms\": %.3f, \"mean_loss\": %.5f, "
               "\"rss_peak_bytes\": %.0f, \"alloc_peak_bytes\": %.0f, \"pool_peak_bytes\": "
               "%.0f}",
               first ? "" : ", ", modes[i].name, 1e3 * rows[i].t_med, rows[i].tok_s, rows[i].inter,
               rows[i].intra, 1e3 * rows[i].compute, 1e3 * rows[i].comm, 1e3 * rows[i].t_min,
               1e3 * rows[i].optim, rows[i].loss, rows[i].rss, rows[i].alloc, rows[i].pool);
        first = 0;
    }
    printf("}}\n");
}

/* Rank 0: the notes under the table, ZeRO++ against ZeRO-3, and --json's line. */
static void print_summary(const train_opts *o, const zr_comm *c, const row rows[NMODES],
                          const int ran[NMODES])
{
    printf("\n(inter/intra MB: bytes per step summed over all ranks, from zr's exact counters;"
           " compute/comm/optim: ms per step averaged over ranks)\n");
    int both = ran[0] && ran[ZEROPP];
    double ratio = both && rows[0].inter > 0 ? rows[ZEROPP].inter / rows[0].inter : 0.0;
    double speedup = both ? rows[ZEROPP].tok_s / rows[0].tok_s : 0.0;
    if (both) {
        printf("ZeRO++ inter-node bytes per step / ZeRO-3 bf16: %.3f; throughput ZeRO++ / "
               "ZeRO-3: %.2fx\n",
               ratio, speedup);
    }
    if (o->json) {
        print_json(o, c, rows, ran, both, ratio, speedup);
    }
}

int zr_bench_train(int argc, char **argv)
{
    train_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc != 0) {
        return rc;
    }
    MPI_Init(&argc, &argv);
    zr_comm c;
    ZR_TRY(zr_comm_init(&c, MPI_COMM_WORLD, NULL), "check ZR_RANKS_PER_NODE");
    int R = c.rank[ZR_GROUP_WORLD];
    if (R == 0) {
        print_header(&o, &c);
    }
    row rows[NMODES];
    int ran[NMODES] = {0};
    run_modes(&o, &c, rows, ran);
    if (R == 0) {
        print_summary(&o, &c, rows, ran);
    }
    zr_comm_free(&c);
    MPI_Finalize();
    return 0;
}
