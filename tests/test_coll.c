/*
 * test_coll.c - the collectives at any rank count and emulated layout.
 *
 * Every rank can compute every other rank's input (val() below depends only
 * on rank, index and seed), so each rank checks its own result against a
 * reference computed locally, without trusting any communication:
 *
 *   exact all-gather / reduce-scatter / all-reduce
 *       fp32: bit-exact against the rank-order sum divided by n (the order
 *       zr promises), and against MPI's own collective on the same data
 *       (MPI_Allgather bit-exact; MPI_Reduce_scatter_block / MPI_Allreduce
 *       within n ulps of the sum, MPI's order being its own);
 *       bf16 wire: bit-exact against the reference with every term rounded
 *       to bf16, and within the rounding bound of the true mean.
 *   qwZ  |x - x'| <= scale = absmax(group) / 2^(bits-1) per element
 *       (quant.h: <= scale/2, except next to +absmax where <= scale).
 *   qgZ  |mean - out| <= sum over the W contributions of their hop-1 scale
 *       + sum over the N nodes of their hop-2 scale, where a node's partial
 *       sum has absmax <= sum over its D ranks of (absmax + hop-1 scale).
 *       Checked for odd counts, bf16 inputs, one node, three nodes, D = 1.
 *   types: a bf16 all-gather output (every wire, either input, qwZ, hpZ, in
 *       place) is the fp32 output rounded to bf16, bit for bit; a bf16
 *       reduce-scatter input gives the bits of the fp32 input of the same
 *       values, on either wire; an hpZ cut from a bf16 unit is the cut of
 *       the fp32 one.
 *   traffic: exact byte counts from zr_quant_block_bytes; the qwZ / bf16 and
 *       qgZ / bf16 inter-node ratios; every algorithm's cost (zr_coll_cost, on
 *       a layout built without MPI) equals the calls and bytes the run
 *       accounts and the workspace it reserves, for every input and output
 *       type, and counts a conversion exactly where two types differ.
 *   pipelining bit-identical to one chunk; error feedback's running mean
 *   converges; several collectives in flight at once; errors.
 */
#define ZR_TEST_MPI
#include "test.h"
#include "zr/pool.h"

#include "zr/coll.h"

#include <float.h>

static int W, R, D, N;

/* Test value of element i on rank r: uniform in [-1, 1) times a magnitude
 * that changes every 64 elements, so quantization groups get different scales. */
static float val(int r, size_t i, unsigned seed)
{
    uint64_t x = (uint64_t)(r + 1) * 0x9E3779B97F4A7C15ull ^
                 (uint64_t)(i + 1) * 0xBF58476D1CE4E5B9ull ^
                 (uint64_t)(seed + 7) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    x *= 0xD6E8FEB86659FD93ull;
    x ^= x >> 29;
    float u = (float)((double)(x >> 40) * (1.0 / 16777216.0) * 2.0 - 1.0);
    return u * (float)(1 + (i / 64) % 5);
}

/* The value as the collective sees it: bf16 inputs are rounded once. */
static float seen(int r, size_t i, unsigned seed, zr_dtype t)
{
    float v = val(r, i, seed);
    return t == ZR_DTYPE_BF16 ? zr_bf16_to_f32(zr_bf16_from_f32(v)) : v;
}

static float bf16_round(float v)
{
    return zr_bf16_to_f32(zr_bf16_from_f32(v));
}

/* Fill n elements of type t with val(r, off + k, seed). */
static void *make_input(int r, size_t off, size_t n, unsigned seed, zr_dtype t)
{
    void *p = malloc((n ? n : 1) * zr_dtype_size(t));
    for (size_t k = 0; k < n; k++) {
        float v = val(r, off + k, seed);
        if (t == ZR_DTYPE_BF16) {
            ((zr_bf16 *)p)[k] = zr_bf16_from_f32(v);
        } else {
            ((float *)p)[k] = v;
        }
    }
    return p;
}

static zr_wire wire_of(zr_wire_type t, int bits, int group)
{
    zr_wire w;
    memset(&w, 0, sizeof w);
    w.type = t;
    w.q.bits = bits;
    w.q.group = group;
    w.q.scheme = ZR_QUANT_SYM;
    return w;
}

static const zr_group groups[] = {ZR_GROUP_WORLD, ZR_GROUP_NODE, ZR_GROUP_CROSS, ZR_GROUP_HPZ};
/* Elements per rank; with --threads N a fifth count large enough that the codecs, casts and
   means of every collective run on N threads (zr_threads_set), whose results must not change. */
static size_t counts[] = {1, 37, 1000, 4099, 0};
static size_t ncounts = 4;
#define THREADED_COUNT (3 * 65536 + 1029) /* three tasks of the pool and a short group */

/* ---- exact baselines ----------------------------------------------------- */

static void test_allgather_exact(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    zr_coll_op op = ZR_COLL_OP_INIT;
    for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
        zr_group g = groups[gi];
        int n = c.size[g];
        for (size_t ci = 0; ci < ncounts; ci++) {
            size_t count = counts[ci];
            unsigned seed = (unsigned)(gi * 10 + ci);
            float *in = make_input(R, 0, count, seed, ZR_DTYPE_F32);
            zr_bf16 *in16 = make_input(R, 0, count, seed, ZR_DTYPE_BF16);
            float *out = malloc(sizeof(float) * n * count);
            float *ref = malloc(sizeof(float) * n * count);
            MPI_Allgather(in, (int)count, MPI_FLOAT, ref, (int)count, MPI_FLOAT,
                          zr_comm_mpi(&c, g));
            zr_wire f32 = wire_of(ZR_WIRE_F32, 0, 0), b16 = wire_of(ZR_WIRE_BF16, 0, 0);
            /* fp32 wire, fp32 in: MPI's bits */
            TEST_OK(zr_allgather(&c, g, ZR_KIND_ALLGATHER, &f32, ZR_DTYPE_F32, in, count,
                                 ZR_DTYPE_F32, out, &op));
            TEST_CHECKF(memcmp(out, ref, sizeof(float) * n * count) == 0,
                        "fp32 all-gather over %s, count %zu differs from MPI_Allgather",
                        zr_group_name(g), count);
            /* in place: my shard already in my slot of out */
            memcpy(out + (size_t)c.rank[g] * count, in, sizeof(float) * count);
            TEST_OK(zr_allgather(&c, g, ZR_KIND_ALLGATHER, &f32, ZR_DTYPE_F32,
                                 out + (size_t)c.rank[g] * count, count, ZR_DTYPE_F32, out, &op));
            TEST_CHECK(memcmp(out, ref, sizeof(float) * n * count) == 0);
            /* bf16 wire: every value rounded once, within 2^-9 relative */
            int ok = 1;
            TEST_OK(zr_allgather(&c, g, ZR_KIND_ALLGATHER, &b16, ZR_DTYPE_F32, in, count,
                                 ZR_DTYPE_F32, out, &op));
            for (size_t k = 0; k < n * count; k++) {
                ok &= out[k] == bf16_round(ref[k]) &&
                      fabsf(out[k] - ref[k]) <= fabsf(ref[k]) * (1.0f / 256.0f);
            }
            TEST_CHECKF(ok, "bf16 all-gather over %s, count %zu", zr_group_name(g), count);
            /* bf16 in, either wire: the bf16 values exactly */
            for (int wt = 0; wt < 2; wt++) {
                ok = 1;
                TEST_OK(zr_allgather(&c, g, ZR_KIND_ALLGATHER, wt ? &b16 : &f32, ZR_DTYPE_BF16,
                                     in16, count, ZR_DTYPE_F32, out, &op));
                for (size_t k = 0; k < n * count; k++) {
                    ok &= out[k] == bf16_round(ref[k]);
                }
                TEST_CHECKF(ok, "bf16-in all-gather (%s wire) over %s", wt ? "bf16" : "fp32",
                            zr_group_name(g));
            }
            free(in), free(in16), free(out), free(ref);
        }
    }
    zr_coll_op_free(&op);
    zr_comm_free(&c);
}

