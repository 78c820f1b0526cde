/*
 * quant.c - the block codec of zr/quant.h: parameters, the wire block,
 * per-group scale selection and non-finite handling, implementation
 * dispatch, and the scalar kernels that are the oracle for the vector ones.
 *
 * Everything decided once per group (scale, zero point, whether the group is
 * non-finite) is computed here in scalar C for every implementation, so the
 * vector kernels cannot disagree on it; they only run element loops.
 *
 * Threads: a block's groups are independent (each its own scale, its own
 * bytes of payload, its own residuals), so encode, decode and the qgZ sum
 * split a block's groups over the process's pool (zr/pool.h), whole groups
 * per thread: the bytes and floats written are the same at any thread count.
 * A collective's codec work runs between the model's operators on the rank's
 * main thread, where it delays the step unless the rank's other threads take
 * their share.
 */
#include "quant_impl.h"

#include "zr/pool.h"

#include <float.h>
#include <stdatomic.h>

#define HEADER_BYTES ((size_t)sizeof(zr_quant_header))

/* quant_rules.h repeats ZR_QUANT_MAGIC (a different value is a redefinition
 * the compiler reports) and says what the header's size is */
_Static_assert(ZR_QUANT_HEADER_BYTES == sizeof(zr_quant_header),
               "quant_rules.h describes the block of zr/quant.h");

/* ---- scalar kernels (the oracle) ----------------------------------------- */

static void scalar_scan(zr_dtype t, const void *x, const float *r, size_t n, float mul, int asym,
                        zr_quant_scan *out)
{
    uint32_t absbits = 0;
    float mn = INFINITY, mx = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        float v = zr_quant_value(t, x, r, i, mul);
        uint32_t a = zr_quant_absbits(v);
        /* integer max of |v| bits orders every finite value and puts NaN above
         * Inf, so one compare finds both the absmax and non-finite values */
        absbits = a > absbits ? a : absbits;
        if (asym) {
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
        }
    }
    out->absbits = absbits;
    out->mn = mn;
    out->mx = mx;
}

static void scalar_encode(const zr_quant_group *g, zr_dtype t, const void *x, float *r, size_t n,
                          float mul, uint8_t *payload)
{
    for (size_t i = 0; i < n; i++) {
        float v = zr_quant_value(t, x, r, i, mul);
        int q = zr_quant_code(g, v);
        if (r != NULL) {
            r[i] = v - zr_quant_dequant(g, q);
        }
        if (g->bits == 8) {
            payload[i] = (uint8_t)zr_quant_pack(8, q);
        } else if ((i & 1) == 0) {
            payload[i / 2] = (uint8_t)zr_quant_pack(4, q);
        } else {
            payload[i / 2] |= (uint8_t)(zr_quant_pack(4, q) << 4);
        }
    }
}

static inline void put_decoded(zr_quant_out mode, void *out, size_t i, float v)
{
    switch (mode) {
    case ZR_QUANT_OUT_F32:
        ((float *)out)[i] = v;
        break;
    case ZR_QUANT_OUT_BF16:
        ((zr_bf16 *)out)[i] = zr_quant_bf16_round(v);
        break;
    case ZR_QUANT_OUT_ADD:
        ((float *)out)[i] = zr_quant_add(((float *)out)[i], v);
        break;
    }
}

static void scalar_decode(const zr_quant_group *g, const uint8_t *payload, size_t n,
                          zr_quant_out mode, void *out)
{
    zr_quant_group gl = *g; /* a copy the stores below cannot alias */
    if (zr_quant_scale_nonfinite(gl.scale)) {
        /* zr_quant_decode1 of every element, decided once per segment */
        for (size_t i = 0; i < n; i++) {
            put_decoded(mode, out, i, zr_quant_bits_f32(ZR_QUANT_QNAN_BITS));
        }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        put_decoded(mode, out, i, zr_quant_dequant(&gl, zr_quant_payload_get(&gl, payload, i)));
    }
}

const zr_quant_kernels zr_quant_kernels_scalar = {ZR_QUANT_IMPL_SCALAR, scalar_scan, scalar_encode,
                                                  scalar_decode};

/* ---- implementation selection ------------------------------------------- */

static zr_quant_impl forced_impl = ZR_QUANT_IMPL_AUTO;

