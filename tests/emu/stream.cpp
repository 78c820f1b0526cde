/*
 * stream.cpp - the GPU emulator's streams and events (tests/emu, issue 23).
 *
 * Every stream, the legacy default stream of each device included, has a
 * worker thread that executes its queue in order, really concurrently with
 * the host and with the other streams: a missing wait is a real race here,
 * not one that serial execution hides.
 *
 * Order is kept as vector clocks, one entry per stream: a stream's clock says
 * how many operations of every stream its next operation comes after. Each
 * queued operation takes its stream's clock and ticks its own entry; an event
 * record copies it; cudaStreamWaitEvent merges the event's copy into the
 * waiting stream; the legacy stream merges every blocking stream of its
 * device, and a blocking stream merges the legacy stream (CUDA's implicit
 * synchronisation through stream 0); and everything the host has seen
 * complete (a synchronisation, a successful query, a synchronous copy) is
 * merged into every operation it queues afterwards. The same clock drives
 * both halves of the emulator:
 *   - execution: the worker starts an operation only when every stream has
 *     completed as many operations as the clock names;
 *   - race detection (race.cpp): an operation is ordered after an earlier
 *     one of another stream iff its clock covers that operation, which is a
 *     property of the program, decided when the operation is queued, and so
 *     the same on every run whatever the threads' timing.
 */
#include "emu.h"

#include <thread>
#include <unordered_set>

