/*
 * cublaslt.cpp - the GPU emulator's cuBLASLt (tests/emu, issue 42): handles,
 * the three descriptors, a heuristic that returns one algorithm, and
 * cublasLtMatmul with the epilogues zr uses, run on OpenBLAS by the worker of
 * the call's stream, in stream order (include/cublasLt.h says what is kept
 * and what is refused).
 *
 * The checks are cuBLASLt's (layout shapes against the transposes, types,
 * the auxiliary leading dimension a multiple of 8, a bias and an auxiliary
 * pointer where the epilogue needs them), then the emulated cuBLAS's: every
 * operand's extent inside one device allocation of the stream's device, and
 * those extents the race detector's accesses. The product accumulates in fp32
 * (cblas_sgemm, bf16 widened); alpha, beta C, the bias and the GELU (tanh
 * form, as cuBLASLt's and zr's CPU op) in fp32; D and the auxiliary output
 * rounded once to their type, to nearest even. DGELU multiplies the product
 * by gelu'(aux), aux widened from its type.
 */
#include "emu.h"

#include "cublasLt.h"
#include "cuda_bf16.h"

#include <cblas.h>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

using namespace zr_emu;

struct cublasLtContext {
    int device = 0;
};

struct cublasLtMatmulDescOpaque_t {
    cublasComputeType_t compute;
    cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
    uint32_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    const void *bias = nullptr;
    void *aux = nullptr;
    int64_t aux_ld = 0;
};

struct cublasLtMatrixLayoutOpaque_t {
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld;
};

struct cublasLtMatmulPreferenceOpaque_t {
    uint64_t workspace = 0;
    uint32_t align[4] = {256, 256, 256, 256}; /* A, B, C, D */
};

