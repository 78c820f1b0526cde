/*
 * transport_staged.c - the staged transport: zr's exchanges of device memory
 * over MPI through pinned host memory, for several ranks per GPU or a build
 * without NCCL. MPI never sees a device pointer (Debian's Open MPI is not
 * CUDA-aware).
 *
 *   sender                                      receiver
 *   device --D2H chunk k--> pinned --MPI_Isend--> pinned --H2D chunk k--> device
 *            (stream d2h)    (as its event       (MPI_Irecv posted  (stream h2d, as
 *                             completes)          at the start)      chunk k arrives)
 *
 * The messages and their order are the MPI transport's (zr_xplan_messages),
 * cut into chunks of chunk_bytes: every receive is posted at once; every
 * send chunk's copy to pinned memory is queued at once on d2h, after the
 * followed stream's work, with an event each, and the host posts chunk k's
 * MPI_Isend when its event has completed - while the copy of chunk k+1 runs.
 * A received chunk's copy back to the device is queued on h2d as soon as MPI
 * says it arrived. Sends are posted strictly in the plan's order (the first
 * send whose copy is not done stops the others), so MPI's non-overtaking
 * rule matches chunk k with chunk k on the other side.
 *
 * The host drives every step without blocking: the transport's test, and
 * its progress, which every bounded wait calls (comm.h), so an exchange
 * keeps moving while its rank waits for something else. The pinned receive
 * stage mirrors the receive buffer's offsets; the send stage holds each
 * distinct message once (zr_xplan_stage: an all-gather's block is copied
 * once for all peers, and no copy overwrites bytes MPI may be sending).
 * Stages are kept for reuse until the transport is freed. Tag 7002 on the
 * groups' MPI communicators: the MPI transport's control exchanges there
 * (tag 7001) never match these.
 *
 * Compiled only where CUDA is built; comm_nocuda.c stands in without.
 */
#include "transport_device.h"

#include <stdint.h>
#include <string.h>

#define TAG 7002

/* A pinned buffer of the pool. */
typedef struct stage {
    void *p;
    size_t cap;
    int busy;
} stage;

typedef struct staged_exchange staged_exchange;

typedef struct staged_state {
    zr_devx x; /* first: the shared functions take the state as one */
    cudaStream_t d2h, h2d;
    size_t chunk;
    stage *stages;
    int nstages;
    staged_exchange **live; /* the exchanges in flight, for progress */
    int nlive, livecap;
    uint64_t serial; /* exchanges started so far */
} staged_state;

/* The steps of a message (chunk): sends D2H -> WIRE -> DONE, receives WIRE -> H2D -> DONE. */
enum { STEP_D2H = 0, STEP_WIRE, STEP_H2D, STEP_DONE };

/* What zr_request.impl points to: one allocation. */
struct staged_exchange {
    zr_group g;
    uint64_t serial;   /* the transport's exchanges started before this one */
    const char *dsend; /* device buffers */
    char *drecv;
    int ssend, srecv;    /* their pinned stages (indices), -1: none */
    size_t count, left;  /* messages, and those not DONE */
    size_t next_send;    /* the first send not yet posted to MPI */
    cudaEvent_t self;    /* the block for myself */
    int failed;          /* a step failed: release waits for the copies */
    zr_xmsg *msg;        /* the plan: receives, then sends */
    size_t *stage;       /* per message: its offset in its pinned stage (zr_xplan_stage) */
    size_t *copy;        /* per message: the message whose copy fills its stage bytes */
    MPI_Request *req;    /* per message */
    cudaEvent_t *ev;     /* per message: its D2H (send) or H2D (receive) copy */
    unsigned char *step; /* per message */
};

static zr_status stage_get(staged_state *s, size_t bytes, int *out)
{
    int best = -1;
    *out = -1;
    if (bytes == 0) {
        return ZR_OK;
    }
    for (int i = 0; i < s->nstages; i++) {
        if (!s->stages[i].busy && s->stages[i].cap >= bytes &&
            (best < 0 || s->stages[i].cap < s->stages[best].cap)) {
            best = i;
        }
    }
    if (best < 0) {
        stage *grown = NULL;
        ZR_ALLOC(grown, (size_t)s->nstages + 1);
        if (s->nstages > 0) {
            memcpy(grown, s->stages, sizeof *grown * (size_t)s->nstages);
        }
        zr_free(s->stages);
        s->stages = grown;
        best = s->nstages;
        s->stages[best].cap = 0;
        s->stages[best].busy = 0;
        ZR_CHECK(zr_host_alloc_pinned_at(&s->x.dev, &s->stages[best].p, bytes, __FILE__, __LINE__));
        s->stages[best].cap = bytes;
        s->nstages++;
    }
    s->stages[best].busy = 1;
    *out = best;
    return ZR_OK;
}

