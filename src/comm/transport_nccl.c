/*
 * transport_nccl.c - the NCCL transport: zr's exchanges of device memory as
 * grouped ncclSend / ncclRecv, one GPU per rank.
 *
 *   set-up (zr_comm_use_transport, collective over world):
 *     every rank's (node, GPU) over the control plane -> refuse shared GPUs
 *     rank 0: ncclGetUniqueId -> zr_comm_bcast -> ncclCommInitRank (world)
 *     ncclCommSplit(world, colour, key) per group (zr_xplan_split)
 *     a stream per group
 *   an exchange on group g:
 *     followed stream --event--> stream[g]: ncclGroupStart,
 *       ncclRecv / ncclSend per message (zr_xplan_messages, unchunked: the
 *       MPI transport's peers, bytes and order), ncclGroupEnd; event "done"
 *   completion: test polls ncclCommGetAsyncError and "done" (never a
 *     blocking stream synchronisation: MPI may need the host meanwhile)
 *
 * A stream per group, because ranks start exchanges in the same order on
 * each group (zr_comm.posted) but not necessarily across groups: ops on one
 * stream run in issue order, and two ranks that issued two groups' ops in
 * different orders on one stream would wait for each other forever.
 *
 * Failures. An NCCL error (ncclCommGetAsyncError) fails the wait and aborts
 * every communicator of the rank (ncclCommAbort), since no enqueued
 * operation can be trusted after one; the watchdog (timeouts) and
 * zr_comm_abort (an agreed failure, on every rank) abort them through
 * zr_transport.abort before MPI_Abort. Which peer an NCCL group still waits
 * for, NCCL does not say: pending names every peer of the exchange.
 *
 * Shared GPUs. NCCL 2.5-2.29 refuse two ranks on one GPU ("Duplicate GPU
 * detected"), 2.30 unless NCCL_MULTI_RANK_GPU_ENABLE=1 (experimental). zr
 * checks first, with every rank's GPU UUID and node, so the refusal names
 * the ranks and the GPU and says what to do (the staged transport).
 *
 * Compiled only where CUDA and NCCL are built; transport_nccl_none.c stands
 * in without.
 */
#include "transport_device.h"

#include "../base/cudalib.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ncclCommSplit: NCCL 2.18.1 */
#define MIN_VERSION 21801

typedef struct nccl_state {
    zr_devx x;                  /* first: the shared functions take the state as one */
    const zr_cudalib_nccl *lib; /* NCCL, opened by the first set-up */
    int version;
    ncclComm_t comm[ZR_GROUP_COUNT]; /* [WORLD] is the world communicator, the others its splits */
    cudaStream_t stream[ZR_GROUP_COUNT];
    ncclResult_t async; /* the first asynchronous error seen by progress */
    zr_group async_group;
    int aborted;
} nccl_state;

/* What zr_request.impl points to. */
typedef struct nccl_exchange {
    cudaEvent_t done; /* after the group on stream[g]; NULL: nothing was queued */
    cudaEvent_t self; /* the block for myself; NULL: none */
    size_t count;
    zr_xmsg msg[]; /* the plan, for pending */
} nccl_exchange;

static zr_status nccl_fail(const nccl_state *s, ncclResult_t r, const char *call, const char *file,
                           int line)
{
    return zr_error_at(ZR_ERR_DEVICE, file, line, "%s failed: %s (NCCL error %d)", call,
                       s->lib->ncclGetErrorString(r), (int)r);
}

