/*
 * quant_cuda.cu - the block codec's CUDA kernels: encode from fp32 or bf16,
 * decode to fp32, bf16 or an fp32 accumulator, qgZ's fused
 * decode-sum-requantize, bf16 casts and the rank-ordered fp32 sum.
 *
 * The blocks are the CPU codec's (zr/quant.h): every per-element and
 * per-group decision is a rule of quant_rules.h / bf16_rules.h, which the CPU
 * oracle calls too, so a block encoded here decodes on the CPU to the same
 * bytes and back. What is left to this file is the parallel shape:
 *   - encode: a team of threads per group. Up to 2048 elements a team is a
 *     power-of-two slice of a warp (width W = 1..32) and every thread keeps
 *     R <= 8 chunks of 8 values in registers between the scan and the coding,
 *     so the input is read once; larger groups get a block of 256 threads
 *     that reads the group twice (the second time from cache). The scan's
 *     reductions (largest |v| as integer bits; asym also min, max) give the
 *     same result in any order; -0 and +0 are merged by the rule. Scheme and
 *     error feedback are template parameters (no per-element test of either).
 *   - decode and elementwise work: one thread per chunk of 8 elements.
 *   - chunks of 8 elements never straddle a group (groups are multiples of 8)
 *     and are loaded and stored with 16-byte accesses where the C side found
 *     the pointers aligned (vec_in, vec_out, vec), elementwise otherwise.
 * The header is written by thread 0 of block 0; the count of non-finite
 * groups is added atomically into a word the launcher zeroes first.
 *
 * Built by nvcc and the GPU emulator (g++); the rules' arithmetic is spelled
 * with __fmul_rn etc., so no --fmad flag changes a bit. The C side
 * (quant_cuda.c) checks every argument before a launch.
 */
#include "../base/cuda_kernel.h"
#include "quant_cuda_impl.h"
#include "quant_rules.h"

#define FULL_MASK     0xffffffffu
#define TEAM_THREADS  128 /* block of the warp-team encode */
#define GROUP_THREADS 256 /* block of the one-group-per-block encode */
#define EW_THREADS    256 /* block of decode and elementwise kernels */
#define MAX_R         8   /* chunks of 8 values a thread keeps in registers */

/* ---- scans and their reduction ------------------------------------------------ */

struct scan_t {
    uint32_t absbits;
    float mn, mx;
};

__device__ __forceinline__ scan_t scan_join(scan_t a, scan_t b)
{
    a.absbits = max(a.absbits, b.absbits);
    a.mn = fminf(a.mn, b.mn);
    a.mx = fmaxf(a.mx, b.mx);
    return a;
}

/* Butterfly over lanes l ^ off (off < width): every lane of a team ends
 * with the team's result (sym: the largest |v| only). All 32 lanes of the
 * warp take part. */
template <bool ASYM> __device__ __forceinline__ scan_t warp_join(scan_t s, int width)
{
    for (int off = width / 2; off > 0; off /= 2) {
        s.absbits = max(s.absbits, __shfl_xor_sync(FULL_MASK, s.absbits, off));
        if (ASYM) {
            s.mn = fminf(s.mn, __shfl_xor_sync(FULL_MASK, s.mn, off));
            s.mx = fmaxf(s.mx, __shfl_xor_sync(FULL_MASK, s.mx, off));
        }
    }
    return s;
}

/* ---- loading the values of one chunk ------------------------------------------ */

/* What decoding an input block of a sum needs, read once per CUDA block. */
struct in_hdr {
    const uint8_t *base;
    uint64_t poff;
    uint32_t group;
    int bits, asym;
};

/*
 * d[i] = x' of elements e..e+m-1 of an input block (0 beyond m), gi their
 * group's index when the caller knows it (~0 otherwise). EXACT: a
 * non-finite group decodes to ZR_QUANT_QNAN_BITS; without, to some NaN (a
 * sum being requantized only asks whether a value is NaN).
 */
