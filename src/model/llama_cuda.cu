/*
 * llama_cuda.cu - the Llama family's operators other than attention and
 * the matrix products on a CUDA device (issue 43): RMSNorm forward and
 * input gradient, rotary position embeddings, SwiGLU. The shapes and
 * conventions are ops_table.h's; the CPU's are ops_llama.c's.
 *
 * Every element is computed by llama_rules.h, ops_llama.c's arithmetic in
 * its order, and this file is compiled with --fmad=false (the Makefile), so
 * fp32 results are the CPU's bits; bf16 storage is widened to fp32 on load
 * and rounded once on store, which gives the bits of the CPU run on the
 * widened inputs, rounded.
 *
 *   RMSNorm     a row's sum of squares as the CPU takes it: 16 lanes (a
 *               half warp per row), lane k summing columns k, k + 16, ...
 *               in order (the CPU's ZR_LANES accumulators), then an xor
 *               butterfly over 8, 4, 2, 1, which is zr_lanes_total's
 *               pairwise order on every lane. The weight's gradient is a
 *               column sum (norm_cuda.cu, zr_op_k_launch_rmsnorm_dw), in
 *               another fixed order than the CPU's row by row.
 *   rope        one thread per pair (x[j], x[j + hd/2]) of a row's head,
 *               cos and sin from the table the host built (zr_op_rope_table).
 *   SwiGLU      one thread per element; gate and up rows ld apart.
 *
 * Built by nvcc and by the GPU emulator (g++, no contraction either).
 */
#include "llama_rules.h"
#include "ops_cuda_impl.h"
#include "ops_cuda_vec.h"

#define LL_THREADS   128 /* threads of a block */
#define LL_LANES     16  /* lanes of a row's sum: the CPU's ZR_LANES */
#define LL_ROWS      (LL_THREADS / LL_LANES)
#define LL_EW_BLOCKS 65535u /* grid cap of the elementwise kernels (they stride past it) */

static unsigned int ll_grid(uint64_t work)
{
    uint64_t blocks = (work + LL_THREADS - 1) / LL_THREADS;
    return (unsigned int)(blocks < 1 ? 1 : blocks > LL_EW_BLOCKS ? LL_EW_BLOCKS : blocks);
}

#define LL_FOR(i, count)                                                                           \
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (count);                \
         i += (uint64_t)gridDim.x * blockDim.x)

/* The sum over a half warp's 16 lanes in zr_lanes_total's order, the same bits on every lane. */
__device__ __forceinline__ float ll_lanes_total(float acc)
{
    ZR_UNROLL
    for (int off = LL_LANES / 2; off > 0; off /= 2) {
        acc = acc + __shfl_xor_sync(ZR_FULL_MASK, acc, off);
    }
    return acc;
}

/* ---- RMSNorm ------------------------------------------------------------------------- */

/* A half warp per row (rows past N compute on row N-1 and write nothing: the shuffles meet). */
template <typename S>
__global__ void __launch_bounds__(LL_THREADS)
    rmsnorm_fwd(S *out, float *rstd, const S *inp, const S *w, float eps, int N, int C)
{
    const int row = blockIdx.x * LL_ROWS + threadIdx.x / LL_LANES, k = threadIdx.x % LL_LANES;
    const size_t off = (size_t)min(row, N - 1) * C;
    float acc = 0.0f;
    for (int c = k; c < C; c += LL_LANES) {
        float x = ld1(inp + off + c);
        acc = acc + x * x;
    }
    const float rs = zr_llama_rms_rstd(ll_lanes_total(acc), C, eps);
    if (row >= N) {
        return;
    }
    for (int c = k; c < C; c += LL_LANES) {
        st1(out + off + c, zr_llama_rms_out(ld1(inp + off + c), ld1(w + c), rs));
    }
    if (k == 0) {
        rstd[row] = rs;
    }
}

/* dinp (+)= the input gradient, a half warp per row. */
template <typename S>
__global__ void __launch_bounds__(LL_THREADS)
    rmsnorm_bwd_rows(S *dinp, const S *dout, const S *inp, const S *w, const float *rstd, int N,
                     int C, int accumulate)
{
    const int row = blockIdx.x * LL_ROWS + threadIdx.x / LL_LANES, k = threadIdx.x % LL_LANES;
    const int r = min(row, N - 1);
    const size_t off = (size_t)r * C;
    const float rs = rstd[r];
    float acc = 0.0f;
    for (int c = k; c < C; c += LL_LANES) {
        acc = acc + zr_llama_rms_dot(ld1(inp + off + c), ld1(w + c), ld1(dout + off + c), rs);
    }
    const float m = ll_lanes_total(acc) / (float)C;
    if (row >= N) {
        return;
    }
    for (int c = k; c < C; c += LL_LANES) {
        float g = zr_llama_rms_dx(ld1(inp + off + c), ld1(w + c), ld1(dout + off + c), rs, m);
        st1(dinp + off + c, accumulate ? ld1(dinp + off + c) + g : g);
    }
}

/* ---- rotary embeddings ---------------------------------------------------------------- */

/* Pair p = ((i * NH + h) * h2 + j) of rows i = b * T + t; sign -1 rotates back. */
template <typename S>
__global__ void __launch_bounds__(LL_THREADS)
    rope(S *out, const S *inp, const float *cosines, const float *sines, int T, int NH, int hd,
         float sign, uint64_t pairs)
{
    const int h2 = hd / 2;
    LL_FOR(p, pairs)
    {
        const int j = (int)(p % (uint64_t)h2);
        const uint64_t ih = p / (uint64_t)h2, i = ih / (uint64_t)NH;
        const size_t at = (size_t)ih * hd + j, cs = (size_t)(i % (uint64_t)T) * h2 + j;
        float y1, y2;
        zr_llama_rope(ld1(inp + at), ld1(inp + at + h2), cosines[cs], sign * sines[cs], &y1, &y2);
        st1(out + at, y1);
        st1(out + at + h2, y2);
    }
}

