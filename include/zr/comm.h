/*
 * zr/comm.h - the communicator: process groups of the node topology, the
 * point-to-point transport every zr collective is built from, and exact
 * traffic accounting.
 *
 * Groups (W ranks, D ranks per node, N = W / D nodes, h = hpZ group size;
 * ranks of a node are consecutive, node n holds ranks n*D .. n*D+D-1):
 *
 *   ZR_GROUP_WORLD  all W ranks
 *   ZR_GROUP_NODE   the D ranks of my node         (qgZ's local all-to-all group)
 *   ZR_GROUP_CROSS  the N ranks with my node index (qgZ's global all-to-all group)
 *   ZR_GROUP_HPZ    h consecutive ranks            (hpZ's secondary partition group)
 *
 *   example W=6, D=3 (2 nodes), h=3:
 *     rank       0 1 2 | 3 4 5
 *     NODE       0 0 0 | 1 1 1   (group id; in-group rank = rank % 3)
 *     CROSS      0 1 2 | 0 1 2   (group id; in-group rank = node)
 *     HPZ        0 0 0 | 1 1 1
 *
 * Nodes are detected with MPI_Comm_split_type(SHARED) unless emulated: the
 * config field ranks_per_node, or else the environment variable
 * ZR_RANKS_PER_NODE, fakes nodes of that many consecutive ranks on one machine
 * (tests, demos). zr refuses a world that is not divisible by the ranks per
 * node or by h, nodes of different sizes, nodes whose ranks are not
 * consecutive, and ranks started with different ZR_RANKS_PER_NODE or hpZ
 * sizes (naming the ranks and their values), with a message that is the same
 * on every rank.
 *
 * Transport: collectives move bytes only through zr_comm_iexchange (each
 * rank sends a block to each peer of a group and receives one from each), so
 * zr knows exactly which bytes cross which link. Accounting records, per
 * collective kind, the calls and the bytes this rank sent to peers on its
 * own node and on other nodes; it is exact for zr's algorithms because these
 * are the bytes zr hands to the transport (the transport's own headers and
 * any staging inside MPI are not counted).
 *
 * The transport sits behind a table of function pointers (zr_transport) so a
 * NCCL implementation can plug in later; MPI is the one implementation now.
 */
#ifndef ZR_COMM_H
#define ZR_COMM_H

#include "zr/base.h"

#include <mpi.h>

typedef enum zr_group {
    ZR_GROUP_WORLD = 0,
    ZR_GROUP_NODE,
    ZR_GROUP_CROSS,
    ZR_GROUP_HPZ,
    ZR_GROUP_COUNT
} zr_group;

/* The collective kinds zr accounts for, one row each in the traffic table. */
typedef enum zr_kind {
    ZR_KIND_ALLGATHER = 0,  /* exact all-gather (fp32 / bf16 on the wire) */
    ZR_KIND_REDUCE_SCATTER, /* exact reduce-scatter */
    ZR_KIND_ALLREDUCE,      /* exact all-reduce */
    ZR_KIND_QWZ,            /* quantized weight all-gather */
    ZR_KIND_HPZ,            /* gather of the secondary partition inside the node */
    ZR_KIND_QGZ,            /* quantized hierarchical gradient reduce-scatter */
    ZR_KIND_ALLTOALL,       /* plain all-to-all */
    ZR_KIND_CONTROL,        /* small agreements: errors, norms, checksums */
    ZR_KIND_COUNT
} zr_kind;

/* Name of a kind as printed in tables and JSON ("allgather", "qwz", ...). */
const char *zr_kind_name(zr_kind kind);
const char *zr_group_name(zr_group group);

typedef struct zr_traffic_row {
    uint64_t calls;       /* collectives of this kind started on this rank */
    uint64_t bytes_intra; /* bytes this rank sent to peers on its own node */
    uint64_t bytes_inter; /* bytes this rank sent to peers on other nodes */
} zr_traffic_row;

typedef struct zr_traffic {
    zr_traffic_row kind[ZR_KIND_COUNT];
} zr_traffic;

/*
 * One in-flight exchange. Caller-owned storage; zr_comm_wait releases its
 * internals. Zero-initialised storage is a valid idle request.
 */
