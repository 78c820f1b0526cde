/*
 * test_transport.c - the device transports of the data plane (staged MPI and
 * NCCL) against the MPI transport, on device memory.
 *
 *   - the plans (src/comm/transport_plan.h) as plain functions: messages,
 *     order and chunks, extents, split colours, the shared-GPU check;
 *   - the plans against what the transports really call: MPI_Isend /
 *     MPI_Irecv intercepted through MPI's profiling interface (the MPI and
 *     the staged transport), ncclSend / ncclRecv through the emulator's
 *     trace (the NCCL transport);
 *   - test_comm's exchange patterns on every group (all-gather, in place,
 *     all-to-all, uneven, two in flight, a control value while an exchange
 *     waits on another rank) over each transport: the received bytes and the
 *     traffic counters equal the MPI transport's on host memory, byte for
 *     byte;
 *   - what a wait names as pending through each transport, the NCCL
 *     transport's refusal of ranks that share a GPU, the staged transport
 *     with every rank on one GPU.
 *
 * Under mpirun (layouts from ZR_RANKS_PER_NODE): in the emulator build every
 * rank gets an emulated GPU of its own (node-local rank -> GPU), on a real
 * GPU (the gpu suite) NCCL runs where every rank of a node has a GPU of its
 * own, and its refusal is checked where they do not. Run directly with
 * --launch: jobs of this program in child mode (--child SCENARIO) for a rank
 * that stalls inside an exchange of each transport (the watchdog names it
 * and ends the job) and, in the emulator, NCCL 2.30's shared-GPU opt-in.
 * Without a GPU the program says it was skipped and why.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, readlink */
#define ZR_TEST_MPI
#include "test.h"

#include "zr/comm.h"
#include "zr/device.h"

#include "../src/comm/transport_plan.h" /* the plans under test */

#include <sys/wait.h>
#include <unistd.h>

#if ZR_CUDA_EMU
#include <zr_emu.h> /* the emulated NCCL's trace */
#endif

/* paths and commands here are short; a truncated one would fail its check loudly */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

#define STAGED_CHUNK 256 /* small, so that every message of the patterns is several chunks */

static int W, R, D;
static int ngpu;          /* GPUs this process sees */
static zr_device own_gpu; /* node-local rank -> GPU */
static zr_stream *stream; /* on own_gpu: the stream the transports follow */

/* ---- MPI calls as the transports make them (MPI's profiling interface) ------------------ */

#define MAX_TRACE 4096

typedef struct call_rec {
    int recv, peer;
    const char *buf;
    size_t bytes;
} call_rec;

static struct {
    int on, tag;
    MPI_Comm comm;
    int n;
    call_rec r[MAX_TRACE];
} mpi_trace;

static void mpi_record(int recv, int peer, const void *buf, int count, int tag, MPI_Comm comm)
{
    if (mpi_trace.on && tag == mpi_trace.tag && comm == mpi_trace.comm && mpi_trace.n < MAX_TRACE) {
        mpi_trace.r[mpi_trace.n++] = (call_rec){recv, peer, buf, (size_t)count};
    }
}

int MPI_Isend(const void *buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm,
              MPI_Request *req)
{
    mpi_record(0, dest, buf, count, tag, comm);
    return PMPI_Isend(buf, count, type, dest, tag, comm, req);
}

int MPI_Irecv(void *buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm,
              MPI_Request *req)
{
    mpi_record(1, source, buf, count, tag, comm);
    return PMPI_Irecv(buf, count, type, source, tag, comm, req);
}

#if ZR_CUDA_EMU
static struct {
    int on, n;
    call_rec r[MAX_TRACE];
} nccl_trace;

static void nccl_record(void *arg, const char *call, int peer, const void *buf, size_t bytes)
{
    (void)arg;
    if (nccl_trace.on && nccl_trace.n < MAX_TRACE) {
        nccl_trace.r[nccl_trace.n++] =
            (call_rec){strcmp(call, "ncclRecv") == 0, peer, (const char *)buf, bytes};
    }
}
#endif

/* ---- the plans as plain functions ---------------------------------------------------------- */

/* Random counts and packed displacements for n peers (some 0). */
static void random_exchange(zr_test_rng *rng, int n, size_t *sc, size_t *sd, size_t *rc, size_t *rd)
{
    size_t so = 0, ro = 0;
    for (int p = 0; p < n; p++) {
        sc[p] = zr_test_rng_next(rng) % 5 == 0 ? 0 : zr_test_rng_next(rng) % 3000;
        rc[p] = zr_test_rng_next(rng) % 5 == 0 ? 0 : zr_test_rng_next(rng) % 3000;
        sd[p] = so;
        rd[p] = ro + 7; /* not packed from 0 */
        so += sc[p];
        ro += rc[p] + 7;
    }
}

/*
 * The staging of a plan: receives mirror their offsets; a send chunk copies
 * itself or shares an earlier chunk of the same bytes; distinct send
 * messages never share stage bytes; the stage holds them all.
 */
