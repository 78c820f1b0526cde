/*
 * gpt_backend_cuda.c - the GPT's CUDA backend (zr/gpt_engine.h,
 * zr_gpt_backend_i): the device model (zr/model_cuda.h) driven by a ZeRO
 * engine whose state is on the same GPU (zr_engine_init over a communicator
 * with a device transport that follows this model's stream: zr/zero.h,
 * "Where the state lives"), in compute type fp32 (TF32 off: the mode
 * compared with the CPU) or bf16 (bf16 weights and activations, fp32
 * accumulation). The engine keeps the fp32 master weights and optimizer
 * shards, runs the collectives, AdamW and clipping, all in device memory,
 * and hands out working buffers of its types. The loss is computed on the
 * device and read through the model's control buffer. Checkpoints are the
 * CPU path's files: either resumes the other. The engine hands
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
#include "gpt_backend_impl.h"

#include "zr/model_cuda.h"
#include "zr/quant_cuda.h"

#include "ops_table.h"

#include <string.h>

typedef struct gpt_cuda {
    zr_gpt_cuda model;
    zr_device dev;
    zr_stream *stream; /* owned; the model's kernels, the engine's and the collectives' */
    zr_dtype param_type, grad_type; /* the engine's buffers it was made for */
    void *p[3], *g[3]; /* bf16 unit buffers where the engine's are fp32 (NULL otherwise):
                          unit 0, a block, the last unit */
    size_t numel[3];   /* elements of the slot's units */
} gpt_cuda;

/* Which unit buffer unit u uses: 0 for unit 0, 1 for a block, 2 for the last unit. */
static int slot_of(const gpt_cuda *g, int u)
{
    return u == 0 ? 0 : u <= g->model.cfg.layers ? 1 : 2;
}

/* The device model's kernels take B x T rows up to 2^30 and B x heads attention blocks up to
   65535 (zr_gpt_cuda_max_batch). */
static zr_status cuda_check_shape(const zr_gpt_config *cfg, const zr_gpt_shape *s)
{
    int bmax = zr_gpt_cuda_max_batch(cfg, s->T);
    if (s->B > bmax) {
        ZR_FAIL(ZR_ERR_INVALID,
                "train_micro_batch_size_per_gpu %d at zr.model.seq_len %d is more than the GPU "
                "model takes (%d: its kernels take micro-batch x seq_len rows up to 2^30 and "
                "micro-batch x heads attention blocks up to 65535); lower "
                "train_micro_batch_size_per_gpu and raise gradient_accumulation_steps",
                s->B, s->T, bmax);
    }
    return ZR_OK;
}