static const zr_quant_kernels *kernels_of(zr_quant_impl impl)
{
    switch (impl) {
    case ZR_QUANT_IMPL_SCALAR:
        return &zr_quant_kernels_scalar;
    case ZR_QUANT_IMPL_AVX2:
        return zr_quant_kernels_avx2_ok() ? &zr_quant_kernels_avx2 : NULL;
    case ZR_QUANT_IMPL_AVX512:
        return zr_quant_kernels_avx512_ok() ? &zr_quant_kernels_avx512 : NULL;
    case ZR_QUANT_IMPL_AUTO:
        break;
    }
    if (zr_quant_kernels_avx512_ok()) {
        return &zr_quant_kernels_avx512;
    }
    if (zr_quant_kernels_avx2_ok()) {
        return &zr_quant_kernels_avx2;
    }
    return &zr_quant_kernels_scalar;
}

static const zr_quant_kernels *kernels(void)
{
    const zr_quant_kernels *k = kernels_of(forced_impl);
    ZR_ASSERT(k != NULL); /* zr_quant_set_impl only accepts runnable choices */
    return k;
}

zr_status zr_quant_set_impl(zr_quant_impl impl)
{
    if (impl < ZR_QUANT_IMPL_AUTO || impl > ZR_QUANT_IMPL_AVX512) {
        ZR_FAIL(ZR_ERR_INVALID, "quant impl: unknown implementation %d", (int)impl);
    }
    if (kernels_of(impl) == NULL) {
        ZR_FAIL(ZR_ERR_INVALID, "quant impl: this CPU cannot run %s%s", zr_quant_impl_name(impl),
                zr_cpu_cap() < ZR_CPU_AVX512 ? " (ZR_CPU caps the kernels)" : "");
    }
    forced_impl = impl;
    return ZR_OK;
}

zr_quant_impl zr_quant_get_impl(void)
{
    return kernels()->impl;
}

const char *zr_quant_impl_name(zr_quant_impl impl)
{
    switch (impl) {
    case ZR_QUANT_IMPL_AUTO:
        return "auto";
    case ZR_QUANT_IMPL_SCALAR:
        return "scalar";
    case ZR_QUANT_IMPL_AVX2:
        return "avx2";
    case ZR_QUANT_IMPL_AVX512:
        return "avx512";
    }
    return "unknown";
}

/* ---- parameters and block layout ----------------------------------------- */

static int group_ok(uint64_t group)
{
    return zr_quant_group_ok(group);
}

zr_status zr_quant_params_check(const zr_quant_params *p)
{
    if (p == NULL) {
        ZR_FAIL(ZR_ERR_INVALID, "quant params: NULL");
    }
    if (p->bits != 8 && p->bits != 4) {
        ZR_FAIL(ZR_ERR_INVALID, "quant params: bits must be 8 or 4, got %d", p->bits);
    }
    if (p->group < 0 || !group_ok((uint64_t)p->group)) {
        ZR_FAIL(ZR_ERR_INVALID, "quant params: group must be a multiple of 8 in 32..65536, got %d",
                p->group);
    }
    if (p->scheme != ZR_QUANT_SYM && p->scheme != ZR_QUANT_ASYM) {
        ZR_FAIL(ZR_ERR_INVALID,
                "quant params: scheme must be ZR_QUANT_SYM or ZR_QUANT_ASYM, got %d",
                (int)p->scheme);
    }
    return ZR_OK;
}

static size_t payload_offset_of(int scheme, uint64_t group, uint64_t count)
{
    return (size_t)zr_quant_payload_offset(scheme == ZR_QUANT_ASYM, group, count);
}

static size_t payload_bytes_of(int bits, uint64_t count)
{
    return bits == 8 ? (size_t)count : (size_t)zr_div_up(count, 2);
}

static size_t block_bytes_of(int bits, int scheme, uint64_t group, uint64_t count)
{
    return payload_offset_of(scheme, group, count) + zr_round_up(payload_bytes_of(bits, count), 4);
}

size_t zr_quant_block_bytes(const zr_quant_params *p, size_t count)
{
    return block_bytes_of(p->bits, p->scheme, (uint64_t)p->group, count);
}

/* Blocks may sit at any 4-byte offset of a message, so the header (with its
 * 8-byte fields) and the scales are accessed through memcpy. */
static zr_quant_header header_get(const void *block)
{
    zr_quant_header h;
    memcpy(&h, block, sizeof h);
    return h;
}

static float scale_get(const uint8_t *block, size_t index)
{
    float s;
    memcpy(&s, block + HEADER_BYTES + index * sizeof(float), sizeof s);
    return s;
}

