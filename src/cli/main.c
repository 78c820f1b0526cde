/*
 * main.c - the zr program: one binary, one subcommand per job.
 *
 *   zr selfcheck         communicator self-check (layout, groups, traffic)
 *   zr bench <name>      benchmarks from bench/ (quant, comm, model, train, memory, noise)
 *   zr train             sharded training from a DeepSpeed-style config and flags
 *   zr probe / zr plan   measure an allocation, then rank the configurations for it
 *   zr export            llm.c, safetensors, Hugging Face folders from a checkpoint
 *   zr plot              loss and throughput curves of runs' metrics files (gnuplot)
 *
 * Each subcommand is a function taking (argc, argv) after the subcommand name
 * and returning the process exit status; the table below is the only place
 * that knows them all.
 */
#include "cli.h"

#include "../base/blas.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

/* A later failure (no configuration fits, a probe of no batch size) would blame the request
   for a typo, and atoi reads "lots" as 0: numbers are checked where they are read. */
zr_status zr_cli_number(const char *name, const char *text, double lo, double hi, int integer,
                        double *out)
{
    char *end = NULL;
    errno = 0;
    double d = strtod(text, &end);
    if (end == text || *end != '\0' || errno != 0 || !isfinite(d) || d < lo || d > hi ||
        (integer && d != floor(d))) {
        ZR_FAIL(ZR_ERR_INVALID, "%s \"%.40s\": expected %s from %.15g to %.15g", name, text,
                integer ? "a whole number" : "a number", lo, hi);
    }
    *out = d;
    return ZR_OK;
}

int zr_cli_int_flags(const char *cmd, const zr_cli_int_flag *f, size_t n, const char *flag,
                     const char *text)
{
    for (size_t k = 0; k < n; k++) {
        if (strcmp(flag, f[k].flag) != 0) {
            continue;
        }
        double v = 0;
        if (zr_cli_number(flag, text, f[k].lo, f[k].hi, 1, &v) != ZR_OK) {
            fprintf(stderr, "zr bench %s: %s\n", cmd, zr_error_message());
            return -1;
        }
        if (f[k].i != NULL) {
            *f[k].i = (int)v;
        } else {
            *f[k].ll = (long long)v;
        }
        return 1;
    }
    return 0;
}

int zr_cli_size(const char *cmd, const char *flag, const char *text, double lo, double hi,
                size_t *out)
{
    static const char suffix[] = "KMG";
    char num[64];
    size_t n = strlen(text);
    int last = n > 0 ? text[n - 1] & ~0x20 : 0; /* upper case */
    const char *s = last != 0 ? strchr(suffix, last) : NULL;
    double scale = s == NULL ? 1 : (double)(1ull << (10 * (s - suffix + 1)));
    snprintf(num, sizeof num, "%.*s", (int)(scale > 1 ? n - 1 : n), text);
    double v = 0;
    if (n >= sizeof num || zr_cli_number(flag, num, 0, hi / scale, 0, &v) != ZR_OK ||
        v * scale < lo || v * scale != floor(v * scale)) {
        fprintf(stderr,
                "zr bench %s: %s \"%.40s\": expected a whole count from %.15g to %.15g (K, M "
                "and G multiply by 2^10, 2^20, 2^30)\n",
                cmd, flag, text, lo, hi);
        return 0;
    }
    *out = (size_t)(v * scale);
    return 1;
}

int zr_cli_bad_arg(const char *cmd, int argc, char **argv, int i)
{
    char a[96];
    zr_str_printable(a, sizeof a, argv[i], strlen(argv[i]));
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
        return 2; /* asked for the usage, which the caller prints */
    }
    if (argv[i][0] != '-') {
        fprintf(stderr, "zr %s: error: unexpected argument \"%s\"\n", cmd, a);
    } else if (i + 1 == argc) {
        fprintf(stderr, "zr %s: error: %s: unknown flag, or one missing its value\n", cmd, a);
    } else {
        fprintf(stderr, "zr %s: error: unknown flag %s\n", cmd, a);
    }
    return 2;
}

/*
 * Every command: an empty argument is refused as such before the command reads
 * it ("--probe is empty", not "cannot open : ..."), as the value of a flag
 * (--flag "" or --flag=) or on its own. Returns 1 (said on stderr) or 0.
 */
static int empty_arg(const char *cmd, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
        char f[96];
        if (a[0] == '\0' && i > 1 && argv[i - 1][0] == '-') {
            zr_str_printable(f, sizeof f, argv[i - 1], strlen(argv[i - 1]));
            fprintf(stderr, "zr %s: error: %s is empty\n", cmd, f);
        } else if (a[0] == '\0') {
            fprintf(stderr, "zr %s: error: argument %d is empty\n", cmd, i);
        } else if (eq != NULL && eq[1] == '\0') {
            zr_str_printable(f, sizeof f, a, (size_t)(eq - a));
            fprintf(stderr, "zr %s: error: %s is empty\n", cmd, f);
        } else {
            continue;
        }
        return 1;
    }
    return 0;
}

typedef struct command {
    const char *name;
    int (*main)(int argc, char **argv);
    const char *help;
} command;

enum { BENCH = 5 }; /* commands[BENCH], whose first argument names the benchmark */

static const command commands[] = {
    {"train", zr_cli_train, "train a GPT across MPI ranks (mpirun -np N zr train ...)"},
    {"probe", zr_cli_probe,
     "measure compute, codecs and links of an allocation for zr plan (mpirun)"},
    {"plan", zr_cli_plan, "rank every sharding / ZeRO++ configuration by predicted tokens/s"},
    {"export", zr_cli_export, "write llm.c, safetensors, HF folders from a checkpoint"},
    {"selfcheck", zr_cli_selfcheck, "check the communicator: layout, groups, traffic counters"},
    {"bench", zr_cli_bench, "run a benchmark from bench/ (zr bench --help)"},
    {"plot", zr_cli_plot, "render loss and throughput curves of one or more runs to PNG (gnuplot)"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: zr <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    }
    fprintf(f, "\nzr <command> --help shows the options of a command.\n");
}

int main(int argc, char **argv)
{
#ifdef __GLIBC__
    /* Buffers of 1 MiB and more come from mmap and go back to the system when freed. glibc's
       default threshold rises after the first such free, and later big buffers then come from
       the heap, where a freed one stays resident: the process would hold more than zr's own
       accounting (and zr plan's prediction) says, by whatever a resized workspace left behind. */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(argv[1], commands[i].name) == 0) {
            int bench = i == BENCH && argc > 2 && argv[2][0] != '-';
            char cmd[64];
            snprintf(cmd, sizeof cmd, "%s%s%.40s", argv[1], bench ? " " : "", bench ? argv[2] : "");
            if (empty_arg(cmd, argc - 1 - bench, argv + 1 + bench)) {
                return 2;
            }
            /* the BLAS, opened before MPI starts threads (it may set OPENBLAS_CORETYPE for
               a moment, src/base/blas.h); a failure comes back where a product needs it */
            const zr_blas *blas = NULL;
            if (strcmp(argv[1], "export") != 0 && strcmp(argv[1], "plot") != 0) {
                (void)zr_blas_load(&blas);
            }
            return commands[i].main(argc - 1, argv + 1);
        }
    }
    fprintf(stderr, "zr: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
