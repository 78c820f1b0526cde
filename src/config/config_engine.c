/*
 * config_engine.c - the engine settings a finalized configuration asks for
 * (zr_config_engine). It lives with the configuration, not with the trainer,
 * because the trainer and the planner (src/plan) both need the same mapping
 * and neither may depend on the other.
 */
#include "config_impl.h"

#include <string.h>

zr_engine_config zr_config_engine(const zr_train_config *c, zr_dtype bf16_work)
{
    zr_engine_config e = zr_engine_config_default();
    e.stage = c->stage;
    zr_wire_type wire =
        strcmp(c->communication_data_type, "fp32") == 0 ? ZR_WIRE_F32 : ZR_WIRE_BF16;
    e.param_wire.type = wire;
    e.grad_wire.type = wire;
    e.qwz = c->zero_quantized_weights;
    e.qwz_q = (zr_quant_params){c->qwz_bits, c->qwz_group, ZR_QUANT_SYM};
    e.hpz = c->zero_hpz_partition_size != 1;
    e.qgz = c->zero_quantized_gradients;
    e.qgz_cfg.q = (zr_quant_params){c->qgz_bits, c->qgz_group, ZR_QUANT_SYM};
    e.qgz_cfg.chunks = c->qgz_chunks;
    e.qgz_cfg.error_feedback = c->qgz_error_feedback;
    e.overlap = c->overlap_comm;
    size_t live = (size_t)c->stage3_max_live_parameters;
    e.max_live = live > 0 ? live : (size_t)-1;
    e.prefetch_bucket = (size_t)c->stage3_prefetch_bucket_size;
    e.reduce_bucket = (size_t)c->reduce_bucket_size;
    e.beta1 = (float)c->beta1;
    e.beta2 = (float)c->beta2;
    e.eps = (float)c->eps;
    e.weight_decay = (float)c->weight_decay;
    e.grad_clip = (float)c->gradient_clipping;
    e.work_type = c->bf16_enabled ? bf16_work : ZR_DTYPE_F32;
    return e;
}
