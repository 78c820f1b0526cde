/*
 * attention_flash.cu - causal self-attention on tensor cores for bf16
 * storage (issue 42): FlashAttention-2 (Dao 2023) with nvcuda::wmma bf16
 * 16x16x16 products and fp32 accumulators, head sizes 32, 64 and 128. Same
 * contract as attention_cuda.cu (qkv [B, T, 3C], out [B, T, C], lse [B, NH,
 * T] = m + log(l) in natural units, dqkv written once), which stays the path
 * for fp32 storage and other head sizes, and the reference of the tests.
 *
 * A block of 4 warps takes 64 rows (16 per warp) of one (batch, head); the
 * other operand comes in tiles of 64 rows, bf16 in shared memory (16-byte
 * loads where the C side allows, zero past T). Products go through a per-warp
 * fp32 tile in shared memory, where the warp's lanes (two per row, 32
 * columns each) do the softmax; the results return as bf16 matrix_a tiles.
 *
 *   flash_fwd      S = Q K^T per key tile up to the block's diagonal (later
 *                  tiles never loaded; on the diagonal a warp multiplies only
 *                  the 16-key parts at or before its last row), online
 *                  softmax in base 2, O (fragments) rescaled per tile by a
 *                  row-scale fragment, O += P V; O / l and L at the end.
 *   fa_delta       D = rowsum(dO * O) (no tensor cores: not flash_).
 *   flash_bwd_dkv  a block of keys walks the query tiles at or after it:
 *                  P^T = exp(K Q^T - L), dP^T = V dO^T, dS^T = P^T (dP^T -
 *                  D), dV += P^T dO, dK += dS^T Q.
 *   flash_bwd_dq   a block of queries walks the key tiles up to its
 *                  diagonal: dQ += dS K.
 * Every gradient has one writer: no atomics, the same bits every run.
 * Grouped key and value heads (issue 43) as in attention_cuda.cu: the
 * operands where zr_op_k_qkv says; flash_bwd_dkv's block of keys walks the
 * query tiles of its group's query heads one head after another.
 *
 * Fragments are used only through load/store/mma/fill and operations that
 * are the same for every element, or element by element between two
 * accumulators loaded the same way (the row scale): never by which element
 * is which entry (the emulator's layout is not the hardware's, mma.h).
 */
#include "ops_cuda_impl.h"
#include "ops_cuda_vec.h"

#include <cuda_pipeline.h>
#include <mma.h>

namespace wmma = nvcuda::wmma;
typedef __nv_bfloat16 fa_bf16;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, fa_bf16, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, fa_bf16, wmma::row_major> frag_br;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, fa_bf16, wmma::col_major> frag_bc;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

#define FA_THREADS 128
#define FA_ROWS    64 /* rows of a block (16 per warp) and of a tile */
#define FA_SW      72 /* row stride of a warp's fp32 16 x 64 tile (floats, padded) */
#define FA_PW      72 /* row stride of a warp's bf16 16 x 64 tile */
#define FA_LOG2E   1.4426950408889634f
#define FA_LN2     0.6931471805599453f

/*
 * DB: the variant with double-buffered tiles (zr_op_k_att.variant 1): the
 * next tile of the walked operand is copied to shared memory with cp.async
 * (__pipeline_memcpy_async) while the warps compute on the current one;
 * four tiles, L and D twice.
 */
template <int HS, bool DB = false> struct fa_cfg {
    static constexpr int NF = HS / 16;                      /* 16-wide parts of a head */
    static constexpr int LD = HS + 8;                       /* bf16 tile row stride */
    static constexpr int TILE = FA_ROWS * LD;               /* elements of a bf16 tile */
    static constexpr int OW = HS <= 64 ? FA_SW : 2 * FA_SW; /* fp32 output rows' stride */
    static constexpr int WF = 16 * 2 * FA_SW;               /* floats of a warp's two fp32 tiles */
    static constexpr int WB = 16 * 2 * FA_PW;               /* bf16 of a warp's two bf16 tiles */
    /* bytes: two bf16 tiles, L and D, then per warp two fp32 and two bf16 tiles */
    /* (+ 32: the start rounded up to 32 bytes, wmma's alignment, whatever the base's) */
    static constexpr int NT = DB ? 4 : 2; /* bf16 tiles */
    static constexpr size_t SHMEM = 32 + NT * TILE * sizeof(fa_bf16) +
                                    NT * FA_ROWS * sizeof(float) +
                                    4 * (WF * sizeof(float) + WB * sizeof(fa_bf16));
};

