/*
 * bench_comm_cuda.c - "zr bench comm --device cuda": zr's collectives on
 * device buffers through a device transport, next to NCCL's own all-gather
 * and reduce-scatter on the same buffers in the same run.
 *
 *   mpirun -np N zr bench comm --device cuda [--transport nccl|staged] [--json]
 *          [--min 1K] [--max 256M] [--iters N] [--chunks C]
 *
 * Every rank uses the GPU of its node-local rank; the transport is NCCL
 * when every rank of a node has a GPU of its own (and the build has NCCL),
 * else the staged one. Per size and collective: the median over iterations
 * of the slowest rank's time (host clock from the start to the completion
 * zr_coll_wait reports, which includes the op's local kernels), algbw,
 * busbw and zr's exact bytes per rank to its own and other nodes. The NCCL
 * rows (ncclAllGather / ncclReduceScatter, fp32, sum) are the baselines and
 * are not accounted. Without a GPU it exits with status 1 at once, saying no
 * GPU was found. In the emulator build the numbers say nothing about speed:
 * run it with tiny sizes, for correctness only.
 */
#include "../src/base/cudalib.h" /* NCCL, opened for the baselines */
#include "../src/cli/cli.h"

#include "zr/coll.h"
#include "zr/device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if ZR_CUDA && ZR_NCCL
#include <cuda_runtime_api.h>
#define HAVE_NCCL 1
#else
#define HAVE_NCCL 0
#endif

enum { G_AG_BF16, G_QWZ, G_HPZ, G_RS_BF16, G_QGZ, G_QGZ_PIPE, G_NCCL_AG, G_NCCL_RS, G_COUNT };

static const char *const gnames[G_COUNT] = {
    "allgather_bf16", "qwz_int8",      "hpz_bf16",           "reduce_scatter_bf16",
    "qgz_int4",       "qgz_int4_pipe", "nccl_allgather_f32", "nccl_reduce_scatter_f32",
};

typedef struct gcomm {
    zr_comm c;
    zr_device gpu;
    zr_stream *s;
    zr_coll_op op;
    float *full, *out, *shard, *sec; /* device */
    int chunks;
#if HAVE_NCCL
    const zr_cudalib_nccl *lib; /* NULL until the baselines' set-up */
    ncclComm_t nccl;            /* the baselines' own communicator over world */
#endif
} gcomm;

typedef struct grow {
    int coll;
    size_t bytes;
    double time, algbw, busbw, intra, inter;
    int iters;
} grow;

