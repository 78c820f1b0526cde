/*
 * ops_cuda.cu - GPT-2's elementwise kernels: embedding, residual add, bias +
 * GELU, bias add. LayerNorm and the column sums are norm_cuda.cu's,
 * attention attention_cuda.cu's, softmax + cross-entropy xent_cuda.cu's,
 * the matrix products cuBLAS'.
 *
 * Every kernel of the model is templated on the storage type (float or bf16
 * bits, ops_cuda_vec.h) and computes in fp32. The shapes:
 *   - elementwise work: one thread per chunk of 8 elements of a row, 16-byte
 *     accesses where the C side (ops_cuda.c) found every row aligned;
 *   - per-row reductions (LayerNorm forward and backward): one warp per row,
 *     sums by an xor butterfly, so every lane holds the same bits;
 *   - sums over rows (bias and LayerNorm weight gradients, the embedding's):
 *     never atomics. Column sums run in two passes, partial sums of fixed
 *     row ranges then their sum in range order; the token embedding's
 *     gradient sums each token's positions in position order, from buckets
 *     the host builds (gpt_cuda.c), the position embedding's each position
 *     over the batch in order. Results are the same bits on every run.
 *
 * Built by nvcc (--fmad=true: multiply-adds contract, so results differ from
 * the CPU's in the last bits where a product meets a sum; single additions,
 * the residual and bias adds, still give the CPU's bits) and by the GPU
 * emulator (g++, no contraction).
 */
#include "ops_cuda_impl.h"
#include "ops_cuda_vec.h"
#include "ops_index.h"

#define EW_THREADS 256 /* elementwise kernels */

#define GELU_S 0.7978845608028654f /* sqrt(2 / pi) */

/* Blocks for `work` items, one per thread (the kernels stride past the cap). */
static unsigned int grid_for(uint64_t work, int threads)
{
    uint64_t blocks = (work + (uint64_t)threads - 1) / (uint64_t)threads;
    return (unsigned int)(blocks < 1 ? 1 : blocks > 65535 ? 65535 : blocks);
}

#define FOR_CHUNKS(q, count)                                                                       \
    for (uint64_t q = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; q < (count);                \
         q += (uint64_t)gridDim.x * blockDim.x)

/* ---- embedding ----------------------------------------------------------------------- */

template <typename S>
__global__ void __launch_bounds__(EW_THREADS)
    encoder_fwd(S *out, const int *inp, const S *wte, const S *wpe, int T, int C, uint64_t rows,
                int vec)
{
    FOR_CHUNKS(q, zr_op_chunks(rows, C))
    {
        uint64_t row;
        int c, m;
        uint64_t at = zr_op_chunk_at(q, C, &row, &c, &m);
        float e[8], p[8];
        load8(wte + zr_op_offset((uint64_t)inp[row], C, c), m, vec, e);
        load8(wpe + zr_op_offset(row % (uint64_t)T, C, c), m, vec, p);
        ZR_UNROLL
        for (int i = 0; i < 8; i++) {
            e[i] = e[i] + p[i];
        }
        store8(out + at, m, vec, e);
    }
}

/* dwte[token] += the token's positions' rows, in position order, from the current value. */
template <typename S>
__global__ void __launch_bounds__(128)
    encoder_bwd_wte(S *dwte, const S *dout, const int *btoken, const int *bstart, const int *bpos,
                    int C, int vec)
{
    int c = (blockIdx.y * blockDim.x + threadIdx.x) * 8;
    if (c >= C) {
        return;
    }
    int m = min(8, C - c), bucket = blockIdx.x;
    S *dst = dwte + zr_op_offset((uint64_t)btoken[bucket], C, c);
    float acc[8];
    load8(dst, m, vec, acc);
    for (int p = bstart[bucket]; p < bstart[bucket + 1]; p++) {
        float d[8];
        load8(dout + zr_op_offset((uint64_t)bpos[p], C, c), m, vec, d);
        ZR_UNROLL
        for (int i = 0; i < 8; i++) {
            acc[i] = acc[i] + d[i];
        }
    }
    store8(dst, m, vec, acc);
}

/* dwpe[t] += dout[b, t] for b = 0 .. B-1 in order. */
template <typename S>
__global__ void __launch_bounds__(EW_THREADS)
    encoder_bwd_wpe(S *dwpe, const S *dout, int B, int T, int C, int vec)
{
    FOR_CHUNKS(q, zr_op_chunks((uint64_t)T, C))
    {
        uint64_t t;
        int c, m;
        uint64_t at = zr_op_chunk_at(q, C, &t, &c, &m);
        float acc[8];
        load8(dwpe + at, m, vec, acc);
        for (int b = 0; b < B; b++) {
            float d[8];
            load8(dout + zr_op_offset((uint64_t)b * (uint64_t)T + t, C, c), m, vec, d);
            ZR_UNROLL
            for (int i = 0; i < 8; i++) {
                acc[i] = acc[i] + d[i];
            }
        }
        store8(dwpe + at, m, vec, acc);
    }
}

/* ---- residual ------------------------------------------------------------------------ */

