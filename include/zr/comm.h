/*
 * zr/comm.h - the communicator: process groups of the node topology, a
 * control plane over MPI, a data plane behind a transport table, and exact
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
 * Two planes:
 *
 *   control plane  the groups, the start-up agreement, abort notices, the
 *                  watchdog, small control values (zr_comm_allreduce_*, and
 *                  every exchange of kind ZR_KIND_CONTROL), barrier,
 *                  broadcast, zr_comm_agree. Always MPI, always host memory.
 *   data plane     the bulk exchanges the collectives make: zr_comm_iexchange
 *                  and its wait / test, through the communicator's transport
 *                  (zr_transport). MPI by default; a transport for device
 *                  memory (NCCL, or host-staged MPI) plugs in with
 *                  zr_comm_use_transport without changes to comm.
 *
 * Collectives move bytes only through exchanges (each rank sends a block to
 * each peer of a group and receives one from each), so zr knows exactly
 * which bytes cross which link. Accounting records, per collective kind, the
 * calls and the bytes this rank sent to peers on its own node and on other
 * nodes; it is exact for zr's algorithms because these are the bytes zr hands
 * to the transport (the transport's own headers and any staging inside it
 * are not counted). The accounting, the bounded waits and the abort notices
 * are the same whatever the transport.
 */
#ifndef ZR_COMM_H
#define ZR_COMM_H

#include "zr/base.h"
#include "zr/device.h"

/* for the control plane's entry points only (zr_comm_init, zr_comm_mpi, ZR_MPI_CHECK): the
   data-plane types below (zr_request, zr_transport) mention no MPI type */
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

/* One message an exchange still waits for, as its transport names it to the watchdog. */
typedef struct zr_pending {
    int rank; /* world rank at the other end; -1: not known (the watchdog names the group) */
    int recv; /* 1: the data from rank has not arrived; 0: rank has not taken the data sent */
} zr_pending;

struct zr_transport;

/*
 * One in-flight exchange. Caller-owned storage; zr_comm_wait (or a
 * zr_comm_test that reports done) releases the transport's part. Zero-
 * initialised storage is a valid idle request.
 */
typedef struct zr_request {
    const struct zr_transport *transport; /* that posted it, and owns impl */
    void *impl;                           /* the transport's storage; NULL when idle */
    int active;                           /* posted and not completed */
    zr_group group; /* what the watchdog names when the exchange does not complete */
    zr_kind kind;
    uint64_t seq;  /* exchanges this rank had posted before this one */
    uint64_t gseq; /* ... on its group: the same number on every rank of the group */
} zr_request;

#define ZR_REQUEST_INIT                                                                            \
    {                                                                                              \
        NULL, NULL, 0, ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, 0, 0                                     \
    }

typedef struct zr_comm zr_comm;

/*
 * The data-plane transport: how the bytes of an exchange move between the
 * ranks of a group. The generic side (src/comm/exchange.c, watchdog.c) does
 * the accounting, the block for myself, the bounded waits and the abort
 * notices; a transport only posts, progresses, names what it waits for and
 * releases. The buffers are in the transport's memory: host memory for MPI,
 * device memory for a GPU transport (which then also copies the block for
 * myself). Members are required unless marked optional.
 * Implementations: zr_transport_mpi, zr_transport_nccl, zr_transport_staged.
 *
 * Its state: init runs once per communicator (zr_comm_use_transport),
 * collectively over world, with the groups and the control plane in place,
 * so it may build its own per-group communicators there (with zr_comm_bcast
 * for an id, say). What it stores in *state is c->transport_state for every
 * later call; free releases it (zr_comm_free, or another transport chosen).
 */
