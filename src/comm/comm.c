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

#include "comm_impl.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/*
 * MPICH defines MPI_STATUSES_IGNORE as the address 1, which GCC's access
 * analysis reads as a zero-sized array being written; the standard says the
 * library never touches it. (clang has no such warning and rejects its name.)
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#endif

/* Tags on the control communicator (ctl), which carries no data exchange. */
#define CTL_TAG_GATHER 11
#define CTL_TAG_BCAST  12
#define CTL_TAG_NOTICE 13
/* notice_buf[1] of a rank whose watchdog fired (otherwise: the failing status) */
#define NOTICE_TIMEOUT (-1)
/* after its own report, a timed-out rank lets the others print theirs this long */
#define TIMEOUT_GRACE_S 1.0

static const char *const kind_names[ZR_KIND_COUNT] = {
    [ZR_KIND_ALLGATHER] = "allgather",
    [ZR_KIND_REDUCE_SCATTER] = "reduce_scatter",
    [ZR_KIND_ALLREDUCE] = "allreduce",
    [ZR_KIND_QWZ] = "qwz",
    [ZR_KIND_HPZ] = "hpz",
    [ZR_KIND_QGZ] = "qgz",
    [ZR_KIND_ALLTOALL] = "alltoall",
    [ZR_KIND_CONTROL] = "control",
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

/* ---- bounded waits ---------------------------------------------------------- */

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

/*
 * What a wait is waiting for, in words: the collective, its group and step,
 * and the world ranks whose messages have not completed.
 */
static void describe_wait(const zr_comm *c, MPI_Request *reqs, int n, const int *peer, int nrecv,
                          const char *what, zr_group g, char *buf, size_t len)
{
    int W = c->size[ZR_GROUP_WORLD] > 0 ? c->size[ZR_GROUP_WORLD] : 1;
    /* out of memory only loses the rank list: the description still names the wait */
    int *mark = NULL;
    (void)zr_alloc_at((void **)&mark, sizeof *mark * (size_t)W, __FILE__, __LINE__);
    int unknown = 0, any_recv = 0, any_send = 0;
    for (int i = 0; i < n; i++) {
        int flag = 1;
        if (reqs[i] != MPI_REQUEST_NULL) {
            MPI_Request_get_status(reqs[i], &flag, MPI_STATUS_IGNORE);
        }
        if (flag) {
            continue;
        }
        int p = peer != NULL ? peer[i] : -1;
        if (p < 0 || p >= W || mark == NULL) {
            unknown = 1;
        } else if (i < nrecv) {
            mark[p] = 1;
            any_recv = 1;
        } else if (mark[p] == 0) {
            mark[p] = 2;
            any_send = 1;
        }
    }
    size_t used = (size_t)snprintf(buf, len, "%s (group %s of %d ranks", what, zr_group_name(g),
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
static _Noreturn void watchdog_fire(zr_comm *c, MPI_Request *reqs, int n, const int *peer,
                                    int nrecv, const char *what, zr_group g, double waited)
{
    char desc[1024];
    describe_wait(c, reqs, n, peer, nrecv, what, g, desc, sizeof desc);
    int me = c->rank[ZR_GROUP_WORLD], W = c->size[ZR_GROUP_WORLD];
    fflush(stdout);
    fprintf(stderr,
            "[zr rank %d] timeout: no progress for %.0f s in %s.\n"
            "  hint: the job is aborted; every rank that is waiting reports what it waits for. "
            "A rank that stopped (crashed, stalled, deadlocked, or started with other arguments) "
            "is the usual cause; if a step really takes this long, raise zr.train.timeout_s "
            "(--timeout; ZR_TIMEOUT for other programs; 0 = wait forever)\n",
            me, waited, desc);
    fflush(stderr);
    static int64_t notice[ZR_NOTICE_LEN];
    notice[0] = me;
    notice[1] = NOTICE_TIMEOUT;
    MPI_Request *sends = c->notice_sends;
    int nsend = 0;
    if (c->ctl != MPI_COMM_NULL && sends != NULL && !c->notified) {
        for (int r = 0; r < W; r++) {
            if (r != me && MPI_Isend(notice, ZR_NOTICE_LEN, MPI_INT64_T, r, CTL_TAG_NOTICE, c->ctl,
                                     &sends[nsend]) == MPI_SUCCESS) {
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
    MPI_Abort(c->mpi[ZR_GROUP_WORLD] != MPI_COMM_NULL ? c->mpi[ZR_GROUP_WORLD] : MPI_COMM_WORLD, 1);
    _exit(1);
}

static zr_status post_notice_recv(zr_comm *c);

/* The notice in notice_buf has arrived: record it. Returns 2 for a timeout notice, else 1. */
static int record_notice(zr_comm *c)
{
    int W = c->size[ZR_GROUP_WORLD];
    int from = (int)c->notice_buf[0];
    int64_t status = c->notice_buf[1];
    if (status == NOTICE_TIMEOUT) {
        c->notice_from = from;
        return 2;
    }
    c->notice_got++;
    if (from >= 0 && from < W && c->notice_tab != NULL) {
        int64_t *row = c->notice_tab + (size_t)from * ZR_NOTICE_LEN;
        memcpy(row, c->notice_buf, sizeof c->notice_buf);
        row[0] = 1;
    }
    /* messages name the failure that started it all, not a rank that gave up waiting */
    if (!c->noticed || (c->notice_status == ZR_ERR_REMOTE && status != ZR_ERR_REMOTE)) {
        c->notice_from = from;
        c->notice_status = (int)status;
    }
    c->noticed = 1;
    return 1;
}

/*
 * Take in the notices that have arrived. 2: another rank timed out (this
 * rank then prints what it waits for), 1: failure notices, 0: none.
 */
static int notice_poll(zr_comm *c)
{
    int got = 0;
    while (c->notice_req != MPI_REQUEST_NULL) {
        int flag = 0;
        if (MPI_Test(&c->notice_req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag) {
            break;
        }
        int k = record_notice(c);
        got = k > got ? k : got;
        (void)post_notice_recv(c);
    }
    return got;
}

/* Rank p sent a notice before it started number index of posted[counter]: it never will. */
static int gone(const zr_comm *c, int p, int counter, long long index)
{
    const int64_t *row = c->notice_tab + (size_t)p * ZR_NOTICE_LEN;
    return row[0] != 0 && row[2 + counter] <= index;
}

/* A rank this wait still needs that will never take part, or -1. */
static int abandoned_by(const zr_comm *c, MPI_Request *reqs, int n, const int *peer, int counter,
                        long long index)
{
    int W = c->size[ZR_GROUP_WORLD];
    if (c->notice_tab == NULL) {
        return -1;
    }
    for (int i = 0; i < n; i++) {
        int flag = 1;
        if (reqs[i] != MPI_REQUEST_NULL) {
            MPI_Request_get_status(reqs[i], &flag, MPI_STATUS_IGNORE);
        }
        if (flag) {
            continue;
        }
        int p = peer != NULL ? peer[i] : -1;
        if (p >= 0 && p < W) {
            if (gone(c, p, counter, index)) {
                return p;
            }
            continue;
        }
        for (int q = 0; q < W; q++) {
            if (q != c->rank[ZR_GROUP_WORLD] && gone(c, q, counter, index)) {
                return q;
            }
        }
    }
    return -1;
}

zr_status zr_comm_poll(zr_comm *c, MPI_Request *reqs, int n, const int *peer, int nrecv,
                       int *scratch, const char *what, zr_group g, int counter, long long index)
{
    if (n <= 0) {
        return ZR_OK;
    }
    double last = zr_now();
    long idle = 0;
    int seen = 0; /* notices taken into account so far */
    for (;;) {
        int done = 0, progressed = 0, rc;
        if (scratch != NULL) {
            int out = 0;
            rc = MPI_Testsome(n, reqs, &out, scratch, MPI_STATUSES_IGNORE);
            done = out == MPI_UNDEFINED;
            progressed = out > 0;
        } else {
            rc = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
        }
        if (rc != MPI_SUCCESS) {
            return zr_mpi_status_at(rc, __FILE__, __LINE__, "MPI_Test");
        }
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
        if (counter >= 0) {
            if (notice_poll(c) == 2) {
                char desc[1024];
                describe_wait(c, reqs, n, peer, nrecv, what, g, desc, sizeof desc);
                fflush(stdout);
                fprintf(stderr, "[zr rank %d] rank %d timed out; this rank waits in %s\n",
                        c->rank[ZR_GROUP_WORLD], c->notice_from, desc);
                fflush(stderr);
            }
            int p = -1;
            if (c->notice_got != seen) {
                seen = c->notice_got;
                p = abandoned_by(c, reqs, n, peer, counter, index);
            }
            if (p >= 0) {
                /* those waiting for this rank learn in turn that it stops here */
                zr_comm_notify(c, ZR_ERR_REMOTE);
                ZR_FAIL(ZR_ERR_REMOTE,
                        "rank %d failed (%s); this rank stopped waiting for rank %d in "
                        "%s",
                        c->notice_from, zr_status_str((zr_status)c->notice_status), p, what);
            }
        }
        if (c->timeout_s > 0 && now - last > c->timeout_s) {
            watchdog_fire(c, reqs, n, peer, nrecv, what, g, now - last);
        }
        /* an idle wait gives its core away: ranks may outnumber cores */
        if (idle > 1024) {
            sched_yield();
        }
    }
}

/* ---- the control communicator ------------------------------------------------ */

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

/*
 * Point-to-point on ctl, every rank with every other (all-gather: root < 0)
 * or root to every other (broadcast), so that a wait that does not complete
 * can name the ranks it misses. Small payloads only.
 */
static zr_status ctl_exchange(zr_comm *c, const void *mine, size_t bytes, void *all, int root,
                              const char *what)
{
    int W = c->size[ZR_GROUP_WORLD], me = c->rank[ZR_GROUP_WORLD];
    if (root < 0) {
        memmove((char *)all + (size_t)me * bytes, mine, bytes);
    }
    if (W == 1) {
        return ZR_OK;
    }
    int tag = root < 0 ? CTL_TAG_GATHER : CTL_TAG_BCAST;
    MPI_Request *reqs = NULL;
    int *peer = NULL;
    ZR_ALLOC(reqs, 2 * (size_t)W);
    zr_status st = zr_alloc_at((void **)&peer, sizeof(int) * 4 * (size_t)W, __FILE__, __LINE__);
    int n = 0, nrecv = 0;
    for (int r = 0; r < W && st == ZR_OK; r++) {
        if (r == me || (root >= 0 && me != root && r != root) || (root >= 0 && me == root)) {
            continue;
        }
        void *dst = root < 0 ? (char *)all + (size_t)r * bytes : all;
        int rc = MPI_Irecv(dst, (int)bytes, MPI_BYTE, r, tag, c->ctl, &reqs[n]);
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
        int rc = MPI_Isend(mine, (int)bytes, MPI_BYTE, r, tag, c->ctl, &reqs[n]);
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

static zr_status post_notice_recv(zr_comm *c)
{
    if (c->size[ZR_GROUP_WORLD] == 1 || c->notice_req != MPI_REQUEST_NULL) {
        return ZR_OK;
    }
    ZR_MPI_CHECK(MPI_Irecv(c->notice_buf, ZR_NOTICE_LEN, MPI_INT64_T, MPI_ANY_SOURCE,
                           CTL_TAG_NOTICE, c->ctl, &c->notice_req));
    return ZR_OK;
}

void zr_comm_notify(zr_comm *c, zr_status st)
{
    int W = c->size[ZR_GROUP_WORLD], me = c->rank[ZR_GROUP_WORLD];
    if (W == 1 || c->notified || c->ctl == MPI_COMM_NULL || c->notice_sends == NULL) {
        return;
    }
    c->notify_buf[0] = me;
    c->notify_buf[1] = (int64_t)st;
    for (int k = 0; k <= ZR_GROUP_COUNT; k++) {
        c->notify_buf[2 + k] = (int64_t)c->posted[k];
    }
    int n = 0;
    for (int r = 0; r < W; r++) {
        if (r != me && MPI_Isend(c->notify_buf, ZR_NOTICE_LEN, MPI_INT64_T, r, CTL_TAG_NOTICE,
                                 c->ctl, &c->notice_sends[n]) == MPI_SUCCESS) {
            n++;
        }
    }
    c->notice_nsend = n;
    c->notified = 1;
}

void zr_comm_set_timeout(zr_comm *c, double seconds)
{
    c->timeout_s = seconds > 0 ? seconds : 0;
}

void zr_comm_set_step(zr_comm *c, long long step)
{
    c->step = step;
}

void zr_comm_set_fail_fast(zr_comm *c, int on)
{
    c->fail_fast = on;
}

int zr_comm_broken(const zr_comm *c)
{
    return c->broken;
}

_Noreturn void zr_comm_abort(zr_comm *c, int exit_code)
{
    fflush(stdout);
    fflush(stderr);
    /* everyone is here, so the message printed before this call is out */
    int32_t one = 1, *all = NULL;
    (void)zr_alloc_at((void **)&all, sizeof *all * (size_t)c->size[ZR_GROUP_WORLD], __FILE__,
                      __LINE__);
    if (all != NULL && c->ctl != MPI_COMM_NULL) {
        (void)ctl_exchange(c, &one, sizeof one, all, -1, "the final abort");
    }
    zr_free(all);
    MPI_Abort(c->mpi[ZR_GROUP_WORLD], exit_code);
    _exit(exit_code);
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

/* ZR_TIMEOUT: seconds (>= 0, 0 = forever); -1 when set but not such a number. */
static double env_timeout(void)
{
    const char *s = getenv("ZR_TIMEOUT");
    if (s == NULL || s[0] == '\0') {
        return ZR_COMM_TIMEOUT_DEFAULT;
    }
    char *end = NULL;
    double v = strtod(s, &end);
    if (*end != '\0' || !(v >= 0.0 && v <= 1e9)) {
        return -1.0;
    }
    return v;
}

/* ZR_FAULT_STEP=R:S[:fail|:stall]; returns 0 when set but malformed. */
static int env_fault(zr_comm *c)
{
    c->fault = ZR_FAULT_NONE;
    const char *s = getenv("ZR_FAULT_STEP");
    if (s == NULL || s[0] == '\0') {
        return 1;
    }
    char *end = NULL;
    long r = strtol(s, &end, 10);
    if (end == s || *end != ':' || r < 0) {
        return 0;
    }
    const char *p = end + 1;
    long long step = strtoll(p, &end, 10);
    if (end == p || step < 0) {
        return 0;
    }
    zr_fault_mode mode = ZR_FAULT_FAIL;
    if (strcmp(end, ":stall") == 0) {
        mode = ZR_FAULT_STALL;
    } else if (*end != '\0' && strcmp(end, ":fail") != 0) {
        return 0;
    }
    c->fault = mode;
    c->fault_rank = (int)r;
    c->fault_step = step;
    return 1;
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
static zr_status detect_nodes(zr_comm *c, MPI_Comm world, int rank, int size, int *rpn, char *why,
                              size_t n)
{
    MPI_Comm shm;
    ZR_MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shm));
    int mine[2];
    MPI_Comm_size(shm, &mine[1]);
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Iallreduce(&rank, &mine[0], 1, MPI_INT, MPI_MIN, shm, &req);
    zr_status st = rc == MPI_SUCCESS ? zr_comm_poll(c, &req, 1, NULL, 0, NULL, "node detection",
                                                    ZR_GROUP_NODE, -1, 0)
                                     : zr_mpi_status_at(rc, __FILE__, __LINE__, "MPI_Iallreduce");
    MPI_Comm_free(&shm);
    ZR_CHECK(st);
    /* the gathered pairs, then the same split into two arrays */
    int *all = NULL;
    ZR_ALLOC(all, 4 * (size_t)size);
    int *tmp = all + 2 * size;
    rc = MPI_Iallgather(mine, 2, MPI_INT, all, 2, MPI_INT, world, &req);
    st = rc == MPI_SUCCESS
             ? zr_comm_poll(c, &req, 1, NULL, 0, NULL, "node detection", ZR_GROUP_WORLD, -1, 0)
             : zr_mpi_status_at(rc, __FILE__, __LINE__, "MPI_Iallgather");
    if (st != ZR_OK) {
        goto fail;
    }
    for (int r = 0; r < size; r++) {
        tmp[r] = all[2 * r];
        tmp[size + r] = all[2 * r + 1];
    }
    *rpn = zr_comm_check_placement(tmp, tmp + size, size, why, n);
fail:
    zr_free(all);
    return st;
}

static zr_status split(zr_comm *c, zr_group g, int color, int key)
{
    ZR_MPI_CHECK(MPI_Comm_split(c->mpi[ZR_GROUP_WORLD], color, key, &c->mpi[g]));
    ZR_MPI_CHECK(MPI_Comm_rank(c->mpi[g], &c->rank[g]));
    ZR_MPI_CHECK(MPI_Comm_size(c->mpi[g], &c->size[g]));
    return ZR_OK;
}

/*
 * What must be the same on every rank before any group is built: the
 * emulated node size (a config field or ZR_RANKS_PER_NODE, which MPMD
 * launches and per-node environments can set differently) and the hpZ size.
 * A difference used to surface as an assertion or a hang; here it is a user
 * error naming the ranks and their values. Malformed zr environment knobs are
 * reported at the same point, so that every rank returns the same error.
 */
typedef struct launch_rec {
    int32_t cfg_rpn, hpz, bad_timeout, bad_fault;
    char rpn[64], timeout[64], fault[64];
} launch_rec;

static void env_copy(char *dst, size_t n, const char *name)
{
    const char *v = getenv(name);
    snprintf(dst, n, "%s", v != NULL ? v : "");
}

static void rec_value(const launch_rec *r, int field, char *buf, size_t n)
{
    if (field == 0) {
        snprintf(buf, n, "%s%s%s", r->rpn[0] ? "'" : "", r->rpn[0] ? r->rpn : "unset",
                 r->rpn[0] ? "'" : "");
    } else if (field == 1) {
        snprintf(buf, n, "%d", (int)r->cfg_rpn);
    } else {
        snprintf(buf, n, "%d", (int)r->hpz);
    }
}

static int rec_same(const launch_rec *a, const launch_rec *b, int field)
{
    if (field == 0) {
        return strcmp(a->rpn, b->rpn) == 0;
    }
    return field == 1 ? a->cfg_rpn == b->cfg_rpn : a->hpz == b->hpz;
}

/* The first rank whose ZR_TIMEOUT or ZR_FAULT_STEP did not parse, reported by every rank. */
static zr_status check_env(const launch_rec *all, int W)
{
    for (int r = 0; r < W; r++) {
        char who[32] = "";
        if (W > 1) {
            snprintf(who, sizeof who, "rank %d: ", r);
        }
        if (all[r].bad_timeout) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "%sZR_TIMEOUT='%s' is not a number of seconds from 0 (wait forever) to 1e9",
                    who, all[r].timeout);
        }
        if (all[r].bad_fault) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "%sZR_FAULT_STEP='%s' is not RANK:STEP, RANK:STEP:fail or RANK:STEP:stall", who,
                    all[r].fault);
        }
    }
    return ZR_OK;
}

/*
 * Whether every rank has the same value of one field; if not, an error that
 * lists up to four distinct values with the ranks holding each. cls is
 * scratch space of W ints.
 */
static zr_status check_field(const launch_rec *all, int W, int field, int *cls)
{
    static const char *const names[3] = {"ZR_RANKS_PER_NODE", "ranks_per_node",
                                         "hpZ partition sizes"};
    int differ = 0, k = 0;
    for (int r = 0; r < W; r++) {
        cls[r] = -1;
        for (int q = 0; q < r && cls[r] < 0; q++) {
            if (rec_same(&all[q], &all[r], field)) {
                cls[r] = cls[q];
            }
        }
        if (cls[r] < 0) {
            cls[r] = k++;
        }
        differ |= cls[r] != 0;
    }
    if (!differ) {
        return ZR_OK;
    }
    char msg[900];
    size_t used =
        (size_t)snprintf(msg, sizeof msg, "ranks were started with different %s:", names[field]);
    for (int v = 0; v < k && v < 4 && used < sizeof msg; v++) {
        int first = 0;
        while (cls[first] != v) {
            first++;
        }
        char val[80], ranks[160];
        rec_value(&all[first], field, val, sizeof val);
        zr_comm_format_ranks(ranks, sizeof ranks, cls, W, v);
        used += (size_t)snprintf(msg + used, sizeof msg - used, "%s %s on %s", v ? "," : "", val,
                                 ranks);
    }
    if (field == 0) {
        ZR_FAIL(ZR_ERR_INVALID,
                "%s; give every rank the same value (Open MPI: mpirun -x "
                "ZR_RANKS_PER_NODE=N; MPICH: mpiexec -genv ZR_RANKS_PER_NODE N)",
                msg);
    }
    ZR_FAIL(ZR_ERR_INVALID, "%s; every rank must build the same groups", msg);
}

static zr_status agree_launch(zr_comm *c, const zr_comm_config *cfg, int bad_timeout, int bad_fault)
{
    int W = c->size[ZR_GROUP_WORLD];
    launch_rec mine;
    memset(&mine, 0, sizeof mine);
    mine.cfg_rpn = cfg->ranks_per_node;
    mine.hpz = cfg->hpz_size;
    mine.bad_timeout = bad_timeout;
    mine.bad_fault = bad_fault;
    env_copy(mine.rpn, sizeof mine.rpn, "ZR_RANKS_PER_NODE");
    env_copy(mine.timeout, sizeof mine.timeout, "ZR_TIMEOUT");
    env_copy(mine.fault, sizeof mine.fault, "ZR_FAULT_STEP");
    launch_rec *all = NULL;
    int *cls = NULL;
    zr_status st;
    ZR_ALLOC(all, (size_t)W);
    ZR_CHECK_GOTO(zr_alloc_at((void **)&cls, sizeof(int) * (size_t)W, __FILE__, __LINE__), st,
                  fail);
    ZR_CHECK_GOTO(ctl_exchange(c, &mine, sizeof mine, all, -1, "the start-up agreement"), st, fail);
    ZR_CHECK_GOTO(check_env(all, W), st, fail);
    /* the environment matters only where no config field overrides it */
    int env_used = 1;
    for (int r = 0; r < W; r++) {
        env_used &= all[r].cfg_rpn == 0;
    }
    for (int field = env_used ? 0 : 1; field < 3; field++) {
        ZR_CHECK_GOTO(check_field(all, W, field, cls), st, fail);
    }
fail:
    zr_free(cls);
    zr_free(all);
    return st;
}

static void teardown(zr_comm *c)
{
    for (int g = 1; g < ZR_GROUP_COUNT; g++) {
        if (c->mpi[g] != MPI_COMM_NULL) {
            MPI_Comm_free(&c->mpi[g]);
        }
    }
    if (c->notice_req != MPI_REQUEST_NULL) {
        /* a notice that arrived after the last agreement is dropped with it */
        MPI_Cancel(&c->notice_req);
        MPI_Wait(&c->notice_req, MPI_STATUS_IGNORE);
    }
    if (c->notice_nsend > 0) {
        for (int i = 0; i < c->notice_nsend; i++) {
            MPI_Request_free(&c->notice_sends[i]);
        }
        c->notice_nsend = 0;
    }
    zr_free(c->notice_sends);
    c->notice_sends = NULL;
    zr_free(c->notice_tab);
    c->notice_tab = NULL;
    if (c->ctl != MPI_COMM_NULL) {
        MPI_Comm_free(&c->ctl);
    }
    if (abort_world == c->mpi[ZR_GROUP_WORLD]) {
        abort_world = MPI_COMM_NULL;
        zr_set_abort_hook(NULL);
    }
}

/*
 * The ranks per node (from the config, ZR_RANKS_PER_NODE or the hosts the
 * ranks run on) and the hpZ partition size, checked against the world size.
 */
static zr_status choose_layout(zr_comm *c, MPI_Comm world, const zr_comm_config *cfg, int *rpn_out,
                               int *h_out)
{
    int rank = c->rank[ZR_GROUP_WORLD], size = c->size[ZR_GROUP_WORLD];
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
        ZR_CHECK(detect_nodes(c, world, rank, size, &rpn, why, sizeof why));
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
    *rpn_out = rpn;
    *h_out = h;
    return ZR_OK;
}

/* The node, cross-node and hpZ communicators of a layout chose_layout accepted. */
static zr_status split_groups(zr_comm *c, int rpn, int h)
{
    int rank = c->rank[ZR_GROUP_WORLD];
    c->ranks_per_node = rpn;
    c->n_nodes = c->size[ZR_GROUP_WORLD] / rpn;
    c->node = rank / rpn;

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

static zr_status init_groups(zr_comm *c, MPI_Comm world, const zr_comm_config *cfg)
{
    c->transport = &zr_transport_mpi;
    c->mpi[ZR_GROUP_WORLD] = world;
    /* errors come back as return codes so that zr can report them itself */
    ZR_MPI_CHECK(MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN));
    int rank, size;
    ZR_MPI_CHECK(MPI_Comm_rank(world, &rank));
    ZR_MPI_CHECK(MPI_Comm_size(world, &size));
    c->rank[ZR_GROUP_WORLD] = rank;
    c->size[ZR_GROUP_WORLD] = size;
    c->first[ZR_GROUP_WORLD] = 0;
    c->stride[ZR_GROUP_WORLD] = 1;
    zr_log_set_rank(rank);
    abort_world = world;
    zr_set_abort_hook(abort_with_mpi);

    zr_comm_config none = {0, 0};
    if (cfg == NULL) {
        cfg = &none;
    }
    double timeout = env_timeout();
    c->timeout_s = timeout >= 0 ? timeout : ZR_COMM_TIMEOUT_DEFAULT;
    int fault_ok = env_fault(c);
    ZR_ALLOC(c->notice_sends, (size_t)size);
    ZR_ALLOC(c->notice_tab, (size_t)size * ZR_NOTICE_LEN);
    /* the control communicator first: from here on every wait is bounded */
    MPI_Request req = MPI_REQUEST_NULL;
    ZR_MPI_CHECK(MPI_Comm_idup(world, &c->ctl, &req));
    ZR_CHECK(zr_comm_poll(c, &req, 1, NULL, 0, NULL, "zr_comm_init", ZR_GROUP_WORLD, -1, 0));
    ZR_MPI_CHECK(MPI_Comm_set_errhandler(c->ctl, MPI_ERRORS_RETURN));
    ZR_CHECK(agree_launch(c, cfg, timeout < 0, !fault_ok));
    ZR_CHECK(post_notice_recv(c));

    int rpn, h;
    ZR_CHECK(choose_layout(c, world, cfg, &rpn, &h));
    return split_groups(c, rpn, h);
}

zr_status zr_comm_init(zr_comm *c, MPI_Comm world, const zr_comm_config *cfg)
{
    memset(c, 0, sizeof *c);
    for (int g = 0; g < ZR_GROUP_COUNT; g++) {
        c->mpi[g] = MPI_COMM_NULL;
    }
    c->ctl = MPI_COMM_NULL;
    c->notice_req = MPI_REQUEST_NULL;
    c->step = -1;
    zr_status st = init_groups(c, world, cfg);
    if (st != ZR_OK) {
        teardown(c);
    }
    return st;
}

void zr_comm_free(zr_comm *c)
{
    teardown(c);
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

/* ZR_FAULT_STEP fired on this rank: fail the exchange, or stall until the job is ended. */
static zr_status inject_fault(zr_comm *c, zr_group g, zr_kind kind)
{
    if (c->fault == ZR_FAULT_STALL) {
        fflush(stdout);
        fprintf(stderr, "[zr rank %d] ZR_FAULT_STEP: stalling at step %lld before %s on group %s\n",
                c->rank[ZR_GROUP_WORLD], c->step, zr_kind_name(kind), zr_group_name(g));
        fflush(stderr);
        for (;;) {
            struct timespec ts = {1, 0};
            nanosleep(&ts, NULL);
        }
    }
    c->fault = ZR_FAULT_NONE; /* once */
    ZR_FAIL(ZR_ERR_INTERNAL, "fault injected by ZR_FAULT_STEP at step %lld (%s on group %s)",
            c->step, zr_kind_name(kind), zr_group_name(g));
}

zr_status zr_comm_iexchange(zr_comm *c, zr_group g, zr_kind kind, const void *send,
                            const size_t *scount, const size_t *sdisp, void *recv,
                            const size_t *rcount, const size_t *rdisp, zr_request *req)
{
    ZR_ASSERT((unsigned)g < ZR_GROUP_COUNT && (unsigned)kind < ZR_KIND_COUNT);
    ZR_ASSERT(!req->active);
    if (c->fault != ZR_FAULT_NONE && c->rank[ZR_GROUP_WORLD] == c->fault_rank &&
        c->step == c->fault_step) {
        ZR_CHECK(inject_fault(c, g, kind));
    }
    int me = c->rank[g];
    if (scount[me] != 0 && rcount[me] != 0) {
        ZR_ASSERT(scount[me] == rcount[me]);
        memmove((char *)recv + rdisp[me], (const char *)send + sdisp[me], scount[me]);
    }
    account(c, g, kind, scount);
    req->group = g;
    req->kind = kind;
    req->seq = c->seq++;
    req->gseq = c->posted[g];
    zr_status st = c->transport->iexchange(c, g, send, scount, sdisp, recv, rcount, rdisp, req);
    if (st == ZR_OK) {
        c->posted[g]++;
    }
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

zr_status zr_comm_wait(zr_comm *c, zr_request *req)
{
    if (!req->active) {
        return ZR_OK;
    }
    zr_status st = c->transport->wait(c, req);
    if (!req->active) {
        c->inflight--;
    }
    return st;
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
    zr_status st = c->transport->test(c, req, done);
    if (!req->active) {
        c->inflight--;
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

/* ---- control values -------------------------------------------------------- */

/*
 * Direct all-reduce for a handful of values: all-gather everyone's vector and
 * reduce locally in rank order, so every rank computes the same bits.
 */
static zr_status gather_values(zr_comm *c, zr_group g, const void *vals, size_t bytes, void **all)
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
    MPI_Request req = MPI_REQUEST_NULL;
    long long index = (long long)c->posted[ZR_GROUP_COUNT]++;
    ZR_MPI_CHECK(MPI_Ibarrier(c->mpi[ZR_GROUP_WORLD], &req));
    return zr_comm_poll(c, &req, 1, NULL, 0, NULL, "barrier", ZR_GROUP_WORLD, ZR_GROUP_COUNT,
                        index);
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
            int rc = MPI_Ibcast(p, chunk, MPI_BYTE, root, c->mpi[ZR_GROUP_WORLD], &reqs[n]);
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

/* Receive the notices still addressed to this rank (expect of them in all), then reset. */
static zr_status drain_notices(zr_comm *c, int expect)
{
    (void)notice_poll(c);
    while (c->notice_got < expect && c->notice_req != MPI_REQUEST_NULL) {
        ZR_CHECK(zr_comm_poll(c, &c->notice_req, 1, NULL, 0, NULL, "the failure notices",
                              ZR_GROUP_WORLD, -1, 0));
        (void)record_notice(c);
        ZR_CHECK(post_notice_recv(c));
    }
    if (c->notice_nsend > 0) {
        ZR_CHECK(zr_comm_poll(c, c->notice_sends, c->notice_nsend, NULL, 0, NULL,
                              "the failure notices", ZR_GROUP_WORLD, -1, 0));
    }
    c->notice_nsend = 0;
    c->notified = 0;
    c->noticed = 0;
    c->notice_got = 0;
    if (c->notice_tab != NULL) {
        memset(c->notice_tab, 0,
               sizeof *c->notice_tab * ZR_NOTICE_LEN * (size_t)c->size[ZR_GROUP_WORLD]);
    }
    return ZR_OK;
}

zr_status zr_comm_agree(zr_comm *c, zr_status local)
{
    int size = c->size[ZR_GROUP_WORLD], me = c->rank[ZR_GROUP_WORLD];
    c->broken = 0;
    if (size == 1) {
        if (local != ZR_OK) {
            char copy[1024];
            snprintf(copy, sizeof copy, "%s", zr_error_message());
            zr_error_set_agreed(copy);
        }
        return local;
    }
    int32_t mine[4] = {(int32_t)local, c->notified, c->inflight > 0, 0};
    int32_t *all = NULL;
    ZR_ALLOC(all, 4 * (size_t)size);
    zr_status st = ctl_exchange(c, mine, sizeof mine, all, -1, "an error agreement");
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
        c->broken |= all[4 * r + 2] != 0;
    }
    zr_free(all);
    ZR_CHECK(st);
    ZR_CHECK(drain_notices(c, senders));
    if (root < 0) {
        c->broken = 0;
        return ZR_OK;
    }
    struct {
        int32_t status;
        int32_t agreed; /* the message names its rank already: an error agreed on before */
        char msg[1000];
    } m;
    memset(&m, 0, sizeof m);
    if (me == root) {
        m.status = (int32_t)local;
        m.agreed = zr_error_agreed();
        snprintf(m.msg, sizeof m.msg, "%s", zr_error_message());
    }
    ZR_CHECK(ctl_exchange(c, &m, sizeof m, &m, root, "an error agreement"));
    char full[1100];
    if (m.agreed) {
        snprintf(full, sizeof full, "%s", m.msg);
    } else {
        snprintf(full, sizeof full, "rank %d: %s", root, m.msg);
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
    MPI_Request req = MPI_REQUEST_NULL;
    long long index = (long long)c->posted[ZR_GROUP_COUNT]++;
    ZR_MPI_CHECK(MPI_Iallreduce(mine, sum, N, MPI_UINT64_T, MPI_SUM, c->mpi[ZR_GROUP_WORLD], &req));
    ZR_CHECK(zr_comm_poll(c, &req, 1, NULL, 0, NULL, "traffic total", ZR_GROUP_WORLD,
                          ZR_GROUP_COUNT, index));
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
