/*
 * test_emu_wmma.cu - the emulator's warp matrix functions (tests/emu/include/mma.h, issue 42).
 *
 *   product      D = A B + C through load_matrix_sync (A row-major, B row- and
 *                col-major), mma_sync, store_matrix_sync (row- and col-major),
 *                fill_fragment, against a scalar fp32 product of the same
 *                bf16 inputs: the same bits (k = 0..15 in order, no FMA, as
 *                mma.h documents), and the accumulator reloaded from memory.
 *   layout       a kernel that writes its accumulator's elements where the
 *                hardware's m16n16k16 layout puts them (lane l, element e:
 *                row l/4 + 8 (e/2 % 2), column 2 (l%4) + e%2 + 8 (e/4)) gets a
 *                wrong answer; the same kernel scaling every element by 2 and
 *                storing with store_matrix_sync gets 2 D exactly.
 *   errors       a warp matrix operation after a lane has exited, and a
 *                pointer that is not 32-byte aligned, are emulator errors.
 *
 * Emulator only (suites emu and emu-tsan): on a GPU the layout check would
 * mean nothing.
 */
#include "../src/base/cuda_kernel.h"

#include "test.h"

#include <initializer_list>
#include <mma.h>
#include <vector>

#include "zr_emu.h"

namespace wmma = nvcuda::wmma;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa_t;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fbr_t;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fbc_t;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc_t;

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        TEST_CHECKF(e_ == cudaSuccess, "%s -> %s", #call, cudaGetErrorName(e_));                   \
    } while (0)

/* d = a b + c; b col-major when bcol; d stored col-major when dcol (then reloaded and stored
 * row-major into d2) */
__global__ void k_product(float *d, float *d2, const __nv_bfloat16 *a, const __nv_bfloat16 *b,
                          const float *c, int bcol, int dcol)
{
    fa_t fa;
    fc_t fc;
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fc, c, 16, wmma::mem_row_major);
    if (bcol) {
        fbc_t fb;
        wmma::load_matrix_sync(fb, b, 16);
        wmma::mma_sync(fc, fa, fb, fc);
    } else {
        fbr_t fb;
        wmma::load_matrix_sync(fb, b, 16);
        wmma::mma_sync(fc, fa, fb, fc);
    }
    wmma::store_matrix_sync(d, fc, 16, dcol ? wmma::mem_col_major : wmma::mem_row_major);
    __syncwarp();
    fc_t re;
    wmma::fill_fragment(re, -1.0f);
    wmma::load_matrix_sync(re, d, 16, dcol ? wmma::mem_col_major : wmma::mem_row_major);
    wmma::store_matrix_sync(d2, re, 16, wmma::mem_row_major);
}