#if HAVE_NCCL
/* A call of b's NCCL: NCCL_TRY(b, ncclGetUniqueId(&id)). */
#define NCCL_TRY(b, call)                                                                          \
    do {                                                                                           \
        ncclResult_t r_ = (b)->lib->call;                                                          \
        if (r_ != ncclSuccess) {                                                                   \
            ZR_FAIL(ZR_ERR_DEVICE, "%s failed: %s", #call, (b)->lib->ncclGetErrorString(r_));      \
        }                                                                                          \
    } while (0)

static zr_status nccl_baseline(gcomm *b, int k, size_t count)
{
    /* the zr_stream's CUDA handle is internal to zr; the legacy stream serves the baseline */
    if (k == G_NCCL_AG) {
        NCCL_TRY(b, ncclAllGather(b->shard, b->out, count, ncclFloat, b->nccl, NULL));
    } else {
        NCCL_TRY(b, ncclReduceScatter(b->full, b->out, count, ncclFloat, ncclSum, b->nccl, NULL));
    }
    if (cudaStreamSynchronize(NULL) != cudaSuccess) {
        ZR_FAIL(ZR_ERR_DEVICE, "cudaStreamSynchronize after the NCCL baseline failed");
    }
    return ZR_OK;
}

static zr_status nccl_setup(gcomm *b)
{
    ZR_CHECK(zr_cudalib_load_nccl(&b->lib));
    ncclUniqueId id;
    if (b->c.rank[ZR_GROUP_WORLD] == 0) {
        NCCL_TRY(b, ncclGetUniqueId(&id));
    }
    ZR_CHECK(zr_comm_bcast(&b->c, &id, sizeof id, 0));
    NCCL_TRY(b,
             ncclCommInitRank(&b->nccl, b->c.size[ZR_GROUP_WORLD], id, b->c.rank[ZR_GROUP_WORLD]));
    return ZR_OK;
}
#endif

/* One call of collective k on a full buffer of count * W elements. */
static zr_status run_one(gcomm *b, int k, size_t count)
{
    zr_comm *c = &b->c;
    zr_wire bf16 = {ZR_WIRE_BF16, {0, 0, ZR_QUANT_SYM}};
    zr_wire q8 = {ZR_WIRE_QUANT, {8, ZR_QUANT_DEFAULT_GROUP, ZR_QUANT_SYM}};
    zr_qgz_config cfg = zr_qgz_config_default();
    int W = c->size[ZR_GROUP_WORLD], h = c->size[ZR_GROUP_HPZ];
    switch (k) {
    case G_AG_BF16:
        return zr_allgather(c, ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, &bf16, ZR_DTYPE_F32, b->shard,
                            count, ZR_DTYPE_F32, b->out, &b->op);
    case G_QWZ:
        return zr_allgather(c, ZR_GROUP_WORLD, ZR_KIND_QWZ, &q8, ZR_DTYPE_F32, b->shard, count,
                            ZR_DTYPE_F32, b->out, &b->op);
    case G_HPZ:
        return zr_hpz_gather(c, &bf16, ZR_DTYPE_F32, b->sec, count * (size_t)W / (size_t)h,
                             ZR_DTYPE_F32, b->out, &b->op);
    case G_RS_BF16:
        return zr_reduce_scatter(c, ZR_GROUP_WORLD, &bf16, ZR_DTYPE_F32, b->full, count, b->out,
                                 &b->op);
    case G_QGZ:
        return zr_qgz(c, &cfg, ZR_DTYPE_F32, b->full, count, b->out, NULL, &b->op);
    case G_QGZ_PIPE:
        cfg.chunks = b->chunks;
        return zr_qgz(c, &cfg, ZR_DTYPE_F32, b->full, count, b->out, NULL, &b->op);
    case G_NCCL_AG:
    case G_NCCL_RS:
#if HAVE_NCCL
        return nccl_baseline(b, k, count);
#else
        return ZR_OK;
#endif
    }
    ZR_FAIL(ZR_ERR_INVALID, "bench comm: unknown collective %d", k);
}

static zr_status measure(gcomm *b, int k, size_t count, int iters, grow *r)
{
    zr_comm *c = &b->c;
    int W = c->size[ZR_GROUP_WORLD];
    double *t = NULL;
    ZR_ALLOC(t, (size_t)iters);
    zr_status st = run_one(b, k, count); /* warm-up: workspace, connections */
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
    int n = k == G_HPZ ? c->size[ZR_GROUP_HPZ] : W;
    int baseline = k == G_NCCL_AG || k == G_NCCL_RS;
    r->coll = k;
    r->bytes = count * (size_t)W * sizeof(float);
    r->time = med;
    r->algbw = med > 0 ? (double)r->bytes / med / 1e9 : 0;
    r->busbw = r->algbw * (double)(n - 1) / (double)n;
    r->iters = iters;
    r->intra = baseline ? -1 : (double)intra / iters;
    r->inter = baseline ? -1 : (double)inter / iters;
    return ZR_OK;
}

/* Device buffers with values of a plausible scale, different per rank. */
static zr_status buffers(gcomm *b, size_t max_elems)
{
    zr_comm *c = &b->c;
    int W = c->size[ZR_GROUP_WORLD];
    size_t sec_elems = max_elems / (size_t)c->size[ZR_GROUP_HPZ];
    ZR_DEVICE_ALLOC(&b->gpu, b->full, max_elems);
    ZR_DEVICE_ALLOC(&b->gpu, b->out, max_elems);
    ZR_DEVICE_ALLOC(&b->gpu, b->shard, max_elems / (size_t)W);
    ZR_DEVICE_ALLOC(&b->gpu, b->sec, sec_elems);
    float *h = NULL;
    ZR_ALLOC(h, max_elems);
    uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(c->rank[ZR_GROUP_WORLD] + 1);
    for (size_t i = 0; i < max_elems; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        h[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5) * 0.02f;
    }
    zr_status st = zr_memcpy_async(b->full, h, max_elems * sizeof(float), b->s);
    if (st == ZR_OK) {
        st = zr_memcpy_async(b->shard, h, max_elems / (size_t)W * sizeof(float), b->s);
    }
    if (st == ZR_OK) {
        st = zr_memcpy_async(b->sec, h, sec_elems * sizeof(float), b->s);
    }
    if (st == ZR_OK) {
        st = zr_stream_sync(b->s);
    }
    zr_free(h);
    return st;
}

static void print_json(const gcomm *b, const char *transport, const grow *rows, int nrows)
{
    const zr_comm *c = &b->c;
    char desc[256];
    zr_device_describe(&b->gpu, desc, sizeof desc);
    printf("{\"bench\":\"comm\",\"device\":\"%s\",\"transport\":\"%s\",\"ranks\":%d,\"nodes\":%d,"
           "\"ranks_per_node\":%d,\"hpz\":%d,\"chunks\":%d,\"results\":[",
           desc, transport, c->size[ZR_GROUP_WORLD], c->n_nodes, c->ranks_per_node,
           c->size[ZR_GROUP_HPZ], b->chunks);
    for (int i = 0; i < nrows; i++) {
        const grow *r = &rows[i];
        printf("%s{\"coll\":\"%s\",\"bytes\":%zu,\"time_us\":%.2f,\"algbw_gbs\":%.4f,"
               "\"busbw_gbs\":%.4f,\"intra_bytes\":%.0f,\"inter_bytes\":%.0f,\"iters\":%d}",
               i ? "," : "", gnames[r->coll], r->bytes, r->time * 1e6, r->algbw, r->busbw, r->intra,
               r->inter, r->iters);
    }
    printf("]}\n");
}

static void print_row(const grow *r)
{
    char in[32], ex[32];
    snprintf(in, sizeof in, r->intra < 0 ? "-" : "%.0f", r->intra);
    snprintf(ex, sizeof ex, r->inter < 0 ? "-" : "%.0f", r->inter);
    printf("  %11zu  %-24s %11.1f %9.3f %9.3f %13s %13s %5d\n", r->bytes, gnames[r->coll],
           r->time * 1e6, r->algbw, r->busbw, in, ex, r->iters);
    fflush(stdout);
}

/* Set up the GPU, its transport and the baselines' communicator; run every size. */
static zr_status run_all(gcomm *b, const zr_bench_comm_args *a, grow *rows, int *nrows,
                         const char **tname)
{
    zr_comm *c = &b->c;
    ZR_CHECK(zr_device_open_for_rank(c->rank[ZR_GROUP_NODE], c->ranks_per_node, &b->gpu));
    ZR_CHECK(zr_stream_create(&b->gpu, &b->s));
    int ngpu = 0;
    ZR_CHECK(zr_device_cuda_count(&ngpu));
    int nccl = HAVE_NCCL && ngpu >= c->ranks_per_node;
    if (a->transport != NULL) {
        nccl = strcmp(a->transport, "nccl") == 0;
    }
    const zr_transport *t = nccl ? &zr_transport_nccl : &zr_transport_staged;
    *tname = t->name;
    zr_transport_device arg = {&b->gpu, b->s, 0};
    ZR_CHECK(zr_comm_use_transport(c, t, &arg));
    int W = c->size[ZR_GROUP_WORLD];
    size_t max_elems = zr_round_up(a->max / sizeof(float), (size_t)W);
    ZR_CHECK(buffers(b, max_elems));
#if HAVE_NCCL
    int base = nccl; /* NCCL's own collectives need one GPU per rank too */
    if (base) {
        ZR_CHECK(nccl_setup(b));
    }
#else
    int base = 0;
#endif
    for (size_t sz = a->min; sz <= a->max; sz *= 4) {
        size_t count = zr_div_up(sz / sizeof(float), (size_t)W);
        count = count > 0 ? count : 1;
        int it = a->iters > 0 ? a->iters : (sz <= ((size_t)4 << 20) ? 10 : 3);
        for (int k = 0; k < G_COUNT; k++) {
            if ((k == G_NCCL_AG || k == G_NCCL_RS) && !base) {
                continue;
            }
            grow *r = &rows[(*nrows)++];
            ZR_CHECK(measure(b, k, count, it, r));
            if (c->rank[ZR_GROUP_WORLD] == 0) {
                print_row(r);
            }
        }
    }
    return ZR_OK;
}

static void release(gcomm *b)
{
    zr_coll_op_free(&b->op);
#if HAVE_NCCL
    if (b->nccl != NULL) {
        b->lib->ncclCommDestroy(b->nccl);
    }
#endif
    zr_device_free(&b->gpu, b->full);
    zr_device_free(&b->gpu, b->out);
    zr_device_free(&b->gpu, b->shard);
    zr_device_free(&b->gpu, b->sec);
    zr_comm_free(&b->c);
    zr_stream_destroy(b->s);
}

int zr_bench_comm_cuda(const zr_bench_comm_args *a)
{
    int ngpu = 0, ordinal = -1;
    zr_device_kind kind = ZR_DEVICE_CPU;
    if (zr_device_parse(a->device, &kind, &ordinal) != ZR_OK || kind != ZR_DEVICE_CUDA ||
        ordinal >= 0) {
        fprintf(stderr,
                "zr bench comm: --device must be cpu or cuda (each rank uses the GPU of "
                "its node-local rank), got '%s'\n",
                a->device);
        return 2;
    }
    if (zr_device_cuda_count(&ngpu) != ZR_OK) {
        fprintf(stderr, "zr bench comm: --device %s: %s\n", a->device, zr_error_message());
        return 1;
    }
    if (a->transport != NULL && strcmp(a->transport, "nccl") != 0 &&
        strcmp(a->transport, "staged") != 0) {
        fprintf(stderr, "zr bench comm: --transport must be nccl or staged, got '%s'\n",
                a->transport);
        return 2;
    }
    MPI_Init(NULL, NULL);
    gcomm b;
    memset(&b, 0, sizeof b);
    b.chunks = a->chunks;
    zr_status st = zr_comm_init(&b.c, MPI_COMM_WORLD, NULL);
    int nsizes = 0;
    for (size_t sz = a->min; sz <= a->max; sz *= 4) {
        nsizes++;
    }
    grow *rows = calloc((size_t)nsizes * G_COUNT, sizeof *rows);
    int nrows = 0, R = st == ZR_OK ? b.c.rank[ZR_GROUP_WORLD] : 0;
    const char *tname = "?";
    if (st == ZR_OK && R == 0) {
        char desc[256];
        zr_comm_describe(&b.c, desc, sizeof desc);
        printf("# zr bench comm --device cuda: %s; zr's collectives on device buffers, NCCL's "
               "own as baselines\n",
               desc);
        printf("# %11s  %-24s %11s %9s %9s %13s %13s %5s\n", "size", "collective", "time(us)",
               "algbw", "busbw", "intra B/rank", "inter B/rank", "iters");
        fflush(stdout);
    }
    if (st == ZR_OK) {
        st = run_all(&b, a, rows, &nrows, &tname);
    }
    st = st == ZR_OK || b.c.control == NULL ? st : zr_comm_agree(&b.c, st);
    if (st != ZR_OK) {
        if (R == 0) {
            fprintf(stderr, "zr bench comm: %s: %s\n", zr_status_str(st), zr_error_message());
        }
        free(rows);
        MPI_Abort(MPI_COMM_WORLD, 1);
        return 1;
    }
    if (R == 0) {
        printf("# transport %s; time = median of the slowest rank, start to completion\n", tname);
        if (a->json) {
            print_json(&b, tname, rows, nrows);
        }
        fflush(stdout);
    }
    free(rows);
    release(&b);
    MPI_Finalize();
    return 0;
}
