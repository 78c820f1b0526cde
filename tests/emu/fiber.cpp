/*
 * fiber.cpp - the GPU emulator's CUDA threads as fibers (tests/emu, issue 23).
 *
 * A block's CUDA threads are fibers: user-level contexts, each with its own
 * stack, that the OS thread running the block (a stream's worker) switches
 * between cooperatively. A CUDA thread only ever waits for another one at a
 * __syncthreads, a warp operation or its exit, so those are the only places
 * a fiber gives way. With one OS thread per CUDA thread (the emulator's
 * first design) every barrier and shuffle woke hundreds of threads on two
 * cores, and the system calls and context switches were most of the test
 * suite's time; a switch here is a few instructions.
 *
 * The scheduler is a queue of ready fibers, nothing else. A fiber that waits
 * calls fiber_wait and the next ready fiber runs; whoever completes what it
 * waits for calls fiber_ready; fiber_yield lets the others run first. The
 * queue starts in thread order, and a barrier releases its waiters in thread
 * order, so the fibers of a block take turns round-robin, the same way on
 * every run. A wait with nothing ready while fibers are still live is a
 * deadlock, known at once: the caller's all_wait hook (kernel.cpp) fails the
 * block and makes every waiter ready again so that it unwinds. A fiber that
 * never waits (a loop that never ends, a spin on memory another thread
 * writes) keeps the OS thread, and only the watchdog thread (kernel.cpp) can
 * see it.
 *
 * ThreadSanitizer: each fiber is a TSan fiber of its own (a distinct
 * "thread" in its reports), created once per slot and reused, and every
 * switch is made with __tsan_switch_to_fiber_no_sync, so that switching
 * orders nothing: the only happens-before edges between CUDA threads are the
 * atomics of the barriers and warp operations (kernel.cpp), and a missing
 * __syncthreads is a race TSan reports. The runner's work before a block
 * happens before each fiber's (an acquire of `serial`), each fiber's before
 * the runner's after the block (an acquire of `live`), as with threads
 * started and joined. The scheduler's own bookkeeping is relaxed atomics
 * (seen by TSan, ordering nothing); the saved stack pointers and the
 * thread-local variables that say which fiber runs (threadIdx, written by
 * the enter hook) are written only by code TSan does not instrument.
 *
 * The switch is a few lines of assembly on x86-64 (the callee-saved
 * registers and the floating-point control words, as the ABI requires);
 * elsewhere it is ucontext's swapcontext, which also makes a system call per
 * switch for the signal mask.
 */
#include "emu.h"

#include <sys/mman.h>

#if !defined(__x86_64__) || defined(ZR_EMU_FIBER_UCONTEXT)
#define ZR_EMU_UCONTEXT 1
#include <ucontext.h>
#else
#define ZR_EMU_UCONTEXT 0
#endif

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

/* Functions whose memory accesses ThreadSanitizer must not see (see above);
 * never inlined into instrumented code. */
#define ZR_EMU_NO_TSAN __attribute__((no_sanitize_thread, noinline))

#if !ZR_EMU_UCONTEXT
/* zr_emu_fiber_switch(&from_sp, to_sp): saves rbp rbx r12-r15, MXCSR and the
 * x87 control word on the current stack, stores the stack pointer in
 * *from_sp, and resumes the context saved at to_sp. A new fiber's stack is
 * laid out as if it had called the switch from zr_emu_fiber_trampoline, which
 * calls r13(r12) and never returns (the function does not). */
extern "C" void zr_emu_fiber_switch(void **from_sp, void *to_sp);
extern "C" void zr_emu_fiber_trampoline(void);
asm(R"(
    .text
    .p2align 4
    .globl zr_emu_fiber_switch
    .hidden zr_emu_fiber_switch
    .type zr_emu_fiber_switch, @function
zr_emu_fiber_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size zr_emu_fiber_switch, .-zr_emu_fiber_switch

    .p2align 4
    .globl zr_emu_fiber_trampoline
    .hidden zr_emu_fiber_trampoline
    .type zr_emu_fiber_trampoline, @function
zr_emu_fiber_trampoline:
    .cfi_startproc
    .cfi_undefined rip
    movq %r12, %rdi
    callq *%r13
    ud2
    .cfi_endproc
    .size zr_emu_fiber_trampoline, .-zr_emu_fiber_trampoline
)");
#endif

