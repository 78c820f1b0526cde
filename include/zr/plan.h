/*
 * zr/plan.h - choosing the sharding and the ZeRO++ techniques before the
 * first step, from measurements of the allocation: the probe, the cost
 * model and the planner behind `zr probe`, `zr plan` and `zr train --auto`.
 *
 *   probe    (collective, a few seconds) times what the cost model needs on
 *            this allocation, with every rank busy at once as in training:
 *            forward and backward of the model's own units at each
 *            micro-batch size, the codecs and AdamW per element, and
 *            point-to-point bandwidth and latency inside a node and between
 *            nodes through zr's transport; and (on CPUs) a few steps of three
 *            reference configurations through the real engine, which the
 *            cost model is calibrated on; written as JSON.
 *   cost     for a model, a layout (nodes x ranks per node), a choice
 *            (stage, qwZ, hpZ, qgZ, prefetch, micro-batch x accumulation)
 *            and a probe: the bytes of every collective of one step, per
 *            kind, exactly as the engine's counters will count them; the
 *            memory the engine and model will hold (zr_gpt_engine_predict,
 *            and the pool's peak exactly); and the step time: a dry engine
 *            (zr_engine_init_dry) runs the trainer's schedule and reports
 *            each collective, its CPU work and each unit's computation,
 *            priced with the probe's figures and its measured overlap,
 *            calibrated on the probe's reference steps (cost.c).
 *   plan     every valid choice for a global batch, those over the memory
 *            limit discarded, ranked by predicted tokens/s.
 *
 * Layers: the plan sits on the configuration (src/config: it writes the
 * winner as a config `zr train --config` accepts, and costs the engine
 * settings zr_config_engine derives from it), beside the trainer (neither
 * uses the other) and below the CLI.
 */
#ifndef ZR_PLAN_H
#define ZR_PLAN_H

#include "zr/config.h"
#include "zr/gpt_engine.h"

#define ZR_PROBE_VERSION 3
#define ZR_PROBE_MAX_B   8 /* micro-batch sizes measured: 1, 2, 4, ... */
/* The largest micro-batch a probe measures (zr probe --max-micro-batch). */
#define ZR_PROBE_MAX_MICRO (1 << 16)
/* The most ranks a plan is made for (2^24, more than any machine has): a probe file that says
   more is refused naming "world", and the planner's time and memory do not grow with the ranks. */
#define ZR_PLAN_MAX_WORLD (1 << 24)

/* Seconds of forward and backward of one micro-batch of b sequences, per unit kind. */
typedef struct zr_probe_compute {
    int batch;        /* b */
    double fwd_embed; /* unit 0: token + position embedding */
    double fwd_block; /* one transformer block */
    double fwd_head;  /* final LayerNorm, tied LM head, loss */
    double bwd_head;  /* their backward */
    double bwd_block; /* one block's backward (with its recompute, if on) */
    double bwd_embed; /* the embedding's backward */
} zr_probe_compute;

typedef struct zr_probe {
    int version;
    int gpu;  /* 1: the figures are a GPU run's (zr.device), the memory the GPU's */
    int bf16; /* a GPU's compute type: bf16 (bf16.enabled), else fp32 */
    int world, nodes, ranks_per_node; /* the allocation measured */
    int threads;                      /* BLAS threads per rank */
    /* the shape the compute figures belong to */
    int layers, heads, channels, vocab, padded_vocab, seq_len, max_seq_len, recompute;
    /* its architecture (zr_model_arch) and, for the Llama family, the rest of what a unit's
       compute depends on (0 for GPT-2, and in a file of an earlier zr) */
    int arch, kv_heads, head_dim, intermediate, tied, qkv_bias;
    int ncompute;
    zr_probe_compute compute[ZR_PROBE_MAX_B];
    /* seconds per element, every rank at once */
    double adamw;    /* one AdamW update */
    double sumsq;    /* the grad-norm sum of squares, and gradient zeroing */
    double bf16_enc; /* fp32 -> bf16 */
    double bf16_dec; /* bf16 -> fp32 */
    double f32_add;  /* fp32 accumulate (reductions, shard accumulation) */
    double q_enc[2]; /* quantize, [0] INT8, [1] INT4 (default group) */
    double q_dec[2]; /* dequantize (and add) */
    /* transport: bytes per second per rank with every rank of the level sending at once, with
       bw_msg bytes to each peer; and with bw_msg_small bytes (0: not measured, a file of an
       earlier zr: every size at the first) */
    double intra_bw, inter_bw;
    double intra_lat, inter_lat; /* seconds per exchange (small messages) */
    double bw_msg, bw_msg_small;
    double intra_bw_small, inter_bw_small;
    /* fraction of a transfer that proceeds while its rank computes (posted, not yet waited) */
    double overlap;
    double base_rss;     /* bytes a rank holds before the model and engine (program, MPI, BLAS);
                            a GPU: 0 (the device holds nothing of zr's before the model) */
    double mem_per_rank; /* the node's available memory / ranks per node (smallest node); a GPU:
                            its free memory / the ranks sharing it (smallest) */
    /* The references: a few steps of three configurations at the configuration's micro-batch and
       prefetch bucket (zr_probe_reference: [0] ZeRO-3, [1] ZeRO-3 + qwZ + qgZ, [2] stage 0), run
       through the real engine and model on every rank at once; the cost model is calibrated on
       them (cost.c). cal_batch 0: none ran (ZeRO-3 did not fit); cal_step[2] 0: stage 0 did not
       fit. */
    int cal_batch;
    double cal_prefetch;   /* their stage3_prefetch_bucket_size */
    double cal_step[3];    /* seconds per step: the slowest rank's, median over the steps */
    double cal_compute[3]; /* seconds per step outside waits and the optimizer, mean over ranks */
    double cal_comm[3];    /* seconds per step waiting for collectives, mean over ranks */
    double cal_optim[3];   /* seconds per step in the optimizer step, mean over ranks */
} zr_probe;