static void scale_put(uint8_t *block, size_t index, float s)
{
    memcpy(block + HEADER_BYTES + index * sizeof(float), &s, sizeof s);
}

zr_status zr_quant_validate(const void *block, size_t block_bytes, const zr_quant_params *expect,
                            size_t expect_count)
{
    if (block == NULL) {
        ZR_FAIL(ZR_ERR_INVALID, "quant block: NULL");
    }
    if (block_bytes < HEADER_BYTES) {
        ZR_FAIL(ZR_ERR_FORMAT, "quant block: size %zu is shorter than the %zu-byte header",
                block_bytes, HEADER_BYTES);
    }
    zr_quant_header h = header_get(block);
    if (h.magic != ZR_QUANT_MAGIC) {
        ZR_FAIL(ZR_ERR_FORMAT, "quant block: magic 0x%08x is not ZRQ1 (0x%08x)", h.magic,
                ZR_QUANT_MAGIC);
    }
    if (h.bits != 8 && h.bits != 4) {
        ZR_FAIL(ZR_ERR_FORMAT, "quant block: bits %u is not 8 or 4", h.bits);
    }
    if (h.scheme != ZR_QUANT_SYM && h.scheme != ZR_QUANT_ASYM) {
        ZR_FAIL(ZR_ERR_FORMAT, "quant block: scheme %u is not sym (0) or asym (1)", h.scheme);
    }
    if (!group_ok(h.group)) {
        ZR_FAIL(ZR_ERR_FORMAT, "quant block: group %u is not a multiple of 8 in 32..65536",
                h.group);
    }
    if (h.reserved != 0) {
        ZR_FAIL(ZR_ERR_FORMAT, "quant block: reserved field is %u, not 0", h.reserved);
    }
    if (expect != NULL) {
        if (h.bits != expect->bits) {
            ZR_FAIL(ZR_ERR_FORMAT, "quant block: bits %u, expected %d", h.bits, expect->bits);
        }
        if (h.scheme != (unsigned)expect->scheme) {
            ZR_FAIL(ZR_ERR_FORMAT, "quant block: scheme %u, expected %d", h.scheme,
                    (int)expect->scheme);
        }
        if (h.group != (uint32_t)expect->group) {
            ZR_FAIL(ZR_ERR_FORMAT, "quant block: group %u, expected %d", h.group, expect->group);
        }
    }
    if (expect_count != SIZE_MAX && h.count != (uint64_t)expect_count) {
        ZR_FAIL(ZR_ERR_FORMAT, "quant block: count %llu, expected %zu", (unsigned long long)h.count,
                expect_count);
    }
    /* bound count by the size before any arithmetic on it can overflow */
    if (h.count / 2 > block_bytes) {
        ZR_FAIL(ZR_ERR_FORMAT, "quant block: count %llu cannot fit in %zu bytes",
                (unsigned long long)h.count, block_bytes);
    }
    if (h.nonfinite_groups > zr_div_up(h.count, h.group)) {
        ZR_FAIL(ZR_ERR_FORMAT, "quant block: nonfinite_groups %u exceeds the %llu groups",
                h.nonfinite_groups, (unsigned long long)zr_div_up(h.count, h.group));
    }
    size_t off = payload_offset_of(h.scheme, h.group, h.count);
    if (h.payload_offset != off) {
        ZR_FAIL(ZR_ERR_FORMAT, "quant block: payload_offset %llu, expected %zu",
                (unsigned long long)h.payload_offset, off);
    }
    size_t want = block_bytes_of(h.bits, h.scheme, h.group, h.count);
    if (block_bytes != want) {
        ZR_FAIL(ZR_ERR_FORMAT, "quant block: size %zu bytes, expected %zu for count %llu",
                block_bytes, want, (unsigned long long)h.count);
    }
    return ZR_OK;
}

size_t zr_quant_block_count(const void *block)
{
    return (size_t)header_get(block).count;
}

