/*
 * coll_nocuda.c - the device part of a collective (coll_impl.h) in a build
 * without CUDA: the Makefile compiles it instead of coll_local_cuda.c.
 * zr_comm_device is then always NULL, so no op gets here; a start fails
 * with "built without CUDA", so no other member is ever reached.
 */
#include "coll_impl.h"

struct zr_coll_dev {
    int unused;
};

void zr_coll_dev_free(zr_coll_dev *dev)
{
    ZR_ASSERT(dev == NULL);
}

static zr_status refuse_start(zr_coll_dev **dev, const zr_device *d, zr_stream *follow)
{
    (void)dev;
    (void)d;
    (void)follow;
    ZR_FAIL(ZR_ERR_DEVICE, "collective on a device: zr was built without CUDA");
}

/* no other functions: the start fails first, so no op ever reaches them */
const zr_coll_local zr_coll_local_cuda = {.name = "cuda", .start = refuse_start};
