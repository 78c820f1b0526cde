/*
 * xent_cuda.cu - the fused softmax + cross-entropy of GPT-2's LM head, and
 * the mean loss, on a CUDA device. The probabilities are never stored.
 *
 *   forward   one block per row: each thread keeps an online (max, sum of
 *             exp) over its chunks of 8 columns (16-byte loads, two in
 *             flight), merged across the warp by an xor
 *             butterfly and across warps in warp order (the merge gives the
 *             same bits either way round); the row's log-sum-exp is kept
 *             (fp32) and the loss is lse - logit(target).
 *   backward  in place over the logits: (exp(x - lse) - onehot) * dloss,
 *             16-byte accesses where the C side found rows aligned; the
 *             padded columns V..Vp are written 0 (the classifier's GEMMs run
 *             over Vp: those columns must add nothing to dX nor to wte's
 *             padded rows).
 *   fused     both in one kernel, the row read once from memory (again
 *             from cache): for a caller that needs no logits after the
 *             loss; the same bits as forward then backward.
 *   mean      one block sums the losses in double in a fixed order, so the
 *             loss the host sees is the same bits on every run.
 *
 * Built by nvcc (--fmad=true: see ops_cuda.cu) and by the GPU emulator (g++).
 */
#include "ops_cuda_impl.h"
#include "ops_cuda_vec.h"
#include "ops_index.h"

#define XENT_THREADS 128

/* ---- softmax + cross-entropy --------------------------------------------------------------- */

/* (m, s) of two sets: the larger max, each sum rescaled to it; the same bits either way round. */
__device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2)
{
    float mx = fmaxf(m, m2);
    float a = m == -INFINITY ? 0.0f : s * expf(m - mx);
    float b = m2 == -INFINITY ? 0.0f : s2 * expf(m2 - mx);
    m = mx;
    s = a + b;
}

/*
 * (m, s) of a set, extended by the chunk v[0..n-1]: first the chunk's max
 * (NaNs skipped), the sum rescaled to it when it is larger, then the
 * chunk's terms in order. A NaN logit makes s NaN (the loss shows it).
 */
__device__ __forceinline__ void lse_chunk(float &m, float &s, const float v[8], int n)
{
    float mc = -INFINITY;
    ZR_UNROLL
    for (int i = 0; i < 8; i++) {
        mc = i < n && v[i] > mc ? v[i] : mc;
    }
    if (mc > m) {
        s = m == -INFINITY ? 0.0f : s * expf(m - mc);
        m = mc;
    }
    ZR_UNROLL
    for (int i = 0; i < 8; i++) {
        s += i < n ? expf(v[i] - m) : 0.0f;
    }
}

/*
 * The log-sum-exp of the row x[0..V-1], the same bits in every thread of
 * the block: thread t takes the chunks of 8 at t, t + XENT_THREADS, ... in
 * order, two loads in flight (16-byte accesses where vec), the lanes merge
 * by an xor butterfly, the warps in warp order (wm, wsum: the kernel's
 * shared arrays). Contains a __syncthreads: every thread must call it.
 */
template <typename S>
__device__ __forceinline__ float row_lse(const S *x, int V, int vec, float *wm, float *wsum)
{
    float m = -INFINITY, s = 0.0f;
    const int step = XENT_THREADS * ZR_OP_CHUNK;
    for (int j = (int)threadIdx.x * ZR_OP_CHUNK; j < V; j += 2 * step) {
        int n0 = min(ZR_OP_CHUNK, V - j), n1 = min(ZR_OP_CHUNK, V - j - step);
        float a[8], b[8];
        load8(x + j, n0, vec, a);
        if (n1 > 0) {
            load8(x + j + step, n1, vec, b);
        }
        lse_chunk(m, s, a, n0);
        if (n1 > 0) {
            lse_chunk(m, s, b, n1);
        }
    }
    for (int off = 16; off > 0; off /= 2) {
        float m2 = __shfl_xor_sync(ZR_FULL_MASK, m, off);
        float s2 = __shfl_xor_sync(ZR_FULL_MASK, s, off);
        lse_merge(m, s, m2, s2);
    }
    if (threadIdx.x % 32 == 0) {
        wm[threadIdx.x / 32] = m;
        wsum[threadIdx.x / 32] = s;
    }
    __syncthreads();
    m = wm[0];
    s = wsum[0];
    for (int w = 1; w < XENT_THREADS / 32; w++) {
        lse_merge(m, s, wm[w], wsum[w]);
    }
    return m + logf(s);
}

/*
 * x[0..V-1] (in place) = (exp(x - l) - onehot(t)) * dloss, and x[V..Vp-1] = 0:
 * the classifier's GEMMs run over Vp, so the padded columns must add nothing.
 */
template <typename S>
__device__ __forceinline__ void row_dlogits(S *x, float l, int t, float dloss, int V, int Vp,
                                            int vec)
{
    for (int j = threadIdx.x * 8; j < Vp; j += XENT_THREADS * 8) {
        int m = min(8, Vp - j);
        float v[8];
        load8(x + j, m, vec, v);
        ZR_UNROLL
        for (int i = 0; i < 8; i++) {
            v[i] = j + i < V ? (expf(v[i] - l) - (j + i == t ? 1.0f : 0.0f)) * dloss : 0.0f;
        }
        store8(x + j, m, vec, v);
    }
}

