/*
 * race.cpp - the GPU emulator's allocation table and its race detector
 * between streams (tests/emu, issue 23).
 *
 * For every device and pinned allocation the emulator keeps the recent
 * accesses of queued operations: which stream, which of its operations (the
 * count), read or write, which bytes. When an operation is queued, each of
 * its accesses is compared with the recorded accesses of other streams to
 * overlapping bytes where at least one side writes; if the new operation's
 * vector clock (stream.cpp) does not cover the earlier one, nothing orders
 * them - the two may run at the same time on a GPU - and that is a loud
 * error naming both operations, both streams and the allocation. The
 * decision depends only on the order of the program's calls, so a test that
 * drops an event wait fails on every run.
 *
 * What an operation accesses:
 *   - a copy reads its source bytes and writes its destination bytes, a
 *     memset writes its bytes (exact ranges);
 *   - a kernel accesses, through each pointer argument into a tracked
 *     allocation, the element that pointer points at: `const T *` reads it,
 *     `T *` writes it (the launch template knows the parameter types, not
 *     how far the kernel goes). Two operations on the same buffer through
 *     the same pointer, or a copy over a range that holds a kernel's
 *     pointer, are compared; a kernel that reaches, through an offset, bytes
 *     another stream uses through another pointer is not seen here.
 * Pointers hidden inside structs are not seen either.
 *
 * Records are dropped once the host has seen their operation complete
 * (nothing queued later can be unordered with them), and a newer access of
 * the same stream that covers an older one replaces it.
 */
#include "emu.h"

#include <deque>
#include <map>

