/*
 * test_gpu_coll.c - every collective of zr/coll.h on device buffers, through
 * both device transports (staged MPI and NCCL), against the CPU path on the
 * same inputs.
 *
 * The reference is the MPI transport on host memory: the CPU path, whose
 * results and bounds test_coll checks against the exact sums. Each case
 * (all-gather fp32/bf16 in, on the wire and out, qwZ INT8/INT4 into fp32 or
 * bf16, the hpZ cut and gather of fp32 and bf16 units, reduce-scatter
 * fp32/bf16 in and on the wire on world and node groups, qgZ with and
 * without error feedback and chunks, fp32 and bf16 inputs, all-reduce, two
 * ops in flight at once) then runs on the GPU with the same inputs, and
 *   - the output bytes equal the CPU's (the local work is the same steps in
 *     the same order; NaN compares as NaN: a GPU's NaN payloads are its own),
 *   - the error-feedback residuals equal the CPU's after two calls,
 *   - the traffic counters (calls and bytes per kind, own node and others)
 *     and the count of non-finite groups equal the CPU's,
 *   - a bf16 all-gather output is the fp32 output of the same inputs rounded
 *     to bf16, bit for bit (a NaN stays a NaN), on either side;
 * and a received block that fails validation fails the device op with the
 * CPU path's message (the device checks the headers when the op completes).
 * Inputs are written on the stream the communicator follows right before
 * each start, and outputs read on it right after completion, with no other
 * synchronisation: an op that did not order its work after the followed
 * stream, or that completed before its kernels did, fails the comparison
 * (and the emulator's race detector).
 *
 * Under mpirun at 1x4, 2x2 and 3x2 (ZR_RANKS_PER_NODE) in the emulator build,
 * each rank on an emulated GPU of its own; NCCL runs where every rank of a
 * node has a GPU (always in the emulator). On a real GPU (suite gpu) the same
 * program, where the machine has the GPUs; without a GPU it says it was
 * skipped and why.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#define ZR_TEST_MPI
#include "test.h"

#include "zr/coll.h"
#include "zr/comm.h"
#include "zr/device.h"

#define COUNT        600  /* elements per partition: 3 quantization groups, the last short */
#define QGROUP       256  /* quantization groups: several per partition */
#define STAGED_CHUNK 1024 /* small: every message is several chunks */
#define MAX_CASES    32

static int W, R, D;
static int ngpu;
static zr_device own_gpu;
static zr_stream *stream; /* the stream the communicators follow */

/* ---- buffers ------------------------------------------------------------------------------ */

