/*
 * control.c - the control plane's traffic: small control values, barrier,
 * broadcast, error agreement, the final abort and the traffic total.
 *
 * All of it is MPI on host memory whatever the data transport, and every
 * wait goes through the watchdog. Agreements run point-to-point on ctl (a
 * duplicate of world that carries no data exchange), so they work while
 * exchanges are still in flight and a wait that does not complete can name
 * the ranks it misses. Control values travel as exchanges of kind
 * ZR_KIND_CONTROL, which exchange.c always sends over MPI. The payloads are
 * accounted as CONTROL as the direct algorithms they are (every rank to
 * every other, or the root to every other).
 */
#define _POSIX_C_SOURCE 200809L

#include "comm_impl.h"

#include "zr/file.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* A control collective: this rank sends bytes_to_each to every other rank (root < 0) or is root. */
static void account_control(zr_comm *c, size_t bytes_to_each, int root)
{
    zr_traffic_row *row = &c->traffic.kind[ZR_KIND_CONTROL];
    row->calls++;
    int me = c->rank[ZR_GROUP_WORLD];
    if (root >= 0 && root != me) {
        return;
    }
    for (int p = 0; p < c->size[ZR_GROUP_WORLD]; p++) {
        if (p == me) {
            continue;
        }
        if (c->ranks_per_node > 0 && zr_comm_node_of(c, p) == c->node) {
            row->bytes_intra += bytes_to_each;
        } else {
            row->bytes_inter += bytes_to_each;
        }
    }
}

zr_status zr_comm_ctl_exchange(zr_comm *c, const void *mine, size_t bytes, void *all, int root,
                               const char *what)
{
    int W = c->size[ZR_GROUP_WORLD], me = c->rank[ZR_GROUP_WORLD];
    MPI_Comm ctl = c->control->ctl;
    if (root < 0) {
        memmove((char *)all + (size_t)me * bytes, mine, bytes);
    }
    if (W == 1) {
        return ZR_OK;
    }
    int tag = root < 0 ? ZR_CTL_TAG_GATHER : ZR_CTL_TAG_BCAST;
    MPI_Request *reqs = NULL;
    int *peer = NULL;
    ZR_ALLOC(reqs, 2 * (size_t)W);
    zr_status st = ZR_ALLOC_STATUS(peer, 4 * (size_t)W);
    int n = 0, nrecv = 0;
    for (int r = 0; r < W && st == ZR_OK; r++) {
        if (r == me || (root >= 0 && me != root && r != root) || (root >= 0 && me == root)) {
            continue;
        }
        void *dst = root < 0 ? (char *)all + (size_t)r * bytes : all;
        int rc = MPI_Irecv(dst, (int)bytes, MPI_BYTE, r, tag, ctl, &reqs[n]);
        if (rc != MPI_SUCCESS) {
            st = zr_mpi_status_at(rc, __FILE__, __LINE__, "MPI_Irecv");
            break;
        }
        peer[n++] = r;
    }
    nrecv = n;
    for (int r = 0; r < W && st == ZR_OK; r++) {
        if (r == me || (root >= 0 && me != root)) {
            continue;
        }
        int rc = MPI_Isend(mine, (int)bytes, MPI_BYTE, r, tag, ctl, &reqs[n]);
        if (rc != MPI_SUCCESS) {
            st = zr_mpi_status_at(rc, __FILE__, __LINE__, "MPI_Isend");
            break;
        }
        peer[n++] = r;
    }
    if (st == ZR_OK) {
        account_control(c, bytes, root);
        st = zr_comm_poll(c, reqs, n, peer, nrecv, peer + 2 * W, what, ZR_GROUP_WORLD, -1, 0);
    } else {
        for (int i = 0; i < n; i++) {
            MPI_Cancel(&reqs[i]);
            MPI_Request_free(&reqs[i]);
        }
    }
    zr_free(peer);
    zr_free(reqs);
    return st;
}

/* ---- control values ---------------------------------------------------------- */

/*
 * Direct all-reduce for a handful of values: all-gather everyone's vector and
 * reduce locally in rank order, so every rank computes the same bits.
 */
