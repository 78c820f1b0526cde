/*
 * coll_nocuda.c - the device part of a collective (coll_impl.h) in a build
 * without CUDA: the Makefile compiles it instead of coll_local_cuda.c.
 * zr_comm_device is then always NULL, so no op gets here; a call fails with
 * "built without CUDA".
 */
#include "coll_impl.h"

struct zr_coll_dev {
    int unused;
};

zr_status zr_coll_dev_attach(zr_coll_dev **dev, const zr_device *d)
{
    (void)dev;
    (void)d;
    ZR_FAIL(ZR_ERR_DEVICE, "collective on a device: zr was built without CUDA");
}

void zr_coll_dev_free(zr_coll_dev *dev)
{
    ZR_ASSERT(dev == NULL);
}

const zr_device *zr_coll_dev_device(const zr_coll_dev *dev)
{
    (void)dev;
    ZR_ASSERT(!"no device part without CUDA");
    return NULL;
}

zr_status zr_coll_dev_start(zr_coll_dev *dev, zr_stream *follow)
{
    (void)dev;
    (void)follow;
    ZR_FAIL(ZR_ERR_DEVICE, "collective on a device: zr was built without CUDA");
}

zr_status zr_coll_dev_finish(zr_coll_dev *dev)
{
    (void)dev;
    ZR_FAIL(ZR_ERR_DEVICE, "collective on a device: zr was built without CUDA");
}

zr_status zr_coll_dev_poll(zr_comm *c, zr_coll_dev *dev, zr_coll_op *op, int block, int *done)
{
    (void)c;
    (void)dev;
    (void)op;
    (void)block;
    *done = 1;
    ZR_FAIL(ZR_ERR_DEVICE, "collective on a device: zr was built without CUDA");
}

void zr_coll_dev_drain(zr_coll_dev *dev)
{
    (void)dev;
}

zr_status zr_coll_dev_follow(zr_coll_dev *dev, zr_comm *c, zr_stream **prev)
{
    (void)dev;
    (void)c;
    *prev = NULL;
    ZR_FAIL(ZR_ERR_DEVICE, "collective on a device: zr was built without CUDA");
}

/* no functions: zr_coll_dev_attach fails first, so no op ever reaches the table */
const zr_coll_local zr_coll_local_cuda = {.name = "cuda", .device = 1};