/* A block's shared memory, carved from one dynamic buffer (every part 32-byte aligned). */
template <int HS, bool DB = false> struct fa_smem {
    fa_bf16 *t0, *t1; /* two 64-row tiles (the first pair with DB) */
    float *Ls, *Ds;   /* a query tile's L (base 2) and D (the first pair with DB) */
    float *f;         /* this warp's fp32 tiles: f [16][FA_SW], f + 16 FA_SW */
    fa_bf16 *p;       /* this warp's bf16 tiles: p [16][FA_PW], p + 16 FA_PW */
    __device__ fa_smem(char *raw, int w)
    {
        typedef fa_cfg<HS, DB> c;
        char *base = raw + ((32 - ((uintptr_t)raw & 31u)) & 31u);
        t0 = reinterpret_cast<fa_bf16 *>(base);
        t1 = t0 + c::TILE;
        Ls = reinterpret_cast<float *>(t0 + c::NT * c::TILE);
        Ds = Ls + FA_ROWS;
        float *wb = Ls + c::NT * FA_ROWS;
        f = wb + w * c::WF;
        p = reinterpret_cast<fa_bf16 *>(wb + 4 * c::WF) + w * c::WB;
    }
    /* buffer k of a pair of tiles (DB: 0 or 1), its L and D */
    __device__ fa_bf16 *tile(int k, int which) const
    {
        return t0 + (2 * k + which) * fa_cfg<HS, DB>::TILE;
    }
    __device__ float *rows(int k, int which) const
    {
        return Ls + (2 * k + which) * FA_ROWS;
    }
};

/* The same as fa_load_tile, the 16-byte rows' copies asynchronous (cp.async, vec only). */
template <int HS>
__device__ __forceinline__ void fa_issue_tile(fa_bf16 *dst, const zr_bf16_t *src, int r0, int T,
                                              size_t ld)
{
    constexpr int CH = HS / 8, LD = fa_cfg<HS>::LD;
    for (int q = threadIdx.x; q < FA_ROWS * CH; q += FA_THREADS) {
        int rr = q / CH, c = (q % CH) * 8, r = r0 + rr;
        if (r < T) {
            __pipeline_memcpy_async(dst + rr * LD + c, src + (size_t)r * ld + c, 16);
        } else {
            *reinterpret_cast<uint4 *>(dst + rr * LD + c) = make_uint4(0, 0, 0, 0);
        }
    }
}

/* dst [64][LD] = rows r0.. of src (HS bf16 each, row stride ld), zero past T. */
template <int HS>
__device__ __forceinline__ void fa_load_tile(fa_bf16 *dst, const zr_bf16_t *src, int r0, int T,
                                             size_t ld, int vec)
{
    constexpr int CH = HS / 8, LD = fa_cfg<HS>::LD;
    for (int q = threadIdx.x; q < FA_ROWS * CH; q += FA_THREADS) {
        int rr = q / CH, c = (q % CH) * 8, r = r0 + rr;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < T) {
            const zr_bf16_t *s = src + (size_t)r * ld + c;
            if (vec) {
                v = *reinterpret_cast<const uint4 *>(s);
            } else {
                v.x = s[0] | (unsigned int)s[1] << 16, v.y = s[2] | (unsigned int)s[3] << 16;
                v.z = s[4] | (unsigned int)s[5] << 16, v.w = s[6] | (unsigned int)s[7] << 16;
            }
        }
        *reinterpret_cast<uint4 *>(dst + rr * LD + c) = v;
    }
}

/*
 * Tiles d0, d1 = rows r0.. of s0 and s1 (row strides ld0, ld1): with DB and
 * 16-byte rows by cp.async, committed as one batch; else loaded.
 */
template <int HS, bool DB>
__device__ __forceinline__ void fa_fetch(fa_bf16 *d0, fa_bf16 *d1, const zr_bf16_t *s0,
                                         const zr_bf16_t *s1, size_t ld0, size_t ld1, int r0, int T,
                                         int vec)
{
    if (DB && vec) {
        fa_issue_tile<HS>(d0, s0, r0, T, ld0);
        fa_issue_tile<HS>(d1, s1, r0, T, ld1);
    } else {
        fa_load_tile<HS>(d0, s0, r0, T, ld0, vec);
        fa_load_tile<HS>(d1, s1, r0, T, ld1, vec);
    }
    if (DB) {
        __pipeline_commit();
    }
}

/* x[t] = v[r0 + t] (0 past T) for t < 64, times mul. */
__device__ __forceinline__ void fa_load_rows(float *x, const float *v, int r0, int T, float mul)
{
    for (int t = threadIdx.x; t < FA_ROWS; t += FA_THREADS) {
        x[t] = r0 + t < T ? v[r0 + t] * mul : 0.0f;
    }
}