/* One block per row: lse = log sum exp of the V logits, loss = lse - logit(target). */
template <typename S>
__global__ void __launch_bounds__(XENT_THREADS)
    xent_fwd(float *losses, float *lse, const S *logits, const int *targets, int V, int Vp, int vec)
{
    __shared__ float wm[XENT_THREADS / 32], wsum[XENT_THREADS / 32];
    const S *x = logits + zr_op_offset(blockIdx.x, Vp, 0);
    float l = row_lse(x, V, vec, wm, wsum);
    if (threadIdx.x == 0) {
        lse[blockIdx.x] = l;
        if (targets != nullptr) {
            losses[blockIdx.x] = l - ld1(x + targets[blockIdx.x]);
        }
    }
}

/* In place: logits become (softmax - onehot(target)) * dloss; the padded columns 0. */
template <typename S>
__global__ void __launch_bounds__(XENT_THREADS)
    xent_bwd(S *logits, const float *lse, const int *targets, float dloss, int V, int Vp, int vec)
{
    S *x = logits + zr_op_offset(blockIdx.x, Vp, 0);
    row_dlogits(x, lse[blockIdx.x], targets[blockIdx.x], dloss, V, Vp, vec);
}

/*
 * Both in one pass over the row: xent_fwd's lse and loss (the target's
 * logit read before the row changes), then xent_bwd's dlogits in place,
 * the row read again from cache. The same bits as the two kernels.
 */
template <typename S>
__global__ void __launch_bounds__(XENT_THREADS)
    xent_fused(float *losses, float *lse, S *logits, const int *targets, float dloss, int V, int Vp,
               int vec)
{
    __shared__ float wm[XENT_THREADS / 32], wsum[XENT_THREADS / 32];
    S *x = logits + zr_op_offset(blockIdx.x, Vp, 0);
    int t = targets[blockIdx.x];
    float xt = threadIdx.x == 0 ? ld1(x + t) : 0.0f; /* before row_lse's barrier */
    float l = row_lse(x, V, vec, wm, wsum);
    if (threadIdx.x == 0) {
        lse[blockIdx.x] = l;
        losses[blockIdx.x] = l - xt;
    }
    row_dlogits(x, l, t, dloss, V, Vp, vec);
}

/* out[0] = mean of x[0..n-1], summed in double in a fixed order (one block). */
__global__ void __launch_bounds__(256) mean_kernel(float *out, const float *x, int n)
{
    __shared__ double sh[256];
    double acc = 0.0;
    for (int i = threadIdx.x; i < n; i += 256) {
        acc += x[i];
    }
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int h = 128; h > 0; h /= 2) {
        if ((int)threadIdx.x < h) {
            sh[threadIdx.x] = sh[threadIdx.x] + sh[threadIdx.x + h];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out[0] = (float)(sh[0] / (double)n);
    }
}

/* ---- launchers ------------------------------------------------------------------------------ */

extern "C" cudaError_t zr_op_k_launch_xent_fwd(int bf16, float *losses, float *lse,
                                               const void *logits, const int *targets, int N, int V,
                                               int Vp, int vec, cudaStream_t s)
{
    if (bf16) {
        ZR_LAUNCH(xent_fwd<zr_bf16_t>, (unsigned int)N, XENT_THREADS, 0, s, losses, lse,
                  sptr<zr_bf16_t>(logits), targets, V, Vp, vec);
    } else {
        ZR_LAUNCH(xent_fwd<float>, (unsigned int)N, XENT_THREADS, 0, s, losses, lse,
                  sptr<float>(logits), targets, V, Vp, vec);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t zr_op_k_launch_xent_bwd(int bf16, void *logits, const float *lse,
                                               const int *targets, float dloss, int N, int V,
                                               int Vp, int vec, cudaStream_t s)
{
    if (bf16) {
        ZR_LAUNCH(xent_bwd<zr_bf16_t>, (unsigned int)N, XENT_THREADS, 0, s, sptr<zr_bf16_t>(logits),
                  lse, targets, dloss, V, Vp, vec);
    } else {
        ZR_LAUNCH(xent_bwd<float>, (unsigned int)N, XENT_THREADS, 0, s, sptr<float>(logits), lse,
                  targets, dloss, V, Vp, vec);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t zr_op_k_launch_xent_fused(int bf16, float *losses, float *lse, void *logits,
                                                 const int *targets, float dloss, int N, int V,
                                                 int Vp, int vec, cudaStream_t s)
{
    if (bf16) {
        ZR_LAUNCH(xent_fused<zr_bf16_t>, (unsigned int)N, XENT_THREADS, 0, s, losses, lse,
                  sptr<zr_bf16_t>(logits), targets, dloss, V, Vp, vec);
    } else {
        ZR_LAUNCH(xent_fused<float>, (unsigned int)N, XENT_THREADS, 0, s, losses, lse,
                  sptr<float>(logits), targets, dloss, V, Vp, vec);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t zr_op_k_launch_mean(float *out, const float *x, int n, cudaStream_t s)
{
    ZR_LAUNCH(mean_kernel, 1, 256, 0, s, out, x, n);
    return cudaGetLastError();
}
