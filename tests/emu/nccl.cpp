/*
 * nccl.cpp - the emulated NCCL's communicators (tests/emu, issue 23): the
 * unique id, the bootstrap that turns it into an MPI communicator, splits,
 * the shared-GPU check, finalize / destroy / abort, asynchronous errors.
 *
 * The unique id carries what the ranks that call ncclCommInitRank with it
 * need to find each other: the world rank of its creator (the root) and a
 * serial number. Each member sends the root its world rank, NCCL rank,
 * device and host over MPI_COMM_WORLD (tag 29000 + serial % 1000); the root
 * answers everyone with the whole table; then every member checks the table
 * the same way (so they fail or succeed together) and the members build
 * their MPI communicator with MPI_Comm_create_group, ranks in NCCL's order.
 * A split is MPI_Comm_split of the parent's communicator.
 *
 * Two ranks on one GPU: NCCL 2.5 to 2.29 refuse them with ncclInvalidUsage
 * ("Duplicate GPU detected"); 2.30 still does unless
 * NCCL_MULTI_RANK_GPU_ENABLE=1. The emulator does the same for the version
 * it reports (ZR_EMU_NCCL_VERSION), where a GPU is (host, device ordinal)
 * and the host of a rank is its emulated node when ZR_RANKS_PER_NODE is set
 * (as NCCL_HOSTID overrides NCCL's), else the machine.
 */
#include "nccl_impl.h"

#include <unistd.h>

#include <cstdarg>
#include <thread>

namespace zr_emu {

namespace {

constexpr char kMagic[8] = "zrnccl1";
constexpr int kBootTag = 29000;

struct id_payload {
    char magic[8];
    int root; /* world rank of the creator */
    unsigned serial;
};

struct member {
    int world, rank, nranks, device;
    uint64_t host;
};

std::mutex g_mu; /* the registry and the MPI thread's identity */
std::vector<std::shared_ptr<comm_state>> g_comms;
std::atomic<bool> g_have_thread{false};
std::thread::id g_thread;
unsigned g_serial;

uint64_t fnv(const char *s, uint64_t h)
{
    for (; *s != '\0'; s++) {
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    }
    return h;
}

/* This rank's host: the emulated node of ZR_RANKS_PER_NODE, else the machine. */
uint64_t host_key(int world)
{
    char name[256] = "";
    gethostname(name, sizeof name - 1);
    uint64_t h = fnv(name, 1469598103934665603ull);
    const char *rpn = getenv("ZR_RANKS_PER_NODE");
    long d = rpn != nullptr ? strtol(rpn, nullptr, 10) : 0;
    if (d > 0) {
        h = (h ^ (uint64_t)(world / d + 1)) * 1099511628211ull;
    }
    return h;
}

/* Two members on one GPU NCCL cannot run: ncclInvalidUsage, as NCCL says it. */
ncclResult_t check_members(const std::vector<member> &t)
{
    for (size_t i = 0; i < t.size(); i++) {
        if (t[i].rank != (int)i || t[i].nranks != (int)t.size()) {
            nccl_warn("ncclCommInitRank: ranks disagree on the communicator (rank %d of %d)",
                      t[i].rank, t[i].nranks);
            return ncclInvalidUsage;
        }
    }
    const char *multi = getenv("NCCL_MULTI_RANK_GPU_ENABLE");
    bool allowed = nccl_version() >= 23000 && multi != nullptr && strcmp(multi, "1") == 0;
    for (size_t i = 0; i < t.size() && !allowed; i++) {
        for (size_t j = 0; j < i; j++) {
            if (t[i].host == t[j].host && t[i].device == t[j].device) {
                nccl_warn("Duplicate GPU detected : rank %d and rank %d both on CUDA device %x",
                          t[i].rank, t[j].rank, 0x10 + t[i].device);
                return ncclInvalidUsage;
            }
        }
    }
    return ncclSuccess;
}

/* The root collects every member's line and sends the table back; members send theirs. */
ncclResult_t exchange_members(const id_payload &id, const member &me, std::vector<member> &t)
{
    int tag = kBootTag + (int)(id.serial % 1000);
    int n = me.nranks;
    t.assign((size_t)n, member{-1, -1, -1, -1, 0});
    if (me.world != id.root) {
        if (MPI_Send(&me, (int)sizeof me, MPI_BYTE, id.root, tag, MPI_COMM_WORLD) != MPI_SUCCESS ||
            MPI_Recv(t.data(), (int)(sizeof me * t.size()), MPI_BYTE, id.root, tag, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE) != MPI_SUCCESS) {
            return ncclSystemError;
        }
        return ncclSuccess;
    }
    std::vector<int> from;
    t[(size_t)me.rank] = me;
    for (int i = 1; i < n; i++) {
        member m;
        MPI_Status st;
        if (MPI_Recv(&m, (int)sizeof m, MPI_BYTE, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, &st) !=
            MPI_SUCCESS) {
            return ncclSystemError;
        }
        from.push_back(st.MPI_SOURCE);
        if (m.rank >= 0 && m.rank < n && t[(size_t)m.rank].world < 0) {
            t[(size_t)m.rank] = m;
        } else {
            t[(size_t)me.rank].nranks = -1; /* a duplicate or bad rank: everyone fails */
        }
    }
    for (int w : from) {
        if (MPI_Send(t.data(), (int)(sizeof me * t.size()), MPI_BYTE, w, tag, MPI_COMM_WORLD) !=
            MPI_SUCCESS) {
            return ncclSystemError;
        }
    }
    return ncclSuccess;
}

ncclResult_t make_handle(MPI_Comm mpi, int device, ncclComm_t *out)
{
    auto s = std::make_shared<comm_state>();
    s->mpi = mpi;
    MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN);
    MPI_Comm_rank(mpi, &s->rank);
    MPI_Comm_size(mpi, &s->nranks);
    s->device = device;
    nccl_register(s);
    auto *h = new nccl_handle;
    h->s = s;
    *out = reinterpret_cast<ncclComm_t>(h);
    return ncclSuccess;
}

comm_state *state_of(ncclComm_t c)
{
    return c != nullptr ? reinterpret_cast<nccl_handle *>(c)->s.get() : nullptr;
}

/* Drives the host's progress until s has nothing in flight. */
void drain(comm_state &s)
{
    while (s.inflight.load() > 0) {
        nccl_progress();
        std::this_thread::yield();
    }
}

void release(ncclComm_t comm)
{
    auto *h = reinterpret_cast<nccl_handle *>(comm);
    nccl_unregister(h->s.get());
    if (h->s->mpi != MPI_COMM_NULL && nccl_mpi_usable()) {
        MPI_Comm_free(&h->s->mpi);
    }
    delete h;
}

} // namespace

