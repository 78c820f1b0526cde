/*
 * device_plane.c - the two collective choices a GPU run makes once, before
 * anything moves: whether every rank has a GPU, and which device transport
 * moves their memory (zr/comm.h). The trainer and the probe make them the
 * same way, so a plan measured on GPUs is the run it plans.
 *
 * Both are agreed over the control plane: a rank without a GPU, or ranks
 * sharing one, change what every rank does (the engine's state follows the
 * data plane onto the GPU only if every rank's does; NCCL refuses ranks
 * that share a GPU, so one shared GPU anywhere means the staged transport
 * everywhere).
 */
#include "comm_impl.h"

#include <stdio.h>
#include <string.h>

zr_status zr_comm_gpus_everywhere(zr_comm *c, int *mine, int *all, char *why, size_t n)
{
    int count = 0;
    *mine = zr_device_cuda_count(&count) == ZR_OK && count > 0;
    if (!*mine && why != NULL && n > 0) {
        snprintf(why, n, "%s", zr_error_message()[0] ? zr_error_message() : "no GPU found");
    }
    zr_error_clear();
    int64_t missing = !*mine;
    ZR_CHECK(zr_comm_allreduce_max_i64(c, ZR_GROUP_WORLD, &missing, 1));
    *all = missing == 0;
    if (*mine && !*all && why != NULL && n > 0) {
        snprintf(why, n, "a rank sees no GPU");
    }
    return ZR_OK;
}

/* 1 when node-local ranks share this rank's GPU. */
static int sharing_gpu(const zr_comm *c)
{
    int count = 0;
    if (zr_device_cuda_count(&count) != ZR_OK || count <= 0) {
        zr_error_clear();
        return 0;
    }
    return c->size[ZR_GROUP_NODE] > count;
}

zr_status zr_comm_use_device(zr_comm *c, const zr_device *dev, zr_stream *follow, const char *want,
                             int *nccl, int *shared)
{
    if (strcmp(want, "auto") != 0 && strcmp(want, "nccl") != 0 && strcmp(want, "staged") != 0) {
        ZR_FAIL(ZR_ERR_INVALID, "transport must be auto, nccl or staged, got \"%s\"", want);
    }
    int64_t any_shared = sharing_gpu(c);
    ZR_CHECK(zr_comm_allreduce_max_i64(c, ZR_GROUP_WORLD, &any_shared, 1));
    *shared = any_shared != 0;
    *nccl = strcmp(want, "nccl") == 0 ||
            (strcmp(want, "auto") == 0 && zr_comm_nccl_built() && !*shared);
    zr_transport_device td = {dev, follow, 0};
    return zr_comm_use_transport(c, *nccl ? &zr_transport_nccl : &zr_transport_staged, &td);
}
