/*
 * bench.c - "zr bench <name>": dispatch to the benchmarks in bench/.
 *
 * Benchmarks print a table for people and, with --json, one JSON object on
 * the last line of stdout for machines. They never assert timings.
 */
#include "cli.h"

#include <stdio.h>
#include <string.h>

typedef struct bench_entry {
    const char *name;
    int (*main)(int argc, char **argv);
    const char *help;
} bench_entry;

static const bench_entry benches[] = {
    {"quant", zr_bench_quant, "quantize/dequantize GB/s against memcpy, error by group size"},
    {"model", zr_bench_model, "GPT-2 train step (fwd+bwd+AdamW) tokens/s and FLOP rate vs sgemm"},
    {"train", zr_bench_train, "GPT training steps per ZeRO++ mode: time split and bytes per step"},
    {"memory", zr_bench_memory,
     "peak RSS per rank (from the OS) against the engine's memory formula"},
    {"comm", zr_bench_comm,
     "collectives: time, algbw/busbw, intra/inter-node bytes; ZeRO-3 vs ZeRO++"},
    {"noise", zr_bench_noise, "how steady this machine is: a fixed loop per core, timed"},
    {"attention", zr_bench_attention,
     "CUDA causal attention kernels: ms and TFLOP/s per kernel, every variant side by side"},
    {NULL, NULL, NULL},
};

int zr_cli_bench(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0) {
        printf("usage: zr bench <name> [--json] [options]\n\nbenchmarks:\n");
        for (const bench_entry *b = benches; b->name != NULL; b++) {
            printf("  %-9s %s\n", b->name, b->help);
        }
        return argc < 2 ? 2 : 0;
    }
    for (const bench_entry *b = benches; b->name != NULL; b++) {
        if (strcmp(argv[1], b->name) == 0) {
            return b->main(argc - 1, argv + 1);
        }
    }
    fprintf(stderr, "zr bench: unknown benchmark '%s' (zr bench --help lists them)\n", argv[1]);
    return 2;
}
