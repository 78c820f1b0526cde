/*
 * bench_comm.c - "zr bench comm": time and traffic of the ZeRO-3 baselines
 * and the ZeRO++ collectives, in the style of nccl-tests.
 *
 *   mpirun -np 4 -x ZR_RANKS_PER_NODE=2 zr bench comm [--json] [--min 1K]
 *          [--max 256M] [--iters N] [--chunks C] [--device cuda [--transport T]]
 *
 * --device cuda runs the same collectives on device buffers through a
 * device transport, with NCCL's own collectives as baselines
 * (bench_comm_cuda.c).
 *
 * For every size (bytes of the full fp32 buffer, powers of 4) and
 * collective: median over iterations of the slowest rank's time, algbw =
 * size / time, busbw = algbw * (n-1)/n (n = the group size, as nccl-tests
 * does for all-gather and reduce-scatter), and the bytes one rank sent to
 * its own node and to other nodes per call (zr's exact accounting; MPI's own
 * collectives are not accounted). Rank 0 prints the table; --json adds one
 * JSON object on the last line with every row and the inter-node byte
 * ratios of ZeRO++ to the bf16 baseline at 64 MiB.
 *
 * Timings on an oversubscribed machine are noisy; bytes are exact.
 */
#include "../src/cli/cli.h"

#include "zr/coll.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { C_AG_BF16, C_QWZ, C_HPZ, C_RS_BF16, C_QGZ, C_QGZ_PIPE, C_MPI_AG, C_MPI_RS, C_COUNT };

static const char *const coll_names[C_COUNT] = {
    "allgather_bf16", "qwz_int8",      "hpz_bf16",          "reduce_scatter_bf16",
    "qgz_int4",       "qgz_int4_pipe", "mpi_allgather_f32", "mpi_reduce_scatter_f32",
};

typedef struct row {
    int coll;
    size_t bytes; /* full fp32 buffer */
    double time;  /* seconds, median of the per-iteration maximum over ranks */
    double algbw, busbw;
    double intra, inter; /* bytes per rank per call; < 0 when not accounted */
    int iters;
} row;

typedef struct bench {
    zr_comm c;
    zr_coll_op op;
    float *full, *out, *shard, *sec;
    int chunks;
} bench;

/* One call of collective k on a full buffer of count*W elements. */
static zr_status run_one(bench *b, int k, size_t count)
{
    zr_comm *c = &b->c;
    zr_wire bf16 = {ZR_WIRE_BF16, {0, 0, ZR_QUANT_SYM}};
    zr_wire q8 = {ZR_WIRE_QUANT, {8, ZR_QUANT_DEFAULT_GROUP, ZR_QUANT_SYM}};
    zr_qgz_config cfg = zr_qgz_config_default();
    int W = c->size[ZR_GROUP_WORLD], h = c->size[ZR_GROUP_HPZ];
    switch (k) {
    case C_AG_BF16:
        return zr_allgather(c, ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, &bf16, ZR_DTYPE_F32, b->shard,
                            count, ZR_DTYPE_F32, b->out, &b->op);
    case C_QWZ:
        return zr_allgather(c, ZR_GROUP_WORLD, ZR_KIND_QWZ, &q8, ZR_DTYPE_F32, b->shard, count,
                            ZR_DTYPE_F32, b->out, &b->op);
    case C_HPZ:
        return zr_hpz_gather(c, &bf16, ZR_DTYPE_F32, b->sec, count * (size_t)W / (size_t)h,
                             ZR_DTYPE_F32, b->out, &b->op);
    case C_RS_BF16:
        return zr_reduce_scatter(c, ZR_GROUP_WORLD, &bf16, ZR_DTYPE_F32, b->full, count, b->out,
                                 &b->op);
    case C_QGZ:
        return zr_qgz(c, &cfg, ZR_DTYPE_F32, b->full, count, b->out, NULL, &b->op);
    case C_QGZ_PIPE:
        cfg.chunks = b->chunks;
        return zr_qgz(c, &cfg, ZR_DTYPE_F32, b->full, count, b->out, NULL, &b->op);
    case C_MPI_AG:
        ZR_MPI_CHECK(MPI_Allgather(b->shard, (int)count, MPI_FLOAT, b->out, (int)count, MPI_FLOAT,
                                   zr_comm_mpi(c, ZR_GROUP_WORLD)));
        return ZR_OK;
    case C_MPI_RS:
        ZR_MPI_CHECK(MPI_Reduce_scatter_block(b->full, b->out, (int)count, MPI_FLOAT, MPI_SUM,
                                              zr_comm_mpi(c, ZR_GROUP_WORLD)));
        return ZR_OK;
    }
    ZR_FAIL(ZR_ERR_INVALID, "bench comm: unknown collective %d", k);
}

