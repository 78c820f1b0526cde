/*
 * probe_impl.h - what probe.c (the probe: which device, transport, memory,
 * the CPU's figures), probe_gpu.c (the GPU's figures) and probe_ref.c (the
 * reference steps) share, and cost.c (the cost model) with calibrate.c (its
 * fit to the reference steps).
 */
#ifndef ZR_PROBE_IMPL_H
#define ZR_PROBE_IMPL_H

#include "zr/plan.h"

/* The median of v (reordered), and the slowest rank's value of each of v over c's world. */
zr_status zr_probe_slowest(zr_comm *c, double *v, int n);

/*
 * The reference steps (collective; g: the whole model) on the CPU, or on s's
 * GPU (s non-NULL: the stream c's device transport follows, followed again
 * after): out's cal_* fields, or cal_batch 0 where ZeRO-3's could not run
 * (rank 0 says why on stderr). Needs out->mem_per_rank.
 */
void zr_probe_reference_steps(zr_comm *c, const zr_train_config *cfg, const zr_gpt_config *g,
                              zr_stream *s, zr_probe *out);

/* Forward and backward of each unit kind at micro-batch b on s's GPU, in type (collective). */
zr_status zr_probe_gpu_compute(zr_comm *c, const zr_gpt_config *g, int T, int b, zr_dtype type,
                               zr_stream *s, zr_probe_compute *out);

/*
 * Seconds per element of the engine's kernels on s's GPU (collective), in
 * probe.c's order: AdamW, sum of squares, fp32 -> bf16, bf16 -> fp32, fp32
 * add, INT8 encode, INT8 decode-add, INT4 encode, INT4 decode-add.
 */
zr_status zr_probe_gpu_kernels(zr_comm *c, zr_stream *s, double v[9]);

/* GPU work queued while the host drives a transfer (the overlap measurement). */
typedef struct zr_probe_busy {
    zr_stream *s;
    float *x;
    double *sq, *work;
    size_t n;
    double t_kernel; /* seconds of one of its kernels */
} zr_probe_busy;
zr_status zr_probe_gpu_busy_init(zr_stream *s, zr_probe_busy *b);
/* Queue about this many seconds of kernels on b's stream (the host does not wait). */
zr_status zr_probe_gpu_busy(zr_probe_busy *b, double seconds);
void zr_probe_gpu_busy_free(zr_probe_busy *b);

/*
 * The cost of ch on nodes x D ranks priced with calibration cal (cost.c);
 * waits non-NULL (room for maxwaits): each synchronising wait's exposure of
 * the step too, their count in *nwaits.
 */
zr_status zr_plan_cost_with(const zr_train_config *cfg, int vocab, int nodes, int D,
                            const zr_plan_choice *ch, const zr_probe *probe,
                            const zr_plan_calib *cal, double *waits, int maxwaits, int *nwaits,
                            zr_plan_cost *out);

#endif /* ZR_PROBE_IMPL_H */