/* The warp's 16 x HS fragments a[] from rows 16 w.. of a bf16 tile. */
template <int HS> __device__ __forceinline__ void fa_rows_a(frag_a *a, const fa_bf16 *tile, int w)
{
    ZR_UNROLL
    for (int d = 0; d < fa_cfg<HS>::NF; d++) {
        wmma::load_matrix_sync(a[d], tile + 16 * w * fa_cfg<HS>::LD + 16 * d, fa_cfg<HS>::LD);
    }
}

/* f[0..16)[16 kf..) = a (16 x HS) times rows 16 kf.. of tile, transposed, for f0 <= kf < nf. */
template <int HS>
__device__ __forceinline__ void fa_scores(float *f, const frag_a *a, const fa_bf16 *tile, int f0,
                                          int nf)
{
    for (int kf = f0; kf < nf; kf++) {
        frag_c s;
        wmma::fill_fragment(s, 0.0f);
        ZR_UNROLL
        for (int d = 0; d < fa_cfg<HS>::NF; d++) {
            frag_bc b;
            wmma::load_matrix_sync(b, tile + 16 * kf * fa_cfg<HS>::LD + 16 * d, fa_cfg<HS>::LD);
            wmma::mma_sync(s, a[d], b, s);
        }
        wmma::store_matrix_sync(f + 16 * kf, s, FA_SW, wmma::mem_row_major);
    }
}

/* acc[n] += columns 16 f0..16 nf of p (bf16, stride FA_PW) times those rows of tile. */
template <int HS>
__device__ __forceinline__ void fa_accum(frag_c *acc, const fa_bf16 *p, const fa_bf16 *tile, int f0,
                                         int nf)
{
    for (int kf = f0; kf < nf; kf++) {
        frag_a a;
        wmma::load_matrix_sync(a, p + 16 * kf, FA_PW);
        ZR_UNROLL
        for (int n = 0; n < fa_cfg<HS>::NF; n++) {
            frag_br b;
            wmma::load_matrix_sync(b, tile + 16 * kf * fa_cfg<HS>::LD + 16 * n, fa_cfg<HS>::LD);
            wmma::mma_sync(acc[n], a, b, acc[n]);
        }
    }
}

/*
 * Multiply row r of the warp's accumulators by this lane pair's v (lanes 2r
 * and 2r+1 pass the same v): a 16 x 16 tile of row scales in f, loaded as an
 * accumulator, multiplies element by element (both fragments have the
 * accumulator's layout, whatever it is).
 */
template <int NF> __device__ __forceinline__ void fa_scale_rows(frag_c *acc, float *f, float v)
{
    const int lane = threadIdx.x % 32, r = lane / 2, h = lane % 2;
    __syncwarp();
    ZR_UNROLL
    for (int c = 0; c < 8; c++) {
        f[r * 16 + h * 8 + c] = v;
    }
    __syncwarp();
    frag_c sc;
    wmma::load_matrix_sync(sc, f, 16, wmma::mem_row_major);
    ZR_UNROLL
    for (int n = 0; n < NF; n++) {
        ZR_UNROLL
        for (int e = 0; e < sc.num_elements; e++) {
            acc[n].x[e] *= sc.x[e];
        }
    }
}

/* Row r (this lane pair's) of the warp's accumulators, times mul, into dst (HS bf16) when r < T. */
template <int HS>
__device__ __forceinline__ void fa_store_rows(zr_bf16_t *dst, frag_c *acc, float *f, bool live,
                                              float mul, int vec)
{
    constexpr int OW = fa_cfg<HS>::OW;
    const int lane = threadIdx.x % 32, r = lane / 2, h = lane % 2;
    __syncwarp();
    ZR_UNROLL
    for (int n = 0; n < fa_cfg<HS>::NF; n++) {
        wmma::store_matrix_sync(f + 16 * n, acc[n], OW, wmma::mem_row_major);
    }
    __syncwarp();
    if (live) {
        ZR_UNROLL
        for (int c = h * HS / 2; c < (h + 1) * HS / 2; c += 8) {
            float v[8];
            ZR_UNROLL
            for (int e = 0; e < 8; e++) {
                v[e] = f[r * OW + c + e] * mul;
            }
            store8(dst + c, 8, vec != 0, v);
        }
    }
}

/*
 * Where lane 2r + h (row r, columns 32 h..32 h + 31) starts its walk over
 * the columns: at r + 16 h, so that with the row stride FA_SW = 72 (8 banks
 * on) the 32 lanes read 32 different banks at every step (9 r + 16 h + step
 * is distinct mod 32 for r < 16, h < 2).
 */