typedef struct zr_transport {
    int version; /* ZR_TRANSPORT_VERSION */
    const char *name;
    /* Optional: set up on c; arg is zr_comm_use_transport's. */
    zr_status (*init)(zr_comm *c, const void *arg, void **state);
    /* Optional: tear down what init built. */
    void (*free)(zr_comm *c, void *state);
    /*
     * Start sending scount[p] bytes at send+sdisp[p] to group peer p and
     * receiving rcount[p] bytes into recv+rdisp[p] from p, for every p != me,
     * and set req->impl to the transport's storage for it (NULL: nothing to
     * move, the exchange is complete). After a failure, what was posted
     * stays in req->impl and is completed by the waits like any exchange.
     */
    zr_status (*iexchange)(zr_comm *c, zr_group g, const void *send, const size_t *scount,
                           const size_t *sdisp, void *recv, const size_t *rcount,
                           const size_t *rdisp, zr_request *req);
    /*
     * Progress req without blocking: *done = 1 once every message of it is
     * complete; *progressed = 1 when a message completed in this call (the
     * watchdog counts its timeout from the last progress).
     */
    zr_status (*test)(zr_comm *c, zr_request *req, int *done, int *progressed);
    /*
     * The messages of req not complete yet, receives first, for the watchdog's
     * messages and abort notices: at most max entries; returns how many.
     */
    int (*pending)(const zr_comm *c, const zr_request *req, zr_pending *out, int max);
    /* Free req->impl: after completion, or after a failure of test. */
    void (*release)(zr_comm *c, zr_request *req);
    /* Optional: copy the block for myself, before iexchange (NULL: memmove, host memory). */
    zr_status (*self_copy)(zr_comm *c, void *dst, const void *src, size_t bytes);
    /*
     * Optional: move every exchange in flight along without blocking. Every
     * bounded wait calls it while this transport has exchanges in flight,
     * whatever it waits for (a control value, another exchange): a transport
     * whose bytes need the host (a staging copy to start, an NCCL error to
     * notice) keeps going while the rank waits elsewhere, as MPI's requests
     * progress inside any MPI call.
     */
    void (*progress)(zr_comm *c);
    /*
     * Optional: a wait failed and the job ends (the watchdog fired, or
     * zr_comm_abort after an agreed failure, which every rank calls): stop
     * whatever the transport still runs (ncclCommAbort) before MPI_Abort.
     */
    void (*abort)(zr_comm *c);
} zr_transport;

#define ZR_TRANSPORT_VERSION 3

/* The default: one nonblocking send and receive per peer on the groups' MPI communicators. */
extern const zr_transport zr_transport_mpi;

/*
 * The device transports: exchanges of device memory on a rank with a GPU
 * (src/comm/transport_nccl.c, transport_staged.c). Both move exactly the MPI
 * transport's messages (same peers, bytes and order per peer), so the
 * traffic counters read the same whatever the transport.
 *
 *   zr_transport_nccl    one GPU per rank: the exchange as grouped ncclSend /
 *                        ncclRecv on a communicator per group, split from a
 *                        world communicator whose id goes out over the
 *                        control plane. Refuses (naming ranks and GPU) ranks
 *                        that share a GPU, unless NCCL can run them.
 *   zr_transport_staged  several ranks per GPU, or no NCCL: device -> pinned
 *                        host -> MPI -> pinned host -> device, in chunks, the
 *                        copies of one chunk overlapping the wire of another.
 *                        MPI never sees a device pointer.
 *
 * zr_comm_use_transport's arg is a zr_transport_device. An exchange starts
 * after the work queued on the followed stream before zr_comm_iexchange (an
 * event: the host does not wait); once zr_comm_wait or zr_comm_test says it
 * is done, its bytes (the block for myself included) are in place for work
 * queued afterwards on any stream. Waits poll events, never block in a
 * stream synchronisation. Without CUDA in the build (or NCCL, for the NCCL
 * transport) init fails saying so.
 */
typedef struct zr_transport_device {
    const zr_device *device; /* this rank's GPU (zr_device_open_for_rank) */
    zr_stream *stream;       /* the stream exchanges follow; NULL: the legacy default stream */
    size_t chunk_bytes;      /* staged: the pipeline's chunk; 0: ZR_STAGED_CHUNK_DEFAULT */
} zr_transport_device;

#define ZR_STAGED_CHUNK_DEFAULT ((size_t)1 << 20)

extern const zr_transport zr_transport_nccl;
extern const zr_transport zr_transport_staged;

/*
 * Exchanges started from now on follow s instead (NULL: the legacy default
 * stream), e.g. the stream that quantized their send buffers. c's transport
 * must be a device transport.
 */
zr_status zr_comm_device_follow(zr_comm *c, zr_stream *s);

/*
 * The GPU whose memory c's data plane moves (a device transport), or NULL
 * when it moves host memory (the MPI transport). *follow (may be NULL)
 * receives the stream exchanges follow now (NULL: the legacy default
 * stream, or a host transport). The collectives read it to take device
 * buffers and to start after the work queued on that stream.
 */
const zr_device *zr_comm_device(const zr_comm *c, zr_stream **follow);

/*
 * Whether every rank of c sees a GPU (collective): *mine for this rank, *all
 * for every rank; why (may be NULL) gets the reason when not (this rank's
 * runtime's words, or "a rank sees no GPU"). A GPU run needs all of them.
 */
zr_status zr_comm_gpus_everywhere(zr_comm *c, int *mine, int *all, char *why, size_t n);