template <bool EXACT>
__device__ __forceinline__ void decode8(const in_hdr &h, uint64_t gi, uint64_t e, int m, float d[8])
{
    gi = gi == ~(uint64_t)0 ? zr_quant_div_group(e, h.group) : gi;
    const float *sc = reinterpret_cast<const float *>(h.base + ZR_QUANT_HEADER_BYTES);
    zr_quant_group g;
    g.bits = h.bits;
    g.asym = h.asym;
    g.scale = sc[h.asym ? 2 * gi : gi];
    g.zero = h.asym ? sc[2 * gi + 1] : 0.0f;
    g.div = g.lo = g.hi = 0.0f;
    const uint32_t *pw =
        reinterpret_cast<const uint32_t *>(h.base + h.poff + (h.bits == 8 ? e : e / 2));
    uint32_t w0 = pw[0], w1 = h.bits == 8 && m > 4 ? pw[1] : 0u;
    ZR_UNROLL
    for (int i = 0; i < 8; i++) {
        uint32_t f =
            h.bits == 8 ? ((i < 4 ? w0 : w1) >> (8 * (i & 3))) & 0xffu : (w0 >> (4 * i)) & 0xfu;
        int q = zr_quant_unpack(h.bits, h.asym, f);
        d[i] = i >= m ? 0.0f : EXACT ? zr_quant_decode1(&g, q) : zr_quant_dequant(&g, q);
    }
}

/*
 * 8 floats from p (m valid), with one 16-byte pair of loads when allowed;
 * through the read-only cache (__ldg) only for memory the kernel does not
 * also write (RO = false for residuals and accumulators).
 */
