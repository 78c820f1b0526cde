/*
 * gpt_backend_cpu.c - the GPT's CPU backend (zr/gpt_engine.h,
 * zr_gpt_backend_i): the host model (zr/model.h) computing in fp32 on the
 * engine's fp32 buffers in host memory, at once. bf16 (bf16.enabled) means
 * the matrix products' inputs on CPUs that have bf16 products
 * (zr_gpt_set_products), set by the trainer once every rank agrees.
 */
#include "gpt_backend_impl.h"

#include "zr/pool.h"

#include "../base/blas.h"

static size_t cpu_model_bytes(const zr_gpt_config *cfg, const zr_gpt_shape *s,
                              const zr_engine_config *ecfg)
{
    size_t b = zr_gpt_config_activation_bytes(cfg, s->B, s->T, s->recompute);
    const char *kernel;
    char why[160];
    if (s->compute == ZR_DTYPE_BF16 && zr_blas_bf16_here(&kernel, why, sizeof why)) {
        /* the products' bf16 scratch (zr_gpt_set_products) */
        b += zr_gpt_config_products_bytes(cfg, s->B, s->T, zr_threads_get());
    }
    return b;
}

static zr_status cpu_init(void **model, const zr_device *dev, const zr_gpt_config *cfg,
                          const zr_gpt_shape *s, const zr_engine_config *ecfg)
{
    zr_gpt *m;
    ZR_ALLOC(m, 1);
    zr_status st = zr_gpt_init_ex(m, cfg, s->B, s->T, s->recompute);
    if (st != ZR_OK) {
        zr_free(m);
        return st;
    }
    *model = m;
    return ZR_OK;
}

static void cpu_free(void *model)
{
    zr_gpt_free(model);
    zr_free(model);
}

static int cpu_set_products(void *model, int bf16, char *why, size_t n)
{
    return zr_gpt_set_products(model, bf16, why, n);
}

/* The CPU model computes in fp32 on the engine's buffers: they must be fp32. */
static zr_status cpu_check_engine(void *model, const zr_engine *e)
{
    zr_dtype p = zr_engine_param_type(&e->cfg), g = zr_engine_grad_type(&e->cfg);
    if (p != ZR_DTYPE_F32 || g != ZR_DTYPE_F32) {
        ZR_FAIL(ZR_ERR_INVALID,
                "the GPT on the CPU computes in fp32 on the engine's buffers, which are %s "
                "parameters and %s gradients: give it an engine with fp32 working buffers",
                zr_dtype_name(p), zr_dtype_name(g));
    }
    ZR_ASSERT(zr_gpt_unit_count(model) == e->nunits);
    return ZR_OK;
}

static zr_status cpu_loss(void *model, float *loss)
{
    *loss = zr_gpt_loss(model);
    return ZR_OK;
}

static zr_status cpu_forward_begin(void *model, const int *inputs, const int *targets)
{
    return zr_gpt_forward_begin(model, inputs, targets);
}

static zr_status cpu_forward_unit(void *model, int u, const void *p, const void *p0)
{
    return zr_gpt_forward_unit(model, u, p, p0);
}

static zr_status cpu_backward_begin(void *model)
{
    return zr_gpt_backward_begin(model);
}

static zr_status cpu_backward_unit(void *model, int u, const void *p, const void *p0, void *g,
                                   void *g0)
{
    return zr_gpt_backward_unit(model, u, p, p0, g, g0);
}

const zr_gpt_backend_i zr_gpt_backend_cpu = {
    .name = "cpu",
    .bf16_work_type = ZR_DTYPE_F32,
    .model_bytes = cpu_model_bytes,
    .device_memory = 0,
    .recompute = 1,
    .init = cpu_init,
    .free = cpu_free,
    .set_products = cpu_set_products,
    .check_engine = cpu_check_engine,
    .forward_begin = cpu_forward_begin,
    .forward_unit = cpu_forward_unit,
    .loss = cpu_loss,
    .backward_begin = cpu_backward_begin,
    .backward_unit = cpu_backward_unit,
};
