/*
 * cublas.cpp - the GPU emulator's cuBLAS (tests/emu, issue 24): handles and
 * the two GEMM calls zr makes, executed on OpenBLAS by the worker of the
 * handle's stream, in stream order (include/cublas_v2.h says what is kept
 * and what is refused).
 *
 * A call is checked as cuBLAS checks it (sizes, leading dimensions, types:
 * CUBLAS_STATUS_INVALID_VALUE or _NOT_SUPPORTED), then each operand's whole
 * extent must lie in one device allocation of the stream's device (a GPU
 * would fault otherwise: an emulator error here), and the operation is
 * queued with those extents as its accesses for the race detector. The
 * worker widens bf16 operands to fp32, runs cblas_sgemm (column-major, as
 * cuBLAS), and rounds the result back to the output type to nearest even.
 */
#include "emu.h"

#include "cublas_v2.h"
#include "cuda_bf16.h"

#include <cblas.h>
#include <vector>

using namespace zr_emu;

struct cublasContext {
    cudaStream_t stream = nullptr;
    int device = 0;
    cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

namespace {

size_t type_size(cudaDataType t)
{
    return t == CUDA_R_32F ? 4 : 2;
}

/* One column-major operand of one batch entry: rows x cols at ld. */
struct operand {
    const void *p;
    cudaDataType type;
    int rows, cols, ld;
    long long stride;
    /* elements from the first to one past the last one of every batch entry */
    size_t span(int batch) const
    {
        if (rows == 0 || cols == 0) {
            return 0;
        }
        size_t one = (size_t)(cols - 1) * (size_t)ld + (size_t)rows;
        long long s = stride < 0 ? -stride : stride;
        return one + (size_t)(batch - 1) * (size_t)s;
    }
    /* entry b as fp32, column-major with leading dimension rows */
    void widen(int b, std::vector<float> *out) const
    {
        out->resize((size_t)rows * (size_t)cols);
        const char *base = static_cast<const char *>(p) + (long long)b * stride * type_size(type);
        for (int c = 0; c < cols; c++) {
            for (int r = 0; r < rows; r++) {
                size_t i = (size_t)c * (size_t)ld + (size_t)r;
                float v;
                if (type == CUDA_R_32F) {
                    memcpy(&v, base + 4 * i, 4);
                } else {
                    unsigned short h;
                    memcpy(&h, base + 2 * i, 2);
                    v = bf16_widen(h);
                }
                (*out)[(size_t)c * (size_t)rows + (size_t)r] = v;
            }
        }
    }
};

struct gemm_op : op {
    cublasOperation_t ta, tb;
    int m, n, k, batch;
    float alpha, beta;
    operand a, b, c;
    void run() override
    {
        if (sticky_error() != cudaSuccess) {
            return;
        }
        std::vector<float> fa, fb, fc;
        for (int e = 0; e < batch; e++) {
            a.widen(e, &fa);
            b.widen(e, &fb);
            if (beta != 0.0f) {
                c.widen(e, &fc);
            } else {
                fc.assign((size_t)m * (size_t)n, 0.0f); /* C is not read: NaN poison stays out */
            }
            if (k > 0) {
                cblas_sgemm(CblasColMajor, ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                            tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, m, n, k, alpha,
                            fa.data(), a.rows > 0 ? a.rows : 1, fb.data(), b.rows > 0 ? b.rows : 1,
                            beta, fc.data(), m > 0 ? m : 1);
            } else {
                for (float &v : fc) {
                    v = beta * v;
                }
            }
            char *base = static_cast<char *>(const_cast<void *>(c.p)) +
                         (long long)e * c.stride * type_size(c.type);
            for (int col = 0; col < n; col++) {
                for (int r = 0; r < m; r++) {
                    size_t i = (size_t)col * (size_t)c.ld + (size_t)r;
                    float v = fc[(size_t)col * (size_t)m + (size_t)r];
                    if (c.type == CUDA_R_32F) {
                        memcpy(base + 4 * i, &v, 4);
                    } else {
                        unsigned short h = bf16_rn(v);
                        memcpy(base + 2 * i, &h, 2);
                    }
                }
            }
        }
    }
};

/* The supported type combinations: all fp32, or bf16 inputs (bf16 or fp32 out). */
bool types_ok(cudaDataType at, cudaDataType bt, cudaDataType ct)
{
    if (at == CUDA_R_32F) {
        return bt == CUDA_R_32F && ct == CUDA_R_32F;
    }
    return at == CUDA_R_16BF && bt == CUDA_R_16BF && (ct == CUDA_R_16BF || ct == CUDA_R_32F);
}

/* An operand's extent inside one device allocation of the device; under api_mutex. */
bool operand_ok(const char *call, const char *name, const operand &o, int batch, int device,
                std::vector<mem_access> *acc, bool write)
{
    size_t bytes = o.span(batch) * type_size(o.type);
    if (bytes == 0) {
        return true;
    }
    if (o.p == nullptr || (o.stride < 0)) {
        emu_error("%s: operand %s is %s", call, name,
                  o.p == nullptr ? "NULL" : "given a negative batch stride");
        return false;
    }
    alloc_view v = alloc_find(o.p);
    if (v.kind != MEM_DEVICE || v.device != device) {
        std::string freed = alloc_freed_note(o.p);
        emu_error("%s: operand %s = %p is %s", call, name, o.p,
                  !freed.empty()         ? freed.c_str()
                  : v.kind == MEM_DEVICE ? "memory of another device"
                                         : "not device memory (cuBLAS needs cudaMalloc memory)");
        return false;
    }
    uintptr_t a = (uintptr_t)o.p;
    if (bytes > v.base + v.size - a) {
        emu_error("%s: operand %s [%p, +%zu bytes) runs %zu bytes past the end of its device "
                  "allocation (#%llu, %zu bytes at %#lx)",
                  call, name, o.p, bytes, (size_t)(a + bytes - (v.base + v.size)),
                  (unsigned long long)v.serial, v.size, (unsigned long)v.base);
        return false;
    }
    acc->push_back(mem_access{o.p, bytes, write, std::string("cuBLAS operand ") + name});
    return true;
}

cublasStatus_t gemm(const char *call, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                    int m, int n, int k, const void *alpha, const void *A, cudaDataType at, int lda,
                    long long sa, const void *B, cudaDataType bt, int ldb, long long sb,
                    const void *beta, void *C, cudaDataType ct, int ldc, long long sc, int batch,
                    cublasComputeType_t compute)
{
    if (h == nullptr) {
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    if (api_enter(call) != cudaSuccess) {
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T) ||
        m < 0 || n < 0 || k < 0 || batch < 0 || alpha == nullptr || beta == nullptr) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    operand oa{A, at, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda, sa};
    operand ob{B, bt, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb, sb};
    operand oc{C, ct, m, n, ldc, sc};
    if (lda < (oa.rows > 1 ? oa.rows : 1) || ldb < (ob.rows > 1 ? ob.rows : 1) ||
        ldc < (m > 1 ? m : 1)) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (!types_ok(at, bt, ct) ||
        (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_PEDANTIC)) {
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (m == 0 || n == 0 || batch == 0) {
        return CUBLAS_STATUS_SUCCESS;
    }
    std::lock_guard<std::mutex> lock(api_mutex());
    zr_emu_stream *s = resolve_stream(h->stream);
    if (s == nullptr) {
        emu_error("%s: the handle's stream is not a live stream", call);
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    std::vector<mem_access> acc;
    if ((k > 0 && (!operand_ok(call, "A", oa, batch, s->device, &acc, false) ||
                   !operand_ok(call, "B", ob, batch, s->device, &acc, false))) ||
        !operand_ok(call, "C", oc, batch, s->device, &acc, true)) {
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    auto *o = new gemm_op;
    o->ta = ta;
    o->tb = tb;
    o->m = m;
    o->n = n;
    o->k = k;
    o->batch = batch;
    memcpy(&o->alpha, alpha, sizeof(float)); /* host pointer mode: read at the call */
    memcpy(&o->beta, beta, sizeof(float));
    o->a = oa;
    o->b = ob;
    o->c = oc;
    if (enqueue(s, o, call, acc) != cudaSuccess) {
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    count_gemm();
    return CUBLAS_STATUS_SUCCESS;
}

} // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle)
{
    if (handle == nullptr) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    *handle = nullptr;
    if (api_enter("cublasCreate") != cudaSuccess) {
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    auto *h = new cublasContext;
    h->device = current_device();
    *handle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle)
{
    if (handle == nullptr) {
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    delete handle; /* queued GEMMs hold copies of everything they need */
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetVersion_v2(cublasHandle_t /* handle */, int *version)
{
    if (version == nullptr) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    *version = CUBLAS_VERSION;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId)
{
    if (handle == nullptr) {
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    handle->stream = streamId;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *streamId)
{
    if (handle == nullptr) {
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    if (streamId == nullptr) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    *streamId = handle->stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void * /* workspace */,
                                     size_t /* workspaceSizeInBytes */)
{
    return handle == nullptr ? CUBLAS_STATUS_NOT_INITIALIZED : CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode)
{
    if (handle == nullptr) {
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    return mode == CUBLAS_POINTER_MODE_HOST ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t *mode)
{
    if (handle == nullptr) {
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    if (mode == nullptr) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    *mode = CUBLAS_POINTER_MODE_HOST;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
    if (handle == nullptr) {
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    int base = (int)mode & ~(int)CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    if (base != CUBLAS_DEFAULT_MATH && base != CUBLAS_PEDANTIC_MATH) {
        return CUBLAS_STATUS_NOT_SUPPORTED; /* tensor-op math: results the emulator cannot give */
    }
    handle->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode)
{
    if (handle == nullptr) {
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    if (mode == nullptr) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    *mode = handle->math;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusName(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS:
        return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
        return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
        return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
        return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasGetStatusString(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS:
        return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "an unsupported value or parameter was passed to the function";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "the GPU program failed to execute";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "the functionality requested is not supported";
    default:
        return "an error occurred inside the (emulated) cuBLAS library";
    }
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t /* algo: one algorithm here */)
{
    return gemm("cublasGemmEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype,
                ldb, 0, beta, C, Ctype, ldc, 0, 1, computeType);
}

cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void *alpha, const void *A, cudaDataType Atype, int lda, long long int strideA,
    const void *B, cudaDataType Btype, int ldb, long long int strideB, const void *beta, void *C,
    cudaDataType Ctype, int ldc, long long int strideC, int batchCount,
    cublasComputeType_t computeType, cublasGemmAlgo_t /* algo: one algorithm here */)
{
    return gemm("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda,
                strideA, B, Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount,
                computeType);
}

} /* extern "C" */