__device__ __forceinline__ int fa_rot(int lane)
{
    return lane / 2 + 16 * (lane % 2);
}

/*
 * The online softmax of one key tile on the warp's scores f (16 x 16 nkf):
 * lanes 2r and 2r+1 take row r (query i), 32 columns each; key k0 + c is
 * seen when c < 16 nkf, k0 + c <= i and k0 + c < T. Writes P (bf16) to p,
 * updates the row's running maximum m and sum l (base 2), returns the
 * factor the row's output must be multiplied by.
 */
__device__ __forceinline__ float fa_softmax(const float *f, fa_bf16 *p, int i, int k0, int nkf,
                                            int T, float sl2, float *m, float *l)
{
    const int lane = threadIdx.x % 32, r = lane / 2, c0 = (lane % 2) * 32, rot = fa_rot(lane);
    const int cend = min(16 * nkf, min(i + 1, T) - k0); /* columns seen: c < cend */
    float mt = -INFINITY;
    for (int it = 0; it < 32; it++) {
        const int c = c0 + ((it + rot) & 31);
        mt = c < cend ? fmaxf(mt, f[r * FA_SW + c] * sl2) : mt;
    }
    mt = fmaxf(mt, __shfl_xor_sync(ZR_FULL_MASK, mt, 1));
    const float mn = fmaxf(*m, mt); /* finite: key k0 <= i is seen on every tile */
    const float alpha = exp2f(*m - mn);
    float ls = 0.0f;
    for (int it = 0; it < 32; it++) {
        const int c = c0 + ((it + rot) & 31);
        float pv = c < cend ? exp2f(f[r * FA_SW + c] * sl2 - mn) : 0.0f;
        ls += pv;
        p[r * FA_PW + c] = __float2bfloat16(pv);
    }
    ls += __shfl_xor_sync(ZR_FULL_MASK, ls, 1);
    *l = *l * alpha + ls;
    *m = mn;
    return alpha;
}

/* Head h of batch b reading key and value head kh: its first q, k and v elements. */
struct fa_head {
    const zr_bf16_t *q, *k, *v;
    __device__ fa_head(zr_op_k_qkv x, int b, int h, int kh, int T, int hs)
    {
        q = static_cast<const zr_bf16_t *>(x.q) + (size_t)b * T * (size_t)x.lq + (size_t)h * hs;
        k = static_cast<const zr_bf16_t *>(x.k) + (size_t)b * T * (size_t)x.lkv + (size_t)kh * hs;
        v = static_cast<const zr_bf16_t *>(x.v) + (size_t)b * T * (size_t)x.lkv + (size_t)kh * hs;
    }
};

template <int HS, bool DB, bool SKIP>
__global__ void __launch_bounds__(FA_THREADS, 1)
    flash_fwd(zr_bf16_t *out, float *lse, zr_op_k_qkv x, int T, int C, int NH, float scale, int vec)
{
    typedef fa_cfg<HS, DB> cf;
    ZR_SHARED_DYNAMIC(char, smraw);
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    fa_smem<HS, DB> sm(smraw, w);
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * FA_ROWS; /* the longest blocks first */
    const fa_head hd(x, b, h, h / x.group, T, HS);
    const size_t ld = x.lkv;
    frag_a qa[cf::NF];
    frag_c o[cf::NF];
    fa_load_tile<HS>(sm.t0, hd.q, q0, T, x.lq, vec);
    __syncthreads();
    fa_rows_a<HS>(qa, sm.t0, w);
    ZR_UNROLL
    for (int n = 0; n < cf::NF; n++) {
        wmma::fill_fragment(o[n], 0.0f);
    }
    const int i = q0 + 16 * w + lane / 2; /* this lane pair's query row */
    const float sl2 = scale * FA_LOG2E;
    float m = -INFINITY, l = 0.0f;
    if (DB) {
        __syncthreads(); /* Q is read: buffer 0 takes the first key tile */
        fa_fetch<HS, DB>(sm.t0, sm.t1, hd.k, hd.v, ld, ld, 0, T, vec);
    }
    for (int k0 = 0, bf = 0; k0 <= q0; k0 += FA_ROWS, bf ^= DB ? 1 : 0) {
        if (DB) {
            __pipeline_wait_prior(0);
            __syncthreads(); /* tile bf is here; the other buffer is no longer read */
            if (k0 + FA_ROWS <= q0) {
                fa_fetch<HS, DB>(sm.tile(bf ^ 1, 0), sm.tile(bf ^ 1, 1), hd.k, hd.v, ld, ld,
                                 k0 + FA_ROWS, T, vec);
            }
        } else {
            __syncthreads(); /* the previous tiles (and Q) are no longer read */
            fa_fetch<HS, DB>(sm.t0, sm.t1, hd.k, hd.v, ld, ld, k0, T, vec);
            __syncthreads();
        }
        const int nkf = k0 == q0 ? w + 1 : 4; /* on the diagonal: keys up to the warp's last row */
        fa_scores<HS>(sm.f, qa, sm.tile(bf, 0), 0, nkf);
        __syncwarp();
        float alpha = fa_softmax(sm.f, sm.p, i, k0, nkf, T, sl2, &m, &l);
        /* SKIP: not when every row's maximum stayed (alpha 1: the same bits either way) */
        if (!SKIP || __ballot_sync(ZR_FULL_MASK, alpha != 1.0f) != 0) {
            fa_scale_rows<cf::NF>(o, sm.f + 16 * FA_SW, alpha);
        }
        fa_accum<HS>(o, sm.p, sm.tile(bf, 1), 0, nkf);
    }
    fa_scale_rows<cf::NF>(o, sm.f + 16 * FA_SW, 1.0f / l);
    fa_store_rows<HS>(out + ((size_t)b * T + min(i, T - 1)) * C + (size_t)h * HS, o, sm.f, i < T,
                      1.0f, vec);
    if (i < T && lane % 2 == 0) {
        lse[(size_t)bh * T + i] = (m + log2f(l)) * FA_LN2;
    }
}

