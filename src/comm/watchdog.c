/*
 * watchdog.c - the bounded wait. Every wait of zr (a data-plane exchange
 * through its transport, the control plane's MPI requests) polls instead of
 * blocking, so that while it waits a rank notices two things: an abort
 * notice saying that a rank it waits for will never take part (it stops
 * with ZR_ERR_REMOTE), and timeout_s seconds without progress (it says what
 * it waits for and ends the job; comm.h "Bounded waits").
 *
 * The loop knows a wait only as a zr_waiter: test (progress without
 * blocking) and pending (the world ranks whose messages have not completed,
 * receives first). A transport that is not MPI therefore gets the same
 * watchdog, the same notices and the same messages.
 */
#define _POSIX_C_SOURCE 200809L

#include "comm_impl.h"

#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/*
 * MPICH defines MPI_STATUSES_IGNORE as the address 1, which GCC's access
 * analysis reads as a zero-sized array being written; the standard says the
 * library never touches it. (clang has no such warning and rejects its name.)
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#endif

void zr_comm_format_ranks(char *buf, size_t len, const int *cls, int n, int k)
{
    int total = 0, ranges = 0, shown = 0;
    for (int r = 0; r < n; r++) {
        total += cls[r] == k;
    }
    size_t used = (size_t)snprintf(buf, len, "%s", total == 1 ? "rank " : "ranks ");
    for (int r = 0; r < n && used < len; r++) {
        if (cls[r] != k || (r > 0 && cls[r - 1] == k)) {
            continue;
        }
        int e = r;
        while (e + 1 < n && cls[e + 1] == k) {
            e++;
        }
        if (ranges == 4) {
            snprintf(buf + used, len - used, " and %d more", total - shown);
            return;
        }
        if (e == r) {
            used += (size_t)snprintf(buf + used, len - used, "%s%d", ranges ? ", " : "", r);
        } else {
            used += (size_t)snprintf(buf + used, len - used, "%s%d-%d", ranges ? ", " : "", r, e);
        }
        ranges++;
        shown += e - r + 1;
    }
}

static int world_size(const zr_comm *c)
{
    return c->size[ZR_GROUP_WORLD] > 0 ? c->size[ZR_GROUP_WORLD] : 1;
}

/*
 * The messages w still waits for, in *out (allocated; NULL when out of
 * memory, which only loses the rank list of a message). Every rank at most
 * once per direction, plus room for "not known".
 */
static int pending_of(const zr_comm *c, const zr_waiter *w, zr_pending **out)
{
    int max = 2 * world_size(c) + 2;
    *out = NULL;
    if (ZR_ALLOC_STATUS(*out, (size_t)max) != ZR_OK) {
        return 0;
    }
    return w->pending(c, w->ctx, *out, max);
}

/* Mark the ranks w waits for: mark[r] = 1 data from r, 2 data to r; returns 1 if some are unknown.
 */
static int mark_pending(const zr_comm *c, const zr_waiter *w, int *mark, int *any_recv,
                        int *any_send)
{
    int W = world_size(c);
    zr_pending *pend = NULL;
    int np = pending_of(c, w, &pend);
    int unknown = pend == NULL || mark == NULL;
    /* receives first: a rank that owes data and has not taken ours is named as owing it */
    for (int pass = 1; pass >= 0 && mark != NULL; pass--) {
        for (int i = 0; i < np; i++) {
            int p = pend[i].rank;
            if ((pend[i].recv != 0) != pass) {
                continue;
            }
            if (p < 0 || p >= W) {
                unknown = 1;
            } else if (mark[p] == 0) {
                mark[p] = 2 - pass;
                *any_recv |= pass;
                *any_send |= !pass;
            }
        }
    }
    zr_free(pend);
    return unknown;
}

/*
 * What a wait is waiting for, in words: the collective, its group and step,
 * and the world ranks whose messages have not completed.
 */
