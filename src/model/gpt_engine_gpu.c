/*
 * gpt_engine_gpu.c - the GPT on a GPU driven by the ZeRO engine
 * (zr/gpt_engine.h, "the GPT on a GPU"): the device model's calls with each
 * unit's host buffers staged through three device unit buffers.
 *
 * Why three: the schedule holds at most unit 0, one block and the last unit
 * at once (the tied LM head reads unit 0 while the last unit runs). Every
 * copy, conversion and kernel is queued on one stream, so a unit buffer (or
 * the fp32 staging buffer) refilled for the next unit is ordered after the
 * kernels of the previous one. Host to device copies read the engine's
 * buffers before the call returns (pageable memory is staged by CUDA), so
 * the engine may release and reuse them at once; the gradients come back
 * before zr_gpt_gpu_backward_unit returns, because the engine reduces them
 * right after.
 */
#include "gpt_gpu_impl.h"

#include "zr/quant_cuda.h"

#include <string.h>

/* Which unit buffer unit u uses: 0 for unit 0, 1 for a block, 2 for the last unit. */
static int slot_of(const zr_gpt_gpu *g, int u)
{
    return u == 0 ? 0 : u <= g->model.cfg.layers ? 1 : 2;
}

/* Elements of the units of each slot (blocks are all alike); returns the largest. */
static size_t slot_numel(const zr_gpt_config *cfg, size_t n[3])
{
    n[0] = zr_gpt_config_unit_numel(cfg, 0);
    n[1] = zr_gpt_config_unit_numel(cfg, 1);
    n[2] = zr_gpt_config_unit_numel(cfg, cfg->layers + 1);
    size_t big = n[0] > n[1] ? n[0] : n[1];
    return big > n[2] ? big : n[2];
}

size_t zr_gpt_gpu_device_bytes(const zr_gpt_config *cfg, int B, int T, zr_dtype type)
{
    size_t n[3];
    size_t big = slot_numel(cfg, n), es = zr_dtype_size(type);
    return zr_gpt_cuda_activation_bytes(cfg, B, T, type) + 2 * (n[0] + n[1] + n[2]) * es +
           (type == ZR_DTYPE_F32 ? 0 : big * sizeof(float));
}

static zr_status alloc_buffers(zr_gpt_gpu *g, zr_dtype type, size_t big)
{
    size_t es = zr_dtype_size(type);
    for (int i = 0; i < 3; i++) {
        ZR_CHECK(zr_device_alloc_at(&g->dev, &g->p[i], g->numel[i] * es, __FILE__, __LINE__));
        ZR_CHECK(zr_device_alloc_at(&g->dev, &g->g[i], g->numel[i] * es, __FILE__, __LINE__));
    }
    if (type != ZR_DTYPE_F32) {
        ZR_CHECK(zr_device_alloc_at(&g->dev, (void **)&g->stage, big * sizeof(float), __FILE__,
                                    __LINE__));
        ZR_CHECK(zr_host_alloc_pinned_at(&g->dev, (void **)&g->host, big * sizeof(float), __FILE__,
                                         __LINE__));
    }
    return ZR_OK;
}

zr_status zr_gpt_gpu_init(zr_gpt_gpu *g, const zr_device *dev, const zr_gpt_config *cfg, int B,
                          int T, zr_dtype type)
{
    memset(g, 0, sizeof *g);
    if (dev->kind != ZR_DEVICE_CUDA) {
        ZR_FAIL(ZR_ERR_INVALID, "GPT on a GPU: %s is not a GPU", dev->name);
    }
    g->dev = *dev;
    ZR_CHECK(zr_stream_create(&g->dev, &g->stream));
    size_t big = slot_numel(cfg, g->numel);
    zr_status st = alloc_buffers(g, type, big);
    if (st == ZR_OK) {
        st = zr_gpt_cuda_init(&g->model, cfg, B, T, type, g->stream);
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
    (void)zr_stream_sync(g->stream);
    zr_gpt_cuda_free(&g->model);
    for (int i = 0; i < 3; i++) {
        zr_device_free(&g->dev, g->p[i]);
        zr_device_free(&g->dev, g->g[i]);
    }
    zr_device_free(&g->dev, g->stage);
    zr_host_free_pinned(&g->dev, g->host);
    zr_stream_destroy(g->stream);
    memset(g, 0, sizeof *g);
}

static int is_f32(const zr_gpt_gpu *g)
{
    return g->model.type == ZR_DTYPE_F32;
}

zr_status zr_gpt_gpu_forward_begin(zr_gpt_gpu *g, const int *inputs, const int *targets)
{
    return zr_gpt_cuda_forward_begin(&g->model, inputs, targets);
}

/* Unit u's fp32 host parameters src into device buffer dst of the compute type (queued). */
static zr_status put(zr_gpt_gpu *g, int u, void *dst, const float *src)
{
    size_t n = zr_gpt_config_unit_numel(&g->model.cfg, u);
    ZR_ASSERT(n <= g->numel[slot_of(g, u)]);
    if (is_f32(g)) {
        return zr_memcpy_async(dst, src, n * sizeof(float), g->stream);
    }
    ZR_CHECK(zr_memcpy_async(g->stage, src, n * sizeof(float), g->stream));
    return zr_bf16_cuda_from_f32((zr_bf16 *)dst, g->stage, n, g->stream);
}

/* Gradient buffer src (compute type) of unit u, written by its backward, into the host's dst. */
static zr_status take(zr_gpt_gpu *g, int u, float *dst, const void *src)
{
    size_t n = zr_gpt_config_unit_numel(&g->model.cfg, u);
    if (is_f32(g)) {
        /* the backward accumulated into the host's values copied in: they replace dst */
        ZR_CHECK(zr_memcpy_async(dst, src, n * sizeof(float), g->stream));
        return zr_stream_sync(g->stream);
    }
    /* bf16: the backward's contribution alone, added in fp32 */
    ZR_CHECK(zr_bf16_cuda_to_f32(g->stage, (const zr_bf16 *)src, n, g->stream));
    ZR_CHECK(zr_memcpy_async(g->host, g->stage, n * sizeof(float), g->stream));
    ZR_CHECK(zr_stream_sync(g->stream));
    for (size_t i = 0; i < n; i++) {
        dst[i] += g->host[i];
    }
    return ZR_OK;
}

/* The device gradient buffer of unit u before its backward: the host's values, or zeros. */
static zr_status grads_in(zr_gpt_gpu *g, int u, void *dst, const float *src)
{
    if (is_f32(g)) {
        return put(g, u, dst, src);
    }
    return zr_memset_async(dst, 0, zr_gpt_config_unit_numel(&g->model.cfg, u) * sizeof(zr_bf16),
                           g->stream);
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
    if (params != NULL) {
        ZR_CHECK(put(g, u, g->p[k], params));
    }
    ZR_CHECK(grads_in(g, u, g->g[k], grads));
    if (last) {
        ZR_CHECK(put(g, 0, g->p[0], unit0_params));
        ZR_CHECK(grads_in(g, 0, g->g[0], unit0_grads));
    }
    ZR_CHECK(zr_gpt_cuda_backward_unit(&g->model, u, params != NULL ? g->p[k] : NULL,
                                       last ? g->p[0] : NULL, g->g[k], last ? g->g[0] : NULL));
    ZR_CHECK(take(g, u, grads, g->g[k]));
    return last ? take(g, 0, unit0_grads, g->g[0]) : ZR_OK;
}