static void check_stage(const zr_xmsg *m, size_t n)
{
    size_t *stage = calloc(n + 1, sizeof *stage), *copy = calloc(n + 1, sizeof *copy);
    size_t size = zr_xplan_stage(m, n, stage, copy), bad = SIZE_MAX;
    for (size_t i = 0; i < n && bad == SIZE_MAX; i++) {
        const zr_xmsg *c = &m[copy[i]];
        int ok = copy[i] <= i && c->recv == m[i].recv && c->bytes == m[i].bytes &&
                 c->offset == m[i].offset && stage[copy[i]] == stage[i];
        ok &= m[i].recv ? stage[i] == m[i].offset && copy[i] == i : stage[i] + m[i].bytes <= size;
        for (size_t j = 0; j < i && ok && !m[i].recv; j++) {
            /* chunks that overlap in the stage hold the same bytes of the buffer */
            int overlap =
                !m[j].recv && stage[j] < stage[i] + m[i].bytes && stage[i] < stage[j] + m[j].bytes;
            ok = !overlap || (stage[j] == stage[i] && m[j].offset == m[i].offset);
        }
        bad = ok ? bad : i;
    }
    TEST_CHECKF(bad == SIZE_MAX, "staging of chunk %zu", bad);
    free(stage);
    free(copy);
}

static void test_plan_messages(void)
{
    zr_test_rng rng = {42};
    enum { N = 7 };
    size_t sc[N], sd[N], rc[N], rd[N];
    zr_xmsg whole[2 * N], part[2 * 3000];
    for (int trial = 0; trial < 50; trial++) {
        int n = 1 + trial % N, me = trial % n;
        random_exchange(&rng, n, sc, sd, rc, rd);
        size_t chunk = 1 + zr_test_rng_next(&rng) % 700;
        size_t nw = zr_xplan_messages(n, me, sc, sd, rc, rd, SIZE_MAX, whole, 2 * N);
        size_t np = zr_xplan_messages(n, me, sc, sd, rc, rd, chunk, part, 2 * 3000);
        TEST_EQ_INT(zr_xplan_messages(n, me, sc, sd, rc, rd, chunk, NULL, 0), np);
        /* whole messages: receives from me-1 down, then sends to me+1 up; none of 0 bytes */
        size_t k = 0;
        for (int pass = 1; pass >= 0; pass--) {
            for (int i = 1; i < n; i++) {
                int p = pass ? (me + n - i) % n : (me + i) % n;
                size_t bytes = pass ? rc[p] : sc[p], off = pass ? rd[p] : sd[p];
                if (bytes == 0) {
                    continue;
                }
                TEST_CHECK(k < nw && whole[k].peer == p && whole[k].recv == pass &&
                           whole[k].offset == off && whole[k].bytes == bytes);
                k++;
            }
        }
        TEST_EQ_INT(k, nw);
        /* chunks: the same messages in the same order, cut at most chunk bytes, contiguous */
        size_t j = 0;
        for (size_t i = 0; i < nw; i++) {
            size_t covered = 0;
            while (j < np && part[j].peer == whole[i].peer && part[j].recv == whole[i].recv &&
                   part[j].offset == whole[i].offset + covered) {
                TEST_CHECK(part[j].bytes > 0 && part[j].bytes <= chunk);
                covered += part[j].bytes;
                j++;
            }
            TEST_EQ_INT(covered, whole[i].bytes);
        }
        TEST_EQ_INT(j, np);
        size_t rend = 0, send = 0;
        for (int p = 0; p < n; p++) {
            if (p != me && rc[p] > 0 && rd[p] + rc[p] > rend) {
                rend = rd[p] + rc[p];
            }
            if (p != me && sc[p] > 0 && sd[p] + sc[p] > send) {
                send = sd[p] + sc[p];
            }
        }
        TEST_EQ_INT(zr_xplan_extent(part, np, 1), rend);
        TEST_EQ_INT(zr_xplan_extent(part, np, 0), send);
        check_stage(part, np);
    }
    /* an all-gather's plan: one block for every peer, copied once */
    int n = 5, me = 2;
    for (int p = 0; p < n; p++) {
        sc[p] = rc[p] = 1000;
        sd[p] = 0;
        rd[p] = (size_t)p * 1000;
    }
    size_t np = zr_xplan_messages(n, me, sc, sd, rc, rd, 256, part, 2 * 3000);
    size_t stage[64], copy[64];
    TEST_EQ_INT(zr_xplan_stage(part, np, stage, copy), 1000);
    size_t copies = 0;
    for (size_t i = 0; i < np; i++) {
        copies += !part[i].recv && copy[i] == i;
    }
    TEST_EQ_INT(copies, 4); /* 1000 bytes in chunks of 256 */
    check_stage(part, np);
}