/* delta[bh, t] = dO . O of row t of head bh: HS/8 lanes a row, 8 elements each. */
template <int HS>
__global__ void __launch_bounds__(FA_THREADS, 1)
    fa_delta(float *delta, const zr_bf16_t *dout, const zr_bf16_t *o, int T, int C, int NH,
             int rows, int vec)
{
    constexpr int G = HS / 8;
    const int first = blockIdx.x * (FA_THREADS / G);
    const int row = first + threadIdx.x / G, g = threadIdx.x % G;
    if (first + (int)(threadIdx.x / 32) * (32 / G) >= rows) {
        return; /* the whole warp (its first row is past the end; no barrier here) */
    }
    const int r = min(row, rows - 1), bh = r / T, t = r % T, b = bh / NH, h = bh % NH;
    const size_t at = ((size_t)b * T + t) * C + (size_t)h * HS + 8 * g;
    float x[8], y[8], acc = 0.0f;
    load8(dout + at, 8, vec != 0, x);
    load8(o + at, 8, vec != 0, y);
    ZR_UNROLL
    for (int e = 0; e < 8; e++) {
        acc += x[e] * y[e];
    }
    acc = group_sum<G>(acc);
    if (row < rows && g == 0) {
        delta[r] = acc;
    }
}

/*
 * dS (or P) of one tile from the warp's two fp32 tiles (f: scores, f +
 * 16 FA_SW: dP), lanes 2r and 2r+1 on row r, 32 columns each. Row r is key
 * kj (dkv: columns are queries i0 + c, seen when kj <= i0 + c < T) or query
 * kj (dq: columns are keys i0 + c, seen when i0 + c <= kj and < T); L, D per
 * column (dkv) or per row (dq, Lr and Dr). Writes dS, and P when pb.
 */
template <bool KEYS>
__device__ __forceinline__ void fa_dscores(const float *f, fa_bf16 *dsb, fa_bf16 *pb, int kj,
                                           int i0, int T, float sl2, const float *Ls,
                                           const float *Ds, float Lr, float Dr)
{
    const int lane = threadIdx.x % 32, r = lane / 2, c0 = (lane % 2) * 32, rot = fa_rot(lane);
    ZR_UNROLL
    for (int it = 0; it < 32; it++) {
        const int c = c0 + ((it + rot) & 31), x = i0 + c;
        const bool seen = KEYS ? kj <= x && x < T : x <= kj && x < T;
        const float L = KEYS ? Ls[c] : Lr, D = KEYS ? Ds[c] : Dr;
        float p = seen ? exp2f(f[r * FA_SW + c] * sl2 - L) : 0.0f;
        float ds = seen ? p * (f[16 * FA_SW + r * FA_SW + c] - D) : 0.0f;
        dsb[r * FA_PW + c] = __float2bfloat16(ds);
        if (pb != nullptr) {
            pb[r * FA_PW + c] = __float2bfloat16(p);
        }
    }
}

