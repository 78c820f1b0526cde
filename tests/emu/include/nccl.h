/*
 * nccl.h - the GPU emulator's NCCL (tests/emu, issue 23).
 *
 * The subset of NCCL 2.28's API that zr calls, with NCCL's names, numbers
 * and signatures, implemented by libzremu.a over MPI on host memory (the
 * emulated device memory is host memory): every operation is queued on its
 * CUDA stream and runs there in stream order, so the NCCL transport's code
 * path - events, stream waits, grouped sends and receives, asynchronous
 * errors, aborts - runs in the CPU test suite. Valid C11 and C++, like the
 * real header; nothing here needs a CUDA toolkit.
 *
 * What the emulator adds to NCCL's rules (tests/emu/README.md, "NCCL"):
 *   - MPI must be initialised; the ranks of a communicator are MPI processes
 *     of MPI_COMM_WORLD, and the rank that called ncclGetUniqueId must be
 *     one of the ranks that call ncclCommInitRank with its id;
 *   - the emulator calls MPI only from the thread that created the first
 *     communicator (MPI_Init's thread level is enough); the bytes move when
 *     that thread calls into NCCL or waits on the CUDA runtime (a
 *     synchronisation, a query), which is where zr's waits poll;
 *   - ranks of one emulated node (ZR_RANKS_PER_NODE consecutive world ranks,
 *     else the host) share its emulated GPUs, so two ranks on one GPU are
 *     refused as NCCL 2.5-2.29 refuses them ("Duplicate GPU detected",
 *     ncclInvalidUsage); ZR_EMU_NCCL_VERSION (default 22809) sets the version
 *     reported, and from 23000 NCCL_MULTI_RANK_GPU_ENABLE=1 allows them.
 */
#ifndef ZR_EMU_NCCL_H
#define ZR_EMU_NCCL_H

#include "cuda_runtime_api.h"

#include <limits.h>
#include <stddef.h>

#define NCCL_MAJOR        2
#define NCCL_MINOR        28
#define NCCL_PATCH        9
#define NCCL_SUFFIX       ""
#define NCCL_VERSION_CODE 22809
#define NCCL_VERSION(X, Y, Z)                                                                      \
    (((X) <= 2 && (Y) <= 8) ? (X)*1000 + (Y)*100 + (Z) : (X)*10000 + (Y)*100 + (Z))

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclComm *ncclComm_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

/* The numbers are NCCL's. */
typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR    -1

/* Accepted and ignored (blocking communicators only). */
typedef struct ncclConfig_v22800 {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
    int cgaClusterSize;
    int minCTAs;
    int maxCTAs;
    const char *netName;
    int splitShare;
    int trafficClass;
    const char *commName;
    int collnetEnable;
    int CTAPolicy;
    int shrinkShare;
    int nvlsCTAs;
    int nChannelsPerNetPeer;
    int nvlinkCentricSched;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                                    \
    {                                                                                              \
        sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH),        \
            NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                   \
            NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,                   \
            NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,                   \
            NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                   \
            NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT                                           \
    }

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;

typedef enum {
    ncclInt8 = 0,
    ncclChar = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclInt = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6, /* not emulated: ncclInvalidArgument */
    ncclHalf = 6,
    ncclFloat32 = 7,
    ncclFloat = 7,
    ncclFloat64 = 8,
    ncclDouble = 8,
    ncclBfloat16 = 9,
    ncclNumTypes = 10
} ncclDataType_t;

ncclResult_t ncclGetVersion(int *version);
const char *ncclGetErrorString(ncclResult_t result);
const char *ncclGetLastError(ncclComm_t comm);

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);

ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* ZR_EMU_NCCL_H */
