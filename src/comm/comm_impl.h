/*
 * comm_impl.h - what the files of src/comm share: the control plane's state
 * behind zr_comm.control, the bounded wait every wait of zr goes through,
 * and the steps zr_comm_init and zr_comm_free are made of.
 *
 *   comm.c           the life of a communicator: init, free, knobs, abort hook, names
 *   topology.c       nodes (detected or emulated), layout checks, the start-up
 *                    agreement, the group communicators
 *   watchdog.c       the bounded wait: progress, notices, timeout, what a wait waits for
 *   notice.c         abort notices: sending, receiving, what they tell a wait
 *   control.c        the control plane's traffic: control values, barrier, broadcast,
 *                    agreement, the final abort, the traffic total
 *   exchange.c       the data plane: exchanges through the transport, accounting,
 *                    fault injection, the transport's life on a communicator
 *   transport_mpi.c  the MPI transport
 *   transport_plan.c the calls every transport makes, as plain functions
 *   transport_staged.c  device memory over MPI through pinned host memory
 *   transport_nccl.c the NCCL transport (one GPU per rank)
 *
 * The control plane is MPI (this header may name MPI types); the data plane
 * reaches its transport only through zr_transport.
 */
#ifndef ZR_COMM_IMPL_H
#define ZR_COMM_IMPL_H

#include "zr/comm.h"

/* Fault injection (ZR_FAULT_STEP=R:S[:stall]), for tests of the failure paths. */
typedef enum zr_fault_mode { ZR_FAULT_NONE = 0, ZR_FAULT_FAIL, ZR_FAULT_STALL } zr_fault_mode;

/*
 * An abort notice: {world rank, status, epoch, posted[0 .. ZR_GROUP_COUNT]} (see
 * zr_comm.posted); epoch: how many zr_comm_agree the sender had completed when it sent it.
 */
#define ZR_NOTICE_EPOCH  2
#define ZR_NOTICE_POSTED 3
#define ZR_NOTICE_LEN    (ZR_GROUP_COUNT + 4)
/* notice[1] of a rank whose watchdog fired (otherwise: the failing status) */
#define ZR_NOTICE_TIMEOUT (-1)

/* Tags on the control communicator (ctl), which carries no data exchange. */
#define ZR_CTL_TAG_GATHER 11
#define ZR_CTL_TAG_BCAST  12
#define ZR_CTL_TAG_NOTICE 13

/*
 * The failure notices of one epoch (the time between two zr_comm_agree) that
 * this rank has received.
 */
typedef struct zr_notice_set {
    int got;      /* how many */
    int from;     /* the first (an original failure before a ZR_ERR_REMOTE) came from this rank */
    int status;   /* ... with this status */
    int64_t *tab; /* owned: per world rank ZR_NOTICE_LEN values, [0] = 1 once it sent one */
} zr_notice_set;

/* The control plane's state (zr_comm.control): MPI communicators, notices, fault injection. */
struct zr_comm_control {
    MPI_Comm mpi[ZR_GROUP_COUNT]; /* owned, except mpi[WORLD] (the caller's) */
    MPI_Comm ctl; /* owned: a duplicate of world for agreements and notices, never data */
    int broken;   /* the last failed zr_comm_agree left exchanges in flight somewhere */

    /* ---- abort notices (notice.c) ---- */
    int notified;          /* this rank has sent its failure notice in this epoch */
    long long epoch;       /* zr_comm_agree completed on this rank */
    zr_notice_set notices; /* those sent in this epoch */
    /* those sent in the next one: a rank that has completed this epoch's agreement may fail
       and notify before this rank has completed it (they count in the next agreement) */
    zr_notice_set early;
    int timeout_from;                  /* the rank whose timeout notice arrived */
    MPI_Request notice_req;            /* the posted receive of the next notice */
    int64_t notice_buf[ZR_NOTICE_LEN]; /* its buffer (status ZR_NOTICE_TIMEOUT: rank timed out) */
    MPI_Request *notice_sends;         /* owned: world-size slots for this rank's notices */
    int notice_nsend;                  /* of which in flight */
    int64_t notify_buf[ZR_NOTICE_LEN]; /* the notice this rank sends */

    /* ---- fault injection (exchange.c) ---- */
    zr_fault_mode fault;
    int fault_rank;
    long long fault_step;
};

/* ---- bounded waits (watchdog.c) --------------------------------------------- */

/*
 * Something a bounded wait waits for: a data-plane request (through its
 * transport) or a set of MPI requests of the control plane.
 */
