/*
 * nccl_ops.cpp - the emulated NCCL's operations (tests/emu, issue 23):
 * ncclSend / ncclRecv, ncclAllGather, ncclReduceScatter, ncclAllReduce,
 * groups, and the host's progress that moves their bytes through MPI
 * (nccl_impl.h says who runs what).
 *
 * A call checks its arguments as NCCL does (a communicator, a peer in range,
 * device memory of the communicator's GPU for every byte it names, a stream
 * of that GPU) and returns ncclInvalidArgument otherwise; inside
 * ncclGroupStart / ncclGroupEnd the calls are kept, and ncclGroupEnd queues
 * one operation per communicator and stream holding them all, so a group's
 * sends and receives progress together (NCCL's rule: without a group, a
 * send and a receive that need each other deadlock). An operation's
 * buffers are accesses for the race detector, like a copy's.
 *
 * The collectives are sends and receives plus local work: an all-gather
 * sends its block to every peer; a reduce-scatter sends block p to peer p
 * and an all-reduce the whole buffer to everyone, and the stream then
 * reduces the blocks in rank order (bf16 in fp32, rounded once). That is not
 * NCCL's algorithm or rounding, which zr never relies on: zr's exact
 * reductions are its own, NCCL's collectives are only its baselines.
 */
#include "nccl_impl.h"
#include "zr_emu.h"

#include "cuda_bf16.h"

namespace zr_emu {

namespace {

constexpr int kDataTag = 1;
constexpr size_t kMaxMessage = (size_t)1 << 30; /* MPI counts are int */

struct call {
    std::shared_ptr<comm_state> comm;
    cudaStream_t stream;
    part p;
};

thread_local int t_group_depth = 0;
thread_local std::vector<call> t_calls;
thread_local ncclResult_t t_group_error = ncclSuccess;

zr_emu_nccl_trace_fn g_trace = nullptr;
void *g_trace_arg = nullptr;

size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8:
        return 1;
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
        return 8;
    default:
        return 0; /* fp16 and fp8 are not emulated */
    }
}

/* ---- reductions, in rank order ------------------------------------------------ */

template <typename T, typename A>
void reduce_as(const std::vector<const char *> &src, char *dst, size_t count, ncclRedOp_t op,
               A (*get)(T), T (*put)(A))
{
    T *out = reinterpret_cast<T *>(dst);
    for (size_t i = 0; i < count; i++) {
        A acc = get(reinterpret_cast<const T *>(src[0])[i]);
        for (size_t p = 1; p < src.size(); p++) {
            A v = get(reinterpret_cast<const T *>(src[p])[i]);
            switch (op) {
            case ncclProd:
                acc = acc * v;
                break;
            case ncclMax:
                acc = v > acc ? v : acc;
                break;
            case ncclMin:
                acc = v < acc ? v : acc;
                break;
            default:
                acc = acc + v;
                break;
            }
        }
        if (op == ncclAvg) {
            acc = acc / (A)src.size();
        }
        out[i] = put(acc);
    }
}

template <typename T> T same(T v)
{
    return v;
}

float bf16_get(uint16_t h)
{
    return bf16_widen(h);
}

uint16_t bf16_put(float f)
{
    return bf16_rn(f);
}

void reduce(ncclDataType_t t, ncclRedOp_t op, size_t count, const std::vector<const char *> &src,
            char *dst)
{
    switch (t) {
    case ncclInt8:
        return reduce_as<int8_t, int8_t>(src, dst, count, op, same, same);
    case ncclUint8:
        return reduce_as<uint8_t, uint8_t>(src, dst, count, op, same, same);
    case ncclInt32:
        return reduce_as<int32_t, int32_t>(src, dst, count, op, same, same);
    case ncclUint32:
        return reduce_as<uint32_t, uint32_t>(src, dst, count, op, same, same);
    case ncclInt64:
        return reduce_as<int64_t, int64_t>(src, dst, count, op, same, same);
    case ncclUint64:
        return reduce_as<uint64_t, uint64_t>(src, dst, count, op, same, same);
    case ncclFloat32:
        return reduce_as<float, float>(src, dst, count, op, same, same);
    case ncclFloat64:
        return reduce_as<double, double>(src, dst, count, op, same, same);
    case ncclBfloat16:
        return reduce_as<uint16_t, float>(src, dst, count, op, bf16_get, bf16_put);
    default:
        return;
    }
}