typedef struct zr_request {
    MPI_Request *reqs; /* owned; freed by zr_comm_wait */
    int *peer; /* inside the reqs block: 2 * count ints; peer[i] = world rank at the other end
                  of reqs[i] (receives first, then sends), peer[count + i] = scratch */
    int count;
    int nrecv; /* reqs[0 .. nrecv) are receives, the rest sends */
    int active;
    zr_group group; /* what the watchdog names when the exchange does not complete */
    zr_kind kind;
    uint64_t seq;  /* exchanges this rank had posted before this one */
    uint64_t gseq; /* ... on its group: the same number on every rank of the group */
} zr_request;

#define ZR_REQUEST_INIT                                                                            \
    {                                                                                              \
        NULL, NULL, 0, 0, 0, ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, 0, 0                               \
    }

typedef struct zr_comm zr_comm;

/*
 * The transport: how bytes move between ranks of a group. Every member is
 * required unless marked optional. Implementations: zr_transport_mpi.
 */
typedef struct zr_transport {
    int version; /* ZR_TRANSPORT_VERSION */
    const char *name;
    /* Start sending scount[p] bytes at send+sdisp[p] to group peer p and
       receiving rcount[p] bytes into recv+rdisp[p] from p, for every p != me. */
    zr_status (*iexchange)(zr_comm *c, zr_group g, const void *send, const size_t *scount,
                           const size_t *sdisp, void *recv, const size_t *rcount,
                           const size_t *rdisp, zr_request *req);
    zr_status (*wait)(zr_comm *c, zr_request *req);
    /* Optional: progress and report completion without blocking. */
    zr_status (*test)(zr_comm *c, zr_request *req, int *done);
} zr_transport;

#define ZR_TRANSPORT_VERSION 1

extern const zr_transport zr_transport_mpi;

typedef struct zr_comm_config {
    int ranks_per_node; /* 0: ZR_RANKS_PER_NODE from the environment, else detect */
    int hpz_size;       /* h; 0: ranks per node */
} zr_comm_config;

/* Default of the watchdog (zr.train.timeout_s, ZR_TIMEOUT): five minutes without progress. */
#define ZR_COMM_TIMEOUT_DEFAULT 300.0

/* Fault injection (ZR_FAULT_STEP=R:S[:stall]), for tests of the failure paths. */
typedef enum zr_fault_mode { ZR_FAULT_NONE = 0, ZR_FAULT_FAIL, ZR_FAULT_STALL } zr_fault_mode;

/* An abort notice: {world rank, status, posted[0 .. ZR_GROUP_COUNT]} (see zr_comm.posted). */
#define ZR_NOTICE_LEN (ZR_GROUP_COUNT + 3)

struct zr_comm {
    const zr_transport *transport;
    MPI_Comm mpi[ZR_GROUP_COUNT]; /* owned, except mpi[WORLD] (the caller's) */
    int rank[ZR_GROUP_COUNT];     /* my rank inside each group */
    int size[ZR_GROUP_COUNT];     /* size of each group */
    int first[ZR_GROUP_COUNT];    /* world rank of in-group rank 0 */
    int stride[ZR_GROUP_COUNT];   /* world rank of in-group rank k = first + k*stride */
    int ranks_per_node;           /* D */
    int n_nodes;                  /* N */
    int node;                     /* my node index, 0..N-1 */
    int emulated;                 /* 1 when nodes are emulated, 0 when detected */
    zr_traffic traffic;

    /* ---- watchdog and abort notices (see "Bounded waits" below) ---- */
    MPI_Comm ctl;     /* owned: a duplicate of world for agreements and notices, never data */
    double timeout_s; /* seconds a wait may go without progress; 0 = forever */
    long long step;   /* training step named in messages; -1 = none */
    uint64_t seq;     /* exchanges posted on this rank so far */
    /* exchanges started per group, and [ZR_GROUP_COUNT]: MPI collectives on world; every rank
       of a group starts them in the same order, so a notice carrying them tells a waiting rank
       whether the failed rank ever took part in what it waits for */
    uint64_t posted[ZR_GROUP_COUNT + 1];
    int inflight;        /* exchanges posted and not yet completed */
    int fail_fast;       /* a failed collective notifies the other ranks at once */
    int notified;        /* this rank has sent its failure notice */
    int noticed;         /* failure notices arrived since the last agreement; the first ... */
    int notice_from;     /* ... (an original failure before a ZR_ERR_REMOTE) from this rank */
    int notice_status;   /* ... with this status */
    int notice_got;      /* notices received since the last agreement */
    int64_t *notice_tab; /* owned: per world rank ZR_NOTICE_LEN values, [0] = 1 once it sent one */
    int broken;          /* the last failed zr_comm_agree left exchanges in flight somewhere */
    MPI_Request notice_req;            /* the posted receive of the next notice */
    int64_t notice_buf[ZR_NOTICE_LEN]; /* its buffer (status -1: that rank timed out) */
    MPI_Request *notice_sends;         /* owned: world-size slots for this rank's notices */
    int notice_nsend;                  /* of which in flight */
    int64_t notify_buf[ZR_NOTICE_LEN]; /* the notice this rank sends */
    zr_fault_mode fault;
    int fault_rank;
    long long fault_step;
};