namespace zr_emu {

namespace {

struct record {
    const zr_emu_stream *stream;
    uint64_t seq;
    bool write;
    uintptr_t lo, hi;
    std::shared_ptr<const std::string> what; /* "kernel 'k' argument 1 (float *)" */
};

struct alloc {
    uintptr_t base;
    size_t size;
    mem_kind kind;
    int device;
    uint64_t serial;
    std::vector<record> recs;
};

struct freed_alloc {
    uintptr_t base;
    size_t size;
    mem_kind kind;
    uint64_t serial;
};

/* under api_mutex */
std::map<uintptr_t, alloc *> g_allocs;
std::deque<freed_alloc> g_freed; /* the most recent frees, for use-after-free messages */
uint64_t g_serial;
constexpr size_t kMaxFreed = 4096;
constexpr size_t kMaxRecords = 4096; /* per allocation; the oldest go first */

alloc *find(uintptr_t p, bool *at_end)
{
    if (at_end != nullptr) {
        *at_end = false;
    }
    auto it = g_allocs.upper_bound(p);
    if (it == g_allocs.begin()) {
        return nullptr;
    }
    --it;
    alloc *a = it->second;
    if (p < a->base + a->size) {
        return a;
    }
    if (p == a->base + a->size && at_end != nullptr) {
        *at_end = true;
    }
    return nullptr;
}

const char *kind_name(mem_kind k)
{
    return k == MEM_DEVICE ? "device" : "pinned host";
}

} // namespace

std::string stream_name(const zr_emu_stream *s)
{
    char buf[96];
    if (s->legacy) {
        snprintf(buf, sizeof buf, "the default stream (0) of device %d", s->device);
    } else {
        snprintf(buf, sizeof buf, "stream %u (cudaStream_t %p%s)", s->id, (const void *)s,
                 s->nonblocking ? ", non-blocking" : "");
    }
    return buf;
}

void alloc_add(void *p, size_t size, mem_kind kind, int device)
{
    auto *a = new alloc;
    a->base = (uintptr_t)p;
    a->size = size;
    a->kind = kind;
    a->device = device;
    a->serial = ++g_serial;
    g_allocs[a->base] = a;
    for (size_t i = 0; i < g_freed.size();) {
        const freed_alloc &f = g_freed[i];
        if (f.base < a->base + size && a->base < f.base + f.size) {
            g_freed.erase(g_freed.begin() + (long)i); /* the address is in use again */
        } else {
            i++;
        }
    }
}

bool alloc_remove(void *p, mem_kind kind, size_t *size_out)
{
    auto it = g_allocs.find((uintptr_t)p);
    if (it == g_allocs.end() || it->second->kind != kind) {
        return false;
    }
    alloc *a = it->second;
    *size_out = a->size;
    g_freed.push_back(freed_alloc{a->base, a->size, a->kind, a->serial});
    if (g_freed.size() > kMaxFreed) {
        g_freed.pop_front();
    }
    g_allocs.erase(it);
    delete a;
    return true;
}

alloc_view alloc_find(const void *p, bool *at_end)
{
    alloc *a = find((uintptr_t)p, at_end);
    if (a == nullptr) {
        return alloc_view{MEM_PAGEABLE, -1, 0, 0, 0};
    }
    return alloc_view{a->kind, a->device, a->base, a->size, a->serial};
}

std::string alloc_freed_note(const void *p)
{
    uintptr_t u = (uintptr_t)p;
    for (auto it = g_freed.rbegin(); it != g_freed.rend(); ++it) {
        if (u >= it->base && u < it->base + it->size) {
            char buf[160];
            snprintf(buf, sizeof buf, "freed %s memory (allocation #%llu of %zu bytes at %#lx)",
                     kind_name(it->kind), (unsigned long long)it->serial, it->size,
                     (unsigned long)it->base);
            return buf;
        }
    }
    return "";
}

void race_reset(void)
{
    for (auto &kv : g_allocs) {
        kv.second->recs.clear();
    }
}

static void report_race(const alloc *a, const zr_emu_stream *s, uint64_t seq, const char *what,
                        const mem_access &x, uintptr_t lo, uintptr_t hi, const record &r)
{
    emu_error("race between streams on %s memory (allocation #%llu, %zu bytes at %#lx):\n"
              "    %s on %s (its operation #%llu) %s bytes [%lu, %lu) through its %s,\n"
              "    and %s on %s (its operation #%llu) %s bytes [%lu, %lu);\n"
              "    nothing orders them (no cudaStreamWaitEvent on an event recorded after the "
              "earlier one, no host synchronisation in between, no stream-0 ordering), so on a "
              "GPU they may run at the same time",
              kind_name(a->kind), (unsigned long long)a->serial, a->size, (unsigned long)a->base,
              what, stream_name(s).c_str(), (unsigned long long)seq, x.write ? "writes" : "reads",
              (unsigned long)(lo - a->base), (unsigned long)(hi - a->base), x.what.c_str(),
              r.what->c_str(), stream_name(r.stream).c_str(), (unsigned long long)r.seq,
              r.write ? "writes" : "reads", (unsigned long)(r.lo - a->base),
              (unsigned long)(r.hi - a->base));
}

bool race_check_and_record(const zr_emu_stream *s, uint64_t seq, const vclock &c, const char *what,
                           const std::vector<mem_access> &acc, const vclock &host)
{
    std::vector<std::pair<alloc *, std::pair<uintptr_t, uintptr_t>>> spans;
    for (const mem_access &x : acc) {
        alloc *a = find((uintptr_t)x.ptr, nullptr);
        if (a == nullptr) {
            spans.push_back(std::make_pair(nullptr, std::make_pair(0, 0)));
            continue;
        }
        uintptr_t lo = (uintptr_t)x.ptr;
        uintptr_t hi = lo + std::min(x.bytes, (size_t)(a->base + a->size - lo));
        spans.push_back(std::make_pair(a, std::make_pair(lo, hi)));
        auto &recs = a->recs;
        for (size_t i = 0; i < recs.size();) {
            const record &r = recs[i];
            if (host.get(r.stream->id) >= r.seq) {
                recs.erase(recs.begin() + (long)i); /* complete: ordered before anything new */
                continue;
            }
            if (r.stream != s && (r.write || x.write) && lo < r.hi && r.lo < hi &&
                c.get(r.stream->id) < r.seq) {
                report_race(a, s, seq, what, x, lo, hi, r);
                return false;
            }
            i++;
        }
    }
    for (size_t k = 0; k < acc.size(); k++) {
        alloc *a = spans[k].first;
        if (a == nullptr) {
            continue;
        }
        uintptr_t lo = spans[k].second.first, hi = spans[k].second.second;
        const mem_access &x = acc[k];
        auto &recs = a->recs;
        for (size_t i = 0; i < recs.size();) {
            const record &r = recs[i];
            if (r.stream == s && r.lo >= lo && r.hi <= hi && (x.write || !r.write)) {
                recs.erase(recs.begin() + (long)i);
            } else {
                i++;
            }
        }
        if (recs.size() >= kMaxRecords) {
            recs.erase(recs.begin());
        }
        auto desc = std::make_shared<const std::string>(std::string(what) + " (" + x.what + ")");
        recs.push_back(record{s, seq, x.write, lo, hi, desc});
    }
    return true;
}

} // namespace zr_emu
