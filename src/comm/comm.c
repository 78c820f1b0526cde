/*
 * comm.c - the zr communicator: node topology, process groups, error
 * agreement and traffic accounting on top of a pluggable transport.
 *
 * Every group is a strided set of world ranks (first + k*stride), which is
 * what node-major placement gives: NODE and HPZ groups are consecutive ranks,
 * CROSS groups have stride D. Keeping that arithmetic here means accounting
 * can tell intra-node from inter-node bytes without asking MPI anything.
 */
#define _POSIX_C_SOURCE 200809L

#include "zr/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const kind_names[ZR_KIND_COUNT] = {
    [ZR_KIND_ALLGATHER] = "allgather",   [ZR_KIND_REDUCE_SCATTER] = "reduce_scatter",
    [ZR_KIND_ALLREDUCE] = "allreduce",   [ZR_KIND_QWZ] = "qwz",
    [ZR_KIND_HPZ] = "hpz",               [ZR_KIND_QGZ] = "qgz",
    [ZR_KIND_ALLTOALL] = "alltoall",     [ZR_KIND_CONTROL] = "control",
};

static const char *const group_names[ZR_GROUP_COUNT] = {
    [ZR_GROUP_WORLD] = "world",
    [ZR_GROUP_NODE] = "node",
    [ZR_GROUP_CROSS] = "cross",
    [ZR_GROUP_HPZ] = "hpz",
};

const char *zr_kind_name(zr_kind kind)
{
    return (unsigned)kind < ZR_KIND_COUNT ? kind_names[kind] : "?";
}

const char *zr_group_name(zr_group group)
{
    return (unsigned)group < ZR_GROUP_COUNT ? group_names[group] : "?";
}

zr_status zr_mpi_status_at(int rc, const char *file, int line, const char *call)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) {
        snprintf(msg, sizeof msg, "MPI error code %d", rc);
    }
    return zr_error_at(ZR_ERR_MPI, file, line, "%s failed: %s", call, msg);
}

static MPI_Comm abort_world = MPI_COMM_NULL;

static void abort_with_mpi(int code)
{
    if (abort_world != MPI_COMM_NULL) {
        MPI_Abort(abort_world, code);
    }
    exit(code);
}

/*
 * Parse ZR_RANKS_PER_NODE. Returns 0 when unset; -1 when set but not a
 * positive integer (every rank reads the same environment from mpirun, so the
 * verdict is the same everywhere).
 */
static int env_ranks_per_node(void)
{
    const char *s = getenv("ZR_RANKS_PER_NODE");
    if (s == NULL || s[0] == '\0') {
        return 0;
    }
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (*end != '\0' || v <= 0 || v > 1 << 20) {
        return -1;
    }
    return (int)v;
}

int zr_comm_check_placement(const int *leader, const int *local_size, int size, char *why,
                            size_t len)
{
    why[0] = '\0';
    if (size <= 0) {
        snprintf(why, len, "empty world");
        return 0;
    }
    int d = local_size[0];
    for (int r = 0; r < size; r++) {
        if (local_size[r] != d) {
            snprintf(why, len,
                     "nodes hold different numbers of ranks (rank 0's node has %d, rank %d's has "
                     "%d); zr needs the same number of ranks on every node",
                     d, r, local_size[r]);
            return 0;
        }
        if (leader[r] != r / d * d) {
            snprintf(why, len,
                     "ranks of a node are not consecutive (rank %d shares a node with rank %d); "
                     "launch with node-major placement (Open MPI: --map-by slot, the default; "
                     "Slurm: --distribution=block)",
                     r, leader[r]);
            return 0;
        }
    }
    return d;
}

/*
 * Real node detection: ranks sharing memory form a node, named by its lowest
 * world rank. The verdict comes from all-gathered data, so it is the same on
 * every rank.
 */