/* The cheap checks decode paths do on a block they trust to be validated. */
static zr_status header_sane(const void *block, size_t count, zr_quant_header *h)
{
    /* written on every path: callers read it only on success, but a compiler
       that cannot see that (gcc 12 without AVX-512 inlining) must not warn */
    memset(h, 0, sizeof *h);
    if (block == NULL) {
        ZR_FAIL(ZR_ERR_INVALID, "quant block: NULL");
    }
    *h = header_get(block);
    if (h->magic != ZR_QUANT_MAGIC || (h->bits != 8 && h->bits != 4) ||
        (h->scheme != ZR_QUANT_SYM && h->scheme != ZR_QUANT_ASYM) || !group_ok(h->group) ||
        h->payload_offset != payload_offset_of(h->scheme, h->group, h->count)) {
        ZR_FAIL(ZR_ERR_FORMAT, "quant block: bad header (was it validated?)");
    }
    if (h->count != (uint64_t)count) {
        ZR_FAIL(ZR_ERR_INVALID, "quant block: holds %llu elements, caller asked for %zu",
                (unsigned long long)h->count, count);
    }
    return ZR_OK;
}

/* ---- encoding ------------------------------------------------------------- */

/*
 * Quantize one group of n elements: scan, choose the scale, code. Returns 1
 * if the group held Inf/NaN (then the scale is NaN, the payload zero and the
 * residual reset), 0 otherwise.
 */
static int encode_group(const zr_quant_kernels *k, int bits, int asym, zr_dtype t, const void *x,
                        float *r, size_t n, float mul, uint8_t *block, size_t gi, uint8_t *payload)
{
    zr_quant_scan s;
    k->scan(t, x, r, n, mul, asym, &s);
    size_t si = asym ? 2 * gi : gi;
    if (zr_quant_nonfinite(s.absbits)) {
        float nan = zr_quant_bits_f32(ZR_QUANT_QNAN_BITS);
        scale_put(block, si, nan);
        if (asym) {
            scale_put(block, si + 1, nan);
        }
        memset(payload, 0, payload_bytes_of(bits, n));
        if (r != NULL) {
            /* a NaN residual would poison every later step; the NaN already
             * travels in this block, so error feedback starts over */
            memset(r, 0, n * sizeof *r);
        }
        return 1;
    }
    zr_quant_group g = zr_quant_group_make(bits, asym, s.absbits, s.mn, s.mx);
    scale_put(block, si, g.scale);
    if (asym) {
        scale_put(block, si + 1, g.zero);
    }
    k->encode(&g, t, x, r, n, mul, payload);
    return 0;
}

/*
 * Groups per task: at least GRAIN_ELEMS elements (64 groups of the default
 * 1024), tens of microseconds of codec work against the pool's few to hand a
 * job over; smaller blocks stay on the caller's thread.
 */
#define GRAIN_ELEMS 65536

static size_t grain_groups(size_t group)
{
    return GRAIN_ELEMS / group > 0 ? GRAIN_ELEMS / group : 1;
}

/* What one encode (or the requantization of zr_quant_sum_requant) shares with its tasks. */
typedef struct encode_job {
    const zr_quant_kernels *k;
    const zr_quant_params *p;
    zr_dtype t;
    const uint8_t *x;          /* encode: the input (sum_requant: none, t fp32) */
    float *residual;           /* NULL: no error feedback */
    size_t count;              /* elements */
    float mul;                 /* applied before quantizing */
    uint8_t *block;            /* the output block (scales) */
    uint8_t *payload;          /* its payload */
    const void *const *blocks; /* sum_requant: the k input blocks and their headers */
    const zr_quant_header *hs;
    int nblocks;
    float *scratch; /* sum_requant: stride fp32 per task, tasks of them */
    size_t stride, tasks;
    atomic_size_t nonfinite;
} encode_job;

static zr_status encode_args_check(const zr_quant_params *p, zr_dtype t, const void *x,
                                   size_t count, const void *block)
{
    ZR_CHECK(zr_quant_params_check(p));
    if (t != ZR_DTYPE_F32 && t != ZR_DTYPE_BF16) {
        ZR_FAIL(ZR_ERR_INVALID, "quant encode: unknown input dtype %d", (int)t);
    }
    if (block == NULL || (x == NULL && count > 0)) {
        ZR_FAIL(ZR_ERR_INVALID, "quant encode: NULL %s", block == NULL ? "block" : "input");
    }
    return ZR_OK;
}

/* Header and payload padding of a block about to be filled. */
static uint8_t *block_start(const zr_quant_params *p, size_t count, void *block)
{
    zr_quant_header h;
    memset(&h, 0, sizeof h);
    h.magic = ZR_QUANT_MAGIC;
    h.bits = (uint8_t)p->bits;
    h.scheme = (uint8_t)p->scheme;
    h.group = (uint32_t)p->group;
    h.count = count;
    h.payload_offset = payload_offset_of(p->scheme, (uint64_t)p->group, count);
    memcpy(block, &h, sizeof h);
    uint8_t *payload = (uint8_t *)block + h.payload_offset;
    size_t used = payload_bytes_of(p->bits, count);
    memset(payload + used, 0, zr_round_up(used, 4) - used);
    return payload;
}