/* The unit buffers of the kinds the engine's types need. */
static zr_status alloc_buffers(gpt_cuda *g, zr_dtype type, const zr_engine_config *ecfg)
{
    int params, grads;
    zr_gpt_cuda_buffer_kinds(type, ecfg, &params, &grads);
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

static void cuda_free(void *model);

static zr_status cuda_init(void **model, const zr_device *dev, const zr_gpt_config *cfg,
                           const zr_gpt_shape *s, const zr_engine_config *ecfg)
{
    zr_dtype type = s->compute;
    zr_dtype pt = zr_engine_param_type(ecfg), gt = zr_engine_grad_type(ecfg);
    if (type == ZR_DTYPE_F32 && (pt != type || gt != type)) {
        ZR_FAIL(ZR_ERR_INVALID,
                "GPT on a GPU in fp32: the engine's working buffers must be fp32 too "
                "(zr_engine_config.work_type)");
    }
    gpt_cuda *g;
    ZR_ALLOC(g, 1);
    *model = g;
    g->param_type = pt;
    g->grad_type = gt;
    g->dev = *dev;
    zr_status st = zr_stream_create(&g->dev, &g->stream);
    if (st == ZR_OK) {
        zr_gpt_cuda_slot_numel(cfg, g->numel);
        st = alloc_buffers(g, type, ecfg);
    }
    if (st == ZR_OK) {
        st = zr_gpt_cuda_init(&g->model, cfg, s->B, s->T, type, g->stream);
    }
    if (st != ZR_OK) {
        cuda_free(g);
        *model = NULL;
    }
    return st;
}

static void cuda_free(void *model)
{
    gpt_cuda *g = model;
    if (g == NULL) {
        return;
    }
    if (g->stream == NULL) {
        zr_free(g);
        return;
    }
    (void)zr_stream_sync(g->stream);
    zr_gpt_cuda_free(&g->model);
    for (int i = 0; i < 3; i++) {
        zr_device_free(&g->dev, g->p[i]);
        zr_device_free(&g->dev, g->g[i]);
    }
    zr_stream_destroy(g->stream);
    zr_free(g);
}

static zr_stream *cuda_stream(void *model)
{
    gpt_cuda *g = model;
    return g->stream;
}

/*
 * The device model computes on the engine's buffers: they must be on its GPU,
 * of the types it was made for.
 */
static zr_status cuda_check_engine(void *model, const zr_engine *e)
{
    const gpt_cuda *g = model;
    if (!e->on_device || e->device.ordinal != g->dev.ordinal) {
        ZR_FAIL(ZR_ERR_INVALID,
                "the GPT on %s needs a ZeRO engine on the same GPU (a device transport following "
                "the model's stream), not one in %s memory",
                g->dev.name, e->on_device ? e->device.name : "host");
    }
    zr_dtype p = zr_engine_param_type(&e->cfg), gt = zr_engine_grad_type(&e->cfg);
    if (p != g->param_type || gt != g->grad_type) {
        ZR_FAIL(ZR_ERR_INVALID,
                "the GPT on %s was made for an engine with %s parameters and %s gradients, this "
                "one hands out %s and %s",
                g->dev.name, zr_dtype_name(g->param_type), zr_dtype_name(g->grad_type),
                zr_dtype_name(p), zr_dtype_name(gt));
    }
    ZR_ASSERT(g->model.cfg.layers + 2 == e->nunits);
    return ZR_OK;
}

static zr_status cuda_forward_begin(void *model, const int *inputs, const int *targets)
{
    gpt_cuda *g = model;
    return zr_gpt_cuda_forward_begin(&g->model, inputs, targets);
}

/*
 * The parameters unit u computes with: the engine's buffer src itself, or
 * (bf16 compute on fp32 parameters) its cast into unit buffer slot, queued.
 */
static zr_status params_in(gpt_cuda *g, int u, int slot, const void *src, const void **out)
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
static zr_status grads_in(gpt_cuda *g, int u, int slot, void *dst, void **out)
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
static zr_status grads_out(gpt_cuda *g, int u, int slot, void *dst)
{
    if (g->g[slot] == NULL) {
        return ZR_OK;
    }
    return zr_quant_cuda_add(dst, g->g[slot], ZR_DTYPE_BF16,
                             zr_gpt_config_unit_numel(&g->model.cfg, u), g->stream);
}

/* Unit u's forward on params (and unit 0's for the last unit): engine device buffers, queued. */
static zr_status cuda_forward_unit(void *model, int u, const void *params, const void *unit0_params)
{
    gpt_cuda *g = model;
    int k = slot_of(g, u), last = k == 2;
    const void *p = NULL, *p0 = NULL;
    ZR_CHECK(params_in(g, u, k, params, &p));
    if (last) {
        ZR_CHECK(params_in(g, 0, 0, unit0_params, &p0));
    }
    return zr_gpt_cuda_forward_unit(&g->model, u, p, p0);
}

/* The mean loss of the last forward (waits for the control buffer). */
static zr_status cuda_loss(void *model, float *loss)
{
    gpt_cuda *g = model;
    return zr_gpt_cuda_loss(&g->model, loss);
}

static zr_status cuda_backward_begin(void *model)
{
    gpt_cuda *g = model;
    return zr_gpt_cuda_backward_begin(&g->model);
}

/*
 * Queues unit u's backward, accumulating into the engine's device buffers
 * grads (and unit0_grads): once the work queued on the stream so far has
 * run, they hold the accumulated gradients, as after the CPU model's call.
 */
static zr_status cuda_backward_unit(void *model, int u, const void *params,
                                    const void *unit0_params, void *grads, void *unit0_grads)
{
    gpt_cuda *g = model;
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

const zr_gpt_backend_i zr_gpt_backend_cuda = {
    .name = "cuda",
    .bf16_work_type = ZR_DTYPE_BF16,
    .check_shape = cuda_check_shape,
    .model_bytes = zr_gpt_cuda_engine_bytes,
    .device_memory = 1,
    .recompute = 0,
    .init = cuda_init,
    .free = cuda_free,
    .stream = cuda_stream,
    .ops = &zr_ops_cuda,
    .check_engine = cuda_check_engine,
    .forward_begin = cuda_forward_begin,
    .forward_unit = cuda_forward_unit,
    .loss = cuda_loss,
    .backward_begin = cuda_backward_begin,
    .backward_unit = cuda_backward_unit,
};
