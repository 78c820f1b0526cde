/*
 * mma.h - the GPU emulator's warp matrix functions (nvcuda::wmma), issue 42.
 *
 * What zr's kernels use: 16x16x16 tiles, matrix_a / matrix_b fragments of
 * __nv_bfloat16 (row_major or col_major) and float accumulators;
 * fill_fragment, load_matrix_sync, store_matrix_sync (mem_row_major or
 * mem_col_major) and mma_sync. Every one of them is a warp-collective
 * operation, as on a GPU: it completes when all 32 lanes of the warp have
 * arrived (a lane that has exited, or lanes at another warp operation, are
 * an emulator error), like the emulator's shuffles.
 *
 * A fragment is a per-lane array of num_elements = 8 values. Which element
 * of which lane holds which (row, column) of the tile is deliberately NOT
 * the hardware's: lane l's element e holds the tile's entry
 *
 *     p = (37 (8 l + e) + 11) mod 256 (matrix_a), (101 (8 l + e) + 59) mod 256
 *     (matrix_b), (97 (8 l + e) + 23) mod 256 (accumulator)
 *
 * in row-major order (row p / 16, column p % 16): a bijection per use,
 * different for each use and from every hardware layout. A kernel that only
 * loads, stores, multiplies, fills and applies the same operation to every
 * element (or combines two fragments of the same type element by element)
 * gives the same results here and on a GPU; one that assumes which entry an
 * element is gets a wrong answer here (test_emu_wmma shows both).
 *
 * mma_sync: every lane writes its elements of A, B and C into its warp's
 * scratch (two buffers used in turn, so a lane may start the next product
 * while others still read this one), the lanes meet, and each lane computes
 * its 8 elements of D = A B + C in fp32 (bf16 inputs are exact in fp32, the
 * 16 products added to C in order k = 0..15, no fused multiply-add). The
 * hardware adds in another order: results agree to fp32 rounding.
 * load_matrix_sync / store_matrix_sync meet the lanes, then each lane reads
 * or writes its own elements: as on a GPU, other lanes see a store only
 * after a __syncwarp (or __syncthreads). Pointers must be 32-byte aligned and
 * ldm a multiple of 16 bytes (CUDA's rule): else an emulator error.
 */
#ifndef ZR_EMU_MMA_H
#define ZR_EMU_MMA_H

#include "cuda_bf16.h"
#include "cuda_runtime.h"

namespace zr_emu {

/* tests/emu/kernel.cpp: the lanes of the warp meet (all 32, else an error) */
void wmma_sync(const char *what, const char *file, int line);
/* this lane's next product buffer of its warp: 3 x 256 floats (A, B, C) */
float *wmma_scratch(void);

template <typename Use> struct wmma_map;

inline int wmma_pos(int mul, int add, int lane, int e)
{
    return (mul * (8 * lane + e) + add) & 255;
}

inline void wmma_check(const void *p, unsigned int ldm, size_t esize, const char *what,
                       const char *file, int line)
{
    if (((uintptr_t)p & 31u) != 0 || (ldm * esize) % 16 != 0) {
        trap(what, file, line); /* reported as "wmma::...: pointer not 32-byte aligned ..." */
    }
}

} // namespace zr_emu

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> class fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulator knows the 16x16x16 shape only");

  public:
    enum { num_elements = 8 };
    T x[8];
};

} // namespace wmma
} // namespace nvcuda