static char *stage_ptr(const staged_state *s, int i)
{
    return i >= 0 ? s->stages[i].p : NULL;
}

static zr_status staged_init(zr_comm *c, const void *arg, void **state)
{
    (void)c;
    staged_state *s = NULL;
    ZR_ALLOC(s, 1);
    const zr_transport_device *a = arg;
    zr_status st = zr_devx_init(&s->x, &zr_transport_staged, arg, "staged");
    s->chunk = a != NULL && a->chunk_bytes > 0 ? a->chunk_bytes : ZR_STAGED_CHUNK_DEFAULT;
    if (s->chunk > ZR_XPLAN_MPI_CHUNK) {
        s->chunk = ZR_XPLAN_MPI_CHUNK; /* MPI counts are int */
    }
    if (st == ZR_OK) {
        cudaError_t e = cudaStreamCreateWithFlags(&s->d2h, cudaStreamNonBlocking);
        if (e == cudaSuccess) {
            e = cudaStreamCreateWithFlags(&s->h2d, cudaStreamNonBlocking);
        }
        st = e == cudaSuccess ? ZR_OK : zr_cuda_fail(e, "cudaStreamCreate", __FILE__, __LINE__);
    }
    if (st != ZR_OK) {
        if (s->d2h != NULL) {
            cudaStreamDestroy(s->d2h);
        }
        zr_devx_free(&s->x);
        zr_free(s);
        return st;
    }
    *state = s;
    return ZR_OK;
}

static void staged_free(zr_comm *c, void *state)
{
    (void)c;
    staged_state *s = state;
    /* the copies of exchanges abandoned in flight still use the stages */
    cudaStreamSynchronize(s->d2h);
    cudaStreamSynchronize(s->h2d);
    for (int i = 0; i < s->nstages; i++) {
        zr_host_free_pinned(&s->x.dev, s->stages[i].p);
    }
    zr_free(s->stages);
    zr_free(s->live);
    cudaStreamDestroy(s->d2h);
    cudaStreamDestroy(s->h2d);
    zr_devx_free(&s->x);
    zr_free(s);
}

static zr_status live_add(staged_state *s, staged_exchange *x)
{
    if (s->nlive == s->livecap) {
        int cap = s->livecap ? 2 * s->livecap : 8;
        staged_exchange **grown = NULL;
        ZR_ALLOC(grown, (size_t)cap);
        if (s->nlive > 0) {
            memcpy(grown, s->live, sizeof *grown * (size_t)s->nlive);
        }
        zr_free(s->live);
        s->live = grown;
        s->livecap = cap;
    }
    s->live[s->nlive++] = x;
    return ZR_OK;
}

static void live_remove(staged_state *s, const staged_exchange *x)
{
    for (int i = 0; i < s->nlive; i++) {
        if (s->live[i] == x) {
            s->live[i] = s->live[--s->nlive];
            return;
        }
    }
}

/* One allocation: the header, the plan, then the per-message arrays. */
static zr_status exchange_alloc(size_t count, staged_exchange **out)
{
    size_t bytes =
        sizeof(staged_exchange) + count * (sizeof(zr_xmsg) + 2 * sizeof(size_t) +
                                           sizeof(MPI_Request) + sizeof(cudaEvent_t) + 1);
    staged_exchange *x = NULL;
    ZR_CHECK(zr_alloc_at((void **)&x, bytes, __FILE__, __LINE__));
    x->msg = (zr_xmsg *)(x + 1);
    x->stage = (size_t *)(x->msg + count);
    x->copy = x->stage + count;
    x->req = (MPI_Request *)(x->copy + count);
    x->ev = (cudaEvent_t *)(x->req + count);
    x->step = (unsigned char *)(x->ev + count);
    for (size_t i = 0; i < count; i++) {
        x->req[i] = MPI_REQUEST_NULL;
    }
    x->count = x->left = count;
    x->ssend = x->srecv = -1;
    *out = x;
    return ZR_OK;
}

