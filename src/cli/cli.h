/*
 * cli.h - subcommands of the zr program (src/cli and bench/).
 */
#ifndef ZR_CLI_H
#define ZR_CLI_H

#include <stddef.h>

int zr_cli_selfcheck(int argc, char **argv);
int zr_cli_bench(int argc, char **argv);
int zr_cli_train(int argc, char **argv);
int zr_cli_export(int argc, char **argv);
int zr_cli_plot(int argc, char **argv);
int zr_cli_probe(int argc, char **argv);
int zr_cli_plan(int argc, char **argv);

/*
 * The value of a numeric flag of a subcommand: all of text a finite number in
 * [lo, hi] (a whole one when integer), else ZR_ERR_INVALID naming the flag and
 * its text (src/cli/main.c).
 */
#include "zr/base.h"
zr_status zr_cli_number(const char *name, const char *text, double lo, double hi, int integer,
                        double *out);
/*
 * A benchmark's flag, read by the same rule: 1 with *out set, or 0 after
 * printing "zr bench <cmd>: <the reason>" on stderr. zr_cli_int: a whole
 * number; zr_cli_size: one with an optional K, M or G suffix (2^10, 2^20,
 * 2^30), a whole count once scaled ("1.5M" is fine, "1.5" is not).
 */
int zr_cli_int(const char *cmd, const char *flag, const char *text, double lo, double hi,
               long long *out);
int zr_cli_size(const char *cmd, const char *flag, const char *text, double lo, double hi,
                size_t *out);

/* zr train --auto: probe this allocation, plan, and apply the winner to cfg (collective). */
#include "zr/config.h"
#include <mpi.h>
zr_status zr_cli_auto(MPI_Comm world, zr_train_config *cfg, int rank);

/* Benchmarks in bench/, dispatched by zr_cli_bench. */
int zr_bench_quant(int argc, char **argv);
int zr_bench_model(int argc, char **argv);
int zr_bench_train(int argc, char **argv);
int zr_bench_comm(int argc, char **argv);
/* zr bench comm --device cuda (bench/bench_comm_cuda.c): 1 at once without a GPU. */
typedef struct zr_bench_comm_args {
    const char *device;    /* "cuda" */
    const char *transport; /* "nccl", "staged" or NULL (NCCL where each rank has a GPU) */
    int json, iters, chunks;
    size_t min, max; /* bytes of the full fp32 buffer */
} zr_bench_comm_args;
int zr_bench_comm_cuda(const zr_bench_comm_args *a);
int zr_bench_memory(int argc, char **argv);
int zr_bench_noise(int argc, char **argv);
/* zr bench quant --device cuda[:N] (bench/bench_quant_cuda.c); 1 without a GPU. */
/* zr bench model --device cuda (bench/bench_model_cuda.c). */
int zr_bench_model_cuda(const char *spec, int json, int quick);
int zr_bench_quant_cuda(const char *spec, int json, const size_t *sizes, int nsizes, int group,
                        int reps);

#endif