/* res = a + (x + xbias), elementwise over rows of C. */
template <typename S>
__global__ void __launch_bounds__(EW_THREADS)
    residual(S *res, const S *a, const S *x, const S *xbias, uint64_t N, int C, int vec)
{
    FOR_CHUNKS(q, zr_op_chunks(N, C))
    {
        uint64_t row;
        int c, m;
        uint64_t at = zr_op_chunk_at(q, C, &row, &c, &m);
        float av[8], xv[8], bv[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        load8(a + at, m, vec, av);
        load8(x + at, m, vec, xv);
        if (xbias != nullptr) {
            load8(xbias + c, m, vec, bv);
        }
        ZR_UNROLL
        for (int i = 0; i < 8; i++) {
            av[i] = av[i] + (xv[i] + bv[i]);
        }
        store8(res + at, m, vec, av);
    }
}

/* ---- GELU and bias ------------------------------------------------------------------------ */

/* tanh(u) = 1 - 2 / (exp(2u) + 1): +-1 at the ends, as the CPU's form. */
__device__ __forceinline__ float tanh_form(float u)
{
    return 1.0f - 2.0f / (expf(2.0f * u) + 1.0f);
}

/* pre += bias (stored), out = GELU(pre), both rows of OC. */
template <typename S>
__global__ void __launch_bounds__(EW_THREADS)
    bias_gelu(S *out, S *pre, const S *bias, uint64_t N, int OC, int vec)
{
    FOR_CHUNKS(q, zr_op_chunks(N, OC))
    {
        uint64_t row;
        int c, m;
        uint64_t at = zr_op_chunk_at(q, OC, &row, &c, &m);
        float v[8], bv[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        load8(pre + at, m, vec, v);
        if (bias != nullptr) {
            load8(bias + c, m, vec, bv);
            ZR_UNROLL
            for (int i = 0; i < 8; i++) {
                v[i] = as_stored(v[i] + bv[i], pre);
            }
            store8(pre + at, m, vec, v);
        }
        ZR_UNROLL
        for (int i = 0; i < 8; i++) {
            float x = v[i];
            float u = GELU_S * (x + 0.044715f * x * x * x);
            v[i] = 0.5f * x * (1.0f + tanh_form(u));
        }
        store8(out + at, m, vec, v);
    }
}

/* dinp = gelu'(inp) * dout over n elements; dinp may be dout. */
template <typename S>
__global__ void __launch_bounds__(EW_THREADS)
    gelu_bwd(S *dinp, const S *inp, const S *dout, uint64_t n, int vec)
{
    FOR_CHUNKS(q, (n + 7) / 8)
    {
        uint64_t e = 8 * q;
        int m = (int)min((uint64_t)8, n - e);
        float xv[8], d[8];
        load8(inp + e, m, vec, xv);
        load8(dout + e, m, vec, d);
        ZR_UNROLL
        for (int i = 0; i < 8; i++) {
            float x = xv[i];
            float u = GELU_S * (x + 0.044715f * x * x * x);
            float t = tanh_form(u);
            float sech2 = 1.0f - t * t;
            float g =
                0.5f * (1.0f + t) + x * 0.5f * sech2 * GELU_S * (1.0f + 3.0f * 0.044715f * x * x);
            d[i] = g * d[i];
        }
        store8(dinp + e, m, vec, d);
    }
}

template <typename S>
__global__ void __launch_bounds__(EW_THREADS)
    bias_add(S *x, const S *bias, uint64_t N, int OC, int vec)
{
    FOR_CHUNKS(q, zr_op_chunks(N, OC))
    {
        uint64_t row;
        int c, m;
        uint64_t at = zr_op_chunk_at(q, OC, &row, &c, &m);
        float v[8], bv[8];
        load8(x + at, m, vec, v);
        load8(bias + c, m, vec, bv);
        ZR_UNROLL
        for (int i = 0; i < 8; i++) {
            v[i] = v[i] + bv[i];
        }
        store8(x + at, m, vec, v);
    }
}

/* ---- launchers ------------------------------------------------------------------------------ */

template <typename S>
static cudaError_t encoder_fwd_t(void *out, const int *inp, const void *wte, const void *wpe, int B,
                                 int T, int C, int vec, cudaStream_t s)
{
    uint64_t rows = (uint64_t)B * T;
    ZR_LAUNCH(encoder_fwd<S>, grid_for(zr_op_chunks(rows, C), EW_THREADS), EW_THREADS, 0, s,
              sptr<S>(out), inp, sptr<S>(wte), sptr<S>(wpe), T, C, rows, vec);
    return cudaGetLastError();
}

extern "C" cudaError_t zr_op_k_launch_encoder_fwd(int bf16, void *out, const int *inp,
                                                  const void *wte, const void *wpe, int B, int T,
                                                  int C, int vec, cudaStream_t s)
{
    return bf16 ? encoder_fwd_t<zr_bf16_t>(out, inp, wte, wpe, B, T, C, vec, s)
                : encoder_fwd_t<float>(out, inp, wte, wpe, B, T, C, vec, s);
}

template <typename S>
static cudaError_t encoder_bwd_t(void *dwte, void *dwpe, const void *dout, const int *btoken,
                                 const int *bstart, const int *bpos, int nbuckets, int B, int T,
                                 int C, int vec, cudaStream_t s)
{
    int c8 = zr_op_row_chunks(C);
    if (nbuckets > 0) {
        dim3 grid((unsigned int)nbuckets, (unsigned int)((c8 + 127) / 128));
        ZR_LAUNCH(encoder_bwd_wte<S>, grid, 128, 0, s, sptr<S>(dwte), sptr<S>(dout), btoken, bstart,
                  bpos, C, vec);
        cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) {
            return err;
        }
    }
    ZR_LAUNCH(encoder_bwd_wpe<S>, grid_for(zr_op_chunks((uint64_t)T, C), EW_THREADS), EW_THREADS, 0,
              s, sptr<S>(dwpe), sptr<S>(dout), B, T, C, vec);
    return cudaGetLastError();
}

extern "C" cudaError_t zr_op_k_launch_encoder_bwd(int bf16, void *dwte, void *dwpe,
                                                  const void *dout, const int *btoken,
                                                  const int *bstart, const int *bpos, int nbuckets,
                                                  int B, int T, int C, int vec, cudaStream_t s)
{
    return bf16 ? encoder_bwd_t<zr_bf16_t>(dwte, dwpe, dout, btoken, bstart, bpos, nbuckets, B, T,
                                           C, vec, s)
                : encoder_bwd_t<float>(dwte, dwpe, dout, btoken, bstart, bpos, nbuckets, B, T, C,
                                       vec, s);
}

template <typename S>
static cudaError_t residual_t(void *res, const void *a, const void *x, const void *xbias, int N,
                              int C, int vec, cudaStream_t s)
{
    ZR_LAUNCH(residual<S>, grid_for(zr_op_chunks((uint64_t)N, C), EW_THREADS), EW_THREADS, 0, s,
              sptr<S>(res), sptr<S>(a), sptr<S>(x), sptr<S>(xbias), (uint64_t)N, C, vec);
    return cudaGetLastError();
}

extern "C" cudaError_t zr_op_k_launch_residual(int bf16, void *res, const void *a, const void *x,
                                               const void *xbias, int N, int C, int vec,
                                               cudaStream_t s)
{
    return bf16 ? residual_t<zr_bf16_t>(res, a, x, xbias, N, C, vec, s)
                : residual_t<float>(res, a, x, xbias, N, C, vec, s);
}

template <typename S>
static cudaError_t bias_gelu_t(void *out, void *pre, const void *bias, int N, int OC, int vec,
                               cudaStream_t s)
{
    ZR_LAUNCH(bias_gelu<S>, grid_for(zr_op_chunks((uint64_t)N, OC), EW_THREADS), EW_THREADS, 0, s,
              sptr<S>(out), sptr<S>(pre), sptr<S>(bias), (uint64_t)N, OC, vec);
    return cudaGetLastError();
}

extern "C" cudaError_t zr_op_k_launch_bias_gelu(int bf16, void *out, void *pre, const void *bias,
                                                int N, int OC, int vec, cudaStream_t s)
{
    return bf16 ? bias_gelu_t<zr_bf16_t>(out, pre, bias, N, OC, vec, s)
                : bias_gelu_t<float>(out, pre, bias, N, OC, vec, s);
}

template <typename S>
static cudaError_t gelu_bwd_t(void *dinp, const void *inp, const void *dout, uint64_t n, int vec,
                              cudaStream_t s)
{
    ZR_LAUNCH(gelu_bwd<S>, grid_for((n + 7) / 8, EW_THREADS), EW_THREADS, 0, s, sptr<S>(dinp),
              sptr<S>(inp), sptr<S>(dout), n, vec);
    return cudaGetLastError();
}

extern "C" cudaError_t zr_op_k_launch_gelu_bwd(int bf16, void *dinp, const void *inp,
                                               const void *dout, uint64_t n, int vec,
                                               cudaStream_t s)
{
    return bf16 ? gelu_bwd_t<zr_bf16_t>(dinp, inp, dout, n, vec, s)
                : gelu_bwd_t<float>(dinp, inp, dout, n, vec, s);
}

template <typename S>
static cudaError_t bias_add_t(void *x, const void *bias, int N, int OC, int vec, cudaStream_t s)
{
    ZR_LAUNCH(bias_add<S>, grid_for(zr_op_chunks((uint64_t)N, OC), EW_THREADS), EW_THREADS, 0, s,
              sptr<S>(x), sptr<S>(bias), (uint64_t)N, OC, vec);
    return cudaGetLastError();
}

extern "C" cudaError_t zr_op_k_launch_bias_add(int bf16, void *x, const void *bias, int N, int OC,
                                               int vec, cudaStream_t s)
{
    return bf16 ? bias_add_t<zr_bf16_t>(x, bias, N, OC, vec, s)
                : bias_add_t<float>(x, bias, N, OC, vec, s);
}