static void test_reduce_scatter_exact(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    zr_coll_op op = ZR_COLL_OP_INIT;
    for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
        zr_group g = groups[gi];
        int n = c.size[g], me = c.rank[g];
        for (size_t ci = 0; ci < ncounts; ci++) {
            size_t count = counts[ci];
            unsigned seed = (unsigned)(100 + gi * 10 + ci);
            float *in = make_input(R, 0, n * count, seed, ZR_DTYPE_F32);
            float *out = malloc(sizeof(float) * count), *mpi = malloc(sizeof(float) * count);
            MPI_Reduce_scatter_block(in, mpi, (int)count, MPI_FLOAT, MPI_SUM, zr_comm_mpi(&c, g));
            zr_wire f32 = wire_of(ZR_WIRE_F32, 0, 0), b16 = wire_of(ZR_WIRE_BF16, 0, 0);
            TEST_OK(zr_reduce_scatter(&c, g, &f32, ZR_DTYPE_F32, in, count, out, &op));
            int exact = 1, near_mpi = 1;
            for (size_t i = 0; i < count; i++) {
                size_t e = (size_t)me * count + i;
                float s = 0.0f, mag = 0.0f;
                for (int k = 0; k < n; k++) {
                    float v = val(zr_comm_world_rank(&c, g, k), e, seed);
                    s = k == 0 ? v : s + v;
                    mag += fabsf(v);
                }
                exact &= out[i] == s / (float)n;
                near_mpi &= fabsf(out[i] - mpi[i] / (float)n) <= 2.0f * FLT_EPSILON * mag + 1e-30f;
            }
            TEST_CHECKF(exact, "fp32 reduce-scatter over %s count %zu: not the rank-order mean",
                        zr_group_name(g), count);
            TEST_CHECKF(near_mpi, "fp32 reduce-scatter over %s count %zu: far from MPI",
                        zr_group_name(g), count);
            TEST_OK(zr_reduce_scatter(&c, g, &b16, ZR_DTYPE_F32, in, count, out, &op));
            exact = 1;
            int bound = 1;
            for (size_t i = 0; i < count; i++) {
                size_t e = (size_t)me * count + i;
                float s = 0.0f;
                double truth = 0.0, mag = 0.0;
                for (int k = 0; k < n; k++) {
                    float v = val(zr_comm_world_rank(&c, g, k), e, seed);
                    s = k == 0 ? bf16_round(v) : s + bf16_round(v);
                    truth += v;
                    mag += fabs(v);
                }
                exact &= out[i] == s / (float)n;
                /* each term off by <= 2^-8 relative (8 significant bits), plus fp32 sums */
                bound &= fabs(out[i] - truth / n) <= mag / n * (1.0 / 256 + (n + 2) * 1.2e-7);
            }
            TEST_CHECKF(exact && bound, "bf16 reduce-scatter over %s count %zu (exact %d bound %d)",
                        zr_group_name(g), count, exact, bound);
            free(in), free(out), free(mpi);
        }
    }
    zr_coll_op_free(&op);
    zr_comm_free(&c);
}

static void test_allreduce_exact(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    zr_coll_op op = ZR_COLL_OP_INIT;
    const size_t ar_counts[] = {1, 7, 1001, 4096};
    for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
        zr_group g = groups[gi];
        int n = c.size[g];
        for (size_t ci = 0; ci < sizeof ar_counts / sizeof ar_counts[0]; ci++) {
            size_t count = ar_counts[ci];
            unsigned seed = (unsigned)(200 + gi * 10 + ci);
            float *buf = make_input(R, 0, count, seed, ZR_DTYPE_F32);
            float *mpi = malloc(sizeof(float) * count);
            MPI_Allreduce(buf, mpi, (int)count, MPI_FLOAT, MPI_SUM, zr_comm_mpi(&c, g));
            for (int wt = 0; wt < 2; wt++) {
                zr_wire w = wire_of(wt ? ZR_WIRE_BF16 : ZR_WIRE_F32, 0, 0);
                float *b = make_input(R, 0, count, seed, ZR_DTYPE_F32);
                TEST_OK(zr_allreduce(&c, g, &w, b, count, &op));
                int exact = 1, near_mpi = 1;
                for (size_t i = 0; i < count; i++) {
                    float s = 0.0f, mag = 0.0f;
                    for (int k = 0; k < n; k++) {
                        float v = val(zr_comm_world_rank(&c, g, k), i, seed);
                        v = wt ? bf16_round(v) : v;
                        s = k == 0 ? v : s + v;
                        mag += fabsf(v);
                    }
                    float ref = s / (float)n;
                    ref = wt ? bf16_round(ref) : ref;
                    exact &= b[i] == ref;
                    float tol = wt ? mag / (float)n * (2.0f / 256.0f) + 1e-30f
                                   : 2.0f * FLT_EPSILON * mag + 1e-30f;
                    near_mpi &= fabsf(b[i] - mpi[i] / (float)n) <= tol;
                }
                TEST_CHECKF(exact && near_mpi, "%s all-reduce over %s count %zu (exact %d mpi %d)",
                            wt ? "bf16" : "fp32", zr_group_name(g), count, exact, near_mpi);
                free(b);
            }
            free(buf), free(mpi);
        }
    }
    zr_coll_op_free(&op);
    zr_comm_free(&c);
}

/* ---- qwZ and hpZ ---------------------------------------------------------- */

/* |out - x| <= absmax(group) / 2^(bits-1) for every element of a shard. */
static int qwz_within(const float *out, int src_rank, size_t count, unsigned seed, zr_dtype t,
                      int bits, int G, double *max_err)
{
    int ok = 1;
    for (size_t g0 = 0; g0 < count; g0 += (size_t)G) {
        size_t g1 = g0 + (size_t)G < count ? g0 + (size_t)G : count;
        float amax = 0.0f;
        for (size_t i = g0; i < g1; i++) {
            amax = fmaxf(amax, fabsf(seen(src_rank, i, seed, t)));
        }
        double scale = (double)amax / (double)(1 << (bits - 1));
        for (size_t i = g0; i < g1; i++) {
            double err = fabs((double)out[i] - seen(src_rank, i, seed, t));
            *max_err = fmax(*max_err, err / (scale > 0 ? scale : 1));
            ok &= err <= scale * (1 + 1e-4); /* 127 * scale rounds in fp32 */
        }
    }
    return ok;
}

/* Same bytes on every rank of a group? */
static int same_in_group(zr_comm *c, zr_group g, const void *p, size_t bytes)
{
    uint32_t h = zr_crc32c(0, p, bytes), lo = h, hi = h;
    MPI_Allreduce(&h, &lo, 1, MPI_UINT32_T, MPI_MIN, zr_comm_mpi(c, g));
    MPI_Allreduce(&h, &hi, 1, MPI_UINT32_T, MPI_MAX, zr_comm_mpi(c, g));
    return lo == hi;
}