namespace zr_emu {

template <> struct wmma_map<nvcuda::wmma::matrix_a> {
    static int pos(int lane, int e)
    {
        return wmma_pos(37, 11, lane, e);
    }
};
template <> struct wmma_map<nvcuda::wmma::matrix_b> {
    static int pos(int lane, int e)
    {
        return wmma_pos(101, 59, lane, e);
    }
};
template <> struct wmma_map<nvcuda::wmma::accumulator> {
    static int pos(int lane, int e)
    {
        return wmma_pos(97, 23, lane, e);
    }
};

/* the lane of the calling thread in its warp */
inline int wmma_lane(void)
{
    return (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32;
}

/* where entry p (row-major position in the tile) lies in memory */
inline size_t wmma_at(int p, unsigned int ldm, bool row_major)
{
    return row_major ? (size_t)(p / 16) * ldm + (size_t)(p % 16)
                     : (size_t)(p % 16) * ldm + (size_t)(p / 16);
}

} // namespace zr_emu

namespace nvcuda {
namespace wmma {

template <typename Use, int M, int N, int K, typename T, typename L>
inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, const T &v)
{
    for (int e = 0; e < 8; e++) {
        f.x[e] = v;
    }
}

/* matrix_a / matrix_b: the memory layout is the fragment's */
template <typename Use, typename T, typename L>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, L> &f, const T *p, unsigned int ldm,
                             const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    static_assert(std::is_same<T, __nv_bfloat16>::value, "bf16 matrix_a / matrix_b only");
    zr_emu::wmma_check(p, ldm, sizeof(T),
                       "wmma::load_matrix_sync: pointer not 32-byte aligned or ldm not a "
                       "multiple of 16 bytes",
                       file, line);
    zr_emu::wmma_sync("wmma::load_matrix_sync", file, line);
    const int lane = zr_emu::wmma_lane();
    const bool rm = std::is_same<L, row_major>::value;
    for (int e = 0; e < 8; e++) {
        f.x[e] = p[zr_emu::wmma_at(zr_emu::wmma_map<Use>::pos(lane, e), ldm, rm)];
    }
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                             unsigned int ldm, layout_t layout, const char *file = __builtin_FILE(),
                             int line = __builtin_LINE())
{
    zr_emu::wmma_check(p, ldm, sizeof(float),
                       "wmma::load_matrix_sync: pointer not 32-byte aligned or ldm not a "
                       "multiple of 16 bytes",
                       file, line);
    zr_emu::wmma_sync("wmma::load_matrix_sync", file, line);
    const int lane = zr_emu::wmma_lane();
    for (int e = 0; e < 8; e++) {
        int pos = zr_emu::wmma_map<accumulator>::pos(lane, e);
        f.x[e] = p[zr_emu::wmma_at(pos, ldm, layout == mem_row_major)];
    }
}

inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                              unsigned int ldm, layout_t layout,
                              const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    zr_emu::wmma_check(p, ldm, sizeof(float),
                       "wmma::store_matrix_sync: pointer not 32-byte aligned or ldm not a "
                       "multiple of 16 bytes",
                       file, line);
    zr_emu::wmma_sync("wmma::store_matrix_sync", file, line);
    const int lane = zr_emu::wmma_lane();
    for (int e = 0; e < 8; e++) {
        int pos = zr_emu::wmma_map<accumulator>::pos(lane, e);
        p[zr_emu::wmma_at(pos, ldm, layout == mem_row_major)] = f.x[e];
    }
}

template <typename LA, typename LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                     const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
                     const fragment<accumulator, 16, 16, 16, float> &c,
                     const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    float *s = zr_emu::wmma_scratch(); /* A [16][16], B [16][16], C [16][16], row-major */
    const int lane = zr_emu::wmma_lane();
    for (int e = 0; e < 8; e++) {
        s[zr_emu::wmma_map<matrix_a>::pos(lane, e)] = __bfloat162float(a.x[e]);
        s[256 + zr_emu::wmma_map<matrix_b>::pos(lane, e)] = __bfloat162float(b.x[e]);
        s[512 + zr_emu::wmma_map<accumulator>::pos(lane, e)] = c.x[e];
    }
    zr_emu::wmma_sync("wmma::mma_sync", file, line);
    float out[8];
    for (int e = 0; e < 8; e++) {
        int pos = zr_emu::wmma_map<accumulator>::pos(lane, e), i = pos / 16, j = pos % 16;
        float acc = s[512 + pos];
        for (int k = 0; k < 16; k++) {
            acc += s[i * 16 + k] * s[256 + k * 16 + j];
        }
        out[e] = acc;
    }
    for (int e = 0; e < 8; e++) {
        d.x[e] = out[e]; /* d may be c: written after every read */
    }
}

} // namespace wmma
} // namespace nvcuda

#endif /* ZR_EMU_MMA_H */