/*
 * Make c's data plane a device transport for dev's memory following stream
 * follow (collective; src/comm/device_plane.c): want "nccl", "staged", or
 * "auto": NCCL when zr has it and no node has more ranks than GPUs, else
 * staged. *nccl = 1 when NCCL was chosen; *shared = 1 when some ranks share
 * a GPU (then NCCL refuses, naming them).
 */
zr_status zr_comm_use_device(zr_comm *c, const zr_device *dev, zr_stream *follow, const char *want,
                             int *nccl, int *shared);

typedef struct zr_comm_config {
    int ranks_per_node; /* 0: ZR_RANKS_PER_NODE from the environment, else detect */
    int hpz_size;       /* h; 0: ranks per node */
} zr_comm_config;

/* Default of the watchdog (zr.train.timeout_s, ZR_TIMEOUT): five minutes without progress. */
#define ZR_COMM_TIMEOUT_DEFAULT 300.0

struct zr_comm_control;

struct zr_comm {
    /* ---- topology (topology.c) ---- */
    int rank[ZR_GROUP_COUNT];   /* my rank inside each group */
    int size[ZR_GROUP_COUNT];   /* size of each group */
    int first[ZR_GROUP_COUNT];  /* world rank of in-group rank 0 */
    int stride[ZR_GROUP_COUNT]; /* world rank of in-group rank k = first + k*stride */
    int ranks_per_node;         /* D */
    int n_nodes;                /* N */
    int node;                   /* my node index, 0..N-1 */
    int emulated;               /* 1 when nodes are emulated, 0 when detected */

    /* ---- data plane (exchange.c) ---- */
    const zr_transport *transport; /* zr_transport_mpi unless zr_comm_use_transport chose */
    void *transport_state;         /* the transport's own, from its init */
    zr_traffic traffic;
    uint64_t seq; /* exchanges posted on this rank so far */
    /* exchanges started per group, and [ZR_GROUP_COUNT]: MPI collectives on world; every rank
       of a group starts them in the same order, so an abort notice carrying them tells a
       waiting rank whether the failed rank ever took part in what it waits for */
    uint64_t posted[ZR_GROUP_COUNT + 1];
    int inflight; /* exchanges posted and not yet completed */

    /* ---- control plane (see "Bounded waits" below) ---- */
    double timeout_s;                /* seconds a wait may go without progress; 0 = forever */
    long long step;                  /* training step named in messages; -1 = none */
    int fail_fast;                   /* a failed collective notifies the other ranks at once */
    struct zr_comm_control *control; /* owned: MPI communicators, notices (src/comm) */
};

/*
 * Build the groups over world (usually MPI_COMM_WORLD; not freed by zr).
 * Collective over world; on a layout error every rank returns ZR_ERR_INVALID
 * with the same message. Sets the log rank and installs an abort hook that
 * calls MPI_Abort on world.
 */
zr_status zr_comm_init(zr_comm *c, MPI_Comm world, const zr_comm_config *cfg);
void zr_comm_free(zr_comm *c);

/*
 * The MPI communicator of group g (owned by c; world is the caller's), for
 * programs that run MPI's own collectives on zr's groups (tests, benchmarks)
 * and for transports that move bytes over MPI.
 */
MPI_Comm zr_comm_mpi(const zr_comm *c, zr_group g);

/*
 * Make t the data-plane transport of c (zr_comm_init chose zr_transport_mpi):
 * collective over world, with no exchange in flight. Runs t->init(c, arg)
 * and agrees on its status, so every rank returns the same one; on failure
 * c keeps its transport. The previous transport's state is freed.
 */
zr_status zr_comm_use_transport(zr_comm *c, const zr_transport *t, const void *arg);

/*
 * A layout without MPI: the groups zr_comm_init would build for world rank
 * `rank` of nodes x ranks_per_node ranks with hpZ groups of hpz_size (0: the
 * ranks per node), by the same arithmetic and the same checks. Nothing is
 * allocated and nothing can be sent on it (it needs no zr_comm_free): it is
 * what the collectives' cost functions and dry engines (zr_engine_init_dry)
 * read to know who is where.
 */
zr_status zr_comm_init_layout(zr_comm *c, int nodes, int ranks_per_node, int hpz_size, int rank);

/*
 * Peers of my group g on my node and on other nodes: how the traffic of an
 * exchange that sends the same bytes to every peer splits between the two
 * rows of the accounting.
 */
void zr_comm_peers(const zr_comm *c, zr_group g, int *on_node, int *off_node);

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
 * Exchanges of kind ZR_KIND_CONTROL carry control values in host memory and
 * always go over MPI (the control plane); every other kind goes through
 * c->transport.
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
 * buffers that the transport may still write into.
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
