/*
 * gpt_engine_gpu.c - the GPT on a GPU driven by the ZeRO engine
 * (zr/gpt_engine.h, "the GPT on a GPU"): the device model's calls with each
 * unit's host buffers staged through three device unit buffers.
 *
 * Why three: the schedule holds at most unit 0, one block and the last unit
 * at once (the tied LM head reads unit 0 while the last unit runs). Every
 * copy and kernel is queued on one stream, so a unit buffer refilled for the
 * next unit is ordered after the kernels of the previous one. Host to device
 * copies read the engine's buffers before the call returns (pageable memory
 * is staged by CUDA), so the engine may release and reuse them at once; the
 * gradients come back before zr_gpt_gpu_backward_unit returns, because the
 * engine reduces them right after.
 */
#include "gpt_gpu_impl.h"

#include <string.h>

/* Which unit buffer unit u uses: 0 for unit 0, 1 for a block, 2 for the last unit. */
static int slot_of(const zr_gpt_gpu *g, int u)
{
    return u == 0 ? 0 : u <= g->model.cfg.layers ? 1 : 2;
}

/* Elements of the largest unit of each slot (blocks are all alike). */
static void slot_numel(const zr_gpt_config *cfg, size_t n[3])
{
    n[0] = zr_gpt_config_unit_numel(cfg, 0);
    n[1] = zr_gpt_config_unit_numel(cfg, 1);
    n[2] = zr_gpt_config_unit_numel(cfg, cfg->layers + 1);
}

size_t zr_gpt_gpu_device_bytes(const zr_gpt_config *cfg, int B, int T)
{
    size_t n[3];
    slot_numel(cfg, n);
    return zr_gpt_cuda_activation_bytes(cfg, B, T, ZR_DTYPE_F32) +
           2 * (n[0] + n[1] + n[2]) * sizeof(float);
}

zr_status zr_gpt_gpu_init(zr_gpt_gpu *g, const zr_device *dev, const zr_gpt_config *cfg, int B,
                          int T)
{
    memset(g, 0, sizeof *g);
    if (dev->kind != ZR_DEVICE_CUDA) {
        ZR_FAIL(ZR_ERR_INVALID, "GPT on a GPU: %s is not a GPU", dev->name);
    }
    g->dev = *dev;
    ZR_CHECK(zr_stream_create(&g->dev, &g->stream));
    slot_numel(cfg, g->numel);
    zr_status st = ZR_OK;
    for (int i = 0; i < 3 && st == ZR_OK; i++) {
        st = zr_device_alloc_at(&g->dev, (void **)&g->p[i], g->numel[i] * sizeof(float), __FILE__,
                                __LINE__);
        if (st == ZR_OK) {
            st = zr_device_alloc_at(&g->dev, (void **)&g->g[i], g->numel[i] * sizeof(float),
                                    __FILE__, __LINE__);
        }
    }
    if (st == ZR_OK) {
        st = zr_gpt_cuda_init(&g->model, cfg, B, T, ZR_DTYPE_F32, g->stream);
    }
    if (st != ZR_OK) {
        zr_gpt_gpu_free(g);
    }
    return st;
}

void zr_gpt_gpu_free(zr_gpt_gpu *g)
{
    if (g == NULL || g->stream == NULL) {
        return;
    }
    zr_gpt_cuda_free(&g->model); /* waits for the stream */
    for (int i = 0; i < 3; i++) {
        if (g->p[i] != NULL) {
            zr_device_free(&g->dev, g->p[i]);
        }
        if (g->g[i] != NULL) {
            zr_device_free(&g->dev, g->g[i]);
        }
    }
    zr_stream_destroy(g->stream);
    memset(g, 0, sizeof *g);
}

zr_status zr_gpt_gpu_forward_begin(zr_gpt_gpu *g, const int *inputs, const int *targets)
{
    return zr_gpt_cuda_forward_begin(&g->model, inputs, targets);
}

/* Copy host buffer src of unit u into its slot's device buffer dst (queued). */
static zr_status put(zr_gpt_gpu *g, int u, float *dst, const float *src)
{
    size_t n = zr_gpt_config_unit_numel(&g->model.cfg, u);
    ZR_ASSERT(n <= g->numel[slot_of(g, u)]);
    return zr_memcpy_async(dst, src, n * sizeof(float), g->stream);
}

zr_status zr_gpt_gpu_forward_unit(zr_gpt_gpu *g, int u, const float *params,
                                  const float *unit0_params)
{
    int k = slot_of(g, u), last = k == 2;
    ZR_CHECK(put(g, u, g->p[k], params));
    if (last) {
        ZR_CHECK(put(g, 0, g->p[0], unit0_params));
    }
    return zr_gpt_cuda_forward_unit(&g->model, u, g->p[k], last ? g->p[0] : NULL);
}

zr_status zr_gpt_gpu_loss(zr_gpt_gpu *g, float *loss)
{
    return zr_gpt_cuda_loss(&g->model, loss);
}

zr_status zr_gpt_gpu_backward_begin(zr_gpt_gpu *g)
{
    return zr_gpt_cuda_backward_begin(&g->model);
}

zr_status zr_gpt_gpu_backward_unit(zr_gpt_gpu *g, int u, const float *params,
                                   const float *unit0_params, float *grads, float *unit0_grads)
{
    int k = slot_of(g, u), last = k == 2;
    size_t n = zr_gpt_config_unit_numel(&g->model.cfg, u);
    size_t n0 = zr_gpt_config_unit_numel(&g->model.cfg, 0);
    if (params != NULL) {
        ZR_CHECK(put(g, u, g->p[k], params));
    }
    ZR_CHECK(put(g, u, g->g[k], grads));
    if (last) {
        ZR_CHECK(put(g, 0, g->p[0], unit0_params));
        ZR_CHECK(put(g, 0, g->g[0], unit0_grads));
    }
    ZR_CHECK(zr_gpt_cuda_backward_unit(&g->model, u, params != NULL ? g->p[k] : NULL,
                                       last ? g->p[0] : NULL, g->g[k], last ? g->g[0] : NULL));
    ZR_CHECK(zr_memcpy_async(grads, g->g[k], n * sizeof(float), g->stream));
    if (last) {
        ZR_CHECK(zr_memcpy_async(unit0_grads, g->g[0], n0 * sizeof(float), g->stream));
    }
    return zr_stream_sync(g->stream);
}
