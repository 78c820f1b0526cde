/*
 * exchange.c - the data plane: personalised exchanges inside a group,
 * through the communicator's transport, with exact accounting.
 *
 * Everything an exchange needs that does not depend on how its bytes move
 * is done here, once for every transport: fault injection, the block for
 * myself (a local copy, not traffic), the traffic counters, the sequence
 * numbers that abort notices refer to, the count of exchanges in flight, and
 * the bounded wait (watchdog.c) that completes a request through its
 * transport's test and names its peers through the transport's pending. A
 * transport (zr_transport; transport_mpi.c) only posts, progresses, names
 * and releases.
 *
 * Exchanges of kind ZR_KIND_CONTROL carry control values in host memory, so
 * they always take the MPI transport (the control plane), whatever the
 * communicator's data transport is. A request remembers the transport that
 * posted it.
 */
#define _POSIX_C_SOURCE 200809L

#include "comm_impl.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

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

/* ZR_FAULT_STEP fired on this rank: fail the exchange, or stall until the job is ended. */
static zr_status inject_fault(zr_comm *c, zr_group g, zr_kind kind)
{
    if (c->control->fault == ZR_FAULT_STALL) {
        fflush(stdout);
        fprintf(stderr, "[zr rank %d] ZR_FAULT_STEP: stalling at step %lld before %s on group %s\n",
                c->rank[ZR_GROUP_WORLD], c->step, zr_kind_name(kind), zr_group_name(g));
        fflush(stderr);
        for (;;) {
            struct timespec ts = {1, 0};
            nanosleep(&ts, NULL);
        }
    }
    c->control->fault = ZR_FAULT_NONE; /* once */
    ZR_FAIL(ZR_ERR_INTERNAL, "fault injected by ZR_FAULT_STEP at step %lld (%s on group %s)",
            c->step, zr_kind_name(kind), zr_group_name(g));
}

zr_status zr_comm_iexchange(zr_comm *c, zr_group g, zr_kind kind, const void *send,
                            const size_t *scount, const size_t *sdisp, void *recv,
                            const size_t *rcount, const size_t *rdisp, zr_request *req)
{
    ZR_ASSERT((unsigned)g < ZR_GROUP_COUNT && (unsigned)kind < ZR_KIND_COUNT);
    ZR_ASSERT(!req->active);
    const struct zr_comm_control *cp = c->control;
    if (cp->fault != ZR_FAULT_NONE && c->rank[ZR_GROUP_WORLD] == cp->fault_rank &&
        c->step == cp->fault_step) {
        ZR_CHECK(inject_fault(c, g, kind));
    }
    const zr_transport *t = kind == ZR_KIND_CONTROL ? &zr_transport_mpi : c->transport;
    int me = c->rank[g];
    if (scount[me] != 0 && rcount[me] != 0) {
        ZR_ASSERT(scount[me] == rcount[me]);
        char *dst = (char *)recv + rdisp[me];
        const char *src = (const char *)send + sdisp[me];
        if (t->self_copy != NULL) {
            ZR_CHECK(t->self_copy(c, dst, src, scount[me]));
        } else {
            memmove(dst, src, scount[me]);
        }
    }
    account(c, g, kind, scount);
    req->transport = t;
    req->impl = NULL;
    req->group = g;
    req->kind = kind;
    req->seq = c->seq++;
    req->gseq = c->posted[g];
    zr_status st = t->iexchange(c, g, send, scount, sdisp, recv, rcount, rdisp, req);
    if (st == ZR_OK) {
        c->posted[g]++;
    }
    /* after a failure, what was posted is still completed by the waits */
    req->active = req->impl != NULL;
    if (req->active) {
        c->inflight++;
    }
    return st;
}

/* Equal-block layouts need count/displacement arrays; groups are small, so a stack buffer. */
#define MAX_STACK_PEERS 256

static zr_status equal_blocks(zr_comm *c, zr_group g, zr_kind kind, const void *send, size_t bytes,
                              int send_same, void *recv, zr_request *req)
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

zr_status zr_comm_iallgather(zr_comm *c, zr_group g, zr_kind kind, const void *send, size_t bytes,
                             void *recv, zr_request *req)
{
    return equal_blocks(c, g, kind, send, bytes, 1, recv, req);
}