namespace {

const uint64_t ALGO_MAGIC = 0x7a72656d756c74ULL; /* "zremult" */

size_t tsize(cudaDataType t)
{
    return t == CUDA_R_32F ? 4 : 2;
}

float ld_elem(const void *base, cudaDataType t, size_t i)
{
    if (t == CUDA_R_32F) {
        float v;
        memcpy(&v, static_cast<const char *>(base) + 4 * i, 4);
        return v;
    }
    unsigned short h;
    memcpy(&h, static_cast<const char *>(base) + 2 * i, 2);
    return bf16_widen(h);
}

void st_elem(void *base, cudaDataType t, size_t i, float v)
{
    if (t == CUDA_R_32F) {
        memcpy(static_cast<char *>(base) + 4 * i, &v, 4);
    } else {
        unsigned short h = bf16_rn(v);
        memcpy(static_cast<char *>(base) + 2 * i, &h, 2);
    }
}

float gelu(float x)
{
    float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

float gelu_grad(float x)
{
    float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    float t = tanhf(u);
    return 0.5f * (1.0f + t) +
           x * 0.5f * (1.0f - t * t) * 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
}

bool epi_known(uint32_t e)
{
    return e == CUBLASLT_EPILOGUE_DEFAULT || e == CUBLASLT_EPILOGUE_BIAS ||
           e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
           e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
           e == CUBLASLT_EPILOGUE_DGELU;
}

bool epi_bias(uint32_t e)
{
    return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS ||
           e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}

bool epi_aux(uint32_t e)
{
    return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
           e == CUBLASLT_EPILOGUE_DGELU;
}

/* What a matmul's descriptors say, checked: m x n = op(A) op(B), k. */
struct shape {
    int m, n, k;
};

cublasStatus_t check(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                     cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D, shape *s)
{
    if (d == nullptr || A == nullptr || B == nullptr || C == nullptr || D == nullptr) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    uint64_t am = d->ta == CUBLAS_OP_N ? A->rows : A->cols;
    uint64_t ak = d->ta == CUBLAS_OP_N ? A->cols : A->rows;
    uint64_t bk = d->tb == CUBLAS_OP_N ? B->rows : B->cols;
    uint64_t bn = d->tb == CUBLAS_OP_N ? B->cols : B->rows;
    if (ak != bk || am != D->rows || bn != D->cols || C->rows != D->rows || C->cols != D->cols ||
        C->ld != D->ld || C->type != D->type) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    for (cublasLtMatrixLayout_t l : {A, B, D}) {
        if (l->ld < (int64_t)(l->rows > 1 ? l->rows : 1) || l->rows > INT32_MAX ||
            l->cols > INT32_MAX) {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    }
    bool f32 = A->type == CUDA_R_32F;
    if ((!f32 && A->type != CUDA_R_16BF) || B->type != A->type || D->type != A->type) {
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!epi_known(d->epi)) {
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if ((epi_bias(d->epi) && d->bias == nullptr) || (epi_aux(d->epi) && d->aux == nullptr)) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (epi_aux(d->epi) && (d->aux_ld % 8 != 0 || d->aux_ld < (int64_t)D->rows)) {
        return CUBLAS_STATUS_NOT_SUPPORTED; /* cuBLASLt: the aux ld a multiple of 8 */
    }
    s->m = (int)am;
    s->n = (int)bn;
    s->k = (int)ak;
    return CUBLAS_STATUS_SUCCESS;
}

/* [p, p + bytes) inside one device allocation of device; its access recorded. Under api_mutex. */
bool extent_ok(const char *name, const void *p, size_t bytes, int device,
               std::vector<mem_access> *acc, bool write)
{
    if (bytes == 0) {
        return true;
    }
    alloc_view v = alloc_find(p);
    if (p == nullptr || v.kind != MEM_DEVICE || v.device != device) {
        std::string freed = alloc_freed_note(p);
        emu_error("cublasLtMatmul: operand %s = %p is %s", name, p,
                  !freed.empty()         ? freed.c_str()
                  : v.kind == MEM_DEVICE ? "memory of another device"
                                         : "not device memory (cuBLASLt needs cudaMalloc memory)");
        return false;
    }
    if (bytes > v.base + v.size - (uintptr_t)p) {
        emu_error("cublasLtMatmul: operand %s [%p, +%zu bytes) runs past the end of its device "
                  "allocation (#%llu, %zu bytes)",
                  name, p, bytes, (unsigned long long)v.serial, v.size);
        return false;
    }
    acc->push_back(mem_access{p, bytes, write, std::string("cuBLASLt operand ") + name});
    return true;
}

size_t span(cublasLtMatrixLayout_t l)
{
    return l->rows == 0 || l->cols == 0 ? 0 : (size_t)((l->cols - 1) * l->ld + l->rows);
}

struct lt_op : op {
    cublasLtMatmulDescOpaque_t d;
    cublasLtMatrixLayoutOpaque_t la, lb, lc;
    const void *A, *B, *C;
    void *D;
    shape s;
    float alpha, beta;

    void widen(const void *p, const cublasLtMatrixLayoutOpaque_t &l, std::vector<float> *out)
    {
        out->resize(l.rows * l.cols);
        for (uint64_t c = 0; c < l.cols; c++) {
            for (uint64_t r = 0; r < l.rows; r++) {
                (*out)[c * l.rows + r] = ld_elem(p, l.type, c * (uint64_t)l.ld + r);
            }
        }
    }
    void run() override
    {
        if (sticky_error() != cudaSuccess) {
            return;
        }
        std::vector<float> fa, fb, fc((size_t)s.m * (size_t)s.n, 0.0f);
        widen(A, la, &fa);
        widen(B, lb, &fb);
        if (beta != 0.0f) {
            widen(C, lc, &fc);
        }
        if (s.k > 0) {
            cblas_sgemm(CblasColMajor, d.ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                        d.tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, s.m, s.n, s.k, alpha,
                        fa.data(), la.rows > 0 ? (int)la.rows : 1, fb.data(),
                        lb.rows > 0 ? (int)lb.rows : 1, beta, fc.data(), s.m > 0 ? s.m : 1);
        } else {
            for (float &v : fc) {
                v *= beta;
            }
        }
        cudaDataType t = lc.type;
        for (int col = 0; col < s.n; col++) {
            for (int r = 0; r < s.m; r++) {
                float v = fc[(size_t)col * (size_t)s.m + (size_t)r];
                size_t ai = (size_t)col * (size_t)d.aux_ld + (size_t)r;
                if (epi_bias(d.epi)) {
                    v += ld_elem(d.bias, t, (size_t)r);
                }
                if (d.epi == CUBLASLT_EPILOGUE_DGELU) {
                    v *= gelu_grad(ld_elem(d.aux, t, ai));
                } else if (d.epi & CUBLASLT_EPILOGUE_GELU) {
                    if (epi_aux(d.epi)) {
                        st_elem(d.aux, t, ai, v);
                    }
                    v = gelu(v);
                }
                st_elem(D, t, (size_t)col * (size_t)lc.ld + (size_t)r, v);
            }
        }
    }
};

uint32_t align_of(const void *p)
{
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a != 0) {
        a /= 2;
    }
    return a;
}

} // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle)
{
    if (lightHandle == nullptr) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    *lightHandle = nullptr;
    if (api_enter("cublasLtCreate") != cudaSuccess) {
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    auto *h = new cublasLtContext;
    h->device = current_device();
    *lightHandle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle)
{
    if (lightHandle == nullptr) {
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    delete lightHandle; /* queued matmuls hold copies of everything they need */
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasLtGetStatusName(cublasStatus_t status)
{
    return cublasGetStatusName(status);
}

const char *cublasLtGetStatusString(cublasStatus_t status)
{
    return cublasGetStatusString(status);
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
                                        cublasComputeType_t computeType, cudaDataType_t scaleType)
{
    if (matmulDesc == nullptr) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    *matmulDesc = nullptr;
    if ((computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_32F_PEDANTIC) ||
        scaleType != CUDA_R_32F) {
        return CUBLAS_STATUS_NOT_SUPPORTED; /* what the emulator computes: plain fp32 */
    }
    auto *d = new cublasLtMatmulDescOpaque_t;
    d->compute = computeType;
    *matmulDesc = d;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc)
{
    delete matmulDesc;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t attr, const void *buf,
                                              size_t sizeInBytes)
{
    if (d == nullptr || buf == nullptr) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    int32_t i32;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB:
        if (sizeInBytes != sizeof i32) {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        memcpy(&i32, buf, sizeof i32);
        if (i32 != CUBLAS_OP_N && i32 != CUBLAS_OP_T) {
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
        (attr == CUBLASLT_MATMUL_DESC_TRANSA ? d->ta : d->tb) = (cublasOperation_t)i32;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        if (sizeInBytes != sizeof d->epi) {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        memcpy(&d->epi, buf, sizeof d->epi);
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
        if (sizeInBytes != sizeof(void *)) {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        if (attr == CUBLASLT_MATMUL_DESC_BIAS_POINTER) {
            memcpy(&d->bias, buf, sizeof(void *));
        } else {
            memcpy(&d->aux, buf, sizeof(void *));
        }
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
        if (sizeInBytes != sizeof d->aux_ld) {
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        memcpy(&d->aux_ld, buf, sizeof d->aux_ld);
        return CUBLAS_STATUS_SUCCESS;
    default:
        return CUBLAS_STATUS_NOT_SUPPORTED; /* zr sets no other attribute */
    }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld)
{
    if (matLayout == nullptr) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    *matLayout = nullptr;
    if (type != CUDA_R_32F && type != CUDA_R_16BF) {
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (ld < 1) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    *matLayout = new cublasLtMatrixLayoutOpaque_t{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout)
{
    delete matLayout;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    if (pref == nullptr) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    *pref = new cublasLtMatmulPreferenceOpaque_t;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t sizeInBytes)
{
    if (pref == nullptr || buf == nullptr) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES && sizeInBytes == sizeof(uint64_t)) {
        memcpy(&pref->workspace, buf, sizeof(uint64_t));
        return CUBLAS_STATUS_SUCCESS;
    }
    if (attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES &&
        attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES && sizeInBytes == sizeof(uint32_t)) {
        memcpy(&pref->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf,
               sizeof(uint32_t));
        return CUBLAS_STATUS_SUCCESS;
    }
    return sizeInBytes == 0 ? CUBLAS_STATUS_INVALID_VALUE : CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int *returnAlgoCount)
{
    if (lightHandle == nullptr) {
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    if (preference == nullptr || requestedAlgoCount < 1 || heuristicResultsArray == nullptr ||
        returnAlgoCount == nullptr) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    *returnAlgoCount = 0;
    shape s;
    cublasStatus_t st = check(operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &s);
    if (st != CUBLAS_STATUS_SUCCESS) {
        return st;
    }
    const char *none = getenv("ZR_EMU_LT_NO_ALGO"); /* tests: a GPU with no algorithm for it */
    if (none != nullptr && strcmp(none, "0") != 0) {
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    cublasLtMatmulHeuristicResult_t r;
    memset(&r, 0, sizeof r);
    r.algo.data[0] = ALGO_MAGIC;
    for (int i = 0; i < 4; i++) {
        r.algo.data[1 + i] = preference->align[i]; /* what the algorithm assumes */
    }
    r.workspaceSize = 0;
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.0f;
    heuristicResultsArray[0] = r;
    *returnAlgoCount = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t d,
                              const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                              const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                              void * /* workspace */, size_t /* workspaceSizeInBytes */,
                              cudaStream_t stream)
{
    const char *call = "cublasLtMatmul";
    if (lightHandle == nullptr) {
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    if (api_enter(call) != cudaSuccess) {
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    if (alpha == nullptr || beta == nullptr || algo == nullptr || algo->data[0] != ALGO_MAGIC) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    shape s;
    cublasStatus_t st = check(d, Adesc, Bdesc, Cdesc, Ddesc, &s);
    if (st != CUBLAS_STATUS_SUCCESS) {
        return st;
    }
    const void *ptrs[4] = {A, B, C, D};
    for (int i = 0; i < 4; i++) {
        if (align_of(ptrs[i]) < algo->data[1 + i]) {
            return CUBLAS_STATUS_NOT_SUPPORTED; /* the algorithm assumes more alignment */
        }
    }
    float fa, fb;
    memcpy(&fa, alpha, sizeof fa); /* host pointer mode: read at the call */
    memcpy(&fb, beta, sizeof fb);
    if (fb != 0.0f && C != D) {
        return CUBLAS_STATUS_NOT_SUPPORTED; /* zr accumulates in place only */
    }
    if (s.m == 0 || s.n == 0) {
        return CUBLAS_STATUS_SUCCESS;
    }
    std::lock_guard<std::mutex> lock(api_mutex());
    zr_emu_stream *zs = resolve_stream(stream);
    if (zs == nullptr) {
        emu_error("%s: the stream is not a live stream", call);
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    size_t es = tsize(Ddesc->type);
    size_t aux_bytes = ((size_t)(s.n - 1) * (size_t)d->aux_ld + (size_t)s.m) * es;
    std::vector<mem_access> acc;
    bool ok = s.k == 0 || (extent_ok("A", A, span(Adesc) * es, zs->device, &acc, false) &&
                           extent_ok("B", B, span(Bdesc) * es, zs->device, &acc, false));
    ok = ok &&
         (fb == 0.0f || D == C || extent_ok("C", C, span(Cdesc) * es, zs->device, &acc, false));
    ok = ok && extent_ok("D", D, span(Ddesc) * es, zs->device, &acc, true);
    ok = ok && (!epi_bias(d->epi) ||
                extent_ok("bias", d->bias, (size_t)s.m * es, zs->device, &acc, false));
    ok = ok && (!epi_aux(d->epi) || extent_ok("aux", d->aux, aux_bytes, zs->device, &acc,
                                              d->epi != CUBLASLT_EPILOGUE_DGELU));
    if (!ok) {
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    auto *o = new lt_op;
    o->d = *d;
    o->la = *Adesc;
    o->lb = *Bdesc;
    o->lc = *Ddesc;
    o->A = A;
    o->B = B;
    o->C = C;
    o->D = D;
    o->s = s;
    o->alpha = fa;
    o->beta = fb;
    if (enqueue(zs, o, call, acc) != cudaSuccess) {
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    count_gemm(); /* the launch counters (zr_emu_launch_counts): one GEMM call */
    return CUBLAS_STATUS_SUCCESS;
}

} /* extern "C" */