/* ---- SwiGLU --------------------------------------------------------------------------- */

template <typename S>
__global__ void __launch_bounds__(LL_THREADS)
    swiglu_fwd(S *out, const S *gate, const S *up, int IC, int ld, uint64_t n)
{
    LL_FOR(e, n)
    {
        const uint64_t i = e / (uint64_t)IC, j = e % (uint64_t)IC;
        const size_t at = (size_t)i * ld + j;
        st1(out + e, zr_llama_swiglu(ld1(gate + at), ld1(up + at)));
    }
}

/* dgate, dup may be gate, up (each element read before it is written, by its one thread). */
template <typename S>
__global__ void __launch_bounds__(LL_THREADS)
    swiglu_bwd(S *dgate, S *dup, const S *dout, const S *gate, const S *up, int IC, int ld,
               uint64_t n)
{
    LL_FOR(e, n)
    {
        const uint64_t i = e / (uint64_t)IC, j = e % (uint64_t)IC;
        const size_t at = (size_t)i * ld + j;
        float dg, du;
        zr_llama_swiglu_bwd(ld1(gate + at), ld1(up + at), ld1(dout + e), &dg, &du);
        st1(dgate + at, dg);
        st1(dup + at, du);
    }
}

/* ---- launchers ------------------------------------------------------------------------ */

template <typename S> static cudaError_t rmsnorm_fwd_t(const zr_op_k_rms *a, cudaStream_t s)
{
    unsigned int grid = (unsigned int)((a->N + LL_ROWS - 1) / LL_ROWS);
    ZR_LAUNCH(rmsnorm_fwd<S>, grid, LL_THREADS, 0, s, sptr<S>(a->out), a->rstd, sptr<S>(a->inp),
              sptr<S>(a->w), a->eps, a->N, a->C);
    return cudaGetLastError();
}

extern "C" cudaError_t zr_op_k_launch_rmsnorm_fwd(int bf16, const zr_op_k_rms *a, cudaStream_t s)
{
    return bf16 ? rmsnorm_fwd_t<zr_bf16_t>(a, s) : rmsnorm_fwd_t<float>(a, s);
}

template <typename S> static cudaError_t rmsnorm_bwd_t(const zr_op_k_rms *a, cudaStream_t s)
{
    unsigned int grid = (unsigned int)((a->N + LL_ROWS - 1) / LL_ROWS);
    ZR_LAUNCH(rmsnorm_bwd_rows<S>, grid, LL_THREADS, 0, s, sptr<S>(a->dinp), sptr<S>(a->dout),
              sptr<S>(a->inp), sptr<S>(a->w), a->rstd, a->N, a->C, a->accumulate);
    return cudaGetLastError();
}

extern "C" cudaError_t zr_op_k_launch_rmsnorm_bwd(int bf16, const zr_op_k_rms *a, cudaStream_t s)
{
    cudaError_t err = bf16 ? rmsnorm_bwd_t<zr_bf16_t>(a, s) : rmsnorm_bwd_t<float>(a, s);
    if (err != cudaSuccess) {
        return err;
    }
    return zr_op_k_launch_rmsnorm_dw(bf16, a->dw, a->dout, a->inp, a->rstd, a->N, a->C, a->scratch,
                                     a->vec, s);
}

template <typename S>
static cudaError_t rope_t(void *out, const void *inp, const float *cosines, const float *sines,
                          int B, int T, int NH, int hd, float sign, cudaStream_t s)
{
    uint64_t pairs = (uint64_t)B * T * NH * (hd / 2);
    ZR_LAUNCH(rope<S>, ll_grid(pairs), LL_THREADS, 0, s, sptr<S>(out), sptr<S>(inp), cosines, sines,
              T, NH, hd, sign, pairs);
    return cudaGetLastError();
}

extern "C" cudaError_t zr_op_k_launch_rope(int bf16, void *out, const void *inp,
                                           const float *cosines, const float *sines, int B, int T,
                                           int NH, int hd, float sign, cudaStream_t s)
{
    return bf16 ? rope_t<zr_bf16_t>(out, inp, cosines, sines, B, T, NH, hd, sign, s)
                : rope_t<float>(out, inp, cosines, sines, B, T, NH, hd, sign, s);
}

template <typename S>
static cudaError_t swiglu_t(void *dgate, void *dup, void *out, const void *dout, const void *gate,
                            const void *up, int N, int IC, int ld, cudaStream_t s)
{
    uint64_t n = (uint64_t)N * IC;
    if (dout == nullptr) {
        ZR_LAUNCH(swiglu_fwd<S>, ll_grid(n), LL_THREADS, 0, s, sptr<S>(out), sptr<S>(gate),
                  sptr<S>(up), IC, ld, n);
    } else {
        ZR_LAUNCH(swiglu_bwd<S>, ll_grid(n), LL_THREADS, 0, s, sptr<S>(dgate), sptr<S>(dup),
                  sptr<S>(dout), sptr<S>(gate), sptr<S>(up), IC, ld, n);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t zr_op_k_launch_swiglu(int bf16, void *dgate, void *dup, void *out,
                                             const void *dout, const void *gate, const void *up,
                                             int N, int IC, int ld, cudaStream_t s)
{
    return bf16 ? swiglu_t<zr_bf16_t>(dgate, dup, out, dout, gate, up, N, IC, ld, s)
                : swiglu_t<float>(dgate, dup, out, dout, gate, up, N, IC, ld, s);
}