namespace zr_emu {

std::atomic<void (*)(void)> host_progress{nullptr};

/* ---- vector clocks --------------------------------------------------------------- */

uint64_t vclock::get(uint32_t id) const
{
    size_t lo = 0, hi = e.size();
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (e[mid].first < id) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo < e.size() && e[lo].first == id ? e[lo].second : 0;
}

void vclock::set(uint32_t id, uint64_t v)
{
    for (size_t i = 0; i < e.size(); i++) {
        if (e[i].first == id) {
            e[i].second = v;
            return;
        }
        if (e[i].first > id) {
            e.insert(e.begin() + (long)i, std::make_pair(id, v));
            return;
        }
    }
    e.push_back(std::make_pair(id, v));
}

void vclock::merge(const vclock &o)
{
    std::vector<std::pair<uint32_t, uint64_t>> out;
    out.reserve(e.size() + o.e.size());
    size_t i = 0, j = 0;
    while (i < e.size() || j < o.e.size()) {
        if (j == o.e.size() || (i < e.size() && e[i].first < o.e[j].first)) {
            out.push_back(e[i++]);
        } else if (i == e.size() || o.e[j].first < e[i].first) {
            out.push_back(o.e[j++]);
        } else {
            out.push_back(std::make_pair(e[i].first, std::max(e[i].second, o.e[j].second)));
            i++;
            j++;
        }
    }
    e.swap(out);
}

/* ---- the registry (host side, under api_mutex) ------------------------------------ */

namespace {

struct registry {
    std::vector<zr_emu_stream *> all; /* by id; streams are never freed */
    std::unordered_set<zr_emu_stream *> live;
    std::unordered_set<zr_emu_event *> events;
    std::vector<zr_emu_stream *> legacy;                /* per device, made on first use */
    std::vector<std::vector<zr_emu_stream *>> blocking; /* per device */
    vclock host; /* every operation the host has seen complete */
};

registry &R(void)
{
    static registry *r = new registry; /* never destroyed: workers outlive exit */
    return *r;
}

thread_local bool t_worker = false; /* a stream's worker thread: it never runs host_progress */

void worker_main(zr_emu_stream *s, op *cur)
{
    t_worker = true;
    for (;;) {
        op *n = cur->next.load(std::memory_order_acquire);
        if (n == nullptr) {
            uint32_t seen = s->pushed.v.load(std::memory_order_acquire);
            n = cur->next.load(std::memory_order_acquire);
            if (n == nullptr) {
                s->pushed.wait(seen);
                continue;
            }
        }
        delete cur;
        cur = n;
        for (const auto &d : n->deps) {
            wait_completed(d.first, d.second);
        }
        n->run();
        bool stop = n->stop;
        s->completed.store(n->seq, std::memory_order_release);
        s->done_word.bump();
        if (stop) {
            delete n;
            return;
        }
    }
}

zr_emu_stream *new_stream(int device, bool legacy, bool nonblocking)
{
    registry &r = R();
    auto *s = new zr_emu_stream;
    s->id = (uint32_t)r.all.size();
    s->device = device;
    s->legacy = legacy;
    s->nonblocking = nonblocking;
    op *dummy = new op;
    s->tail = dummy;
    r.all.push_back(s);
    if ((int)r.blocking.size() <= device) {
        r.blocking.resize((size_t)device + 1);
        r.legacy.resize((size_t)device + 1, nullptr);
    }
    if (!legacy && !nonblocking) {
        r.blocking[(size_t)device].push_back(s);
    }
    std::thread(worker_main, s, dummy).detach();
    return s;
}

zr_emu_stream *legacy_stream(int device)
{
    registry &r = R();
    if ((int)r.legacy.size() <= device || r.legacy[(size_t)device] == nullptr) {
        zr_emu_stream *s = new_stream(device, true, false);
        r.legacy[(size_t)device] = s;
    }
    return r.legacy[(size_t)device];
}

void push(zr_emu_stream *s, op *o)
{
    s->tail->next.store(o, std::memory_order_release);
    s->tail = o;
    s->pushed.bump();
}

struct record_op : op {
    std::shared_ptr<double> stamp;
    void run() override
    {
        *stamp = now_ms();
    }
};

struct host_fn_op : op {
    cudaHostFn_t fn;
    void *data;
    void run() override
    {
        if (sticky_error() != cudaSuccess) {
            return;
        }
        t_in_host_fn = true;
        fn(data);
        t_in_host_fn = false;
    }
};

/* A synchronisation target: wait until the stream completed `seq`, then the
 * host knows `clock`. */
struct target {
    zr_emu_stream *s;
    uint64_t seq;
    vclock clock;
};

/* What synchronising with stream s covers: s itself; for the legacy stream
 * also every blocking stream of its device. Under api_mutex. */
std::vector<target> targets_of(zr_emu_stream *s)
{
    std::vector<target> t{target{s, s->enqueued, s->clock}};
    if (s->legacy) {
        for (zr_emu_stream *b : R().blocking[(size_t)s->device]) {
            t.push_back(target{b, b->enqueued, b->clock});
        }
    }
    return t;
}

bool wait_completed_for(zr_emu_stream *s, uint64_t seq, double timeout_s)
{
    double t0 = now_ms();
    /* a host wait keeps the emulated NCCL's bytes moving, a millisecond at a time */
    void (*progress)(void) = t_worker ? nullptr : host_progress.load();
    while (s->completed.load(std::memory_order_acquire) < seq) {
        if (progress != nullptr) {
            progress();
        }
        uint32_t w = s->done_word.v.load(std::memory_order_acquire);
        if (s->completed.load(std::memory_order_acquire) >= seq) {
            break;
        }
        if (timeout_s > 0 && now_ms() - t0 > timeout_s * 1000.0) {
            return false;
        }
        s->done_word.wait(w, progress != nullptr ? 0.001 : timeout_s > 0 ? 0.1 : 0);
    }
    return true;
}

/* Waits for the targets without api_mutex, then tells the host. */
void sync_targets(std::unique_lock<std::mutex> &lock, const std::vector<target> &ts,
                  double timeout_s = 0)
{
    lock.unlock();
    bool all = true;
    for (const target &t : ts) {
        all = wait_completed_for(t.s, t.seq, timeout_s) && all;
    }
    lock.lock();
    if (all) {
        for (const target &t : ts) {
            host_learns(t.clock);
        }
    }
}

/* True when every target is complete; the host then knows their clocks. A
 * query that says "not ready" must not order anything for ThreadSanitizer
 * either, hence the relaxed load first. */
bool query_targets(const std::vector<target> &ts)
{
    for (const target &t : ts) {
        if (t.s->completed.load(std::memory_order_relaxed) < t.seq) {
            return false;
        }
    }
    for (const target &t : ts) {
        (void)t.s->completed.load(std::memory_order_acquire);
        host_learns(t.clock);
    }
    return true;
}

/* Under api_mutex. */
zr_emu_event *resolve_event(cudaEvent_t e)
{
    return e != nullptr && R().events.count(e) != 0 ? e : nullptr;
}

cudaError_t enqueue_after(zr_emu_stream *s, op *o, const char *what,
                          const std::vector<mem_access> &acc, const vclock *extra,
                          vclock *clock_out)
{
    registry &r = R();
    vclock c = s->clock;
    c.merge(r.host);
    if (extra != nullptr) {
        c.merge(*extra);
    }
    if (s->legacy) {
        std::vector<zr_emu_stream *> &bl = r.blocking[(size_t)s->device];
        for (size_t i = 0; i < bl.size();) {
            zr_emu_stream *b = bl[i];
            if (b->destroyed && r.host.get(b->id) >= b->enqueued) {
                bl.erase(bl.begin() + (long)i); /* done, and nothing will follow */
                continue;
            }
            c.merge(b->clock);
            i++;
        }
    } else if (!s->nonblocking && (int)r.legacy.size() > s->device &&
               r.legacy[(size_t)s->device] != nullptr) {
        c.merge(r.legacy[(size_t)s->device]->clock);
    }
    uint64_t seq = s->enqueued + 1;
    c.set(s->id, seq);
    if (!acc.empty() && !race_check_and_record(s, seq, c, what, acc, r.host)) {
        delete o;
        return cudaErrorLaunchFailure;
    }
    s->clock = c;
    s->enqueued = seq;
    o->seq = seq;
    for (const auto &kv : c.e) {
        if (kv.first != s->id && r.host.get(kv.first) < kv.second) {
            o->deps.push_back(std::make_pair(r.all[kv.first], kv.second));
        }
    }
    if (clock_out != nullptr) {
        *clock_out = c;
    }
    push(s, o);
    return cudaSuccess;
}

} // namespace

zr_emu_stream *resolve_stream(cudaStream_t h)
{
    int dev = current_device();
    if (h == nullptr || h == cudaStreamLegacy) {
        return legacy_stream(dev);
    }
    if (R().live.count(h) == 0 || h->device != dev) {
        return nullptr;
    }
    return h;
}

cudaError_t enqueue(zr_emu_stream *s, op *o, const char *what, const std::vector<mem_access> &acc,
                    vclock *clock_out)
{
    return enqueue_after(s, o, what, acc, nullptr, clock_out);
}

void wait_completed(zr_emu_stream *s, uint64_t seq)
{
    wait_completed_for(s, seq, 0);
}

void host_learns(const vclock &c)
{
    R().host.merge(c);
}

void sync_device(int device, double timeout_s)
{
    std::unique_lock<std::mutex> lock(api_mutex());
    std::vector<target> ts;
    for (zr_emu_stream *s : R().all) {
        if ((device < 0 || s->device == device) && s->enqueued > R().host.get(s->id)) {
            ts.push_back(target{s, s->enqueued, s->clock});
        }
    }
    sync_targets(lock, ts, timeout_s);
}

} // namespace zr_emu