static void describe_wait(const zr_comm *c, const zr_waiter *w, char *buf, size_t len)
{
    int W = world_size(c);
    zr_group g = w->group;
    /* out of memory only loses the rank list: the description still names the wait */
    int *mark = NULL;
    (void)ZR_ALLOC_STATUS(mark, (size_t)W);
    int any_recv = 0, any_send = 0;
    int unknown = mark_pending(c, w, mark, &any_recv, &any_send);
    size_t used = (size_t)snprintf(buf, len, "%s (group %s of %d ranks", w->what, zr_group_name(g),
                                   c->size[g] > 0 ? c->size[g] : W);
    if (c->step >= 0 && used < len) {
        used += (size_t)snprintf(buf + used, len - used, ", step %lld", c->step);
    }
    if (used < len) {
        used += (size_t)snprintf(buf + used, len - used, ", after %llu exchanges on this rank)",
                                 (unsigned long long)c->seq);
    }
    char ranks[200];
    if (any_recv && used < len) {
        zr_comm_format_ranks(ranks, sizeof ranks, mark, W, 1);
        used += (size_t)snprintf(buf + used, len - used, "; waiting for data from %s", ranks);
    }
    if (any_send && used < len) {
        zr_comm_format_ranks(ranks, sizeof ranks, mark, W, 2);
        used += (size_t)snprintf(buf + used, len - used, "; %s %s not taken the data sent to %s",
                                 ranks, strncmp(ranks, "ranks", 5) == 0 ? "have" : "has",
                                 strncmp(ranks, "ranks", 5) == 0 ? "them" : "it");
    }
    if ((unknown || (!any_recv && !any_send)) && used < len) {
        snprintf(buf + used, len - used, "; waiting for the other ranks of group %s",
                 zr_group_name(g));
    }
    zr_free(mark);
}

/*
 * The watchdog fired: report, tell the other ranks (each then prints what it
 * waits for), give them a moment, end the job.
 */
static _Noreturn void watchdog_fire(zr_comm *c, const zr_waiter *w, double waited)
{
    char desc[1024];
    describe_wait(c, w, desc, sizeof desc);
    fflush(stdout);
    fprintf(stderr,
            "[zr rank %d] timeout: no progress for %.0f s in %s.\n"
            "  hint: the job is aborted; every rank that is waiting reports what it waits for. "
            "A rank that stopped (crashed, stalled, deadlocked, or started with other arguments) "
            "is the usual cause; if a step really takes this long, raise zr.train.timeout_s "
            "(--timeout; ZR_TIMEOUT for other programs; 0 = wait forever)\n",
            c->rank[ZR_GROUP_WORLD], waited, desc);
    fflush(stderr);
    zr_comm_notice_timeout(c);
    zr_comm_transport_abort(c);
    MPI_Comm world = c->control->mpi[ZR_GROUP_WORLD];
    MPI_Abort(world != MPI_COMM_NULL ? world : MPI_COMM_WORLD, 1);
    _exit(1);
}

/* A rank this wait still needs that will never take part, or -1. */
static int abandoned_by(const zr_comm *c, const zr_waiter *w)
{
    int W = c->size[ZR_GROUP_WORLD], me = c->rank[ZR_GROUP_WORLD];
    if (c->control->notices.tab == NULL) {
        return -1;
    }
    zr_pending *pend = NULL;
    int np = pending_of(c, w, &pend), found = -1;
    for (int i = 0; i < np && found < 0; i++) {
        int p = pend[i].rank;
        if (p >= 0 && p < W) {
            found = zr_comm_notice_gone(c, p, w->counter, w->index) ? p : -1;
            continue;
        }
        /* a message whose peer is not known may wait for any rank */
        for (int q = 0; q < W && found < 0; q++) {
            if (q != me && zr_comm_notice_gone(c, q, w->counter, w->index)) {
                found = q;
            }
        }
    }
    zr_free(pend);
    return found;
}

/*
 * Look at the notices that arrived: another rank's timeout makes this rank
 * say what it waits in; a failed rank that never started this wait ends it.
 * *seen: notices already taken into account by this wait.
 */