static void test_qwz(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    zr_coll_op op = ZR_COLL_OP_INIT;
    const zr_group qg[] = {ZR_GROUP_WORLD, ZR_GROUP_HPZ};
    const size_t qc[] = {1, 100, 5000, THREADED_COUNT}; /* the last with --threads only */
    for (int gi = 0; gi < 2; gi++) {
        zr_group g = qg[gi];
        int n = c.size[g];
        for (int bits = 8; bits >= 4; bits -= 4) {
            for (int ti = 0; ti < 2; ti++) {
                zr_dtype t = ti ? ZR_DTYPE_BF16 : ZR_DTYPE_F32;
                for (size_t ci = 0; ci < (ncounts > 4 ? 4u : 3u); ci++) {
                    size_t count = qc[ci];
                    int G = ci >= 2 ? ZR_QUANT_DEFAULT_GROUP : 64;
                    unsigned seed = (unsigned)(300 + gi * 100 + bits * 10 + ti * 3 + ci);
                    void *in = make_input(R, 0, count, seed, t);
                    float *out = malloc(sizeof(float) * n * count);
                    zr_wire w = wire_of(ZR_WIRE_QUANT, bits, G);
                    TEST_OK(
                        zr_allgather(&c, g, ZR_KIND_QWZ, &w, t, in, count, ZR_DTYPE_F32, out, &op));
                    int ok = 1;
                    double worst = 0;
                    for (int p = 0; p < n; p++) {
                        ok &= qwz_within(out + (size_t)p * count, zr_comm_world_rank(&c, g, p),
                                         count, seed, t, bits, G, &worst);
                    }
                    TEST_CHECKF(ok, "qwZ int%d %s over %s count %zu: error %.3g scales", bits,
                                zr_dtype_name(t), zr_group_name(g), count, worst);
                    TEST_CHECK(same_in_group(&c, g, out, sizeof(float) * n * count));
                    TEST_EQ_INT(op.nonfinite, 0);
                    free(in), free(out);
                }
            }
        }
    }
    /* a NaN travels as a NaN group, counted on every rank */
    size_t count = 256;
    float *in = make_input(R, 0, count, 1, ZR_DTYPE_F32), *out = malloc(sizeof(float) * W * count);
    if (R == 0) {
        in[70] = NAN;
    }
    zr_wire w = wire_of(ZR_WIRE_QUANT, 8, 64);
    TEST_OK(zr_allgather(&c, ZR_GROUP_WORLD, ZR_KIND_QWZ, &w, ZR_DTYPE_F32, in, count, ZR_DTYPE_F32,
                         out, &op));
    TEST_EQ_INT(op.nonfinite, 1);
    TEST_CHECK(isnan(out[64]) && isnan(out[127]) && !isnan(out[63]) && !isnan(out[128]));
    free(in), free(out);
    zr_coll_op_free(&op);
    zr_comm_free(&c);
}

static void test_hpz(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    zr_coll_op op = ZR_COLL_OP_INIT;
    int h = c.size[ZR_GROUP_HPZ];
    size_t count = 777;
    /* the full buffer the forward gather would have left: the same on every rank */
    float *full = make_input(0, 0, (size_t)h * count, 42, ZR_DTYPE_F32);
    float *sec = malloc(sizeof(float) * count), *back = malloc(sizeof(float) * h * count);
    zr_bf16 *sec16 = malloc(sizeof(zr_bf16) * count);
    TEST_OK(zr_hpz_cut(&c, ZR_DTYPE_F32, full, count, ZR_DTYPE_F32, sec));
    const float *my_slice = full + (size_t)c.rank[ZR_GROUP_HPZ] * count;
    TEST_CHECK(memcmp(sec, my_slice, sizeof(float) * count) == 0);
    zr_wire f32 = wire_of(ZR_WIRE_F32, 0, 0), q8 = wire_of(ZR_WIRE_QUANT, 8, 64);
    zr_comm_traffic_reset(&c);
    TEST_OK(zr_hpz_gather(&c, &f32, ZR_DTYPE_F32, sec, count, ZR_DTYPE_F32, back, &op));
    TEST_CHECK(memcmp(back, full, sizeof(float) * h * count) == 0);
    zr_traffic t = zr_comm_traffic_get(&c);
    TEST_EQ_INT(t.kind[ZR_KIND_HPZ].calls, 1);
    TEST_EQ_INT(t.kind[ZR_KIND_HPZ].bytes_inter, 0);
    TEST_EQ_INT(t.kind[ZR_KIND_HPZ].bytes_intra, (uint64_t)(h - 1) * count * 4);
    /* bf16 secondary: the bf16 values exactly */
    TEST_OK(zr_hpz_cut(&c, ZR_DTYPE_F32, full, count, ZR_DTYPE_BF16, sec16));
    TEST_OK(zr_hpz_gather(&c, &f32, ZR_DTYPE_BF16, sec16, count, ZR_DTYPE_F32, back, &op));
    int ok = 1;
    for (size_t i = 0; i < (size_t)h * count; i++) {
        ok &= back[i] == bf16_round(full[i]);
    }
    TEST_CHECK(ok);
    /* quantized gather of the secondary (qwZ inside the node) */
    zr_comm_traffic_reset(&c);
    TEST_OK(zr_hpz_gather(&c, &q8, ZR_DTYPE_F32, sec, count, ZR_DTYPE_F32, back, &op));
    double worst = 0;
    ok = 1;
    for (int p = 0; p < h; p++) {
        /* full is rank 0's val() sequence, slice p starts at p * count */
        for (size_t g0 = 0; g0 < count; g0 += 64) {
            size_t g1 = g0 + 64 < count ? g0 + 64 : count;
            float amax = 0;
            for (size_t i = g0; i < g1; i++) {
                amax = fmaxf(amax, fabsf(full[(size_t)p * count + i]));
            }
            for (size_t i = g0; i < g1; i++) {
                double err = fabs(back[(size_t)p * count + i] - full[(size_t)p * count + i]);
                worst = fmax(worst, err);
                ok &= err <= amax / 128.0 * (1 + 1e-4);
            }
        }
    }
    TEST_CHECKF(ok, "quantized hpZ gather: worst error %g", worst);
    t = zr_comm_traffic_get(&c);
    TEST_EQ_INT(t.kind[ZR_KIND_HPZ].bytes_inter, 0);
    TEST_EQ_INT(t.kind[ZR_KIND_HPZ].bytes_intra,
                (uint64_t)(h - 1) * zr_quant_block_bytes(&q8.q, count));
    free(full), free(sec), free(sec16), free(back);
    zr_coll_op_free(&op);
    zr_comm_free(&c);
}

/* ---- the types of the buffers ---------------------------------------------------- */

/* out16[k] is out32[k] rounded to bf16, bit for bit, for every k. */
static int rounded_bits(const zr_bf16 *out16, const float *out32, size_t n)
{
    int ok = 1;
    for (size_t k = 0; k < n; k++) {
        ok &= out16[k] == zr_bf16_from_f32(out32[k]);
    }
    return ok;
}

/*
 * A bf16 output of an all-gather (zr/coll.h, "Types") is the fp32 output of
 * the same call rounded to bf16, bit for bit: on every exact wire from
 * either input type, and qwZ decoding straight to bf16; in place too (my
 * bf16 shard in my slot of the bf16 output).
 */
static void test_allgather_types(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    zr_coll_op op = ZR_COLL_OP_INIT;
    zr_wire wires[] = {wire_of(ZR_WIRE_F32, 0, 0), wire_of(ZR_WIRE_BF16, 0, 0),
                       wire_of(ZR_WIRE_QUANT, 8, 64), wire_of(ZR_WIRE_QUANT, 4, 64)};
    const char *names[] = {"fp32", "bf16", "qwZ int8", "qwZ int4"};
    for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
        zr_group g = groups[gi];
        size_t n = (size_t)c.size[g], me = (size_t)c.rank[g];
        for (size_t ci = 0; ci < ncounts; ci++) {
            size_t count = counts[ci];
            float *out32 = malloc(sizeof(float) * n * count);
            zr_bf16 *out16 = malloc(sizeof(zr_bf16) * n * count);
            for (int w = 0; w < 4; w++) {
                for (int t = 0; t < 2; t++) {
                    zr_dtype in_type = t ? ZR_DTYPE_BF16 : ZR_DTYPE_F32;
                    unsigned seed = (unsigned)(700 + gi * 40 + ci * 8 + (size_t)w * 2 + (size_t)t);
                    void *in = make_input(R, 0, count, seed, in_type);
                    TEST_OK(zr_allgather(&c, g, ZR_KIND_ALLGATHER, &wires[w], in_type, in, count,
                                         ZR_DTYPE_F32, out32, &op));
                    memset(out16, 0xff, sizeof(zr_bf16) * n * count);
                    TEST_OK(zr_allgather(&c, g, ZR_KIND_ALLGATHER, &wires[w], in_type, in, count,
                                         ZR_DTYPE_BF16, out16, &op));
                    TEST_CHECKF(rounded_bits(out16, out32, n * count),
                                "%s all-gather of %s over %s, count %zu: the bf16 output is not "
                                "the fp32 output rounded",
                                names[w], zr_dtype_name(in_type), zr_group_name(g), count);
                    free(in);
                }
                /* in place: my bf16 shard already in my slot of the bf16 output */
                zr_bf16 *in16 = make_input(R, 0, count, 9, ZR_DTYPE_BF16);
                TEST_OK(zr_allgather(&c, g, ZR_KIND_ALLGATHER, &wires[w], ZR_DTYPE_BF16, in16,
                                     count, ZR_DTYPE_F32, out32, &op));
                memcpy(out16 + me * count, in16, sizeof(zr_bf16) * count);
                TEST_OK(zr_allgather(&c, g, ZR_KIND_ALLGATHER, &wires[w], ZR_DTYPE_BF16,
                                     out16 + me * count, count, ZR_DTYPE_BF16, out16, &op));
                TEST_CHECKF(rounded_bits(out16, out32, n * count),
                            "%s all-gather in place over %s, count %zu", names[w], zr_group_name(g),
                            count);
                free(in16);
            }
            free(out32), free(out16);
        }
    }
    zr_coll_op_free(&op);
    zr_comm_free(&c);
}