static void test_plan_shared_gpu(void)
{
    zr_gpu_id ids[4];
    memset(ids, 0, sizeof ids);
    for (int r = 0; r < 4; r++) {
        ids[r].node = r / 2;
        ids[r].uuid[0] = (unsigned char)(r % 2); /* two GPUs per node, the same UUIDs per node */
    }
    int a, b;
    TEST_EQ_INT(zr_xplan_shared_gpu(ids, 4, &a, &b), 0);
    TEST_CHECK(a == -1 && b == -1);
    ids[3].uuid[0] = 0; /* rank 3 on node 1's first GPU, with rank 2 */
    TEST_EQ_INT(zr_xplan_shared_gpu(ids, 4, &a, &b), 1);
    TEST_CHECK(a == 2 && b == 3);
    ids[1].uuid[5] = 9; /* a GPU that differs only late in its UUID is another GPU */
    ids[1].uuid[0] = 0;
    TEST_EQ_INT(zr_xplan_shared_gpu(ids, 2, &a, &b), 0);
}

/* Layouts without MPI (zr_comm_init_layout): every rank's colour and key give its groups. */
static void split_layouts(void)
{
    static const int layouts[][3] = {{1, 4, 4}, {2, 2, 2}, {3, 2, 2},
                                     {4, 2, 4}, {2, 3, 6}, {3, 1, 1}};
    for (size_t l = 0; l < sizeof layouts / sizeof layouts[0]; l++) {
        int nodes = layouts[l][0], d = layouts[l][1], h = layouts[l][2], n = nodes * d;
        zr_comm cs[8];
        for (int r = 0; r < n; r++) {
            TEST_OK(zr_comm_init_layout(&cs[r], nodes, d, h, r));
        }
        for (int g = 0; g < ZR_GROUP_COUNT; g++) {
            for (int r = 0; r < n; r++) {
                zr_xsplit a = zr_xplan_split(&cs[r], (zr_group)g);
                for (int q = 0; q < n; q++) {
                    zr_xsplit b = zr_xplan_split(&cs[q], (zr_group)g);
                    int together = 0;
                    for (int k = 0; k < cs[r].size[g]; k++) {
                        together |= zr_comm_world_rank(&cs[r], (zr_group)g, k) == q;
                    }
                    TEST_CHECKF((a.color == b.color) == together, "%dx%d h%d group %s ranks %d, %d",
                                nodes, d, h, zr_group_name((zr_group)g), r, q);
                }
                TEST_EQ_INT(a.key, cs[r].rank[g]);
            }
        }
    }
}

/* The split of NCCL's world communicator gives zr's groups, in-group ranks in order. */
static void test_plan_split(void)
{
    split_layouts();
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    int *all = calloc(2 * (size_t)W, sizeof *all);
    for (int g = 0; g < ZR_GROUP_COUNT; g++) {
        zr_xsplit s = zr_xplan_split(&c, (zr_group)g);
        int mine[2] = {s.color, s.key};
        MPI_Allgather(mine, 2, MPI_INT, all, 2, MPI_INT, MPI_COMM_WORLD);
        /* the ranks of my colour, ordered by key, are my group's members in order */
        for (int r = 0; r < W; r++) {
            int same = all[2 * r] == s.color;
            int member = 0;
            for (int k = 0; k < c.size[g]; k++) {
                if (zr_comm_world_rank(&c, (zr_group)g, k) == r) {
                    member = 1;
                    TEST_EQ_INT(all[2 * r + 1], k);
                }
            }
            TEST_CHECKF(same == member, "group %s: rank %d colour %d, mine %d",
                        zr_group_name((zr_group)g), r, all[2 * r], s.color);
        }
    }
    free(all);
    zr_comm_free(&c);
}

/* ---- buffers on the host (MPI transport) or on the GPU ------------------------------------- */

static void *buf_alloc(int on_dev, size_t n)
{
    void *p = NULL;
    if (on_dev) {
        TEST_OK(zr_device_alloc_at(&own_gpu, &p, n, __FILE__, __LINE__));
    } else {
        p = malloc(n);
    }
    return p;
}

static void buf_free(int on_dev, void *p)
{
    if (on_dev) {
        zr_device_free(&own_gpu, p);
    } else {
        free(p);
    }
}

/* Host bytes into a buffer: on the GPU, queued on the followed stream (no host wait). */
static void buf_put(int on_dev, void *dst, const void *host, size_t n)
{
    if (on_dev) {
        TEST_OK(zr_memcpy_async(dst, host, n, stream));
    } else {
        memcpy(dst, host, n);
    }
}

static void buf_get(int on_dev, void *host, const void *src, size_t n)
{
    if (on_dev) {
        TEST_OK(zr_memcpy_async(host, src, n, stream));
        TEST_OK(zr_stream_sync(stream));
    } else {
        memcpy(host, src, n);
    }
}

/* ---- the exchange patterns, logged ---------------------------------------------------------- */

/* What a run of the patterns received, in order, and what the counters said. */
typedef struct run_log {
    unsigned char *bytes;
    size_t len, cap;
    zr_traffic traffic;
} run_log;

static void log_add(run_log *l, const void *p, size_t n)
{
    if (l->len + n > l->cap) {
        l->cap = 2 * (l->len + n);
        l->bytes = realloc(l->bytes, l->cap);
    }
    memcpy(l->bytes + l->len, p, n);
    l->len += n;
}

