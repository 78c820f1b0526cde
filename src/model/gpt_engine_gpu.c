/*
 * gpt_engine_gpu.c - the GPT on a GPU driven by a ZeRO engine whose state is
 * on the same GPU (zr/gpt_engine.h, "the GPT on a GPU"): the engine hands
 * out device pointers to gathered parameters and gradient buffers of its
 * working types, and every kernel, the model's and the engine's, is queued
 * on one stream, the one the communicator follows, so the collectives start
 * after the kernels that wrote their inputs and before anything that
 * overwrites them.
 *
 * Where the engine's buffer is of the compute type (fp32 compute on an fp32
 * engine; bf16 compute on a bf16 engine's gathered units, stage 1-2 working
 * copy and stage 2-3 gradients) the model reads it and accumulates into it
 * directly: nothing is copied, and a bf16 engine's pool holds the only bf16
 * copy of a unit, as DeepSpeed's does. Where it is not (bf16 compute on
 * stage 0's fp32 master, on stage 0-1's fp32 gradients, which accumulate
 * the micro-batches, or on an fp32 engine), the unit's parameters are cast
 * into one of three bf16 unit buffers (unit 0, a block, the last unit: the
 * schedule holds at most those at once, the tied LM head reading unit 0
 * while the last unit runs), and its backward writes a zeroed bf16 unit
 * buffer that is then added into the engine's fp32 buffer
 * (zr_quant_cuda_add: the fp32 sum the host would do). Only the kinds a
 * configuration needs are allocated. Nothing here waits for the device:
 * the engine does, once per step, and at the loss.
 */
#include "gpt_gpu_impl.h"

#include "zr/quant_cuda.h"

#include <string.h>

/* Which unit buffer unit u uses: 0 for unit 0, 1 for a block, 2 for the last unit. */
static int slot_of(const zr_gpt_gpu *g, int u)
{
    return u == 0 ? 0 : u <= g->model.cfg.layers ? 1 : 2;
}

/* Elements of the units of each slot (blocks are all alike). */
static void slot_numel(const zr_gpt_config *cfg, size_t n[3])
{
    n[0] = zr_gpt_config_unit_numel(cfg, 0);
    n[1] = zr_gpt_config_unit_numel(cfg, 1);
    n[2] = zr_gpt_config_unit_numel(cfg, cfg->layers + 1);
}

/* How many kinds of unit buffers (parameters, gradients) the engine's types need: 0, 1 or 2. */
static void buffer_kinds(zr_dtype type, const zr_engine_config *ecfg, int *params, int *grads)
{
    *params = zr_engine_param_type(ecfg) != type;
    *grads = zr_engine_grad_type(ecfg) != type;
}

size_t zr_gpt_gpu_device_bytes(const zr_gpt_config *cfg, int B, int T, zr_dtype type,
                               const zr_engine_config *ecfg)
{
    size_t n[3];
    slot_numel(cfg, n);
    int params, grads;
    buffer_kinds(type, ecfg, &params, &grads);
    size_t act = zr_gpt_cuda_activation_bytes(cfg, B, T, type);
    return act + (size_t)(params + grads) * (n[0] + n[1] + n[2]) * zr_dtype_size(type);
}

/* The unit buffers of the kinds the engine's types need. */
static zr_status alloc_buffers(zr_gpt_gpu *g, zr_dtype type, const zr_engine_config *ecfg)
{
    int params, grads;
    buffer_kinds(type, ecfg, &params, &grads);
    size_t es = zr_dtype_size(type);
    for (int i = 0; i < 3; i++) {
        if (params) {
            ZR_CHECK(zr_device_alloc_at(&g->dev, &g->p[i], g->numel[i] * es, __FILE__, __LINE__));
        }
        if (grads) {
            ZR_CHECK(zr_device_alloc_at(&g->dev, &g->g[i], g->numel[i] * es, __FILE__, __LINE__));
        }
    }
    return ZR_OK;
}

