/*
 * train.c - "zr train": arguments in, progress out. The loop itself is the
 * library's (src/train/trainer.c); this file reads the configuration from
 * the command line, makes every rank agree on it, and prints what the
 * trainer reports: the start-up lines, each step's line or the live bar,
 * checkpoints, the summary, and an agreed error with a hint.
 */
#define _POSIX_C_SOURCE 200809L

#include "cli.h"

#include "zr/launch.h"
#include "zr/trainer.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

extern char **environ; /* POSIX; unistd.h declares it only for _GNU_SOURCE */

/* Exit codes: 0 done (or stopped cleanly by a signal), 1 runtime failure, 2 bad input. */
enum { EXIT_OK = 0, EXIT_RUNTIME = 1, EXIT_INPUT = 2 };

/* Unknown-key warnings and notes ("note: ..."): collected on every rank, printed by rank 0. */
static void warn_rank0(void *ctx, const char *msg)
{
    if (*(int *)ctx == 0) {
        fprintf(stderr, "zr train: %s%s\n", strncmp(msg, "note: ", 6) == 0 ? "" : "warning: ", msg);
    }
}

/* The trainer's notices (rank 0 only). */
static void print_note(void *ctx, zr_log_level level, const char *msg)
{
    (void)ctx;
    if (level <= ZR_LOG_WARN) {
        fprintf(stderr, "zr train: warning: %s\n", msg);
    } else {
        printf("zr train: %s\n", msg);
        fflush(stdout);
    }
}

/* Report an agreed error on rank 0, with a hint for the errors a user fixes, and
 * return the exit code every rank uses. */
static int fail(int rank, zr_status st)
{
    const char *hint =
        st == ZR_ERR_INVALID ? "zr train --help lists every key with its default"
        : st == ZR_ERR_FORMAT
            ? "the file is damaged or is not what zr expects; nothing was overwritten"
        : st == ZR_ERR_IO ? "check the path and permissions; nothing was overwritten"
                          : "";
    if (rank == 0) {
        fprintf(stderr, "zr train: error: %s\n", zr_error_message());
        if (hint[0] != '\0') {
            fprintf(stderr, "  hint: %s\n", hint);
        }
    }
    return st == ZR_ERR_INVALID || st == ZR_ERR_FORMAT ? EXIT_INPUT : EXIT_RUNTIME;
}

static void fmt_eta(double s, char *buf, size_t n)
{
    if (!(s >= 0) || s > 1e7) {
        snprintf(buf, n, "?");
    } else if (s >= 3600) {
        snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
    } else {
        snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)s % 60);
    }
}

static void progress_bar(const zr_step_record *r)
{
    char e[32];
    fmt_eta(r->eta_s, e, sizeof e);
    int width = 30, done = r->total > 0 ? (int)((double)width * r->step / r->total) : width;
    printf("\r[");
    for (int i = 0; i < width; i++) {
        putchar(i < done ? '=' : (i == done ? '>' : ' '));
    }
    printf("] %d/%d loss %.9g ETA %s   ", r->step, r->total, r->loss, e);
    fflush(stdout);
}

/* Rank 0: the step's line (periodic), or the live bar at a terminal. */
static void print_step(const zr_step_record *r, int bar)
{
    if (r->print) {
        char e[32];
        fmt_eta(r->eta_s, e, sizeof e);
        if (bar) {
            printf("\r%*s\r", 80, "");
        }
        printf("step %5d/%d | loss %.9g", r->step, r->total, r->loss);
        if (r->validated) {
            printf(" (val %.9g)", r->val_loss);
        }
        printf(" | lr %.2e | norm %6.3f | %7.0f tok/s | compute %5.1f comm %5.1f optim %4.1f ms"
               " | intra %6.2f inter %6.2f MB",
               r->lr, r->grad_norm, r->tokens_per_s, 1e3 * r->t_compute, 1e3 * r->t_comm,
               1e3 * r->t_optim, r->bytes_intra / 1e6, r->bytes_inter / 1e6);
        if (r->device_mem_peak > 0) {
            printf(" | GPU peak %.1f MB", r->device_mem_peak / 1e6);
        }
        printf(" | ETA %s\n", e);
    } else if (bar) {
        progress_bar(r);
    }
    if (r->checkpoint[0] != '\0' && !r->stop) {
        printf("checkpoint: %s\n", r->checkpoint);
    }
    if (r->stop) {
        printf("zr train: stop requested; finished step %d%s%s\n", r->step,
               r->checkpoint[0] ? ", checkpoint " : " (no checkpoint_dir: nothing saved)",
               r->checkpoint);
        if (r->checkpoint[0]) {
            printf("  continue with: --resume\n");
        }
    }
    fflush(stdout);
}

