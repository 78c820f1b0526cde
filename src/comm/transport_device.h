/*
 * transport_device.h - what the two device transports share
 * (transport_nccl.c, transport_staged.c): the start of their state (the GPU,
 * the stream exchanges follow, a pool of events, the block for myself), and
 * the steps every device exchange takes: start after the followed stream's
 * work, copy the block for myself, look at an event without blocking.
 *
 * Each transport's state begins with a zr_devx, so the shared functions take
 * c->transport_state as one. Only the files built with CUDA include it.
 */
#ifndef ZR_TRANSPORT_DEVICE_H
#define ZR_TRANSPORT_DEVICE_H

#include "comm_impl.h"
#include "transport_plan.h"

#include "../base/device_impl.h"

typedef struct zr_devx {
    const zr_transport *owner; /* the table whose state this is (zr_comm_device_follow) */
    zr_device dev;
    cudaStream_t follow; /* exchanges start after its work (NULL: the legacy stream) */
    zr_stream *follow_s; /* the same as a zr_stream, for zr_comm_device (NULL: legacy) */
    cudaEvent_t ready;   /* recorded on follow when an exchange starts */
    cudaEvent_t *pool;   /* idle events */
    int npool, cap;
    /* the block for myself of the next exchange, copied on follow; NULL: none */
    cudaEvent_t self_done;
} zr_devx;

/* Check arg (a zr_transport_device on a CUDA device) and set up x; who names the transport. */
zr_status zr_devx_init(zr_devx *x, const zr_transport *owner, const void *arg, const char *who);
void zr_devx_free(zr_devx *x);

/* An event from the pool (created when the pool is empty), and back. */
zr_status zr_devx_event(zr_devx *x, cudaEvent_t *e);
void zr_devx_put(zr_devx *x, cudaEvent_t e);

/* Work queued on s from now on runs after the work queued on the followed stream so far. */
zr_status zr_devx_after_follow(zr_devx *x, cudaStream_t s);

/* zr_transport.self_copy of both: device to device on the followed stream, then an event that
 * the next exchange takes (zr_devx_take_self), so its completion covers my block too. */
zr_status zr_devx_self_copy(zr_comm *c, void *dst, const void *src, size_t bytes);
cudaEvent_t zr_devx_take_self(zr_devx *x);

/* *done = 1 when e has completed (NULL counts as completed); never blocks. */
zr_status zr_devx_query(cudaEvent_t e, int *done);

#endif /* ZR_TRANSPORT_DEVICE_H */