zr_status zr_gpt_gpu_init(zr_gpt_gpu *g, const zr_device *dev, const zr_gpt_config *cfg, int B,
                          int T, zr_dtype type, const zr_engine_config *ecfg)
{
    memset(g, 0, sizeof *g);
    if (dev->kind != ZR_DEVICE_CUDA) {
        ZR_FAIL(ZR_ERR_INVALID, "GPT on a GPU: %s is not a GPU", dev->name);
    }
    g->param_type = zr_engine_param_type(ecfg);
    g->grad_type = zr_engine_grad_type(ecfg);
    if (type == ZR_DTYPE_F32 && (g->param_type != type || g->grad_type != type)) {
        ZR_FAIL(ZR_ERR_INVALID,
                "GPT on a GPU in fp32: the engine's working buffers must be fp32 too "
                "(zr_engine_config.work_type)");
    }
    g->dev = *dev;
    ZR_CHECK(zr_stream_create(&g->dev, &g->stream));
    slot_numel(cfg, g->numel);
    zr_status st = alloc_buffers(g, type, ecfg);
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
    zr_stream_destroy(g->stream);
    memset(g, 0, sizeof *g);
}

zr_status zr_gpt_gpu_forward_begin(zr_gpt_gpu *g, const int *inputs, const int *targets)
{
    return zr_gpt_cuda_forward_begin(&g->model, inputs, targets);
}

/*
 * The parameters unit u computes with: the engine's buffer src itself, or
 * (bf16 compute on fp32 parameters) its cast into unit buffer slot, queued.
 */
static zr_status params_in(zr_gpt_gpu *g, int u, int slot, const void *src, const void **out)
{
    if (g->p[slot] == NULL) {
        *out = src;
        return ZR_OK;
    }
    size_t n = zr_gpt_config_unit_numel(&g->model.cfg, u);
    ZR_ASSERT(n <= g->numel[slot]);
    *out = g->p[slot];
    return zr_bf16_cuda_from_f32((zr_bf16 *)g->p[slot], src, n, g->stream);
}

/*
 * Where unit u's backward accumulates: the engine's buffer dst itself (the
 * engine zeroed it), or (bf16 compute on fp32 gradients) a zeroed unit buffer.
 */
static zr_status grads_in(zr_gpt_gpu *g, int u, int slot, void *dst, void **out)
{
    if (g->g[slot] == NULL) {
        *out = dst;
        return ZR_OK;
    }
    *out = g->g[slot];
    return zr_memset_async(g->g[slot], 0,
                           zr_gpt_config_unit_numel(&g->model.cfg, u) * sizeof(zr_bf16), g->stream);
}

/* The backward's contribution in unit buffer slot, if it went there, added to the engine's dst. */
static zr_status grads_out(zr_gpt_gpu *g, int u, int slot, void *dst)
{
    if (g->g[slot] == NULL) {
        return ZR_OK;
    }
    return zr_quant_cuda_add(dst, g->g[slot], ZR_DTYPE_BF16,
                             zr_gpt_config_unit_numel(&g->model.cfg, u), g->stream);
}

zr_status zr_gpt_gpu_forward_unit(zr_gpt_gpu *g, int u, const void *params,
                                  const void *unit0_params)
{
    int k = slot_of(g, u), last = k == 2;
    const void *p = NULL, *p0 = NULL;
    ZR_CHECK(params_in(g, u, k, params, &p));
    if (last) {
        ZR_CHECK(params_in(g, 0, 0, unit0_params, &p0));
    }
    return zr_gpt_cuda_forward_unit(&g->model, u, p, p0);
}

zr_status zr_gpt_gpu_loss(zr_gpt_gpu *g, float *loss)
{
    return zr_gpt_cuda_loss(&g->model, loss);
}

zr_status zr_gpt_gpu_backward_begin(zr_gpt_gpu *g)
{
    return zr_gpt_cuda_backward_begin(&g->model);
}

zr_status zr_gpt_gpu_backward_unit(zr_gpt_gpu *g, int u, const void *params,
                                   const void *unit0_params, void *grads, void *unit0_grads)
{
    int k = slot_of(g, u), last = k == 2;
    const void *p = NULL, *p0 = NULL;
    void *d = NULL, *d0 = NULL;
    if (params != NULL) {
        ZR_CHECK(params_in(g, u, k, params, &p));
    }
    ZR_CHECK(grads_in(g, u, k, grads, &d));
    if (last) {
        ZR_CHECK(params_in(g, 0, 0, unit0_params, &p0));
        ZR_CHECK(grads_in(g, 0, 0, unit0_grads, &d0));
    }
    ZR_CHECK(zr_gpt_cuda_backward_unit(&g->model, u, p, p0, d, d0));
    ZR_CHECK(grads_out(g, u, k, grads));
    return last ? grads_out(g, 0, 0, unit0_grads) : ZR_OK;
}
