/*
 * selfcheck.c - "zr selfcheck": bring up the communicator, print the layout
 * every rank sees, move a known pattern through each group and compare the
 * traffic counters with what the layout implies; and per rank its cores
 * (the affinity mask the launcher gave it), its BLAS's kernels and one
 * thread's sgemm against the core's FMA peak, warning where that is under
 * half. A quick way to check an mpirun hostfile or Slurm allocation before
 * a long job.
 */
#include "cli.h"

#include "zr/comm.h"

#include "../base/blas.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * This rank's CPU: its cores (affinity mask), the BLAS's kernels and why, and one thread's
 * sgemm against the core's FMA peak (the best of three pairs, about 0.3 s; every rank at
 * once, as in training), both per second of the CPU time the thread got, so that a busy
 * machine's time slices do not count.
 */
static void cpu_line(char *buf, size_t n, int *slow)
{
    const zr_blas *blas = NULL;
    if (zr_blas_load(&blas) != ZR_OK) {
        snprintf(buf, n, "cores %d, BLAS: %s", zr_cpu_cores(), zr_error_message());
        *slow = 1;
        return;
    }
    zr_blas_set_threads(1);
    const char *isa = "";
    double peak = 0, sgemm = 0;
    for (int r = 0; r < 3; r++) { /* the best of three pairs: a busy machine only lowers it */
        double p = zr_cpu_fma_peak(1, 0.03, 1, &isa), g = zr_blas_sgemm_rate(1024, 1, 1);
        if (r == 0 || g / p > sgemm / peak) {
            peak = p;
            sgemm = g;
        }
    }
    *slow = sgemm < 0.5 * peak;
    /* what bf16.enabled's matrix products run on */
    char why[160], bf16[256];
    const char *kernel = NULL;
    if (zr_blas_bf16_here(&kernel, why, sizeof why)) {
        snprintf(bf16, sizeof bf16, "%s (%s)", kernel, why);
    } else {
        snprintf(bf16, sizeof bf16, "%s", why);
    }
    snprintf(buf, n,
             "cores %d, BLAS %s kernels (%s); sgemm %.1f GFLOP/s = %.2f of the core's FMA "
             "peak %.1f (%s)%s; bf16 products: %s",
             zr_cpu_cores(), blas->core, blas->how, sgemm, sgemm / peak, peak, isa,
             *slow ? " - under half: check the BLAS's kernels" : "", bf16);
}

/* Two lines per rank, printed in rank order; *slow: this rank's sgemm is under half its peak. */
static void print_ranks(zr_comm *c, int *slow)
{
    int W = c->size[ZR_GROUP_WORLD], R = c->rank[ZR_GROUP_WORLD];
    char cpu[1024];
    cpu_line(cpu, sizeof cpu, slow);
    for (int r = 0; r < W; r++) {
        if (r == R) {
            char host[MPI_MAX_PROCESSOR_NAME];
            int len = 0;
            MPI_Get_processor_name(host, &len);
            printf("  rank %d on %s: node %d (local %d/%d), cross %d/%d, hpz %d/%d\n"
                   "    %s\n",
                   R, host, c->node, c->rank[ZR_GROUP_NODE], c->size[ZR_GROUP_NODE],
                   c->rank[ZR_GROUP_CROSS], c->size[ZR_GROUP_CROSS], c->rank[ZR_GROUP_HPZ],
                   c->size[ZR_GROUP_HPZ], cpu);
            fflush(stdout);
        }
        ZR_TRY(zr_comm_barrier(c), "");
    }
}

/* B bytes from every rank to every rank, through each group in turn; *ok = 0 if
 * a block did not come from the rank the group says. */
