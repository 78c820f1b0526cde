/*
 * attention_cuda.cu - fused causal self-attention, forward and backward, in
 * the manner of FlashAttention-2 (Dao 2023): the T x T scores never reach
 * device memory. qkv is [B, T, 3C] (q, k, v of head h at columns h*hs,
 * C + h*hs, 2C + h*hs), the output [B, T, C].
 *
 * Work split: a block of 128 threads takes R = 128/G query (or key) rows of
 * one (batch, head); each row belongs to a group of G lanes of one warp,
 * lane g holding head dimensions d*G + g (d < 16), so a dot product is 16
 * multiply-adds per lane and a log2(G) xor butterfly, and the lanes of a
 * warp read consecutive shared-memory words. G is the smallest power of two
 * with 16 G >= hs (hs <= 256).
 *
 *   forward   for key tiles of BK rows up to the block's last query (causal:
 *             later tiles are never loaded), K and V go to shared memory;
 *             each row computes its BK scores, then rescales its running
 *             output and sum once per tile (online softmax) and adds P V.
 *             It writes O / l and the row's L = m + log(l), in fp32, which
 *             is all the backward needs to recompute the probabilities.
 *   backward  D_i = dO_i . O_i (one pass); then two passes, each writing
 *             its gradient once, so no atomics and the same bits every run:
 *             dK, dV over key blocks (each key row walks the query tiles at
 *             or after it: P = exp(s - L), dV += P dO, dS = P (dO.V - D),
 *             dK += dS Q), and dQ over query blocks (dQ += dS K), both
 *             recomputing the scores tile by tile.
 *
 * Masked scores are -inf before the maximum and contribute exp(-inf) = 0;
 * every row's first tile holds key 0, so its running maximum is finite from
 * there on. Rows past T compute on row T-1's data and write nothing; tiles
 * are zero-filled past T and past hs, so nothing reads shared memory that
 * was not written. All arithmetic is fp32; storage is fp32 or bf16.
 *
 * Since issue 42 these kernels run for fp32 storage and for head sizes other
 * than 32, 64 and 128; bf16 with those head sizes runs on tensor cores
 * (attention_flash.cu), which the tests check against these.
 *
 * Grouped key and value heads (issue 43: Llama, Mistral, Qwen2): the
 * operands are where zr_op_k_qkv says (GPT-2: columns of qkv; GQA: q, k, v
 * of their own, NH and NKV heads a row), query head h reading key and value
 * head h / group. att_bwd_kv then takes the R key rows of one (batch, key
 * head) and walks the query tiles of the group's query heads one head after
 * another, so dK and dV still have one writer and one order of additions.
 */
#include "ops_cuda_impl.h"
#include "ops_cuda_vec.h"

#define ATT_THREADS 128
#define ATT_D       16 /* head dimensions per lane */

/* key (or query) tile rows: 32, or 16 for the widest heads (shared memory) */
template <int G> struct att_tile {
    static constexpr int R = ATT_THREADS / G;
    static constexpr int BK = G == 16 ? 16 : 32;
    static constexpr int HSP = G * ATT_D;
};