static zr_status measure(bench *b, int k, size_t count, int iters, row *r)
{
    zr_comm *c = &b->c;
    int W = c->size[ZR_GROUP_WORLD];
    double *t = NULL;
    ZR_ALLOC(t, (size_t)iters);
    zr_status st = run_one(b, k, count); /* warm-up: workspace, MPI connections */
    zr_comm_traffic_reset(c);
    for (int i = 0; i < iters && st == ZR_OK; i++) {
        st = zr_comm_barrier(c);
        double t0 = zr_now();
        if (st == ZR_OK) {
            st = run_one(b, k, count);
        }
        double mine = zr_now() - t0;
        MPI_Allreduce(&mine, &t[i], 1, MPI_DOUBLE, MPI_MAX, zr_comm_mpi(c, ZR_GROUP_WORLD));
    }
    if (st != ZR_OK) {
        zr_free(t);
        return st;
    }
    double med = zr_median(t, iters);
    zr_free(t);
    zr_traffic tr = zr_comm_traffic_get(c);
    uint64_t intra = 0, inter = 0;
    for (int kind = 0; kind < ZR_KIND_COUNT; kind++) {
        if (kind != ZR_KIND_CONTROL) {
            intra += tr.kind[kind].bytes_intra;
            inter += tr.kind[kind].bytes_inter;
        }
    }
    int n = k == C_HPZ ? c->size[ZR_GROUP_HPZ] : W;
    r->coll = k;
    r->bytes = count * (size_t)W * sizeof(float);
    r->time = med;
    r->algbw = med > 0 ? (double)r->bytes / med / 1e9 : 0;
    r->busbw = r->algbw * (double)(n - 1) / (double)n;
    r->iters = iters;
    int mpi = k == C_MPI_AG || k == C_MPI_RS;
    r->intra = mpi ? -1 : (double)intra / iters;
    r->inter = mpi ? -1 : (double)inter / iters;
    return ZR_OK;
}

/* Few iterations for big buffers so the whole run stays short. */
static int auto_iters(size_t bytes)
{
    if (bytes <= ((size_t)1 << 20)) {
        return 20;
    }
    if (bytes <= ((size_t)4 << 20)) {
        return 10;
    }
    if (bytes <= ((size_t)16 << 20)) {
        return 5;
    }
    return 3;
}

static void print_bytes(char *buf, size_t len, double v)
{
    if (v < 0) {
        snprintf(buf, len, "-");
    } else {
        snprintf(buf, len, "%.0f", v);
    }
}

static int usage(int code)
{
    fprintf(code ? stderr : stdout,
            "usage: mpirun -np N zr bench comm [--json] [--min SIZE] [--max SIZE] [--iters N] "
            "[--chunks C]\n"
            "                                  [--device cpu|cuda] [--transport nccl|staged]\n"
            "  --device cuda: zr's collectives on device buffers (each rank the GPU of its "
            "node-local\n"
            "  rank) next to NCCL's own all-gather / reduce-scatter; exits 1 without a GPU\n"
            "  SIZE: bytes of the full fp32 buffer (1K, 4M, 256M ...), powers of 4 from min to "
            "max\n"
            "  defaults: --min 1K --max 256M, iterations by size (20 .. 3), --chunks 4 for the "
            "pipelined qgZ\n"
            "  ZR_RANKS_PER_NODE=D emulates nodes of D consecutive ranks\n");
    return code;
}

/* What the command line asked for. */
typedef struct comm_opts {
    int json, iters, chunks; /* iters 0: by size */
    size_t min, max;
    const char *device, *transport;
} comm_opts;

/* The command line into o: -1 to run, or the exit code (usage()'s: 0 for --help). */
static int parse_args(int argc, char **argv, comm_opts *o)
{
    *o = (comm_opts){.chunks = 4, .min = 1024, .max = (size_t)256 << 20, .device = "cpu"};
    const zr_cli_int_flag nums[2] = {{"--iters", &o->iters, NULL, 0, 1e6},
                                     {"--chunks", &o->chunks, NULL, 1, 1 << 16}};
    int got;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
            o->device = argv[++i];
        } else if (strcmp(argv[i], "--transport") == 0 && i + 1 < argc) {
            o->transport = argv[++i];
        } else if (strcmp(argv[i], "--json") == 0) {
            o->json = 1;
        } else if ((strcmp(argv[i], "--min") == 0 || strcmp(argv[i], "--max") == 0) &&
                   i + 1 < argc) {
            /* bytes, K/M/G allowed; anything else is refused by name (strtod read "1x" as 1) */
            if (!zr_cli_size("comm", argv[i], argv[i + 1], 1, (double)(1ull << 40),
                             argv[i][3] == 'n' ? &o->min : &o->max)) {
                return usage(2);
            }
            i++;
        } else if (i + 1 < argc &&
                   (got = zr_cli_int_flags("comm", nums, 2, argv[i], argv[i + 1])) != 0) {
            if (got < 0) {
                return usage(2);
            }
            i++;
        } else {
            if (strcmp(argv[i], "--help") != 0) {
                zr_cli_bad_arg("bench comm", argc, argv, i);
            }
            return usage(strcmp(argv[i], "--help") == 0 ? 0 : 2);
        }
    }
    if (o->min == 0 || o->max < o->min || o->iters < 0 || o->chunks < 1) {
        return usage(2);
    }
    return -1;
}