using namespace zr_emu;

extern "C" {

/* ---- streams ------------------------------------------------------------------------ */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    ZR_EMU_ENTER("cudaStreamCreateWithFlags");
    if (pStream == nullptr || (flags & ~(unsigned)cudaStreamNonBlocking) != 0) {
        return set_last_error(cudaErrorInvalidValue);
    }
    std::lock_guard<std::mutex> lock(api_mutex());
    zr_emu_stream *s = new_stream(current_device(), false, (flags & cudaStreamNonBlocking) != 0);
    R().live.insert(s);
    *pStream = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
    return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}

/* Returns at once; the worker finishes the queue, then stops (as CUDA). */
cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    ZR_EMU_ENTER("cudaStreamDestroy");
    std::lock_guard<std::mutex> lock(api_mutex());
    if (stream == nullptr || R().live.count(stream) == 0) {
        return set_last_error(cudaErrorInvalidResourceHandle);
    }
    op *o = new op;
    o->stop = true;
    cudaError_t e = enqueue(stream, o, "cudaStreamDestroy", {});
    R().live.erase(stream);
    stream->destroyed = true;
    return set_last_error(e);
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    ZR_EMU_ENTER("cudaStreamSynchronize");
    std::unique_lock<std::mutex> lock(api_mutex());
    zr_emu_stream *s = resolve_stream(stream);
    if (s == nullptr) {
        return set_last_error(cudaErrorInvalidResourceHandle);
    }
    sync_targets(lock, targets_of(s));
    return set_last_error(sticky_error());
}

/* Runs the host's owed progress (host_progress) before a query looks. */
static void query_progress(void)
{
    void (*progress)(void) = host_progress.load();
    if (progress != nullptr) {
        progress();
    }
}

cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    ZR_EMU_ENTER("cudaStreamQuery");
    query_progress();
    std::lock_guard<std::mutex> lock(api_mutex());
    zr_emu_stream *s = resolve_stream(stream);
    if (s == nullptr) {
        return set_last_error(cudaErrorInvalidResourceHandle);
    }
    return query_targets(targets_of(s)) ? sticky_error() : cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    ZR_EMU_ENTER("cudaStreamWaitEvent");
    if (flags != 0) {
        return set_last_error(cudaErrorInvalidValue);
    }
    std::lock_guard<std::mutex> lock(api_mutex());
    zr_emu_stream *s = resolve_stream(stream);
    zr_emu_event *e = resolve_event(event);
    if (s == nullptr || e == nullptr) {
        return set_last_error(cudaErrorInvalidResourceHandle);
    }
    if (!e->recorded) {
        return cudaSuccess; /* CUDA: a wait on an event never recorded is a no-op */
    }
    return set_last_error(enqueue_after(s, new op, "cudaStreamWaitEvent", {}, &e->clock, nullptr));
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData)
{
    ZR_EMU_ENTER("cudaLaunchHostFunc");
    if (fn == nullptr) {
        return set_last_error(cudaErrorInvalidValue);
    }
    std::lock_guard<std::mutex> lock(api_mutex());
    zr_emu_stream *s = resolve_stream(stream);
    if (s == nullptr) {
        return set_last_error(cudaErrorInvalidResourceHandle);
    }
    auto *o = new host_fn_op;
    o->fn = fn;
    o->data = userData;
    return set_last_error(enqueue(s, o, "cudaLaunchHostFunc", {}));
}

cudaError_t cudaDeviceSynchronize(void)
{
    ZR_EMU_ENTER("cudaDeviceSynchronize");
    sync_device(current_device());
    return set_last_error(sticky_error());
}

/* ---- events ----------------------------------------------------------------------- */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    ZR_EMU_ENTER("cudaEventCreateWithFlags");
    if (event == nullptr || (flags & ~0x7u) != 0) {
        return set_last_error(cudaErrorInvalidValue);
    }
    std::lock_guard<std::mutex> lock(api_mutex());
    auto *e = new zr_emu_event;
    e->flags = flags;
    e->device = current_device();
    R().events.insert(e);
    *event = e;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    ZR_EMU_ENTER("cudaEventDestroy");
    std::lock_guard<std::mutex> lock(api_mutex());
    if (resolve_event(event) == nullptr) {
        return set_last_error(cudaErrorInvalidResourceHandle);
    }
    R().events.erase(event);
    delete event; /* queued records hold only their time stamp */
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    ZR_EMU_ENTER("cudaEventRecord");
    std::lock_guard<std::mutex> lock(api_mutex());
    zr_emu_stream *s = resolve_stream(stream);
    zr_emu_event *e = resolve_event(event);
    if (s == nullptr || e == nullptr || e->device != s->device) {
        return set_last_error(cudaErrorInvalidResourceHandle);
    }
    auto *o = new record_op;
    o->stamp = std::make_shared<double>(0.0);
    std::shared_ptr<double> stamp = o->stamp;
    vclock c;
    cudaError_t err = enqueue(s, o, "cudaEventRecord", {}, &c);
    if (err != cudaSuccess) {
        return set_last_error(err);
    }
    e->recorded = true;
    e->stream = s;
    e->seq = c.get(s->id);
    e->clock = c;
    e->stamp = stamp;
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    ZR_EMU_ENTER("cudaEventQuery");
    query_progress();
    std::lock_guard<std::mutex> lock(api_mutex());
    zr_emu_event *e = resolve_event(event);
    if (e == nullptr) {
        return set_last_error(cudaErrorInvalidResourceHandle);
    }
    if (!e->recorded) {
        return cudaSuccess;
    }
    return query_targets({target{e->stream, e->seq, e->clock}}) ? sticky_error()
                                                                : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    ZR_EMU_ENTER("cudaEventSynchronize");
    std::unique_lock<std::mutex> lock(api_mutex());
    zr_emu_event *e = resolve_event(event);
    if (e == nullptr) {
        return set_last_error(cudaErrorInvalidResourceHandle);
    }
    if (e->recorded) {
        sync_targets(lock, {target{e->stream, e->seq, e->clock}});
    }
    return set_last_error(sticky_error());
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    ZR_EMU_ENTER("cudaEventElapsedTime");
    if (ms == nullptr) {
        return set_last_error(cudaErrorInvalidValue);
    }
    std::lock_guard<std::mutex> lock(api_mutex());
    zr_emu_event *a = resolve_event(start), *b = resolve_event(end);
    if (a == nullptr || b == nullptr || !a->recorded || !b->recorded ||
        ((a->flags | b->flags) & cudaEventDisableTiming) != 0 || a->device != b->device) {
        return set_last_error(cudaErrorInvalidResourceHandle);
    }
    if (!query_targets(
            {target{a->stream, a->seq, a->clock}, target{b->stream, b->seq, b->clock}})) {
        return set_last_error(cudaErrorNotReady);
    }
    *ms = (float)(*b->stamp - *a->stamp);
    return cudaSuccess;
}

} /* extern "C" */