static void print_start(const zr_trainer *t)
{
    char desc[256];
    zr_comm_describe(&t->comm, desc, sizeof desc);
    printf("zr train: %s\n", desc);
    size_t params = zr_gpt_config_param_count(&t->mcfg);
    zr_memory mem = zr_trainer_memory(t);
    char shape[256];
    zr_gpt_config_describe(&t->mcfg, shape, sizeof shape);
    printf("model: %zu parameters (%s)%s%s; model state "
           "per rank %.2f MB (optimizer %.2f, grads %.2f, params %.2f, hpZ secondary %.2f)\n",
           params, shape, t->cfg.init_path[0] ? " from " : "", t->cfg.init_path,
           (mem.optim + mem.grads + mem.params + mem.secondary) / 1e6, mem.optim / 1e6,
           mem.grads / 1e6, mem.params / 1e6, mem.secondary / 1e6);
    fflush(stdout);
}

static void print_summary(const zr_train_summary *s, int stage, int steps)
{
    if (s->checkpoint[0] != '\0') {
        printf("checkpoint: %s\n", s->checkpoint);
    }
    if (steps == 0) {
        printf("done: 0 steps (zr.train.train_steps 0): %s\n",
               s->checkpoint[0] != '\0' ? "the initial weights are the checkpoint above"
                                        : "nothing to do without zr.checkpoint.dir");
    }
    if (s->start >= s->end) {
        return;
    }
    int n = s->end - s->start;
    printf("done: %d step%s in %.1f s, loss %.9g -> %.9g", n, n == 1 ? "" : "s", s->seconds,
           s->first_loss, s->last_loss);
    if (!isnan(s->val_loss)) {
        printf(" (val %.9g)", s->val_loss);
    }
    printf("\ninter-node traffic: %.2f MB (intra-node %.2f MB)", s->bytes_inter / 1e6,
           s->bytes_intra / 1e6);
    if (stage == 3 && s->zero3_bytes_inter > 0) {
        printf("; ZeRO-3 with bf16 would have sent %.2f MB across nodes: %.2f MB kept off the "
               "links (%.2fx less)",
               s->zero3_bytes_inter / 1e6, (s->zero3_bytes_inter - s->bytes_inter) / 1e6,
               s->bytes_inter > 0 ? s->zero3_bytes_inter / s->bytes_inter : 0.0);
    }
    printf("\n");
}

int zr_cli_train(int argc, char **argv)
{
    /* before MPI_Init: a singleton run must not look like one under a launcher */
    int bar = zr_progress_bar_wanted(environ, isatty(STDOUT_FILENO));
    MPI_Init(&argc, &argv);
    int rank, help = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    bar = bar && rank == 0;

    /* --auto: the planner chooses the sharding (src/cli/plan.c); every rank gets the flag */
    int auto_plan = zr_cli_take_flag(&argc, argv, "--auto");
    static zr_train_config cfg;
    zr_status st =
        zr_launch_read_config(MPI_COMM_WORLD, argc, argv, &cfg, &help, warn_rank0, &rank);
    if (st == ZR_OK && auto_plan && !help) {
        st = zr_cli_auto(MPI_COMM_WORLD, &cfg, rank);
    }
    if (st != ZR_OK || help) {
        if (st == ZR_OK && rank == 0) {
            zr_config_print_help(stdout);
        }
        int code = st == ZR_OK ? EXIT_OK : fail(rank, st);
        MPI_Finalize();
        return code;
    }
    if (rank == 0) {
        /* before anything can fail: the effective configuration explains most errors; with
           zr.model.init, with the shape the file gives (the trainer checks it again) */
        static zr_train_config shown;
        shown = cfg;
        zr_gpt_config fc;
        if (cfg.init_path[0] != '\0' && zr_gpt_read_llmc_config(cfg.init_path, &fc) == ZR_OK) {
            (void)zr_config_adopt_model(&shown, &fc, cfg.init_path);
        }
        zr_error_clear();
        zr_config_print(stdout, &shown);
        fflush(stdout);
    }
    static zr_trainer t;
    st = zr_trainer_init(&t, MPI_COMM_WORLD, &cfg, print_note, NULL);
    if (st == ZR_OK && (cfg.resume || cfg.resume_from[0] != '\0')) {
        st = zr_trainer_resume(&t);
    }
    if (st == ZR_OK && rank == 0) {
        print_start(&t);
    }
    if (st == ZR_OK) {
        zr_trainer_catch_signals(&t); /* a stop after the current step, on every rank */
    }
    int stopped = 0;
    while (st == ZR_OK && !zr_trainer_done(&t) && !stopped) {
        zr_step_record rec;
        st = zr_trainer_step(&t, &rec);
        /* a diverged step still has its numbers; any other failure has none */
        if (rank == 0 && (st == ZR_OK || st == ZR_ERR_NONFINITE)) {
            print_step(&rec, bar);
        }
        stopped = rec.stop;
    }
    if (st == ZR_OK && !stopped) {
        zr_train_summary sum;
        st = zr_trainer_finish(&t, &sum);
        if (st == ZR_OK && rank == 0) {
            print_summary(&sum, cfg.stage, cfg.train_steps);
        }
    }
    st = zr_trainer_conclude(&t, st);
    int code = st == ZR_OK ? EXIT_OK : fail(rank, st);
    zr_trainer_free(&t, code);
    MPI_Finalize();
    return code;
}