template <int HS, bool DB, bool GQA>
__global__ void __launch_bounds__(FA_THREADS, 1)
    flash_bwd_dkv(zr_op_k_qkv x, const zr_bf16_t *dout, const float *lse, const float *delta, int T,
                  int C, int NH, float scale, int vec)
{
    typedef fa_cfg<HS, DB> cf;
    ZR_SHARED_DYNAMIC(char, smraw);
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    fa_smem<HS, DB> sm(smraw, w);
    const int group = GQA ? x.group : 1, NKV = NH / group;
    const int b = blockIdx.y / NKV, kh = blockIdx.y % NKV;
    const int k0 = blockIdx.x * FA_ROWS;
    const fa_head kv(x, b, kh * group, kh, T, HS);
    const size_t ld = x.lq;
    frag_a ka[cf::NF], va[cf::NF];
    frag_c dk[cf::NF], dv[cf::NF];
    fa_load_tile<HS>(sm.t0, kv.k, k0, T, x.lkv, vec);
    fa_load_tile<HS>(sm.t1, kv.v, k0, T, x.lkv, vec);
    __syncthreads();
    fa_rows_a<HS>(ka, sm.t0, w);
    fa_rows_a<HS>(va, sm.t1, w);
    ZR_UNROLL
    for (int n = 0; n < cf::NF; n++) {
        wmma::fill_fragment(dk[n], 0.0f);
        wmma::fill_fragment(dv[n], 0.0f);
    }
    const int j = k0 + 16 * w + lane / 2; /* this lane pair's key row */
    const float sl2 = scale * FA_LOG2E;
    /* the group's query heads in order, each from the block's first key on */
    for (int h = kh * group, it = 0; it < group; h++, it++) {
        const int bh = b * NH + h;
        const zr_bf16_t *base = fa_head(x, b, h, kh, T, HS).q;
        const zr_bf16_t *dbase = dout + (size_t)b * T * C + (size_t)h * HS;
        if (DB) {
            __syncthreads(); /* K, V or the last head's tiles are read: buffer 0 takes the next */
            fa_fetch<HS, DB>(sm.t0, sm.t1, base, dbase, ld, (size_t)C, k0, T, vec);
            fa_load_rows(sm.Ls, lse + (size_t)bh * T, k0, T, FA_LOG2E);
            fa_load_rows(sm.Ds, delta + (size_t)bh * T, k0, T, 1.0f);
        }
        for (int i0 = k0, bf = 0; i0 < T; i0 += FA_ROWS, bf ^= DB ? 1 : 0) {
            if (DB) {
                __pipeline_wait_prior(0);
                __syncthreads(); /* tile bf is here; the other buffer is no longer read */
                if (i0 + FA_ROWS < T) {
                    const int n0 = i0 + FA_ROWS, nb = bf ^ 1;
                    fa_fetch<HS, DB>(sm.tile(nb, 0), sm.tile(nb, 1), base, dbase, ld, (size_t)C, n0,
                                     T, vec);
                    fa_load_rows(sm.rows(nb, 0), lse + (size_t)bh * T, n0, T, FA_LOG2E);
                    fa_load_rows(sm.rows(nb, 1), delta + (size_t)bh * T, n0, T, 1.0f);
                }
            } else {
                __syncthreads(); /* the previous tiles (and K, V) are no longer read */
                fa_fetch<HS, DB>(sm.t0, sm.t1, base, dbase, ld, (size_t)C, i0, T, vec);
                fa_load_rows(sm.Ls, lse + (size_t)bh * T, i0, T, FA_LOG2E);
                fa_load_rows(sm.Ds, delta + (size_t)bh * T, i0, T, 1.0f);
                __syncthreads();
            }
            /* query parts at or after the warp's first key, and before T (warp-uniform) */
            const int f0 = i0 == k0 ? w : 0, nf = min(4, (T - i0 + 15) / 16);
            if (f0 >= nf) {
                continue;
            }
            const fa_bf16 *qt = sm.tile(bf, 0), *gt = sm.tile(bf, 1);
            fa_scores<HS>(sm.f, ka, qt, f0, nf);
            fa_scores<HS>(sm.f + 16 * FA_SW, va, gt, f0, nf);
            __syncwarp();
            fa_dscores<true>(sm.f, sm.p + 16 * FA_PW, sm.p, j, i0, T, sl2, sm.rows(bf, 0),
                             sm.rows(bf, 1), 0, 0);
            __syncwarp();
            fa_accum<HS>(dv, sm.p, gt, f0, nf);
            fa_accum<HS>(dk, sm.p + 16 * FA_PW, qt, f0, nf);
            __syncwarp(); /* p and f are read before the next tile writes them */
        }
    }
    const size_t at = ((size_t)b * T + min(j, T - 1)) * (size_t)x.lkv + (size_t)kh * HS;
    fa_store_rows<HS>(static_cast<zr_bf16_t *>(x.dk) + at, dk, sm.f, j < T, scale, vec);
    fa_store_rows<HS>(static_cast<zr_bf16_t *>(x.dv) + at, dv, sm.f, j < T, 1.0f, vec);
}