bool nccl_mpi_usable(void)
{
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}

int nccl_version(void)
{
    static int v = [] {
        const char *s = getenv("ZR_EMU_NCCL_VERSION");
        long x = s != nullptr ? strtol(s, nullptr, 10) : 0;
        return x > 0 ? (int)x : NCCL_VERSION_CODE;
    }();
    return v;
}

void nccl_warn(const char *fmt, ...)
{
    if (getenv("NCCL_DEBUG") == nullptr) {
        return;
    }
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "zr-emu NCCL WARN %s\n", buf);
}

bool nccl_on_mpi_thread(void)
{
    if (!g_have_thread.load(std::memory_order_acquire)) {
        return false;
    }
    return std::this_thread::get_id() == g_thread;
}

void nccl_claim_mpi_thread(void)
{
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_have_thread.load()) {
        g_thread = std::this_thread::get_id();
        g_have_thread.store(true, std::memory_order_release);
        host_progress.store(nccl_progress);
    }
}

void nccl_register(const std::shared_ptr<comm_state> &s)
{
    std::lock_guard<std::mutex> lock(g_mu);
    g_comms.push_back(s);
}

void nccl_unregister(const comm_state *s)
{
    std::lock_guard<std::mutex> lock(g_mu);
    for (size_t i = 0; i < g_comms.size(); i++) {
        if (g_comms[i].get() == s) {
            g_comms.erase(g_comms.begin() + (long)i);
            return;
        }
    }
}

/* The registered communicators, for one round of progress. */
std::vector<std::shared_ptr<comm_state>> nccl_comms(void)
{
    std::lock_guard<std::mutex> lock(g_mu);
    return g_comms;
}

} // namespace zr_emu

using namespace zr_emu;

/* The first lines of a call that touches the device: the runtime's checks, the MPI thread. */
#define NCCL_ENTER(call)                                                                           \
    do {                                                                                           \
        if (api_enter(call) != cudaSuccess) {                                                      \
            return ncclUnhandledCudaError;                                                         \
        }                                                                                          \
        if (!nccl_mpi_usable()) {                                                                  \
            nccl_warn("%s: the emulated NCCL runs over MPI: MPI is not initialised", call);        \
            return ncclSystemError;                                                                \
        }                                                                                          \
        nccl_claim_mpi_thread();                                                                   \
        if (!nccl_on_mpi_thread()) {                                                               \
            nccl_warn("%s: called from another thread than the first communicator's", call);       \
            return ncclInvalidUsage;                                                               \
        }                                                                                          \
    } while (0)

