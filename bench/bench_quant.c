#include "../src/cli/cli.h"
int zr_bench_quant(int argc, char **argv) { (void)argc; (void)argv; return 0; }
