/*
 * transport_plan.h - the calls a data-plane transport makes, as plain
 * functions of an exchange and the topology (no MPI, no CUDA): which
 * messages, to and from which peers, at which offsets, in which order and in
 * which chunks; the colours and keys that split NCCL's world communicator
 * into zr's groups; which ranks share a GPU.
 *
 * The MPI transport's schedule (transport_mpi.c) is the reference: every
 * receive first, from me-1, me-2, ... (wrapping), then every send, to me+1,
 * me+2, ...; each message in chunks of at most 1 GiB. The staged transport
 * posts the same messages in the same order with smaller chunks (the
 * pipeline's unit), and the NCCL transport the same messages unchunked
 * inside one ncclGroupStart / ncclGroupEnd. So every transport moves the
 * same bytes between the same ranks, per peer in the same order, and the
 * traffic counters (exchange.c) hold for all of them. tests/test_transport.c
 * checks these functions against what the transports really call.
 */
#ifndef ZR_TRANSPORT_PLAN_H
#define ZR_TRANSPORT_PLAN_H

#include "zr/comm.h"

/* One message (or chunk of one) of an exchange. */
typedef struct zr_xmsg {
    int peer;      /* in-group rank at the other end */
    int recv;      /* 1: a receive from peer; 0: a send to peer */
    size_t offset; /* from the start of the receive (send) buffer */
    size_t bytes;  /* > 0 */
} zr_xmsg;

/* The MPI transport's chunk: MPI counts are int. */
#define ZR_XPLAN_MPI_CHUNK ((size_t)1 << 30)

/*
 * The messages of an exchange in group of n ranks seen from in-group rank me
 * (the arguments of zr_transport.iexchange), in the MPI transport's order,
 * every message cut into chunks of at most chunk bytes (SIZE_MAX: whole
 * messages). Nothing to or from me, nothing of 0 bytes. Writes the first max
 * entries to out (out may be NULL with max 0) and returns how many there are.
 */
size_t zr_xplan_messages(int n, int me, const size_t *scount, const size_t *sdisp,
                         const size_t *rcount, const size_t *rdisp, size_t chunk, zr_xmsg *out,
                         size_t max);

/* The end of the furthest receive (recv 1) or send (recv 0) among m[0..count): the size of a
 * staging buffer that keeps the exchange's offsets. */
size_t zr_xplan_extent(const zr_xmsg *m, size_t count, int recv);

/*
 * Where the staged transport stages the chunks m[0..count) (a plan from
 * zr_xplan_messages): stage[i] is the chunk's offset in its pinned buffer,
 * copy[i] the chunk whose device-to-host copy fills it. Receives mirror the
 * receive buffer (stage = offset, copy = i). Each distinct send message gets
 * a region of its own, in plan order; a message with the same bytes as an
 * earlier one (an all-gather sends one block to every peer) shares that
 * one's region and copies, so the block is copied once, and no copy ever
 * writes bytes that MPI may be sending. Returns the send stage's size.
 */
size_t zr_xplan_stage(const zr_xmsg *m, size_t count, size_t *stage, size_t *copy);

/* Where ncclCommSplit of the world communicator puts this rank for group g. */
typedef struct zr_xsplit {
    int color; /* the same for the ranks of one group: world rank of its in-group rank 0 */
    int key;   /* orders them: the in-group rank */
} zr_xsplit;

zr_xsplit zr_xplan_split(const zr_comm *c, zr_group g);

/* A rank's GPU, as the shared-GPU check compares them. */
typedef struct zr_gpu_id {
    int node;               /* zr's node of the rank (zr_comm.node) */
    int ordinal;            /* the CUDA ordinal the rank uses, for messages */
    int pci_bus;            /* for messages */
    unsigned char uuid[16]; /* the GPU's UUID: the same GPU on one node has the same */
} zr_gpu_id;

/*
 * The first two ranks a < b of ids[0..n) on one node with one GPU; 0 when
 * every rank has a GPU of its own (then *a = *b = -1).
 */
int zr_xplan_shared_gpu(const zr_gpu_id *ids, int n, int *a, int *b);

#endif /* ZR_TRANSPORT_PLAN_H */
