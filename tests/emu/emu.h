/*
 * emu.h - what the parts of the GPU emulator share (tests/emu, issue 23).
 *
 *   runtime.cpp  configuration, errors, devices
 *   memcpy.cpp   memory, copies and memsets
 *   stream.cpp   streams (a worker thread each), events, ordering, host sync
 *   race.cpp     the allocation table and the race detector between streams
 *   launch.cpp   a launch's checks and queueing (the host side)
 *   kernel.cpp   running a launch: blocks, barriers, warps, the watchdog
 *   fiber.cpp    a block's CUDA threads as fibers on the runner's OS thread
 *   symtab.cpp   a kernel's static __shared__ arrays, from the symbol table
 *   memory.cpp   the address range device and pinned memory comes from
 *
 * Two sides, two kinds of lock. The host side (every runtime call) holds
 * api_mutex() while it reads or changes streams, events, clocks and the
 * allocation table; the workers that execute streams and the fibers that
 * play CUDA threads never take it. The host hands work to a worker through
 * a lock-free queue and learns of its completion through atomic counters, so
 * the only happens-before edges between host and device that ThreadSanitizer
 * sees are the ones CUDA also has (a wait, a synchronisation, a query that
 * succeeds): a host read of pinned memory that no synchronisation orders
 * after the copy that wrote it is a race TSan can report.
 */
#ifndef ZR_EMU_INTERNAL_H
#define ZR_EMU_INTERNAL_H

#include "cuda_runtime.h"

#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace zr_emu {

/* ---- configuration (environment, read once) ------------------------------ */

struct config {
    int devices;         /* ZR_EMU_DEVICES: 0 = no GPU (cudaErrorNoDevice) */
    bool no_driver;      /* ZR_EMU_DEVICES=nodriver: cudaErrorInsufficientDriver */
    double watchdog_s;   /* ZR_EMU_WATCHDOG_S: a block without progress this long aborts */
    bool abort_on_error; /* ZR_EMU_ABORT=1: abort() at the first emulator error */
    size_t mem_bytes;    /* ZR_EMU_MEM_MB: each device's memory */
    int sms;             /* ZR_EMU_SMS: multiProcessorCount reported */
};
const config &cfg(void);

constexpr size_t kSharedPerBlock = 48 * 1024; /* static + dynamic without opt-in */
constexpr size_t kSharedOptin = 227 * 1024;   /* sharedMemPerBlockOptin (H100) */

/* ---- errors --------------------------------------------------------------- */

/* An emulator error: printed as "zr-emu: error: ...", counted, and the device
 * enters the failed state (every later call returns cudaErrorLaunchFailure).
 * Safe from any thread; never takes api_mutex. */
void emu_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* cudaSuccess, or the sticky error every call returns after an emulator error */
cudaError_t sticky_error(void);
/* the calling thread's last error (cudaGetLastError) */
cudaError_t set_last_error(cudaError_t e);

/* Every runtime call starts here: lazy initialisation, the no-device modes,
 * calls from kernels or host functions (not allowed), the sticky error. */
cudaError_t api_enter(const char *call, bool check_sticky = true);
int current_device(void);

/* The first line of every runtime call (returns its error from the call). */
#define ZR_EMU_ENTER(call)                                                                         \
    do {                                                                                           \
        cudaError_t e_ = zr_emu::api_enter(call);                                                  \
        if (e_ != cudaSuccess) {                                                                   \
            return zr_emu::set_last_error(e_);                                                     \
        }                                                                                          \
    } while (0)

std::mutex &api_mutex(void);

/* ---- futex-based waiting (no lock, so no hidden happens-before edge) ----- */

void futex_wait(std::atomic<uint32_t> *word, uint32_t seen, double timeout_s);
void futex_wake_all(std::atomic<uint32_t> *word);
double now_ms(void);

/* A futex word that counts its sleepers, so that a waker who finds nobody
 * asleep makes no system call (the host and the stream workers meet at every
 * operation, and the calls would be much of their time). Every change of v must be
 * sequentially consistent (the defaults), then wake(): a sleeper counts
 * itself before it looks at v, the waker changes v before it looks at the
 * count, so one of them sees the other. Under ThreadSanitizer the count is
 * left out: a sleeper's increment read by its waker is an ordering TSan would
 * see and CUDA does not have (a worker falling asleep after a copy, then
 * woken by the host's next call, would order the copy before everything the
 * host does next, and hide a host read that races with the copy). */