static unsigned char pat(int from, int to, size_t i)
{
    return (unsigned char)(from * 31 + to * 7 + i * 13 + 1);
}

/* All-gather (in place too) and all-to-all on group g. */
static void patterns_group(zr_comm *c, int on_dev, zr_group g, run_log *log)
{
    int n = c->size[g], me = c->rank[g];
    size_t blk = 1000 + (size_t)g * 17, all = blk * (size_t)n;
    unsigned char *hs = malloc(all), *hr = calloc(all, 1);
    char *s = buf_alloc(on_dev, all), *r = buf_alloc(on_dev, all);
    for (size_t i = 0; i < blk; i++) {
        hs[i] = pat(me, 0, i);
    }
    buf_put(on_dev, s, hs, blk);
    buf_put(on_dev, r, hr, all);
    TEST_OK(zr_comm_allgather(c, g, ZR_KIND_ALLGATHER, s, blk, r));
    buf_get(on_dev, hr, r, all);
    log_add(log, hr, all);
    /* in place: my block already sits in the receive buffer */
    TEST_OK(zr_comm_allgather(c, g, ZR_KIND_HPZ, r + (size_t)me * blk, blk, r));
    buf_get(on_dev, hr, r, all);
    log_add(log, hr, all);
    for (int p = 0; p < n; p++) {
        for (size_t i = 0; i < blk; i++) {
            hs[(size_t)p * blk + i] = pat(me, p, i);
        }
    }
    buf_put(on_dev, s, hs, all);
    TEST_OK(zr_comm_alltoall(c, g, ZR_KIND_QGZ, s, blk, r));
    buf_get(on_dev, hr, r, all);
    log_add(log, hr, all);
    buf_free(on_dev, s);
    buf_free(on_dev, r);
    free(hs);
    free(hr);
}

/* Peer p gets p+1 bytes from me, I get me+1 from each; polled with zr_comm_test. */
static void pattern_uneven(zr_comm *c, int on_dev, run_log *log)
{
    size_t sc[64], sd[64], rc[64], rd[64], so = 0, ro = 0;
    for (int p = 0; p < W; p++) {
        sc[p] = (size_t)p * 300 + 1;
        sd[p] = so;
        so += sc[p];
        rc[p] = (size_t)R * 300 + 1;
        rd[p] = ro;
        ro += rc[p];
    }
    unsigned char *hs = malloc(so), *hr = calloc(ro, 1);
    for (int p = 0; p < W; p++) {
        for (size_t i = 0; i < sc[p]; i++) {
            hs[sd[p] + i] = pat(R, p, i);
        }
    }
    char *s = buf_alloc(on_dev, so), *r = buf_alloc(on_dev, ro);
    buf_put(on_dev, s, hs, so);
    buf_put(on_dev, r, hr, ro);
    zr_request req = ZR_REQUEST_INIT;
    TEST_OK(zr_comm_iexchange(c, ZR_GROUP_WORLD, ZR_KIND_ALLTOALL, s, sc, sd, r, rc, rd, &req));
    int done = 0;
    while (!done) {
        TEST_OK(zr_comm_test(c, &req, &done));
    }
    TEST_OK(zr_comm_wait(c, &req));
    buf_get(on_dev, hr, r, ro);
    log_add(log, hr, ro);
    buf_free(on_dev, s);
    buf_free(on_dev, r);
    free(hs);
    free(hr);
}

/*
 * Three exchanges in flight on world, node and cross (qgZ's pipeline keeps a
 * node and a cross all-to-all going at once), waited for in another order
 * than started; then an exchange
 * that rank 0 waits for before a control value while the others take the
 * control value first: their exchange must move while they wait for rank 0
 * in the control plane (the transport's progress), or nobody gets anywhere.
 */
static void pattern_in_flight(zr_comm *c, int on_dev, run_log *log)
{
    size_t blk = 3 * STAGED_CHUNK + 5, all = blk * (size_t)W, total = 4 * all;
    unsigned char *h = malloc(total);
    for (size_t i = 0; i < total; i++) {
        h[i] = pat(R, (int)(i / blk), i);
    }
    char *s = buf_alloc(on_dev, total), *r = buf_alloc(on_dev, total);
    buf_put(on_dev, s, h, total);
    memset(h, 0, total); /* the node and cross all-to-alls fill only part of their quarters */
    buf_put(on_dev, r, h, total);
    zr_request r1 = ZR_REQUEST_INIT, r2 = ZR_REQUEST_INIT, r3 = ZR_REQUEST_INIT;
    zr_request r4 = ZR_REQUEST_INIT;
    TEST_OK(zr_comm_ialltoall(c, ZR_GROUP_WORLD, ZR_KIND_ALLTOALL, s, blk, r, &r1));
    TEST_OK(zr_comm_ialltoall(c, ZR_GROUP_NODE, ZR_KIND_QGZ, s + all, blk, r + all, &r2));
    TEST_OK(zr_comm_ialltoall(c, ZR_GROUP_CROSS, ZR_KIND_QGZ, s + 3 * all, blk, r + 3 * all, &r4));
    TEST_OK(zr_comm_wait(c, &r2));
    TEST_OK(zr_comm_wait(c, &r4));
    TEST_OK(zr_comm_wait(c, &r1));
    double v = R + 1.0;
    TEST_OK(zr_comm_ialltoall(c, ZR_GROUP_WORLD, ZR_KIND_QWZ, s + 2 * all, blk, r + 2 * all, &r3));
    if (R == 0) {
        TEST_OK(zr_comm_wait(c, &r3));
    }
    TEST_OK(zr_comm_allreduce_sum_f64(c, ZR_GROUP_WORLD, &v, 1));
    TEST_OK(zr_comm_wait(c, &r3));
    TEST_NEAR(v, W * (W + 1) / 2.0, 0);
    buf_get(on_dev, h, r, total);
    log_add(log, h, total);
    buf_free(on_dev, s);
    buf_free(on_dev, r);
    free(h);
}