static zr_status gather_groups(zr_comm *c, size_t B, int *ok)
{
    int W = c->size[ZR_GROUP_WORLD], R = c->rank[ZR_GROUP_WORLD];
    zr_status st = ZR_OK;
    unsigned char *send = NULL, *recv = NULL;
    ZR_ALLOC_GOTO(send, B, st, done);
    ZR_ALLOC_GOTO(recv, B * (size_t)W, st, done);
    memset(send, R & 0xff, B);
    for (int g = 0; g < ZR_GROUP_COUNT; g++) {
        ZR_CHECK_GOTO(zr_comm_allgather(c, (zr_group)g, ZR_KIND_ALLGATHER, send, B, recv), st,
                      done);
        for (int p = 0; p < c->size[g]; p++) {
            int who = zr_comm_world_rank(c, (zr_group)g, p);
            *ok &= recv[(size_t)p * B] == (unsigned char)(who & 0xff) &&
                   recv[(size_t)p * B + B - 1] == (unsigned char)(who & 0xff);
        }
    }
done:
    zr_free(send);
    zr_free(recv);
    return st;
}

int zr_cli_selfcheck(int argc, char **argv)
{
    int hpz = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--hpz") == 0 && i + 1 < argc) {
            double v = 0;
            if (zr_cli_number("--hpz", argv[++i], 0, 1 << 20, 1, &v) != ZR_OK) {
                fprintf(stderr, "zr selfcheck: error: %s\n", zr_error_message());
                return 2;
            }
            hpz = (int)v;
        } else {
            int help = strcmp(argv[i], "--help") == 0;
            if (!help) {
                zr_cli_bad_arg("selfcheck", argc, argv, i);
            }
            fprintf(help ? stdout : stderr,
                    "usage: mpirun -np N zr selfcheck [--hpz H]\n"
                    "  ZR_RANKS_PER_NODE=D emulates nodes of D consecutive ranks\n");
            return help ? 0 : 2;
        }
    }
    MPI_Init(&argc, &argv);
    zr_comm c;
    zr_comm_config cfg = {0, hpz};
    ZR_TRY(zr_comm_init(&c, MPI_COMM_WORLD, &cfg),
           "check the rank count, ZR_RANKS_PER_NODE and --hpz");
    int W = c.size[ZR_GROUP_WORLD], R = c.rank[ZR_GROUP_WORLD];
    char desc[256];
    zr_comm_describe(&c, desc, sizeof desc);
    if (R == 0) {
        printf("zr selfcheck: %s, transport %s\n", desc, c.transport->name);
    }
    int slow = 0;
    print_ranks(&c, &slow);
    /* 1 MiB from every rank to every rank, through each group in turn */
    size_t B = 1 << 20;
    int ok = 1;
    zr_comm_traffic_reset(&c);
    ZR_TRY(gather_groups(&c, B, &ok), "");
    zr_traffic t;
    ZR_TRY(zr_comm_traffic_total(&c, &t), "");
    uint64_t D = (uint64_t)c.ranks_per_node, N = (uint64_t)c.n_nodes,
             H = (uint64_t)c.size[ZR_GROUP_HPZ];
    uint64_t hpz_inter = H > D ? H - D : 0, hpz_intra = (H > D ? D : H) - 1;
    uint64_t expect_inter = W * B * ((W - D) + 0 + (N - 1) + hpz_inter);
    uint64_t expect_intra = W * B * ((D - 1) + (D - 1) + 0 + hpz_intra);
    zr_traffic_row *row = &t.kind[ZR_KIND_ALLGATHER];
    ok &= row->bytes_inter == expect_inter && row->bytes_intra == expect_intra;
    int all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    if (R == 0) {
        printf("  all-gathers over world, node, cross, hpz: data %s; traffic intra %.1f MiB, inter "
               "%.1f MiB (expected %.1f / %.1f)\n",
               all_ok ? "ok" : "WRONG", row->bytes_intra / 1048576.0, row->bytes_inter / 1048576.0,
               expect_intra / 1048576.0, expect_inter / 1048576.0);
        printf("zr selfcheck: %s\n", all_ok ? "passed" : "FAILED");
    }
    int any_slow = 0;
    MPI_Allreduce(&slow, &any_slow, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    if (R == 0 && any_slow) {
        fprintf(stderr, "zr selfcheck: warning: sgemm runs under half the FMA peak on some rank "
                        "(above): check its BLAS kernels (OPENBLAS_CORETYPE, ZR_BLAS_LIB)\n");
    }
    zr_comm_free(&c);
    MPI_Finalize();
    return all_ok ? 0 : 1;
}