static zr_status detect_nodes(MPI_Comm world, int rank, int size, int *rpn, char *why, size_t n)
{
    MPI_Comm shm;
    ZR_MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shm));
    int mine[2];
    MPI_Comm_size(shm, &mine[1]);
    int rc = MPI_Allreduce(&rank, &mine[0], 1, MPI_INT, MPI_MIN, shm);
    MPI_Comm_free(&shm);
    if (rc != MPI_SUCCESS) {
        return zr_mpi_status_at(rc, __FILE__, __LINE__, "MPI_Allreduce");
    }
    int *all = malloc(sizeof(int) * 2 * (size_t)size);
    if (all == NULL) {
        ZR_FAIL(ZR_ERR_NOMEM, "out of memory detecting nodes");
    }
    rc = MPI_Allgather(mine, 2, MPI_INT, all, 2, MPI_INT, world);
    if (rc != MPI_SUCCESS) {
        free(all);
        return zr_mpi_status_at(rc, __FILE__, __LINE__, "MPI_Allgather");
    }
    int *tmp = malloc(sizeof(int) * 2 * (size_t)size);
    if (tmp == NULL) {
        free(all);
        ZR_FAIL(ZR_ERR_NOMEM, "out of memory detecting nodes");
    }
    for (int r = 0; r < size; r++) {
        tmp[r] = all[2 * r];
        tmp[size + r] = all[2 * r + 1];
    }
    *rpn = zr_comm_check_placement(tmp, tmp + size, size, why, n);
    free(tmp);
    free(all);
    return ZR_OK;
}

static zr_status split(zr_comm *c, zr_group g, int color, int key)
{
    ZR_MPI_CHECK(MPI_Comm_split(c->mpi[ZR_GROUP_WORLD], color, key, &c->mpi[g]));
    ZR_MPI_CHECK(MPI_Comm_rank(c->mpi[g], &c->rank[g]));
    ZR_MPI_CHECK(MPI_Comm_size(c->mpi[g], &c->size[g]));
    return ZR_OK;
}

zr_status zr_comm_init(zr_comm *c, MPI_Comm world, const zr_comm_config *cfg)
{
    memset(c, 0, sizeof *c);
    for (int g = 0; g < ZR_GROUP_COUNT; g++) {
        c->mpi[g] = MPI_COMM_NULL;
    }
    c->transport = &zr_transport_mpi;
    c->mpi[ZR_GROUP_WORLD] = world;
    /* errors come back as return codes so that zr can report them itself */
    ZR_MPI_CHECK(MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN));
    int rank, size;
    ZR_MPI_CHECK(MPI_Comm_rank(world, &rank));
    ZR_MPI_CHECK(MPI_Comm_size(world, &size));
    zr_log_set_rank(rank);
    abort_world = world;
    zr_set_abort_hook(abort_with_mpi);

    zr_comm_config none = {0, 0};
    if (cfg == NULL) {
        cfg = &none;
    }
    char why[512] = "";
    int rpn = cfg->ranks_per_node;
    if (rpn == 0) {
        rpn = env_ranks_per_node();
        if (rpn < 0) {
            ZR_FAIL(ZR_ERR_INVALID, "ZR_RANKS_PER_NODE='%s' is not a positive integer",
                    getenv("ZR_RANKS_PER_NODE"));
        }
    }
    if (rpn > 0) {
        c->emulated = 1;
    } else {
        ZR_CHECK(detect_nodes(world, rank, size, &rpn, why, sizeof why));
        if (rpn == 0) {
            ZR_FAIL(ZR_ERR_INVALID, "cannot use this rank placement: %s", why);
        }
    }
    if (rpn < 0 || size % rpn != 0) {
        ZR_FAIL(ZR_ERR_INVALID,
                "world of %d ranks is not divisible by %d ranks per node; use a rank count that "
                "is a multiple of the ranks per node",
                size, rpn);
    }
    int h = cfg->hpz_size > 0 ? cfg->hpz_size : rpn;
    if (cfg->hpz_size < 0 || size % h != 0) {
        ZR_FAIL(ZR_ERR_INVALID,
                "world of %d ranks is not divisible by the hpZ partition size %d; choose "
                "zero_hpz_partition_size dividing the world size (usually the ranks per node)",
                size, h);
    }
    if (rpn % h != 0 && h % rpn != 0) {
        ZR_FAIL(ZR_ERR_INVALID,
                "hpZ partition size %d neither divides nor is a multiple of the %d ranks per "
                "node, so its groups would straddle node boundaries",
                h, rpn);
    }
    c->ranks_per_node = rpn;
    c->n_nodes = size / rpn;
    c->node = rank / rpn;

    c->rank[ZR_GROUP_WORLD] = rank;
    c->size[ZR_GROUP_WORLD] = size;
    c->first[ZR_GROUP_WORLD] = 0;
    c->stride[ZR_GROUP_WORLD] = 1;
    ZR_CHECK(split(c, ZR_GROUP_NODE, rank / rpn, rank));
    c->first[ZR_GROUP_NODE] = rank / rpn * rpn;
    c->stride[ZR_GROUP_NODE] = 1;
    ZR_CHECK(split(c, ZR_GROUP_CROSS, rank % rpn, rank));
    c->first[ZR_GROUP_CROSS] = rank % rpn;
    c->stride[ZR_GROUP_CROSS] = rpn;
    ZR_CHECK(split(c, ZR_GROUP_HPZ, rank / h, rank));
    c->first[ZR_GROUP_HPZ] = rank / h * h;
    c->stride[ZR_GROUP_HPZ] = 1;

    /* the arithmetic above must agree with what MPI built */
    for (int g = 1; g < ZR_GROUP_COUNT; g++) {
        ZR_ASSERT(zr_comm_world_rank(c, (zr_group)g, c->rank[g]) == rank);
    }
    return ZR_OK;
}