template <int HS, bool DB>
__global__ void __launch_bounds__(FA_THREADS, 1)
    flash_bwd_dq(zr_op_k_qkv x, const zr_bf16_t *dout, const float *lse, const float *delta, int T,
                 int C, int NH, float scale, int vec)
{
    typedef fa_cfg<HS, DB> cf;
    ZR_SHARED_DYNAMIC(char, smraw);
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    fa_smem<HS, DB> sm(smraw, w);
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * FA_ROWS; /* the longest blocks first */
    const fa_head hd(x, b, h, h / x.group, T, HS);
    const size_t ld = x.lkv;
    frag_a qa[cf::NF], ga[cf::NF];
    frag_c dq[cf::NF];
    fa_load_tile<HS>(sm.t0, hd.q, q0, T, x.lq, vec);
    fa_load_tile<HS>(sm.t1, dout + (size_t)b * T * C + (size_t)h * HS, q0, T, (size_t)C, vec);
    __syncthreads();
    fa_rows_a<HS>(qa, sm.t0, w);
    fa_rows_a<HS>(ga, sm.t1, w);
    ZR_UNROLL
    for (int n = 0; n < cf::NF; n++) {
        wmma::fill_fragment(dq[n], 0.0f);
    }
    const int i = q0 + 16 * w + lane / 2, ri = min(i, T - 1); /* this lane pair's query row */
    const float sl2 = scale * FA_LOG2E;
    const float Lr = lse[(size_t)bh * T + ri] * FA_LOG2E, Dr = delta[(size_t)bh * T + ri];
    if (DB) {
        __syncthreads(); /* Q, dO are read: buffer 0 takes the first key tile */
        fa_fetch<HS, DB>(sm.t0, sm.t1, hd.k, hd.v, ld, ld, 0, T, vec);
    }
    for (int k0 = 0, bf = 0; k0 <= q0; k0 += FA_ROWS, bf ^= DB ? 1 : 0) {
        if (DB) {
            __pipeline_wait_prior(0);
            __syncthreads(); /* tile bf is here; the other buffer is no longer read */
            if (k0 + FA_ROWS <= q0) {
                fa_fetch<HS, DB>(sm.tile(bf ^ 1, 0), sm.tile(bf ^ 1, 1), hd.k, hd.v, ld, ld,
                                 k0 + FA_ROWS, T, vec);
            }
        } else {
            __syncthreads(); /* the previous tiles (and Q, dO) are no longer read */
            fa_fetch<HS, DB>(sm.t0, sm.t1, hd.k, hd.v, ld, ld, k0, T, vec);
            __syncthreads();
        }
        const int nkf = k0 == q0 ? w + 1 : 4; /* on the diagonal: keys up to the warp's last row */
        fa_scores<HS>(sm.f, qa, sm.tile(bf, 0), 0, nkf);
        fa_scores<HS>(sm.f + 16 * FA_SW, ga, sm.tile(bf, 1), 0, nkf);
        __syncwarp();
        fa_dscores<false>(sm.f, sm.p, nullptr, i, k0, T, sl2, nullptr, nullptr, Lr, Dr);
        __syncwarp();
        fa_accum<HS>(dq, sm.p, sm.tile(bf, 0), 0, nkf);
        __syncwarp();
    }
    zr_bf16_t *dst =
        static_cast<zr_bf16_t *>(x.dq) + ((size_t)b * T + ri) * (size_t)x.lq + (size_t)h * HS;
    fa_store_rows<HS>(dst, dq, sm.f, i < T, scale, vec);
}

/* ---- launchers -------------------------------------------------------------------------- */