static void run_patterns(zr_comm *c, int on_dev, run_log *log)
{
    memset(log, 0, sizeof *log);
    zr_comm_traffic_reset(c);
    for (int g = 0; g < ZR_GROUP_COUNT; g++) {
        patterns_group(c, on_dev, (zr_group)g, log);
    }
    pattern_uneven(c, on_dev, log);
    pattern_in_flight(c, on_dev, log);
    log->traffic = zr_comm_traffic_get(c);
}

static run_log mpi_log; /* the MPI transport on host memory: the reference */

static void check_same_as_mpi(const run_log *l, const char *what)
{
    TEST_EQ_INT(l->len, mpi_log.len);
    size_t first = SIZE_MAX;
    for (size_t i = 0; i < l->len && i < mpi_log.len && first == SIZE_MAX; i++) {
        first = l->bytes[i] != mpi_log.bytes[i] ? i : first;
    }
    TEST_CHECKF(first == SIZE_MAX, "%s: byte %zu differs from the MPI transport's", what, first);
    for (int k = 0; k < ZR_KIND_COUNT; k++) {
        const zr_traffic_row *a = &l->traffic.kind[k], *b = &mpi_log.traffic.kind[k];
        TEST_CHECKF(a->calls == b->calls && a->bytes_intra == b->bytes_intra &&
                        a->bytes_inter == b->bytes_inter,
                    "%s: traffic of %s: %llu calls %llu + %llu bytes, MPI %llu calls %llu + %llu",
                    what, zr_kind_name((zr_kind)k), (unsigned long long)a->calls,
                    (unsigned long long)a->bytes_intra, (unsigned long long)a->bytes_inter,
                    (unsigned long long)b->calls, (unsigned long long)b->bytes_intra,
                    (unsigned long long)b->bytes_inter);
    }
}

/* ---- the calls against the plans ---------------------------------------------------------- */

/* The uneven exchange's counts (the pattern's), and its plan with chunk. */
static size_t uneven_plan(size_t chunk, size_t *sc, size_t *sd, size_t *rc, size_t *rd,
                          zr_xmsg *out, size_t max)
{
    size_t so = 0, ro = 0;
    for (int p = 0; p < W; p++) {
        sc[p] = (size_t)p * 300 + 1;
        sd[p] = so;
        so += sc[p];
        rc[p] = (size_t)R * 300 + 1;
        rd[p] = ro;
        ro += rc[p];
    }
    return zr_xplan_messages(W, R, sc, sd, rc, rd, chunk, out, max);
}

/*
 * The recorded calls are the plan's messages in the plan's order. Offsets:
 * exact from the buffers' addresses sbase / rbase when known, else (0)
 * relative to the first call of each direction (a staging buffer mirrors
 * the offsets).
 */
static void check_calls(const call_rec *rec, int n, const zr_xmsg *plan, size_t count,
                        uintptr_t sbase, uintptr_t rbase, const char *what)
{
    TEST_CHECKF((size_t)n == count, "%s: %d calls, the plan has %zu", what, n, count);
    uintptr_t base[2] = {sbase, rbase};
    int bad = -1;
    for (int i = 0; i < n && (size_t)i < count && bad < 0; i++) {
        const call_rec *c = &rec[i];
        const zr_xmsg *m = &plan[i];
        int d = m->recv;
        if (base[d] == 0) {
            base[d] = (uintptr_t)c->buf - m->offset;
        }
        size_t off = (size_t)((uintptr_t)c->buf - base[d]);
        if (c->recv != m->recv || c->peer != m->peer || c->bytes != m->bytes || off != m->offset) {
            bad = i;
        }
    }
    TEST_CHECKF(bad < 0, "%s: call %d is not the plan's message %d", what, bad, bad);
}