/*
 * Build the groups over world (usually MPI_COMM_WORLD; not freed by zr).
 * Collective over world; on a layout error every rank returns ZR_ERR_INVALID
 * with the same message. Sets the log rank and installs an abort hook that
 * calls MPI_Abort on world.
 */
zr_status zr_comm_init(zr_comm *c, MPI_Comm world, const zr_comm_config *cfg);
void zr_comm_free(zr_comm *c);

/* World rank of in-group rank k of my group g. */
static inline int zr_comm_world_rank(const zr_comm *c, zr_group g, int k)
{
    return c->first[g] + k * c->stride[g];
}

/* Node of a world rank. */
static inline int zr_comm_node_of(const zr_comm *c, int world_rank)
{
    return world_rank / c->ranks_per_node;
}

/*
 * Start a personalised exchange inside group g and account it under kind:
 * to in-group peer p send scount[p] bytes from send + sdisp[p], receive
 * rcount[p] bytes from p into recv + rdisp[p]. The block for myself is copied
 * locally when both counts are non-zero and is not counted as traffic. Arrays
 * have size[g] entries. Buffers must stay valid until zr_comm_wait.
 */
zr_status zr_comm_iexchange(zr_comm *c, zr_group g, zr_kind kind, const void *send,
                            const size_t *scount, const size_t *sdisp, void *recv,
                            const size_t *rcount, const size_t *rdisp, zr_request *req);

/* All-gather of equal blocks: recv holds size[g] blocks of bytes, mine at rank[g]*bytes. */
zr_status zr_comm_iallgather(zr_comm *c, zr_group g, zr_kind kind, const void *send, size_t bytes,
                             void *recv, zr_request *req);

/* All-to-all of equal blocks: block p of send goes to peer p, block p of recv comes from p. */
zr_status zr_comm_ialltoall(zr_comm *c, zr_group g, zr_kind kind, const void *send, size_t bytes,
                            void *recv, zr_request *req);

/* Complete a request (no-op on one never started or already completed). */
zr_status zr_comm_wait(zr_comm *c, zr_request *req);

/* Progress a request; *done = 1 once complete (then no wait is needed). */
zr_status zr_comm_test(zr_comm *c, zr_request *req, int *done);

/* Blocking conveniences. */
zr_status zr_comm_allgather(zr_comm *c, zr_group g, zr_kind kind, const void *send, size_t bytes,
                            void *recv);
zr_status zr_comm_alltoall(zr_comm *c, zr_group g, zr_kind kind, const void *send, size_t bytes,
                           void *recv);

/*
 * Small all-reduces for control values (norms, flags, counters), over group g,
 * accounted under ZR_KIND_CONTROL as the direct algorithm zr runs (every rank
 * sends its values to every peer, each rank reduces locally in rank order, so
 * the result is bitwise identical on every rank).
 */
zr_status zr_comm_allreduce_sum_f64(zr_comm *c, zr_group g, double *vals, int n);
zr_status zr_comm_allreduce_max_i64(zr_comm *c, zr_group g, int64_t *vals, int n);

/*
 * Bounded waits. Every wait of zr (exchanges, control values, barriers,
 * broadcasts, agreements) polls instead of blocking, and gives up when
 * timeout_s seconds pass without any of its messages completing: the rank
 * prints which collective it is in (kind, group, step, its exchange count)
 * and which world ranks it still waits for, tells the other ranks, and after
 * a short grace (so that they print what they wait for too) ends the job
 * with MPI_Abort and exit status 1. A rank that stalls therefore costs one
 * timeout, never a hung job. The timeout starts as ZR_TIMEOUT from the
 * environment (seconds; default ZR_COMM_TIMEOUT_DEFAULT; 0 = wait forever);
 * zr train sets it from zr.train.timeout_s.
 *
 * Abort notices. A rank that fails while the others may be waiting for it
 * sends every other rank a small notice (zr_comm_notify, which a program
 * calls where a failure is local to the rank, as zr train does for a failed
 * step; and at the first failed collective in fail-fast mode). The notice
 * says how many exchanges of each group the rank had started. A rank waiting
 * for that rank in an exchange it never started stops waiting, returns
 * ZR_ERR_REMOTE and sends its own notice (for those waiting for it in turn);
 * an exchange the failed rank did start still completes. So every rank
 * reaches the next zr_comm_agree promptly and reports the failing rank's
 * message there. Exchanges abandoned that way stay posted: zr_comm_broken
 * then says so, and the program ends with zr_comm_abort instead of freeing
 * buffers that MPI may still write into.
 */
