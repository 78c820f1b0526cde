/*
 * memory.cpp - where the GPU emulator's device and pinned memory lives
 * (tests/emu, issue 23).
 *
 * Not in the malloc heap: a pointer the host got from malloc must never look
 * like (freed) device memory, and device memory must not be handed out again
 * at the address a stale pointer still holds. So device and pinned
 * allocations come from one range of address space reserved at the first
 * allocation, page by page, each followed by an inaccessible guard page and
 * placed so that it ends (rounded up to 256 bytes, CUDA's alignment) right
 * before the guard: a kernel or host access that runs past the end faults
 * instead of reading a neighbour. Freed pages become inaccessible too, and
 * are reused only once the never-used space is gone. A fault inside the
 * range is reported as what it is before the process dies.
 */
#include "emu.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

namespace zr_emu {

namespace {

constexpr size_t kPage = 4096;

struct range {
    uintptr_t lo;
    size_t bytes;
};

/* under api_mutex */
uintptr_t g_base, g_end, g_next;
std::vector<range> g_free; /* freed page runs, oldest first */
struct sigaction g_old_segv;

void on_segv(int sig, siginfo_t *info, void *ctx)
{
    uintptr_t a = (uintptr_t)info->si_addr;
    if (a >= g_base && a < g_end) {
        static const char msg[] = "zr-emu: error: an access to device or pinned memory that is "
                                  "not allocated: past the end of an allocation (each is followed "
                                  "by a guard page) or freed memory; aborting\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
    }
    sigaction(SIGSEGV, &g_old_segv, nullptr); /* the fault repeats with the old handler */
    (void)sig;
    (void)ctx;
}

bool reserve(void)
{
    /* within what ThreadSanitizer lets an application map */
    for (size_t gib : {256, 64, 16, 4}) {
        size_t bytes = gib << 30;
        void *p =
            mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p != MAP_FAILED) {
            g_base = g_next = (uintptr_t)p;
            g_end = g_base + bytes;
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_sigaction = on_segv;
            sa.sa_flags = SA_SIGINFO;
            sigemptyset(&sa.sa_mask);
            sigaction(SIGSEGV, &sa, &g_old_segv);
            return true;
        }
    }
    return false;
}

} // namespace

void *region_alloc(size_t size)
{
    if (g_base == 0 && !reserve()) {
        return nullptr;
    }
    size_t pages = (size + kPage - 1) / kPage * kPage;
    size_t need = pages + kPage; /* and the guard */
    uintptr_t lo = 0;
    if (need <= g_end - g_next) {
        lo = g_next;
        g_next += need;
    } else {
        for (size_t i = 0; i < g_free.size(); i++) {
            if (g_free[i].bytes >= need) {
                lo = g_free[i].lo;
                g_free[i].lo += need;
                g_free[i].bytes -= need;
                if (g_free[i].bytes == 0) {
                    g_free.erase(g_free.begin() + (long)i);
                }
                break;
            }
        }
        if (lo == 0) {
            return nullptr;
        }
    }
    if (mprotect((void *)lo, pages, PROT_READ | PROT_WRITE) != 0) {
        return nullptr;
    }
    size_t used = (size + 255) & ~(size_t)255;
    return (void *)(lo + pages - used);
}

void region_free(void *p, size_t size)
{
    size_t pages = (size + kPage - 1) / kPage * kPage;
    uintptr_t lo = ((uintptr_t)p + ((size + 255) & ~(size_t)255)) - pages;
    madvise((void *)lo, pages, MADV_DONTNEED);
    mprotect((void *)lo, pages, PROT_NONE);
    g_free.push_back(range{lo, pages + kPage});
}

} // namespace zr_emu