/*
 * The model cfg's run trains (as zr train builds it): where zr.model.init is
 * a Hugging Face folder, its config.json's shape (a Llama-family model) at
 * cfg's depth, its vocabulary vocab's (ZR_ERR_INVALID naming both
 * otherwise); else a GPT-2 of cfg's zr.model keys with vocabulary vocab.
 */
zr_status zr_plan_model(const zr_train_config *cfg, int vocab, zr_gpt_config *out);
/*
 * Where zr.model.init is a Hugging Face folder: its shape into cfg's
 * zr.model keys as zr train adopts it (a key given otherwise is refused);
 * nothing otherwise. zr probe, zr plan and zr train --auto call it first.
 */
zr_status zr_plan_adopt_model(zr_train_config *cfg);

/*
 * Collective over c: measure everything above for cfg's model shape (layers,
 * heads, channels, vocab, seq_len, activation checkpointing) at micro-batch
 * sizes 1, 2, 4, ... up to max_b (at most ZR_PROBE_MAX_B sizes). Every rank
 * returns the same probe (times are the slowest rank's).
 */
zr_status zr_probe_run(zr_comm *c, const zr_train_config *cfg, int vocab, int max_b, zr_probe *out);

/* JSON (one object, keys as in the struct); reading validates every key and range. */
zr_status zr_probe_write(const char *path, const zr_probe *p);
zr_status zr_probe_read(const char *path, zr_probe *p);

/* ---- the cost model ---------------------------------------------------------- */

/* What the planner varies; everything else comes from the user's configuration. */
typedef struct zr_plan_choice {
    int stage;         /* 0..3 */
    int qwz, qwz_bits; /* stage 3 */
    int hpz; /* zero_hpz_partition_size: hpZ group h > 1 dividing the ranks per node; 1 = off;
                0 with one rank per node = a secondary over a group of one (a bf16 copy of each
                unit, so backward gathers send nothing) */
    int qgz, qgz_bits;         /* stage 2, 3 */
    long long prefetch_bucket; /* stage3_prefetch_bucket_size, elements; 0 = no prefetch */
    int micro_batch, accum;
} zr_plan_choice;

/* Reference r of the probe at micro-batch b: 0 ZeRO-3, 1 ZeRO-3 + qwZ + qgZ, 2 stage 0. */
zr_plan_choice zr_probe_reference(int r, int b, long long prefetch_bucket);

/* Predicted for one rank and one optimizer step. */
typedef struct zr_plan_cost {
    zr_traffic traffic; /* bytes per kind, as the engine's counters count one step (no CONTROL) */
    double bytes_intra, bytes_inter; /* their sums */
    double t_compute;                /* forward and backward of every micro-batch */
    double t_codec;   /* wire conversions, (de)quantization, reductions on the CPU, and (calibrated)
                         the network's CPU time per inter-node byte */
    double t_comm;    /* every transfer, alone */
    double t_exposed; /* the part of t_comm not hidden behind computation */
    double t_optim;   /* AdamW, grad norm, clearing */
    double t_step;    /* t_compute + t_codec + t_exposed + t_optim */
    double tokens_per_s;
    zr_gpt_memory_prediction mem; /* allowance = the probe's base_rss when it has one */
} zr_plan_cost;