/*
 * A bf16 input to the reduce-scatter gives, bit for bit, the output of the
 * fp32 input holding the same values (each term widened exactly, the sum
 * fp32 in rank order), on either wire.
 */
static void test_reduce_scatter_types(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    zr_coll_op op = ZR_COLL_OP_INIT;
    zr_wire wires[] = {wire_of(ZR_WIRE_F32, 0, 0), wire_of(ZR_WIRE_BF16, 0, 0)};
    for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
        zr_group g = groups[gi];
        size_t n = (size_t)c.size[g];
        for (size_t ci = 0; ci < ncounts; ci++) {
            size_t count = counts[ci];
            unsigned seed = (unsigned)(800 + gi * 10 + ci);
            zr_bf16 *in16 = make_input(R, 0, n * count, seed, ZR_DTYPE_BF16);
            float *in32 = malloc(sizeof(float) * n * count);
            zr_bf16_to_f32_n(in32, in16, n * count);
            float *a = malloc(sizeof(float) * count), *b = malloc(sizeof(float) * count);
            for (int w = 0; w < 2; w++) {
                TEST_OK(zr_reduce_scatter(&c, g, &wires[w], ZR_DTYPE_F32, in32, count, a, &op));
                TEST_OK(zr_reduce_scatter(&c, g, &wires[w], ZR_DTYPE_BF16, in16, count, b, &op));
                TEST_CHECKF(memcmp(a, b, sizeof(float) * count) == 0,
                            "%s-wire reduce-scatter of bf16 over %s, count %zu: not the fp32 "
                            "input's bits",
                            w ? "bf16" : "fp32", zr_group_name(g), count);
            }
            free(in16), free(in32), free(a), free(b);
        }
    }
    zr_coll_op_free(&op);
    zr_comm_free(&c);
}

/*
 * hpZ on bf16 units: a secondary cut from a bf16 full buffer is the one cut
 * from the fp32 buffer (rounded), and a gather into a bf16 buffer is the fp32
 * gather rounded, on every wire.
 */
static void test_hpz_types(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    zr_coll_op op = ZR_COLL_OP_INIT;
    size_t h = (size_t)c.size[ZR_GROUP_HPZ], count = 777;
    float *full = make_input(0, 0, h * count, 43, ZR_DTYPE_F32);
    zr_bf16 *full16 = make_input(0, 0, h * count, 43, ZR_DTYPE_BF16);
    zr_bf16 *a = malloc(sizeof(zr_bf16) * count), *b = malloc(sizeof(zr_bf16) * count);
    float *sec32 = malloc(sizeof(float) * count), *out32 = malloc(sizeof(float) * h * count);
    zr_bf16 *out16 = malloc(sizeof(zr_bf16) * h * count);
    TEST_OK(zr_hpz_cut(&c, ZR_DTYPE_F32, full, count, ZR_DTYPE_BF16, a));
    TEST_OK(zr_hpz_cut(&c, ZR_DTYPE_BF16, full16, count, ZR_DTYPE_BF16, b));
    TEST_CHECK(memcmp(a, b, sizeof(zr_bf16) * count) == 0);
    /* a bf16 unit into an fp32 secondary: widened exactly */
    TEST_OK(zr_hpz_cut(&c, ZR_DTYPE_BF16, full16, count, ZR_DTYPE_F32, sec32));
    TEST_CHECK(rounded_bits(b, sec32, count));
    zr_wire wires[] = {wire_of(ZR_WIRE_F32, 0, 0), wire_of(ZR_WIRE_BF16, 0, 0),
                       wire_of(ZR_WIRE_QUANT, 8, 64)};
    for (int w = 0; w < 3; w++) {
        TEST_OK(zr_hpz_gather(&c, &wires[w], ZR_DTYPE_BF16, b, count, ZR_DTYPE_F32, out32, &op));
        TEST_OK(zr_hpz_gather(&c, &wires[w], ZR_DTYPE_BF16, b, count, ZR_DTYPE_BF16, out16, &op));
        TEST_CHECKF(rounded_bits(out16, out32, h * count), "hpZ gather into bf16, wire %d", w);
    }
    free(full), free(full16), free(a), free(b), free(sec32), free(out32), free(out16);
    zr_coll_op_free(&op);
    zr_comm_free(&c);
}

/* ---- qgZ -------------------------------------------------------------------- */

/*
 * True mean and error bound of element i of my partition (see the file
 * comment): hop-1 scales of the W contributions plus, with both hops, the
 * hop-2 scales of the N partial sums.
 */
static void qgz_reference(const zr_comm *c, size_t count, unsigned seed, zr_dtype t,
                          const zr_quant_params *q, double *mean, double *bound)
{
    int w = c->size[ZR_GROUP_WORLD], d = c->ranks_per_node, nn = c->n_nodes;
    int me = c->rank[ZR_GROUP_WORLD];
    float mul = 1.0f / (float)w;
    double levels = (double)(1 << (q->bits - 1));
    size_t G = (size_t)q->group;
    double *amax = malloc(sizeof(double) * w);
    for (size_t g0 = 0; g0 < count; g0 += G) {
        size_t g1 = g0 + G < count ? g0 + G : count;
        for (int r = 0; r < w; r++) {
            amax[r] = 0;
            for (size_t i = g0; i < g1; i++) {
                float v = seen(r, (size_t)me * count + i, seed, t) * mul;
                amax[r] = fmax(amax[r], fabs((double)v));
            }
        }
        double b = 0;
        int quantized = w > 1;
        for (int r = 0; r < w && quantized; r++) {
            b += amax[r] / levels;
        }
        if (d > 1 && nn > 1) {
            for (int m = 0; m < nn; m++) {
                double a = 0;
                for (int j = 0; j < d; j++) {
                    a += amax[m * d + j] * (1 + 1 / levels);
                }
                b += a / levels;
            }
        }
        for (size_t i = g0; i < g1; i++) {
            double s = 0, mag = 0;
            for (int r = 0; r < w; r++) {
                double v = seen(r, (size_t)me * count + i, seed, t);
                s += v;
                mag += fabs(v);
            }
            mean[i] = s / w;
            /* plus fp32 rounding of the scaling and the sums */
            bound[i] = b * (1 + 1e-5) + mag / w * 1e-6;
        }
    }
    free(amax);
}

static int qgz_check(const zr_comm *c, const float *out, size_t count, unsigned seed, zr_dtype t,
                     const zr_quant_params *q, double *worst)
{
    double *mean = malloc(sizeof(double) * (count ? count : 1));
    double *bound = malloc(sizeof(double) * (count ? count : 1));
    qgz_reference(c, count, seed, t, q, mean, bound);
    int ok = 1;
    for (size_t i = 0; i < count; i++) {
        double err = fabs(out[i] - mean[i]);
        *worst = fmax(*worst, err / bound[i]);
        ok &= err <= bound[i];
    }
    free(mean), free(bound);
    return ok;
}

