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
 * argv[i], which command cmd ("plot", "bench quant") does not take, named on
 * stderr: an unknown flag (or, as the last argument, one missing its value)
 * or an unexpected argument. Returns 2, the exit status for it; the caller
 * may print its usage after.
 */
int zr_cli_bad_arg(const char *cmd, int argc, char **argv, int i);
/*
 * A benchmark's flags, read by the same rule. zr_cli_int_flags: flag looked
 * up in a table of whole-number flags (each stores into an int or a long
 * long, lo..hi): 1 when it is one and text is in range (stored), 0 when flag
 * is none of them, -1 when text is not (said on stderr as "zr bench <cmd>:
 * <the reason>"). zr_cli_size: a whole count with an optional K, M or G
 * suffix (2^10, 2^20, 2^30; "1.5M" is fine, "1.5" is not): 1, or 0 after
 * saying why.
 */
typedef struct zr_cli_int_flag {
    const char *flag;
    int *i; /* where the value goes: i, or ll where i is NULL */
    long long *ll;
    double lo, hi;
} zr_cli_int_flag;
int zr_cli_int_flags(const char *cmd, const zr_cli_int_flag *f, size_t n, const char *flag,
                     const char *text);
int zr_cli_size(const char *cmd, const char *flag, const char *text, double lo, double hi,
                size_t *out);

/* zr train --auto: probe this allocation, plan, and apply the winner to cfg (collective). */
#include "zr/config.h"
#include <mpi.h>
zr_status zr_cli_auto(MPI_Comm world, zr_train_config *cfg, int rank);

/* Remove every argv[i] equal to flag (argc shrinks); 1 if there was one. */
int zr_cli_take_flag(int *argc, char **argv, const char *flag);

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
int zr_bench_attention(int argc, char **argv);
/* zr bench quant --device cuda[:N] (bench/bench_quant_cuda.c); 1 without a GPU. */
/* zr bench model --device cuda (bench/bench_model_cuda.c). */
int zr_bench_model_cuda(const char *spec, int json, int quick);
int zr_bench_quant_cuda(const char *spec, int json, const size_t *sizes, int nsizes, int group,
                        int reps);

#endif