static zr_status check_notices(zr_comm *c, const zr_waiter *w, int *seen)
{
    struct zr_comm_control *cp = c->control;
    if (zr_comm_notice_poll(c) == 2) {
        char desc[1024];
        describe_wait(c, w, desc, sizeof desc);
        fflush(stdout);
        fprintf(stderr, "[zr rank %d] rank %d timed out; this rank waits in %s\n",
                c->rank[ZR_GROUP_WORLD], cp->timeout_from, desc);
        fflush(stderr);
    }
    if (cp->notices.got == *seen) {
        return ZR_OK;
    }
    *seen = cp->notices.got;
    int p = abandoned_by(c, w);
    if (p < 0) {
        return ZR_OK;
    }
    /* those waiting for this rank learn in turn that it stops here */
    zr_comm_notify(c, ZR_ERR_REMOTE);
    ZR_FAIL(ZR_ERR_REMOTE, "rank %d failed (%s); this rank stopped waiting for rank %d in %s",
            cp->notices.from, zr_status_str((zr_status)cp->notices.status), p, w->what);
}

zr_status zr_comm_wait_bounded(zr_comm *c, const zr_waiter *w)
{
    double last = zr_now();
    long idle = 0;
    int seen = 0; /* notices taken into account so far */
    const zr_transport *t = c->transport;
    for (;;) {
        int done = 0, progressed = 0;
        /* exchanges of a transport that needs the host keep moving, whatever this waits for */
        if (t != NULL && t->progress != NULL && c->inflight > 0) {
            t->progress(c);
        }
        ZR_CHECK(w->test(c, w->ctx, &done, &progressed));
        if (done) {
            return ZR_OK;
        }
        if (progressed) {
            last = zr_now();
            idle = 0;
            continue;
        }
        /* the clock and the notices are looked at now and then: a short wait stays short */
        if (++idle % 16 != 0) {
            continue;
        }
        double now = zr_now();
        if (w->counter >= 0) {
            ZR_CHECK(check_notices(c, w, &seen));
        }
        if (c->timeout_s > 0 && now - last > c->timeout_s) {
            watchdog_fire(c, w, now - last);
        }
        /* an idle wait gives its core away: ranks may outnumber cores */
        if (idle > 1024) {
            sched_yield();
        }
    }
}

/* ---- the control plane's MPI requests as a waiter -------------------------------- */

typedef struct mpi_wait {
    MPI_Request *reqs;
    int n, nrecv;
    const int *peer;
    int *scratch;
} mpi_wait;

static zr_status mpi_wait_test(zr_comm *c, void *ctx, int *done, int *progressed)
{
    (void)c;
    mpi_wait *m = ctx;
    int rc;
    if (m->scratch != NULL) {
        int out = 0;
        rc = MPI_Testsome(m->n, m->reqs, &out, m->scratch, MPI_STATUSES_IGNORE);
        *done = out == MPI_UNDEFINED;
        *progressed = out > 0;
    } else {
        rc = MPI_Testall(m->n, m->reqs, done, MPI_STATUSES_IGNORE);
    }
    if (rc != MPI_SUCCESS) {
        return zr_mpi_status_at(rc, __FILE__, __LINE__, "MPI_Test");
    }
    return ZR_OK;
}

static int mpi_wait_pending(const zr_comm *c, void *ctx, zr_pending *out, int max)
{
    (void)c;
    const mpi_wait *m = ctx;
    int np = 0;
    for (int i = 0; i < m->n; i++) {
        int flag = 1;
        if (m->reqs[i] != MPI_REQUEST_NULL) {
            MPI_Request_get_status(m->reqs[i], &flag, MPI_STATUS_IGNORE);
        }
        if (!flag) {
            zr_comm_pending_add(out, max, &np, m->peer != NULL ? m->peer[i] : -1, i < m->nrecv);
        }
    }
    return np;
}

zr_status zr_comm_poll(zr_comm *c, MPI_Request *reqs, int n, const int *peer, int nrecv,
                       int *scratch, const char *what, zr_group g, int counter, long long index)
{
    if (n <= 0) {
        return ZR_OK;
    }
    mpi_wait m = {reqs, n, nrecv, peer, scratch};
    zr_waiter w = {mpi_wait_test, mpi_wait_pending, &m, what, g, counter, index};
    return zr_comm_wait_bounded(c, &w);
}