static void test_qgz_bound(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    zr_coll_op op = ZR_COLL_OP_INIT;
    /* the last with --threads only */
    const size_t qc[] = {1, 37, 64 * 5 + 3, 3 * 2048 + 5, THREADED_COUNT};
    for (int ti = 0; ti < 2; ti++) {
        zr_dtype t = ti ? ZR_DTYPE_BF16 : ZR_DTYPE_F32;
        for (size_t ci = 0; ci < (ncounts > 4 ? 5u : 4u); ci++) {
            size_t count = qc[ci];
            zr_qgz_config cfg = zr_qgz_config_default();
            cfg.q.group = ci >= 3 ? ZR_QUANT_DEFAULT_GROUP : 64;
            unsigned seed = (unsigned)(500 + ti * 10 + ci);
            void *in = make_input(R, 0, (size_t)W * count, seed, t);
            float *out = malloc(sizeof(float) * count);
            TEST_OK(zr_qgz(&c, &cfg, t, in, count, out, NULL, &op));
            double worst = 0;
            TEST_CHECKF(qgz_check(&c, out, count, seed, t, &cfg.q, &worst),
                        "qgZ %s count %zu (%d nodes x %d): error %.3g x the bound",
                        zr_dtype_name(t), count, N, D, worst);
            TEST_EQ_INT(op.nonfinite, 0);
            free(in), free(out);
        }
    }
    /* INT8 on both hops works too, and has a 16x tighter bound */
    size_t count = 500;
    zr_qgz_config cfg = zr_qgz_config_default();
    cfg.q.bits = 8;
    cfg.q.group = 128;
    float *in = make_input(R, 0, (size_t)W * count, 9, ZR_DTYPE_F32);
    float *out = malloc(sizeof(float) * count);
    TEST_OK(zr_qgz(&c, &cfg, ZR_DTYPE_F32, in, count, out, NULL, &op));
    double worst = 0;
    TEST_CHECKF(qgz_check(&c, out, count, 9, ZR_DTYPE_F32, &cfg.q, &worst), "int8 qgZ: %.3g",
                worst);
    /* count 0 is a no-op */
    TEST_OK(zr_qgz(&c, NULL, ZR_DTYPE_F32, in, 0, out, NULL, &op));
    free(in), free(out);
    zr_coll_op_free(&op);
    zr_comm_free(&c);
}

static void test_qgz_pipeline(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    zr_coll_op op = ZR_COLL_OP_INIT;
    size_t count = 64 * 9 + 13; /* 10 groups of 64, the last one short */
    float *in = make_input(R, 0, (size_t)W * count, 77, ZR_DTYPE_F32);
    float *one = malloc(sizeof(float) * count), *out = malloc(sizeof(float) * count);
    zr_qgz_config cfg = zr_qgz_config_default();
    cfg.q.group = 64;
    TEST_OK(zr_qgz(&c, &cfg, ZR_DTYPE_F32, in, count, one, NULL, &op));
    const int chunks[] = {2, 3, 4, 7, 10, 50};
    for (int k = 0; k < 6; k++) {
        cfg.chunks = chunks[k];
        memset(out, 0, sizeof(float) * count);
        zr_comm_traffic_reset(&c);
        TEST_OK(zr_qgz(&c, &cfg, ZR_DTYPE_F32, in, count, out, NULL, &op));
        TEST_CHECKF(memcmp(out, one, sizeof(float) * count) == 0,
                    "qgZ with %d chunks differs from one chunk", chunks[k]);
        /* one exchange per chunk and hop (at most one chunk per group) */
        int eff = chunks[k] < 10 ? chunks[k] : 10;
        zr_traffic t = zr_comm_traffic_get(&c);
        TEST_EQ_INT(t.kind[ZR_KIND_QGZ].calls, (uint64_t)eff * ((D > 1) + (N > 1)));
    }
    free(in), free(one), free(out);
    zr_coll_op_free(&op);
    zr_comm_free(&c);
}