/* ---- checks ---------------------------------------------------------------------- */

comm_state *state_of(ncclComm_t c)
{
    return c != nullptr ? reinterpret_cast<nccl_handle *>(c)->s.get() : nullptr;
}

/* [p, p+n) lies in device memory of device dev. Under api_mutex. */
bool device_range(const void *p, size_t n, int dev, const char *call, const char *what)
{
    if (n == 0) {
        return true;
    }
    alloc_view v = alloc_find(p);
    if (p == nullptr || v.kind != MEM_DEVICE || v.device != dev ||
        n > v.base + v.size - (uintptr_t)p) {
        nccl_warn("%s: the %s %p (%zu bytes) is not device memory of device %d", call, what, p, n,
                  dev);
        return false;
    }
    return true;
}

/* An argument error: returned, and inside a group remembered for ncclGroupEnd. */
ncclResult_t bad(ncclResult_t r)
{
    if (t_group_depth > 0) {
        t_group_error = r;
    }
    return r;
}

/* The shared checks of a call: the runtime's, the thread, the communicator, the type. */
ncclResult_t enter(const char *name, ncclComm_t comm, ncclDataType_t t, comm_state **s,
                   size_t *esize)
{
    if (api_enter(name) != cudaSuccess) {
        return bad(ncclUnhandledCudaError);
    }
    *s = state_of(comm);
    *esize = type_size(t);
    if (*s == nullptr || *esize == 0) {
        nccl_warn("%s: %s", name, *s == nullptr ? "no communicator" : "data type not emulated");
        return bad(ncclInvalidArgument);
    }
    if (!nccl_on_mpi_thread()) {
        nccl_warn("%s: called from another thread than the first communicator's", name);
        return bad(ncclInvalidUsage);
    }
    return ncclSuccess;
}

/* ---- queueing ----------------------------------------------------------------------- */

/* Queues the calls, one operation per communicator and stream, in the calls' order. */
ncclResult_t submit(std::vector<call> &calls)
{
    std::vector<nccl_op *> ops;
    std::vector<cudaStream_t> streams;
    for (call &c : calls) {
        size_t i = 0;
        while (i < ops.size() && !(ops[i]->comm == c.comm && streams[i] == c.stream)) {
            i++;
        }
        if (i == ops.size()) {
            ops.push_back(new nccl_op);
            ops.back()->comm = c.comm;
            streams.push_back(c.stream);
        }
        ops[i]->parts.push_back(std::move(c.p));
    }
    std::lock_guard<std::mutex> lock(api_mutex());
    std::vector<zr_emu_stream *> ss;
    for (size_t i = 0; i < ops.size(); i++) {
        zr_emu_stream *s = resolve_stream(streams[i]);
        if (s == nullptr || s->device != ops[i]->comm->device) {
            nccl_warn("ncclGroupEnd: stream %p is not a stream of the communicator's device %d",
                      (void *)streams[i], ops[i]->comm->device);
            for (nccl_op *o : ops) {
                delete o;
            }
            return ncclInvalidArgument;
        }
        ss.push_back(s);
    }
    ncclResult_t r = ncclSuccess;
    for (size_t i = 0; i < ops.size(); i++) {
        std::vector<mem_access> acc;
        for (const part &p : ops[i]->parts) {
            acc.insert(acc.end(), p.acc.begin(), p.acc.end());
        }
        std::shared_ptr<comm_state> cs = ops[i]->comm;
        cs->inflight.fetch_add(1);
        if (r != ncclSuccess || enqueue(ss[i], ops[i], "an NCCL operation", acc) != cudaSuccess) {
            cs->inflight.fetch_sub(1); /* enqueue deleted it (a race was reported) */
            if (r != ncclSuccess) {
                delete ops[i];
            }
            r = ncclUnhandledCudaError;
        }
    }
    return r;
}

