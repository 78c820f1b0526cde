/*
 * kernel.cpp - the GPU emulator's launches: blocks, barriers, warps and the
 * watchdog (tests/emu, issue 23).
 *
 * The emulated device has one multiprocessor: one block runs at a time in the
 * whole process, on the OS thread of the stream that launched it, its CUDA
 * threads played by fibers that take turns on that thread (fiber.cpp). They
 * give way only where a CUDA thread can wait for another (__syncthreads, a
 * warp operation, its exit), so a block costs its kernel's work and a few
 * instructions per wait, not an OS thread woken per CUDA thread and barrier.
 * Running one block at a time is what lets a function-local static stand for
 * __shared__ memory; it is poisoned (0xFF) before every block, as is the
 * dynamic shared memory.
 *
 * The synchronisation is made of atomics that ThreadSanitizer understands (and
 * a mutex per warp); a fiber switch orders nothing for TSan, so these are the
 * only happens-before edges between a block's threads, as a GPU's barriers
 * are the only order between its threads:
 *   - __syncthreads: one 64-bit counter (live threads << 32 | arrived) and a
 *     phase. A thread that returns leaves the live count, so a barrier that
 *     the remaining threads reach completes, as on sm_70+. The thread that
 *     completes a barrier checks that every waiting thread called it from the
 *     same line: threads split between two __syncthreads is a divergent
 *     barrier, undefined in CUDA, and an error here.
 *   - warp operations (__syncwarp, shuffles, votes): the lanes of one mask
 *     meet in an entry of their warp's table; it completes when every lane of
 *     the mask that has not exited has arrived (CUDA's rule since Volta). A
 *     lane outside its own mask, a shuffle whose source lane is not in the
 *     mask or has exited, a bad width: errors. Lanes may wait in entries with
 *     overlapping masks (independent thread scheduling makes that legal); lanes
 *     that wait for each other in a circle (they disagree on the masks) are a
 *     deadlock, an error as soon as the circle closes.
 *   - a lane that waits at __syncthreads while lanes of its warp wait for it
 *     in a warp operation (or the other way round) can never proceed: an
 *     error at once, not a hang.
 *   - every live thread waiting with none able to go on (a deadlock the
 *     checks above do not name) is an error as soon as the last one waits:
 *     the scheduler finds no fiber ready.
 *   - every barrier and warp operation is a point where a thread gives way,
 *     even one that completes at once: a thread that spins on memory with a
 *     __syncwarp in its loop lets the writer run, as on sm_70+ (independent
 *     thread scheduling).
 *   - a thread that never reaches a wait (a loop that never ends, or a spin
 *     on memory another thread writes with no barrier or warp operation in
 *     the loop: fibers take turns only at those) keeps the OS thread. The
 *     watchdog, a thread of its own, sees no barrier, warp operation or exit
 *     for ZR_EMU_WATCHDOG_S seconds and aborts the process with the threads'
 *     whereabouts (a thread that never returns cannot be stopped).
 * A kernel's error is thrown as an exception out of the failing thread's
 * kernel code; the others are made ready and unwind the same way (every wait
 * looks at the failed flag when it resumes), and the launch fails with a
 * message naming the kernel, block, thread and line.
 */
#include "emu.h"