static void test_qgz_feedback(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    zr_coll_op op = ZR_COLL_OP_INIT;
    size_t count = 300;
    const int K = 16;
    float *in = make_input(R, 0, (size_t)W * count, 5, ZR_DTYPE_F32);
    float *out = malloc(sizeof(float) * count);
    double *mean = malloc(sizeof(double) * count), *bound = malloc(sizeof(double) * count);
    double *acc = calloc(count, sizeof(double));
    zr_qgz_config cfg = zr_qgz_config_default();
    cfg.q.group = 64;
    qgz_reference(&c, count, 5, ZR_DTYPE_F32, &cfg.q, mean, bound);
    double rms[2];
    zr_qgz_feedback fb = {0};
    for (int with = 0; with < 2; with++) {
        cfg.error_feedback = with;
        memset(acc, 0, sizeof(double) * count);
        int first_ok = 1;
        for (int k = 0; k < K; k++) {
            TEST_OK(zr_qgz(&c, &cfg, ZR_DTYPE_F32, in, count, out, with ? &fb : NULL, &op));
            for (size_t i = 0; i < count; i++) {
                acc[i] += out[i];
                /* the first call with feedback starts from zero residuals: same bound */
                if (k == 0) {
                    first_ok &= fabs(out[i] - mean[i]) <= bound[i];
                }
            }
        }
        TEST_CHECK(first_ok);
        double s = 0;
        for (size_t i = 0; i < count; i++) {
            double e = acc[i] / K - mean[i];
            s += e * e;
        }
        double tot = 0;
        MPI_Allreduce(&s, &tot, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        rms[with] = sqrt(tot / ((double)count * W));
    }
    if (W > 1) {
        TEST_CHECKF(rms[1] < 0.25 * rms[0],
                    "error feedback: rms error of the %d-call mean %.3g, without %.3g", K, rms[1],
                    rms[0]);
        TEST_EQ_INT(fb.n_intra, (uint64_t)W * count);
    } else {
        TEST_CHECK(rms[0] == 0 && rms[1] == 0);
    }
    if (R == 0) {
        printf("  error feedback: rms error of the mean of %d calls %.3g (without: %.3g)\n", K,
               rms[1], rms[0]);
    }
    zr_qgz_feedback_free(&fb);
    free(in), free(out), free(mean), free(bound), free(acc);
    zr_coll_op_free(&op);
    zr_comm_free(&c);
}

/* ---- traffic -------------------------------------------------------------------- */

static void test_traffic(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    zr_coll_op op = ZR_COLL_OP_INIT;
    size_t count = 1 << 16; /* per rank */
    float *shard = make_input(R, 0, count, 3, ZR_DTYPE_F32);
    float *full = make_input(R, 0, (size_t)W * count, 4, ZR_DTYPE_F32);
    float *out = malloc(sizeof(float) * W * count);
    zr_wire b16 = wire_of(ZR_WIRE_BF16, 0, 0);
    zr_wire q8 = wire_of(ZR_WIRE_QUANT, 8, ZR_QUANT_DEFAULT_GROUP);
    zr_qgz_config cfg = zr_qgz_config_default();

    zr_comm_traffic_reset(&c);
    TEST_OK(zr_allgather(&c, ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, &b16, ZR_DTYPE_F32, shard, count,
                         ZR_DTYPE_F32, out, &op));
    TEST_OK(zr_allgather(&c, ZR_GROUP_WORLD, ZR_KIND_QWZ, &q8, ZR_DTYPE_F32, shard, count,
                         ZR_DTYPE_F32, out, &op));
    TEST_OK(zr_reduce_scatter(&c, ZR_GROUP_WORLD, &b16, ZR_DTYPE_F32, full, count, out, &op));
    TEST_OK(zr_qgz(&c, &cfg, ZR_DTYPE_F32, full, count, out, NULL, &op));
    zr_traffic t = zr_comm_traffic_get(&c);
    uint64_t b8 = zr_quant_block_bytes(&q8.q, count), b4 = zr_quant_block_bytes(&cfg.q, count);
    zr_traffic_row *ag = &t.kind[ZR_KIND_ALLGATHER], *qw = &t.kind[ZR_KIND_QWZ];
    zr_traffic_row *rs = &t.kind[ZR_KIND_REDUCE_SCATTER], *qg = &t.kind[ZR_KIND_QGZ];
    TEST_EQ_INT(ag->bytes_inter, (uint64_t)(W - D) * count * 2);
    TEST_EQ_INT(ag->bytes_intra, (uint64_t)(D - 1) * count * 2);
    TEST_EQ_INT(qw->bytes_inter, (uint64_t)(W - D) * b8);
    TEST_EQ_INT(qw->bytes_intra, (uint64_t)(D - 1) * b8);
    TEST_EQ_INT(rs->bytes_inter, (uint64_t)(W - D) * count * 2);
    TEST_EQ_INT(rs->bytes_intra, (uint64_t)(D - 1) * count * 2);
    /* qgZ: N blocks to each node peer, then one block to each other node */
    TEST_EQ_INT(qg->bytes_intra, (uint64_t)(D - 1) * N * b4);
    TEST_EQ_INT(qg->bytes_inter, (uint64_t)(N - 1) * b4);
    if (N > 1) {
        double r_qwz = (double)qw->bytes_inter / (double)ag->bytes_inter;
        double r_qgz = (double)qg->bytes_inter / (double)rs->bytes_inter;
        /* INT8 vs bf16 = 1/2, INT4 vs bf16 = 1/4 and the intra-node pre-reduction 1/D */
        TEST_CHECKF(r_qwz <= 0.51, "qwZ / bf16 inter-node bytes %.4f", r_qwz);
        TEST_CHECKF(r_qgz <= 0.27 && r_qgz <= 0.25 / D + 0.01, "qgZ / bf16 inter-node bytes %.4f",
                    r_qgz);
        if (R == 0) {
            printf("  inter-node bytes per rank: qwZ/bf16 all-gather %.4f, qgZ/bf16 "
                   "reduce-scatter %.4f (1/4 x 1/D = %.4f)\n",
                   r_qwz, r_qgz, 0.25 / D);
        }
    }
    free(shard), free(full), free(out);
    zr_coll_op_free(&op);
    zr_comm_free(&c);
}

/* ---- costs known before the run ----------------------------------------------------- */

/* What the run counted (calls and bytes of its kind) and the op's workspace equal the cost. */
static void check_cost(const zr_comm *c, const zr_traffic *before, const zr_coll_op *op,
                       const zr_coll_cost *k, const char *what, size_t count)
{
    const zr_traffic_row *a = &before->kind[k->kind], *b = &c->traffic.kind[k->kind];
    uint64_t calls = b->calls - a->calls, intra = b->bytes_intra - a->bytes_intra,
             inter = b->bytes_inter - a->bytes_inter;
    TEST_CHECKF(calls == k->exchanges && intra == k->intra[0] + k->intra[1] &&
                    inter == k->inter[0] + k->inter[1] && op->work_cap == k->work,
                "%s, count %zu: ran %llu calls %llu/%llu bytes, work %zu; cost %llu calls "
                "%llu/%llu bytes, work %zu",
                what, count, (unsigned long long)calls, (unsigned long long)intra,
                (unsigned long long)inter, op->work_cap, (unsigned long long)k->exchanges,
                (unsigned long long)(k->intra[0] + k->intra[1]),
                (unsigned long long)(k->inter[0] + k->inter[1]), k->work);
}

/*
 * The conversions an all-gather's cost counts: one where two types differ,
 * in to wire (my shard) and wire to out (every shard), none for qwZ, whose
 * encoder and decoder read and write either type.
 */
static void check_conversions(const zr_coll_cost *k, zr_wire_type wire, zr_dtype in, zr_dtype out,
                              size_t count, size_t n, const char *what)
{
    size_t enc = 0, dec = 0;
    if (wire != ZR_WIRE_QUANT) {
        zr_dtype wt = wire == ZR_WIRE_BF16 ? ZR_DTYPE_BF16 : ZR_DTYPE_F32;
        if (in != wt) {
            *(wt == ZR_DTYPE_BF16 ? &enc : &dec) += count;
        }
        if (out != wt) {
            *(out == ZR_DTYPE_BF16 ? &enc : &dec) += n * count;
        }
    }
    TEST_CHECKF(k->bf16_enc == enc && k->bf16_dec == dec,
                "%s cost, wire %d, %s in, %s out: %zu enc %zu dec, expected %zu %zu", what,
                (int)wire, zr_dtype_name(in), zr_dtype_name(out), k->bf16_enc, k->bf16_dec, enc,
                dec);
}

/*
 * Every algorithm's cost, computed on a layout built without MPI for this
 * rank, equals what the run accounts and reserves (a fresh op each time, so
 * its workspace is exactly what the run asked for), for every type of input
 * and output; its conversions are where the types differ.
 */
static void test_costs(void)
{
    zr_comm c, L;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    TEST_OK(zr_comm_init_layout(&L, N, D, 0, R));
    for (int g = 0; g < ZR_GROUP_COUNT; g++) {
        TEST_CHECKF(L.rank[g] == c.rank[g] && L.size[g] == c.size[g] && L.first[g] == c.first[g] &&
                        L.stride[g] == c.stride[g],
                    "group %s: the layout differs from the communicator", zr_group_name(g));
    }
    TEST_EQ_INT(L.node, c.node);
    zr_wire wires[] = {wire_of(ZR_WIRE_F32, 0, 0), wire_of(ZR_WIRE_BF16, 0, 0),
                       wire_of(ZR_WIRE_QUANT, 8, ZR_QUANT_DEFAULT_GROUP),
                       wire_of(ZR_WIRE_QUANT, 4, 64)};
    for (size_t ci = 0; ci < ncounts; ci++) {
        size_t count = counts[ci];
        float *in = make_input(R, 0, (size_t)W * count, 5, ZR_DTYPE_F32);
        float *out = malloc(sizeof(float) * ((size_t)W * count + 1));
        for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
            zr_group g = groups[gi];
            for (int w = 0; w < 4; w++) {
                for (int t = 0; t < 4; t++) {
                    zr_dtype in_type = t & 1 ? ZR_DTYPE_BF16 : ZR_DTYPE_F32;
                    zr_dtype out_type = t & 2 ? ZR_DTYPE_BF16 : ZR_DTYPE_F32;
                    zr_coll_op op = ZR_COLL_OP_INIT;
                    zr_traffic before = c.traffic;
                    zr_coll_cost k =
                        zr_allgather_cost(&L, g, ZR_KIND_HPZ, &wires[w], in_type, count, out_type);
                    TEST_OK(zr_allgather(&c, g, ZR_KIND_HPZ, &wires[w], in_type, in, count,
                                         out_type, out, &op));
                    check_cost(&c, &before, &op, &k, "all-gather", count);
                    check_conversions(&k, wires[w].type, in_type, out_type, count,
                                      (size_t)c.size[g], "all-gather");
                    zr_coll_op_free(&op);
                }
                if (w >= 2) {
                    continue;
                }
                for (int t = 0; t < 2; t++) {
                    zr_dtype in_type = t ? ZR_DTYPE_BF16 : ZR_DTYPE_F32;
                    zr_coll_op op = ZR_COLL_OP_INIT;
                    zr_traffic before = c.traffic;
                    zr_coll_cost k = zr_reduce_scatter_cost(&L, g, &wires[w], in_type, count);
                    TEST_OK(zr_reduce_scatter(&c, g, &wires[w], in_type, in, count, out, &op));
                    check_cost(&c, &before, &op, &k, "reduce-scatter", count);
                    zr_coll_op_free(&op);
                    /* the input cast to the wire, every received term widened by the sum */
                    size_t nc = (size_t)c.size[g] * count;
                    int b16 = wires[w].type == ZR_WIRE_BF16, in16 = t;
                    TEST_CHECKF(k.bf16_enc == (!in16 && b16 ? nc : 0) &&
                                    k.bf16_dec == (in16 && !b16 ? nc : 0) + (b16 ? nc : 0) &&
                                    k.f32_add == nc,
                                "reduce-scatter cost, %s in, wire %d: %zu enc, %zu dec, %zu adds",
                                zr_dtype_name(in_type), (int)wires[w].type, k.bf16_enc, k.bf16_dec,
                                k.f32_add);
                }
                zr_coll_op op = ZR_COLL_OP_INIT;
                zr_traffic before = c.traffic;
                zr_coll_cost k = zr_allreduce_cost(&L, g, wires[w].type, count);
                TEST_OK(zr_allreduce(&c, g, &wires[w], out, count, &op));
                check_cost(&c, &before, &op, &k, "all-reduce", count);
                zr_coll_op_free(&op);
            }
        }
        for (int chunks = 1; chunks <= 3; chunks += 2) {
            zr_qgz_config cfg = zr_qgz_config_default();
            cfg.chunks = chunks;
            cfg.q.group = 64;
            zr_coll_op op = ZR_COLL_OP_INIT;
            zr_traffic before = c.traffic;
            zr_coll_cost k = zr_qgz_cost(&L, &cfg, count);
            /* the input type changes nothing of the cost: the encoder reads either */
            zr_dtype in_type = chunks == 1 ? ZR_DTYPE_F32 : ZR_DTYPE_BF16;
            TEST_OK(zr_qgz(&c, &cfg, in_type, in, count, out, NULL, &op));
            check_cost(&c, &before, &op, &k, "qgZ", count);
            zr_coll_op_free(&op);
        }
        free(in), free(out);
    }
    zr_comm_free(&c);
}