/* MPI_Isend / MPI_Irecv of one uneven exchange through c's transport (tag: its MPI tag). */
static int traced_uneven(zr_comm *c, int on_dev, int tag, uintptr_t *sbase, uintptr_t *rbase)
{
    size_t sc[64], sd[64], rc[64], rd[64];
    uneven_plan(SIZE_MAX, sc, sd, rc, rd, NULL, 0);
    size_t so = sd[W - 1] + sc[W - 1], ro = rd[W - 1] + rc[W - 1];
    char *s = buf_alloc(on_dev, so), *r = buf_alloc(on_dev, ro);
    unsigned char *h = calloc(so > ro ? so : ro, 1);
    buf_put(on_dev, s, h, so);
    memset(&mpi_trace, 0, sizeof mpi_trace);
    mpi_trace.tag = tag;
    mpi_trace.comm = zr_comm_mpi(c, ZR_GROUP_WORLD);
    mpi_trace.on = 1;
#if ZR_CUDA_EMU
    memset(&nccl_trace, 0, sizeof nccl_trace);
    nccl_trace.on = 1;
#endif
    zr_request req = ZR_REQUEST_INIT;
    TEST_OK(zr_comm_iexchange(c, ZR_GROUP_WORLD, ZR_KIND_ALLTOALL, s, sc, sd, r, rc, rd, &req));
    TEST_OK(zr_comm_wait(c, &req));
    mpi_trace.on = 0;
#if ZR_CUDA_EMU
    nccl_trace.on = 0;
#endif
    buf_get(on_dev, h, r, ro);
    *sbase = (uintptr_t)s;
    *rbase = (uintptr_t)r;
    buf_free(on_dev, s);
    buf_free(on_dev, r);
    free(h);
    return mpi_trace.n;
}

static void test_mpi_calls(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    size_t sc[64], sd[64], rc[64], rd[64];
    zr_xmsg plan[128];
    size_t count = uneven_plan(ZR_XPLAN_MPI_CHUNK, sc, sd, rc, rd, plan, 128);
    uintptr_t sb, rb;
    int n = traced_uneven(&c, 0, 7001, &sb, &rb);
    check_calls(mpi_trace.r, n, plan, count, sb, rb, "MPI transport");
    zr_comm_free(&c);
}

/* ---- the device transports ------------------------------------------------------------------- */

static zr_status use(zr_comm *c, const zr_transport *t, const zr_device *gpu, zr_stream *s)
{
    zr_transport_device arg = {gpu, s, STAGED_CHUNK};
    return zr_comm_use_transport(c, t, &arg);
}

static void test_staged(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    TEST_OK(use(&c, &zr_transport_staged, &own_gpu, stream));
    if (c.transport == &zr_transport_staged) {
        run_log l;
        run_patterns(&c, 1, &l);
        check_same_as_mpi(&l, "staged transport");
        free(l.bytes);
        size_t sc[64], sd[64], rc[64], rd[64];
        zr_xmsg plan[4096];
        size_t count = uneven_plan(STAGED_CHUNK, sc, sd, rc, rd, plan, 4096);
        uintptr_t sb, rb;
        int n = traced_uneven(&c, 1, 7002, &sb, &rb);
        /* in the pinned stages: offsets from zr_xplan_stage, relative to the first of each side */
        static size_t stage[4096], copy[4096];
        zr_xplan_stage(plan, count, stage, copy);
        for (size_t i = 0; i < count; i++) {
            plan[i].offset = stage[i];
        }
        check_calls(mpi_trace.r, n, plan, count, 0, 0, "staged transport");
    }
    zr_comm_free(&c);
}

/* NCCL can run this layout here: every rank of a node has a GPU of its own. */
static int nccl_fits(void)
{
    return D <= ngpu;
}

static void test_nccl(void)
{
    if (!nccl_fits()) {
        return; /* test_nccl_shared checks the refusal instead */
    }
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    TEST_OK(use(&c, &zr_transport_nccl, &own_gpu, stream));
    if (c.transport == &zr_transport_nccl) {
        run_log l;
        run_patterns(&c, 1, &l);
        check_same_as_mpi(&l, "NCCL transport");
        free(l.bytes);
#if ZR_CUDA_EMU
        size_t sc[64], sd[64], rc[64], rd[64];
        zr_xmsg plan[128];
        size_t count = uneven_plan(SIZE_MAX, sc, sd, rc, rd, plan, 128);
        uintptr_t sb, rb;
        TEST_EQ_INT(traced_uneven(&c, 1, 7002, &sb, &rb), 0); /* no MPI on the data plane */
        check_calls(nccl_trace.r, nccl_trace.n, plan, count, sb, rb, "NCCL transport");
#endif
    }
    zr_comm_free(&c);
}

/* Every rank on GPU 0: NCCL refuses, naming ranks and GPU, the same on every rank. */
static void test_nccl_shared(void)
{
    zr_device gpu0;
    zr_stream *s0 = NULL;
    TEST_OK(zr_device_open_cuda(0, &gpu0));
    TEST_OK(zr_stream_create(&gpu0, &s0));
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    if (D == 1) {
        TEST_OK(use(&c, &zr_transport_nccl, &gpu0, s0)); /* one rank per node: nothing shared */
    } else {
        TEST_FAILS(use(&c, &zr_transport_nccl, &gpu0, s0), ZR_ERR_INVALID,
                   "ranks 0 and 1 share GPU cuda:0");
        TEST_CHECKF(strstr(zr_error_message(), "staged transport") != NULL, "%s",
                    zr_error_message());
        TEST_CHECK(c.transport == &zr_transport_mpi);
        /* the staged transport runs them */
        TEST_OK(use(&c, &zr_transport_staged, &gpu0, s0));
        TEST_CHECK(c.transport == &zr_transport_staged);
    }
    zr_comm_free(&c);
    zr_stream_destroy(s0);
    TEST_OK(zr_device_open_cuda(own_gpu.ordinal, &own_gpu)); /* back to this rank's GPU */
}