/* d = 2 (a b), stored by store_matrix_sync (hw = 0) or by the hardware's layout (hw = 1) */
__global__ void k_layout(float *d, const __nv_bfloat16 *a, const __nv_bfloat16 *b, int hw)
{
    fa_t fa;
    fbr_t fb;
    fc_t fc;
    wmma::fill_fragment(fc, 0.0f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(fc, fa, fb, fc);
    for (int e = 0; e < fc.num_elements; e++) {
        fc.x[e] *= 2.0f;
    }
    if (!hw) {
        wmma::store_matrix_sync(d, fc, 16, wmma::mem_row_major);
        return;
    }
    int l = (int)threadIdx.x;
    for (int e = 0; e < fc.num_elements; e++) {
        int row = l / 4 + 8 * (e / 2 % 2), col = 2 * (l % 4) + e % 2 + 8 * (e / 4);
        d[row * 16 + col] = fc.x[e];
    }
}

__global__ void k_exited(float *d)
{
    if (threadIdx.x == 31) {
        return;
    }
    fc_t fc;
    wmma::fill_fragment(fc, 1.0f);
    wmma::store_matrix_sync(d, fc, 16, wmma::mem_row_major);
}

__global__ void k_misaligned(float *d)
{
    fc_t fc;
    wmma::fill_fragment(fc, 1.0f);
    wmma::store_matrix_sync(d + 1, fc, 16, wmma::mem_row_major);
}

template <typename T> static T *to_dev(const std::vector<T> &h)
{
    void *p = nullptr;
    CK(cudaMalloc(&p, h.size() * sizeof(T)));
    CK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return static_cast<T *>(p);
}

static std::vector<float> to_host(const float *d, size_t n)
{
    std::vector<float> h(n);
    CK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

struct inputs {
    std::vector<float> a, b, c;        /* a, b: bf16 values */
    std::vector<__nv_bfloat16> ah, bh; /* a row-major, b row-major */
    std::vector<__nv_bfloat16> bt;     /* b col-major */
};

static inputs make_inputs(uint64_t seed)
{
    zr_test_rng rng = {seed};
    inputs in;
    for (int i = 0; i < 256; i++) {
        in.ah.push_back(__float2bfloat16(zr_test_rng_uniform(&rng)));
        in.bh.push_back(__float2bfloat16(zr_test_rng_uniform(&rng)));
        in.c.push_back(0.5f * zr_test_rng_uniform(&rng));
        in.a.push_back(__bfloat162float(in.ah[i]));
        in.b.push_back(__bfloat162float(in.bh[i]));
    }
    in.bt.resize(256);
    for (int k = 0; k < 16; k++) {
        for (int j = 0; j < 16; j++) {
            in.bt[j * 16 + k] = in.bh[k * 16 + j];
        }
    }
    return in;
}

/* a b (+ c), k = 0..15 in order, one rounding per step */
static std::vector<float> ref_product(const inputs &in, bool with_c)
{
    std::vector<float> d(256);
    for (int i = 0; i < 16; i++) {
        for (int j = 0; j < 16; j++) {
            float acc = with_c ? in.c[i * 16 + j] : 0.0f;
            for (int k = 0; k < 16; k++) {
                acc += in.a[i * 16 + k] * in.b[k * 16 + j];
            }
            d[i * 16 + j] = acc;
        }
    }
    return d;
}

static void test_product(void)
{
    inputs in = make_inputs(42);
    std::vector<float> want = ref_product(in, true);
    __nv_bfloat16 *a = to_dev(in.ah), *b = to_dev(in.bh), *bt = to_dev(in.bt);
    float *c = to_dev(in.c), *d = to_dev(std::vector<float>(256)), *d2 = to_dev(in.c);
    for (int mode = 0; mode < 4; mode++) {
        int bcol = mode & 1, dcol = mode >> 1;
        ZR_LAUNCH(k_product, 1, 32, 0, 0, d, d2, a, bcol ? bt : b, c, bcol, dcol);
        CK(cudaDeviceSynchronize());
        std::vector<float> got = to_host(d, 256), again = to_host(d2, 256);
        for (int i = 0; i < 16; i++) {
            for (int j = 0; j < 16; j++) {
                float g = dcol ? got[j * 16 + i] : got[i * 16 + j];
                TEST_CHECKF(g == want[i * 16 + j] && again[i * 16 + j] == want[i * 16 + j],
                            "b %s, d %s: d[%d][%d] = %g (reloaded %g), want %g",
                            bcol ? "col" : "row", dcol ? "col" : "row", i, j, g, again[i * 16 + j],
                            want[i * 16 + j]);
            }
        }
    }
    for (void *p : {(void *)a, (void *)b, (void *)bt, (void *)c, (void *)d, (void *)d2}) {
        CK(cudaFree(p));
    }
}

static void test_layout(void)
{
    inputs in = make_inputs(7);
    std::vector<float> want = ref_product(in, false);
    __nv_bfloat16 *a = to_dev(in.ah), *b = to_dev(in.bh);
    float *d = to_dev(std::vector<float>(256));
    int wrong[2] = {0, 0};
    for (int hw = 0; hw < 2; hw++) {
        ZR_LAUNCH(k_layout, 1, 32, 0, 0, d, a, b, hw);
        CK(cudaDeviceSynchronize());
        std::vector<float> got = to_host(d, 256);
        for (int i = 0; i < 256; i++) {
            wrong[hw] += got[i] != 2.0f * want[i];
        }
    }
    TEST_CHECKF(wrong[0] == 0, "layout-independent use: %d of 256 elements wrong", wrong[0]);
    TEST_CHECKF(wrong[1] > 128, "the hardware's layout assumed: only %d of 256 elements wrong",
                wrong[1]);
    for (void *p : {(void *)a, (void *)b, (void *)d}) {
        CK(cudaFree(p));
    }
}

static void expect_emu_error(const char *what, std::initializer_list<const char *> parts)
{
    cudaError_t e = cudaDeviceSynchronize();
    TEST_CHECKF(e == cudaErrorLaunchFailure, "%s: synchronize -> %s, want the sticky failure", what,
                cudaGetErrorName(e));
    char msg[4096];
    int n = zr_emu_take_errors(msg, sizeof msg);
    TEST_CHECKF(n == 1, "%s: %d emulator errors, want 1", what, n);
    for (const char *p : parts) {
        TEST_CHECKF(strstr(msg, p) != nullptr, "%s: the message lacks \"%s\": %s", what, p, msg);
    }
    TEST_EQ_INT(cudaGetLastError(), cudaSuccess);
    CK(cudaDeviceSynchronize());
}

static void test_errors(void)
{
    float *d = to_dev(std::vector<float>(512));
    ZR_LAUNCH(k_exited, 1, 32, 0, 0, d);
    expect_emu_error("a lane exited", {"wmma::store_matrix_sync", "all 32 lanes", "0x80000000"});
    ZR_LAUNCH(k_misaligned, 1, 32, 0, 0, d);
    expect_emu_error("misaligned", {"wmma::store_matrix_sync", "32-byte aligned"});
    CK(cudaFree(d));
}

int main(void)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        printf("skipped: no CUDA device (%s)\n", cudaGetErrorName(e));
        printf("0 passed, 0 failed\n");
        return 0;
    }
    TEST_RUN(test_product);
    TEST_RUN(test_layout);
    TEST_RUN(test_errors);
    return zr_test_finish();
}