/* Every receive at once; every send chunk's copy to pinned memory after the followed stream. */
static zr_status start(zr_comm *c, staged_state *s, staged_exchange *x)
{
    MPI_Comm comm = zr_comm_mpi(c, x->g);
    char *hrecv = stage_ptr(s, x->srecv), *hsend = stage_ptr(s, x->ssend);
    /* both copy streams after the followed stream's work: d2h reads the send buffer it wrote,
       h2d writes the receive buffer it may have written or read */
    ZR_CHECK(zr_devx_after_follow(&s->x, s->d2h));
    ZR_CUDA_CHECK(cudaStreamWaitEvent(s->h2d, s->x.ready, 0));
    for (size_t i = 0; i < x->count; i++) {
        const zr_xmsg *m = &x->msg[i];
        if (m->recv) {
            x->step[i] = STEP_WIRE;
            ZR_MPI_CHECK(MPI_Irecv(hrecv + x->stage[i], (int)m->bytes, MPI_BYTE, m->peer, TAG, comm,
                                   &x->req[i]));
            continue;
        }
        x->step[i] = STEP_D2H;
        if (x->copy[i] != i) {
            continue; /* the same bytes as an earlier message: its copy serves both */
        }
        ZR_CUDA_CHECK(cudaMemcpyAsync(hsend + x->stage[i], x->dsend + m->offset, m->bytes,
                                      cudaMemcpyDeviceToHost, s->d2h));
        ZR_CHECK(zr_devx_event(&s->x, &x->ev[i]));
        ZR_CUDA_CHECK(cudaEventRecord(x->ev[i], s->d2h));
    }
    return ZR_OK;
}

static zr_status staged_iexchange(zr_comm *c, zr_group g, const void *send, const size_t *scount,
                                  const size_t *sdisp, void *recv, const size_t *rcount,
                                  const size_t *rdisp, zr_request *req)
{
    staged_state *s = c->transport_state;
    int n = c->size[g], me = c->rank[g];
    size_t count = zr_xplan_messages(n, me, scount, sdisp, rcount, rdisp, s->chunk, NULL, 0);
    req->impl = NULL;
    if (count == 0 && s->x.self_done == NULL) {
        return ZR_OK;
    }
    staged_exchange *x = NULL;
    ZR_CHECK(exchange_alloc(count, &x));
    zr_xplan_messages(n, me, scount, sdisp, rcount, rdisp, s->chunk, x->msg, count);
    x->g = g;
    x->serial = s->serial++;
    x->dsend = send;
    x->drecv = recv;
    x->self = zr_devx_take_self(&s->x);
    req->impl = x;
    /* sends come after every receive in the plan */
    x->next_send = 0;
    while (x->next_send < count && x->msg[x->next_send].recv) {
        x->next_send++;
    }
    x->failed = 1; /* until everything below is posted */
    ZR_CHECK(live_add(s, x));
    size_t send_stage = zr_xplan_stage(x->msg, count, x->stage, x->copy);
    ZR_CHECK(stage_get(s, zr_xplan_extent(x->msg, count, 1), &x->srecv));
    ZR_CHECK(stage_get(s, send_stage, &x->ssend));
    ZR_CHECK(start(c, s, x));
    x->failed = 0;
    return ZR_OK;
}

/*
 * An earlier exchange on x's communicator still has sends to post. MPI matches the
 * messages of two ranks on one communicator and tag in posting order, and
 * every receiver posted the earlier exchange's receives first, so x's sends
 * wait for those: the copies of a later exchange can be seen done first
 * (its events are queried later), and two exchanges of a group in flight at
 * once (qgZ's pipeline) would otherwise cross.
 */
static int sends_wait_before(const zr_comm *c, const staged_state *s, const staged_exchange *x)
{
    MPI_Comm mine = zr_comm_mpi(c, x->g); /* groups of the same ranks may share one */
    for (int i = 0; i < s->nlive; i++) {
        const staged_exchange *y = s->live[i];
        if (y != x && y->serial < x->serial && !y->failed && y->next_send < y->count &&
            zr_comm_mpi(c, y->g) == mine) {
            return 1;
        }
    }
    return 0;
}

