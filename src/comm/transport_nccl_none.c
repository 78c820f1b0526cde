/*
 * transport_nccl_none.c - zr_transport_nccl in a build without NCCL (or
 * without CUDA): the Makefile compiles it instead of transport_nccl.c. Its
 * init fails, saying which of the two the build lacks, so no exchange ever
 * reaches the table.
 */
#include "comm_impl.h"

#include "zr/device.h"

static zr_status nccl_unavailable(zr_comm *c, const void *arg, void **state)
{
    (void)c;
    (void)arg;
    *state = NULL;
    if (zr_device_cuda_built()) {
        ZR_FAIL(ZR_ERR_DEVICE, "NCCL transport: zr was built without NCCL (none found in "
                               "CUDA_HOME or NCCL_HOME); use the staged transport");
    }
    ZR_FAIL(ZR_ERR_DEVICE, "NCCL transport: zr was built without CUDA (make CUDA=0, or no nvcc)");
}

/* Never called: init fails, so no exchange ever reaches the table. */
static zr_status nccl_none_iexchange(zr_comm *c, zr_group g, const void *send, const size_t *scount,
                                     const size_t *sdisp, void *recv, const size_t *rcount,
                                     const size_t *rdisp, zr_request *req)
{
    (void)c, (void)g, (void)send, (void)scount, (void)sdisp, (void)recv, (void)rcount;
    (void)rdisp, (void)req;
    ZR_FAIL(ZR_ERR_INTERNAL, "NCCL transport: not in this build");
}

static zr_status nccl_none_test(zr_comm *c, zr_request *req, int *done, int *progressed)
{
    (void)c, (void)req;
    *done = 1;
    *progressed = 0;
    return ZR_OK;
}

static int nccl_none_pending(const zr_comm *c, const zr_request *req, zr_pending *out, int max)
{
    (void)c, (void)req, (void)out, (void)max;
    return 0;
}

static void nccl_none_release(zr_comm *c, zr_request *req)
{
    (void)c;
    req->impl = NULL;
}

const zr_transport zr_transport_nccl = {
    .version = ZR_TRANSPORT_VERSION,
    .name = "nccl",
    .init = nccl_unavailable,
    .iexchange = nccl_none_iexchange,
    .test = nccl_none_test,
    .pending = nccl_none_pending,
    .release = nccl_none_release,
};

int zr_comm_nccl_built(void)
{
    return 0;
}