template <bool RO = true>
__device__ __forceinline__ void load_f32(const float *p, int m, bool vec, float v[8])
{
    if (vec && m == 8) {
        const float4 *q = reinterpret_cast<const float4 *>(p);
        float4 a = RO ? __ldg(q) : q[0];
        float4 b = RO ? __ldg(q + 1) : q[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        return;
    }
    ZR_UNROLL
    for (int i = 0; i < 8; i++) {
        v[i] = i < m ? p[i] : 0.0f;
    }
}

__device__ __forceinline__ void load_bf16(const uint16_t *p, int m, bool vec, float v[8])
{
    if (vec && m == 8) {
        uint4 w = __ldg(reinterpret_cast<const uint4 *>(p));
        uint32_t ws[4] = {w.x, w.y, w.z, w.w};
        ZR_UNROLL
        for (int i = 0; i < 8; i++) {
            v[i] = zr_quant_bf16_widen((uint16_t)(ws[i / 2] >> (16 * (i & 1))));
        }
        return;
    }
    ZR_UNROLL
    for (int i = 0; i < 8; i++) {
        v[i] = i < m ? zr_quant_bf16_widen(p[i]) : 0.0f;
    }
}

__device__ __forceinline__ void store_f32(float *p, int m, bool vec, const float v[8])
{
    if (vec && m == 8) {
        reinterpret_cast<float4 *>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
        reinterpret_cast<float4 *>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
        return;
    }
    ZR_UNROLL
    for (int i = 0; i < 8; i++) {
        if (i < m) {
            p[i] = v[i];
        }
    }
}

__device__ __forceinline__ void store_bf16(uint16_t *p, int m, bool vec, const float v[8])
{
    uint16_t h[8];
    ZR_UNROLL
    for (int i = 0; i < 8; i++) {
        h[i] = zr_quant_bf16_round(v[i]);
    }
    if (vec && m == 8) {
        *reinterpret_cast<uint4 *>(p) =
            make_uint4(h[0] | (uint32_t)h[1] << 16, h[2] | (uint32_t)h[3] << 16,
                       h[4] | (uint32_t)h[5] << 16, h[6] | (uint32_t)h[7] << 16);
        return;
    }
    ZR_UNROLL
    for (int i = 0; i < 8; i++) {
        if (i < m) {
            p[i] = h[i];
        }
    }
}

/*
 * The memory an encode touches. Its pointers travel as kernel parameters of
 * their own, not only in zr_quant_k_encode: the GPU emulator's race detector
 * records a launch's pointer parameters, so it sees what each launch reads
 * and writes (of a sum's input blocks, the first: they usually share one
 * buffer). The struct parameter is only read, never copied or written, so it
 * stays in parameter memory.
 */
struct enc_ptrs {
    const void *x;
    float *r;
    uint8_t *block;
};

/*
 * v = the values quantized for elements e..e+m-1 of group gi (x * mul, + r
 * with error feedback, EF). A sum of blocks adds with __fadd_rn, not the
 * NaN-preserving zr_quant_add: a NaN only makes its group non-finite, which
 * codes the same whatever the NaN's bits.
 */
template <int SRC, bool EF>
__device__ __forceinline__ void load_values(const zr_quant_k_encode &a, const enc_ptrs &p,
                                            const in_hdr *hs, uint64_t gi, uint64_t e, int m,
                                            float v[8])
{
    if (SRC == ZR_QUANT_K_SRC_F32) {
        load_f32(static_cast<const float *>(p.x) + e, m, a.vec_in, v);
    } else if (SRC == ZR_QUANT_K_SRC_BF16) {
        load_bf16(static_cast<const uint16_t *>(p.x) + e, m, a.vec_in, v);
    } else {
        decode8<false>(hs[0], hs[0].group == (uint32_t)a.group ? gi : ~(uint64_t)0, e, m, v);
        for (int j = 1; j < a.k; j++) {
            float d[8];
            decode8<false>(hs[j], hs[j].group == (uint32_t)a.group ? gi : ~(uint64_t)0, e, m, d);
            ZR_UNROLL
            for (int i = 0; i < 8; i++) {
                v[i] = __fadd_rn(v[i], d[i]); /* in the order given, as on the CPU */
            }
        }
    }
    float r[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (EF) {
        load_f32<false>(p.r + e, m, a.vec_in, r);
    }
    ZR_UNROLL
    for (int i = 0; i < 8; i++) {
        v[i] = zr_quant_input(v[i], a.mul, EF, r[i]);
    }
}

/* The loads give 0 beyond m, which cannot raise the largest |v|: only the
 * min and max (asym) test i < m. */
template <bool ASYM> __device__ __forceinline__ void scan_chunk(scan_t &s, const float v[8], int m)
{
    if (ASYM) {
        ZR_UNROLL
        for (int i = 0; i < 8; i++) {
            s.mn = i < m ? fminf(s.mn, v[i]) : s.mn;
            s.mx = i < m ? fmaxf(s.mx, v[i]) : s.mx;
        }
    }
    ZR_UNROLL
    for (int i = 0; i < 8; i++) {
        s.absbits = max(s.absbits, zr_quant_absbits(v[i]));
    }
}

/* ---- coding one chunk, and a group's scales ---------------------------------------- */

/*
 * The codes of 8 values of a finite group packed into w0 (and w1 for INT8),
 * and with EF the residuals. The group is coded as if recip were 0:
 * (v * pre) * inv, which for pre = 1 is the same bits as v * inv, so that
 * one straight path serves every finite group (no per-element branch).
 */
template <int BITS, bool EF>
__device__ __forceinline__ void code8(const zr_quant_group &g, const float v[8], uint32_t &w0,
                                      uint32_t &w1, float res[8])
{
    zr_quant_group gc = g;
    gc.recip = 0;
    w0 = w1 = 0;
    ZR_UNROLL
    for (int i = 0; i < 8; i++) {
        int q = zr_quant_code(&gc, v[i]);
        if (EF) {
            res[i] = ZR_QUANT_FSUB(v[i], zr_quant_dequant(&gc, q));
        }
        uint32_t f = zr_quant_pack(BITS, q);
        if (BITS == 8 && i >= 4) {
            w1 |= f << (8 * (i - 4));
        } else {
            w0 |= f << (BITS * i);
        }
    }
}

/* Payload (codes of 0 beyond m, which is the block's zero padding) and residual. */
template <int BITS, bool EF>
__device__ __forceinline__ void code_chunk(const zr_quant_k_encode &a, const enc_ptrs &p,
                                           const zr_quant_group &g, bool nonfinite, uint64_t e,
                                           int m, const float v[8])
{
    uint32_t w0 = 0, w1 = 0;
    float res[8] = {0, 0, 0, 0, 0, 0, 0, 0}; /* a non-finite group's residual starts over */
    if (!nonfinite) {
        code8<BITS, EF>(g, v, w0, w1, res);
    }
    if (m < 8) { /* the block's last chunk: zero codes beyond m */
        uint64_t keep = (1ull << (BITS * m)) - 1;
        w0 &= (uint32_t)keep;
        w1 &= (uint32_t)(keep >> 32);
    }
    uint8_t *out = p.block + a.payload_offset + (BITS == 8 ? e : e / 2);
    if (BITS == 8 && a.vec_out && m > 4) {
        *reinterpret_cast<uint2 *>(out) = make_uint2(w0, w1);
    } else {
        reinterpret_cast<uint32_t *>(out)[0] = w0;
        if (BITS == 8 && m > 4) {
            reinterpret_cast<uint32_t *>(out)[1] = w1;
        }
    }
    if (EF) {
        store_f32(p.r + e, m, a.vec_in, res);
    }
}

__device__ __forceinline__ void put_scales(const zr_quant_k_encode &a, const enc_ptrs &p,
                                           uint64_t gi, const zr_quant_group &g, bool nonfinite)
{
    float *sc = reinterpret_cast<float *>(p.block + ZR_QUANT_HEADER_BYTES);
    float nan = zr_quant_bits_f32(ZR_QUANT_QNAN_BITS);
    if (a.asym) {
        sc[2 * gi] = nonfinite ? nan : g.scale;
        sc[2 * gi + 1] = nonfinite ? nan : g.zero;
    } else {
        sc[gi] = nonfinite ? nan : g.scale;
    }
    if (nonfinite) {
        atomicAdd(reinterpret_cast<unsigned int *>(p.block + 12), 1u);
    }
}

/*
 * Prologue of every encode block: read (BLOCKS) and check the input headers,
 * write the output header (block 0). Returns false, for the whole block,
 * when an input is not a block of count elements: then the output's magic
 * is 0, so that nothing downstream takes it for data.
 */
template <int SRC>
__device__ __forceinline__ bool encode_prologue(const zr_quant_k_encode &a, const enc_ptrs &p,
                                                in_hdr *hs, int *bad)
{
    bool ok = true;
    if (SRC == ZR_QUANT_K_SRC_BLOCKS) {
        if (threadIdx.x == 0) {
            *bad = 0;
        }
        __syncthreads();
        for (int j = threadIdx.x; j < a.k; j += blockDim.x) {
            const uint32_t *w = reinterpret_cast<const uint32_t *>(a.in[j]);
            uint32_t bs = w[1];
            uint64_t count = w[4] | (uint64_t)w[5] << 32, poff = w[6] | (uint64_t)w[7] << 32;
            in_hdr h = {a.in[j], poff, w[2], (int)(bs & 0xffu), (int)((bs >> 8) & 0xffu)};
            bool good = w[0] == ZR_QUANT_MAGIC && (h.bits == 8 || h.bits == 4) && h.asym <= 1 &&
                        (bs >> 16) == 0 && zr_quant_group_ok(h.group) && count == a.count &&
                        poff == zr_quant_payload_offset(h.asym, h.group, count);
            hs[j] = h;
            if (!good) {
                *bad = 1;
            }
        }
        __syncthreads();
        ok = *bad == 0;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        uint32_t *h = reinterpret_cast<uint32_t *>(p.block);
        for (int i = 0; i < 8; i++) {
            if (i != 3) {
                h[i] = i == 0 && !ok ? 0u : a.header[i];
            }
        }
    }
    return ok;
}

/* ---- encode kernels ------------------------------------------------------------------ */

/* Teams of `width` lanes, one group each, R chunks per lane kept in registers. */
#define ENCODE_PARAMS                                                                              \
    const zr_quant_k_encode a, const void *x, const uint8_t *in0, float *r, uint8_t *block

template <int SRC, int BITS, bool ASYM, bool EF, int R>
__global__ void __launch_bounds__(TEAM_THREADS) encode_teams(ENCODE_PARAMS, int width)
{
    __shared__ in_hdr hs[SRC == ZR_QUANT_K_SRC_BLOCKS ? ZR_QUANT_K_MAX_IN : 1];
    __shared__ int bad;
    const enc_ptrs p = {x, r, block};
    (void)in0;
    if (!encode_prologue<SRC>(a, p, hs, &bad)) {
        return;
    }
    int lane = threadIdx.x % width;
    uint64_t gi = (uint64_t)blockIdx.x * (blockDim.x / width) + threadIdx.x / width;
    uint64_t start = gi * (uint64_t)a.group;
    bool active = start < a.count;
    int n = active ? (int)min((uint64_t)a.group, a.count - start) : 0;
    float v[R][8];
    int mj[R]; /* elements of chunk j: 0..8 */
    scan_t s = {0u, INFINITY, -INFINITY};
    ZR_UNROLL
    for (int j = 0; j < R; j++) {
        int c = lane + j * width;
        mj[j] = max(0, min(8, n - 8 * c));
        if (mj[j] > 0) {
            load_values<SRC, EF>(a, p, hs, gi, start + 8 * (uint64_t)c, mj[j], v[j]);
            scan_chunk<ASYM>(s, v[j], mj[j]);
        }
    }
    s = warp_join<ASYM>(s, width);
    ZR_UNROLL
    for (int j = 0; j < R; j++) {
        asm("" : "+r"(mj[j])); /* tests and offsets anew below: kept live, they spilled */
    }
    asm("" : "+r"(lane));
    bool nonfinite = zr_quant_nonfinite(s.absbits);
    zr_quant_group g = zr_quant_group_make(BITS, ASYM, s.absbits, s.mn, s.mx);
    if (active && lane == 0) {
        put_scales(a, p, gi, g, nonfinite);
    }
    ZR_UNROLL
    for (int j = 0; j < R; j++) {
        if (mj[j] > 0) {
            code_chunk<BITS, EF>(a, p, g, nonfinite, start + 8 * (uint64_t)(lane + j * width),
                                 mj[j], v[j]);
        }
    }
}

/* One block per group (groups of more than 2048 elements): scan, then code. */
template <int SRC, int BITS, bool ASYM, bool EF>
__global__ void __launch_bounds__(GROUP_THREADS) encode_group(ENCODE_PARAMS)
{
    __shared__ in_hdr hs[SRC == ZR_QUANT_K_SRC_BLOCKS ? ZR_QUANT_K_MAX_IN : 1];
    __shared__ int bad;
    __shared__ scan_t part[GROUP_THREADS / 32];
    const enc_ptrs p = {x, r, block};
    (void)in0;
    if (!encode_prologue<SRC>(a, p, hs, &bad)) {
        return;
    }
    uint64_t gi = blockIdx.x, start = gi * (uint64_t)a.group;
    int n = start < a.count ? (int)min((uint64_t)a.group, a.count - start) : 0;
    scan_t s = {0u, INFINITY, -INFINITY};
    for (int c = threadIdx.x; 8 * c < n; c += blockDim.x) {
        float v[8];
        int m = min(8, n - 8 * c);
        load_values<SRC, EF>(a, p, hs, gi, start + 8 * (uint64_t)c, m, v);
        scan_chunk<ASYM>(s, v, m);
    }
    s = warp_join<ASYM>(s, 32);
    if (threadIdx.x % 32 == 0) {
        part[threadIdx.x / 32] = s;
    }
    __syncthreads();
    s = part[0];
    for (int w = 1; w < (int)blockDim.x / 32; w++) {
        s = scan_join(s, part[w]);
    }
    bool nonfinite = zr_quant_nonfinite(s.absbits);
    zr_quant_group g = zr_quant_group_make(BITS, ASYM, s.absbits, s.mn, s.mx);
    if (n > 0 && threadIdx.x == 0) {
        put_scales(a, p, gi, g, nonfinite);
    }
    for (int c = threadIdx.x; 8 * c < n; c += blockDim.x) {
        float v[8];
        int m = min(8, n - 8 * c);
        load_values<SRC, EF>(a, p, hs, gi, start + 8 * (uint64_t)c, m, v); /* again: from cache */
        code_chunk<BITS, EF>(a, p, g, nonfinite, start + 8 * (uint64_t)c, m, v);
    }
}

/* ---- decode and elementwise kernels ------------------------------------------------- */

template <int MODE>
__global__ void __launch_bounds__(EW_THREADS)
    decode_kernel(const zr_quant_k_decode a, const uint8_t *block, void *out)
{
    /* block and out as parameters of their own: see enc_ptrs */
    const uint32_t *w = reinterpret_cast<const uint32_t *>(block);
    uint32_t bs = w[1];
    uint64_t count = w[4] | (uint64_t)w[5] << 32, poff = w[6] | (uint64_t)w[7] << 32;
    in_hdr h = {block, poff, w[2], (int)(bs & 0xffu), (int)((bs >> 8) & 0xffu)};
    /* a header the C side could not read: NaN out, never plausible numbers */
    bool ok = w[0] == ZR_QUANT_MAGIC && (h.bits == 8 || h.bits == 4) && h.asym <= 1 &&
              zr_quant_group_ok(h.group) && count == a.count &&
              poff == zr_quant_payload_offset(h.asym, h.group, count);
    uint64_t nch = (a.count + 7) / 8;
    for (uint64_t c = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; c < nch;
         c += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t e = 8 * c;
        int m = (int)min((uint64_t)8, a.count - e);
        float d[8];
        if (ok) {
            decode8<true>(h, ~(uint64_t)0, e, m, d);
        } else {
            ZR_UNROLL
            for (int i = 0; i < 8; i++) {
                d[i] = zr_quant_bits_f32(ZR_QUANT_QNAN_BITS);
            }
        }
        if (MODE == ZR_QUANT_K_OUT_BF16) {
            store_bf16(static_cast<uint16_t *>(out) + e, m, a.vec, d);
        } else if (MODE == ZR_QUANT_K_OUT_F32) {
            store_f32(static_cast<float *>(out) + e, m, a.vec, d);
        } else {
            float *acc = static_cast<float *>(out) + e;
            float v[8];
            load_f32<false>(acc, m, a.vec, v);
            ZR_UNROLL
            for (int i = 0; i < 8; i++) {
                v[i] = zr_quant_add(v[i], d[i]);
            }
            store_f32(acc, m, a.vec, v);
        }
    }
}

template <int OP>
__global__ void __launch_bounds__(EW_THREADS)
    elementwise(const zr_quant_k_elementwise a, const void *in, void *out)
{
    /* in and out as parameters of their own: see enc_ptrs */
    uint64_t nch = (a.n + 7) / 8;
    for (uint64_t c = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; c < nch;
         c += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t e = 8 * c;
        int m = (int)min((uint64_t)8, a.n - e);
        float v[8];
        if constexpr (OP == ZR_QUANT_K_TO_BF16) {
            load_f32(static_cast<const float *>(in) + e, m, a.vec, v);
            store_bf16(static_cast<uint16_t *>(out) + e, m, a.vec, v);
        } else if constexpr (OP == ZR_QUANT_K_TO_F32) {
            load_bf16(static_cast<const uint16_t *>(in) + e, m, a.vec, v);
            store_f32(static_cast<float *>(out) + e, m, a.vec, v);
        } else if constexpr (OP == ZR_QUANT_K_ADD_F32 || OP == ZR_QUANT_K_ADD_BF16) {
            /* acc = acc + x, x widened exactly: the CPU's acc[i] += x[i] */
            float t[8];
            float *acc = static_cast<float *>(out) + e;
            if constexpr (OP == ZR_QUANT_K_ADD_F32) {
                load_f32(static_cast<const float *>(in) + e, m, a.vec, t);
            } else {
                load_bf16(static_cast<const uint16_t *>(in) + e, m, a.vec, t);
            }
            load_f32<false>(acc, m, a.vec, v);
            ZR_UNROLL
            for (int i = 0; i < 8; i++) {
                v[i] = zr_quant_add(v[i], t[i]);
            }
            store_f32(acc, m, a.vec, v);
        } else {
            /* the rank-ordered sum: row 0, + row 1, + row 2, ..., then / div */
            for (int j = 0; j < a.k; j++) {
                float t[8];
                uint64_t at = (uint64_t)j * a.stride + e;
                if constexpr (OP == ZR_QUANT_K_SUM_F32) {
                    load_f32(static_cast<const float *>(in) + at, m, a.vec, t);
                } else {
                    load_bf16(static_cast<const uint16_t *>(in) + at, m, a.vec, t);
                }
                ZR_UNROLL
                for (int i = 0; i < 8; i++) {
                    v[i] = j == 0 ? t[i] : v[i] + t[i];
                }
            }
            ZR_UNROLL
            for (int i = 0; i < 8; i++) {
                v[i] = v[i] / a.div;
            }
            store_f32(static_cast<float *>(out) + e, m, a.vec, v);
        }
    }
}

/* ---- launchers -------------------------------------------------------------------------- */

/* Blocks for n chunks of 8, one chunk per thread, capped (the kernels stride). */
static unsigned int ew_grid(uint64_t n)
{
    uint64_t blocks = ((n + 7) / 8 + EW_THREADS - 1) / EW_THREADS;
    return (unsigned int)(blocks < 1 ? 1 : blocks > 65535 ? 65535 : blocks);
}

#define ENCODE_ARGS a, a.x, a.in[0], a.r, a.block

template <int SRC, int BITS, bool ASYM, bool EF>
static void launch_encode_t(const zr_quant_k_encode &a, cudaStream_t s)
{
    uint64_t ngroups = (a.count + a.group - 1) / a.group;
    int nch = a.group / 8;
    /* sums: at most 2 chunks a lane (4 spilled a register on sm_90, ptxas 13) */
    constexpr bool SUM = SRC == ZR_QUANT_K_SRC_BLOCKS;
    if (nch > 32 * (SUM ? 2 : MAX_R)) {
        unsigned int grid = (unsigned int)(ngroups < 1 ? 1 : ngroups);
        ZR_LAUNCH((encode_group<SRC, BITS, ASYM, EF>), grid, GROUP_THREADS, 0, s, ENCODE_ARGS);
        return;
    }
    int width = 1;
    while (width * 2 <= nch && width < 32) {
        width *= 2;
    }
    int r = 1;
    while (r * width < nch) {
        r *= 2;
    }
    uint64_t teams = TEAM_THREADS / width;
    unsigned int grid = (unsigned int)(ngroups < 1 ? 1 : (ngroups + teams - 1) / teams);
    void (*k)(ENCODE_PARAMS, int) = r == 1   ? encode_teams<SRC, BITS, ASYM, EF, 1>
                                    : r == 2 ? encode_teams<SRC, BITS, ASYM, EF, 2>
                                             : r == 4 ? encode_teams < SRC,
                             BITS, ASYM, EF, SUM ? 2 : 4 > : encode_teams < SRC, BITS, ASYM, EF,
                             SUM ? 2 : 8 > ;
    ZR_LAUNCH(k, grid, TEAM_THREADS, 0, s, ENCODE_ARGS, width);
}

template <int SRC, int BITS> static void launch_encode_b(const zr_quant_k_encode &a, cudaStream_t s)
{
    if (a.asym) {
        a.r != NULL ? launch_encode_t<SRC, BITS, true, true>(a, s)
                    : launch_encode_t<SRC, BITS, true, false>(a, s);
    } else {
        a.r != NULL ? launch_encode_t<SRC, BITS, false, true>(a, s)
                    : launch_encode_t<SRC, BITS, false, false>(a, s);
    }
}

template <int SRC> static void launch_encode_src(const zr_quant_k_encode &a, cudaStream_t s)
{
    if (a.bits == 8) {
        launch_encode_b<SRC, 8>(a, s);
    } else {
        launch_encode_b<SRC, 4>(a, s);
    }
}

extern "C" cudaError_t zr_quant_k_launch_encode(const zr_quant_k_encode *a, cudaStream_t s)
{
    /* the non-finite count is added to by the groups: it starts at 0 */
    cudaError_t err = cudaMemsetAsync(a->block + 12, 0, 4, s);
    if (err != cudaSuccess) {
        return err;
    }
    if (a->src == ZR_QUANT_K_SRC_F32) {
        launch_encode_src<ZR_QUANT_K_SRC_F32>(*a, s);
    } else if (a->src == ZR_QUANT_K_SRC_BF16) {
        launch_encode_src<ZR_QUANT_K_SRC_BF16>(*a, s);
    } else {
        launch_encode_src<ZR_QUANT_K_SRC_BLOCKS>(*a, s);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t zr_quant_k_launch_decode(const zr_quant_k_decode *a, cudaStream_t s)
{
    unsigned int grid = ew_grid(a->count);
    if (a->mode == ZR_QUANT_K_OUT_F32) {
        ZR_LAUNCH(decode_kernel<ZR_QUANT_K_OUT_F32>, grid, EW_THREADS, 0, s, *a, a->block, a->out);
    } else if (a->mode == ZR_QUANT_K_OUT_BF16) {
        ZR_LAUNCH(decode_kernel<ZR_QUANT_K_OUT_BF16>, grid, EW_THREADS, 0, s, *a, a->block, a->out);
    } else {
        ZR_LAUNCH(decode_kernel<ZR_QUANT_K_OUT_ADD>, grid, EW_THREADS, 0, s, *a, a->block, a->out);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t zr_quant_k_launch_elementwise(const zr_quant_k_elementwise *a,
                                                     cudaStream_t s)
{
    unsigned int grid = ew_grid(a->n);
    switch (a->op) {
    case ZR_QUANT_K_TO_BF16:
        ZR_LAUNCH(elementwise<ZR_QUANT_K_TO_BF16>, grid, EW_THREADS, 0, s, *a, a->in, a->out);
        break;
    case ZR_QUANT_K_TO_F32:
        ZR_LAUNCH(elementwise<ZR_QUANT_K_TO_F32>, grid, EW_THREADS, 0, s, *a, a->in, a->out);
        break;
    case ZR_QUANT_K_SUM_F32:
        ZR_LAUNCH(elementwise<ZR_QUANT_K_SUM_F32>, grid, EW_THREADS, 0, s, *a, a->in, a->out);
        break;
    case ZR_QUANT_K_ADD_F32:
        ZR_LAUNCH(elementwise<ZR_QUANT_K_ADD_F32>, grid, EW_THREADS, 0, s, *a, a->in, a->out);
        break;
    case ZR_QUANT_K_ADD_BF16:
        ZR_LAUNCH(elementwise<ZR_QUANT_K_ADD_BF16>, grid, EW_THREADS, 0, s, *a, a->in, a->out);
        break;
    default:
        ZR_LAUNCH(elementwise<ZR_QUANT_K_SUM_BF16>, grid, EW_THREADS, 0, s, *a, a->in, a->out);
        break;
    }
    return cudaGetLastError();
}