ncclResult_t add(comm_state *s, cudaStream_t stream, part &&p)
{
    call c{nullptr, stream, std::move(p)};
    for (const auto &cs : nccl_comms()) {
        if (cs.get() == s) {
            c.comm = cs;
        }
    }
    if (c.comm == nullptr) {
        return bad(ncclInvalidArgument); /* destroyed or aborted */
    }
    if (t_group_depth > 0) {
        t_calls.push_back(std::move(c));
        return ncclSuccess;
    }
    std::vector<call> one;
    one.push_back(std::move(c));
    return submit(one);
}

/* ---- the host's progress -------------------------------------------------------------- */

void complete(nccl_op *o, ncclResult_t r)
{
    std::lock_guard<std::mutex> lock(o->m);
    o->result = r;
    o->done = true;
    o->cv.notify_all();
}

void drop_requests(nccl_op *o)
{
    for (MPI_Request &r : o->reqs) {
        if (r != MPI_REQUEST_NULL) {
            MPI_Cancel(&r);
            MPI_Request_free(&r);
        }
    }
    o->reqs.clear();
}

/* Posts the operation's receives, then its sends, in the order of its parts. */
bool post(comm_state &c, nccl_op *o)
{
    for (int pass = 0; pass < 2; pass++) {
        for (const part &p : o->parts) {
            for (const xfer &x : p.xfers) {
                if (x.recv != (pass == 0)) {
                    continue;
                }
                size_t off = 0;
                do {
                    size_t n = std::min(x.bytes - off, kMaxMessage);
                    MPI_Request r;
                    int rc =
                        x.recv
                            ? MPI_Irecv(x.ptr + off, (int)n, MPI_BYTE, x.peer, kDataTag, c.mpi, &r)
                            : MPI_Isend(x.ptr + off, (int)n, MPI_BYTE, x.peer, kDataTag, c.mpi, &r);
                    if (rc != MPI_SUCCESS) {
                        c.async_error.store(ncclSystemError);
                        drop_requests(o);
                        complete(o, ncclSystemError);
                        return false;
                    }
                    o->reqs.push_back(r);
                    off += n;
                } while (off < x.bytes);
            }
        }
    }
    return true;
}

void progress_comm(comm_state &c)
{
    std::deque<nccl_op *> got;
    {
        std::lock_guard<std::mutex> lock(c.mu);
        got.swap(c.ready);
    }
    for (nccl_op *o : got) {
        if (post(c, o)) {
            c.posted.push_back(o);
        }
    }
    for (size_t i = 0; i < c.posted.size();) {
        nccl_op *o = c.posted[i];
        int flag = 1, rc = MPI_SUCCESS;
        if (!o->reqs.empty()) {
            rc = MPI_Testall((int)o->reqs.size(), o->reqs.data(), &flag, MPI_STATUSES_IGNORE);
        }
        if (rc != MPI_SUCCESS || flag) {
            c.posted.erase(c.posted.begin() + (long)i);
            if (rc != MPI_SUCCESS) {
                c.async_error.store(ncclRemoteError); /* a peer went away */
                drop_requests(o);
            }
            o->reqs.clear();
            complete(o, rc == MPI_SUCCESS ? ncclSuccess : ncclRemoteError);
            continue;
        }
        i++;
    }
}

} // namespace

void nccl_op::run()
{
    comm_state &c = *comm;
    if (sticky_error() == cudaSuccess) {
        for (part &p : parts) {
            if (p.before) {
                p.before();
            }
        }
        bool queued = false;
        {
            std::lock_guard<std::mutex> lock(c.mu);
            if (!c.aborted) {
                c.ready.push_back(this);
                queued = true;
            }
        }
        if (queued) {
            std::unique_lock<std::mutex> lock(m);
            cv.wait(lock, [this] { return done; });
            if (result == ncclSuccess) {
                for (part &p : parts) {
                    if (p.after) {
                        p.after();
                    }
                }
            }
        }
    }
    c.inflight.fetch_sub(1);
}