void zr_comm_set_timeout(zr_comm *c, double seconds);
/* The training step named in watchdog messages (and matched by ZR_FAULT_STEP); -1 = none. */
void zr_comm_set_step(zr_comm *c, long long step);
/* Programs in which any failure ends the job: the first failed collective notifies at once. */
void zr_comm_set_fail_fast(zr_comm *c, int on);
/* Send this rank's failure notice now (once per agreement; no-op at one rank). */
void zr_comm_notify(zr_comm *c, zr_status st);
/* After a failed zr_comm_agree: 1 if some rank still has exchanges in flight. */
int zr_comm_broken(const zr_comm *c);
/*
 * End the job after an agreed failure left exchanges in flight: waits (bounded)
 * until every rank is here, so the message printed before is out, then
 * MPI_Abort with exit_code. Never returns.
 */
_Noreturn void zr_comm_abort(zr_comm *c, int exit_code);

/*
 * "rank 3", "ranks 0-2, 5" (at most a few ranges, then "and N more"): the
 * world ranks r < n with cls[r] == k. For messages about ranks that differ.
 */
void zr_comm_format_ranks(char *buf, size_t len, const int *cls, int n, int k);

/* Barrier over world (not accounted: it moves no payload). */
zr_status zr_comm_barrier(zr_comm *c);

/* Broadcast bytes from world rank root over world, accounted as CONTROL. */
zr_status zr_comm_bcast(zr_comm *c, void *buf, size_t bytes, int root);

/*
 * Agree on an error across world. Every rank passes its local status; if any
 * rank failed, all ranks return the status of the lowest failing rank and its
 * message, prefixed "rank R: ", so the error and the exit are identical
 * everywhere and nobody waits forever on a peer that gave up. Call it at
 * set-up points (config, file opens, checkpoint loads) where a failure might
 * be visible on some ranks only, and where a run ends. An error agreed on
 * before keeps its one "rank R: " (zr_error_agreed), so layers may agree on
 * a status again freely. ZR_ERR_REMOTE from a notice (see "Abort notices")
 * never wins over the failure that caused it; notices sent are received
 * here. Runs on the control communicator, so it is safe while exchanges are
 * still in flight.
 */
zr_status zr_comm_agree(zr_comm *c, zr_status local);

/* Traffic counters of this rank. */
void zr_comm_traffic_reset(zr_comm *c);
zr_traffic zr_comm_traffic_get(const zr_comm *c);

/*
 * Sum of every rank's counters over world (collective; the sum itself is
 * not accounted).
 */
zr_status zr_comm_traffic_total(zr_comm *c, zr_traffic *total);

/* One-line description of the layout: "4 ranks = 2 nodes x 2 (emulated), hpZ 2". */
void zr_comm_describe(const zr_comm *c, char *buf, size_t len);

/*
 * Check a detected placement: leader[r] = lowest world rank on rank r's node,
 * local_size[r] = ranks on that node. Returns the ranks per node, or 0 with a
 * reason in why when nodes differ in size or their ranks are not consecutive.
 */
int zr_comm_check_placement(const int *leader, const int *local_size, int size, char *why,
                            size_t len);

/* Convert an MPI return code into a zr status with the MPI error string. */
zr_status zr_mpi_status_at(int rc, const char *file, int line, const char *call);

#define ZR_MPI_CHECK(call)                                                                         \
    do {                                                                                           \
        int zr_rc_ = (call);                                                                       \
        if (zr_rc_ != MPI_SUCCESS) {                                                               \
            return zr_mpi_status_at(zr_rc_, __FILE__, __LINE__, #call);                            \
        }                                                                                          \
    } while (0)

#endif /* ZR_COMM_H */