void zr_comm_free(zr_comm *c)
{
    for (int g = 1; g < ZR_GROUP_COUNT; g++) {
        if (c->mpi[g] != MPI_COMM_NULL) {
            MPI_Comm_free(&c->mpi[g]);
        }
    }
    if (abort_world == c->mpi[ZR_GROUP_WORLD]) {
        abort_world = MPI_COMM_NULL;
        zr_set_abort_hook(NULL);
    }
    memset(c, 0, sizeof *c);
}

/* ---- exchanges and accounting -------------------------------------------- */

static void account(zr_comm *c, zr_group g, zr_kind kind, const size_t *scount)
{
    zr_traffic_row *row = &c->traffic.kind[kind];
    row->calls++;
    int me = c->rank[g];
    for (int p = 0; p < c->size[g]; p++) {
        if (p == me || scount[p] == 0) {
            continue;
        }
        int peer = zr_comm_world_rank(c, g, p);
        if (zr_comm_node_of(c, peer) == c->node) {
            row->bytes_intra += scount[p];
        } else {
            row->bytes_inter += scount[p];
        }
    }
}

zr_status zr_comm_iexchange(zr_comm *c, zr_group g, zr_kind kind, const void *send,
                            const size_t *scount, const size_t *sdisp, void *recv,
                            const size_t *rcount, const size_t *rdisp, zr_request *req)
{
    ZR_ASSERT((unsigned)g < ZR_GROUP_COUNT && (unsigned)kind < ZR_KIND_COUNT);
    ZR_ASSERT(!req->active);
    int me = c->rank[g];
    if (scount[me] != 0 && rcount[me] != 0) {
        ZR_ASSERT(scount[me] == rcount[me]);
        memmove((char *)recv + rdisp[me], (const char *)send + sdisp[me], scount[me]);
    }
    account(c, g, kind, scount);
    return c->transport->iexchange(c, g, send, scount, sdisp, recv, rcount, rdisp, req);
}

/* Equal-block layouts need count/displacement arrays; groups are small, so a stack buffer. */
#define MAX_STACK_PEERS 256

static zr_status equal_blocks(zr_comm *c, zr_group g, zr_kind kind, const void *send,
                              size_t bytes, int send_same, void *recv, zr_request *req)
{
    int n = c->size[g];
    size_t stack[4 * MAX_STACK_PEERS];
    size_t *heap = NULL, *a = stack;
    if (n > MAX_STACK_PEERS) {
        ZR_ALLOC(heap, 4 * (size_t)n);
        a = heap;
    }
    size_t *sc = a, *sd = a + n, *rc = a + 2 * n, *rd = a + 3 * n;
    for (int p = 0; p < n; p++) {
        sc[p] = rc[p] = bytes;
        sd[p] = send_same ? 0 : (size_t)p * bytes;
        rd[p] = (size_t)p * bytes;
    }
    if (send_same) {
        /* all-gather: my own block is already in place when send aliases it */
        const char *own = (const char *)recv + (size_t)c->rank[g] * bytes;
        if (send == own) {
            sc[c->rank[g]] = 0;
        }
    }
    zr_status st = zr_comm_iexchange(c, g, kind, send, sc, sd, recv, rc, rd, req);
    zr_free(heap);
    return st;
}

