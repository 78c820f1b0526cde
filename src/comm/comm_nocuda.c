/*
 * comm_nocuda.c - the device half of the data plane in a build without
 * CUDA: the Makefile compiles it instead of transport_staged.c and
 * transport_device.c. The staged transport's init fails with "built without
 * CUDA", so no exchange ever reaches its table; no communicator has a device.
 */
#include "comm_impl.h"

static zr_status staged_unavailable(zr_comm *c, const void *arg, void **state)
{
    (void)c;
    (void)arg;
    *state = NULL;
    ZR_FAIL(ZR_ERR_DEVICE, "staged transport: zr was built without CUDA (make CUDA=0, or no nvcc)");
}

/* Never called: init fails, so no exchange ever reaches the table. */
static zr_status staged_none_iexchange(zr_comm *c, zr_group g, const void *send,
                                       const size_t *scount, const size_t *sdisp, void *recv,
                                       const size_t *rcount, const size_t *rdisp, zr_request *req)
{
    (void)c, (void)g, (void)send, (void)scount, (void)sdisp, (void)recv, (void)rcount;
    (void)rdisp, (void)req;
    ZR_FAIL(ZR_ERR_INTERNAL, "staged transport: not in this build");
}

static zr_status staged_none_test(zr_comm *c, zr_request *req, int *done, int *progressed)
{
    (void)c, (void)req;
    *done = 1;
    *progressed = 0;
    return ZR_OK;
}

static int staged_none_pending(const zr_comm *c, const zr_request *req, zr_pending *out, int max)
{
    (void)c, (void)req, (void)out, (void)max;
    return 0;
}

static void staged_none_release(zr_comm *c, zr_request *req)
{
    (void)c;
    req->impl = NULL;
}

const zr_transport zr_transport_staged = {
    .version = ZR_TRANSPORT_VERSION,
    .name = "staged",
    .init = staged_unavailable,
    .iexchange = staged_none_iexchange,
    .test = staged_none_test,
    .pending = staged_none_pending,
    .release = staged_none_release,
};

const zr_device *zr_comm_device(const zr_comm *c, zr_stream **follow)
{
    (void)c;
    if (follow != NULL) {
        *follow = NULL;
    }
    return NULL;
}

zr_status zr_comm_device_follow(zr_comm *c, zr_stream *s)
{
    (void)c;
    (void)s;
    ZR_FAIL(ZR_ERR_DEVICE, "zr_comm_device_follow: zr was built without CUDA");
}