/* The user's configuration with a choice applied (batch keys, stage, switches, bits, bucket). */
void zr_plan_apply(zr_train_config *cfg, const zr_plan_choice *ch);

/*
 * Cost of cfg (model shape, wires, buckets, with ch applied) on nodes x D
 * ranks with vocabulary vocab. probe may be NULL: bytes and memory only.
 * An invalid combination (e.g. hpZ not dividing D) is ZR_ERR_INVALID.
 */
zr_status zr_plan_cost_of(const zr_train_config *cfg, int vocab, int nodes, int D,
                          const zr_plan_choice *ch, const zr_probe *probe, zr_plan_cost *out);

/*
 * The cost model's calibration on the probe's reference steps (cost.c): one
 * set for stage 3, one for stages 0-2. Neutral ({1, 0, 1, 1, 0}) without
 * reference steps.
 */
typedef struct zr_plan_calib {
    double k_compute; /* measured over priced computation */
    double c_byte;    /* seconds of CPU per inter-node byte (0 on GPUs) */
    double k_optim;   /* measured over priced optimizer */
    double k_comm;    /* scale on transfer times (< 1: they hid more than the overlap says) */
    double t_sync;    /* the least a synchronising wait exposes, seconds */
} zr_plan_calib;
typedef struct zr_plan_calibration {
    int calibrated; /* 0: neutral (the probe ran no reference steps) */
    zr_plan_calib stage3, stage012;
    double k_optim_replicated; /* stage 0's optimizer (every rank updates the whole model) */
    int layers;                /* zr_plan_run: the depth the references ran (the probe's) */
} zr_plan_calibration;

/* Fit the calibration to probe's reference steps; cfg: the model they ran (probe may be NULL). */
zr_status zr_plan_calibrate(const zr_train_config *cfg, int vocab, const zr_probe *probe,
                            zr_plan_calibration *out);
/*
 * Whether the probe's link figures look off: the smallest transfer scale
 * fitted without a wait floor, 1 where none is under 1 or nothing was fitted.
 * Under 0.5 the reference steps waited less than half of what the measured
 * links predict (zr plan warns). With a floor, stage 3's scale only splits
 * the references' waiting between bytes and waits: not counted.
 */
double zr_plan_link_shrink(const zr_plan_calibration *cal);
/* zr_plan_cost_of with a calibration already fitted (the planner fits it once). */
zr_status zr_plan_cost_calibrated(const zr_train_config *cfg, int vocab, int nodes, int D,
                                  const zr_plan_choice *ch, const zr_probe *probe,
                                  const zr_plan_calibration *cal, zr_plan_cost *out);

/* ---- the planner --------------------------------------------------------------- */

typedef struct zr_plan_entry {
    zr_plan_choice choice;
    zr_plan_cost cost;
} zr_plan_entry;

typedef struct zr_plan_result {
    int n, considered, over_memory; /* entries kept (ranked), enumerated, discarded for memory */
    zr_plan_entry *entries;         /* owned; best first */
    char why[512];                  /* one line: why the first one wins */
    zr_plan_calibration cal;        /* the probe's, as every entry was priced */
} zr_plan_result;

/*
 * Every valid choice for cfg's global batch (train_batch_size, or micro x
 * accumulation x world when it is 0) on the probe's layout (nodes, D),
 * discarding those whose predicted peak exceeds mem_limit bytes (0 = no
 * limit), ranked by predicted tokens/s. qwZ and qgZ are never coarser than
 * cfg's zr.quant.qwz_bits and qgz_bits (INT8 weights, INT4 gradients by
 * default: ZeRO++'s validated pre-training setting). Impossible requests (no micro-batch
 * divides the batch, nothing fits the limit, a layout the engine cannot
 * run, a probe of another model) are ZR_ERR_INVALID with the reason.
 */
zr_status zr_plan_run(const zr_train_config *cfg, int vocab, const zr_probe *probe,
                      double mem_limit, zr_plan_result *out);
/*
 * Whether probe's figures price cfg's run (zr_plan_run asks first): the same
 * device and compute type, and the same model but for the depth
 * (architecture, width, heads, sequence, positions, vocabulary, the Llama
 * family's kv heads, head size, MLP width, tied head and biases,
 * recomputation and, on the CPU, threads); ZR_ERR_INVALID naming what
 * differs.
 */
zr_status zr_plan_check_probe(const zr_train_config *cfg, int vocab, const zr_probe *probe);
void zr_plan_result_free(zr_plan_result *r);

/* "stage 3 + qwZ(8) + hpZ(2) + qgZ(4), micro 2 x 4, prefetch 5e7" */
void zr_plan_describe(const zr_plan_choice *ch, char *buf, size_t n);

#endif /* ZR_PLAN_H */