/* ---- nonblocking ------------------------------------------------------------------- */

static void test_nonblocking(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    size_t count = 64 * 6 + 5;
    zr_wire b16 = wire_of(ZR_WIRE_BF16, 0, 0), q8 = wire_of(ZR_WIRE_QUANT, 8, 64);
    zr_qgz_config cfg = zr_qgz_config_default();
    cfg.q.group = 64;
    cfg.chunks = 3;
    float *gin = make_input(R, 0, (size_t)W * count, 11, ZR_DTYPE_F32);
    float *gin2 = make_input(R, 0, (size_t)W * count, 12, ZR_DTYPE_F32);
    float *shard = make_input(R, 0, count, 13, ZR_DTYPE_F32);
    float *arbuf = make_input(R, 0, count, 14, ZR_DTYPE_F32);
    float *ref[6], *res[6];
    for (int i = 0; i < 6; i++) {
        ref[i] = calloc((size_t)W * count, sizeof(float));
        res[i] = calloc((size_t)W * count, sizeof(float));
    }
    zr_coll_op ops[6] = {ZR_COLL_OP_INIT, ZR_COLL_OP_INIT, ZR_COLL_OP_INIT,
                         ZR_COLL_OP_INIT, ZR_COLL_OP_INIT, ZR_COLL_OP_INIT};
    /* blocking references, one at a time */
    TEST_OK(zr_qgz(&c, &cfg, ZR_DTYPE_F32, gin, count, ref[0], NULL, &ops[0]));
    TEST_OK(zr_qgz(&c, &cfg, ZR_DTYPE_F32, gin2, count, ref[1], NULL, &ops[0]));
    TEST_OK(zr_allgather(&c, ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, &b16, ZR_DTYPE_F32, shard, count,
                         ZR_DTYPE_F32, ref[2], &ops[0]));
    memcpy(ref[3], arbuf, sizeof(float) * count);
    TEST_OK(zr_allreduce(&c, ZR_GROUP_WORLD, &b16, ref[3], count, &ops[0]));
    TEST_OK(zr_allgather(&c, ZR_GROUP_HPZ, ZR_KIND_QWZ, &q8, ZR_DTYPE_F32, shard, count,
                         ZR_DTYPE_F32, ref[4], &ops[0]));
    TEST_OK(zr_reduce_scatter(&c, ZR_GROUP_WORLD, &b16, ZR_DTYPE_F32, gin, count, ref[5], &ops[0]));

    for (int order = 0; order < 3; order++) {
        memcpy(res[3], arbuf, sizeof(float) * count);
        /* six in flight: two qgZ on the same groups, an all-reduce between world gathers */
        TEST_OK(zr_qgz_start(&c, &cfg, ZR_DTYPE_F32, gin, count, res[0], NULL, &ops[0]));
        TEST_OK(zr_qgz_start(&c, &cfg, ZR_DTYPE_F32, gin2, count, res[1], NULL, &ops[1]));
        TEST_OK(zr_allreduce_start(&c, ZR_GROUP_WORLD, &b16, res[3], count, &ops[3]));
        TEST_OK(zr_allgather_start(&c, ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, &b16, ZR_DTYPE_F32, shard,
                                   count, ZR_DTYPE_F32, res[2], &ops[2]));
        TEST_OK(zr_allgather_start(&c, ZR_GROUP_HPZ, ZR_KIND_QWZ, &q8, ZR_DTYPE_F32, shard, count,
                                   ZR_DTYPE_F32, res[4], &ops[4]));
        TEST_OK(zr_reduce_scatter_start(&c, ZR_GROUP_WORLD, &b16, ZR_DTYPE_F32, gin, count, res[5],
                                        &ops[5]));
        if (order == 0) {
            /* newest first: waits have to drive the older ops */
            for (int i = 5; i >= 0; i--) {
                TEST_OK(zr_coll_wait(&c, &ops[i]));
            }
        } else if (order == 1) {
            /* poll them all, rank-dependent rotation so ranks progress differently */
            int left = 6;
            for (long spin = 0; left > 0 && spin < 100000000L; spin++) {
                left = 0;
                for (int k = 0; k < 6; k++) {
                    int i = (k + R + (int)spin) % 6, done = 0;
                    TEST_OK(zr_coll_test(&c, &ops[i], &done));
                    left += !done;
                }
            }
            TEST_EQ_INT(left, 0);
        } else {
            for (int i = 0; i < 6; i++) {
                TEST_OK(zr_coll_wait(&c, &ops[i]));
            }
        }
        TEST_CHECKF(memcmp(res[0], ref[0], sizeof(float) * count) == 0, "qgZ A, order %d", order);
        TEST_CHECKF(memcmp(res[1], ref[1], sizeof(float) * count) == 0, "qgZ B, order %d", order);
        TEST_CHECKF(memcmp(res[2], ref[2], sizeof(float) * W * count) == 0, "all-gather, order %d",
                    order);
        TEST_CHECKF(memcmp(res[3], ref[3], sizeof(float) * count) == 0, "all-reduce, order %d",
                    order);
        TEST_CHECKF(memcmp(res[4], ref[4], sizeof(float) * c.size[ZR_GROUP_HPZ] * count) == 0,
                    "qwZ hpZ, order %d", order);
        TEST_CHECKF(memcmp(res[5], ref[5], sizeof(float) * count) == 0, "reduce-scatter, order %d",
                    order);
    }
    /* zr_coll_op_free on an op in flight completes it first */
    TEST_OK(zr_allgather_start(&c, ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, &b16, ZR_DTYPE_F32, shard,
                               count, ZR_DTYPE_F32, res[2], &ops[2]));
    for (int i = 0; i < 6; i++) {
        zr_coll_op_free(&ops[i]);
        free(ref[i]);
        free(res[i]);
    }
    free(gin), free(gin2), free(shard), free(arbuf);
    zr_comm_free(&c);
}

/* Zero elements: every collective completes without moving payload. */
static void test_empty(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    zr_coll_op op = ZR_COLL_OP_INIT;
    float in[1] = {1.0f}, out[1] = {2.0f};
    zr_wire f32 = wire_of(ZR_WIRE_F32, 0, 0), b16 = wire_of(ZR_WIRE_BF16, 0, 0);
    zr_wire q8 = wire_of(ZR_WIRE_QUANT, 8, 64);
    const zr_wire *wires[3] = {&f32, &b16, &q8};
    for (int i = 0; i < 3; i++) {
        TEST_OK(zr_allgather(&c, ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, wires[i], ZR_DTYPE_F32, in, 0,
                             ZR_DTYPE_F32, out, &op));
        if (i < 2) {
            TEST_OK(zr_reduce_scatter(&c, ZR_GROUP_WORLD, wires[i], ZR_DTYPE_F32, in, 0, out, &op));
            TEST_OK(zr_allreduce(&c, ZR_GROUP_WORLD, wires[i], in, 0, &op));
        }
    }
    TEST_OK(zr_qgz(&c, NULL, ZR_DTYPE_F32, in, 0, out, NULL, &op));
    TEST_CHECK(in[0] == 1.0f && out[0] == 2.0f);
    zr_coll_op_free(&op);
    zr_comm_free(&c);
}