extern "C" {

ncclResult_t ncclGetVersion(int *version)
{
    if (version == nullptr) {
        return ncclInvalidArgument;
    }
    *version = nccl_version();
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess:
        return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
        return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
        return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
        return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
        return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
        return "remote process exited or there was a network error";
    case ncclInProgress:
        return "NCCL operation in progress";
    default:
        return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return "";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    if (uniqueId == nullptr) {
        return ncclInvalidArgument;
    }
    if (!nccl_mpi_usable()) {
        nccl_warn("ncclGetUniqueId: the emulated NCCL runs over MPI: MPI is not initialised");
        return ncclSystemError;
    }
    id_payload p;
    memcpy(p.magic, kMagic, sizeof p.magic);
    MPI_Comm_rank(MPI_COMM_WORLD, &p.root);
    {
        std::lock_guard<std::mutex> lock(g_mu);
        p.serial = ++g_serial;
    }
    memset(uniqueId, 0, sizeof *uniqueId);
    memcpy(uniqueId->internal, &p, sizeof p);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config)
{
    (void)config; /* blocking communicators only */
    NCCL_ENTER("ncclCommInitRank");
    id_payload id;
    memcpy(&id, commId.internal, sizeof id);
    if (comm == nullptr || nranks < 1 || rank < 0 || rank >= nranks ||
        memcmp(id.magic, kMagic, sizeof id.magic) != 0) {
        nccl_warn("ncclCommInitRank: bad argument (rank %d of %d, or not an emulator's id)", rank,
                  nranks);
        return ncclInvalidArgument;
    }
    *comm = nullptr;
    member me;
    MPI_Comm_rank(MPI_COMM_WORLD, &me.world);
    me.rank = rank;
    me.nranks = nranks;
    me.device = current_device();
    me.host = host_key(me.world);
    std::vector<member> t;
    ncclResult_t r = exchange_members(id, me, t);
    if (r == ncclSuccess) {
        r = check_members(t);
    }
    if (r != ncclSuccess) {
        return r;
    }
    MPI_Group world, mine;
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    std::vector<int> ranks;
    for (const member &m : t) {
        ranks.push_back(m.world);
    }
    MPI_Group_incl(world, nranks, ranks.data(), &mine);
    MPI_Comm mpi = MPI_COMM_NULL;
    int rc = MPI_Comm_create_group(MPI_COMM_WORLD, mine, kBootTag + (int)(id.serial % 1000), &mpi);
    MPI_Group_free(&mine);
    MPI_Group_free(&world);
    if (rc != MPI_SUCCESS || mpi == MPI_COMM_NULL) {
        return ncclSystemError;
    }
    return make_handle(mpi, me.device, comm);
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    return ncclCommInitRankConfig(comm, nranks, commId, rank, nullptr);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config)
{
    (void)config;
    NCCL_ENTER("ncclCommSplit");
    comm_state *s = state_of(comm);
    if (s == nullptr || newcomm == nullptr || (color < 0 && color != NCCL_SPLIT_NOCOLOR)) {
        return ncclInvalidArgument;
    }
    *newcomm = nullptr;
    MPI_Comm mpi = MPI_COMM_NULL;
    if (MPI_Comm_split(s->mpi, color < 0 ? MPI_UNDEFINED : color, key, &mpi) != MPI_SUCCESS) {
        return ncclSystemError;
    }
    if (mpi == MPI_COMM_NULL) {
        return ncclSuccess; /* NCCL_SPLIT_NOCOLOR: no communicator */
    }
    return make_handle(mpi, s->device, newcomm);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    NCCL_ENTER("ncclCommFinalize");
    comm_state *s = state_of(comm);
    if (s == nullptr) {
        return ncclInvalidArgument;
    }
    drain(*s);
    return (ncclResult_t)s->async_error.load();
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    NCCL_ENTER("ncclCommDestroy");
    comm_state *s = state_of(comm);
    if (s == nullptr) {
        return ncclInvalidArgument;
    }
    drain(*s);
    release(comm);
    return ncclSuccess;
}

/* Stops everything in flight: the operations complete (with an error) without their bytes. */
ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (comm == nullptr) {
        return ncclSuccess;
    }
    comm_state *s = state_of(comm);
    if (nccl_on_mpi_thread() && nccl_mpi_usable()) {
        nccl_fail_all(*s, ncclRemoteError);
    } else {
        std::lock_guard<std::mutex> lock(s->mu);
        s->aborted = true;
    }
    release(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    comm_state *s = state_of(comm);
    if (s == nullptr || asyncError == nullptr) {
        return ncclInvalidArgument;
    }
    if (nccl_on_mpi_thread() && nccl_mpi_usable()) {
        nccl_progress();
    }
    *asyncError = (ncclResult_t)s->async_error.load();
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    comm_state *s = state_of(comm);
    if (s == nullptr || count == nullptr) {
        return ncclInvalidArgument;
    }
    *count = s->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    comm_state *s = state_of(comm);
    if (s == nullptr || device == nullptr) {
        return ncclInvalidArgument;
    }
    *device = s->device;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    comm_state *s = state_of(comm);
    if (s == nullptr || rank == nullptr) {
        return ncclInvalidArgument;
    }
    *rank = s->rank;
    return ncclSuccess;
}

} /* extern "C" */