template <typename K> static cudaError_t fa_shmem(K kernel, size_t bytes)
{
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

template <int HS, bool DB, bool SKIP>
static cudaError_t fa_fwd(const zr_op_k_att *a, cudaStream_t s)
{
    const size_t shm = fa_cfg<HS, DB>::SHMEM;
    cudaError_t err = fa_shmem(flash_fwd<HS, DB, SKIP>, shm);
    if (err != cudaSuccess) {
        return err;
    }
    dim3 grid((unsigned int)((a->T + FA_ROWS - 1) / FA_ROWS), (unsigned int)(a->B * a->NH));
    ZR_LAUNCH((flash_fwd<HS, DB, SKIP>), grid, FA_THREADS, shm, s, sptr<zr_bf16_t>(a->out), a->lse,
              a->x, a->T, a->C, a->NH, a->scale, a->vec);
    return cudaGetLastError();
}

/* a->part: 0 all three kernels, else only fa_delta (1), flash_bwd_dkv (2) or flash_bwd_dq (3) */
template <int HS, bool DB> static cudaError_t fa_bwd(const zr_op_k_att *a, cudaStream_t s)
{
    const size_t shm = fa_cfg<HS, DB>::SHMEM;
    cudaError_t err = fa_shmem(flash_bwd_dkv<HS, DB, false>, shm);
    err = err == cudaSuccess && HS < 128 ? fa_shmem(flash_bwd_dkv<HS, DB, (HS < 128)>, shm) : err;
    err = err == cudaSuccess ? fa_shmem(flash_bwd_dq<HS, DB>, shm) : err;
    if (err != cudaSuccess) {
        return err;
    }
    const int rows = a->B * a->NH * a->T, per = FA_THREADS / (HS / 8);
    if (a->part == 0 || a->part == 1) {
        ZR_LAUNCH((fa_delta<HS>), (unsigned int)((rows + per - 1) / per), FA_THREADS, 0, s,
                  a->delta, sptr<zr_bf16_t>(a->dout), sptr<zr_bf16_t>(a->o), a->T, a->C, a->NH,
                  rows, a->vec);
        if ((err = cudaGetLastError()) != cudaSuccess) {
            return err;
        }
    }
    const float *delta = a->delta;
    dim3 grid((unsigned int)((a->T + FA_ROWS - 1) / FA_ROWS), (unsigned int)(a->B * a->NH));
    if (a->part == 0 || a->part == 2) {
        dim3 kvgrid(grid.x, (unsigned int)(a->B * (a->NH / a->x.group)));
        if (a->x.group > 1 && HS < 128) { /* 128: dK, dV and the group's walk would spill */
            ZR_LAUNCH((flash_bwd_dkv<HS, DB, (HS < 128)>), kvgrid, FA_THREADS, shm, s, a->x,
                      sptr<zr_bf16_t>(a->dout), a->lse, delta, a->T, a->C, a->NH, a->scale, a->vec);
        } else {
            ZR_LAUNCH((flash_bwd_dkv<HS, DB, false>), kvgrid, FA_THREADS, shm, s, a->x,
                      sptr<zr_bf16_t>(a->dout), a->lse, delta, a->T, a->C, a->NH, a->scale, a->vec);
        }
        if ((err = cudaGetLastError()) != cudaSuccess) {
            return err;
        }
    }
    if (a->part == 0 || a->part == 3) {
        ZR_LAUNCH((flash_bwd_dq<HS, DB>), grid, FA_THREADS, shm, s, a->x, sptr<zr_bf16_t>(a->dout),
                  a->lse, delta, a->T, a->C, a->NH, a->scale, a->vec);
    }
    return cudaGetLastError();
}

/*
 * a->variant: 0 one buffer per operand (round 1), 1 double-buffered
 * (cp.async), 2 as 0 with the forward's rescale of O skipped on the tiles
 * where no row's maximum moved (the backward is 0's)
 */
template <int HS> static cudaError_t fa_fwd_v(const zr_op_k_att *a, cudaStream_t s)
{
    return a->variant == 1   ? fa_fwd<HS, true, false>(a, s)
           : a->variant == 2 ? fa_fwd<HS, false, true>(a, s)
                             : fa_fwd<HS, false, false>(a, s);
}

template <int HS> static cudaError_t fa_bwd_v(const zr_op_k_att *a, cudaStream_t s)
{
    return a->variant == 1 ? fa_bwd<HS, true>(a, s) : fa_bwd<HS, false>(a, s);
}

extern "C" cudaError_t zr_op_k_launch_flash_fwd(const zr_op_k_att *a, cudaStream_t s)
{
    int hs = a->C / a->NH;
    return hs == 32 ? fa_fwd_v<32>(a, s) : hs == 64 ? fa_fwd_v<64>(a, s) : fa_fwd_v<128>(a, s);
}

extern "C" cudaError_t zr_op_k_launch_flash_bwd(const zr_op_k_att *a, cudaStream_t s)
{
    int hs = a->C / a->NH;
    return hs == 32 ? fa_bwd_v<32>(a, s) : hs == 64 ? fa_bwd_v<64>(a, s) : fa_bwd_v<128>(a, s);
}