/* ---- errors ----------------------------------------------------------------------- */

/* A transport that flips the magic of the first block it receives from a peer. */
static zr_transport corrupting;
static struct {
    zr_request *req;
    unsigned char *at;
} victim;

static zr_status corrupt_iexchange(zr_comm *c, zr_group g, const void *send, const size_t *scount,
                                   const size_t *sdisp, void *recv, const size_t *rcount,
                                   const size_t *rdisp, zr_request *req)
{
    int peer = (c->rank[g] + 1) % c->size[g];
    victim.req = NULL;
    if (peer != c->rank[g] && rcount[peer] > 0) {
        victim.req = req;
        victim.at = (unsigned char *)recv + rdisp[peer];
    }
    return zr_transport_mpi.iexchange(c, g, send, scount, sdisp, recv, rcount, rdisp, req);
}

/* every wait and test completes through the transport's test: flip once the data is in */
static zr_status corrupt_test(zr_comm *c, zr_request *req, int *done, int *progressed)
{
    zr_status st = zr_transport_mpi.test(c, req, done, progressed);
    if (st == ZR_OK && *done && req == victim.req) {
        victim.at[0] ^= 0xff;
        victim.req = NULL;
    }
    return st;
}

static void test_errors(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    zr_coll_op op = ZR_COLL_OP_INIT;
    float in[64 * 8], out[64 * 8];
    memset(in, 0, sizeof in);
    zr_wire q = wire_of(ZR_WIRE_QUANT, 4, 64), bad = wire_of(ZR_WIRE_QUANT, 5, 64);
    TEST_FAILS(zr_reduce_scatter(&c, ZR_GROUP_WORLD, &q, ZR_DTYPE_F32, in, 1, out, &op),
               ZR_ERR_INVALID, "qgZ");
    TEST_FAILS(zr_allgather(&c, ZR_GROUP_WORLD, ZR_KIND_QWZ, &bad, ZR_DTYPE_F32, in, 1,
                            ZR_DTYPE_F32, out, &op),
               ZR_ERR_INVALID, "bits");
    TEST_FAILS(zr_allreduce(&c, ZR_GROUP_WORLD, &q, in, 1, &op), ZR_ERR_INVALID, "quantized");
    zr_wire f32 = wire_of(ZR_WIRE_F32, 0, 0);
    TEST_FAILS(zr_allgather(&c, ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, &f32, ZR_DTYPE_F32, in, 1,
                            (zr_dtype)7, out, &op),
               ZR_ERR_INVALID, "output type must be fp32 or bf16");
    TEST_FAILS(zr_reduce_scatter(&c, ZR_GROUP_WORLD, &f32, (zr_dtype)7, in, 1, out, &op),
               ZR_ERR_INVALID, "input type must be fp32 or bf16");
    TEST_FAILS(zr_hpz_cut(&c, (zr_dtype)7, in, 1, ZR_DTYPE_F32, out), ZR_ERR_INVALID,
               "must be fp32 or bf16");
    zr_qgz_config cfg = zr_qgz_config_default();
    cfg.error_feedback = 1;
    TEST_FAILS(zr_qgz(&c, &cfg, ZR_DTYPE_F32, in, 1, out, NULL, &op), ZR_ERR_INVALID,
               "zr_qgz_feedback");
    cfg.error_feedback = 0;
    /* starting a collective on an op that is in flight is refused (an op
     * marked active by hand: a real one may complete at any moment) */
    zr_coll_op busy = ZR_COLL_OP_INIT;
    busy.active = 1;
    TEST_FAILS(zr_qgz_start(&c, &cfg, ZR_DTYPE_F32, in, 1, out, NULL, &busy), ZR_ERR_INVALID,
               "in flight");
    busy.active = 0;
    zr_coll_op_free(&busy);
    cfg.chunks = -1;
    TEST_FAILS(zr_qgz(&c, &cfg, ZR_DTYPE_F32, in, 1, out, NULL, &op), ZR_ERR_INVALID, "chunks");
    TEST_FAILS(zr_allgather(&c, ZR_GROUP_COUNT, ZR_KIND_QWZ, &q, ZR_DTYPE_F32, in, 1, ZR_DTYPE_F32,
                            out, &op),
               ZR_ERR_INVALID, "group");
    if (W > 1) {
        /* a block damaged on the wire is caught by validation, on every rank */
        corrupting = zr_transport_mpi;
        corrupting.name = "corrupting";
        corrupting.iexchange = corrupt_iexchange;
        corrupting.test = corrupt_test;
        TEST_OK(zr_comm_use_transport(&c, &corrupting, NULL));
        TEST_CHECK(strcmp(c.transport->name, "corrupting") == 0);
        TEST_FAILS(zr_allgather(&c, ZR_GROUP_WORLD, ZR_KIND_QWZ, &q, ZR_DTYPE_F32, in, 64,
                                ZR_DTYPE_F32, out, &op),
                   ZR_ERR_FORMAT, "qwZ: block from world rank");
        TEST_CHECK(!op.active);
        cfg.chunks = 1;
        float big[64 * 8];
        memset(big, 0, sizeof big);
        if (W <= 8) {
            TEST_FAILS(zr_qgz(&c, &cfg, ZR_DTYPE_F32, big, 64 * 8 / W, out, NULL, &op),
                       ZR_ERR_FORMAT, "qgZ: block from world rank");
        }
        TEST_OK(zr_comm_use_transport(&c, &zr_transport_mpi, NULL));
        /* the op works again afterwards */
        TEST_OK(zr_allgather(&c, ZR_GROUP_WORLD, ZR_KIND_QWZ, &q, ZR_DTYPE_F32, in, 64,
                             ZR_DTYPE_F32, out, &op));
    }
    zr_coll_op_free(&op);
    zr_comm_free(&c);
}

int main(int argc, char **argv)
{
    zr_test_mpi_init(&argc, &argv);
    if (argc == 3 && strcmp(argv[1], "--threads") == 0) {
        TEST_OK(zr_threads_set(atoi(argv[2])));
        counts[ncounts++] = THREADED_COUNT;
    }
    {
        zr_comm c;
        if (zr_comm_init(&c, MPI_COMM_WORLD, NULL) != ZR_OK) {
            fprintf(stderr, "zr_comm_init: %s\n", zr_error_message());
            return 1;
        }
        W = c.size[ZR_GROUP_WORLD];
        R = c.rank[ZR_GROUP_WORLD];
        D = c.ranks_per_node;
        N = c.n_nodes;
        if (R == 0) {
            char desc[200];
            zr_comm_describe(&c, desc, sizeof desc);
            printf("test_coll: %s\n", desc);
        }
        zr_comm_free(&c);
    }
    TEST_RUN(test_allgather_exact);
    TEST_RUN(test_reduce_scatter_exact);
    TEST_RUN(test_allreduce_exact);
    TEST_RUN(test_qwz);
    TEST_RUN(test_hpz);
    TEST_RUN(test_allgather_types);
    TEST_RUN(test_reduce_scatter_types);
    TEST_RUN(test_hpz_types);
    TEST_RUN(test_qgz_bound);
    TEST_RUN(test_qgz_pipeline);
    TEST_RUN(test_qgz_feedback);
    TEST_RUN(test_traffic);
    TEST_RUN(test_costs);
    TEST_RUN(test_nonblocking);
    TEST_RUN(test_empty);
    TEST_RUN(test_errors);
    return zr_test_finish();
}