/* t[jj][0..HSP) = rows r0 + jj of src (hs dims, row stride ld) in fp32; 0 past T and hs. */
template <typename S, int BK, int HSP>
__device__ __forceinline__ void load_tile(float *t, const S *src, int r0, int T, int hs, size_t ld,
                                          int vec)
{
    constexpr int CH = HSP / 8;
    for (int q = threadIdx.x; q < BK * CH; q += ATT_THREADS) {
        int jj = q / CH, c = (q % CH) * 8, r = r0 + jj;
        float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (r < T && c < hs) {
            load8(src + (size_t)r * ld + c, min(8, hs - c), vec, v);
        }
        float4 *dst = reinterpret_cast<float4 *>(t + jj * HSP + c);
        dst[0] = make_float4(v[0], v[1], v[2], v[3]);
        dst[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
}

/* x[d] = row r of src (hs dims), lane's dimensions, 0 past hs. */
template <typename S, int G>
__device__ __forceinline__ void load_row(float x[ATT_D], const S *src, int lane, int hs)
{
    ZR_UNROLL
    for (int d = 0; d < ATT_D; d++) {
        int dim = d * G + lane;
        x[d] = dim < hs ? ld1(src + dim) : 0.0f;
    }
}

template <typename S, int G>
__device__ __forceinline__ void store_row(S *dst, const float x[ATT_D], float mul, int lane, int hs)
{
    ZR_UNROLL
    for (int d = 0; d < ATT_D; d++) {
        int dim = d * G + lane;
        if (dim < hs) {
            st1(dst + dim, x[d] * mul);
        }
    }
}

/* The lane's part of x . t[jj], summed over the row's G lanes. */
template <int G>
__device__ __forceinline__ float row_dot(const float x[ATT_D], const float *t, int lane)
{
    float acc = 0.0f;
    ZR_UNROLL
    for (int d = 0; d < ATT_D; d++) {
        acc += x[d] * t[d * G + lane];
    }
    return group_sum<G>(acc);
}

/*
 * The rows of the calling thread's warp: the first, and the last one below
 * T (-1 when the warp has no row below T). Work a whole warp can
 * skip is skipped by a warp-uniform branch, so the lanes of a shuffle always
 * arrive together: keys after the warp's last query row, queries before its
 * first key row, rows past T.
 */
template <int G>
__device__ __forceinline__ void warp_rows(int first_of_block, int T, int *first, int *last)
{
    *first = first_of_block + (int)(threadIdx.x / 32) * (32 / G);
    *last = *first >= T ? -1 : min(*first + 32 / G - 1, T - 1);
}

/* Head h of batch b reading key and value head kh: its first q element, its k and v offset. */
template <typename S> struct att_head {
    const S *q;
    size_t kv;
    __device__ att_head(zr_op_k_qkv x, int b, int h, int kh, int T, int hs)
    {
        q = static_cast<const S *>(x.q) + (size_t)b * T * (size_t)x.lq + (size_t)h * hs;
        kv = (size_t)b * T * (size_t)x.lkv + (size_t)kh * hs;
    }
};

template <typename S> __device__ __forceinline__ const S *kv_at(const void *p, size_t at)
{
    return static_cast<const S *>(p) + at;
}

template <typename S, int G>
__global__ void __launch_bounds__(ATT_THREADS)
    att_fwd(S *out, float *lse, zr_op_k_qkv x, int T, int C, int NH, float scale, int vec)
{
    constexpr int R = att_tile<G>::R, BK = att_tile<G>::BK, HSP = att_tile<G>::HSP;
    ZR_SHARED_DYNAMIC(float, sm);
    float *ks = sm, *vs = sm + BK * HSP;
    const int hs = C / NH, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const att_head<S> hd(x, b, h, h / x.group, T, hs);
    const int q0 = blockIdx.x * R, row = q0 + threadIdx.x / G, lane = threadIdx.x % G;
    const int r = min(row, T - 1);
    float q[ATT_D], o[ATT_D];
    load_row<S, G>(q, hd.q + (size_t)r * (size_t)x.lq, lane, hs);
    ZR_UNROLL
    for (int d = 0; d < ATT_D; d++) {
        o[d] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    int wfirst, wlast;
    warp_rows<G>(q0, T, &wfirst, &wlast);
    const int kend = min(q0 + R, T);
    for (int k0 = 0; k0 < kend; k0 += BK) {
        __syncthreads(); /* the previous tile is no longer read */
        load_tile<S, BK, HSP>(ks, kv_at<S>(x.k, hd.kv), k0, T, hs, x.lkv, vec);
        load_tile<S, BK, HSP>(vs, kv_at<S>(x.v, hd.kv), k0, T, hs, x.lkv, vec);
        __syncthreads();
        if (k0 > wlast) {
            continue; /* the whole warp: no row of it sees these keys */
        }
        const int nk = min(BK, wlast - k0 + 1); /* keys some row of the warp sees */
        float s[BK], mt = -INFINITY;
        ZR_UNROLL
        for (int jj = 0; jj < BK; jj++) {
            s[jj] = -INFINITY;
            if (jj < nk) {
                float dot = row_dot<G>(q, ks + jj * HSP, lane);
                s[jj] = k0 + jj <= r ? dot * scale : -INFINITY;
            }
            mt = fmaxf(mt, s[jj]);
        }
        float mn = fmaxf(m, mt);
        float alpha = expf(m - mn); /* 0 on the first tile (m = -inf, mn finite) */
        l *= alpha;
        ZR_UNROLL
        for (int d = 0; d < ATT_D; d++) {
            o[d] *= alpha;
        }
        ZR_UNROLL
        for (int jj = 0; jj < BK; jj++) {
            if (jj < nk) {
                float p = expf(s[jj] - mn);
                l += p;
                ZR_UNROLL
                for (int d = 0; d < ATT_D; d++) {
                    o[d] += p * vs[jj * HSP + d * G + lane];
                }
            }
        }
        m = mn;
    }
    if (row < T) {
        store_row<S, G>(out + ((size_t)b * T + row) * C + (size_t)h * hs, o, 1.0f / l, lane, hs);
        if (lane == 0) {
            lse[(size_t)bh * T + row] = m + logf(l);
        }
    }
}

/* delta[b, h, i] = dO_i . O_i over the head's dimensions. */
template <typename S, int G>
__global__ void __launch_bounds__(ATT_THREADS)
    att_delta(float *delta, const S *dout, const S *o, int T, int C, int NH)
{
    constexpr int R = att_tile<G>::R;
    const int hs = C / NH, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int row = blockIdx.x * R + threadIdx.x / G, lane = threadIdx.x % G;
    int wfirst, wlast;
    warp_rows<G>(blockIdx.x * R, T, &wfirst, &wlast);
    if (wfirst >= T) {
        return; /* the whole warp (no barrier in this kernel) */
    }
    const size_t at = ((size_t)b * T + min(row, T - 1)) * C + (size_t)h * hs;
    float x[ATT_D], y[ATT_D];
    load_row<S, G>(x, dout + at, lane, hs);
    load_row<S, G>(y, o + at, lane, hs);
    float acc = 0.0f;
    ZR_UNROLL
    for (int d = 0; d < ATT_D; d++) {
        acc += x[d] * y[d];
    }
    acc = group_sum<G>(acc);
    if (row < T && lane == 0) {
        delta[(size_t)bh * T + row] = acc;
    }
}

/*
 * dK and dV of R key rows: walk the query tiles from the block's first key
 * on. Four rows of registers per lane (k, v, dk, dv) and the tile's values
 * in flight need about 135 registers: the launch bound's "at least one
 * block per multiprocessor" lets ptxas use them instead of spilling to fit
 * a higher occupancy it was not asked for.
 */
template <typename S, int G>
__global__ void __launch_bounds__(ATT_THREADS, 1)
    att_bwd_kv(zr_op_k_qkv x, const S *dout, const float *lse, const float *delta, int T, int C,
               int NH, float scale, int vec)
{
    constexpr int R = att_tile<G>::R, BQ = att_tile<G>::BK, HSP = att_tile<G>::HSP;
    ZR_SHARED_DYNAMIC(float, sm);
    float *qs = sm, *dos = sm + BQ * HSP, *ls = dos + BQ * HSP, *ds = ls + BQ;
    const int hs = C / NH, NKV = NH / x.group, b = blockIdx.y / NKV, kh = blockIdx.y % NKV;
    const att_head<S> kv(x, b, kh * x.group, kh, T, hs);
    const int k0 = blockIdx.x * R, j = k0 + threadIdx.x / G, lane = threadIdx.x % G;
    const int rj = min(j, T - 1);
    float k[ATT_D], v[ATT_D], dk[ATT_D], dv[ATT_D];
    load_row<S, G>(k, kv_at<S>(x.k, kv.kv) + (size_t)rj * (size_t)x.lkv, lane, hs);
    load_row<S, G>(v, kv_at<S>(x.v, kv.kv) + (size_t)rj * (size_t)x.lkv, lane, hs);
    ZR_UNROLL
    for (int d = 0; d < ATT_D; d++) {
        dk[d] = dv[d] = 0.0f;
    }
    int wfirst, wlast;
    warp_rows<G>(k0, T, &wfirst, &wlast);
    /* the group's query heads in order, each from the block's first key on */
    for (int h = kh * x.group, it = 0; it < x.group; h++, it++) {
        const int bh = b * NH + h;
        const att_head<S> hd(x, b, h, kh, T, hs);
        const S *dbase = dout + (size_t)b * T * C + (size_t)h * hs;
        for (int i0 = k0; i0 < T; i0 += BQ) {
            __syncthreads();
            load_tile<S, BQ, HSP>(qs, hd.q, i0, T, hs, x.lq, vec);
            load_tile<S, BQ, HSP>(dos, dbase, i0, T, hs, (size_t)C, vec);
            for (int t = threadIdx.x; t < BQ; t += ATT_THREADS) {
                int i = i0 + t;
                ls[t] = i < T ? lse[(size_t)bh * T + i] : 0.0f;
                ds[t] = i < T ? delta[(size_t)bh * T + i] : 0.0f;
            }
            __syncthreads();
            /* warp-uniform bounds: queries from the warp's first key on, and below T */
            const int ii0 = wfirst >= T ? BQ : max(0, wfirst - i0), nq = min(BQ, T - i0);
            /* not unrolled: nothing in registers is indexed by ii, and unrolling spills */
            for (int ii = ii0; ii < nq; ii++) {
                int i = i0 + ii;
                const float *qi = qs + ii * HSP, *doi = dos + ii * HSP;
                float sc = row_dot<G>(k, qi, lane);
                float p = i >= j && i < T ? expf(sc * scale - ls[ii]) : 0.0f;
                float dp = row_dot<G>(v, doi, lane);
                float dsv = p * (dp - ds[ii]);
                ZR_UNROLL
                for (int d = 0; d < ATT_D; d++) {
                    dv[d] += p * doi[d * G + lane];
                    dk[d] += dsv * qi[d * G + lane];
                }
            }
        }
    }
    if (j < T) {
        const size_t at = ((size_t)b * T + j) * (size_t)x.lkv + (size_t)kh * hs;
        store_row<S, G>(static_cast<S *>(x.dk) + at, dk, scale, lane, hs);
        store_row<S, G>(static_cast<S *>(x.dv) + at, dv, 1.0f, lane, hs);
    }
}

/* dQ of R query rows: walk the key tiles up to the block's last query. */
template <typename S, int G>
__global__ void __launch_bounds__(ATT_THREADS)
    att_bwd_q(zr_op_k_qkv x, const S *dout, const float *lse, const float *delta, int T, int C,
              int NH, float scale, int vec)
{
    constexpr int R = att_tile<G>::R, BK = att_tile<G>::BK, HSP = att_tile<G>::HSP;
    ZR_SHARED_DYNAMIC(float, sm);
    float *ks = sm, *vs = sm + BK * HSP;
    const int hs = C / NH, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const att_head<S> hd(x, b, h, h / x.group, T, hs);
    const int q0 = blockIdx.x * R, row = q0 + threadIdx.x / G, lane = threadIdx.x % G;
    const int r = min(row, T - 1);
    float q[ATT_D], g[ATT_D], dq[ATT_D];
    load_row<S, G>(q, hd.q + (size_t)r * (size_t)x.lq, lane, hs);
    load_row<S, G>(g, dout + ((size_t)b * T + r) * C + (size_t)h * hs, lane, hs);
    ZR_UNROLL
    for (int d = 0; d < ATT_D; d++) {
        dq[d] = 0.0f;
    }
    const float L = lse[(size_t)bh * T + r], D = delta[(size_t)bh * T + r];
    int wfirst, wlast;
    warp_rows<G>(q0, T, &wfirst, &wlast);
    const int kend = min(q0 + R, T);
    for (int k0 = 0; k0 < kend; k0 += BK) {
        __syncthreads();
        load_tile<S, BK, HSP>(ks, kv_at<S>(x.k, hd.kv), k0, T, hs, x.lkv, vec);
        load_tile<S, BK, HSP>(vs, kv_at<S>(x.v, hd.kv), k0, T, hs, x.lkv, vec);
        __syncthreads();
        const int nk = min(BK, wlast - k0 + 1); /* warp-uniform; <= 0: nothing to do */
        for (int jj = 0; jj < nk; jj++) {       /* as in att_bwd_kv: not unrolled */
            const float *kj = ks + jj * HSP;
            float sc = row_dot<G>(q, kj, lane);
            float p = k0 + jj <= r ? expf(sc * scale - L) : 0.0f;
            float dp = row_dot<G>(g, vs + jj * HSP, lane);
            float dsv = p * (dp - D);
            ZR_UNROLL
            for (int d = 0; d < ATT_D; d++) {
                dq[d] += dsv * kj[d * G + lane];
            }
        }
    }
    if (row < T) {
        S *dst = static_cast<S *>(x.dq) + ((size_t)b * T + row) * (size_t)x.lq + (size_t)h * hs;
        store_row<S, G>(dst, dq, scale, lane, hs);
    }
}

/* ---- launchers -------------------------------------------------------------------------- */

template <typename S, int G> static cudaError_t fwd_t(const zr_op_k_att *a, cudaStream_t s)
{
    typedef att_tile<G> tl;
    dim3 grid((unsigned int)((a->T + tl::R - 1) / tl::R), (unsigned int)(a->B * a->NH));
    size_t shmem = 2 * (size_t)tl::BK * tl::HSP * sizeof(float);
    ZR_LAUNCH((att_fwd<S, G>), grid, ATT_THREADS, shmem, s, sptr<S>(a->out), a->lse, a->x, a->T,
              a->C, a->NH, a->scale, a->vec);
    return cudaGetLastError();
}

template <typename S, int G> static cudaError_t bwd_t(const zr_op_k_att *a, cudaStream_t s)
{
    typedef att_tile<G> tl;
    dim3 grid((unsigned int)((a->T + tl::R - 1) / tl::R), (unsigned int)(a->B * a->NH));
    ZR_LAUNCH((att_delta<S, G>), grid, ATT_THREADS, 0, s, a->delta, sptr<S>(a->dout), sptr<S>(a->o),
              a->T, a->C, a->NH);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
        return err;
    }
    const float *delta = a->delta;
    size_t shmem = (2 * (size_t)tl::BK * tl::HSP + 2 * (size_t)tl::BK) * sizeof(float);
    dim3 kvgrid(grid.x, (unsigned int)(a->B * (a->NH / a->x.group)));
    ZR_LAUNCH((att_bwd_kv<S, G>), kvgrid, ATT_THREADS, shmem, s, a->x, sptr<S>(a->dout), a->lse,
              delta, a->T, a->C, a->NH, a->scale, a->vec);
    err = cudaGetLastError();
    if (err != cudaSuccess) {
        return err;
    }
    shmem = 2 * (size_t)tl::BK * tl::HSP * sizeof(float);
    ZR_LAUNCH((att_bwd_q<S, G>), grid, ATT_THREADS, shmem, s, a->x, sptr<S>(a->dout), a->lse, delta,
              a->T, a->C, a->NH, a->scale, a->vec);
    return cudaGetLastError();
}

template <typename S> static cudaError_t fwd_s(const zr_op_k_att *a, cudaStream_t s)
{
    switch (a->g) {
    case 1:
        return fwd_t<S, 1>(a, s);
    case 2:
        return fwd_t<S, 2>(a, s);
    case 4:
        return fwd_t<S, 4>(a, s);
    case 8:
        return fwd_t<S, 8>(a, s);
    default:
        return fwd_t<S, 16>(a, s);
    }
}

template <typename S> static cudaError_t bwd_s(const zr_op_k_att *a, cudaStream_t s)
{
    switch (a->g) {
    case 1:
        return bwd_t<S, 1>(a, s);
    case 2:
        return bwd_t<S, 2>(a, s);
    case 4:
        return bwd_t<S, 4>(a, s);
    case 8:
        return bwd_t<S, 8>(a, s);
    default:
        return bwd_t<S, 16>(a, s);
    }
}

extern "C" cudaError_t zr_op_k_launch_attention_fwd(int bf16, const zr_op_k_att *a, cudaStream_t s)
{
    return bf16 ? fwd_s<zr_bf16_t>(a, s) : fwd_s<float>(a, s);
}

extern "C" cudaError_t zr_op_k_launch_attention_bwd(int bf16, const zr_op_k_att *a, cudaStream_t s)
{
    return bf16 ? bwd_s<zr_bf16_t>(a, s) : bwd_s<float>(a, s);
}
