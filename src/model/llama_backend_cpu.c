/*
 * llama_backend_cpu.c - the Llama family's CPU backend (zr/gpt_engine.h,
 * zr_gpt_backend_i): the host model of zr/llama.h computing in fp32 on the
 * engine's fp32 buffers in host memory, at once. The schedule is the GPT's
 * (zr_gpt_engine_micro): unit 0 the embedding, one unit per layer, the last
 * the final norm and the head, which a tied model reads from unit 0 as
 * GPT-2's does. It keeps every activation (no recomputation yet) and its
 * products stay fp32 (no bf16 products yet): the trainer says so where a
 * configuration asks for either.
 */
#include "gpt_backend_impl.h"

#include "zr/llama.h"

static size_t llama_model_bytes(const zr_gpt_config *cfg, const zr_gpt_shape *s,
                                const zr_engine_config *ecfg)
{
    return zr_llama_config_activation_bytes(&cfg->llama, s->B, s->T);
}

/* T within max_position_embeddings, and no sliding window shorter than T. */
static zr_status llama_check_shape(const zr_gpt_config *cfg, const zr_gpt_shape *s)
{
    if (s->T > cfg->max_t) {
        ZR_FAIL(ZR_ERR_INVALID,
                "zr.train.seq_len %d is above the model's max_position_embeddings %d", s->T,
                cfg->max_t);
    }
    if (cfg->llama.sliding_window > 0 && cfg->llama.sliding_window < s->T) {
        ZR_FAIL(ZR_ERR_INVALID,
                "the model's sliding_window %d is shorter than zr.train.seq_len %d (zr's attention "
                "sees every earlier token): train with seq_len <= %d",
                cfg->llama.sliding_window, s->T, cfg->llama.sliding_window);
    }
    return ZR_OK;
}

static zr_status llama_init(void **model, const zr_device *dev, const zr_gpt_config *cfg,
                            const zr_gpt_shape *s, const zr_engine_config *ecfg)
{
    zr_llama *m;
    ZR_CHECK(llama_check_shape(cfg, s));
    ZR_ALLOC(m, 1);
    zr_status st = zr_llama_init(m, &cfg->llama, s->B, s->T);
    if (st != ZR_OK) {
        zr_free(m);
        return st;
    }
    *model = m;
    return ZR_OK;
}

static void llama_free(void *model)
{
    zr_llama_free(model);
    zr_free(model);
}

static zr_status llama_check_engine(void *model, const zr_engine *e)
{
    zr_dtype p = zr_engine_param_type(&e->cfg), g = zr_engine_grad_type(&e->cfg);
    if (p != ZR_DTYPE_F32 || g != ZR_DTYPE_F32) {
        ZR_FAIL(ZR_ERR_INVALID,
                "the Llama model on the CPU computes in fp32 on the engine's buffers, which are "
                "%s parameters and %s gradients: give it an engine with fp32 working buffers",
                zr_dtype_name(p), zr_dtype_name(g));
    }
    ZR_ASSERT(zr_llama_unit_count(model) == e->nunits);
    return ZR_OK;
}

static zr_status llama_loss(void *model, float *loss)
{
    *loss = zr_llama_loss(model);
    return ZR_OK;
}

static zr_status llama_forward_begin(void *model, const int *inputs, const int *targets)
{
    return zr_llama_forward_begin(model, inputs, targets);
}

static zr_status llama_forward_unit(void *model, int u, const void *p, const void *p0)
{
    return zr_llama_forward_unit(model, u, p, p0);
}

static zr_status llama_backward_begin(void *model)
{
    return zr_llama_backward_begin(model);
}

static zr_status llama_backward_unit(void *model, int u, const void *p, const void *p0, void *g,
                                     void *g0)
{
    return zr_llama_backward_unit(model, u, p, p0, g, g0);
}

const zr_gpt_backend_i zr_llama_backend_cpu = {
    .name = "llama-cpu",
    .bf16_work_type = ZR_DTYPE_F32,
    .check_shape = llama_check_shape,
    .model_bytes = llama_model_bytes,
    .device_memory = 0,
    .recompute = 0,
    .init = llama_init,
    .free = llama_free,
    .check_engine = llama_check_engine,
    .forward_begin = llama_forward_begin,
    .forward_unit = llama_forward_unit,
    .loss = llama_loss,
    .backward_begin = llama_backward_begin,
    .backward_unit = llama_backward_unit,
};
