/*
 * gpt_gpu_impl.h - what gpt_engine.c's schedule calls to run a unit on the
 * GPU (gpt_engine_gpu.c): the device model's calls on the engine's device
 * buffers (through the unit buffers of a zr_gpt_gpu where those are not of
 * the compute type). Buffers are of the engine's types, g->param_type and
 * g->grad_type.
 */
#ifndef ZR_GPT_GPU_IMPL_H
#define ZR_GPT_GPU_IMPL_H

#include "zr/gpt_engine.h"

zr_status zr_gpt_gpu_forward_begin(zr_gpt_gpu *g, const int *inputs, const int *targets);
/* Queues unit u's forward on params (and unit 0's for the last unit): engine device buffers. */
zr_status zr_gpt_gpu_forward_unit(zr_gpt_gpu *g, int u, const void *params,
                                  const void *unit0_params);
/* The mean loss of the last forward (waits for the control buffer). */
zr_status zr_gpt_gpu_loss(zr_gpt_gpu *g, float *loss);
zr_status zr_gpt_gpu_backward_begin(zr_gpt_gpu *g);
/*
 * Queues unit u's backward, accumulating into the engine's device buffers
 * grads (and unit0_grads): once the work queued on the stream so far has
 * run, they hold the accumulated gradients, as after the CPU model's call.
 */
zr_status zr_gpt_gpu_backward_unit(zr_gpt_gpu *g, int u, const void *params,
                                   const void *unit0_params, void *grads, void *unit0_grads);

#endif /* ZR_GPT_GPU_IMPL_H */