/*
 * What a wait names through a device transport: rank 0 posts an all-gather,
 * the others post theirs after a barrier that rank 0 enters only after it
 * asked, so every receive of rank 0 is open (test_comm's test_pending).
 */
static void pending_through(const zr_transport *t)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    TEST_OK(use(&c, t, &own_gpu, stream));
    size_t blk = 2 * STAGED_CHUNK;
    char *s = buf_alloc(1, blk), *r = buf_alloc(1, blk * (size_t)W);
    unsigned char *h = calloc(blk, 1);
    buf_put(1, s, h, blk);
    zr_request req = ZR_REQUEST_INIT;
    if (R == 0) {
        TEST_OK(zr_comm_iallgather(&c, ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, s, blk, r, &req));
        zr_pending out[64];
        int n = req.active ? req.transport->pending(&c, &req, out, 64) : 0, seen = 0;
        for (int i = 0; i < n; i++) {
            if (out[i].recv) {
                /* receives first, from rank W-1 down to 1 */
                TEST_CHECKF(i == seen && out[i].rank == W - 1 - i, "%s: entry %d: rank %d", t->name,
                            i, out[i].rank);
                seen++;
            }
        }
        TEST_EQ_INT(seen, W - 1);
    }
    TEST_OK(zr_comm_barrier(&c));
    if (R != 0) {
        TEST_OK(zr_comm_iallgather(&c, ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, s, blk, r, &req));
    }
    TEST_OK(zr_comm_wait(&c, &req));
    buf_free(1, s);
    buf_free(1, r);
    free(h);
    zr_comm_free(&c);
}

static void test_pending(void)
{
    pending_through(&zr_transport_staged);
    if (nccl_fits()) {
        pending_through(&zr_transport_nccl);
    }
}

/* The staged transport with every rank on GPU 0 (several ranks per GPU). */
static void test_staged_shared(void)
{
    zr_device keep = own_gpu;
    TEST_OK(zr_device_open_cuda(0, &own_gpu));
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    zr_stream *s0 = stream;
    TEST_OK(zr_stream_create(&own_gpu, &stream));
    TEST_OK(use(&c, &zr_transport_staged, &own_gpu, stream));
    run_log l;
    run_patterns(&c, 1, &l);
    check_same_as_mpi(&l, "staged transport, every rank on GPU 0");
    free(l.bytes);
    zr_comm_free(&c);
    zr_stream_destroy(stream);
    stream = s0;
    TEST_OK(zr_device_open_cuda(keep.ordinal, &own_gpu));
}

/* ---- child jobs: a stalled rank, NCCL 2.30's opt-in ---------------------------------------- */

static _Noreturn void stall(void)
{
    for (;;) {
        sleep(1);
    }
}

static int child(const char *scenario)
{
    zr_test_mpi_init(NULL, NULL);
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    zr_comm c;
    ZR_TRY(zr_comm_init(&c, MPI_COMM_WORLD, NULL), "");
    int local = c.rank[ZR_GROUP_NODE], nlocal = c.size[ZR_GROUP_NODE];
    int shared = strcmp(scenario, "shared-ok") == 0;
    ZR_TRY(shared ? zr_device_open_cuda(0, &own_gpu)
                  : zr_device_open_for_rank(local, nlocal, &own_gpu),
           "");
    ZR_TRY(zr_stream_create(&own_gpu, &stream), "");
    const zr_transport *t =
        strstr(scenario, "nccl") != NULL || shared ? &zr_transport_nccl : &zr_transport_staged;
    ZR_TRY(use(&c, t, &own_gpu, stream), "");
    int64_t *d = NULL;
    ZR_TRY(
        zr_device_alloc_at(&own_gpu, (void **)&d, sizeof *d * (size_t)(W + 1), __FILE__, __LINE__),
        "");
    MPI_Barrier(MPI_COMM_WORLD); /* everyone is up: the waits below start together */
    if (R == 1 && !shared) {
        stall();
    }
    zr_status st = zr_comm_allgather(&c, ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, d + W, sizeof *d, d);
    printf("rank %d: the allgather returned: %s\n", R, zr_status_str(st));
    fflush(stdout);
    zr_device_free(&own_gpu, d);
    zr_comm_free(&c);
    zr_stream_destroy(stream);
    MPI_Finalize();
    return 0;
}

static struct {
    int code;
    char out[1 << 16];
} res;

static int sh(const char *cmd)
{
    char full[4400];
    snprintf(full, sizeof full, "(%s) 2>&1 </dev/null", cmd);
    FILE *p = popen(full, "r");
    if (p == NULL) {
        return res.code = -1;
    }
    size_t n = fread(res.out, 1, sizeof res.out - 1, p);
    res.out[n] = '\0';
    int st = pclose(p);
    res.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    return res.code;
}