#include <chrono>
#include <map>
#include <thread>
#include <unordered_map>

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace zr_emu {

namespace {

enum thread_state : int { T_IDLE = 0, T_RUNNING, T_BAR, T_WARP, T_EXITED };
enum warp_kind : int { K_SYNC = 0, K_SHFL, K_VOTE, K_WMMA };

struct kernel_abort {};

struct slot {
    std::atomic<int> state{T_IDLE};
    std::atomic<const char *> what{nullptr}; /* where it waits (reports, site checks) */
    std::atomic<const char *> file{nullptr};
    std::atomic<int> line{0};
};

struct warp_entry {
    unsigned int mask = 0, arrived = 0;
    int kind = K_SYNC;
    std::atomic<int> readers{0};
    const char *what = nullptr, *file = nullptr;
    int line = 0;
    unsigned long long vals[32];
    std::atomic<uint32_t> done{0};
};

struct warp {
    std::mutex mu;
    warp_entry e[32];
    /* under mu: bit i for e[i], in use (until its last reader leaves) and
     * open (until every lane it waits for has arrived); a lane waits in at
     * most one entry, so fewer than 32 are ever in use */
    unsigned int used = 0, open = 0;
    unsigned int exited = 0;          /* lanes that returned or do not exist; under mu */
    std::atomic<uint32_t> pending{0}; /* union of the masks of open entries */
    /* mma_sync's operands (mma.h): two buffers of A, B, C used in turn, and
     * each lane's count of products in this block (the same for all lanes) */
    float wmma[2][768];
    unsigned int wmma_seq[32];
};

struct launch_rec {
    std::string name;
    dim3 grid, block;
    size_t shmem;
    const launch_body *body;
};

struct block_state {
    const launch_rec *L = nullptr;
    uint3 idx{0, 0, 0};
    unsigned int n = 0;
    std::atomic<uint64_t> word{0};  /* live << 32 | arrived at __syncthreads */
    std::atomic<uint32_t> phase{0}; /* __syncthreads completed */
    std::atomic<int> failed{0};
    std::atomic<uint64_t> progress{0};
    std::mutex msg_mu;
    std::string msg;
};

struct multiprocessor {
    std::mutex launch_mu; /* one launch, so one block, at a time */
    std::vector<slot *> slots;
    std::vector<warp *> warps;
    block_state blk;
    uint64_t blocks = 0;              /* blocks started */
    std::atomic<uint64_t> running{0}; /* the block that runs (blocks), 0: none; the watchdog's */
    bool watchdog = false;            /* its thread started */
    char *dyn = nullptr;
};

multiprocessor &M(void)
{
    static multiprocessor *m = new multiprocessor; /* never destroyed */
    return *m;
}

thread_local bool t_team = false;
thread_local unsigned int t_tid = 0;

std::string where_am_i(void)
{
    const block_state &b = M().blk;
    char buf[256];
    snprintf(buf, sizeof buf,
             "kernel '%s' (grid (%u,%u,%u), block (%u,%u,%u)), block (%u,%u,%u), thread "
             "(%u,%u,%u)",
             b.L->name.c_str(), b.L->grid.x, b.L->grid.y, b.L->grid.z, b.L->block.x, b.L->block.y,
             b.L->block.z, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y,
             threadIdx.z);
    return buf;
}

/* After a failure: every waiting thread resumes, sees the flag and unwinds. */
void wake_everyone(block_state &b)
{
    for (unsigned int i = 0; i < b.n; i++) {
        fiber_ready(i);
    }
}

/* The block fails with msg (the first failure's message is kept). */
void mark_failed(const std::string &msg)
{
    block_state &b = M().blk;
    {
        std::lock_guard<std::mutex> lock(b.msg_mu);
        if (b.msg.empty()) {
            b.msg = msg;
        }
    }
    b.failed.store(1);
    wake_everyone(b);
}

[[noreturn]] void fail_here(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

[[noreturn]] void fail_here(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    mark_failed(where_am_i() + ": " + buf);
    throw kernel_abort{};
}

void check_failed(const block_state &b)
{
    if (b.failed.load() != 0) {
        throw kernel_abort{};
    }
}

/* "0-31,40" */
std::string lane_list(unsigned int bits, unsigned int base)
{
    std::string s;
    for (unsigned int i = 0; i < 32;) {
        if (!(bits >> i & 1u)) {
            i++;
            continue;
        }
        unsigned int j = i;
        while (j + 1 < 32 && (bits >> (j + 1) & 1u)) {
            j++;
        }
        char buf[32];
        snprintf(buf, sizeof buf, j > i ? "%s%u-%u" : "%s%u", s.empty() ? "" : ",", base + i,
                 base + j);
        s += buf;
        i = j + 1;
    }
    return s;
}

bool same_site(const slot &a, const slot &b)
{
    const char *fa = a.file.load(std::memory_order_relaxed);
    const char *fb = b.file.load(std::memory_order_relaxed);
    return a.line.load(std::memory_order_relaxed) == b.line.load(std::memory_order_relaxed) &&
           (fa == fb || (fa != nullptr && fb != nullptr && strcmp(fa, fb) == 0));
}

std::string thread_coords(unsigned int tid)
{
    const dim3 bd = M().blk.L->block;
    char buf[48];
    snprintf(buf, sizeof buf, "(%u,%u,%u)", tid % bd.x, (tid / bd.x) % bd.y, tid / (bd.x * bd.y));
    return buf;
}

/* Every live thread waits at this barrier: check they agree on the line,
 * release them. Called by the last to arrive, or by the thread whose return
 * made the waiting ones the only live ones. */
void complete_barrier(block_state &b, uint32_t ph, uint32_t live)
{
    multiprocessor &m = M();
    int ref = -1;
    std::string split;
    for (unsigned int i = 0; i < b.n && split.empty(); i++) {
        const slot &s = *m.slots[i];
        if (s.state.load() != T_BAR) {
            continue;
        }
        if (ref < 0) {
            ref = (int)i;
        } else if (!same_site(*m.slots[(unsigned int)ref], s)) {
            const slot &r = *m.slots[(unsigned int)ref];
            char buf[512];
            snprintf(buf, sizeof buf,
                     "divergent __syncthreads: thread %s waits at %s:%d, thread %s at %s:%d "
                     "(every thread of a block must reach the same __syncthreads)",
                     thread_coords((unsigned int)ref).c_str(), r.file.load(), r.line.load(),
                     thread_coords(i).c_str(), s.file.load(), s.line.load());
            split = buf;
        }
    }
    if (!split.empty()) {
        char head[256];
        snprintf(head, sizeof head,
                 "kernel '%s' (grid (%u,%u,%u), block (%u,%u,%u)), block (%u,%u,%u): ",
                 b.L->name.c_str(), b.L->grid.x, b.L->grid.y, b.L->grid.z, b.L->block.x,
                 b.L->block.y, b.L->block.z, b.idx.x, b.idx.y, b.idx.z);
        mark_failed(head + split);
    }
    b.word.store((uint64_t)live << 32, std::memory_order_relaxed);
    b.phase.store(ph + 1);
    for (unsigned int i = 0; i < b.n; i++) {
        int st = T_BAR;
        if (m.slots[i]->state.compare_exchange_strong(st, T_RUNNING)) {
            fiber_ready(i);
        }
    }
}

/* ---- warps ---------------------------------------------------------------------------- */

/* Under w.mu: the entry completes when every lane of its mask that has not
 * exited has arrived. */
void try_complete(warp &w, warp_entry &e, unsigned int warp_base)
{
    unsigned int need = e.mask & ~w.exited;
    if ((e.arrived & need) != need) {
        return;
    }
    w.open &= ~(1u << (unsigned int)(&e - w.e));
    e.readers.store(__builtin_popcount(e.arrived));
    uint32_t pending = 0;
    for (unsigned int o = w.open; o != 0; o &= o - 1) {
        pending |= w.e[__builtin_ctz(o)].mask;
    }
    w.pending.store(pending);
    e.done.store(1, std::memory_order_release);
    for (unsigned int l = 0; l < 32; l++) {
        if (e.arrived >> l & 1u) {
            M().slots[warp_base + l]->state.store(T_RUNNING);
            fiber_ready(warp_base + l);
        }
    }
}

/* The lane has read the entry; the last reader frees it (only the last
 * takes the lock: 32 lanes woken at once would queue on it). */
void leave(warp &w, warp_entry *e)
{
    if (e->readers.fetch_sub(1) == 1) {
        std::lock_guard<std::mutex> lock(w.mu);
        w.used &= ~(1u << (unsigned int)(e - w.e));
    }
}

/* The open entry lane l waits in, or nullptr. Under w.mu. */
warp_entry *waiting_in(warp &w, unsigned int l)
{
    for (unsigned int o = w.open; o != 0; o &= o - 1) {
        warp_entry &f = w.e[__builtin_ctz(o)];
        if (f.arrived >> l & 1u) {
            return &f;
        }
    }
    return nullptr;
}

/* Does entry `from` wait, through lanes that wait in other entries, for
 * itself? Each entry waits for the lanes of its mask that have neither
 * arrived nor exited; a lane waits in at most one entry. Under w.mu. */
bool waits_for_itself(warp &w, const warp_entry *from, std::string *why)
{
    /* a circle needs two open entries (a lane that has not arrived at one
     * waits in another); most arrivals find one, theirs */
    if (__builtin_popcount(w.open) < 2) {
        return false;
    }
    const warp_entry *path[33];
    int depth = 0;
    path[depth++] = from;
    unsigned int seen = 0;
    while (depth > 0) {
        const warp_entry *x = path[depth - 1];
        unsigned int need = x->mask & ~x->arrived & ~w.exited;
        const warp_entry *next = nullptr;
        for (unsigned int l = 0; l < 32 && next == nullptr; l++) {
            const warp_entry *y = (need >> l & 1u) ? waiting_in(w, l) : nullptr;
            if (y == from) {
                for (int i = 0; i < depth; i++) {
                    char buf[256];
                    snprintf(buf, sizeof buf, "\n    lanes %s wait in %s at %s:%d (mask 0x%08x)",
                             lane_list(path[i]->arrived, 0).c_str(), path[i]->what, path[i]->file,
                             path[i]->line, path[i]->mask);
                    *why += buf;
                }
                return true;
            }
            unsigned int bit = y != nullptr ? 1u << (unsigned int)(y - w.e) : 0;
            if (y != nullptr && !(seen & bit)) {
                seen |= bit;
                next = y;
            }
        }
        if (next != nullptr) {
            path[depth++] = next;
        } else {
            depth--;
        }
    }
    return false;
}

/* The calling lane joins the lanes of `mask` in a warp operation of this
 * kind (lanes at different lines meet, as on sm_70+); returns the completed
 * entry (the caller reads it, then calls leave). */
warp_entry *arrive(int kind, unsigned int mask, unsigned long long value, const char *what,
                   const char *file, int line)
{
    multiprocessor &m = M();
    block_state &b = m.blk;
    check_failed(b);
    b.progress.fetch_add(1, std::memory_order_relaxed);
    unsigned int lane = t_tid % 32, bit = 1u << lane, base = t_tid - lane;
    if (!(mask & bit)) {
        fail_here("%s at %s:%d: the mask 0x%08x does not include the calling lane %u", what, file,
                  line, mask, lane);
    }
    warp &w = *m.warps[t_tid / 32];
    std::unique_lock<std::mutex> lock(w.mu);
    warp_entry *e = nullptr;
    for (unsigned int o = w.open; o != 0 && e == nullptr; o &= o - 1) {
        warp_entry &f = w.e[__builtin_ctz(o)];
        if (f.mask == mask && f.kind == kind) {
            e = &f;
        }
    }
    if (e == nullptr) {
        unsigned int k = (unsigned int)__builtin_ctz(~w.used); /* one is free (see warp) */
        e = &w.e[k];
        w.used |= 1u << k;
        w.open |= 1u << k;
        e->mask = mask;
        e->arrived = bit; /* before the check below, whose failure names the lanes */
        e->kind = kind;
        e->readers.store(0);
        e->what = what;
        e->file = file;
        e->line = line;
        e->done.store(0, std::memory_order_relaxed);
        w.pending.fetch_or(mask);
        for (unsigned int l = 0; l < 32; l++) {
            const slot &s = *m.slots[base + l];
            if ((mask & ~w.exited & ~bit) >> l & 1u && s.state.load() == T_BAR) {
                lock.unlock();
                fail_here("%s at %s:%d waits for lane %u, which waits at __syncthreads (%s:%d): "
                          "neither can go on",
                          what, file, line, l, s.file.load(), s.line.load());
            }
        }
    }
    e->arrived |= bit;
    e->vals[lane] = value;
    slot &me = *m.slots[t_tid];
    me.what.store(what, std::memory_order_relaxed);
    me.file.store(file, std::memory_order_relaxed);
    me.line.store(line, std::memory_order_relaxed);
    me.state.store(T_WARP);
    try_complete(w, *e, base);
    std::string why;
    if ((w.open >> (unsigned int)(e - w.e) & 1u) && waits_for_itself(w, e, &why)) {
        lock.unlock();
        fail_here("%s at %s:%d: the lanes of the warp wait for each other in a circle (they "
                  "disagree on the masks or on the operation), so none can go on:%s",
                  what, file, line, why.c_str());
    }
    lock.unlock();
    if (e->done.load(std::memory_order_acquire) != 0) {
        fiber_yield(t_tid); /* completed by this lane: still a point to give way */
    }
    while (e->done.load(std::memory_order_acquire) == 0) {
        check_failed(b);
        fiber_wait(t_tid);
    }
    check_failed(b);
    return e;
}

/* The thread's kernel function returned. */
void thread_exit(block_state &b)
{
    multiprocessor &m = M();
    unsigned int lane = t_tid % 32;
    slot &me = *m.slots[t_tid];
    me.state.store(T_EXITED);
    b.progress.fetch_add(1, std::memory_order_relaxed);
    warp &w = *m.warps[t_tid / 32];
    {
        std::lock_guard<std::mutex> lock(w.mu);
        w.exited |= 1u << lane;
        for (unsigned int o = w.open; o != 0; o &= o - 1) {
            warp_entry &f = w.e[__builtin_ctz(o)];
            if (f.mask >> lane & 1u) {
                try_complete(w, f, t_tid - lane);
            }
        }
    }
    uint64_t v = b.word.fetch_sub((uint64_t)1 << 32, std::memory_order_acq_rel);
    uint32_t live = (uint32_t)(v >> 32) - 1, arrived = (uint32_t)v;
    if (arrived > 0 && arrived == live) {
        complete_barrier(b, b.phase.load(), live);
    }
}

/* ---- blocks ------------------------------------------------------------------------------ */

/* Fiber i is about to run: the thread-locals that say which CUDA thread this
 * OS thread plays. The fibers of a block share the OS thread, so each switch
 * writes them, in code TSan does not see: otherwise every fiber's reads of
 * threadIdx would race with the next switch's write. */
__attribute__((no_sanitize_thread, noinline)) void enter_thread(unsigned int i)
{
    const dim3 bd = M().blk.L->block;
    t_tid = i;
    threadIdx = uint3{i % bd.x, (i / bd.x) % bd.y, i / (bd.x * bd.y)};
}

/* One CUDA thread's life in a block (a fiber's body). */
void cuda_thread(unsigned int tid)
{
    multiprocessor &m = M();
    block_state &b = m.blk;
    try {
        b.L->body->run_thread();
        thread_exit(b);
    } catch (kernel_abort &) {
    } catch (std::exception &ex) {
        mark_failed(where_am_i() + ": the kernel threw " + ex.what());
    } catch (...) {
        mark_failed(where_am_i() + ": the kernel threw an exception");
    }
    /* unwound or returned: the watchdog must not list it as running or
     * waiting (its state is where the failure found it) */
    m.slots[tid]->state.store(T_EXITED);
}

/* "thread 3 waits in __shfl_sync at f.cu:12" for each waiting thread */
std::string waiting_list(const block_state &b)
{
    multiprocessor &m = M();
    std::string waiting;
    for (unsigned int i = 0; i < b.n; i++) {
        const slot &s = *m.slots[i];
        int st = s.state.load(std::memory_order_relaxed);
        if (st == T_BAR || st == T_WARP) {
            char buf[160];
            snprintf(buf, sizeof buf, "\n    thread %u waits in %s at %s:%d", i,
                     st == T_BAR ? "__syncthreads" : s.what.load(std::memory_order_relaxed),
                     s.file.load(std::memory_order_relaxed),
                     s.line.load(std::memory_order_relaxed));
            waiting += buf;
        }
    }
    return waiting;
}

std::string block_head(const block_state &b)
{
    char head[512];
    snprintf(head, sizeof head, "kernel '%s', block (%u,%u,%u)", b.L->name.c_str(), b.idx.x,
             b.idx.y, b.idx.z);
    return head;
}

/* Every live thread waits and nothing can release one: a deadlock that the
 * checks where threads wait did not name. The block fails; the waiting
 * threads are made ready and unwind. */
void all_wait(void)
{
    block_state &b = M().blk;
    mark_failed(block_head(b) + ": every live thread waits, and none can go on:" + waiting_list(b));
}

/* A thread of its own, for what the fibers cannot see themselves: a block
 * whose running thread never reaches a barrier, warp operation or exit (a
 * fiber that never waits keeps the OS thread). It looks every quarter of a
 * second at the running block and its progress count; the same block without
 * progress for ZR_EMU_WATCHDOG_S seconds ends the process, as a kernel that
 * never returns cannot be stopped. */
void watchdog_main(void)
{
    multiprocessor &m = M();
    const double limit_ms = cfg().watchdog_s * 1000.0;
    const auto tick = std::chrono::milliseconds(limit_ms < 1000.0 ? 50 : 250);
    uint64_t block = 0, progress = 0;
    double since = now_ms();
    for (;;) {
        std::this_thread::sleep_for(tick);
        uint64_t r = m.running.load(std::memory_order_acquire);
        uint64_t p = m.blk.progress.load(std::memory_order_relaxed);
        if (r == 0 || r != block || p != progress) {
            block = r;
            progress = p;
            since = now_ms();
            continue;
        }
        if (now_ms() - since <= limit_ms) {
            continue;
        }
        const block_state &b = m.blk;
        emu_error("%s: no progress for %g s (ZR_EMU_WATCHDOG_S); thread (linear id) %u is still "
                  "running: a loop that never ends, or a spin on memory that another thread "
                  "writes with no barrier or warp operation in between (the threads of a block "
                  "take turns only there). A thread cannot be stopped: aborting.%s",
                  block_head(b).c_str(), cfg().watchdog_s, fiber_current(),
                  waiting_list(b).c_str());
        abort();
    }
}

void reserve_block(unsigned int n)
{
    multiprocessor &m = M();
    /* never reallocated: the watchdog reads these vectors */
    m.slots.reserve(1024);
    m.warps.reserve(32);
    while (m.warps.size() < (n + 31) / 32) {
        m.warps.push_back(new warp);
    }
    while (m.slots.size() < n) {
        m.slots.push_back(new slot);
    }
    fibers_reserve(n);
    if (m.dyn == nullptr) {
        m.dyn = static_cast<char *>(aligned_alloc(256, kSharedOptin));
    }
    if (!m.watchdog) {
        m.watchdog = true;
        std::thread(watchdog_main).detach();
    }
}

bool run_block(const launch_rec &L, uint3 idx, const std::vector<shared_var> &statics)
{
    multiprocessor &m = M();
    block_state &b = m.blk;
    unsigned int n = L.block.x * L.block.y * L.block.z;
    b.L = &L;
    b.idx = idx;
    b.n = n;
    b.word.store((uint64_t)n << 32);
    b.phase.store(0);
    b.failed.store(0);
    b.msg.clear();
    for (unsigned int w = 0; w < (n + 31) / 32; w++) {
        warp &wp = *m.warps[w];
        unsigned int lanes = std::min(32u, n - w * 32);
        wp.exited = lanes == 32 ? 0u : ~((1u << lanes) - 1u);
        wp.pending.store(0);
        wp.used = 0;
        wp.open = 0;
        memset(wp.wmma_seq, 0, sizeof wp.wmma_seq);
    }
    for (const shared_var &v : statics) {
        memset(v.addr, 0xff, v.size);
    }
    memset(m.dyn, 0xff, L.shmem);
    for (unsigned int i = 0; i < n; i++) {
        m.slots[i]->state.store(T_RUNNING);
    }
    blockIdx = idx;
    blockDim = L.block;
    gridDim = L.grid;
    m.blocks++;
    m.running.store(m.blocks, std::memory_order_release);
    t_team = true;
    fibers_run(n, fiber_hooks{cuda_thread, enter_thread, all_wait});
    t_team = false;
    m.running.store(0, std::memory_order_relaxed);
    return b.failed.load() == 0;
}

struct kernel_op : op {
    launch_rec L;
    const void *fn = nullptr;
    std::unique_ptr<launch_body> body;
    void run() override
    {
        if (sticky_error() != cudaSuccess) {
            return;
        }
        multiprocessor &m = M();
        std::lock_guard<std::mutex> lock(m.launch_mu);
        reserve_block(L.block.x * L.block.y * L.block.z);
        const std::vector<shared_var> &statics = static_shared_of(fn);
        for (unsigned int z = 0; z < L.grid.z; z++) {
            for (unsigned int y = 0; y < L.grid.y; y++) {
                for (unsigned int x = 0; x < L.grid.x; x++) {
                    if (!run_block(L, uint3{x, y, z}, statics)) {
                        emu_error("%s", m.blk.msg.c_str());
                        return;
                    }
                }
            }
        }
    }
};

} // namespace

bool in_kernel_thread(void)
{
    return t_team;
}

op *make_kernel_op(const char *name, const void *kernel, dim3 grid, dim3 block, size_t shmem,
                   std::unique_ptr<launch_body> body)
{
    auto *o = new kernel_op;
    o->L.name = name;
    o->L.grid = grid;
    o->L.block = block;
    o->L.shmem = shmem;
    o->L.body = body.get();
    o->fn = kernel;
    o->body = std::move(body);
    return o;
}

/* ---- kernel-side entry points --------------------------------------------------------- */

void syncthreads(const char *file, int line)
{
    multiprocessor &m = M();
    block_state &b = m.blk;
    check_failed(b);
    b.progress.fetch_add(1, std::memory_order_relaxed);
    slot &me = *m.slots[t_tid];
    me.what.store("__syncthreads", std::memory_order_relaxed);
    me.file.store(file, std::memory_order_relaxed);
    me.line.store(line, std::memory_order_relaxed);
    me.state.store(T_BAR);
    warp &w = *m.warps[t_tid / 32];
    unsigned int lane = t_tid % 32;
    if (w.pending.load() >> lane & 1u) {
        std::string other;
        {
            std::lock_guard<std::mutex> lock(w.mu);
            for (unsigned int o = w.open; o != 0; o &= o - 1) {
                const warp_entry &f = w.e[__builtin_ctz(o)];
                if (f.mask >> lane & 1u) {
                    other = std::string(f.what) + " at " + f.file + ":" + std::to_string(f.line) +
                            " (lanes " + lane_list(f.arrived, 0) + ")";
                }
            }
        }
        if (!other.empty()) {
            fail_here("__syncthreads at %s:%d while lanes of its warp wait for this lane in %s: "
                      "neither can go on",
                      file, line, other.c_str());
        }
    }
    uint32_t ph = b.phase.load();
    uint64_t v = b.word.fetch_add(1, std::memory_order_acq_rel) + 1;
    if ((uint32_t)v == (uint32_t)(v >> 32)) {
        complete_barrier(b, ph, (uint32_t)(v >> 32));
        fiber_yield(t_tid); /* the last to arrive gives way too */
    } else {
        /* resumed when the barrier completes, or when the block fails */
        while (b.phase.load() == ph) {
            check_failed(b);
            fiber_wait(t_tid);
        }
    }
    check_failed(b);
}

void syncwarp(unsigned int mask, const char *file, int line)
{
    warp_entry *e = arrive(K_SYNC, mask, 0, "__syncwarp", file, line);
    leave(*M().warps[t_tid / 32], e);
}

unsigned long long shfl(unsigned int mask, unsigned long long value, shfl_mode mode, unsigned int b,
                        int width, const char *what, const char *file, int line)
{
    if (width < 1 || width > 32 || (width & (width - 1)) != 0) {
        fail_here("%s at %s:%d: width %d is not a power of two from 1 to 32", what, file, line,
                  width);
    }
    warp_entry *e = arrive(K_SHFL, mask, value, what, file, line);
    /* the source lane, by the PTX ISA's rule for shfl.sync: the segment mask
     * and clamp CUDA passes for `width`, and the low 5 bits of b */
    unsigned int lane = t_tid % 32;
    unsigned int seg = (unsigned int)(32 - width) & 31u;
    unsigned int cval = mode == SHFL_UP ? 0u : 31u;
    unsigned int bval = b & 31u;
    int min_lane = (int)(lane & seg);
    int max_lane = (int)((lane & seg) | (cval & ~seg & 31u));
    int j = (int)lane;
    bool in_range = true;
    switch (mode) {
    case SHFL_UP:
        j = (int)lane - (int)bval;
        in_range = j >= max_lane;
        break;
    case SHFL_DOWN:
        j = (int)lane + (int)bval;
        in_range = j <= max_lane;
        break;
    case SHFL_XOR:
        j = (int)(lane ^ bval);
        in_range = j <= max_lane;
        break;
    case SHFL_IDX:
        j = min_lane | (int)(bval & ~seg & 31u);
        break;
    }
    if (!in_range) {
        j = (int)lane; /* out of the segment: the lane's own value */
    }
    warp &w = *M().warps[t_tid / 32];
    if (!(e->arrived >> j & 1u)) {
        bool in_mask = (mask >> j & 1u) != 0;
        leave(w, e);
        fail_here("%s at %s:%d reads lane %d, which %s (mask 0x%08x)", what, file, line, j,
                  in_mask ? "has exited" : "is not in the mask", mask);
    }
    unsigned long long r = e->vals[j];
    leave(w, e);
    return r;
}

vote_result vote(unsigned int mask, int pred, const char *what, const char *file, int line)
{
    warp_entry *e = arrive(K_VOTE, mask, pred != 0, what, file, line);
    vote_result r{0, e->arrived};
    for (unsigned int l = 0; l < 32; l++) {
        if ((e->arrived >> l & 1u) && e->vals[l] != 0) {
            r.ballot |= 1u << l;
        }
    }
    leave(*M().warps[t_tid / 32], e);
    return r;
}

void wmma_sync(const char *what, const char *file, int line)
{
    warp_entry *e = arrive(K_WMMA, 0xffffffffu, 0, what, file, line);
    unsigned int arrived = e->arrived;
    leave(*M().warps[t_tid / 32], e);
    if (arrived != 0xffffffffu) {
        fail_here("%s at %s:%d: a warp matrix operation needs all 32 lanes of the warp; lanes "
                  "0x%08x have exited",
                  what, file, line, ~arrived);
    }
}

float *wmma_scratch(void)
{
    warp &w = *M().warps[t_tid / 32];
    return w.wmma[w.wmma_seq[t_tid % 32]++ & 1u];
}

void *dynamic_shared(void)
{
    multiprocessor &m = M();
    return m.blk.L->shmem > 0 ? m.dyn : nullptr;
}

void trap(const char *what, const char *file, int line)
{
    fail_here("%s at %s:%d", what, file, line);
}

} // namespace zr_emu
