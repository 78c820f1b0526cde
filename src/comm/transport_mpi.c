/*
 * transport_mpi.c - the MPI transport: a personalised exchange as one
 * nonblocking send and one receive per peer.
 *
 * zr's collectives are built from this single primitive so that the bytes on
 * each link are exactly the bytes zr accounts. Messages above 1 GiB are split
 * because MPI counts are int. Posting every receive before any send lets MPI
 * match messages without unexpected-message copies. All exchanges of a group
 * use one tag: MPI's non-overtaking rule matches concurrent exchanges in the
 * order every rank posts them, which is the same order on every rank.
 */
#include "comm_impl.h"

#include <limits.h>

#define CHUNK ((size_t)1 << 30)
#define TAG   7001

static int chunks_of(size_t bytes)
{
    return (int)((bytes + CHUNK - 1) / CHUNK);
}

static zr_status mpi_iexchange(zr_comm *c, zr_group g, const void *send, const size_t *scount,
                               const size_t *sdisp, void *recv, const size_t *rcount,
                               const size_t *rdisp, zr_request *req)
{
    int n = c->size[g], me = c->rank[g];
    MPI_Comm comm = c->mpi[g];
    int total = 0;
    for (int p = 0; p < n; p++) {
        if (p != me) {
            total += chunks_of(scount[p]) + chunks_of(rcount[p]);
        }
    }
    req->count = 0;
    req->nrecv = 0;
    req->reqs = NULL;
    req->peer = NULL;
    if (total == 0) {
        return ZR_OK;
    }
    /* one block: the requests, then the peers and the wait's scratch */
    ZR_CHECK(zr_alloc_at((void **)&req->reqs,
                         (sizeof(MPI_Request) + 2 * sizeof(int)) * (size_t)total, __FILE__,
                         __LINE__));
    req->peer = (int *)(req->reqs + total);
    req->active = 1;
    /* receives first, in rank order starting after me, so peers spread their load */
    for (int i = 1; i < n; i++) {
        int p = (me + n - i) % n;
        for (size_t off = 0; off < rcount[p]; off += CHUNK) {
            size_t len = rcount[p] - off < CHUNK ? rcount[p] - off : CHUNK;
            int rc = MPI_Irecv((char *)recv + rdisp[p] + off, (int)len, MPI_BYTE, p, TAG, comm,
                               &req->reqs[req->count]);
            if (rc != MPI_SUCCESS) {
                return zr_mpi_status_at(rc, __FILE__, __LINE__, "MPI_Irecv");
            }
            req->peer[req->count] = zr_comm_world_rank(c, g, p);
            req->count++;
            req->nrecv++;
        }
    }
    for (int i = 1; i < n; i++) {
        int p = (me + i) % n;
        for (size_t off = 0; off < scount[p]; off += CHUNK) {
            size_t len = scount[p] - off < CHUNK ? scount[p] - off : CHUNK;
            int rc = MPI_Isend((const char *)send + sdisp[p] + off, (int)len, MPI_BYTE, p, TAG,
                               comm, &req->reqs[req->count]);
            if (rc != MPI_SUCCESS) {
                return zr_mpi_status_at(rc, __FILE__, __LINE__, "MPI_Isend");
            }
            req->peer[req->count] = zr_comm_world_rank(c, g, p);
            req->count++;
        }
    }
    return ZR_OK;
}

/*
 * MPICH defines MPI_STATUSES_IGNORE as the address 1, which GCC's access
 * analysis reads as a zero-sized array being written; the standard says the
 * library never touches it. (clang has no such warning and rejects its name.)
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#endif

static void release(zr_request *req)
{
    zr_free(req->reqs); /* peer lives in the same block */
    req->reqs = NULL;
    req->peer = NULL;
    req->count = 0;
    req->nrecv = 0;
    req->active = 0;
}

static zr_status mpi_wait(zr_comm *c, zr_request *req)
{
    zr_status st =
        zr_comm_poll(c, req->reqs, req->count, req->peer, req->nrecv,
                     req->peer != NULL ? req->peer + req->count : NULL, zr_kind_name(req->kind),
                     req->group, (int)req->group, (long long)req->gseq);
    if (st == ZR_ERR_REMOTE) {
        /* another rank gave up: the requests stay posted, their buffers MPI's */
        return st;
    }
    release(req);
    return st;
}

static zr_status mpi_test(zr_comm *c, zr_request *req, int *done)
{
    (void)c;
    int flag = 1;
    int rc = req->count > 0 ? MPI_Testall(req->count, req->reqs, &flag, MPI_STATUSES_IGNORE)
                            : MPI_SUCCESS;
    if (rc != MPI_SUCCESS) {
        release(req);
        return zr_mpi_status_at(rc, __FILE__, __LINE__, "MPI_Testall");
    }
    *done = flag;
    if (flag) {
        release(req);
    }
    return ZR_OK;
}

const zr_transport zr_transport_mpi = {
    .version = ZR_TRANSPORT_VERSION,
    .name = "mpi",
    .iexchange = mpi_iexchange,
    .wait = mpi_wait,
    .test = mpi_test,
};
