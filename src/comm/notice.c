/*
 * notice.c - abort notices, on the control communicator.
 *
 * A rank that fails while the others may be waiting for it sends every other
 * rank a small notice: its status and how many exchanges of each group (and
 * MPI collectives on world) it had started. A rank waiting for it in
 * something it never started stops waiting (watchdog.c asks
 * zr_comm_notice_gone); something it did start still completes. So every
 * rank reaches the next zr_comm_agree promptly, which receives the notices
 * sent and starts afresh. A rank whose watchdog fired sends a timeout notice
 * instead, so that every waiting rank says what it waits for before the job
 * ends.
 *
 * One receive from any source is always posted (after the start-up
 * agreement), so a notice never waits for its receiver to look.
 *
 * Each notice carries its sender's epoch (the agreements it has completed),
 * and an agreement waits for exactly the notices of its own epoch. A rank
 * that has completed an agreement may fail and send its next notice while a
 * slower rank is still inside the same agreement: that notice belongs to
 * the next epoch and is kept for it. (Counting it in the current one, as zr
 * did, lost it: the next agreement then waited for a notice that had come
 * and gone, while the other ranks had left for MPI_Finalize.) No notice can
 * be two epochs ahead: completing the next agreement needs this rank.
 */
#define _POSIX_C_SOURCE 200809L

#include "comm_impl.h"

#include <string.h>
#include <time.h>

/*
 * MPICH defines MPI_STATUSES_IGNORE as the address 1, which GCC's access
 * analysis reads as a zero-sized array being written; the standard says the
 * library never touches it. (clang has no such warning and rejects its name.)
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#endif

/* after its own report, a timed-out rank lets the others print theirs this long */
#define TIMEOUT_GRACE_S 1.0

zr_status zr_comm_notice_init(zr_comm *c)
{
    struct zr_comm_control *cp = c->control;
    size_t W = (size_t)c->size[ZR_GROUP_WORLD];
    ZR_ALLOC(cp->notice_sends, W);
    ZR_ALLOC(cp->notices.tab, W * ZR_NOTICE_LEN);
    ZR_ALLOC(cp->early.tab, W * ZR_NOTICE_LEN);
    return ZR_OK;
}

zr_status zr_comm_notice_post_recv(zr_comm *c)
{
    struct zr_comm_control *cp = c->control;
    if (c->size[ZR_GROUP_WORLD] == 1 || cp->notice_req != MPI_REQUEST_NULL) {
        return ZR_OK;
    }
    ZR_MPI_CHECK(MPI_Irecv(cp->notice_buf, ZR_NOTICE_LEN, MPI_INT64_T, MPI_ANY_SOURCE,
                           ZR_CTL_TAG_NOTICE, cp->ctl, &cp->notice_req));
    return ZR_OK;
}

/* The notice in notice_buf has arrived: record it. Returns 2 for a timeout notice, else 1. */
static int record_notice(zr_comm *c)
{
    struct zr_comm_control *cp = c->control;
    int W = c->size[ZR_GROUP_WORLD];
    int from = (int)cp->notice_buf[0];
    int64_t status = cp->notice_buf[1];
    if (status == ZR_NOTICE_TIMEOUT) {
        cp->timeout_from = from;
        return 2;
    }
    /* the epoch is this rank's or the next one (see the top of the file) */
    zr_notice_set *set = cp->notice_buf[ZR_NOTICE_EPOCH] > cp->epoch ? &cp->early : &cp->notices;
    if (from >= 0 && from < W && set->tab != NULL) {
        int64_t *row = set->tab + (size_t)from * ZR_NOTICE_LEN;
        memcpy(row, cp->notice_buf, sizeof cp->notice_buf);
        row[0] = 1;
    }
    /* messages name the failure that started it all, not a rank that gave up waiting */
    if (set->got == 0 || (set->status == ZR_ERR_REMOTE && status != ZR_ERR_REMOTE)) {
        set->from = from;
        set->status = (int)status;
    }
    set->got++;
    return 1;
}