static char self[4096];

static int run_child(int np, const char *env, const char *scenario)
{
    char cmd[4400];
    snprintf(cmd, sizeof cmd,
             "timeout -k 5 120 mpirun.openmpi -np %d -x ZR_TIMEOUT=2 %s %s --child %s", np, env,
             self, scenario);
    return sh(cmd);
}

#define OUT_HAS(s)                                                                                 \
    TEST_CHECKF(strstr(res.out, (s)) != NULL, "output lacks \"%s\":\n%s", (s), res.out)

static void test_stall_staged(void)
{
    run_child(3, "", "stall-staged");
    TEST_CHECKF(res.code != 0 && res.code != 124 && res.code != 137, "exit %d", res.code);
    OUT_HAS("timeout: no progress for");
    OUT_HAS("in allgather (group world of 3 ranks");
    /* the staged transport knows which message is missing: rank 1's, on both waiting ranks */
    TEST_CHECKF(strstr(res.out, "waiting for data from rank 1") != NULL, "%s", res.out);
    TEST_CHECK(strstr(res.out, "the allgather returned") == NULL);
}

static void test_stall_nccl(void)
{
    if (ngpu < 3) {
        printf("  (needs 3 GPUs for 3 ranks: not run here)\n");
        return;
    }
    run_child(3, "", "stall-nccl");
    TEST_CHECKF(res.code != 0 && res.code != 124 && res.code != 137, "exit %d", res.code);
    OUT_HAS("timeout: no progress for");
    OUT_HAS("in allgather (group world of 3 ranks");
    /* an NCCL group waits for all its peers until it completes: rank 0 names 1 and 2 */
    OUT_HAS("waiting for data from ranks 1-2");
    TEST_CHECK(strstr(res.out, "the allgather returned") == NULL);
}

/* NCCL 2.30 runs two ranks on one GPU when asked to (the emulator reports that version). */
static void test_shared_opt_in(void)
{
#if ZR_CUDA_EMU
    run_child(2, "-x ZR_EMU_DEVICES=1 -x ZR_EMU_NCCL_VERSION=23000 -x NCCL_MULTI_RANK_GPU_ENABLE=1",
              "shared-ok");
    TEST_EQ_INT(res.code, 0);
    TEST_CHECKF(strstr(res.out, "rank 0: the allgather returned: ok") != NULL, "%s", res.out);
    run_child(2, "-x ZR_EMU_DEVICES=1 -x ZR_EMU_NCCL_VERSION=23000", "shared-ok");
    TEST_CHECK(res.code != 0);
    OUT_HAS("ranks 0 and 1 share GPU cuda:0");
#endif
}

static int launch(void)
{
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "test_transport: cannot find its own path\n");
        return 1;
    }
    self[n] = '\0';
    if (zr_device_cuda_count(&ngpu) != ZR_OK) {
        return zr_test_skip("%s", zr_error_message());
    }
    unsetenv("ZR_RANKS_PER_NODE");
    unsetenv("ZR_TIMEOUT");
#if ZR_CUDA_EMU
    setenv("ZR_EMU_DEVICES", "3", 1);
    ngpu = 3;
#endif
    TEST_RUN(test_stall_staged);
    TEST_RUN(test_stall_nccl);
    TEST_RUN(test_shared_opt_in);
    return zr_test_finish();
}

int main(int argc, char **argv)
{
#if ZR_CUDA_EMU
    setenv("ZR_EMU_DEVICES", "8", 0); /* room for a GPU per rank of a node */
    zr_emu_nccl_trace(nccl_record, NULL);
#endif
    if (argc == 3 && strcmp(argv[1], "--child") == 0) {
        return child(argv[2]);
    }
    if (argc == 2 && strcmp(argv[1], "--launch") == 0) {
        return launch();
    }
    zr_test_mpi_init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    const char *env = getenv("ZR_RANKS_PER_NODE");
    D = env != NULL ? atoi(env) : W; /* one machine: one real node */
    if (zr_device_cuda_count(&ngpu) != ZR_OK) {
        return zr_test_skip("%s", zr_error_message());
    }
    TEST_OK(zr_device_open_for_rank(R % D, D, &own_gpu));
    TEST_OK(zr_stream_create(&own_gpu, &stream));
    TEST_RUN(test_plan_messages);
    TEST_RUN(test_plan_shared_gpu);
    TEST_RUN(test_plan_split);
    TEST_RUN(test_mpi_calls);
    /* the reference: the MPI transport on host memory */
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    run_patterns(&c, 0, &mpi_log);
    zr_comm_free(&c);
    TEST_RUN(test_staged);
    TEST_RUN(test_nccl);
    TEST_RUN(test_nccl_shared);
    TEST_RUN(test_pending);
    TEST_RUN(test_staged_shared);
    free(mpi_log.bytes);
    zr_stream_destroy(stream);
    return zr_test_finish();
}
