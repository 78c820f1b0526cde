/*
 * nccl_impl.h - what the two halves of the emulated NCCL share (tests/emu,
 * issue 23):
 *
 *   nccl.cpp      communicators: the unique id, the bootstrap over
 *                 MPI_COMM_WORLD, splits, the shared-GPU check, finalize,
 *                 destroy, abort, asynchronous errors
 *   nccl_ops.cpp  operations: sends, receives and collectives queued on CUDA
 *                 streams, groups, and the host's progress that moves their
 *                 bytes through MPI
 *
 * Who runs what. An operation is queued on its stream like a copy; when the
 * stream's worker reaches it, the worker does the operation's local part
 * (the block an all-gather keeps), hands it to its communicator's ready
 * queue and sleeps. The host thread that created the communicators (the
 * only thread that calls MPI: MPI_Init's thread level is enough) takes it
 * from there whenever it enters NCCL or waits on the runtime
 * (zr_emu::host_progress): it posts one MPI receive or send per transfer,
 * in the order the stream reached the operations (the order every rank
 * issues them), tests them, and hands the operation back; the worker then
 * does what follows the transfers (a reduction, in rank order) and the
 * stream moves on. The worker and the host meet under the operation's mutex,
 * which is also the happens-before edge that orders the host's MPI writes
 * before the stream's later work.
 */
#ifndef ZR_EMU_NCCL_IMPL_H
#define ZR_EMU_NCCL_IMPL_H

#include "emu.h"
#include "nccl.h"

/* the C API only: Open MPI's C++ bindings do not compile warning-free */
#define OMPI_SKIP_MPICXX  1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <string>

namespace zr_emu {

struct nccl_op;

/* A communicator's state; operations hold it, so it outlives an abort. */
struct comm_state {
    MPI_Comm mpi = MPI_COMM_NULL; /* ranks in NCCL's order; freed by destroy / abort */
    int rank = 0, nranks = 0, device = 0;
    std::atomic<int> async_error{ncclSuccess};
    std::atomic<int> inflight{0}; /* operations queued and not yet complete */
    std::mutex mu;                /* guards aborted and ready (worker <-> host) */
    bool aborted = false;
    std::deque<nccl_op *> ready; /* reached by their stream, not yet posted */
    /* the host's (the MPI thread's) alone */
    std::vector<nccl_op *> posted;
};

/* One transfer: a send of bytes at ptr to peer, or a receive into ptr from it. */
struct xfer {
    int peer;
    bool recv;
    char *ptr;
    size_t bytes;
};

/* One call of an operation (a group fuses several): its transfers, the local work the
 * stream does before and after them, and its accesses for the race detector. */
struct part {
    std::vector<xfer> xfers;
    std::function<void()> before, after;
    std::shared_ptr<std::vector<char>> scratch; /* receives of a reduction */
    std::vector<mem_access> acc;
};

/* The queued operation: the parts of one communicator on one stream. */
struct nccl_op : op {
    std::shared_ptr<comm_state> comm;
    std::vector<part> parts;
    std::vector<MPI_Request> reqs; /* the host's */
    std::mutex m;                  /* hand-over between worker and host */
    std::condition_variable cv;
    bool done = false;
    ncclResult_t result = ncclSuccess;
    void run() override;
};

/* What ncclComm_t points to. */
struct nccl_handle {
    std::shared_ptr<comm_state> s;
};

/* MPI is initialised and not finalised. */
bool nccl_mpi_usable(void);
/* The reported version: ZR_EMU_NCCL_VERSION, default NCCL_VERSION_CODE. */
int nccl_version(void);
/* NCCL_DEBUG set: print "NCCL WARN ..." lines as NCCL does. */
void nccl_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The thread that calls MPI (the first communicator's creator); true on it. */
bool nccl_on_mpi_thread(void);
void nccl_claim_mpi_thread(void);
/* Registers a communicator for the host's progress, and takes it off again. */
void nccl_register(const std::shared_ptr<comm_state> &s);
void nccl_unregister(const comm_state *s);
/* The registered communicators, for one round of progress. */
std::vector<std::shared_ptr<comm_state>> nccl_comms(void);
/* Completes every operation of s with an error (abort): the workers go on. */
void nccl_fail_all(comm_state &s, ncclResult_t why);
/* The host's progress over every communicator (zr_emu::host_progress). */
void nccl_progress(void);
/* 1 while ncclGroupStart calls outnumber ncclGroupEnd calls on this thread. */
bool nccl_in_group(void);

} // namespace zr_emu

#endif /* ZR_EMU_NCCL_IMPL_H */