int zr_comm_notice_poll(zr_comm *c)
{
    struct zr_comm_control *cp = c->control;
    int got = 0;
    while (cp->notice_req != MPI_REQUEST_NULL) {
        int flag = 0;
        if (MPI_Test(&cp->notice_req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag) {
            break;
        }
        int k = record_notice(c);
        got = k > got ? k : got;
        (void)zr_comm_notice_post_recv(c);
    }
    return got;
}

int zr_comm_notice_gone(const zr_comm *c, int p, int counter, long long index)
{
    const int64_t *row = c->control->notices.tab + (size_t)p * ZR_NOTICE_LEN;
    return row[0] != 0 && row[ZR_NOTICE_POSTED + counter] <= index;
}

void zr_comm_notify(zr_comm *c, zr_status st)
{
    struct zr_comm_control *cp = c->control;
    int W = c->size[ZR_GROUP_WORLD], me = c->rank[ZR_GROUP_WORLD];
    if (W == 1 || cp == NULL || cp->notified || cp->ctl == MPI_COMM_NULL ||
        cp->notice_sends == NULL) {
        return;
    }
    cp->notify_buf[0] = me;
    cp->notify_buf[1] = (int64_t)st;
    cp->notify_buf[ZR_NOTICE_EPOCH] = cp->epoch;
    for (int k = 0; k <= ZR_GROUP_COUNT; k++) {
        cp->notify_buf[ZR_NOTICE_POSTED + k] = (int64_t)c->posted[k];
    }
    int n = 0;
    for (int r = 0; r < W; r++) {
        if (r != me && MPI_Isend(cp->notify_buf, ZR_NOTICE_LEN, MPI_INT64_T, r, ZR_CTL_TAG_NOTICE,
                                 cp->ctl, &cp->notice_sends[n]) == MPI_SUCCESS) {
            n++;
        }
    }
    cp->notice_nsend = n;
    cp->notified = 1;
}

void zr_comm_notice_timeout(zr_comm *c)
{
    struct zr_comm_control *cp = c->control;
    int me = c->rank[ZR_GROUP_WORLD], W = c->size[ZR_GROUP_WORLD];
    /* the job ends before this function would return, so the buffer may outlive it */
    static int64_t notice[ZR_NOTICE_LEN];
    notice[0] = me;
    notice[1] = ZR_NOTICE_TIMEOUT;
    MPI_Request *sends = cp->notice_sends;
    int nsend = 0;
    if (cp->ctl != MPI_COMM_NULL && sends != NULL && !cp->notified) {
        for (int r = 0; r < W; r++) {
            if (r != me && MPI_Isend(notice, ZR_NOTICE_LEN, MPI_INT64_T, r, ZR_CTL_TAG_NOTICE,
                                     cp->ctl, &sends[nsend]) == MPI_SUCCESS) {
                nsend++;
            }
        }
    }
    double t0 = zr_now();
    while (zr_now() - t0 < TIMEOUT_GRACE_S) {
        int done = 1;
        if (nsend > 0) {
            MPI_Testall(nsend, sends, &done, MPI_STATUSES_IGNORE);
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

zr_status zr_comm_notice_drain(zr_comm *c, int expect)
{
    struct zr_comm_control *cp = c->control;
    (void)zr_comm_notice_poll(c);
    while (cp->notices.got < expect && cp->notice_req != MPI_REQUEST_NULL) {
        ZR_CHECK(zr_comm_poll(c, &cp->notice_req, 1, NULL, 0, NULL, "the failure notices",
                              ZR_GROUP_WORLD, -1, 0));
        (void)record_notice(c);
        ZR_CHECK(zr_comm_notice_post_recv(c));
    }
    if (cp->notice_nsend > 0) {
        ZR_CHECK(zr_comm_poll(c, cp->notice_sends, cp->notice_nsend, NULL, 0, NULL,
                              "the failure notices", ZR_GROUP_WORLD, -1, 0));
    }
    cp->notice_nsend = 0;
    cp->notified = 0;
    /* the next epoch starts with the notices that came early for it */
    zr_notice_set next = cp->early;
    cp->early = cp->notices;
    cp->notices = next;
    cp->early.got = 0;
    if (cp->early.tab != NULL) {
        memset(cp->early.tab, 0,
               sizeof *cp->early.tab * ZR_NOTICE_LEN * (size_t)c->size[ZR_GROUP_WORLD]);
    }
    cp->epoch++;
    return ZR_OK;
}

void zr_comm_notice_free(zr_comm *c)
{
    struct zr_comm_control *cp = c->control;
    if (cp->notice_req != MPI_REQUEST_NULL) {
        /* a notice that arrived after the last agreement is dropped with it */
        MPI_Cancel(&cp->notice_req);
        MPI_Wait(&cp->notice_req, MPI_STATUS_IGNORE);
    }
    if (cp->notice_nsend > 0) {
        for (int i = 0; i < cp->notice_nsend; i++) {
            MPI_Request_free(&cp->notice_sends[i]);
        }
        cp->notice_nsend = 0;
    }
    zr_free(cp->notice_sends);
    cp->notice_sends = NULL;
    zr_free(cp->notices.tab);
    cp->notices.tab = NULL;
    zr_free(cp->early.tab);
    cp->early.tab = NULL;
}
