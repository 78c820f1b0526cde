/*
 * adamw_cuda.cu - the optimizer's CUDA kernels: AdamW on a shard, and the
 * sum of squares behind the gradient norm.
 *
 * AdamW is elementwise: each thread updates 4 elements with one 16-byte
 * load or store per array where the C side found all four aligned, running
 * zr_adamw_elem (adamw_rules.h), the rule the CPU reference runs, with the
 * step's constants computed once on the host. Bit-identical to the CPU, but
 * for the payload of NaNs (each processor propagates its own).
 *
 * The sum of squares adds in double in the order sumsq_rules.h fixes, which
 * depends only on n, so zr_sumsq_cuda_order (optim.c) gives the same
 * bits on the CPU: a first kernel of P blocks sums tiles into P partials with
 * a shared-memory tree per block, a second sums the partials by the same
 * tree. (The CPU's zr_sumsq keeps its own order of 8 double lanes; the two
 * agree to rounding, not to the bit.)
 *
 * Built by nvcc (--fmad=false) and by the GPU emulator (g++).
 */
#include "../base/cuda_kernel.h"
#include "optim_cuda_impl.h"
#include "sumsq_rules.h"

#define ADAM_THREADS 256

__global__ void __launch_bounds__(ADAM_THREADS)
    adamw_kernel(const zr_adamw_k k, float *p, const float *g, float *m, float *v, uint64_t n,
                 int vec)
{
    uint64_t nq = (n + 3) / 4;
    for (uint64_t q = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; q < nq;
         q += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t e = 4 * q;
        if (vec && e + 4 <= n) {
            float4 pp = reinterpret_cast<float4 *>(p + e)[0];
            float4 gg = __ldg(reinterpret_cast<const float4 *>(g + e));
            float4 mm = reinterpret_cast<float4 *>(m + e)[0];
            float4 vv = reinterpret_cast<float4 *>(v + e)[0];
            zr_adamw_elem(&k, &pp.x, gg.x, &mm.x, &vv.x);
            zr_adamw_elem(&k, &pp.y, gg.y, &mm.y, &vv.y);
            zr_adamw_elem(&k, &pp.z, gg.z, &mm.z, &vv.z);
            zr_adamw_elem(&k, &pp.w, gg.w, &mm.w, &vv.w);
            reinterpret_cast<float4 *>(p + e)[0] = pp;
            reinterpret_cast<float4 *>(m + e)[0] = mm;
            reinterpret_cast<float4 *>(v + e)[0] = vv;
            continue;
        }
        for (uint64_t i = e; i < e + 4 && i < n; i++) {
            zr_adamw_elem(&k, &p[i], g[i], &m[i], &v[i]);
        }
    }
}

/* s[i] = s[i] + s[i + h], h = count/2 .. 1; the result in s[0]. */
__device__ __forceinline__ void tree(double *s, int count)
{
    for (int h = count / 2; h > 0; h /= 2) {
        if ((int)threadIdx.x < h) {
            s[threadIdx.x] = s[threadIdx.x] + s[threadIdx.x + h];
        }
        __syncthreads();
    }
}

__global__ void __launch_bounds__(ZR_SUMSQ_THREADS)
    sumsq_partials(const float *x, uint64_t n, int vec, double *work)
{
    __shared__ double s[ZR_SUMSQ_THREADS];
    uint64_t tiles = (n + ZR_SUMSQ_TILE - 1) / ZR_SUMSQ_TILE;
    double acc = 0.0;
    for (uint64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
        ZR_UNROLL
        for (int j = 0; j < 4; j++) {
            uint64_t e = t * ZR_SUMSQ_TILE + (uint64_t)j * 4 * ZR_SUMSQ_THREADS + 4 * threadIdx.x;
            if (vec && e + 4 <= n) {
                float4 f = __ldg(reinterpret_cast<const float4 *>(x + e));
                acc = zr_sumsq_add(acc, f.x);
                acc = zr_sumsq_add(acc, f.y);
                acc = zr_sumsq_add(acc, f.z);
                acc = zr_sumsq_add(acc, f.w);
            } else {
                for (uint64_t i = e; i < e + 4 && i < n; i++) {
                    acc = zr_sumsq_add(acc, x[i]);
                }
            }
        }
    }
    s[threadIdx.x] = acc;
    __syncthreads();
    tree(s, ZR_SUMSQ_THREADS);
    if (threadIdx.x == 0) {
        work[blockIdx.x] = s[0];
    }
}

__global__ void __launch_bounds__(ZR_SUMSQ_BLOCKS)
    sumsq_final(const double *work, uint64_t parts, double *result)
{
    __shared__ double s[ZR_SUMSQ_BLOCKS];
    s[threadIdx.x] = threadIdx.x < parts ? work[threadIdx.x] : 0.0;
    __syncthreads();
    tree(s, ZR_SUMSQ_BLOCKS);
    if (threadIdx.x == 0) {
        *result = s[0];
    }
}

extern "C" cudaError_t zr_optim_k_launch_adamw(const zr_adamw_k *k, float *p, const float *g,
                                               float *m, float *v, uint64_t n, int vec,
                                               cudaStream_t s)
{
    uint64_t blocks = ((n + 3) / 4 + ADAM_THREADS - 1) / ADAM_THREADS;
    unsigned int grid = (unsigned int)(blocks < 1 ? 1 : blocks > 65535 ? 65535 : blocks);
    ZR_LAUNCH(adamw_kernel, grid, ADAM_THREADS, 0, s, *k, p, g, m, v, n, vec);
    return cudaGetLastError();
}

extern "C" cudaError_t zr_optim_k_launch_sumsq(const float *x, uint64_t n, int vec, double *result,
                                               double *work, cudaStream_t s)
{
    uint64_t parts = zr_sumsq_partials(n);
    ZR_LAUNCH(sumsq_partials, (unsigned int)parts, ZR_SUMSQ_THREADS, 0, s, x, n, vec, work);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
        return err;
    }
    ZR_LAUNCH(sumsq_final, 1, ZR_SUMSQ_BLOCKS, 0, s, work, parts, result);
    return cudaGetLastError();
}