static void *buf_alloc(int on_dev, size_t bytes)
{
    void *p = NULL;
    if (on_dev) {
        TEST_OK(zr_device_alloc_at(&own_gpu, &p, bytes, __FILE__, __LINE__));
    } else {
        p = calloc(1, bytes > 0 ? bytes : 1);
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

/* Host bytes into a buffer: on the GPU queued on the followed stream, no host wait. */
static void buf_put(int on_dev, void *dst, const void *host, size_t bytes)
{
    if (on_dev) {
        TEST_OK(zr_memcpy_async(dst, host, bytes, stream));
    } else {
        memcpy(dst, host, bytes);
    }
}

static void buf_get(int on_dev, void *host, const void *src, size_t bytes)
{
    if (on_dev) {
        TEST_OK(zr_memcpy_async(host, src, bytes, stream));
        TEST_OK(zr_stream_sync(stream));
    } else {
        memcpy(host, src, bytes);
    }
}

/* ---- what a run of the cases gives ------------------------------------------------------- */

typedef struct result {
    const char *name;
    unsigned char *bytes; /* the outputs, in order */
    size_t len;
    zr_traffic traffic;
    size_t nonfinite;
} result;

typedef struct run {
    result r[MAX_CASES];
    int n;
} run;

static result *begin_case(zr_comm *c, run *log, const char *name)
{
    ZR_ASSERT(log->n < MAX_CASES);
    result *r = &log->r[log->n++];
    memset(r, 0, sizeof *r);
    r->name = name;
    zr_comm_traffic_reset(c);
    return r;
}

static void keep(result *r, const void *p, size_t bytes)
{
    r->bytes = realloc(r->bytes, r->len + bytes);
    memcpy(r->bytes + r->len, p, bytes);
    r->len += bytes;
}

/* Read a device (or host) buffer back into the case's result. */
static void keep_buf(result *r, int on_dev, const void *buf, size_t bytes)
{
    unsigned char *h = malloc(bytes > 0 ? bytes : 1);
    buf_get(on_dev, h, buf, bytes);
    keep(r, h, bytes);
    free(h);
}

static void end_case(zr_comm *c, result *r, const zr_coll_op *op)
{
    r->traffic = zr_comm_traffic_get(c);
    r->nonfinite += op != NULL ? op->nonfinite : 0;
}

/* Inputs: values of a plausible scale, different per rank and case; an Inf where asked. */
static void fill(float *x, size_t n, int salt, int with_inf)
{
    zr_test_rng rng = {0x9E3779B97F4A7C15ull * (uint64_t)(R + 1) + (uint64_t)salt * 7919u};
    for (size_t i = 0; i < n; i++) {
        x[i] = zr_test_rng_normal(&rng) * 0.05f;
    }
    if (with_inf && R == W - 1 && n > 3) {
        x[3] = INFINITY; /* a non-finite group on the last rank */
    }
}

/* ---- the cases ------------------------------------------------------------------------------ */

/* n elements of the host fp32 array h as type t (bf16: rounded), in a new host buffer. */
static void *as_type(const float *h, size_t n, zr_dtype t)
{
    void *p = malloc(n * zr_dtype_size(t));
    if (t == ZR_DTYPE_BF16) {
        zr_bf16_from_f32_n(p, h, n);
    } else {
        memcpy(p, h, n * sizeof(float));
    }
    return p;
}

/*
 * A bf16 output is the fp32 output of the same call rounded (zr/coll.h,
 * "Types"), on the GPU as on the CPU: the fp32 output, read back, against
 * the bf16 one.
 */
static void check_rounded(const char *name, int on_dev, const void *out32, const void *out16,
                          size_t n)
{
    float *a = malloc(n * sizeof(float));
    zr_bf16 *b = malloc(n * sizeof(zr_bf16));
    buf_get(on_dev, a, out32, n * sizeof(float));
    buf_get(on_dev, b, out16, n * sizeof(zr_bf16));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t x;
        memcpy(&x, &a[i], 4);
        int nan = (x & 0x7f800000u) == 0x7f800000u && (x & 0x007fffffu) != 0;
        bad += nan ? (b[i] & 0x7f80u) != 0x7f80u || (b[i] & 0x7fu) == 0
                   : b[i] != zr_bf16_from_f32(a[i]);
    }
    TEST_CHECKF(bad == 0, "%s on the %s: %zu of %zu bf16 outputs are not the fp32 output rounded",
                name, on_dev ? "GPU" : "CPU", bad, n);
    free(a);
    free(b);
}

/*
 * All-gather over g of a shard of in_type into out_type, wire as given; a
 * bf16 output is also checked against the fp32 output of the same inputs.
 */
static void case_allgather(zr_comm *c, int on_dev, run *log, const char *name, zr_group g,
                           zr_kind kind, const zr_wire *wire, zr_dtype in_type, zr_dtype out_type,
                           int salt)
{
    result *r = begin_case(c, log, name);
    int n = c->size[g];
    size_t count = COUNT, full = (size_t)n * count;
    float *h = malloc(count * sizeof(float));
    fill(h, count, salt, wire->type == ZR_WIRE_QUANT);
    size_t esize = zr_dtype_size(in_type), osize = zr_dtype_size(out_type);
    void *hin = as_type(h, count, in_type);
    void *in = buf_alloc(on_dev, count * esize);
    void *out = buf_alloc(on_dev, full * osize);
    void *out32 = out_type == ZR_DTYPE_F32 ? NULL : buf_alloc(on_dev, full * sizeof(float));
    zr_coll_op op = ZR_COLL_OP_INIT;
    buf_put(on_dev, in, hin, count * esize);
    TEST_OK(zr_allgather(c, g, kind, wire, in_type, in, count, out_type, out, &op));
    if (out32 != NULL) {
        size_t nonfinite = op.nonfinite;
        TEST_OK(zr_allgather(c, g, kind, wire, in_type, in, count, ZR_DTYPE_F32, out32, &op));
        check_rounded(name, on_dev, out32, out, full);
        op.nonfinite += nonfinite;
    }
    end_case(c, r, &op);
    keep_buf(r, on_dev, out, full * osize);
    zr_coll_op_free(&op);
    buf_free(on_dev, in);
    buf_free(on_dev, out);
    if (out32 != NULL) {
        buf_free(on_dev, out32);
    }
    free(h);
    free(hin);
}

/*
 * The hpZ secondary (of type) cut from a full buffer (of unit_type: the
 * gathered unit), then the gather inside the hpZ group into unit_type.
 */
static void case_hpz(zr_comm *c, int on_dev, run *log, const char *name, const zr_wire *wire,
                     zr_dtype unit_type, zr_dtype type)
{
    result *r = begin_case(c, log, name);
    int h = c->size[ZR_GROUP_HPZ];
    size_t count = COUNT, full = (size_t)h * count, usize = zr_dtype_size(unit_type);
    float *hfull = malloc(full * sizeof(float));
    fill(hfull, full, 11, 0);
    void *hunit = as_type(hfull, full, unit_type);
    void *fbuf = buf_alloc(on_dev, full * usize);
    void *sec = buf_alloc(on_dev, count * zr_dtype_size(type));
    void *out = buf_alloc(on_dev, full * usize);
    zr_coll_op op = ZR_COLL_OP_INIT;
    buf_put(on_dev, fbuf, hunit, full * usize);
    TEST_OK(zr_hpz_cut(c, unit_type, fbuf, count, type, sec));
    keep_buf(r, on_dev, sec, count * zr_dtype_size(type));
    TEST_OK(zr_hpz_gather(c, wire, type, sec, count, unit_type, out, &op));
    end_case(c, r, &op);
    keep_buf(r, on_dev, out, full * usize);
    zr_coll_op_free(&op);
    buf_free(on_dev, fbuf);
    buf_free(on_dev, sec);
    buf_free(on_dev, out);
    free(hfull);
    free(hunit);
}

static void case_reduce_scatter(zr_comm *c, int on_dev, run *log, const char *name, zr_group g,
                                zr_wire_type wt, zr_dtype in_type)
{
    result *r = begin_case(c, log, name);
    zr_wire wire = {wt, {0, 0, ZR_QUANT_SYM}};
    size_t count = COUNT, full = (size_t)c->size[g] * count, esize = zr_dtype_size(in_type);
    float *h = malloc(full * sizeof(float));
    fill(h, full, 21 + (int)g, 0);
    void *hin = as_type(h, full, in_type);
    void *in = buf_alloc(on_dev, full * esize);
    float *out = buf_alloc(on_dev, count * sizeof(float));
    zr_coll_op op = ZR_COLL_OP_INIT;
    buf_put(on_dev, in, hin, full * esize);
    TEST_OK(zr_reduce_scatter(c, g, &wire, in_type, in, count, out, &op));
    end_case(c, r, &op);
    keep_buf(r, on_dev, out, count * sizeof(float));
    zr_coll_op_free(&op);
    buf_free(on_dev, in);
    buf_free(on_dev, out);
    free(h);
    free(hin);
}

static void case_allreduce(zr_comm *c, int on_dev, run *log, const char *name, zr_wire_type wt)
{
    result *r = begin_case(c, log, name);
    zr_wire wire = {wt, {0, 0, ZR_QUANT_SYM}};
    size_t count = 3 * COUNT + 7; /* not a multiple of the group size */
    float *h = malloc(count * sizeof(float));
    fill(h, count, 31, 0);
    float *buf = buf_alloc(on_dev, count * sizeof(float));
    zr_coll_op op = ZR_COLL_OP_INIT;
    buf_put(on_dev, buf, h, count * sizeof(float));
    TEST_OK(zr_allreduce(c, ZR_GROUP_WORLD, &wire, buf, count, &op));
    end_case(c, r, &op);
    keep_buf(r, on_dev, buf, count * sizeof(float));
    zr_coll_op_free(&op);
    buf_free(on_dev, buf);
    free(h);
}

/* qgZ: `calls` calls (the residuals carry over with error feedback), outputs and residuals kept. */
static void case_qgz(zr_comm *c, int on_dev, run *log, const char *name, const zr_qgz_config *cfg,
                     zr_dtype in_type, int calls)
{
    result *r = begin_case(c, log, name);
    size_t count = COUNT, full = (size_t)W * count, esize = zr_dtype_size(in_type);
    float *h = malloc(full * sizeof(float));
    void *hin = malloc(full * esize);
    void *in = buf_alloc(on_dev, full * esize);
    float *out = buf_alloc(on_dev, count * sizeof(float));
    zr_qgz_feedback fb;
    memset(&fb, 0, sizeof fb);
    zr_coll_op op = ZR_COLL_OP_INIT;
    for (int call = 0; call < calls; call++) {
        fill(h, full, 41 + call, 1);
        if (in_type == ZR_DTYPE_BF16) {
            zr_bf16_from_f32_n(hin, h, full);
        } else {
            memcpy(hin, h, full * esize);
        }
        buf_put(on_dev, in, hin, full * esize);
        TEST_OK(zr_qgz(c, cfg, in_type, in, count, out, &fb, &op));
        r->nonfinite += op.nonfinite;
        keep_buf(r, on_dev, out, count * sizeof(float));
    }
    end_case(c, r, NULL);
    if (cfg->error_feedback) {
        if (W > 1) { /* one rank copies its input: no residuals */
            TEST_EQ_INT(fb.dev.kind, on_dev ? ZR_DEVICE_CUDA : ZR_DEVICE_CPU);
        }
        keep_buf(r, on_dev, fb.intra, fb.n_intra * sizeof(float));
        keep_buf(r, on_dev, fb.inter, fb.n_inter * sizeof(float));
    }
    zr_qgz_feedback_free(&fb);
    zr_coll_op_free(&op);
    buf_free(on_dev, in);
    buf_free(on_dev, out);
    free(h);
    free(hin);
}

/* A prefetching qwZ and a qgZ in flight together, polled, completed in the other order. */
static void case_in_flight(zr_comm *c, int on_dev, run *log)
{
    result *r = begin_case(c, log, "qwz + qgz in flight");
    zr_wire q8 = {ZR_WIRE_QUANT, {8, QGROUP, ZR_QUANT_SYM}};
    zr_qgz_config cfg = zr_qgz_config_default();
    cfg.q.group = QGROUP;
    cfg.chunks = 2;
    size_t count = COUNT, full = (size_t)W * count;
    float *h = malloc(full * sizeof(float));
    fill(h, full, 51, 0);
    float *shard = buf_alloc(on_dev, count * sizeof(float));
    float *gathered = buf_alloc(on_dev, full * sizeof(float));
    float *grad = buf_alloc(on_dev, full * sizeof(float));
    float *out = buf_alloc(on_dev, count * sizeof(float));
    buf_put(on_dev, shard, h, count * sizeof(float));
    buf_put(on_dev, grad, h, full * sizeof(float));
    zr_coll_op a = ZR_COLL_OP_INIT, b = ZR_COLL_OP_INIT;
    TEST_OK(zr_allgather_start(c, ZR_GROUP_WORLD, ZR_KIND_QWZ, &q8, ZR_DTYPE_F32, shard, count,
                               ZR_DTYPE_F32, gathered, &a));
    TEST_OK(zr_qgz_start(c, &cfg, ZR_DTYPE_F32, grad, count, out, NULL, &b));
    int done = 0;
    for (int i = 0; i < 3 && !done; i++) {
        TEST_OK(zr_coll_test(c, &a, &done));
    }
    TEST_OK(zr_coll_wait(c, &b));
    TEST_OK(zr_coll_wait(c, &a));
    end_case(c, r, &a);
    r->nonfinite += b.nonfinite;
    keep_buf(r, on_dev, gathered, full * sizeof(float));
    keep_buf(r, on_dev, out, count * sizeof(float));
    zr_coll_op_free(&a);
    zr_coll_op_free(&b);
    buf_free(on_dev, shard);
    buf_free(on_dev, gathered);
    buf_free(on_dev, grad);
    buf_free(on_dev, out);
    free(h);
}

static void run_cases(zr_comm *c, int on_dev, run *log)
{
    memset(log, 0, sizeof *log);
    zr_wire f32 = {ZR_WIRE_F32, {0, 0, ZR_QUANT_SYM}}, bf16 = {ZR_WIRE_BF16, {0, 0, ZR_QUANT_SYM}};
    zr_wire q8 = {ZR_WIRE_QUANT, {8, QGROUP, ZR_QUANT_SYM}};
    zr_wire q4 = {ZR_WIRE_QUANT, {4, QGROUP, ZR_QUANT_ASYM}};
    const zr_dtype F = ZR_DTYPE_F32, H = ZR_DTYPE_BF16;
    /* all-gathers: "wire <- in", and "-> bf16" for a bf16 output */
    case_allgather(c, on_dev, log, "allgather f32 <- f32", ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, &f32,
                   F, F, 1);
    case_allgather(c, on_dev, log, "allgather f32 <- bf16", ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, &f32,
                   H, F, 2);
    case_allgather(c, on_dev, log, "allgather bf16 <- f32", ZR_GROUP_WORLD, ZR_KIND_ALLGATHER,
                   &bf16, F, F, 3);
    case_allgather(c, on_dev, log, "allgather bf16 <- bf16 (node)", ZR_GROUP_NODE,
                   ZR_KIND_ALLGATHER, &bf16, H, F, 4);
    case_allgather(c, on_dev, log, "allgather bf16 <- f32 -> bf16", ZR_GROUP_WORLD,
                   ZR_KIND_ALLGATHER, &bf16, F, H, 7);
    case_allgather(c, on_dev, log, "allgather f32 <- f32 -> bf16 (node)", ZR_GROUP_NODE,
                   ZR_KIND_ALLGATHER, &f32, F, H, 8);
    case_allgather(c, on_dev, log, "allgather f32 <- bf16 -> bf16", ZR_GROUP_WORLD,
                   ZR_KIND_ALLGATHER, &f32, H, H, 9);
    case_allgather(c, on_dev, log, "qwz int8 <- f32", ZR_GROUP_WORLD, ZR_KIND_QWZ, &q8, F, F, 5);
    case_allgather(c, on_dev, log, "qwz int4 asym <- bf16 (cross)", ZR_GROUP_CROSS, ZR_KIND_QWZ,
                   &q4, H, F, 6);
    case_allgather(c, on_dev, log, "qwz int8 <- f32 -> bf16", ZR_GROUP_WORLD, ZR_KIND_QWZ, &q8, F,
                   H, 10);
    case_hpz(c, on_dev, log, "hpz bf16", &bf16, F, H);
    case_hpz(c, on_dev, log, "hpz f32 secondary, qwz int8", &q8, F, F);
    case_hpz(c, on_dev, log, "hpz bf16 unit, bf16", &bf16, H, H);
    case_hpz(c, on_dev, log, "hpz bf16 unit, qwz int8", &q8, H, H);
    case_hpz(c, on_dev, log, "hpz bf16 unit, f32 wire", &f32, H, H);
    case_reduce_scatter(c, on_dev, log, "reduce-scatter f32", ZR_GROUP_WORLD, ZR_WIRE_F32, F);
    case_reduce_scatter(c, on_dev, log, "reduce-scatter bf16", ZR_GROUP_WORLD, ZR_WIRE_BF16, F);
    case_reduce_scatter(c, on_dev, log, "reduce-scatter f32 (node)", ZR_GROUP_NODE, ZR_WIRE_F32, F);
    case_reduce_scatter(c, on_dev, log, "reduce-scatter bf16 <- bf16", ZR_GROUP_WORLD, ZR_WIRE_BF16,
                        H);
    case_reduce_scatter(c, on_dev, log, "reduce-scatter f32 <- bf16 (node)", ZR_GROUP_NODE,
                        ZR_WIRE_F32, H);
    case_allreduce(c, on_dev, log, "allreduce f32", ZR_WIRE_F32);
    case_allreduce(c, on_dev, log, "allreduce bf16", ZR_WIRE_BF16);
    zr_qgz_config cfg = zr_qgz_config_default();
    cfg.q.group = QGROUP;
    case_qgz(c, on_dev, log, "qgz int4", &cfg, ZR_DTYPE_F32, 1);
    cfg.chunks = 3;
    cfg.error_feedback = 1;
    /* 3 chunks: the third reuses the first's buffers; the second call starts from residuals */
    case_qgz(c, on_dev, log, "qgz int4, 3 chunks, error feedback x2", &cfg, ZR_DTYPE_F32, 2);
    cfg.q.bits = 8;
    cfg.chunks = 2;
    case_qgz(c, on_dev, log, "qgz int8 <- bf16, 2 chunks, error feedback", &cfg, ZR_DTYPE_BF16, 1);
    case_in_flight(c, on_dev, log);
}

static void run_free(run *log)
{
    for (int i = 0; i < log->n; i++) {
        free(log->r[i].bytes);
    }
}

/* ---- comparison ----------------------------------------------------------------------------- */

static run cpu_run; /* the MPI transport on host memory */

/* The same bits, or both NaN (a NaN's payload is the hardware's). */
static int same_float(uint32_t a, uint32_t b)
{
    int nan_a = (a & 0x7f800000u) == 0x7f800000u && (a & 0x007fffffu) != 0;
    int nan_b = (b & 0x7f800000u) == 0x7f800000u && (b & 0x007fffffu) != 0;
    return a == b || (nan_a && nan_b);
}

static void compare(const run *got, const char *transport)
{
    TEST_EQ_INT(got->n, cpu_run.n);
    for (int i = 0; i < got->n && i < cpu_run.n; i++) {
        const result *g = &got->r[i], *e = &cpu_run.r[i];
        TEST_CHECKF(g->len == e->len, "%s, %s: %zu output bytes, CPU %zu", transport, g->name,
                    g->len, e->len);
        size_t bad = 0, first = 0;
        for (size_t b = 0; g->len == e->len && b + 4 <= g->len; b += 4) {
            uint32_t x, y;
            memcpy(&x, g->bytes + b, 4);
            memcpy(&y, e->bytes + b, 4);
            if (!same_float(x, y) && bad++ == 0) {
                first = b;
            }
        }
        TEST_CHECKF(bad == 0,
                    "%s, %s: %zu of %zu words differ from the CPU path (first at byte %zu)",
                    transport, g->name, bad, g->len / 4, first);
        TEST_CHECKF(memcmp(&g->traffic, &e->traffic, sizeof g->traffic) == 0,
                    "%s, %s: the traffic counters differ from the CPU path's", transport, g->name);
        TEST_CHECKF(g->nonfinite == e->nonfinite, "%s, %s: %zu non-finite groups, CPU %zu",
                    transport, g->name, g->nonfinite, e->nonfinite);
    }
}

static zr_status use(zr_comm *c, const zr_transport *t)
{
    zr_transport_device arg = {&own_gpu, stream, STAGED_CHUNK};
    return zr_comm_use_transport(c, t, &arg);
}

static void through(const zr_transport *t, const char *name)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    TEST_OK(use(&c, t));
    if (c.transport == t) {
        TEST_CHECK(zr_comm_device(&c, NULL) != NULL);
        run got;
        run_cases(&c, 1, &got);
        compare(&got, name);
        run_free(&got);
    }
    zr_comm_free(&c);
}