namespace zr_emu {

namespace {

constexpr size_t kStack = (size_t)2 << 20; /* as the OS threads' stacks before */
constexpr size_t kGuard = 4096;            /* below each stack: an overflow faults */
constexpr unsigned int kMaxFibers = 1024;

struct context {
#if ZR_EMU_UCONTEXT
    ucontext_t uc;
#else
    void *sp = nullptr;
#endif
};

struct fiber {
    context ctx;
    char *stack = nullptr; /* kStack bytes above a guard page */
    void *tsan = nullptr;  /* its TSan fiber */
    std::atomic<int> waiting{0};
};

struct team {
    std::vector<fiber *> f; /* never reallocated past kMaxFibers */
    fiber_hooks hooks;
    /* the ready queue: a fiber is in it at most once (ready and not running) */
    std::atomic<uint32_t> q[kMaxFibers];
    std::atomic<uint32_t> head{0}, tail{0};
    std::atomic<unsigned int> current{0};
    std::atomic<uint64_t> serial{0};   /* blocks started: the runner -> fibers edge */
    std::atomic<unsigned int> live{0}; /* fibers not finished: fibers -> runner */
    context runner;
    void *runner_tsan = nullptr;
};

team &T(void)
{
    static team *t = new team; /* never destroyed: detached workers may still run */
    return *t;
}

void push(unsigned int i)
{
    team &t = T();
    uint32_t k = t.tail.load(std::memory_order_relaxed);
    t.q[k % kMaxFibers].store(i, std::memory_order_relaxed);
    t.tail.store(k + 1, std::memory_order_relaxed);
}

bool pop(unsigned int *i)
{
    team &t = T();
    uint32_t k = t.head.load(std::memory_order_relaxed);
    if (k == t.tail.load(std::memory_order_relaxed)) {
        return false;
    }
    *i = t.q[k % kMaxFibers].load(std::memory_order_relaxed);
    t.head.store(k + 1, std::memory_order_relaxed);
    return true;
}

/* Saves the running context in `from` and resumes `to`; returns when
 * something switches back to `from`. */
ZR_EMU_NO_TSAN void swap(context *from, context *to, void *to_tsan)
{
#if defined(__SANITIZE_THREAD__)
    __tsan_switch_to_fiber(to_tsan, __tsan_switch_to_fiber_no_sync);
#else
    (void)to_tsan;
#endif
#if ZR_EMU_UCONTEXT
    swapcontext(&from->uc, &to->uc);
#else
    zr_emu_fiber_switch(&from->sp, to->sp);
#endif
}

/* Fiber `from` gives way to fiber `to` (the enter hook first says who runs). */
ZR_EMU_NO_TSAN void switch_fiber(unsigned int from, unsigned int to)
{
    team &t = T();
    t.current.store(to, std::memory_order_relaxed);
    t.hooks.enter(to);
    swap(&t.f[from]->ctx, &t.f[to]->ctx, t.f[to]->tsan);
}

/* The next ready fiber, for one that waits or has finished. With none ready
 * and fibers still live, every live fiber waits: the all_wait hook fails the
 * block and makes them ready. False when no fiber is live. */
bool next_ready(unsigned int *next)
{
    team &t = T();
    if (pop(next)) {
        return true;
    }
    if (t.live.load(std::memory_order_relaxed) == 0) {
        return false;
    }
    t.hooks.all_wait();
    if (!pop(next)) {
        fprintf(stderr, "zr-emu: every fiber of a block waits, and failing the block made none "
                        "ready (an emulator bug)\n");
        abort();
    }
    return true;
}

/* A fiber's life in one block: instrumented (the hook's accesses are the
 * kernel's), returns to fiber_start, whose TSan shadow stack stays empty. */
__attribute__((noinline)) void fiber_body(unsigned int i)
{
    team &t = T();
    (void)t.serial.load(std::memory_order_acquire);
    t.hooks.body(i);
    t.live.fetch_sub(1, std::memory_order_acq_rel);
}

/* Where a fiber starts; it never returns: its last switch goes to the next
 * ready fiber, or back to the runner when it was the last one live. */
ZR_EMU_NO_TSAN void fiber_start(unsigned int i)
{
    team &t = T();
    fiber_body(i);
    unsigned int next = 0;
    if (next_ready(&next)) {
        switch_fiber(i, next);
    } else {
        swap(&t.f[i]->ctx, &t.runner, t.runner_tsan);
    }
    fprintf(stderr, "zr-emu: a finished fiber was resumed (an emulator bug)\n");
    abort();
}

#if ZR_EMU_UCONTEXT
void fiber_start_uc(int i)
{
    fiber_start((unsigned int)i);
}
#endif

/* Lays out fiber i's stack so that switching to it calls fiber_start(i). */
ZR_EMU_NO_TSAN void prepare(unsigned int i)
{
    fiber &f = *T().f[i];
#if ZR_EMU_UCONTEXT
    getcontext(&f.ctx.uc);
    f.ctx.uc.uc_stack.ss_sp = f.stack;
    f.ctx.uc.uc_stack.ss_size = kStack;
    f.ctx.uc.uc_link = nullptr;
    makecontext(&f.ctx.uc, reinterpret_cast<void (*)()>(fiber_start_uc), 1, (int)i);
#else
    uintptr_t top = ((uintptr_t)f.stack + kStack) & ~(uintptr_t)15;
    void **w = reinterpret_cast<void **>(top - 80);
    uint32_t csr = 0;
    uint16_t cw = 0;
    __asm__ volatile("stmxcsr %0" : "=m"(csr));
    __asm__ volatile("fnstcw %0" : "=m"(cw));
    w[0] = reinterpret_cast<void *>((uintptr_t)csr | (uintptr_t)cw << 32); /* MXCSR, x87 CW */
    w[1] = nullptr;                                                        /* r15 */
    w[2] = nullptr;                                                        /* r14 */
    w[3] = reinterpret_cast<void *>(&fiber_start);                         /* r13: the function */
    w[4] = reinterpret_cast<void *>((uintptr_t)i);                         /* r12: its argument */
    w[5] = nullptr;                                                        /* rbx */
    w[6] = nullptr;                                                        /* rbp */
    w[7] = reinterpret_cast<void *>(&zr_emu_fiber_trampoline);
    f.ctx.sp = w;
#endif
}

} // namespace

void fibers_reserve(unsigned int n)
{
    team &t = T();
    t.f.reserve(kMaxFibers);
    while (t.f.size() < n) {
        auto *f = new fiber;
        void *p = mmap(nullptr, kStack + kGuard, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
        if (p == MAP_FAILED || mprotect(p, kGuard, PROT_NONE) != 0) {
            fprintf(stderr, "zr-emu: cannot map the stack of CUDA thread %zu\n", t.f.size());
            abort();
        }
        f->stack = static_cast<char *>(p) + kGuard;
#if defined(__SANITIZE_THREAD__)
        f->tsan = __tsan_create_fiber(0);
        char name[32];
        snprintf(name, sizeof name, "CUDA thread %zu", t.f.size());
        __tsan_set_fiber_name(f->tsan, name);
#endif
        t.f.push_back(f);
    }
}

void fibers_run(unsigned int n, const fiber_hooks &hooks)
{
    team &t = T();
    t.hooks = hooks;
    for (unsigned int i = 0; i < n; i++) {
        t.f[i]->waiting.store(0, std::memory_order_relaxed);
        prepare(i);
    }
    t.head.store(0, std::memory_order_relaxed);
    t.tail.store(0, std::memory_order_relaxed);
    for (unsigned int i = 1; i < n; i++) {
        push(i);
    }
    t.live.store(n, std::memory_order_relaxed);
    t.serial.fetch_add(1, std::memory_order_release);
#if defined(__SANITIZE_THREAD__)
    t.runner_tsan = __tsan_get_current_fiber();
#endif
    t.current.store(0, std::memory_order_relaxed);
    hooks.enter(0);
    swap(&t.runner, &t.f[0]->ctx, t.f[0]->tsan);
    (void)t.live.load(std::memory_order_acquire);
}

void fiber_wait(unsigned int self)
{
    team &t = T();
    t.f[self]->waiting.store(1, std::memory_order_relaxed);
    unsigned int next = 0;
    if (!next_ready(&next)) {
        fprintf(stderr, "zr-emu: a live fiber found no fiber live (an emulator bug)\n");
        abort();
    }
    if (next != self) {
        switch_fiber(self, next);
    }
}

void fiber_yield(unsigned int self)
{
    push(self);
    unsigned int next = self;
    (void)pop(&next);
    if (next != self) {
        switch_fiber(self, next);
    }
}

void fiber_ready(unsigned int i)
{
    fiber &f = *T().f[i];
    if (f.waiting.load(std::memory_order_relaxed) != 0) {
        f.waiting.store(0, std::memory_order_relaxed);
        push(i);
    }
}

unsigned int fiber_current(void)
{
    return T().current.load(std::memory_order_relaxed);
}

} // namespace zr_emu