static void block_finish(void *block, size_t nonfinite)
{
    uint32_t nf = (uint32_t)nonfinite;
    memcpy((uint8_t *)block + offsetof(zr_quant_header, nonfinite_groups), &nf, sizeof nf);
}

static void decode_range(const zr_quant_kernels *k, const zr_quant_header *h, const uint8_t *block,
                         size_t start, size_t n, zr_quant_out mode, void *out);

/*
 * Groups [g0, g1) of an encode, or of zr_quant_sum_requant's output: there
 * one group at a time is first the k inputs decoded and summed in rank order
 * into the task's scratch, which stays in L1/L2, then requantized.
 */
static void encode_task(void *arg, size_t g0, size_t g1, int thread)
{
    encode_job *j = arg;
    size_t group = (size_t)j->p->group, esize = zr_dtype_size(j->t), nf = 0;
    int asym = j->p->scheme == ZR_QUANT_ASYM;
    ZR_ASSERT(j->nblocks == 0 || (thread >= 0 && (size_t)thread < j->tasks));
    float *sum = j->nblocks > 0 ? j->scratch + (size_t)thread * j->stride : NULL;
    for (size_t gi = g0; gi < g1; gi++) {
        size_t start = gi * group, n = j->count - start < group ? j->count - start : group;
        const void *in = sum != NULL ? (const void *)sum : j->x + start * esize;
        for (int b = 0; b < j->nblocks; b++) {
            decode_range(j->k, &j->hs[b], j->blocks[b], start, n,
                         b == 0 ? ZR_QUANT_OUT_F32 : ZR_QUANT_OUT_ADD, sum);
        }
        nf += (size_t)encode_group(
            j->k, j->p->bits, asym, j->t, in, j->residual != NULL ? j->residual + start : NULL, n,
            j->mul, j->block, gi, j->payload + (j->p->bits == 8 ? start : start / 2));
    }
    atomic_fetch_add(&j->nonfinite, nf);
}

zr_status zr_quant_encode(const zr_quant_params *p, zr_dtype in_type, const void *x, size_t count,
                          float mul, float *residual, void *block, size_t *nonfinite)
{
    ZR_CHECK(encode_args_check(p, in_type, x, count, block));
    encode_job j = {.k = kernels(),
                    .p = p,
                    .t = in_type,
                    .x = x,
                    .residual = residual,
                    .count = count,
                    .mul = mul,
                    .block = block,
                    .payload = block_start(p, count, block)};
    atomic_init(&j.nonfinite, 0);
    size_t group = (size_t)p->group;
    zr_parallel_for(zr_div_up(count, group), grain_groups(group), encode_task, &j);
    size_t nf = atomic_load(&j.nonfinite);
    block_finish(block, nf);
    if (nonfinite != NULL) {
        *nonfinite = nf;
    }
    return ZR_OK;
}

/* ---- decoding ------------------------------------------------------------- */

/*
 * Decode elements [start, start + n) of a block into out (mode decides how).
 * start and every group boundary are multiples of 8 in callers that cut
 * ranges at group boundaries, so 4-bit segments start on a byte.
 */
static void decode_range(const zr_quant_kernels *k, const zr_quant_header *h, const uint8_t *block,
                         size_t start, size_t n, zr_quant_out mode, void *out)
{
    size_t group = h->group, osize = mode == ZR_QUANT_OUT_BF16 ? 2 : 4;
    const uint8_t *payload = block + h->payload_offset;
    zr_quant_group g;
    memset(&g, 0, sizeof g);
    g.bits = h->bits;
    g.asym = h->scheme == ZR_QUANT_ASYM;
    size_t done = 0;
    while (done < n) {
        size_t e = start + done, gi = e / group;
        size_t seg = (gi + 1) * group - e;
        seg = seg < n - done ? seg : n - done;
        g.scale = scale_get(block, g.asym ? 2 * gi : gi);
        g.zero = g.asym ? scale_get(block, 2 * gi + 1) : 0.0f;
        k->decode(&g, payload + (g.bits == 8 ? e : e / 2), seg, mode,
                  (uint8_t *)out + done * osize);
        done += seg;
    }
}