/* The communicator and the buffers for sizes up to max bytes, filled. */
static void bench_init(bench *b, const comm_opts *o)
{
    memset(b, 0, sizeof *b);
    b->chunks = o->chunks;
    ZR_TRY(zr_comm_init(&b->c, MPI_COMM_WORLD, NULL), "check the rank count and ZR_RANKS_PER_NODE");
    const zr_comm *c = &b->c;
    int W = c->size[ZR_GROUP_WORLD], R = c->rank[ZR_GROUP_WORLD];
    size_t max_elems = zr_round_up(o->max / sizeof(float), (size_t)W);
    ZR_TRY(zr_alloc_at((void **)&b->full, max_elems * sizeof(float), __FILE__, __LINE__), "");
    ZR_TRY(zr_alloc_at((void **)&b->out, max_elems * sizeof(float), __FILE__, __LINE__), "");
    ZR_TRY(zr_alloc_at((void **)&b->shard, max_elems / W * sizeof(float), __FILE__, __LINE__), "");
    /* the hpZ secondary: the full buffer over h ranks (W divides by h) */
    size_t sec_elems = max_elems / (size_t)c->size[ZR_GROUP_HPZ];
    ZR_TRY(zr_alloc_at((void **)&b->sec, sec_elems * sizeof(float), __FILE__, __LINE__), "");
    /* gradients and weights of a plausible scale, different on every rank */
    uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(R + 1);
    for (size_t i = 0; i < max_elems; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        b->full[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5) * 0.02f;
    }
    memcpy(b->shard, b->full, max_elems / W * sizeof(float));
    memcpy(b->sec, b->full, sec_elems * sizeof(float));
}

static void bench_free(bench *b)
{
    zr_coll_op_free(&b->op);
    zr_free(b->full);
    zr_free(b->out);
    zr_free(b->shard);
    zr_free(b->sec);
    zr_comm_free(&b->c);
}

/* Rank 0: the table's header. */
static void print_header(const zr_comm *c)
{
    char desc[256];
    zr_comm_describe(c, desc, sizeof desc);
    printf("# zr bench comm: %s\n", desc);
    printf("# size = bytes of the full fp32 buffer; time = median over iterations of the "
           "slowest rank\n");
    printf("# busbw = algbw * (n-1)/n; bytes = sent by one rank per call (intra / inter "
           "node)\n");
    printf("# %11s  %-22s %11s %9s %9s %13s %13s %5s\n", "size", "collective", "time(us)", "algbw",
           "busbw", "intra B/rank", "inter B/rank", "iters");
    fflush(stdout);
}

/* Every size from min to max (powers of 4) and collective into rows; rank 0 prints each row.
   Returns the row count. */
static int run_sizes(bench *b, const comm_opts *o, row *rows)
{
    int W = b->c.size[ZR_GROUP_WORLD], R = b->c.rank[ZR_GROUP_WORLD];
    int nrows = 0;
    for (size_t sz = o->min; sz <= o->max; sz *= 4) {
        size_t count = zr_div_up(sz / sizeof(float), (size_t)W);
        count = count > 0 ? count : 1;
        int it = o->iters > 0 ? o->iters : auto_iters(sz);
        for (int k = 0; k < C_COUNT; k++) {
            row *r = &rows[nrows++];
            ZR_TRY(measure(b, k, count, it, r), "");
            if (R == 0) {
                char in[32], ex[32];
                print_bytes(in, sizeof in, r->intra);
                print_bytes(ex, sizeof ex, r->inter);
                printf("  %11zu  %-22s %11.1f %9.3f %9.3f %13s %13s %5d\n", r->bytes, coll_names[k],
                       r->time * 1e6, r->algbw, r->busbw, in, ex, r->iters);
                fflush(stdout);
            }
        }
    }
    return nrows;
}

/* The ratios of ZeRO++ to the bf16 baselines at one size. */
typedef struct ratios {
    size_t at;                     /* the size: 64 MiB, or the largest measured below it */
    double ag, qw, rs, qg, tq, tp; /* inter bytes of each; qgZ's times, one chunk and pipelined */
} ratios;