zr_status zr_comm_iallgather(zr_comm *c, zr_group g, zr_kind kind, const void *send,
                             size_t bytes, void *recv, zr_request *req)
{
    return equal_blocks(c, g, kind, send, bytes, 1, recv, req);
}

zr_status zr_comm_ialltoall(zr_comm *c, zr_group g, zr_kind kind, const void *send,
                            size_t bytes, void *recv, zr_request *req)
{
    return equal_blocks(c, g, kind, send, bytes, 0, recv, req);
}

zr_status zr_comm_wait(zr_comm *c, zr_request *req)
{
    if (!req->active) {
        return ZR_OK;
    }
    return c->transport->wait(c, req);
}

zr_status zr_comm_test(zr_comm *c, zr_request *req, int *done)
{
    if (!req->active) {
        *done = 1;
        return ZR_OK;
    }
    if (c->transport->test == NULL) {
        *done = 0;
        return ZR_OK;
    }
    return c->transport->test(c, req, done);
}

zr_status zr_comm_allgather(zr_comm *c, zr_group g, zr_kind kind, const void *send, size_t bytes,
                            void *recv)
{
    zr_request req = ZR_REQUEST_INIT;
    ZR_CHECK(zr_comm_iallgather(c, g, kind, send, bytes, recv, &req));
    return zr_comm_wait(c, &req);
}

zr_status zr_comm_alltoall(zr_comm *c, zr_group g, zr_kind kind, const void *send, size_t bytes,
                           void *recv)
{
    zr_request req = ZR_REQUEST_INIT;
    ZR_CHECK(zr_comm_ialltoall(c, g, kind, send, bytes, recv, &req));
    return zr_comm_wait(c, &req);
}

/* ---- control values -------------------------------------------------------- */

/*
 * Direct all-reduce for a handful of values: all-gather everyone's vector and
 * reduce locally in rank order, so every rank computes the same bits.
 */
static zr_status gather_values(zr_comm *c, zr_group g, const void *vals, size_t bytes,
                               void **all)
{
    void *buf;
    ZR_CHECK(zr_alloc_at(&buf, bytes * (size_t)c->size[g], __FILE__, __LINE__));
    memcpy((char *)buf + (size_t)c->rank[g] * bytes, vals, bytes);
    zr_status st = zr_comm_allgather(c, g, ZR_KIND_CONTROL,
                                     (char *)buf + (size_t)c->rank[g] * bytes, bytes, buf);
    if (st != ZR_OK) {
        zr_free(buf);
        return st;
    }
    *all = buf;
    return ZR_OK;
}

zr_status zr_comm_allreduce_sum_f64(zr_comm *c, zr_group g, double *vals, int n)
{
    double *all;
    ZR_CHECK(gather_values(c, g, vals, sizeof(double) * (size_t)n, (void **)&all));
    for (int i = 0; i < n; i++) {
        double s = 0.0;
        for (int p = 0; p < c->size[g]; p++) {
            s += all[(size_t)p * n + i];
        }
        vals[i] = s;
    }
    zr_free(all);
    return ZR_OK;
}

zr_status zr_comm_allreduce_max_i64(zr_comm *c, zr_group g, int64_t *vals, int n)
{
    int64_t *all;
    ZR_CHECK(gather_values(c, g, vals, sizeof(int64_t) * (size_t)n, (void **)&all));
    for (int i = 0; i < n; i++) {
        int64_t m = all[i];
        for (int p = 1; p < c->size[g]; p++) {
            if (all[(size_t)p * n + i] > m) {
                m = all[(size_t)p * n + i];
            }
        }
        vals[i] = m;
    }
    zr_free(all);
    return ZR_OK;
}