/* What one decode shares with its tasks. */
typedef struct decode_job {
    const zr_quant_kernels *k;
    const zr_quant_header *h;
    const uint8_t *block;
    size_t count;
    zr_quant_out mode;
    uint8_t *out;
} decode_job;

static void decode_task(void *arg, size_t g0, size_t g1, int thread)
{
    (void)thread;
    const decode_job *j = arg;
    size_t group = j->h->group, osize = j->mode == ZR_QUANT_OUT_BF16 ? 2 : 4;
    size_t start = g0 * group, end = g1 * group < j->count ? g1 * group : j->count;
    decode_range(j->k, j->h, j->block, start, end - start, j->mode, j->out + start * osize);
}

/* Decode a sane block's count elements into out, its groups split over the pool. */
static void decode_all(const zr_quant_header *h, const void *block, size_t count, zr_quant_out mode,
                       void *out)
{
    decode_job j = {kernels(), h, block, count, mode, out};
    zr_parallel_for(zr_div_up(count, h->group), grain_groups(h->group), decode_task, &j);
}

zr_status zr_quant_decode(const void *block, zr_dtype out_type, void *out, size_t count)
{
    zr_quant_header h;
    ZR_CHECK(header_sane(block, count, &h));
    if (out_type != ZR_DTYPE_F32 && out_type != ZR_DTYPE_BF16) {
        ZR_FAIL(ZR_ERR_INVALID, "quant decode: unknown output dtype %d", (int)out_type);
    }
    if (out == NULL && count > 0) {
        ZR_FAIL(ZR_ERR_INVALID, "quant decode: NULL output");
    }
    decode_all(&h, block, count, out_type == ZR_DTYPE_BF16 ? ZR_QUANT_OUT_BF16 : ZR_QUANT_OUT_F32,
               out);
    return ZR_OK;
}

zr_status zr_quant_decode_add(const void *block, float *acc, size_t count)
{
    zr_quant_header h;
    ZR_CHECK(header_sane(block, count, &h));
    if (acc == NULL && count > 0) {
        ZR_FAIL(ZR_ERR_INVALID, "quant decode_add: NULL accumulator");
    }
    decode_all(&h, block, count, ZR_QUANT_OUT_ADD, acc);
    return ZR_OK;
}

zr_status zr_quant_sum_requant(const void *const *blocks, int k, size_t count, float mul,
                               const zr_quant_params *p, float *residual, void *out_block,
                               size_t *nonfinite)
{
    ZR_CHECK(zr_quant_params_check(p));
    if (k < 1 || blocks == NULL || out_block == NULL) {
        ZR_FAIL(ZR_ERR_INVALID, "quant sum_requant: need k >= 1 blocks and an output (k = %d)", k);
    }
    zr_quant_header *hs;
    ZR_ALLOC(hs, (size_t)k);
    zr_status st = ZR_OK;
    for (int j = 0; j < k; j++) {
        ZR_CHECK_GOTO(header_sane(blocks[j], count, &hs[j]), st, done);
    }
    /* a group of scratch for every task the pool may run (tasks may not allocate): as
       zr_pool_run splits, at most the threads and one task per grain */
    size_t group = (size_t)p->group, ngroups = zr_div_up(count, group);
    size_t tasks = ngroups / grain_groups(group), threads = (size_t)zr_threads_get();
    tasks = tasks < 1 ? 1 : tasks > threads ? threads : tasks;
    size_t stride = count < group ? (count > 0 ? count : 1) : group;
    encode_job j = {.k = kernels(),
                    .p = p,
                    .t = ZR_DTYPE_F32,
                    .residual = residual,
                    .count = count,
                    .mul = mul,
                    .block = out_block,
                    .blocks = blocks,
                    .hs = hs,
                    .nblocks = k};
    atomic_init(&j.nonfinite, 0);
    j.stride = stride, j.tasks = tasks;
    ZR_ALLOC_GOTO(j.scratch, tasks * stride, st, done);
    j.payload = block_start(p, count, out_block);
    zr_parallel_for(ngroups, grain_groups(group), encode_task, &j);
    size_t nf = atomic_load(&j.nonfinite);
    block_finish(out_block, nf);
    if (nonfinite != NULL) {
        *nonfinite = nf;
    }
    zr_free(j.scratch);
done:
    zr_free(hs);
    return st;
}