static void test_staged(void)
{
    through(&zr_transport_staged, "staged transport");
}

static void test_nccl(void)
{
    if (D > ngpu) {
        return; /* ranks of a node share a GPU: NCCL refuses them (test_transport checks that) */
    }
    through(&zr_transport_nccl, "NCCL transport");
}

/*
 * A block that fails validation: the last rank quantizes with groups of 296
 * instead of 256 (the same block size for 600 elements: 3 groups either way),
 * so every other rank refuses its block, and it refuses theirs. The device op
 * fails too, with the same message as the CPU path's on every rank, instead
 * of succeeding with what its kernels decoded.
 */
static zr_status bad_block_run(zr_comm *c, int on_dev, char *msg, size_t len)
{
    zr_wire q8 = {ZR_WIRE_QUANT, {8, R == W - 1 ? 296 : QGROUP, ZR_QUANT_SYM}};
    float *h = malloc(COUNT * sizeof(float));
    fill(h, COUNT, 61, 0);
    float *in = buf_alloc(on_dev, COUNT * sizeof(float));
    float *out = buf_alloc(on_dev, (size_t)W * COUNT * sizeof(float));
    buf_put(on_dev, in, h, COUNT * sizeof(float));
    zr_coll_op op = ZR_COLL_OP_INIT;
    zr_status st = zr_allgather(c, ZR_GROUP_WORLD, ZR_KIND_QWZ, &q8, ZR_DTYPE_F32, in, COUNT,
                                ZR_DTYPE_F32, out, &op);
    snprintf(msg, len, "%s", st == ZR_OK ? "" : zr_error_message());
    TEST_CHECK(!op.active);
    zr_coll_op_free(&op);
    buf_free(on_dev, in);
    buf_free(on_dev, out);
    free(h);
    return st;
}