typedef struct zr_waiter {
    /* progress without blocking (see zr_transport.test) */
    zr_status (*test)(zr_comm *c, void *ctx, int *done, int *progressed);
    /* the messages not complete yet, receives first (see zr_transport.pending) */
    int (*pending)(const zr_comm *c, void *ctx, zr_pending *out, int max);
    void *ctx;
    const char *what; /* names the wait in messages, with group */
    zr_group group;
    /* >= 0: the wait is number index among the zr_comm.posted[counter] of this rank, and ends
       with ZR_ERR_REMOTE (left posted) once a notice shows that a rank it waits for never
       started it; < 0: notices are not looked at */
    int counter;
    long long index;
} zr_waiter;

/* Wait for w under the watchdog (comm.h "Bounded waits"). */
zr_status zr_comm_wait_bounded(zr_comm *c, const zr_waiter *w);

/*
 * Complete n MPI requests of the control plane under the watchdog. peer[i] is
 * the world rank at the other end of reqs[i] (-1 or a NULL peer: unknown, as
 * for MPI's own collectives); the first nrecv requests are receives. scratch
 * holds n ints (NULL: no progress tracking, the time counts from the start of
 * the wait). what, g, counter and index as in zr_waiter. Completed requests
 * become MPI_REQUEST_NULL.
 */
zr_status zr_comm_poll(zr_comm *c, MPI_Request *reqs, int n, const int *peer, int nrecv,
                       int *scratch, const char *what, zr_group g, int counter, long long index);

/*
 * Add a message to a pending list (out holds max, *n used), merged with the
 * last entry when it names the same rank and direction (the chunks of one
 * message); when out is full, the last entry becomes "not known".
 */
static inline void zr_comm_pending_add(zr_pending *out, int max, int *n, int rank, int recv)
{
    if (*n > 0 && out[*n - 1].rank == rank && out[*n - 1].recv == recv) {
        return;
    }
    if (*n == max) {
        out[max - 1].rank = -1;
        return;
    }
    out[*n].rank = rank;
    out[*n].recv = recv;
    (*n)++;
}

/* ---- abort notices (notice.c) ------------------------------------------------ */

/* Tables for world's notices; before the control communicator exists. */
zr_status zr_comm_notice_init(zr_comm *c);
/* Post the receive of the next notice (no-op at one rank or when one is posted). */
zr_status zr_comm_notice_post_recv(zr_comm *c);
/* Take in the notices that have arrived: 2 a rank timed out, 1 failure notices, 0 none. */
int zr_comm_notice_poll(zr_comm *c);
/* Rank p sent a notice before it started number index of posted[counter]: it never will. */
int zr_comm_notice_gone(const zr_comm *c, int p, int counter, long long index);
/* This rank's watchdog fired: tell the others (unless notified), let them report a moment. */
void zr_comm_notice_timeout(zr_comm *c);
/* Receive the notices still addressed to this rank (expect in all), then start afresh. */
zr_status zr_comm_notice_drain(zr_comm *c, int expect);
void zr_comm_notice_free(zr_comm *c);

/* ---- topology (topology.c) ---------------------------------------------------- */

/*
 * The start-up agreement over the control communicator: the emulated node
 * size and hpZ size every rank was given, and whether any rank's ZR_TIMEOUT
 * or ZR_FAULT_STEP did not parse; the same error on every rank.
 */
zr_status zr_comm_layout_agree(zr_comm *c, const zr_comm_config *cfg, int bad_timeout,
                               int bad_fault);
/* Choose and check the layout, then split the node, cross and hpZ communicators. */
zr_status zr_comm_groups_build(zr_comm *c, MPI_Comm world, const zr_comm_config *cfg);
void zr_comm_groups_free(zr_comm *c);

/* ---- control plane (control.c) ------------------------------------------------- */

/*
 * Point-to-point on ctl, every rank with every other (all-gather into all:
 * root < 0) or root to every other (broadcast into all), under the watchdog,
 * accounted as CONTROL. Small payloads only.
 */
zr_status zr_comm_ctl_exchange(zr_comm *c, const void *mine, size_t bytes, void *all, int root,
                               const char *what);

/* ---- data plane (exchange.c) ----------------------------------------------------- */

/* Free the transport's state (zr_comm_free). */
void zr_comm_transport_free(zr_comm *c);
/* The job ends after a failed wait: the transport stops what it runs (its abort). */
void zr_comm_transport_abort(zr_comm *c);

/* 1 where zr_transport_nccl is NCCL's (transport_nccl.c), 0 where it only refuses. */
int zr_comm_nccl_built(void);

#endif /* ZR_COMM_IMPL_H */
