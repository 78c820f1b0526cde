/*
 * transport_device.c - the steps the two device transports share
 * (transport_device.h): their common state, events from a pool, the start of
 * an exchange after the followed stream's work, the block for myself, and
 * zr_comm_device_follow.
 *
 * Order without host waits. An exchange's own streams wait for an event
 * recorded on the followed stream when the exchange starts, so it reads its
 * send buffer only after the work that wrote it; the caller learns that it
 * is over from an event the transport polls (cudaEventQuery), after which
 * anything it queues is ordered after the exchange. The block for myself is
 * a device-to-device copy on the followed stream; its completion event goes
 * with the next exchange (every exchange with a block for myself is started
 * right after its copy, exchange.c), so that exchange completes only when
 * its whole receive buffer is in place.
 *
 * Compiled only where CUDA is built; comm_nocuda.c stands in without.
 */
#include "transport_device.h"

#include <string.h>

zr_status zr_devx_init(zr_devx *x, const zr_transport *owner, const void *arg, const char *who)
{
    const zr_transport_device *a = arg;
    memset(x, 0, sizeof *x);
    x->owner = owner;
    if (a == NULL || a->device == NULL || a->device->kind != ZR_DEVICE_CUDA) {
        ZR_FAIL(ZR_ERR_INVALID, "the %s transport needs a zr_transport_device with a CUDA device",
                who);
    }
    x->dev = *a->device;
    if (a->stream != NULL && zr_stream_device(a->stream)->ordinal != x->dev.ordinal) {
        ZR_FAIL(ZR_ERR_INVALID, "the %s transport: the stream to follow is on cuda:%d, not cuda:%d",
                who, zr_stream_device(a->stream)->ordinal, x->dev.ordinal);
    }
    ZR_CUDA_CHECK(cudaSetDevice(x->dev.ordinal));
    x->follow = a->stream != NULL ? zr_stream_cuda(a->stream) : NULL;
    x->follow_s = a->stream;
    ZR_CUDA_CHECK(cudaEventCreateWithFlags(&x->ready, cudaEventDisableTiming));
    return ZR_OK;
}

void zr_devx_free(zr_devx *x)
{
    for (int i = 0; i < x->npool; i++) {
        cudaEventDestroy(x->pool[i]);
    }
    zr_free(x->pool);
    if (x->self_done != NULL) {
        cudaEventDestroy(x->self_done);
    }
    if (x->ready != NULL) {
        cudaEventDestroy(x->ready);
    }
    memset(x, 0, sizeof *x);
}

zr_status zr_devx_event(zr_devx *x, cudaEvent_t *e)
{
    if (x->npool > 0) {
        *e = x->pool[--x->npool];
        return ZR_OK;
    }
    ZR_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    return ZR_OK;
}

void zr_devx_put(zr_devx *x, cudaEvent_t e)
{
    if (e == NULL) {
        return;
    }
    if (x->npool == x->cap) {
        int cap = x->cap ? 2 * x->cap : 16;
        cudaEvent_t *grown = NULL;
        if (ZR_ALLOC_STATUS(grown, (size_t)cap) != ZR_OK) {
            cudaEventDestroy(e); /* no room to keep it: the pool just stays smaller */
            return;
        }
        if (x->npool > 0) {
            memcpy(grown, x->pool, sizeof *grown * (size_t)x->npool);
        }
        zr_free(x->pool);
        x->pool = grown;
        x->cap = cap;
    }
    x->pool[x->npool++] = e;
}

zr_status zr_devx_after_follow(zr_devx *x, cudaStream_t s)
{
    /* a wait takes the record made before it, so one event serves every exchange */
    ZR_CUDA_CHECK(cudaEventRecord(x->ready, x->follow));
    ZR_CUDA_CHECK(cudaStreamWaitEvent(s, x->ready, 0));
    return ZR_OK;
}

zr_status zr_devx_self_copy(zr_comm *c, void *dst, const void *src, size_t bytes)
{
    zr_devx *x = c->transport_state;
    ZR_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, x->follow));
    if (x->self_done == NULL) {
        ZR_CHECK(zr_devx_event(x, &x->self_done));
    }
    ZR_CUDA_CHECK(cudaEventRecord(x->self_done, x->follow));
    return ZR_OK;
}

cudaEvent_t zr_devx_take_self(zr_devx *x)
{
    cudaEvent_t e = x->self_done;
    x->self_done = NULL;
    return e;
}

zr_status zr_devx_query(cudaEvent_t e, int *done)
{
    *done = 1;
    if (e == NULL) {
        return ZR_OK;
    }
    cudaError_t err = cudaEventQuery(e);
    if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();
        *done = 0;
        return ZR_OK;
    }
    ZR_CUDA_CHECK(err);
    return ZR_OK;
}

/* c's device transport state, or NULL when c moves host memory. */
static zr_devx *devx_of(const zr_comm *c)
{
    zr_devx *x = c->transport_state;
    if (x == NULL || (c->transport != &zr_transport_nccl && c->transport != &zr_transport_staged) ||
        x->owner != c->transport) {
        return NULL;
    }
    return x;
}

const zr_device *zr_comm_device(const zr_comm *c, zr_stream **follow)
{
    const zr_devx *x = devx_of(c);
    if (follow != NULL) {
        *follow = x != NULL ? x->follow_s : NULL;
    }
    return x != NULL ? &x->dev : NULL;
}

zr_status zr_comm_device_follow(zr_comm *c, zr_stream *s)
{
    zr_devx *x = devx_of(c);
    if (x == NULL) {
        ZR_FAIL(ZR_ERR_INVALID, "zr_comm_device_follow: the transport is %s, not a device one",
                c->transport != NULL ? c->transport->name : "none");
    }
    if (s != NULL && zr_stream_device(s)->ordinal != x->dev.ordinal) {
        ZR_FAIL(ZR_ERR_INVALID, "zr_comm_device_follow: the stream is on cuda:%d, not cuda:%d",
                zr_stream_device(s)->ordinal, x->dev.ordinal);
    }
    x->follow = s != NULL ? zr_stream_cuda(s) : NULL;
    x->follow_s = s;
    return ZR_OK;
}