/* Propagate a failing call of s's NCCL: NCCL_CHECK(s, ncclGroupStart()). */
#define NCCL_CHECK(s, call)                                                                        \
    do {                                                                                           \
        ncclResult_t zr_nr_ = (s)->lib->call;                                                      \
        if (zr_nr_ != ncclSuccess) {                                                               \
            return nccl_fail((s), zr_nr_, #call, __FILE__, __LINE__);                              \
        }                                                                                          \
    } while (0)

static void version_parts(int v, int *major, int *minor, int *patch)
{
    /* NCCL_VERSION: X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z after */
    int big = v >= 10000;
    *major = big ? v / 10000 : v / 1000;
    *minor = big ? v / 100 % 100 : v / 100 % 10;
    *patch = v % 100;
}

/* NCCL runs several ranks on one GPU only from 2.30, and only when asked to. */
static int multi_rank_gpu_ok(int version)
{
    const char *e = getenv("NCCL_MULTI_RANK_GPU_ENABLE");
    return version >= 23000 && e != NULL && e[0] == '1' && e[1] == '\0';
}

/* A rank's line in the set-up's exchange: whether its set-up went well so far, and its GPU. */
typedef struct gpu_line {
    int32_t ok;
    zr_gpu_id id;
} gpu_line;

/*
 * Every rank's GPU over the control plane, after whatever this rank's set-up
 * did so far (local): every rank takes part, so every rank learns whether
 * all are ready, and the shared-GPU refusal is the same message everywhere.
 */
static zr_status check_gpus(zr_comm *c, const nccl_state *s, zr_status local)
{
    gpu_line mine;
    memset(&mine, 0, sizeof mine);
    struct cudaDeviceProp prop;
    if (local == ZR_OK) {
        cudaError_t e = cudaGetDeviceProperties(&prop, s->x.dev.ordinal);
        local = e == cudaSuccess ? ZR_OK
                                 : zr_cuda_fail(e, "cudaGetDeviceProperties", __FILE__, __LINE__);
    }
    if (local == ZR_OK) {
        mine.ok = 1;
        mine.id.node = c->node;
        mine.id.ordinal = s->x.dev.ordinal;
        mine.id.pci_bus = prop.pciBusID;
        memcpy(mine.id.uuid, prop.uuid.bytes, sizeof mine.id.uuid);
    }
    int W = c->size[ZR_GROUP_WORLD], a, b, bad = -1;
    gpu_line *all = NULL;
    zr_gpu_id *ids = NULL;
    zr_status st = ZR_ALLOC_STATUS(all, (size_t)W);
    if (st == ZR_OK) {
        st = ZR_ALLOC_STATUS(ids, (size_t)W);
    }
    /* the exchange itself runs even after a local failure: the others wait for this rank */
    zr_status ex = zr_comm_ctl_exchange(c, &mine, sizeof mine, all, -1, "the NCCL set-up");
    st = local != ZR_OK ? local : st != ZR_OK ? st : ex;
    for (int r = 0; r < W && st == ZR_OK; r++) {
        ids[r] = all[r].id;
        bad = bad < 0 && !all[r].ok ? r : bad;
    }
    if (st == ZR_OK && bad >= 0) {
        st = zr_error_at(ZR_ERR_REMOTE, __FILE__, __LINE__,
                         "NCCL transport: rank %d could not set up its GPU", bad);
    } else if (st == ZR_OK && zr_xplan_shared_gpu(ids, W, &a, &b) &&
               !multi_rank_gpu_ok(s->version)) {
        int M, m, p;
        version_parts(s->version, &M, &m, &p);
        st = zr_error_at(ZR_ERR_INVALID, __FILE__, __LINE__,
                         "NCCL transport: ranks %d and %d share GPU cuda:%d (PCI bus %#x) on node "
                         "%d, and NCCL %d.%d.%d runs one rank per GPU; use the staged transport "
                         "for several ranks per GPU, start one rank per GPU, or use NCCL 2.30+ "
                         "with NCCL_MULTI_RANK_GPU_ENABLE=1",
                         a, b, ids[a].ordinal, (unsigned)ids[a].pci_bus, ids[a].node, M, m, p);
    }
    zr_free(ids);
    zr_free(all);
    return st;
}

/* The world communicator from an id that rank 0 makes and broadcasts. */
static zr_status init_world(zr_comm *c, nccl_state *s)
{
    struct {
        int32_t result; /* rank 0's ncclGetUniqueId, so every rank fails with it */
        ncclUniqueId id;
    } b;
    memset(&b, 0, sizeof b);
    if (c->rank[ZR_GROUP_WORLD] == 0) {
        b.result = (int32_t)s->lib->ncclGetUniqueId(&b.id);
    }
    ZR_CHECK(zr_comm_bcast(c, &b, sizeof b, 0));
    if (b.result != ncclSuccess) {
        return nccl_fail(s, (ncclResult_t)b.result, "ncclGetUniqueId (on rank 0)", __FILE__,
                         __LINE__);
    }
    NCCL_CHECK(s, ncclCommInitRank(&s->comm[ZR_GROUP_WORLD], c->size[ZR_GROUP_WORLD], b.id,
                                   c->rank[ZR_GROUP_WORLD]));
    return ZR_OK;
}

/* The groups: splits of world whose NCCL ranks are zr's in-group ranks; a stream each. */
static zr_status init_groups(zr_comm *c, nccl_state *s)
{
    for (int g = 0; g < ZR_GROUP_COUNT; g++) {
        if (g != ZR_GROUP_WORLD) {
            zr_xsplit sp = zr_xplan_split(c, (zr_group)g);
            NCCL_CHECK(s,
                       ncclCommSplit(s->comm[ZR_GROUP_WORLD], sp.color, sp.key, &s->comm[g], NULL));
        }
        int rank = -1, size = -1;
        NCCL_CHECK(s, ncclCommUserRank(s->comm[g], &rank));
        NCCL_CHECK(s, ncclCommCount(s->comm[g], &size));
        if (rank != c->rank[g] || size != c->size[g]) {
            ZR_FAIL(ZR_ERR_INTERNAL,
                    "NCCL transport: group %s is rank %d of %d in NCCL, %d of %d "
                    "in zr",
                    zr_group_name((zr_group)g), rank, size, c->rank[g], c->size[g]);
        }
        ZR_CUDA_CHECK(cudaStreamCreateWithFlags(&s->stream[g], cudaStreamNonBlocking));
    }
    return ZR_OK;
}

static void nccl_teardown(nccl_state *s, int abort)
{
    /* the splits before the communicator they came from */
    for (int g = ZR_GROUP_COUNT - 1; g >= 0; g--) {
        if (s->comm[g] != NULL) {
            if (abort) {
                s->lib->ncclCommAbort(s->comm[g]);
            } else {
                s->lib->ncclCommDestroy(s->comm[g]);
            }
            s->comm[g] = NULL;
        }
    }
    for (int g = 0; g < ZR_GROUP_COUNT; g++) {
        if (s->stream[g] != NULL) {
            cudaStreamDestroy(s->stream[g]);
            s->stream[g] = NULL;
        }
    }
}

static zr_status nccl_init(zr_comm *c, const void *arg, void **state)
{
    nccl_state *s = NULL;
    ZR_ALLOC(s, 1);
    zr_status st = zr_devx_init(&s->x, &zr_transport_nccl, arg, "NCCL");
    int v = 0;
    if (st == ZR_OK) {
        st = zr_cudalib_load_nccl(&s->lib);
    }
    if (st == ZR_OK) {
        ncclResult_t r = s->lib->ncclGetVersion(&v);
        st = r == ncclSuccess ? ZR_OK : nccl_fail(s, r, "ncclGetVersion", __FILE__, __LINE__);
    }
    s->version = v;
    if (st == ZR_OK && v < MIN_VERSION) {
        int M, m, p;
        version_parts(v, &M, &m, &p);
        st = zr_error_at(ZR_ERR_DEVICE, __FILE__, __LINE__,
                         "NCCL transport: NCCL %d.%d.%d has no ncclCommSplit (2.18.1 or newer "
                         "needed); use the staged transport",
                         M, m, p);
    }
    /* every rank takes part in the check, whatever failed above: then all go on, or none */
    st = check_gpus(c, s, st);
    if (st == ZR_OK) {
        st = init_world(c, s);
    }
    if (st == ZR_OK) {
        st = init_groups(c, s);
    }
    if (st != ZR_OK) {
        nccl_teardown(s, 1);
        zr_devx_free(&s->x);
        zr_free(s);
        return st;
    }
    *state = s;
    return ZR_OK;
}

static void nccl_free(zr_comm *c, void *state)
{
    nccl_state *s = state;
    /* exchanges still in flight (an abandoned wait) cannot be waited for: abort them */
    nccl_teardown(s, s->aborted || c->inflight > 0);
    zr_devx_free(&s->x);
    zr_free(s);
}

/* Queue the exchange's messages as one NCCL group on stream[g]. */
static zr_status post_group(nccl_state *s, zr_group g, const char *send, char *recv,
                            const nccl_exchange *x)
{
    ncclComm_t comm = s->comm[g];
    cudaStream_t st = s->stream[g];
    NCCL_CHECK(s, ncclGroupStart());
    ncclResult_t r = ncclSuccess;
    const char *call = "ncclRecv";
    for (size_t i = 0; i < x->count && r == ncclSuccess; i++) {
        const zr_xmsg *m = &x->msg[i];
        if (m->recv) {
            r = s->lib->ncclRecv(recv + m->offset, m->bytes, ncclUint8, m->peer, comm, st);
        } else {
            call = "ncclSend";
            r = s->lib->ncclSend(send + m->offset, m->bytes, ncclUint8, m->peer, comm, st);
        }
    }
    /* the group is closed whatever happened in it (an error there queues nothing) */
    ncclResult_t end = s->lib->ncclGroupEnd();
    if (r != ncclSuccess) {
        return nccl_fail(s, r, call, __FILE__, __LINE__);
    }
    if (end != ncclSuccess) {
        return nccl_fail(s, end, "ncclGroupEnd", __FILE__, __LINE__);
    }
    return ZR_OK;
}

static zr_status nccl_iexchange(zr_comm *c, zr_group g, const void *send, const size_t *scount,
                                const size_t *sdisp, void *recv, const size_t *rcount,
                                const size_t *rdisp, zr_request *req)
{
    nccl_state *s = c->transport_state;
    int n = c->size[g], me = c->rank[g];
    size_t count = zr_xplan_messages(n, me, scount, sdisp, rcount, rdisp, SIZE_MAX, NULL, 0);
    req->impl = NULL;
    if (count == 0 && s->x.self_done == NULL) {
        return ZR_OK;
    }
    if (s->aborted) {
        ZR_FAIL(ZR_ERR_DEVICE, "NCCL transport: the communicators were aborted after an error");
    }
    nccl_exchange *x = NULL;
    ZR_CHECK(zr_alloc_at((void **)&x, sizeof *x + sizeof(zr_xmsg) * count, __FILE__, __LINE__));
    x->count = zr_xplan_messages(n, me, scount, sdisp, rcount, rdisp, SIZE_MAX, x->msg, count);
    x->self = zr_devx_take_self(&s->x);
    req->impl = x;
    if (count == 0) {
        return ZR_OK;
    }
    ZR_CHECK(zr_devx_after_follow(&s->x, s->stream[g]));
    ZR_CHECK(post_group(s, g, send, recv, x));
    ZR_CHECK(zr_devx_event(&s->x, &x->done));
    ZR_CUDA_CHECK(cudaEventRecord(x->done, s->stream[g]));
    return ZR_OK;
}

/* Every communicator's asynchronous error; the first one seen is kept. */
static void nccl_progress(zr_comm *c)
{
    nccl_state *s = c->transport_state;
    for (int g = 0; g < ZR_GROUP_COUNT && !s->aborted && s->async == ncclSuccess; g++) {
        ncclResult_t e = ncclSuccess;
        if (s->lib->ncclCommGetAsyncError(s->comm[g], &e) == ncclSuccess && e != ncclSuccess &&
            e != ncclInProgress) {
            s->async = e;
            s->async_group = (zr_group)g;
        }
    }
}

static void nccl_abort(zr_comm *c)
{
    nccl_state *s = c->transport_state;
    if (s != NULL && !s->aborted) {
        s->aborted = 1;
        for (int g = ZR_GROUP_COUNT - 1; g >= 0; g--) {
            if (s->comm[g] != NULL) {
                s->lib->ncclCommAbort(s->comm[g]);
                s->comm[g] = NULL;
            }
        }
    }
}

static zr_status nccl_test(zr_comm *c, zr_request *req, int *done, int *progressed)
{
    nccl_state *s = c->transport_state;
    nccl_exchange *x = req->impl;
    *done = *progressed = 0;
    nccl_progress(c);
    if (s->async != ncclSuccess) {
        /* nothing NCCL queued can be trusted now: stop it all on this rank */
        ncclResult_t e = s->async;
        zr_group g = s->async_group;
        nccl_abort(c);
        ZR_FAIL(ZR_ERR_DEVICE,
                "NCCL reported an error on group %s: %s (NCCL error %d); the "
                "rank's NCCL communicators are aborted",
                zr_group_name(g), s->lib->ncclGetErrorString(e), (int)e);
    }
    int a = 1, b = 1;
    ZR_CHECK(zr_devx_query(x->self, &a));
    ZR_CHECK(zr_devx_query(x->done, &b));
    *done = a && b;
    *progressed = *done;
    return ZR_OK;
}

static int nccl_pending(const zr_comm *c, const zr_request *req, zr_pending *out, int max)
{
    const nccl_exchange *x = req->impl;
    int np = 0, done = 1;
    if (x->done != NULL && zr_devx_query(x->done, &done) == ZR_OK && done) {
        return 0;
    }
    /* one NCCL group: it waits for all its peers until it completes, receives listed first */
    for (size_t i = 0; i < x->count; i++) {
        zr_comm_pending_add(out, max, &np, zr_comm_world_rank(c, req->group, x->msg[i].peer),
                            x->msg[i].recv);
    }
    return np;
}

static void nccl_release(zr_comm *c, zr_request *req)
{
    nccl_state *s = c->transport_state;
    nccl_exchange *x = req->impl;
    zr_devx_put(&s->x, x->done);
    zr_devx_put(&s->x, x->self);
    zr_free(x);
    req->impl = NULL;
}

const zr_transport zr_transport_nccl = {
    .version = ZR_TRANSPORT_VERSION,
    .name = "nccl",
    .init = nccl_init,
    .free = nccl_free,
    .iexchange = nccl_iexchange,
    .test = nccl_test,
    .pending = nccl_pending,
    .release = nccl_release,
    .self_copy = zr_devx_self_copy,
    .progress = nccl_progress,
    .abort = nccl_abort,
};

int zr_comm_nccl_built(void)
{
    return 1;
}
