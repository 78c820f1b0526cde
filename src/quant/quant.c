/*
 * quant.c - the block codec of zr/quant.h: parameters, the wire block,
 * per-group scale selection and non-finite handling, implementation
 * dispatch, and the scalar kernels that are the oracle for the vector ones.
 *
 * Everything decided once per group (scale, zero point, whether the group is
 * non-finite) is computed here in scalar C for every implementation, so the
 * vector kernels cannot disagree on it; they only run element loops.
 */
#include "quant_impl.h"

#include <float.h>

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

zr_status zr_quant_encode(const zr_quant_params *p, zr_dtype in_type, const void *x, size_t count,
                          float mul, float *residual, void *block, size_t *nonfinite)
{
    ZR_CHECK(encode_args_check(p, in_type, x, count, block));
    const zr_quant_kernels *k = kernels();
    uint8_t *payload = block_start(p, count, block);
    size_t group = (size_t)p->group, esize = zr_dtype_size(in_type), nf = 0;
    int asym = p->scheme == ZR_QUANT_ASYM;
    for (size_t start = 0, gi = 0; start < count; start += group, gi++) {
        size_t n = count - start < group ? count - start : group;
        nf += (size_t)encode_group(k, p->bits, asym, in_type, (const uint8_t *)x + start * esize,
                                   residual != NULL ? residual + start : NULL, n, mul, block, gi,
                                   payload + (p->bits == 8 ? start : start / 2));
    }
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
    decode_range(kernels(), &h, block, 0, count,
                 out_type == ZR_DTYPE_BF16 ? ZR_QUANT_OUT_BF16 : ZR_QUANT_OUT_F32, out);
    return ZR_OK;
}

zr_status zr_quant_decode_add(const void *block, float *acc, size_t count)
{
    zr_quant_header h;
    ZR_CHECK(header_sane(block, count, &h));
    if (acc == NULL && count > 0) {
        ZR_FAIL(ZR_ERR_INVALID, "quant decode_add: NULL accumulator");
    }
    decode_range(kernels(), &h, block, 0, count, ZR_QUANT_OUT_ADD, acc);
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
    const zr_quant_kernels *kern = kernels();
    size_t group = (size_t)p->group, nf = 0;
    size_t cap = count < group ? count : group;
    float *sum = NULL;
    ZR_ALLOC_GOTO(sum, cap > 0 ? cap : 1, st, done);
    uint8_t *payload = block_start(p, count, out_block);
    for (size_t start = 0, gi = 0; start < count; start += group, gi++) {
        size_t n = count - start < group ? count - start : group;
        /* one output group at a time: the sum stays in L1/L2 between the
         * decodes and the requantization */
        for (int j = 0; j < k; j++) {
            decode_range(kern, &hs[j], blocks[j], start, n,
                         j == 0 ? ZR_QUANT_OUT_F32 : ZR_QUANT_OUT_ADD, sum);
        }
        nf += (size_t)encode_group(kern, p->bits, p->scheme == ZR_QUANT_ASYM, ZR_DTYPE_F32, sum,
                                   residual != NULL ? residual + start : NULL, n, mul, out_block,
                                   gi, payload + (p->bits == 8 ? start : start / 2));
    }
    block_finish(out_block, nf);
    if (nonfinite != NULL) {
        *nonfinite = nf;
    }
    zr_free(sum);
done:
    zr_free(hs);
    return st;
}
