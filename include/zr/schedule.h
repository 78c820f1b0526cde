/*
 * zr/schedule.h - DeepSpeed's learning-rate schedulers (WarmupLR,
 * WarmupDecayLR, WarmupCosineLR) with DeepSpeed's formulas, so a
 * ds_config.json scheduler section trains with the same rates in zr.
 *
 * Steps count from 0 (DeepSpeed's last_batch_iteration after the first
 * step() call is 0). The warm-up length is max(2, warmup_num_steps) as in
 * DeepSpeed; during warm-up gamma is log(step + 1) / log(warmup) ("log",
 * DeepSpeed's default) or step / warmup ("linear").
 *   WarmupLR        lr = min_lr + (max_lr - min_lr) * gamma, then max_lr
 *   WarmupDecayLR   the same warm-up, then gamma falls linearly to 0 at
 *                   total_num_steps: (total - step) / max(1, total - warmup)
 *   WarmupCosineLR  lr = base_lr * ratio; warm-up ratio from
 *                   warmup_min_ratio to 1, then a half cosine from 1 to
 *                   cos_min_ratio over total - warmup steps, held there after
 * Nothing here depends on MPI or on the configuration reader.
 */
#ifndef ZR_SCHEDULE_H
#define ZR_SCHEDULE_H

#include <stdint.h>

#include "zr/base.h"

typedef enum zr_lr_kind {
    ZR_LR_CONSTANT = 0, /* no scheduler: the optimizer's lr at every step */
    ZR_LR_WARMUP,       /* WarmupLR */
    ZR_LR_WARMUP_DECAY, /* WarmupDecayLR */
    ZR_LR_WARMUP_COSINE /* WarmupCosineLR */
} zr_lr_kind;

typedef enum zr_lr_warmup { ZR_WARMUP_LOG = 0, ZR_WARMUP_LINEAR } zr_lr_warmup;

typedef struct zr_lr_schedule {
    zr_lr_kind kind;
    zr_lr_warmup warmup;
    double lr;            /* the optimizer's lr (WarmupCosineLR's base, constant's value) */
    double warmup_min_lr; /* WarmupLR, WarmupDecayLR */
    double warmup_max_lr; /* WarmupLR, WarmupDecayLR */
    int64_t warmup_num_steps;
    int64_t total_num_steps; /* WarmupDecayLR, WarmupCosineLR */
    double warmup_min_ratio; /* WarmupCosineLR */
    double cos_min_ratio;    /* WarmupCosineLR */
} zr_lr_schedule;

/* DeepSpeed's scheduler type name ("" or "constant" for none) to a kind. */
zr_status zr_lr_kind_parse(const char *name, zr_lr_kind *out);

/* "log" or "linear". */
zr_status zr_lr_warmup_parse(const char *name, zr_lr_warmup *out);

/* The learning rate of step (0-based, >= 0). */
double zr_lr_at(const zr_lr_schedule *s, int64_t step);

#endif /* ZR_SCHEDULE_H */
