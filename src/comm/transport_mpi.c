/*
 * transport_mpi.c - the MPI transport: a personalised exchange as one
 * nonblocking send and one receive per peer, on the group's MPI
 * communicator (zr_comm_mpi).
 *
 * zr's collectives are built from this single primitive so that the bytes on
 * each link are exactly the bytes zr accounts. Messages above 1 GiB are split
 * because MPI counts are int. Posting every receive before any send lets MPI
 * match messages without unexpected-message copies. All exchanges of a group
 * use one tag: MPI's non-overtaking rule matches concurrent exchanges in the
 * order every rank posts them, which is the same order on every rank.
 *
 * The transport keeps no state per communicator (the groups' communicators
 * are the control plane's), so it has no init or free; the control plane
 * uses it for control values too. Each exchange's MPI requests and the world
 * ranks at their other ends live in one block behind zr_request.impl.
 */
#include "comm_impl.h"

#define CHUNK ((size_t)1 << 30)
#define TAG   7001

/* What zr_request.impl points to: one allocation per exchange. */
typedef struct mpi_exchange {
    int count; /* messages posted */
    int nrecv; /* reqs[0 .. nrecv) are receives, the rest sends */
    int left;  /* messages not complete yet */
    int *peer; /* peer[i] = world rank at the other end of reqs[i] */
    int *done; /* MPI_Testsome's indices */
    MPI_Request reqs[];
} mpi_exchange;

static int chunks_of(size_t bytes)
{
    return (int)((bytes + CHUNK - 1) / CHUNK);
}

/*
 * Post the messages to or from group peer p, one per chunk: a receive of len
 * bytes into rbuf, or (rbuf NULL) a send of len bytes from sbuf.
 */
static zr_status post(zr_comm *c, zr_group g, mpi_exchange *x, const char *sbuf, char *rbuf,
                      size_t len, int p)
{
    MPI_Comm comm = zr_comm_mpi(c, g);
    for (size_t off = 0; off < len; off += CHUNK) {
        int n = (int)(len - off < CHUNK ? len - off : CHUNK);
        MPI_Request *r = &x->reqs[x->count];
        int rc = rbuf != NULL ? MPI_Irecv(rbuf + off, n, MPI_BYTE, p, TAG, comm, r)
                              : MPI_Isend(sbuf + off, n, MPI_BYTE, p, TAG, comm, r);
        if (rc != MPI_SUCCESS) {
            return zr_mpi_status_at(rc, __FILE__, __LINE__,
                                    rbuf != NULL ? "MPI_Irecv" : "MPI_Isend");
        }
        x->peer[x->count] = zr_comm_world_rank(c, g, p);
        x->count++;
        x->left++;
        x->nrecv += rbuf != NULL;
    }
    return ZR_OK;
}

static zr_status mpi_iexchange(zr_comm *c, zr_group g, const void *send, const size_t *scount,
                               const size_t *sdisp, void *recv, const size_t *rcount,
                               const size_t *rdisp, zr_request *req)
{
    int n = c->size[g], me = c->rank[g];
    int total = 0;
    for (int p = 0; p < n; p++) {
        if (p != me) {
            total += chunks_of(scount[p]) + chunks_of(rcount[p]);
        }
    }
    req->impl = NULL;
    if (total == 0) {
        return ZR_OK;
    }
    /* one block: the header and requests, then the peers and Testsome's indices */
    mpi_exchange *x = NULL;
    ZR_CHECK(zr_alloc_at((void **)&x,
                         sizeof *x + (sizeof(MPI_Request) + 2 * sizeof(int)) * (size_t)total,
                         __FILE__, __LINE__));
    x->peer = (int *)(x->reqs + total);
    x->done = x->peer + total;
    req->impl = x;
    /* receives first, in rank order starting after me, so peers spread their load */
    for (int i = 1; i < n; i++) {
        int p = (me + n - i) % n;
        ZR_CHECK(post(c, g, x, NULL, (char *)recv + rdisp[p], rcount[p], p));
    }
    for (int i = 1; i < n; i++) {
        int p = (me + i) % n;
        ZR_CHECK(post(c, g, x, (const char *)send + sdisp[p], NULL, scount[p], p));
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

static zr_status mpi_test(zr_comm *c, zr_request *req, int *done, int *progressed)
{
    (void)c;
    mpi_exchange *x = req->impl;
    int out = 0;
    int rc = MPI_Testsome(x->count, x->reqs, &out, x->done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
        return zr_mpi_status_at(rc, __FILE__, __LINE__, "MPI_Testsome");
    }
    /* MPI_UNDEFINED: no active request was left */
    x->left = out == MPI_UNDEFINED ? 0 : x->left - out;
    *progressed = out > 0;
    *done = x->left == 0;
    return ZR_OK;
}

static int mpi_pending(const zr_comm *c, const zr_request *req, zr_pending *out, int max)
{
    (void)c;
    const mpi_exchange *x = req->impl;
    int np = 0;
    for (int i = 0; i < x->count; i++) {
        int flag = 1;
        if (x->reqs[i] != MPI_REQUEST_NULL) {
            MPI_Request_get_status(x->reqs[i], &flag, MPI_STATUS_IGNORE);
        }
        if (!flag) {
            zr_comm_pending_add(out, max, &np, x->peer[i], i < x->nrecv);
        }
    }
    return np;
}

static void mpi_release(zr_comm *c, zr_request *req)
{
    (void)c;
    zr_free(req->impl);
    req->impl = NULL;
}

const zr_transport zr_transport_mpi = {
    .version = ZR_TRANSPORT_VERSION,
    .name = "mpi",
    .init = NULL,
    .free = NULL,
    .iexchange = mpi_iexchange,
    .test = mpi_test,
    .pending = mpi_pending,
    .release = mpi_release,
    .self_copy = NULL, /* host memory: memmove */
    .progress = NULL,  /* MPI progresses its requests inside any MPI call */
    .abort = NULL,
};