struct wait_word {
    std::atomic<uint32_t> v{0};
#if !defined(__SANITIZE_THREAD__)
    std::atomic<int> sleepers{0};
#endif
    /* sleeps while v == seen; may return early (spuriously, or at the timeout) */
    void wait(uint32_t seen, double timeout_s = 0)
    {
#if defined(__SANITIZE_THREAD__)
        futex_wait(&v, seen, timeout_s);
#else
        sleepers.fetch_add(1);
        if (v.load() == seen) {
            futex_wait(&v, seen, timeout_s);
        }
        sleepers.fetch_sub(1);
#endif
    }
    void wake()
    {
#if !defined(__SANITIZE_THREAD__)
        if (sleepers.load() == 0) {
            return;
        }
#endif
        futex_wake_all(&v);
    }
    /* v + 1, then wake */
    void bump()
    {
        v.fetch_add(1);
        wake();
    }
};

/* ---- vector clocks ---------------------------------------------------------- */

/* For each stream id, how many of its operations are ordered before a point
 * (an operation, an event, the host). Sparse, sorted by id. */
struct vclock {
    std::vector<std::pair<uint32_t, uint64_t>> e;
    uint64_t get(uint32_t id) const;
    void set(uint32_t id, uint64_t v);
    void merge(const vclock &o);
};

/* ---- streams ------------------------------------------------------------------ */

struct op;

} // namespace zr_emu

struct zr_emu_stream {
    uint32_t id;
    int device;
    bool legacy;      /* the legacy default stream (0) of its device */
    bool nonblocking; /* cudaStreamNonBlocking: no implicit order with stream 0 */
    /* host side, under api_mutex */
    zr_emu::vclock clock; /* what this stream's next operation is ordered after */
    uint64_t enqueued = 0;
    bool destroyed = false;
    zr_emu::op *tail = nullptr;
    zr_emu::wait_word pushed;
    /* worker side: written by the worker, read by waiters */
    std::atomic<uint64_t> completed{0};
    zr_emu::wait_word done_word;
};

struct zr_emu_event {
    unsigned int flags;
    int device;
    /* host side, under api_mutex: the last record */
    bool recorded = false;
    zr_emu_stream *stream = nullptr;
    uint64_t seq = 0;
    zr_emu::vclock clock;
    std::shared_ptr<double> stamp; /* ms, written by the worker when it runs the record */
};