static void test_bad_block(void)
{
    if (W == 1) {
        return; /* a rank validates its own block with its own parameters */
    }
    char cpu_msg[1024], dev_msg[1024];
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    zr_status cpu_st = bad_block_run(&c, 0, cpu_msg, sizeof cpu_msg);
    TEST_EQ_INT(cpu_st, ZR_ERR_FORMAT); /* the last rank refuses the others' blocks in turn */
    zr_comm_free(&c);
    const zr_transport *t[2] = {&zr_transport_staged, &zr_transport_nccl};
    for (int i = 0; i < 2; i++) {
        if (t[i] == &zr_transport_nccl && D > ngpu) {
            continue;
        }
        TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
        TEST_OK(use(&c, t[i]));
        zr_status st = bad_block_run(&c, 1, dev_msg, sizeof dev_msg);
        TEST_EQ_INT(st, cpu_st);
        TEST_CHECKF(strcmp(dev_msg, cpu_msg) == 0, "%s: the device says '%s', the CPU '%s'",
                    t[i]->name, dev_msg, cpu_msg);
        zr_comm_free(&c);
    }
    if (R == 0) {
        TEST_CHECKF(strstr(cpu_msg, "qwZ: block from world rank") != NULL &&
                        strstr(cpu_msg, "group 296, expected 256") != NULL,
                    "the CPU's message: %s", cpu_msg);
    }
}

/* The CPU path on a communicator that never had a device transport reports no device. */
static void test_host_comm(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    zr_stream *s = stream;
    TEST_CHECK(zr_comm_device(&c, &s) == NULL);
    TEST_CHECK(s == NULL);
    zr_comm_free(&c);
}

int main(int argc, char **argv)
{
    setenv("ZR_EMU_DEVICES", "8", 0); /* the emulator: room for a GPU per rank of a node */
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
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    run_cases(&c, 0, &cpu_run);
    zr_comm_free(&c);
    TEST_RUN(test_host_comm);
    TEST_RUN(test_staged);
    TEST_RUN(test_nccl);
    TEST_RUN(test_bad_block);
    run_free(&cpu_run);
    zr_stream_destroy(stream);
    return zr_test_finish();
}