static zr_status gather_values(zr_comm *c, zr_group g, const void *vals, size_t bytes, void **all)
{
    unsigned char *buf;
    ZR_ALLOC(buf, bytes * (size_t)c->size[g]);
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

/* ---- MPI collectives on world ------------------------------------------------ */

zr_status zr_comm_barrier(zr_comm *c)
{
    MPI_Request req = MPI_REQUEST_NULL;
    long long index = (long long)c->posted[ZR_GROUP_COUNT]++;
    ZR_MPI_CHECK(MPI_Ibarrier(c->control->mpi[ZR_GROUP_WORLD], &req));
    return zr_comm_poll(c, &req, 1, NULL, 0, NULL, "barrier", ZR_GROUP_WORLD, ZR_GROUP_COUNT,
                        index);
}

zr_status zr_comm_bcast(zr_comm *c, void *buf, size_t bytes, int root)
{
    MPI_Comm world = c->control->mpi[ZR_GROUP_WORLD];
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
    /* one nonblocking broadcast per GiB, all completed by one bounded wait */
    enum { MAX_CHUNKS = 64 };
    MPI_Request reqs[MAX_CHUNKS];
    int peer[MAX_CHUNKS], scratch[MAX_CHUNKS];
    char *p = buf;
    size_t left = bytes;
    long long index = (long long)c->posted[ZR_GROUP_COUNT]++;
    while (left > 0) {
        int n = 0;
        for (; left > 0 && n < MAX_CHUNKS; n++) {
            int chunk = left > (size_t)1 << 30 ? 1 << 30 : (int)left;
            int rc = MPI_Ibcast(p, chunk, MPI_BYTE, root, world, &reqs[n]);
            if (rc != MPI_SUCCESS) {
                return zr_mpi_status_at(rc, __FILE__, __LINE__, "MPI_Ibcast");
            }
            /* a receiver waits for the root; the root for everyone */
            peer[n] = c->rank[ZR_GROUP_WORLD] == root ? -1 : root;
            p += chunk;
            left -= (size_t)chunk;
        }
        ZR_CHECK(zr_comm_poll(c, reqs, n, peer, n, scratch, "broadcast", ZR_GROUP_WORLD,
                              ZR_GROUP_COUNT, index));
    }
    return ZR_OK;
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
    MPI_Request req = MPI_REQUEST_NULL;
    long long index = (long long)c->posted[ZR_GROUP_COUNT]++;
    ZR_MPI_CHECK(
        MPI_Iallreduce(mine, sum, N, MPI_UINT64_T, MPI_SUM, c->control->mpi[ZR_GROUP_WORLD], &req));
    ZR_CHECK(zr_comm_poll(c, &req, 1, NULL, 0, NULL, "traffic total", ZR_GROUP_WORLD,
                          ZR_GROUP_COUNT, index));
    for (int k = 0; k < ZR_KIND_COUNT; k++) {
        total->kind[k].calls = sum[3 * k];
        total->kind[k].bytes_intra = sum[3 * k + 1];
        total->kind[k].bytes_inter = sum[3 * k + 2];
    }
    return ZR_OK;
}

/* ---- agreement and the end of a job ------------------------------------------- */

/* The agreed failure's message, from root to everyone; returns its status. */
static zr_status spread_failure(zr_comm *c, int root, zr_status local)
{
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
    ZR_CHECK(zr_comm_ctl_exchange(c, &m, sizeof m, &m, root, "an error agreement"));
    char full[1100];
    if (m.agreed) {
        snprintf(full, sizeof full, "%s", m.msg);
    } else {
        snprintf(full, sizeof full, "rank %d: %s", root, m.msg);
    }
    zr_error_set_agreed(full);
    return (zr_status)m.status;
}

zr_status zr_comm_agree(zr_comm *c, zr_status local)
{
    int size = c->size[ZR_GROUP_WORLD], me = c->rank[ZR_GROUP_WORLD];
    struct zr_comm_control *cp = c->control;
    cp->broken = 0;
    if (size == 1) {
        if (local != ZR_OK) {
            char copy[1024];
            snprintf(copy, sizeof copy, "%s", zr_error_message());
            zr_error_set_agreed(copy);
        }
        return local;
    }
    int32_t mine[4] = {(int32_t)local, cp->notified, c->inflight > 0, 0};
    int32_t *all = NULL;
    ZR_ALLOC(all, 4 * (size_t)size);
    zr_status st = zr_comm_ctl_exchange(c, mine, sizeof mine, all, -1, "an error agreement");
    /* the failure that caused the others wins over their ZR_ERR_REMOTE; lowest rank first */
    int root = -1, senders = 0;
    for (int pass = 0; pass < 2 && st == ZR_OK && root < 0; pass++) {
        for (int r = 0; r < size && root < 0; r++) {
            zr_status s = (zr_status)all[4 * r];
            if (s != ZR_OK && (pass == 1 || s != ZR_ERR_REMOTE)) {
                root = r;
            }
        }
    }
    for (int r = 0; r < size && st == ZR_OK; r++) {
        senders += r != me && all[4 * r + 1];
        cp->broken |= all[4 * r + 2] != 0;
    }
    zr_free(all);
    ZR_CHECK(st);
    ZR_CHECK(zr_comm_notice_drain(c, senders));
    if (root < 0) {
        cp->broken = 0;
        return ZR_OK;
    }
    return spread_failure(c, root, local);
}

int zr_comm_broken(const zr_comm *c)
{
    return c->control != NULL && c->control->broken;
}

_Noreturn void zr_comm_abort(zr_comm *c, int exit_code)
{
    /* the launcher may act on the abort before it reads a rank's last lines (MPICH's
       mpiexec lost the line saying why a job died): wait until they are read */
    zr_file_drain_std(5.0);
    /* everyone is here, so the message printed before this call is out */
    int32_t one = 1, *all = NULL;
    (void)ZR_ALLOC_STATUS(all, (size_t)c->size[ZR_GROUP_WORLD]);
    if (all != NULL && c->control->ctl != MPI_COMM_NULL) {
        (void)zr_comm_ctl_exchange(c, &one, sizeof one, all, -1, "the final abort");
    }
    zr_free(all);
    zr_comm_transport_abort(c);
    MPI_Abort(c->control->mpi[ZR_GROUP_WORLD], exit_code);
    _exit(exit_code);
}