/* A message's next step if it is due; *moved = 1 when one was taken. */
static zr_status advance_one(zr_comm *c, staged_state *s, staged_exchange *x, size_t i, int *moved)
{
    const zr_xmsg *m = &x->msg[i];
    int flag = 0;
    switch (x->step[i]) {
    case STEP_D2H: /* a send: post it when its copy is done, and only in the plan's order */
        if (i != x->next_send || sends_wait_before(c, s, x)) {
            return ZR_OK;
        }
        ZR_CHECK(zr_devx_query(x->ev[x->copy[i]], &flag));
        if (flag) {
            ZR_MPI_CHECK(MPI_Isend(stage_ptr(s, x->ssend) + x->stage[i], (int)m->bytes, MPI_BYTE,
                                   m->peer, TAG, zr_comm_mpi(c, x->g), &x->req[i]));
            x->step[i] = STEP_WIRE;
            x->next_send++;
        }
        break;
    case STEP_WIRE:
        ZR_MPI_CHECK(MPI_Test(&x->req[i], &flag, MPI_STATUS_IGNORE));
        if (flag && m->recv) {
            /* arrived: back to the device (the event pooled from the send side's use) */
            if (x->ev[i] == NULL) {
                ZR_CHECK(zr_devx_event(&s->x, &x->ev[i]));
            }
            ZR_CUDA_CHECK(cudaMemcpyAsync(x->drecv + m->offset,
                                          stage_ptr(s, x->srecv) + x->stage[i], m->bytes,
                                          cudaMemcpyHostToDevice, s->h2d));
            ZR_CUDA_CHECK(cudaEventRecord(x->ev[i], s->h2d));
            x->step[i] = STEP_H2D;
        } else if (flag) {
            x->step[i] = STEP_DONE;
            x->left--;
        }
        break;
    case STEP_H2D:
        ZR_CHECK(zr_devx_query(x->ev[i], &flag));
        if (flag) {
            x->step[i] = STEP_DONE;
            x->left--;
        }
        break;
    default:
        return ZR_OK;
    }
    *moved |= flag;
    return ZR_OK;
}

static zr_status advance(zr_comm *c, staged_state *s, staged_exchange *x, int *moved)
{
    for (size_t i = 0; i < x->count && !x->failed; i++) {
        zr_status st = advance_one(c, s, x, i, moved);
        if (st != ZR_OK) {
            x->failed = 1;
            return st;
        }
    }
    return ZR_OK;
}

static void staged_progress(zr_comm *c)
{
    staged_state *s = c->transport_state;
    int moved = 0;
    /* a failure here is the exchange's: its own test reports it */
    for (int i = 0; i < s->nlive; i++) {
        (void)advance(c, s, s->live[i], &moved);
    }
}

static zr_status staged_test(zr_comm *c, zr_request *req, int *done, int *progressed)
{
    staged_state *s = c->transport_state;
    staged_exchange *x = req->impl;
    *done = *progressed = 0;
    if (x->failed) {
        ZR_FAIL(ZR_ERR_MPI, "staged transport: a step of this exchange failed before");
    }
    /* every exchange in flight moves on, this one first */
    ZR_CHECK(advance(c, s, x, progressed));
    for (int i = 0; i < s->nlive; i++) {
        if (s->live[i] != x) {
            (void)advance(c, s, s->live[i], progressed);
        }
    }
    int self = 1;
    ZR_CHECK(zr_devx_query(x->self, &self));
    *done = x->left == 0 && self;
    return ZR_OK;
}

static int staged_pending(const zr_comm *c, const zr_request *req, zr_pending *out, int max)
{
    const staged_exchange *x = req->impl;
    int np = 0;
    /* on the wire: what MPI still waits for; copies on this rank's GPU name no peer */
    for (int pass = 1; pass >= 0; pass--) {
        for (size_t i = 0; i < x->count; i++) {
            if (x->step[i] == STEP_WIRE && x->msg[i].recv == pass) {
                zr_comm_pending_add(out, max, &np, zr_comm_world_rank(c, x->g, x->msg[i].peer),
                                    pass);
            }
        }
    }
    return np;
}

static void staged_release(zr_comm *c, zr_request *req)
{
    staged_state *s = c->transport_state;
    staged_exchange *x = req->impl;
    if (x->left > 0) {
        /* a failed exchange: no message may still use its stages once they are reused */
        for (size_t i = 0; i < x->count; i++) {
            if (x->req[i] != MPI_REQUEST_NULL) {
                MPI_Cancel(&x->req[i]);
                MPI_Request_free(&x->req[i]);
            }
        }
        cudaStreamSynchronize(s->d2h);
        cudaStreamSynchronize(s->h2d);
    }
    for (size_t i = 0; i < x->count; i++) {
        zr_devx_put(&s->x, x->ev[i]);
    }
    zr_devx_put(&s->x, x->self);
    if (x->ssend >= 0) {
        s->stages[x->ssend].busy = 0;
    }
    if (x->srecv >= 0) {
        s->stages[x->srecv].busy = 0;
    }
    live_remove(s, x);
    zr_free(x);
    req->impl = NULL;
}

const zr_transport zr_transport_staged = {
    .version = ZR_TRANSPORT_VERSION,
    .name = "staged",
    .init = staged_init,
    .free = staged_free,
    .iexchange = staged_iexchange,
    .test = staged_test,
    .pending = staged_pending,
    .release = staged_release,
    .self_copy = zr_devx_self_copy,
    .progress = staged_progress,
    .abort = NULL, /* MPI_Abort ends its MPI requests and copies */
};