namespace zr_emu {

/* One queued operation. run() executes on the stream's worker after every
 * dependency (another stream's operation count) is complete. */
struct op {
    std::atomic<op *> next{nullptr};
    uint64_t seq = 0;
    std::vector<std::pair<zr_emu_stream *, uint64_t>> deps;
    bool stop = false;
    virtual ~op() {}
    virtual void run() {}
};

/* An access of one operation to one tracked allocation, for the race check. */
struct mem_access {
    const void *ptr;
    size_t bytes;
    bool write;
    std::string what; /* "argument 2 (float *)", "source", "destination" */
};

/* Resolves a handle (0 and cudaStreamLegacy = the current device's legacy
 * stream); nullptr for an unknown or destroyed handle. Under api_mutex. */
zr_emu_stream *resolve_stream(cudaStream_t s);
/* Orders, race-checks and queues op on s. On a race nothing is queued and
 * cudaErrorLaunchFailure is returned. Under api_mutex. */
cudaError_t enqueue(zr_emu_stream *s, op *o, const char *what, const std::vector<mem_access> &acc,
                    vclock *clock_out = nullptr);
/* The counters of zr_emu_launch_counts (zr_emu.h): a kernel launch or a GEMM call queued. */
void count_kernel();
void count_gemm();
/* Waits (without api_mutex held) until s has completed `seq` operations. */
void wait_completed(zr_emu_stream *s, uint64_t seq);
/* Work the host owes while it waits on the runtime: the emulated NCCL moves
 * its bytes through MPI on the host thread (nccl.cpp), so a host blocked in a
 * synchronisation must keep them moving, as a GPU would on its own. Called
 * by every host-side wait for a stream (never by a worker), and by queries;
 * nullptr until the first NCCL communicator exists. */
extern std::atomic<void (*)(void)> host_progress;
/* The host now knows everything c is ordered after. Under api_mutex. */
void host_learns(const vclock &c);
/* Waits for every stream of a device (-1: all) and tells the host; at most
 * timeout_s seconds per stream when positive (the exit path). Takes api_mutex. */
void sync_device(int device, double timeout_s = 0);
/* Drops every access record: after zr_emu_take_errors. Under api_mutex. */
void race_reset(void);

/* ---- allocations (race.cpp) ---------------------------------------------------- */

enum mem_kind { MEM_PAGEABLE = 0, MEM_DEVICE = 1, MEM_PINNED = 2 };

struct alloc_view {
    mem_kind kind;
    int device;
    uintptr_t base; /* 0 for pageable memory */
    size_t size;
    uint64_t serial;
};

/* Device and pinned memory, outside the malloc heap (memory.cpp): 256-byte
 * aligned, ending before a guard page. Under api_mutex. */
void *region_alloc(size_t size);
void region_free(void *p, size_t size);

/* Under api_mutex. */
void alloc_add(void *p, size_t size, mem_kind kind, int device);
bool alloc_remove(void *p, mem_kind kind, size_t *size_out);
/* The allocation holding [p, p+1); for pageable memory kind is MEM_PAGEABLE.
 * at_end: p is one past the end of an allocation (nothing to access). */
alloc_view alloc_find(const void *p, bool *at_end = nullptr);
/* "freed device memory (allocation #3 of 64 bytes at 0x...)" when p lies in a
 * recently freed allocation, else "" */
std::string alloc_freed_note(const void *p);
/* Race check of an operation's accesses, then their record. Returns false
 * (after emu_error) on a race. */
bool race_check_and_record(const zr_emu_stream *s, uint64_t seq, const vclock &c, const char *what,
                           const std::vector<mem_access> &acc, const vclock &host);
std::string stream_name(const zr_emu_stream *s);

/* ---- fibers (fiber.cpp) --------------------------------------------------------------- */

/* What a block's fibers run (kernel.cpp). */
struct fiber_hooks {
    void (*body)(unsigned int i);  /* fiber i's whole life in the block */
    void (*enter)(unsigned int i); /* fiber i is about to run: its thread-locals (no TSan) */
    void (*all_wait)(void);        /* every live fiber waits: fail the block, ready them */
};
/* Stacks (and TSan fibers) for n fibers; called before fibers_run. */
void fibers_reserve(unsigned int n);
/* Runs fibers 0..n-1 of a block on the calling OS thread, starting in order,
 * until every one has returned from hooks.body. */
void fibers_run(unsigned int n, const fiber_hooks &hooks);
/* The running fiber `self` waits: the next ready fiber runs, and this call
 * returns once fiber_ready(self) has been called (or at once, when it was the
 * only one ready). */
void fiber_wait(unsigned int self);
/* The running fiber `self` goes to the back of the ready queue. */
void fiber_yield(unsigned int self);
/* Fiber i, if it waits, becomes ready to run (nothing for one that runs). */
void fiber_ready(unsigned int i);
/* The fiber that runs (or last ran): for the watchdog's report. */
unsigned int fiber_current(void);

/* ---- kernels (kernel.cpp, symtab.cpp) ------------------------------------------- */

struct shared_var {
    void *addr;
    size_t size;
};
/* The writable function-local statics of a kernel: its static __shared__
 * arrays. Thread-safe; cached. */
const std::vector<shared_var> &static_shared_of(const void *kernel);
bool in_kernel_thread(void);
/* The queued operation that runs a launch (kernel.cpp). */
op *make_kernel_op(const char *name, const void *kernel, dim3 grid, dim3 block, size_t shmem,
                   std::unique_ptr<launch_body> body);
extern thread_local bool t_in_host_fn;

} // namespace zr_emu

#endif /* ZR_EMU_INTERNAL_H */