zr_status zr_comm_barrier(zr_comm *c)
{
    ZR_MPI_CHECK(MPI_Barrier(c->mpi[ZR_GROUP_WORLD]));
    return ZR_OK;
}

zr_status zr_comm_bcast(zr_comm *c, void *buf, size_t bytes, int root)
{
    /* root sends the whole buffer to every other rank: the direct algorithm */
    zr_traffic_row *row = &c->traffic.kind[ZR_KIND_CONTROL];
    row->calls++;
    if (c->rank[ZR_GROUP_WORLD] == root) {
        for (int p = 0; p < c->size[ZR_GROUP_WORLD]; p++) {
            if (p == root) {
                continue;
            }
            if (zr_comm_node_of(c, p) == c->node) {
                row->bytes_intra += bytes;
            } else {
                row->bytes_inter += bytes;
            }
        }
    }
    char *p = buf;
    size_t left = bytes;
    while (left > 0) {
        int chunk = left > (size_t)1 << 30 ? 1 << 30 : (int)left;
        ZR_MPI_CHECK(MPI_Bcast(p, chunk, MPI_BYTE, root, c->mpi[ZR_GROUP_WORLD]));
        p += chunk;
        left -= (size_t)chunk;
    }
    return ZR_OK;
}

zr_status zr_comm_agree(zr_comm *c, zr_status local)
{
    /* lowest failing rank wins, so the message is deterministic */
    int size = c->size[ZR_GROUP_WORLD];
    int64_t key = local != ZR_OK ? -(int64_t)c->rank[ZR_GROUP_WORLD] : -(int64_t)size;
    ZR_CHECK(zr_comm_allreduce_max_i64(c, ZR_GROUP_WORLD, &key, 1));
    if (key == -(int64_t)size) {
        return ZR_OK;
    }
    int root = (int)-key;
    struct {
        int32_t status;
        int32_t agreed; /* the message names its rank already: an error agreed on before */
        char msg[1000];
    } m;
    memset(&m, 0, sizeof m);
    if (c->rank[ZR_GROUP_WORLD] == root) {
        m.status = (int32_t)local;
        m.agreed = zr_error_agreed();
        snprintf(m.msg, sizeof m.msg, "%s", zr_error_message());
    }
    ZR_CHECK(zr_comm_bcast(c, &m, sizeof m, root));
    char full[1100];
    if (size > 1 && !m.agreed) {
        snprintf(full, sizeof full, "rank %d: %s", root, m.msg);
    } else {
        snprintf(full, sizeof full, "%s", m.msg);
    }
    zr_error_set_agreed(full);
    return (zr_status)m.status;
}

void zr_comm_traffic_reset(zr_comm *c)
{
    memset(&c->traffic, 0, sizeof c->traffic);
}

zr_traffic zr_comm_traffic_get(const zr_comm *c)
{
    return c->traffic;
}

zr_status zr_comm_traffic_total(zr_comm *c, zr_traffic *total)
{
    enum { N = ZR_KIND_COUNT * 3 };
    uint64_t mine[N], sum[N];
    for (int k = 0; k < ZR_KIND_COUNT; k++) {
        mine[3 * k] = c->traffic.kind[k].calls;
        mine[3 * k + 1] = c->traffic.kind[k].bytes_intra;
        mine[3 * k + 2] = c->traffic.kind[k].bytes_inter;
    }
    ZR_MPI_CHECK(
        MPI_Allreduce(mine, sum, N, MPI_UINT64_T, MPI_SUM, c->mpi[ZR_GROUP_WORLD]));
    for (int k = 0; k < ZR_KIND_COUNT; k++) {
        total->kind[k].calls = sum[3 * k];
        total->kind[k].bytes_intra = sum[3 * k + 1];
        total->kind[k].bytes_inter = sum[3 * k + 2];
    }
    return ZR_OK;
}

void zr_comm_describe(const zr_comm *c, char *buf, size_t len)
{
    snprintf(buf, len, "%d ranks = %d node%s x %d (%s), hpZ group %d", c->size[ZR_GROUP_WORLD],
             c->n_nodes, c->n_nodes == 1 ? "" : "s", c->ranks_per_node,
             c->emulated ? "emulated" : "detected", c->size[ZR_GROUP_HPZ]);
}