void nccl_progress(void)
{
    if (!nccl_on_mpi_thread() || !nccl_mpi_usable()) {
        return;
    }
    for (const auto &c : nccl_comms()) {
        progress_comm(*c);
    }
}

void nccl_fail_all(comm_state &s, ncclResult_t why)
{
    std::deque<nccl_op *> got;
    {
        std::lock_guard<std::mutex> lock(s.mu);
        s.aborted = true;
        got.swap(s.ready);
    }
    for (nccl_op *o : got) {
        complete(o, why);
    }
    for (nccl_op *o : s.posted) {
        drop_requests(o);
        complete(o, why);
    }
    s.posted.clear();
}

bool nccl_in_group(void)
{
    return t_group_depth > 0;
}

} // namespace zr_emu

using namespace zr_emu;

extern "C" {

void zr_emu_nccl_trace(zr_emu_nccl_trace_fn fn, void *arg)
{
    g_trace = fn;
    g_trace_arg = arg;
}

ncclResult_t ncclGroupStart(void)
{
    t_group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (t_group_depth == 0) {
        return ncclInvalidUsage;
    }
    if (--t_group_depth > 0) {
        return ncclSuccess;
    }
    std::vector<call> calls;
    calls.swap(t_calls);
    ncclResult_t err = t_group_error;
    t_group_error = ncclSuccess;
    if (err != ncclSuccess) {
        return err; /* a call of the group failed: nothing of it is queued */
    }
    return calls.empty() ? ncclSuccess : submit(calls);
}

/* ncclSend and ncclRecv: one transfer. */
static ncclResult_t p2p(const char *name, bool recv, const void *buf, size_t count,
                        ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream)
{
    comm_state *s;
    size_t es;
    ncclResult_t r = enter(name, comm, datatype, &s, &es);
    if (r != ncclSuccess) {
        return r;
    }
    size_t bytes = count * es;
    if (peer < 0 || peer >= s->nranks) {
        nccl_warn("%s: peer %d of %d ranks", name, peer, s->nranks);
        return bad(ncclInvalidArgument);
    }
    {
        std::lock_guard<std::mutex> lock(api_mutex());
        if (!device_range(buf, bytes, s->device, name, "buffer")) {
            return bad(ncclInvalidArgument);
        }
    }
    if (g_trace != nullptr) {
        g_trace(g_trace_arg, name, peer, buf, bytes);
    }
    part p;
    p.xfers.push_back(xfer{peer, recv, const_cast<char *>(static_cast<const char *>(buf)), bytes});
    if (bytes > 0) {
        p.acc.push_back(mem_access{buf, bytes, recv, recv ? "ncclRecv buffer" : "ncclSend buffer"});
    }
    return add(s, stream, std::move(p));
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    return p2p("ncclSend", false, sendbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    return p2p("ncclRecv", true, recvbuff, count, datatype, peer, comm, stream);
}

/* The checks every collective makes: its two buffers, send_bytes and recv_bytes long. */
static ncclResult_t coll_enter(const char *name, ncclComm_t comm, ncclDataType_t datatype,
                               ncclRedOp_t op, const void *send, size_t send_elems, void *recv,
                               size_t recv_elems, comm_state **s, size_t *es)
{
    ncclResult_t r = enter(name, comm, datatype, s, es);
    if (r != ncclSuccess) {
        return r;
    }
    if ((unsigned)op > (unsigned)ncclAvg) {
        return bad(ncclInvalidArgument);
    }
    std::lock_guard<std::mutex> lock(api_mutex());
    if (!device_range(send, send_elems * *es, (*s)->device, name, "send buffer") ||
        !device_range(recv, recv_elems * *es, (*s)->device, name, "receive buffer")) {
        return bad(ncclInvalidArgument);
    }
    return ncclSuccess;
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    comm_state *s;
    size_t es;
    int n = state_of(comm) != nullptr ? state_of(comm)->nranks : 0;
    ncclResult_t r = coll_enter("ncclAllGather", comm, datatype, ncclSum, sendbuff, sendcount,
                                recvbuff, sendcount * (size_t)n, &s, &es);
    if (r != ncclSuccess) {
        return r;
    }
    size_t b = sendcount * es;
    char *recv = static_cast<char *>(recvbuff), *own = recv + (size_t)s->rank * b;
    const char *send = static_cast<const char *>(sendbuff);
    part p;
    if (own != send) {
        p.before = [own, send, b] { memmove(own, send, b); };
    }
    for (int q = 0; q < n; q++) {
        if (q != s->rank) {
            p.xfers.push_back(xfer{q, true, recv + (size_t)q * b, b});
            p.xfers.push_back(xfer{q, false, const_cast<char *>(send), b});
        }
    }
    if (b > 0) {
        p.acc.push_back(mem_access{send, b, false, "ncclAllGather send buffer"});
        p.acc.push_back(mem_access{recv, b * (size_t)n, true, "ncclAllGather receive buffer"});
    }
    return add(s, stream, std::move(p));
}

/* A reduction: block q of every rank's send (block_elems at q * stride) goes to rank q (all
 * to everyone when stride is 0); the stream reduces what arrived in rank order into recv. */
static ncclResult_t reduction(comm_state *s, size_t es, const char *send, char *recv,
                              size_t block_elems, size_t stride_elems, ncclDataType_t t,
                              ncclRedOp_t op, const char *what, cudaStream_t stream)
{
    int n = s->nranks, me = s->rank;
    size_t b = block_elems * es, stride = stride_elems * es;
    size_t send_bytes = stride == 0 ? b : b * (size_t)n;
    part p;
    p.scratch = std::make_shared<std::vector<char>>(b * (size_t)n);
    char *scratch = p.scratch->data();
    for (int q = 0; q < n; q++) {
        if (q != me) {
            p.xfers.push_back(xfer{q, true, scratch + (size_t)q * b, b});
            p.xfers.push_back(xfer{q, false, const_cast<char *>(send) + (size_t)q * stride, b});
        }
    }
    std::shared_ptr<std::vector<char>> keep = p.scratch;
    p.after = [=] {
        std::vector<const char *> src;
        for (int q = 0; q < n; q++) {
            src.push_back(q == me ? send + (size_t)me * stride : keep->data() + (size_t)q * b);
        }
        std::vector<char> out(b);
        reduce(t, op, block_elems, src, out.data());
        memcpy(recv, out.data(), b);
    };
    if (b > 0) {
        p.acc.push_back(mem_access{send, send_bytes, false, what});
        p.acc.push_back(mem_access{recv, b, true, what});
    }
    return add(s, stream, std::move(p));
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream)
{
    comm_state *s;
    size_t es;
    int n = state_of(comm) != nullptr ? state_of(comm)->nranks : 0;
    ncclResult_t r = coll_enter("ncclReduceScatter", comm, datatype, op, sendbuff,
                                recvcount * (size_t)n, recvbuff, recvcount, &s, &es);
    if (r != ncclSuccess) {
        return r;
    }
    return reduction(s, es, static_cast<const char *>(sendbuff), static_cast<char *>(recvbuff),
                     recvcount, recvcount, datatype, op, "ncclReduceScatter buffer", stream);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream)
{
    comm_state *s;
    size_t es;
    ncclResult_t r =
        coll_enter("ncclAllReduce", comm, datatype, op, sendbuff, count, recvbuff, count, &s, &es);
    if (r != ncclSuccess) {
        return r;
    }
    return reduction(s, es, static_cast<const char *>(sendbuff), static_cast<char *>(recvbuff),
                     count, 0, datatype, op, "ncclAllReduce buffer", stream);
}

} /* extern "C" */