static void ratios_of(const row *rows, int nrows, ratios *q)
{
    *q = (ratios){0};
    for (int i = 0; i < nrows; i++) {
        if (rows[i].bytes <= ((size_t)64 << 20) && rows[i].bytes > q->at) {
            q->at = rows[i].bytes;
        }
    }
    for (int i = 0; i < nrows; i++) {
        if (rows[i].bytes != q->at) {
            continue;
        }
        switch (rows[i].coll) {
        case C_AG_BF16:
            q->ag = rows[i].inter;
            break;
        case C_QWZ:
            q->qw = rows[i].inter;
            break;
        case C_RS_BF16:
            q->rs = rows[i].inter;
            break;
        case C_QGZ:
            q->qg = rows[i].inter;
            q->tq = rows[i].time;
            break;
        case C_QGZ_PIPE:
            q->tp = rows[i].time;
            break;
        default:
            break;
        }
    }
}

static void print_json(const zr_comm *c, int chunks, const row *rows, int nrows, const ratios *q)
{
    printf("{\"bench\":\"comm\",\"ranks\":%d,\"nodes\":%d,\"ranks_per_node\":%d,"
           "\"hpz\":%d,\"chunks\":%d,\"results\":[",
           c->size[ZR_GROUP_WORLD], c->n_nodes, c->ranks_per_node, c->size[ZR_GROUP_HPZ], chunks);
    for (int i = 0; i < nrows; i++) {
        const row *r = &rows[i];
        printf("%s{\"coll\":\"%s\",\"bytes\":%zu,\"time_us\":%.2f,\"algbw_gbs\":%.4f,"
               "\"busbw_gbs\":%.4f,\"intra_bytes\":%.0f,\"inter_bytes\":%.0f,"
               "\"iters\":%d}",
               i ? "," : "", coll_names[r->coll], r->bytes, r->time * 1e6, r->algbw, r->busbw,
               r->intra, r->inter, r->iters);
    }
    printf("],\"ratio_bytes\":%zu,", q->at);
    if (q->ag > 0 && q->rs > 0) {
        printf("\"inter_bytes_ratio_qwz\":%.6f,\"inter_bytes_ratio_qgz\":%.6f,", q->qw / q->ag,
               q->qg / q->rs);
    } else {
        printf("\"inter_bytes_ratio_qwz\":null,\"inter_bytes_ratio_qgz\":null,");
    }
    printf("\"qgz_pipeline_time_ratio\":%.4f}\n", q->tq > 0 ? q->tp / q->tq : 0.0);
}

/* Rank 0: the ratios under the table, and --json's line. */
static void print_summary(const zr_comm *c, const comm_opts *o, const row *rows, int nrows)
{
    ratios q;
    ratios_of(rows, nrows, &q);
    if (q.ag > 0 && q.rs > 0) {
        printf("# at %zu bytes: inter-node bytes qwZ/bf16 all-gather %.4f, qgZ/bf16 "
               "reduce-scatter %.4f\n",
               q.at, q.qw / q.ag, q.qg / q.rs);
    } else {
        printf("# one node: no inter-node bytes to compare\n");
    }
    printf("# at %zu bytes: qgZ time pipelined (%d chunks) / one chunk %.3f\n", q.at, o->chunks,
           q.tq > 0 ? q.tp / q.tq : 0.0);
    if (o->json) {
        print_json(c, o->chunks, rows, nrows, &q);
    }
    fflush(stdout);
}

int zr_bench_comm(int argc, char **argv)
{
    comm_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0) {
        return rc;
    }
    if (strcmp(o.device, "cpu") != 0) {
        zr_bench_comm_args a = {o.device, o.transport, o.json, o.iters, o.chunks, o.min, o.max};
        return zr_bench_comm_cuda(&a);
    }
    if (o.transport != NULL) {
        fprintf(stderr, "zr bench comm: --transport goes with --device cuda\n");
        return 2;
    }
    MPI_Init(&argc, &argv);
    bench b;
    bench_init(&b, &o);
    int nsizes = 0;
    for (size_t sz = o.min; sz <= o.max; sz *= 4) {
        nsizes++;
    }
    row *rows = NULL;
    ZR_TRY(zr_alloc_at((void **)&rows, sizeof *rows * (size_t)nsizes * C_COUNT, __FILE__, __LINE__),
           "");
    int R = b.c.rank[ZR_GROUP_WORLD];
    if (R == 0) {
        print_header(&b.c);
    }
    int nrows = run_sizes(&b, &o, rows);
    if (R == 0) {
        print_summary(&b.c, &o, rows, nrows);
    }
    zr_free(rows);
    bench_free(&b);
    MPI_Finalize();
    return 0;
}