zr_status zr_comm_ialltoall(zr_comm *c, zr_group g, zr_kind kind, const void *send, size_t bytes,
                            void *recv, zr_request *req)
{
    return equal_blocks(c, g, kind, send, bytes, 0, recv, req);
}

/* ---- completion -------------------------------------------------------------- */

/* The request completed, or its transport failed: the transport's storage goes back. */
static void finish(zr_comm *c, zr_request *req)
{
    req->transport->release(c, req);
    req->impl = NULL;
    req->active = 0;
    c->inflight--;
}

/* A request as the watchdog sees it: progress and pending peers from its transport. */
static zr_status request_test(zr_comm *c, void *ctx, int *done, int *progressed)
{
    zr_request *req = ctx;
    return req->transport->test(c, req, done, progressed);
}

static int request_pending(const zr_comm *c, void *ctx, zr_pending *out, int max)
{
    const zr_request *req = ctx;
    return req->transport->pending(c, req, out, max);
}

zr_status zr_comm_wait(zr_comm *c, zr_request *req)
{
    if (!req->active) {
        return ZR_OK;
    }
    /* the exchange is number gseq on its group: a notice tells whether a failed rank got to it */
    zr_waiter w = {
        .test = request_test,
        .pending = request_pending,
        .ctx = req,
        .what = zr_kind_name(req->kind),
        .group = req->group,
        .counter = (int)req->group,
        .index = (long long)req->gseq,
    };
    zr_status st = zr_comm_wait_bounded(c, &w);
    if (st == ZR_ERR_REMOTE) {
        /* another rank gave up: the exchange stays posted, its buffers the transport's */
        return st;
    }
    finish(c, req);
    return st;
}

zr_status zr_comm_test(zr_comm *c, zr_request *req, int *done)
{
    *done = 0;
    if (!req->active) {
        *done = 1;
        return ZR_OK;
    }
    int progressed = 0;
    zr_status st = req->transport->test(c, req, done, &progressed);
    if (st != ZR_OK || *done) {
        finish(c, req);
    }
    return st;
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

/* ---- accounting ------------------------------------------------------------------ */

void zr_comm_traffic_reset(zr_comm *c)
{
    memset(&c->traffic, 0, sizeof c->traffic);
}

zr_traffic zr_comm_traffic_get(const zr_comm *c)
{
    return c->traffic;
}

/* ---- the transport on a communicator ------------------------------------------- */

static zr_status check_transport(const zr_comm *c, const zr_transport *t)
{
    if (t == NULL) {
        ZR_FAIL(ZR_ERR_INVALID, "transport: NULL table");
    }
    const char *name = t->name != NULL ? t->name : "(unnamed)";
    if (t->version != ZR_TRANSPORT_VERSION) {
        ZR_FAIL(ZR_ERR_INVALID, "transport %s: table version %d, this zr needs %d", name,
                t->version, ZR_TRANSPORT_VERSION);
    }
    if (t->iexchange == NULL || t->test == NULL || t->pending == NULL || t->release == NULL) {
        ZR_FAIL(ZR_ERR_INVALID,
                "transport %s: iexchange, test, pending and release are all required", name);
    }
    if (c->inflight > 0) {
        ZR_FAIL(ZR_ERR_INVALID, "transport %s: %d exchanges still in flight on this rank", name,
                c->inflight);
    }
    return ZR_OK;
}

zr_status zr_comm_use_transport(zr_comm *c, const zr_transport *t, const void *arg)
{
    zr_status st = check_transport(c, t);
    void *state = NULL;
    if (st == ZR_OK && t->init != NULL) {
        st = t->init(c, arg, &state);
    }
    /* a transport that came up on some ranks only is taken down again there */
    zr_status agreed = zr_comm_agree(c, st);
    if (agreed != ZR_OK) {
        if (st == ZR_OK && t->free != NULL) {
            t->free(c, state);
        }
        return agreed;
    }
    zr_comm_transport_free(c);
    c->transport = t;
    c->transport_state = state;
    return ZR_OK;
}

void zr_comm_transport_abort(zr_comm *c)
{
    if (c->transport != NULL && c->transport->abort != NULL) {
        c->transport->abort(c);
    }
}

void zr_comm_transport_free(zr_comm *c)
{
    if (c->transport != NULL && c->transport->free != NULL) {
        c->transport->free(c, c->transport_state);
    }
    c->transport_state = NULL;
}
