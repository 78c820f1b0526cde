/*
 * config.c - the configuration of "zr train": one table of every key, and
 * everything else (defaults, the JSON reader, command-line flags, --help, the
 * printout and the JSON dump of the effective configuration) generated from
 * it, so that the five cannot drift apart.
 *
 * Keys are DeepSpeed's where a DeepSpeed key means the same thing (a user's
 * ds_config.json should mostly just work), and zr's own under "zr". DeepSpeed
 * keys that make no sense for zr (CPU offload, bucket tuning of the PyTorch
 * implementation, ...) are accepted with a one-line note rather than flagged
 * as unknown, because the file is usually shared with a DeepSpeed run; keys
 * that would silently change the meaning of training (fp16, Adam without
 * decoupled weight decay) are refused. Truly unknown keys are warnings, not
 * errors, with a did-you-mean, since a typo must not be silently ignored but
 * must not stop a job that DeepSpeed itself would run either.
 *
 * cJSON reports no line numbers; the error offset it returns is turned into
 * line:column here.
 */
#define _POSIX_C_SOURCE 200809L

#include "zr/config.h"
#include "zr/model.h"

#include <cJSON.h>

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef void (*warn_fn)(void *ctx, const char *msg);

typedef enum key_type {
    K_INT,      /* int */
    K_I64,      /* long long */
    K_U64,      /* unsigned long long (the seed; exact up to 2^53 through JSON) */
    K_DBL,      /* double */
    K_BOOL,     /* int 0/1, JSON true/false */
    K_STR,      /* char[size] */
    K_ENUM,     /* char[size], one of choices (matched case-insensitively, stored canonically) */
    K_PAIR,     /* two doubles, JSON [a, b] (betas) */
    K_NOEFFECT, /* a DeepSpeed key zr accepts and ignores (any value), with a note */
    K_ALIAS     /* a second JSON name of the key at target (DeepSpeed's non-stage3 names) */
} key_type;

/* Range flags: which bounds are open. */
#define LO_OPEN 1u
#define HI_OPEN 2u

#define NOFIELD ((size_t)-1)

typedef struct cfg_key {
    const char *path;    /* full dotted JSON path */
    key_type type;
    size_t off, off2;    /* offsets into zr_train_config (off2: second of a pair); NOFIELD = none */
    size_t size;         /* string buffer size */
    double def, def2;    /* numeric / bool / pair default */
    const char *sdef;    /* string default */
    double lo, hi;       /* numeric range */
    unsigned open;       /* LO_OPEN / HI_OPEN */
    int multiple;        /* integers: must be a multiple of this (0 = any) */
    const char *choices; /* enum: "a|b|c" ("" first = empty allowed); int: "4|8" */
    const char *flag;    /* short command-line alias without "--", or NULL */
    unsigned given;      /* ZR_GIVEN_* bit set when a file or flag sets the key */
    const char *refuse;  /* value refused with why ("true", "false", "fp16") */
    const char *why;     /* NOEFFECT: why it has no effect; refuse: why it is refused */
    const char *target;  /* ALIAS: path of the real key */
    const char *help;
} cfg_key;

#define F(m) offsetof(zr_train_config, m)
#define IMAX ((double)INT_MAX)
#define BIG 1e15

/* clang-format off */
#define INT(p, m, d, l, h, fl, hp) \
    {.path = p, .type = K_INT, .off = F(m), .off2 = NOFIELD, .def = d, .lo = l, .hi = h, .flag = fl, .help = hp}
#define INTG(p, m, d, l, h, fl, g, hp) \
    {.path = p, .type = K_INT, .off = F(m), .off2 = NOFIELD, .def = d, .lo = l, .hi = h, .flag = fl, .given = g, .help = hp}
#define INTC(p, m, d, ch, hp) \
    {.path = p, .type = K_INT, .off = F(m), .off2 = NOFIELD, .def = d, .lo = 0, .hi = IMAX, .choices = ch, .help = hp}
#define INTM(p, m, d, l, h, mul, hp) \
    {.path = p, .type = K_INT, .off = F(m), .off2 = NOFIELD, .def = d, .lo = l, .hi = h, .multiple = mul, .help = hp}
#define I64(p, m, d, l, h, hp) \
    {.path = p, .type = K_I64, .off = F(m), .off2 = NOFIELD, .def = d, .lo = l, .hi = h, .help = hp}
#define U64(p, m, d, fl, hp) \
    {.path = p, .type = K_U64, .off = F(m), .off2 = NOFIELD, .def = d, .lo = 0, .hi = 9007199254740992.0, .flag = fl, .help = hp}
#define DBL(p, m, d, l, h, o, fl, hp) \
    {.path = p, .type = K_DBL, .off = F(m), .off2 = NOFIELD, .def = d, .lo = l, .hi = h, .open = o, .flag = fl, .help = hp}
#define BOOL(p, m, d, fl, hp) \
    {.path = p, .type = K_BOOL, .off = F(m), .off2 = NOFIELD, .def = d, .flag = fl, .help = hp}
#define BOOLG(p, m, d, fl, g, hp) \
    {.path = p, .type = K_BOOL, .off = F(m), .off2 = NOFIELD, .def = d, .flag = fl, .given = g, .help = hp}
#define STR(p, m, d, fl, hp) \
    {.path = p, .type = K_STR, .off = F(m), .off2 = NOFIELD, .size = sizeof(((zr_train_config *)0)->m), .sdef = d, .flag = fl, .help = hp}
#define ENUM(p, m, d, ch, rf, wh, hp) \
    {.path = p, .type = K_ENUM, .off = F(m), .off2 = NOFIELD, .size = sizeof(((zr_train_config *)0)->m), .sdef = d, .choices = ch, .refuse = rf, .why = wh, .help = hp}
#define PAIR(p, m1, m2, d1, d2, l, h, o, hp) \
    {.path = p, .type = K_PAIR, .off = F(m1), .off2 = F(m2), .def = d1, .def2 = d2, .lo = l, .hi = h, .open = o, .help = hp}
/* A DeepSpeed boolean zr has no field for: the other value is refused. */
#define REFUSE(p, ok, rf, wh) \
    {.path = p, .type = K_BOOL, .off = NOFIELD, .off2 = NOFIELD, .def = ok, .refuse = rf, .why = wh}
#define NOEFFECT(p, wh) \
    {.path = p, .type = K_NOEFFECT, .off = NOFIELD, .off2 = NOFIELD, .why = wh}
#define ALIAS(p, t) \
    {.path = p, .type = K_ALIAS, .off = NOFIELD, .off2 = NOFIELD, .target = t}

#define W_OFFLOAD "zr keeps parameters, gradients and optimizer states in host memory already"
#define W_BUCKET "zr moves one unit (layer) at a time instead of PyTorch buckets"
#define W_TORCH "a detail of DeepSpeed's PyTorch implementation"
#define W_FP16 "fp16 training is not supported (see fp16.enabled)"
#define W_MONITOR "zr writes JSON-lines metrics instead (zr.train.metrics_path)"

static const cfg_key keys[] = {
    /* ---- DeepSpeed top level ---- */
    INTG("train_batch_size", train_batch_size, 0, 0, IMAX, "batch", ZR_GIVEN_TRAIN_BATCH,
         "global sequences per optimizer step = micro batch * accumulation * world size; 0 = derived"),
    INTG("train_micro_batch_size_per_gpu", train_micro_batch_size_per_gpu, 4, 0, 1 << 20, "micro-batch", ZR_GIVEN_MICRO_BATCH,
         "sequences per rank per forward/backward; 0 = derived from the other two"),
    INTG("gradient_accumulation_steps", gradient_accumulation_steps, 1, 0, 1 << 20, "grad-accum", ZR_GIVEN_GRAD_ACCUM,
         "micro-batches per optimizer step; 0 = derived"),
    DBL("gradient_clipping", gradient_clipping, 1.0, 0, INFINITY, 0, "clip",
        "clip the global gradient norm to this; 0 disables"),
    INT("steps_per_print", steps_per_print, 10, 1, IMAX, NULL, "print progress every this many steps"),
    ENUM("communication_data_type", communication_data_type, "", "|bf16|fp32", "fp16",
         "zr computes in fp32 on the CPU and sends bf16 on the wire; use \"bf16\" or \"fp32\"",
         "wire type of exact (unquantized) gathers and reductions; \"\" = bf16 if bf16.enabled, else fp32"),
    BOOL("bf16.enabled", bf16_enabled, 1, "bf16",
         "16-bit (bf16) wire for exact collectives; compute stays fp32 on the CPU"),
    REFUSE("fp16.enabled", 0, "true",
           "zr computes in fp32 on the CPU and uses bf16 on the wire; use \"bf16\": {\"enabled\": true} instead"),
    NOEFFECT("fp16.loss_scale", W_FP16), NOEFFECT("fp16.initial_scale_power", W_FP16),
    NOEFFECT("fp16.loss_scale_window", W_FP16), NOEFFECT("fp16.hysteresis", W_FP16),
    NOEFFECT("fp16.consecutive_hysteresis", W_FP16), NOEFFECT("fp16.min_loss_scale", W_FP16),
    NOEFFECT("fp16.auto_cast", W_FP16),
    NOEFFECT("prescale_gradients", "zr averages gradients in fp32 before the wire"),
    NOEFFECT("gradient_predivide_factor", "zr averages gradients in fp32 before the wire"),
    NOEFFECT("wall_clock_breakdown", "zr reports per-phase times in its step metrics"),
    NOEFFECT("memory_breakdown", W_TORCH),
    NOEFFECT("dump_state", W_TORCH),
    NOEFFECT("zero_allow_untested_optimizer", "zr has one optimizer, AdamW on shards"),
    NOEFFECT("zero_force_ds_cpu_optimizer", "zr has one optimizer, AdamW on shards"),
    NOEFFECT("sparse_gradients", W_TORCH),
    NOEFFECT("data_types", "zr accumulates gradients in fp32"),
    NOEFFECT("amp", W_TORCH),
    ALIAS("activation_checkpointing.partition_activations", "zr.model.activation_checkpointing"),
    NOEFFECT("activation_checkpointing.cpu_checkpointing", W_OFFLOAD),
    NOEFFECT("activation_checkpointing.contiguous_memory_optimization", W_TORCH),
    NOEFFECT("activation_checkpointing.number_checkpoints", "zr checkpoints at every block"),
    NOEFFECT("activation_checkpointing.synchronize_checkpoint_boundary", W_TORCH),
    NOEFFECT("activation_checkpointing.profile", W_MONITOR),
    NOEFFECT("checkpoint", "zr checkpoints are configured under zr.checkpoint"),
    NOEFFECT("aio", W_OFFLOAD),
    NOEFFECT("flops_profiler", W_MONITOR), NOEFFECT("tensorboard", W_MONITOR),
    NOEFFECT("wandb", W_MONITOR), NOEFFECT("csv_monitor", W_MONITOR),
    NOEFFECT("comet", W_MONITOR), NOEFFECT("comms_logger", "zr counts its traffic exactly per collective kind"),

    /* ---- optimizer ---- */
    ENUM("optimizer.type", optimizer_type, "AdamW", "AdamW|Adam", NULL, NULL,
         "\"AdamW\"; \"Adam\" is DeepSpeed's Adam with adam_w_mode (decoupled weight decay), i.e. AdamW"),
    DBL("optimizer.params.lr", lr, 1e-3, 0, INFINITY, LO_OPEN, "lr", "peak learning rate"),
    PAIR("optimizer.params.betas", beta1, beta2, 0.9, 0.95, 0, 1, HI_OPEN, "Adam moment decay rates [beta1, beta2]"),
    DBL("optimizer.params.eps", eps, 1e-8, 0, INFINITY, LO_OPEN, NULL, "Adam denominator epsilon"),
    DBL("optimizer.params.weight_decay", weight_decay, 0.1, 0, INFINITY, 0, "weight-decay",
        "decoupled weight decay (matrices only; biases and norms are not decayed)"),
    REFUSE("optimizer.params.adam_w_mode", 1, "false", "zr implements AdamW (decoupled weight decay) only"),
    REFUSE("optimizer.params.bias_correction", 1, "false", "zr's AdamW always corrects the moment bias"),
    REFUSE("optimizer.params.amsgrad", 0, "true", "zr implements AdamW without AMSGrad"),
    NOEFFECT("optimizer.params.torch_adam", W_TORCH),
    NOEFFECT("optimizer.params.fused", W_TORCH),

    /* ---- scheduler ---- */
    ENUM("scheduler.type", scheduler_type, "WarmupCosineLR", "|WarmupLR|WarmupDecayLR|WarmupCosineLR", NULL, NULL,
         "learning-rate schedule; \"\" = constant optimizer.params.lr"),
    DBL("scheduler.params.warmup_min_lr", warmup_min_lr, 0, 0, INFINITY, 0, NULL,
        "WarmupLR/WarmupDecayLR: lr at step 0"),
    DBL("scheduler.params.warmup_max_lr", warmup_max_lr, 0, 0, INFINITY, 0, NULL,
        "WarmupLR/WarmupDecayLR: lr after warm-up; 0 = optimizer.params.lr"),
    INT("scheduler.params.warmup_num_steps", warmup_num_steps, 20, 0, IMAX, "warmup", "warm-up steps"),
    INT("scheduler.params.total_num_steps", total_num_steps, 0, 0, IMAX, NULL,
        "WarmupDecayLR/WarmupCosineLR: steps until the final lr; 0 = zr.train.train_steps"),
    DBL("scheduler.params.warmup_min_ratio", warmup_min_ratio, 0, 0, 1, 0, NULL,
        "WarmupCosineLR: lr at step 0 as a fraction of optimizer.params.lr"),
    DBL("scheduler.params.cos_min_ratio", cos_min_ratio, 0.1, 0, 1, 0, NULL,
        "WarmupCosineLR: final lr as a fraction of optimizer.params.lr"),
    ENUM("scheduler.params.warmup_type", warmup_type, "log", "log|linear", NULL, NULL,
         "warm-up curve (DeepSpeed's default is log)"),
    NOEFFECT("scheduler.params.last_batch_iteration", "zr resumes the schedule at the checkpoint's step"),

    /* ---- zero_optimization ---- */
    INT("zero_optimization.stage", stage, 3, 0, 3, "stage",
        "0 replicated, 1 + optimizer states sharded, 2 + gradients, 3 + parameters"),
    BOOLG("zero_optimization.zero_quantized_weights", zero_quantized_weights, 1, "qwz", ZR_GIVEN_QWZ,
          "qwZ: quantized weight all-gather (stage 3; off by default below it)"),
    INTG("zero_optimization.zero_hpz_partition_size", zero_hpz_partition_size, 0, 0, 1 << 20, "hpz", ZR_GIVEN_HPZ,
         "hpZ: secondary weight partition group size (stage 3); 1 = off, 0 = ranks per node"),
    BOOLG("zero_optimization.zero_quantized_gradients", zero_quantized_gradients, 1, "qgz", ZR_GIVEN_QGZ,
          "qgZ: quantized hierarchical gradient reduce-scatter (stage >= 2; off by default below it)"),
    BOOL("zero_optimization.overlap_comm", overlap_comm, 1, "overlap",
         "overlap communication with compute (prefetch, asynchronous reduction)"),
    I64("zero_optimization.stage3_max_live_parameters", stage3_max_live_parameters, 1e9, 1, BIG,
        "stage 3: elements of gathered parameters resident at once"),
    I64("zero_optimization.stage3_prefetch_bucket_size", stage3_prefetch_bucket_size, 5e7, 0, BIG,
        "stage 3: elements gathered ahead of use (prefetch budget)"),
    I64("zero_optimization.reduce_bucket_size", reduce_bucket_size, 1e7, 1, BIG,
        "elements of gradient reductions in flight; the oldest finishes before more would "
        "exceed it (DeepSpeed's default 5e8 would hold most gradients of a mid-sized model)"),
    ALIAS("zero_optimization.max_live_parameters", "zero_optimization.stage3_max_live_parameters"),
    ALIAS("zero_optimization.prefetch_bucket_size", "zero_optimization.stage3_prefetch_bucket_size"),
    NOEFFECT("zero_optimization.contiguous_gradients", W_BUCKET),
    NOEFFECT("zero_optimization.reduce_scatter", "zr always reduce-scatters gradients in stages 2 and 3"),
    NOEFFECT("zero_optimization.allgather_partitions", "zr always all-gathers updated partitions"),
    NOEFFECT("zero_optimization.allgather_bucket_size", W_BUCKET),
    NOEFFECT("zero_optimization.use_multi_rank_bucket_allreduce", W_BUCKET),
    NOEFFECT("zero_optimization.load_from_fp32_weights", "zr checkpoints hold fp32 masters only"),
    NOEFFECT("zero_optimization.elastic_checkpoint", "zr checkpoints hold fp32 masters only"),
    NOEFFECT("zero_optimization.offload_param", W_OFFLOAD),
    NOEFFECT("zero_optimization.offload_optimizer", W_OFFLOAD),
    NOEFFECT("zero_optimization.cpu_offload", W_OFFLOAD),
    NOEFFECT("zero_optimization.cpu_offload_param", W_OFFLOAD),
    NOEFFECT("zero_optimization.cpu_offload_use_pin_memory", W_OFFLOAD),
    NOEFFECT("zero_optimization.round_robin_gradients", W_OFFLOAD),
    NOEFFECT("zero_optimization.zenflow", W_OFFLOAD),
    NOEFFECT("zero_optimization.sub_group_size", W_BUCKET),
    NOEFFECT("zero_optimization.stage3_param_persistence_threshold", "zr shards every unit"),
    NOEFFECT("zero_optimization.param_persistence_threshold", "zr shards every unit"),
    NOEFFECT("zero_optimization.stage3_model_persistence_threshold", "zr shards every unit"),
    NOEFFECT("zero_optimization.model_persistence_threshold", "zr shards every unit"),
    NOEFFECT("zero_optimization.stage3_max_reuse_distance", "zr's schedule is static; see stage3_max_live_parameters"),
    NOEFFECT("zero_optimization.max_reuse_distance", "zr's schedule is static; see stage3_max_live_parameters"),
    NOEFFECT("zero_optimization.stage3_gather_16bit_weights_on_model_save", "zr checkpoints hold fp32 masters only"),
    NOEFFECT("zero_optimization.gather_16bit_weights_on_model_save", "zr checkpoints hold fp32 masters only"),
    NOEFFECT("zero_optimization.stage3_gather_fp16_weights_on_model_save", "zr checkpoints hold fp32 masters only"),
    NOEFFECT("zero_optimization.stage3_module_granularity_threshold", "zr fetches one unit (layer) at a time"),
    NOEFFECT("zero_optimization.module_granularity_threshold", "zr fetches one unit (layer) at a time"),
    NOEFFECT("zero_optimization.stage3_use_all_reduce_for_fetch_params", "zr gathers parameters with all-gathers"),
    NOEFFECT("zero_optimization.use_all_reduce_for_fetch_params", "zr gathers parameters with all-gathers"),
    NOEFFECT("zero_optimization.stage3_allgather_sequential", "zr gathers one unit at a time"),
    NOEFFECT("zero_optimization.allgather_sequential", "zr gathers one unit at a time"),
    NOEFFECT("zero_optimization.ignore_unused_parameters", "every parameter of zr's GPT gets a gradient"),
    NOEFFECT("zero_optimization.legacy_stage1", W_TORCH),
    NOEFFECT("zero_optimization.zero_quantized_nontrainable_weights", "zr's GPT has no frozen weights"),
    NOEFFECT("zero_optimization.zeropp_loco_param", "use zr.quant.qgz_error_feedback"),
    NOEFFECT("zero_optimization.mics_shard_size", "zr implements ZeRO++ hpZ, not MiCS"),
    NOEFFECT("zero_optimization.mics_hierarchical_params_gather", "zr implements ZeRO++ hpZ, not MiCS"),
    NOEFFECT("zero_optimization.memory_efficient_linear", W_TORCH),
    NOEFFECT("zero_optimization.pipeline_loading_checkpoint", W_TORCH),
    NOEFFECT("zero_optimization.override_module_apply", W_TORCH),
    NOEFFECT("zero_optimization.log_trace_cache_warnings", W_TORCH),
    NOEFFECT("zero_optimization.enable_sanity_checks", "zr checks shard layouts always"),
    NOEFFECT("zero_optimization.save_muon_momentum_buffer_in_memory", W_OFFLOAD),
    NOEFFECT("zero_optimization.leaf_module", "zr fetches one unit (layer) at a time"),

    /* ---- zr's own section ---- */
    INTG("zr.model.layers", layers, 2, 1, 1024, "layers", ZR_GIVEN_LAYERS, "transformer blocks"),
    INTG("zr.model.heads", heads, 4, 1, 1024, "heads", ZR_GIVEN_HEADS, "attention heads (must divide channels)"),
    INTG("zr.model.channels", channels, 128, 1, 1 << 16, "channels", ZR_GIVEN_CHANNELS, "embedding width"),
    INT("zr.model.seq_len", seq_len, 64, 1, 1 << 20, "seq-len", "tokens per training sequence (at most zr.model.max_seq_len)"),
    INTG("zr.model.max_seq_len", max_seq_len, 1024, 1, 1 << 20, "max-seq-len", ZR_GIVEN_MAX_SEQ_LEN,
         "positions the model has (rows of wpe; GPT-2: 1024); with zr.model.init: the file's"),
    INT("zr.model.vocab_size", vocab_size, 0, 0, 1 << 24, "vocab-size",
        "vocabulary; 0 = the data's (text 256, llm.c GPT-2 shard 50257, llama-3 shard 128256); must exceed every token"),
    STR("zr.model.init", init_path, "", "init",
        "llm.c GPT-2 model file (e.g. gpt2_124M.bin) to start from instead of a random init; "
        "its shape is the model's (zr.model.* keys given must match it)"),
    BOOL("zr.model.activation_checkpointing", activation_checkpointing, 0, "checkpoint-activations",
         "keep only each block's input and recompute the block's forward in the backward "
         "(bit-identical gradients without hpZ; about a third more compute, far fewer activations)"),
    STR("zr.data.path", data_path, "", "data",
        "UTF-8 text file or llm.c token shard (GPT-2 or llama-3, recognised by its header); \"\" = the bundled corpus"),
    INT("zr.data.val_every", val_every, 50, 0, IMAX, "val-every", "steps between validation passes; 0 = never"),
    INT("zr.data.val_batches", val_batches, 4, 1, IMAX, NULL, "micro-batches per validation pass"),
    INT("zr.train.train_steps", train_steps, 200, 1, IMAX, "steps", "optimizer steps to run"),
    U64("zr.train.seed", seed, 1337, "seed", "seed of initialization and data order"),
    INT("zr.train.threads", threads, 1, 1, 1024, "threads", "BLAS threads per rank"),
    STR("zr.train.metrics_path", metrics_path, "", "metrics",
        "JSON-lines metrics, one line per step; \"\" = <zr.checkpoint.dir>/metrics.jsonl, or none"),
    INT("zr.train.max_nonfinite_steps", max_nonfinite_steps, 3, 0, IMAX, NULL,
        "stop with an error after this many consecutive steps with a non-finite loss or gradient "
        "norm (a diverged run); 0 = never stop"),
    DBL("zr.train.timeout_s", timeout_s, 300, 0, 1e9, 0, "timeout",
        "seconds a rank waits for the others without any progress before the job is aborted, "
        "with a report of which collective waits for which ranks; 0 = wait forever"),
    STR("zr.checkpoint.dir", checkpoint_dir, "", "ckpt-dir", "checkpoint folder; \"\" = no checkpoints"),
    INT("zr.checkpoint.every", checkpoint_every, 0, 0, IMAX, "ckpt-every", "steps between checkpoints; 0 = only at the end"),
    INT("zr.checkpoint.keep", keep_checkpoints, 2, 0, IMAX, NULL, "newest complete checkpoints kept; 0 = all"),
    BOOL("zr.checkpoint.resume", resume, 0, "resume", "continue from the newest complete checkpoint in zr.checkpoint.dir"),
    STR("zr.checkpoint.resume_from", resume_from, "", "resume-from",
        "continue from this checkpoint (a step_N folder), e.g. the newest intact one when the newest is damaged; newer checkpoints in zr.checkpoint.dir are moved aside, not deleted"),
    INTC("zr.quant.qwz_bits", qwz_bits, 8, "4|8", "qwZ weight bits"),
    INTM("zr.quant.qwz_group", qwz_group, 1024, 32, 65536, 8, "qwZ elements per quantization group"),
    INTC("zr.quant.qgz_bits", qgz_bits, 4, "4|8", "qgZ gradient bits"),
    INTM("zr.quant.qgz_group", qgz_group, 1024, 32, 65536, 8, "qgZ elements per quantization group"),
    BOOL("zr.quant.qgz_error_feedback", qgz_error_feedback, 0, NULL,
         "qgZ: carry each rank's quantization error into the next step"),
    INT("zr.quant.qgz_chunks", qgz_chunks, 1, 1, 64, NULL, "qgZ: pipeline the all-to-all in this many chunks"),
    BOOL("zr.compare_zero3", compare_zero3, 1, NULL, "also report the traffic plain ZeRO-3 (bf16) would have sent"),
};
/* clang-format on */

#define NKEYS (sizeof keys / sizeof keys[0])

/* ---- small helpers ------------------------------------------------------ */

static void *field(zr_train_config *c, size_t off)
{
    return (char *)c + off;
}

static const void *cfield(const zr_train_config *c, size_t off)
{
    return (const char *)c + off;
}

static int has_field(const cfg_key *k)
{
    return k->off != NOFIELD;
}

static const cfg_key *find_key(const char *path)
{
    for (size_t i = 0; i < NKEYS; i++) {
        if (strcmp(keys[i].path, path) == 0) {
            return &keys[i];
        }
    }
    return NULL;
}

static const cfg_key *find_flag(const char *flag)
{
    for (size_t i = 0; i < NKEYS; i++) {
        if (keys[i].flag != NULL && strcmp(keys[i].flag, flag) == 0) {
            return &keys[i];
        }
    }
    return NULL;
}

/* An alias stands for its target everywhere except in messages. */
static const cfg_key *resolve(const cfg_key *k)
{
    if (k != NULL && k->type == K_ALIAS) {
        k = find_key(k->target);
        ZR_ASSERT(k != NULL);
    }
    return k;
}

/* Is path a section (an object holding keys), e.g. "zero_optimization"? */
static int is_section(const char *path)
{
    size_t n = strlen(path);
    for (size_t i = 0; i < NKEYS; i++) {
        if (strncmp(keys[i].path, path, n) == 0 && keys[i].path[n] == '.') {
            return 1;
        }
    }
    return 0;
}

/* Length of the parent part of a dotted path ("a.b.c" -> 3, "a" -> 0). */
static size_t parent_len(const char *path)
{
    const char *dot = strrchr(path, '.');
    return dot == NULL ? 0 : (size_t)(dot - path);
}

static const char *leaf(const char *path)
{
    const char *dot = strrchr(path, '.');
    return dot == NULL ? path : dot + 1;
}

static void emit(warn_fn warn, void *ctx, const char *msg)
{
    if (warn != NULL) {
        warn(ctx, msg);
    } else {
        fprintf(stderr, "zr: %s\n", msg);
    }
}

/* Is the choice list "a|b|c" holding s? Returns the canonical spelling or NULL. */
static const char *match_choice(const char *choices, const char *s, char *buf, size_t n)
{
    const char *p = choices;
    for (;;) {
        const char *bar = strchr(p, '|');
        size_t len = bar == NULL ? strlen(p) : (size_t)(bar - p);
        if (len == strlen(s) && strncasecmp(p, s, len) == 0 && len < n) {
            memcpy(buf, p, len);
            buf[len] = '\0';
            return buf;
        }
        if (bar == NULL) {
            return NULL;
        }
        p = bar + 1;
    }
}

/* "\"a\", \"b\" or \"\"" (enum) / "4, 8" (int) for messages. */
static void describe_choices(const char *choices, int quoted, char *buf, size_t n)
{
    size_t used = 0;
    int count = 1;
    for (const char *q = choices; *q != '\0'; q++) {
        count += *q == '|';
    }
    const char *p = choices;
    for (int i = 0; i < count && used < n; i++) {
        const char *bar = strchr(p, '|');
        int len = bar == NULL ? (int)strlen(p) : (int)(bar - p);
        const char *sep = i == 0 ? "" : i == count - 1 ? " or " : ", ";
        int w = quoted ? snprintf(buf + used, n - used, "%s\"%.*s\"", sep, len, p)
                       : snprintf(buf + used, n - used, "%s%.*s", sep, len, p);
        used += w > 0 ? (size_t)w : 0;
        p = bar == NULL ? p + len : bar + 1;
    }
}

static void fmt_bound(char *buf, size_t n, double v)
{
    snprintf(buf, n, "%.10g", v);
}

/* What a key accepts, as a phrase: "an integer in [0, 3]", "true or false", ... */
static void describe_expect(const cfg_key *k, char *buf, size_t n)
{
    char lo[32], hi[32], range[80] = "";
    fmt_bound(lo, sizeof lo, k->lo);
    fmt_bound(hi, sizeof hi, k->hi);
    int integer = k->type == K_INT || k->type == K_I64 || k->type == K_U64;
    int unbounded = isinf(k->hi) || (integer && (k->hi >= IMAX));
    if (unbounded) {
        snprintf(range, sizeof range, " %s %s", (k->open & LO_OPEN) ? ">" : ">=", lo);
    } else {
        snprintf(range, sizeof range, " in %c%s, %s%c", (k->open & LO_OPEN) ? '(' : '[', lo, hi,
                 (k->open & HI_OPEN) ? ')' : ']');
    }
    char ch[160];
    switch (k->type) {
    case K_INT:
    case K_I64:
    case K_U64:
        if (k->choices != NULL) {
            describe_choices(k->choices, 0, ch, sizeof ch);
            snprintf(buf, n, "one of %s", ch);
        } else if (k->multiple > 1) {
            snprintf(buf, n, "a multiple of %d%s", k->multiple, range);
        } else {
            snprintf(buf, n, "an integer%s", range);
        }
        break;
    case K_DBL:
        snprintf(buf, n, "a number%s", range);
        break;
    case K_BOOL:
        snprintf(buf, n, "true or false");
        break;
    case K_STR:
        snprintf(buf, n, "a string of at most %zu characters", k->size - 1);
        break;
    case K_ENUM:
        describe_choices(k->choices, 1, ch, sizeof ch);
        snprintf(buf, n, "one of %s", ch);
        break;
    case K_PAIR:
        snprintf(buf, n, "an array of 2 numbers%s", range);
        break;
    case K_NOEFFECT:
    case K_ALIAS:
        snprintf(buf, n, "anything");
        break;
    }
}

/* Is v acceptable for numeric key k (integrality, range, choices, multiple)? */
static int num_ok(const cfg_key *k, double v)
{
    if (!isfinite(v)) {
        return 0;
    }
    int integer = k->type == K_INT || k->type == K_I64 || k->type == K_U64;
    if (integer && v != floor(v)) {
        return 0;
    }
    if (integer && k->choices != NULL) {
        char buf[32];
        snprintf(buf, sizeof buf, "%.0f", v);
        return match_choice(k->choices, buf, buf, sizeof buf) != NULL;
    }
    if (v < k->lo || v > k->hi || ((k->open & LO_OPEN) && v == k->lo) ||
        ((k->open & HI_OPEN) && v == k->hi)) {
        return 0;
    }
    if (integer && k->multiple > 1 && fmod(v, k->multiple) != 0) {
        return 0;
    }
    return 1;
}

/* A JSON value in a message: compact, cut at 48 characters. */
static void render_json(const cJSON *v, char *buf, size_t n)
{
    char *s = cJSON_PrintUnformatted(v);
    if (s == NULL) {
        snprintf(buf, n, "(unprintable)");
        return;
    }
    if (strlen(s) > 48) {
        snprintf(buf, n, "%.45s...", s);
    } else {
        snprintf(buf, n, "%s", s);
    }
    free(s);
}

/* ---- setting one key from a JSON value ---------------------------------- */

/*
 * where names the key for messages: `config.json: "zero_optimization.stage"`
 * or `flag --stage (zero_optimization.stage)`. null keeps the current value,
 * as DeepSpeed treats null as "use the default".
 */
static zr_status apply_value(zr_train_config *c, const cfg_key *k, const cJSON *v, const char *where,
                             warn_fn warn, void *ctx)
{
    char got[64], expect[200];
    if (k->type == K_NOEFFECT) {
        char msg[512];
        snprintf(msg, sizeof msg, "note: %s accepted, has no effect in zr: %s", where, k->why);
        emit(warn, ctx, msg);
        return ZR_OK;
    }
    if (cJSON_IsNull(v)) {
        return ZR_OK;
    }
    render_json(v, got, sizeof got);
    describe_expect(k, expect, sizeof expect);
    switch (k->type) {
    case K_INT:
    case K_I64:
    case K_U64:
    case K_DBL: {
        if (!cJSON_IsNumber(v) || !num_ok(k, v->valuedouble)) {
            ZR_FAIL(ZR_ERR_INVALID, "%s must be %s, got %s", where, expect, got);
        }
        double d = v->valuedouble;
        if (k->type == K_INT) {
            *(int *)field(c, k->off) = (int)d;
        } else if (k->type == K_I64) {
            *(long long *)field(c, k->off) = (long long)d;
        } else if (k->type == K_U64) {
            *(unsigned long long *)field(c, k->off) = (unsigned long long)d;
        } else {
            *(double *)field(c, k->off) = d;
        }
        break;
    }
    case K_BOOL: {
        if (!cJSON_IsBool(v)) {
            ZR_FAIL(ZR_ERR_INVALID, "%s must be %s, got %s", where, expect, got);
        }
        int b = cJSON_IsTrue(v);
        if (k->refuse != NULL && strcmp(k->refuse, b ? "true" : "false") == 0) {
            ZR_FAIL(ZR_ERR_INVALID, "%s: %s is not supported: %s", where, k->refuse, k->why);
        }
        if (has_field(k)) {
            *(int *)field(c, k->off) = b;
        }
        break;
    }
    case K_STR:
        if (!cJSON_IsString(v) || strlen(v->valuestring) >= k->size) {
            ZR_FAIL(ZR_ERR_INVALID, "%s must be %s, got %s", where, expect, got);
        }
        snprintf((char *)field(c, k->off), k->size, "%s", v->valuestring);
        break;
    case K_ENUM: {
        char canon[64];
        if (cJSON_IsString(v) && k->refuse != NULL && strcasecmp(v->valuestring, k->refuse) == 0) {
            ZR_FAIL(ZR_ERR_INVALID, "%s: %s is not supported: %s", where, got, k->why);
        }
        if (!cJSON_IsString(v) ||
            match_choice(k->choices, v->valuestring, canon, sizeof canon) == NULL) {
            ZR_FAIL(ZR_ERR_INVALID, "%s must be %s, got %s", where, expect, got);
        }
        snprintf((char *)field(c, k->off), k->size, "%s", canon);
        break;
    }
    case K_PAIR: {
        const cJSON *a = cJSON_GetArrayItem(v, 0), *b = cJSON_GetArrayItem(v, 1);
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 2 || !cJSON_IsNumber(a) ||
            !cJSON_IsNumber(b) || !num_ok(k, a->valuedouble) || !num_ok(k, b->valuedouble)) {
            ZR_FAIL(ZR_ERR_INVALID, "%s must be %s, got %s", where, expect, got);
        }
        *(double *)field(c, k->off) = a->valuedouble;
        *(double *)field(c, k->off2) = b->valuedouble;
        break;
    }
    case K_NOEFFECT:
    case K_ALIAS:
        break;
    }
    c->given |= k->given;
    return ZR_OK;
}

/* ---- did you mean ------------------------------------------------------- */

/* Optimal-string-alignment distance: edits, with a swap of neighbours counting one. */
static int edit_distance(const char *a, const char *b)
{
    enum { MAXL = 64 };
    size_t n = strlen(a), m = strlen(b);
    if (n >= MAXL || m >= MAXL) {
        return INT_MAX;
    }
    int d[MAXL][MAXL];
    for (size_t i = 0; i <= n; i++) {
        d[i][0] = (int)i;
    }
    for (size_t j = 0; j <= m; j++) {
        d[0][j] = (int)j;
    }
    for (size_t i = 1; i <= n; i++) {
        for (size_t j = 1; j <= m; j++) {
            int cost = tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]);
            int best = d[i - 1][j - 1] + cost;
            if (d[i - 1][j] + 1 < best) {
                best = d[i - 1][j] + 1;
            }
            if (d[i][j - 1] + 1 < best) {
                best = d[i][j - 1] + 1;
            }
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < best) {
                best = d[i - 2][j - 2] + 1;
            }
            d[i][j] = best;
        }
    }
    return d[n][m];
}

/* Close enough to suggest: a couple of typos, fewer than half the word. */
static int close_enough(const char *typed, int dist)
{
    int len = (int)strlen(typed);
    int limit = len <= 3 ? 1 : len <= 6 ? 2 : 3;
    return dist <= limit && dist < len;
}

/*
 * Suggest a key for an unknown JSON name under section parent ("" = top):
 * a sibling key or section within a few edits (reported by its name in the
 * section, as the user typed it), or the same name in another section
 * (reported by its full path, e.g. "stage" at the top level).
 */
static void suggest_json(const char *parent, const char *name, char *out, size_t n)
{
    size_t plen = strlen(parent);
    int best = INT_MAX;
    out[0] = '\0';
    for (size_t i = 0; i < NKEYS; i++) {
        const char *p = keys[i].path;
        if (strncmp(p, parent, plen) == 0 && (plen == 0 || p[plen] == '.')) {
            /* the component right under parent: a key or a section */
            const char *comp = p + plen + (plen != 0);
            const char *dot = strchr(comp, '.');
            size_t clen = dot == NULL ? strlen(comp) : (size_t)(dot - comp);
            char cand[128];
            if (clen < sizeof cand) {
                memcpy(cand, comp, clen);
                cand[clen] = '\0';
                int d = edit_distance(name, cand);
                if (close_enough(name, d) && d < best) {
                    best = d;
                    snprintf(out, n, "%s", cand);
                }
            }
        }
        if (strcmp(leaf(p), name) == 0 && best > 1) {
            best = 1;
            snprintf(out, n, "%s", p);
        }
    }
}

/* Suggest a flag (path or short alias) for an unknown one. */
static void suggest_flag(const char *name, char *out, size_t n)
{
    int best = INT_MAX;
    out[0] = '\0';
    for (size_t i = 0; i < NKEYS; i++) {
        const char *cands[3] = {keys[i].path, keys[i].flag, leaf(keys[i].path)};
        for (int j = 0; j < 3; j++) {
            if (cands[j] == NULL || keys[i].type == K_NOEFFECT) {
                continue;
            }
            int d = edit_distance(name, cands[j]);
            if (j == 2 && d == 0) {
                d = 1; /* the leaf of a dotted key: suggest the full path */
            }
            if (close_enough(name, d) && d < best) {
                best = d;
                snprintf(out, n, "--%s", j == 1 ? keys[i].flag : keys[i].path);
            }
        }
    }
}

/* ---- the JSON walk ------------------------------------------------------ */

static const char *json_kind(const cJSON *v)
{
    if (cJSON_IsArray(v)) {
        return "an array";
    }
    if (cJSON_IsString(v)) {
        return "a string";
    }
    if (cJSON_IsNumber(v)) {
        return "a number";
    }
    if (cJSON_IsBool(v)) {
        return "a boolean";
    }
    if (cJSON_IsNull(v)) {
        return "null";
    }
    return "an object";
}

static zr_status walk(zr_train_config *c, const cJSON *obj, const char *prefix, const char *name,
                      warn_fn warn, void *ctx)
{
    const cJSON *child;
    cJSON_ArrayForEach(child, obj)
    {
        const char *key = child->string != NULL ? child->string : "";
        char path[256];
        int w = prefix[0] == '\0' ? snprintf(path, sizeof path, "%s", key)
                                  : snprintf(path, sizeof path, "%s.%s", prefix, key);
        const cfg_key *k = w > 0 && (size_t)w < sizeof path ? find_key(path) : NULL;
        char where[320];
        snprintf(where, sizeof where, "%s: \"%s\"", name, path);
        if (k != NULL) {
            ZR_CHECK(apply_value(c, resolve(k), child, where, warn, ctx));
        } else if (w > 0 && (size_t)w < sizeof path && is_section(path)) {
            if (cJSON_IsNull(child)) {
                continue;
            }
            if (!cJSON_IsObject(child)) {
                char got[64];
                render_json(child, got, sizeof got);
                ZR_FAIL(ZR_ERR_INVALID, "%s must be an object, got %s %s", where,
                        json_kind(child), got);
            }
            ZR_CHECK(walk(c, child, path, name, warn, ctx));
        } else {
            char hint[160], msg[640];
            suggest_json(prefix, key, hint, sizeof hint);
            snprintf(msg, sizeof msg, "warning: %s: unknown key \"%.200s\"%s%s%s", name, path,
                     hint[0] ? " (did you mean \"" : "", hint, hint[0] ? "\"?)" : "");
            emit(warn, ctx, msg);
        }
    }
    return ZR_OK;
}

/*
 * Does the number written as s[0..len) lie beyond what a double holds, so
 * that reading it gives an infinity (1e999, a 5000-digit integer) or zero
 * (1e-999)? Such a value would reach the checks as inf or 0 and be reported
 * as something the user never wrote; it is reported as written instead.
 */
static int number_overflows(const char *s, size_t len)
{
    char buf[512];
    char *copy = len < sizeof buf ? buf : malloc(len + 1);
    if (copy == NULL) {
        return 0;
    }
    memcpy(copy, s, len);
    copy[len] = '\0';
    char *end = NULL;
    errno = 0;
    double d = strtod(copy, &end);
    int over = end == copy + len && len > 0 && errno == ERANGE && (isinf(d) || d == 0.0);
    if (copy != buf) {
        free(copy);
    }
    return over;
}

/* A number's text for a message: as written, or its start and length when it is long. */
static void show_number(const char *s, size_t len, char *buf, size_t n)
{
    if (len <= 40) {
        snprintf(buf, n, "%.*s", (int)len, s);
    } else {
        snprintf(buf, n, "%.24s... (%zu characters)", s, len);
    }
}

/*
 * cJSON reads 1e999 as an infinity and prints it back as null, so a check of
 * the parsed value could only say "got null". This pass over the text of a
 * file that parsed finds each number whose value a double cannot hold and
 * reports it as written, with its key and line:column. Strings are skipped
 * (a number inside one is text); the path is kept as a stack of keys.
 */
static zr_status check_number_literals(const char *text, const char *name)
{
    enum { DEPTH = 32, KEYLEN = 96 };
    char keys_at[DEPTH][KEYLEN];
    int depth = 0, line = 1;
    const char *bol = text, *str = NULL;
    size_t slen = 0;
    for (const char *p = text; *p != '\0'; p++) {
        char ch = *p;
        if (ch == '\n') {
            line++;
            bol = p + 1;
        } else if (ch == '"') {
            str = ++p;
            while (*p != '\0' && *p != '"') {
                p += *p == '\\' && p[1] != '\0' ? 2 : 1;
            }
            slen = (size_t)(p - str);
            if (*p == '\0') {
                break;
            }
        } else if (ch == '{' || ch == '[') {
            if (depth < DEPTH) {
                keys_at[depth][0] = '\0';
            }
            depth++;
        } else if (ch == '}' || ch == ']') {
            depth -= depth > 0;
        } else if (ch == ':' && str != NULL && depth > 0 && depth <= DEPTH) {
            snprintf(keys_at[depth - 1], KEYLEN, "%.*s", (int)(slen < KEYLEN ? slen : KEYLEN - 1),
                     str);
        } else if (ch == '-' || (ch >= '0' && ch <= '9')) {
            const char *start = p;
            while (p[1] != '\0' && strchr("0123456789+-.eE", p[1]) != NULL) {
                p++;
            }
            size_t len = (size_t)(p - start) + 1;
            if (number_overflows(start, len)) {
                char path[DEPTH * KEYLEN] = "", shown[80], expect[200] = "";
                size_t used = 0;
                for (int d = 0; d < depth && d < DEPTH; d++) {
                    if (keys_at[d][0] != '\0') {
                        int w = snprintf(path + used, sizeof path - used, "%s%s",
                                         used != 0 ? "." : "", keys_at[d]);
                        used += w > 0 ? (size_t)w : 0;
                    }
                }
                const cfg_key *k = resolve(find_key(path));
                if (k != NULL) {
                    describe_expect(k, expect, sizeof expect);
                }
                show_number(start, len, shown, sizeof shown);
                ZR_FAIL(ZR_ERR_INVALID, "%s:%d:%d: \"%s\": %s is out of range%s%s", name, line,
                        (int)(start - bol) + 1, path, shown, expect[0] ? ": it must be " : "",
                        expect);
            }
        }
    }
    return ZR_OK;
}

zr_status zr_config_parse_json(zr_train_config *c, const char *text, const char *name,
                               void (*warn)(void *ctx, const char *msg), void *ctx)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
    if (root == NULL) {
        /* cJSON gives only a pointer to where it stopped: count lines to it */
        const char *at = end != NULL ? end : cJSON_GetErrorPtr();
        if (at == NULL || at < text || at > text + strlen(text)) {
            at = text + strlen(text);
        }
        int line = 1;
        const char *bol = text;
        for (const char *p = text; p < at; p++) {
            if (*p == '\n') {
                line++;
                bol = p + 1;
            }
        }
        int col = (int)(at - bol) + 1;
        const char *rest = at;
        while (*rest == ' ' || *rest == '\t' || *rest == '\n' || *rest == '\r') {
            rest++;
        }
        if (*rest == '\0') {
            ZR_FAIL(ZR_ERR_FORMAT,
                    "%s:%d:%d: malformed JSON: unexpected end of input (truncated file?)", name,
                    line, col);
        }
        /* a little of the line on both sides: cJSON often stops just past the culprit */
        const char *from = at - bol > 12 ? at - 12 : bol;
        int len = 0;
        while (len < 32 && from[len] != '\0' && from[len] != '\n' && from[len] != '\r') {
            len++;
        }
        ZR_FAIL(ZR_ERR_FORMAT, "%s:%d:%d: malformed JSON near '%.*s'", name, line, col, len, from);
    }
    zr_status st = ZR_OK;
    if (!cJSON_IsObject(root)) {
        st = zr_error_at(ZR_ERR_INVALID, __FILE__, __LINE__,
                         "%s: the top level must be a JSON object, got %s", name, json_kind(root));
    } else {
        st = check_number_literals(text, name);
    }
    if (st == ZR_OK) {
        st = walk(c, root, "", name, warn, ctx);
    }
    cJSON_Delete(root);
    return st;
}

zr_status zr_config_load_json(zr_train_config *c, const char *path,
                              void (*warn)(void *ctx, const char *msg), void *ctx)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        ZR_FAIL(ZR_ERR_IO, "cannot open config file \"%s\": %s", path, strerror(errno));
    }
    enum { MAX_BYTES = 16 << 20 }; /* a config is a few KB; this only stops a wrong file */
    char *text = NULL;
    zr_status st = zr_alloc_at((void **)&text, MAX_BYTES + 1, __FILE__, __LINE__);
    if (st != ZR_OK) {
        fclose(f);
        return st;
    }
    size_t n = fread(text, 1, MAX_BYTES + 1, f);
    int err = ferror(f);
    fclose(f);
    if (err) {
        st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__, "cannot read config file \"%s\"", path);
    } else if (n > MAX_BYTES) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                         "config file \"%s\" is larger than %d bytes; is it a config?", path,
                         MAX_BYTES);
    } else if (memchr(text, '\0', n) != NULL) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                         "config file \"%s\" holds a NUL byte; is it a text file?", path);
    } else {
        text[n] = '\0';
        st = zr_config_parse_json(c, text, path, warn, ctx);
    }
    zr_free(text);
    return st;
}

/* ---- command-line flags ------------------------------------------------- */

static int bool_word(const char *s, int *b)
{
    static const char *const yes[] = {"true", "1", "yes", "on"}, *const no[] = {"false", "0", "no",
                                                                                "off"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *b = 1;
            return 1;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *b = 0;
            return 1;
        }
    }
    return 0;
}

/*
 * Turn a flag's text into the JSON value a file would hold, so that flags
 * and files go through the same checks. Text that does not read as the
 * key's type becomes a JSON string, which then fails the type check with the
 * text quoted in the message.
 */
static cJSON *value_from_text(const cfg_key *k, const char *text)
{
    switch (k->type) {
    case K_INT:
    case K_I64:
    case K_U64:
    case K_DBL: {
        char *end = NULL;
        errno = 0;
        double d = strtod(text, &end);
        if (end != text && *end == '\0' && errno == 0 && isfinite(d)) {
            return cJSON_CreateNumber(d);
        }
        return cJSON_CreateString(text);
    }
    case K_BOOL: {
        int b;
        return bool_word(text, &b) ? cJSON_CreateBool(b) : cJSON_CreateString(text);
    }
    case K_PAIR:
    case K_NOEFFECT: {
        /* "0.9,0.95" or "[0.9, 0.95]"; anything else stays a string */
        size_t n = strlen(text);
        char *buf = malloc(n + 3);
        if (buf == NULL) {
            return NULL;
        }
        int bracket = text[0] == '[' || k->type == K_NOEFFECT;
        snprintf(buf, n + 3, bracket ? "%s" : "[%s]", text);
        cJSON *v = cJSON_Parse(buf);
        free(buf);
        return v != NULL ? v : cJSON_CreateString(text);
    }
    case K_STR:
    case K_ENUM:
    case K_ALIAS:
        break;
    }
    return cJSON_CreateString(text);
}

static zr_status apply_text(zr_train_config *c, const cfg_key *k, const char *text,
                            const char *where, warn_fn warn, void *ctx)
{
    int numeric = k->type == K_INT || k->type == K_I64 || k->type == K_U64 || k->type == K_DBL;
    if (numeric && number_overflows(text, strlen(text))) {
        char shown[80], expect[200];
        show_number(text, strlen(text), shown, sizeof shown);
        describe_expect(k, expect, sizeof expect);
        ZR_FAIL(ZR_ERR_INVALID, "%s: %s is out of range: it must be %s", where, shown, expect);
    }
    cJSON *v = value_from_text(k, text);
    if (v == NULL) {
        ZR_FAIL(ZR_ERR_NOMEM, "%s: out of memory", where);
    }
    zr_status st = apply_value(c, k, v, where, warn, ctx);
    cJSON_Delete(v);
    return st;
}

/* Is this argument -h / --help? */
static int is_help(const char *a)
{
    return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0;
}

/*
 * One pass over argv. Pass 0 reads only --config files, pass 1 applies every
 * other flag, so that a file never overrides a flag whatever their order.
 */
static zr_status args_pass(zr_train_config *c, int argc, char **argv, int pass, warn_fn warn,
                           void *ctx)
{
    /* argv holds only what follows the command name, so every word is a flag or its value:
       a stray word (zr train my.txt) is an error, never silently dropped */
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
            ZR_FAIL(ZR_ERR_INVALID,
                    "unexpected argument \"%.200s\": zr train takes only flags (--key value or "
                    "--key=value; a data file is --data FILE, a config file --config FILE.json; "
                    "see --help)",
                    arg);
        }
        char name[256];
        const char *eq = strchr(arg + 2, '=');
        size_t nlen = eq != NULL ? (size_t)(eq - arg - 2) : strlen(arg + 2);
        if (nlen >= sizeof name) {
            ZR_FAIL(ZR_ERR_INVALID, "unknown flag %.80s...", arg);
        }
        memcpy(name, arg + 2, nlen);
        name[nlen] = '\0';
        const char *value = eq != NULL ? eq + 1 : NULL;

        if (strcmp(name, "config") == 0) {
            if (value == NULL) {
                if (i + 1 >= argc) {
                    ZR_FAIL(ZR_ERR_INVALID, "flag --config needs a value (a JSON file)");
                }
                value = argv[++i];
            }
            if (pass == 0) {
                ZR_CHECK(zr_config_load_json(c, value, warn, ctx));
            }
            continue;
        }

        /*
         * Booleans: --KEY (true), --KEY=WORD or --KEY WORD (WORD one of true/false, 1/0,
         * yes/no, on/off) and --no-KEY (false), which takes no value: --no-KEY=true would
         * read as a double negative, so it is refused naming --no-KEY and the spelling to use.
         */
        int negated = 0;
        const cfg_key *k = find_key(name);
        if (k == NULL) {
            k = find_flag(name);
        }
        if (k == NULL && strncmp(name, "no-", 3) == 0) {
            const cfg_key *nk = find_key(name + 3);
            nk = resolve(nk != NULL ? nk : find_flag(name + 3));
            int b;
            if (nk != NULL && nk->type != K_BOOL) {
                ZR_FAIL(ZR_ERR_INVALID, "flag --%s: --no- applies to true/false keys only, and %s "
                        "is not one; write --%s VALUE", name, nk->path, name + 3);
            }
            const char *extra = value != NULL                                      ? value
                                : i + 1 < argc && bool_word(argv[i + 1], &b) ? argv[i + 1]
                                                                             : NULL;
            if (nk != NULL && extra != NULL) {
                ZR_FAIL(ZR_ERR_INVALID, "flag --%s takes no value (got \"%.60s\"): write --%s "
                        "alone to set %s to false, or --%s=true / --%s=false", name, extra, name,
                        nk->path, name + 3, name + 3);
            }
            if (nk != NULL) {
                k = nk;
                negated = 1;
            }
        }
        if (k == NULL) {
            char hint[160];
            suggest_flag(name, hint, sizeof hint);
            ZR_FAIL(ZR_ERR_INVALID, "unknown flag --%s%s%s%s; see zr train --help", name,
                    hint[0] ? " (did you mean " : "", hint, hint[0] ? "?)" : "");
        }
        const cfg_key *target = resolve(k);
        char where[320];
        if (strcmp(name, target->path) == 0) {
            snprintf(where, sizeof where, "flag --%s", name);
        } else {
            snprintf(where, sizeof where, "flag --%s (%s)", name, target->path);
        }
        if (negated) {
            value = "false";
        } else if (value == NULL && target->type == K_BOOL) {
            /* a bare boolean is true; it takes the next argument only if that is a boolean word */
            int b;
            if (i + 1 < argc && bool_word(argv[i + 1], &b)) {
                value = argv[++i];
            } else {
                value = "true";
            }
        } else if (value == NULL) {
            if (i + 1 >= argc) {
                ZR_FAIL(ZR_ERR_INVALID, "%s needs a value", where);
            }
            if (strncmp(argv[i + 1], "--", 2) == 0) {
                ZR_FAIL(ZR_ERR_INVALID, "%s needs a value, got the flag %s", where, argv[i + 1]);
            }
            value = argv[++i];
        }
        if (pass == 1) {
            ZR_CHECK(apply_text(c, target, value, where, warn, ctx));
        }
    }
    return ZR_OK;
}

zr_status zr_config_from_args(zr_train_config *c, int argc, char **argv, int *help,
                              void (*warn)(void *ctx, const char *msg), void *ctx)
{
    *help = 0;
    for (int i = 0; i < argc; i++) {
        if (is_help(argv[i])) {
            *help = 1;
            return ZR_OK;
        }
    }
    ZR_CHECK(args_pass(c, argc, argv, 0, warn, ctx));
    ZR_CHECK(args_pass(c, argc, argv, 1, warn, ctx));
    return ZR_OK;
}

/* ---- defaults, printing ------------------------------------------------- */

void zr_config_defaults(zr_train_config *c)
{
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < NKEYS; i++) {
        const cfg_key *k = &keys[i];
        if (!has_field(k)) {
            continue;
        }
        void *p = field(c, k->off);
        switch (k->type) {
        case K_INT:
        case K_BOOL:
            *(int *)p = (int)k->def;
            break;
        case K_I64:
            *(long long *)p = (long long)k->def;
            break;
        case K_U64:
            *(unsigned long long *)p = (unsigned long long)k->def;
            break;
        case K_DBL:
            *(double *)p = k->def;
            break;
        case K_STR:
        case K_ENUM:
            snprintf((char *)p, k->size, "%s", k->sdef);
            break;
        case K_PAIR:
            *(double *)p = k->def;
            *(double *)field(c, k->off2) = k->def2;
            break;
        case K_NOEFFECT:
        case K_ALIAS:
            break;
        }
    }
}

/* The numeric value of a field, as a double (for range checks and printing). */
static double get_num(const zr_train_config *c, const cfg_key *k, size_t off)
{
    const void *p = cfield(c, off);
    switch (k->type) {
    case K_INT:
    case K_BOOL:
        return *(const int *)p;
    case K_I64:
        return (double)*(const long long *)p;
    case K_U64:
        return (double)*(const unsigned long long *)p;
    default:
        return *(const double *)p;
    }
}

/* A field's value as text: 3, 0.001, true, "AdamW", [0.9, 0.95]. */
static void fmt_value(const zr_train_config *c, const cfg_key *k, char *buf, size_t n)
{
    const void *p = cfield(c, k->off);
    switch (k->type) {
    case K_INT:
        snprintf(buf, n, "%d", *(const int *)p);
        break;
    case K_I64:
        snprintf(buf, n, "%lld", *(const long long *)p);
        break;
    case K_U64:
        snprintf(buf, n, "%llu", *(const unsigned long long *)p);
        break;
    case K_DBL:
        snprintf(buf, n, "%.10g", *(const double *)p);
        break;
    case K_BOOL:
        snprintf(buf, n, "%s", *(const int *)p ? "true" : "false");
        break;
    case K_STR:
    case K_ENUM:
        snprintf(buf, n, "\"%s\"", (const char *)p);
        break;
    case K_PAIR:
        snprintf(buf, n, "[%.10g, %.10g]", *(const double *)p, *(const double *)cfield(c, k->off2));
        break;
    case K_NOEFFECT:
    case K_ALIAS:
        snprintf(buf, n, "-");
        break;
    }
}

static int listed(const cfg_key *k)
{
    return has_field(k) && k->type != K_NOEFFECT && k->type != K_ALIAS;
}

void zr_config_print_help(FILE *f)
{
    zr_train_config d;
    zr_config_defaults(&d);
    fprintf(f, "usage: mpirun -np N zr train [--config FILE.json] [--KEY VALUE | --KEY=VALUE ...]\n"
               "\n"
               "Keys are DeepSpeed's config keys (dotted: --zero_optimization.stage 3) plus zr's own\n"
               "under \"zr\". Precedence: defaults < --config file < flags. Booleans also take a bare\n"
               "--KEY (true) or --no-KEY. Short aliases are shown after the dotted name.\n");
    char section[128] = "?";
    for (size_t i = 0; i < NKEYS; i++) {
        const cfg_key *k = &keys[i];
        if (!listed(k)) {
            continue;
        }
        size_t pl = parent_len(k->path);
        if (strlen(section) != pl || strncmp(section, k->path, pl) != 0) {
            snprintf(section, sizeof section, "%.*s", (int)pl, k->path);
            fprintf(f, "\n%s\n", pl == 0 ? "top level (DeepSpeed)" : section);
        }
        char expect[200], def[300];
        describe_expect(k, expect, sizeof expect);
        fmt_value(&d, k, def, sizeof def);
        fprintf(f, "  --%s%s%s\n      %s; default %s\n      %s\n", k->path, k->flag ? ", --" : "",
                k->flag ? k->flag : "", expect, def, k->help);
    }
    fprintf(f, "\nAccepted with a note, no effect in zr (DeepSpeed keys):\n ");
    int col = 1;
    for (size_t i = 0; i < NKEYS; i++) {
        if (keys[i].type != K_NOEFFECT) {
            continue;
        }
        int w = (int)strlen(keys[i].path) + 1;
        if (col + w > 98) {
            fprintf(f, "\n ");
            col = 1;
        }
        fprintf(f, " %s", keys[i].path);
        col += w;
    }
    fprintf(f, "\n\nRefused: fp16.enabled true, communication_data_type \"fp16\", "
               "optimizer.params.adam_w_mode false,\n  optimizer.params.bias_correction false, "
               "optimizer.params.amsgrad true.\n"
               "Other DeepSpeed names: zero_optimization.max_live_parameters and "
               "prefetch_bucket_size\n  are the stage3_ keys.\n");
}

void zr_config_print(FILE *f, const zr_train_config *c)
{
    for (size_t i = 0; i < NKEYS; i++) {
        if (listed(&keys[i])) {
            char v[300];
            fmt_value(c, &keys[i], v, sizeof v);
            fprintf(f, "%-46s = %s\n", keys[i].path, v);
        }
    }
}

size_t zr_config_key_count(void)
{
    return NKEYS;
}

const char *zr_config_key_value(const zr_train_config *c, size_t i, char *buf, size_t n)
{
    buf[0] = '\0';
    if (i >= NKEYS || !listed(&keys[i])) {
        return NULL;
    }
    fmt_value(c, &keys[i], buf, n);
    return keys[i].path;
}

/* The object at the dotted parent of path inside root, created as needed. */
static cJSON *json_parent(cJSON *root, const char *path)
{
    cJSON *obj = root;
    const char *p = path;
    for (const char *dot = strchr(p, '.'); dot != NULL; p = dot + 1, dot = strchr(p, '.')) {
        char comp[128];
        snprintf(comp, sizeof comp, "%.*s", (int)(dot - p), p);
        cJSON *next = cJSON_GetObjectItemCaseSensitive(obj, comp);
        if (next == NULL) {
            next = cJSON_AddObjectToObject(obj, comp);
        }
        if (next == NULL) {
            return NULL;
        }
        obj = next;
    }
    return obj;
}

char *zr_config_to_json(const zr_train_config *c)
{
    cJSON *root = cJSON_CreateObject();
    int ok = root != NULL;
    for (size_t i = 0; ok && i < NKEYS; i++) {
        const cfg_key *k = &keys[i];
        if (!listed(k)) {
            continue;
        }
        cJSON *obj = json_parent(root, k->path);
        const char *name = leaf(k->path);
        const void *p = cfield(c, k->off);
        cJSON *v = NULL;
        switch (k->type) {
        case K_BOOL:
            v = cJSON_AddBoolToObject(obj, name, *(const int *)p);
            break;
        case K_STR:
        case K_ENUM:
            v = cJSON_AddStringToObject(obj, name, (const char *)p);
            break;
        case K_PAIR: {
            const double two[2] = {*(const double *)p, *(const double *)cfield(c, k->off2)};
            v = cJSON_CreateDoubleArray(two, 2);
            if (v != NULL && !cJSON_AddItemToObject(obj, name, v)) {
                cJSON_Delete(v);
                v = NULL;
            }
            break;
        }
        default:
            v = cJSON_AddNumberToObject(obj, name, get_num(c, k, k->off));
            break;
        }
        ok = obj != NULL && v != NULL;
    }
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (text == NULL) {
        return NULL;
    }
    /* hand back plain malloc memory whatever cJSON's hooks are */
    size_t n = strlen(text) + 1;
    char *out = malloc(n);
    if (out != NULL) {
        memcpy(out, text, n);
    }
    cJSON_free(text);
    return out;
}

/* ---- cross-field checks ------------------------------------------------- */

/* Re-check every field against the table: a program may have set it directly. */
static zr_status check_fields(const zr_train_config *c)
{
    for (size_t i = 0; i < NKEYS; i++) {
        const cfg_key *k = &keys[i];
        if (!listed(k)) {
            continue;
        }
        char expect[200], got[300];
        describe_expect(k, expect, sizeof expect);
        fmt_value(c, k, got, sizeof got);
        int ok = 1;
        switch (k->type) {
        case K_BOOL: {
            int b = *(const int *)cfield(c, k->off);
            ok = b == 0 || b == 1;
            break;
        }
        case K_STR: {
            const char *s = cfield(c, k->off);
            ok = memchr(s, '\0', k->size) != NULL;
            break;
        }
        case K_ENUM: {
            const char *s = cfield(c, k->off);
            char canon[64];
            ok = memchr(s, '\0', k->size) != NULL &&
                 match_choice(k->choices, s, canon, sizeof canon) != NULL && strcmp(s, canon) == 0;
            break;
        }
        case K_PAIR:
            ok = num_ok(k, get_num(c, k, k->off)) && num_ok(k, get_num(c, k, k->off2));
            break;
        default:
            ok = num_ok(k, get_num(c, k, k->off));
            break;
        }
        if (!ok) {
            ZR_FAIL(ZR_ERR_INVALID, "\"%s\" must be %s, got %s", k->path, expect, got);
        }
    }
    return ZR_OK;
}

/*
 * train_batch_size = micro * accumulation * world. Keys the user gave are
 * fixed; the rest are derived where the given ones determine them and keep
 * their defaults otherwise (DeepSpeed's rules: with only train_batch_size
 * given, accumulation stays at its default and micro is derived).
 */
static zr_status batch_sizes(zr_train_config *c, int world)
{
    long long tb = c->train_batch_size, mb = c->train_micro_batch_size_per_gpu,
              ga = c->gradient_accumulation_steps, w = world;
    int g_tb = tb > 0;
    int g_mb = (c->given & ZR_GIVEN_MICRO_BATCH) && mb > 0;
    int g_ga = (c->given & ZR_GIVEN_GRAD_ACCUM) && ga > 0;
    if (g_tb && g_mb && g_ga) {
        if (tb != mb * ga * w) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "inconsistent batch sizes: train_batch_size (%lld) must equal "
                    "train_micro_batch_size_per_gpu (%lld) * gradient_accumulation_steps (%lld) "
                    "* world size (%lld) = %lld",
                    tb, mb, ga, w, mb * ga * w);
        }
    } else if (g_tb && g_mb) {
        if (tb % (mb * w) != 0) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "inconsistent batch sizes: train_batch_size (%lld) is not a multiple of "
                    "train_micro_batch_size_per_gpu (%lld) * world size (%lld) = %lld, so "
                    "gradient_accumulation_steps cannot be derived",
                    tb, mb, w, mb * w);
        }
        ga = tb / (mb * w);
    } else if (g_tb) {
        if (ga <= 0) {
            ga = 1;
        }
        if (tb % (ga * w) != 0) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "inconsistent batch sizes: train_batch_size (%lld) is not a multiple of "
                    "gradient_accumulation_steps (%lld) * world size (%lld) = %lld, so "
                    "train_micro_batch_size_per_gpu cannot be derived",
                    tb, ga, w, ga * w);
        }
        mb = tb / (ga * w);
    } else {
        if (mb <= 0) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "train_micro_batch_size_per_gpu is 0 (derived) but train_batch_size is not "
                    "given; set one of them");
        }
        if (ga <= 0) {
            ga = 1;
        }
        tb = mb * ga * w;
    }
    /* a derived size obeys the bound of its own key, or train_batch_size INT_MAX would ask
       for two billion sequences per rank and fail (or swap) only when allocated */
    double mb_max = find_key("train_micro_batch_size_per_gpu")->hi;
    double ga_max = find_key("gradient_accumulation_steps")->hi;
    if ((double)mb > mb_max || (double)ga > ga_max) {
        ZR_FAIL(ZR_ERR_INVALID,
                "train_batch_size (%lld) at %lld rank%s gives train_micro_batch_size_per_gpu %lld "
                "and gradient_accumulation_steps %lld, but each may be at most %.0f: lower "
                "train_batch_size or give the other two",
                tb, w, w == 1 ? "" : "s", mb, ga, mb_max > ga_max ? mb_max : ga_max);
    }
    if (tb > INT_MAX || mb > INT_MAX || ga > INT_MAX) {
        ZR_FAIL(ZR_ERR_INVALID, "train_batch_size = %lld * %lld * %lld ranks is too large", mb, ga,
                w);
    }
    c->train_batch_size = (int)tb;
    c->train_micro_batch_size_per_gpu = (int)mb;
    c->gradient_accumulation_steps = (int)ga;
    return ZR_OK;
}

/*
 * ZeRO++ switches and the stage they need. Their defaults are on (the demo),
 * so a default below the stage quietly turns off; an explicit request is an
 * error, since the user asked for something that cannot happen.
 */
static zr_status zeropp_stages(zr_train_config *c, int world)
{
    if (c->stage < 3 && c->zero_quantized_weights) {
        if (c->given & ZR_GIVEN_QWZ) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "zero_optimization.zero_quantized_weights (qwZ) needs "
                    "zero_optimization.stage 3, got stage %d; set it to false or use stage 3",
                    c->stage);
        }
        c->zero_quantized_weights = 0;
    }
    if (c->stage < 3 && c->zero_hpz_partition_size != 1) {
        if ((c->given & ZR_GIVEN_HPZ) && c->zero_hpz_partition_size > 1) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "zero_optimization.zero_hpz_partition_size %d (hpZ) needs "
                    "zero_optimization.stage 3, got stage %d; use 1 to turn hpZ off",
                    c->zero_hpz_partition_size, c->stage);
        }
        c->zero_hpz_partition_size = 1;
    }
    if (c->stage < 2 && c->zero_quantized_gradients) {
        if (c->given & ZR_GIVEN_QGZ) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "zero_optimization.zero_quantized_gradients (qgZ) needs "
                    "zero_optimization.stage 2 or 3, got stage %d; set it to false or use stage "
                    ">= 2",
                    c->stage);
        }
        c->zero_quantized_gradients = 0;
    }
    int h = c->zero_hpz_partition_size;
    if (h > 1 && (h > world || world % h != 0)) {
        ZR_FAIL(ZR_ERR_INVALID,
                "zero_optimization.zero_hpz_partition_size (%d) must divide the world size (%d): "
                "use a divisor of the world size, usually the ranks per node "
                "(0 = ranks per node, 1 = hpZ off)",
                h, world);
    }
    return ZR_OK;
}

static zr_status scheduler(zr_train_config *c)
{
    if (c->warmup_max_lr == 0) {
        c->warmup_max_lr = c->lr;
    }
    int decays = strcmp(c->scheduler_type, "WarmupDecayLR") == 0 ||
                 strcmp(c->scheduler_type, "WarmupCosineLR") == 0;
    if (c->total_num_steps == 0) {
        /* derived: a warm-up longer than the run simply never ends, as in DeepSpeed */
        c->total_num_steps = c->train_steps;
    } else if (decays && c->total_num_steps < c->warmup_num_steps) {
        ZR_FAIL(ZR_ERR_INVALID,
                "scheduler.params.total_num_steps (%d) must be at least "
                "scheduler.params.warmup_num_steps (%d) for %s",
                c->total_num_steps, c->warmup_num_steps, c->scheduler_type);
    }
    return ZR_OK;
}

zr_status zr_config_finalize(zr_train_config *c, int world)
{
    if (world < 1) {
        ZR_FAIL(ZR_ERR_INVALID, "world size must be >= 1, got %d", world);
    }
    ZR_CHECK(check_fields(c));
    ZR_CHECK(batch_sizes(c, world));
    ZR_CHECK(zeropp_stages(c, world));
    if (c->channels % c->heads != 0) {
        ZR_FAIL(ZR_ERR_INVALID, "zr.model.channels (%d) must be a multiple of zr.model.heads (%d)",
                c->channels, c->heads);
    }
    /* with zr.model.init and no explicit max_seq_len the file decides (zr_config_adopt_model) */
    int own_max = c->init_path[0] == '\0' || (c->given & ZR_GIVEN_MAX_SEQ_LEN);
    if (own_max && c->seq_len > c->max_seq_len) {
        ZR_FAIL(ZR_ERR_INVALID,
                "zr.model.seq_len (%d) must be at most zr.model.max_seq_len (%d), the positions "
                "the model has; raise zr.model.max_seq_len or train on shorter sequences",
                c->seq_len, c->max_seq_len);
    }
    if (c->communication_data_type[0] == '\0') {
        snprintf(c->communication_data_type, sizeof c->communication_data_type, "%s",
                 c->bf16_enabled ? "bf16" : "fp32");
    }
    ZR_CHECK(scheduler(c));
    if (c->resume && c->checkpoint_dir[0] == '\0') {
        ZR_FAIL(ZR_ERR_INVALID,
                "zr.checkpoint.resume needs zr.checkpoint.dir (--ckpt-dir) to resume from");
    }
    if (c->metrics_path[0] == '\0' && c->checkpoint_dir[0] != '\0') {
        int n = snprintf(c->metrics_path, sizeof c->metrics_path, "%s/metrics.jsonl",
                         c->checkpoint_dir);
        if (n < 0 || (size_t)n >= sizeof c->metrics_path) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "zr.checkpoint.dir \"%s\" is too long to hold metrics.jsonl (at most %zu "
                    "characters); set zr.train.metrics_path",
                    c->checkpoint_dir, sizeof c->metrics_path - 1);
        }
    }
    return ZR_OK;
}

/* One shape key against the file: a value given explicitly must be the file's. */
static zr_status adopt_int(int *field, int given, int file_value, const char *key,
                           const char *what, const char *path)
{
    if (given && *field != file_value) {
        ZR_FAIL(ZR_ERR_INVALID,
                "%s is %d, but the model file %s (zr.model.init) has %d %s; leave %s out to "
                "take the file's value, or start from a file of that shape",
                key, *field, path, file_value, what, key);
    }
    *field = file_value;
    return ZR_OK;
}

zr_status zr_config_adopt_model(zr_train_config *c, const struct zr_gpt_config *file,
                                const char *path)
{
    ZR_CHECK(adopt_int(&c->layers, (c->given & ZR_GIVEN_LAYERS) != 0, file->layers,
                       "zr.model.layers", "layers", path));
    ZR_CHECK(adopt_int(&c->heads, (c->given & ZR_GIVEN_HEADS) != 0, file->heads,
                       "zr.model.heads", "heads", path));
    ZR_CHECK(adopt_int(&c->channels, (c->given & ZR_GIVEN_CHANNELS) != 0, file->channels,
                       "zr.model.channels", "channels", path));
    ZR_CHECK(adopt_int(&c->max_seq_len, (c->given & ZR_GIVEN_MAX_SEQ_LEN) != 0, file->max_t,
                       "zr.model.max_seq_len", "positions", path));
    ZR_CHECK(adopt_int(&c->vocab_size, c->vocab_size != 0, file->vocab, "zr.model.vocab_size",
                       "tokens in its vocabulary", path));
    if (c->seq_len > c->max_seq_len) {
        ZR_FAIL(ZR_ERR_INVALID,
                "zr.model.seq_len (%d) must be at most the %d positions of the model file %s "
                "(zr.model.init)",
                c->seq_len, c->max_seq_len, path);
    }
    return ZR_OK;
}

int zr_config_key_info(size_t i, const char **path, const char **flag, zr_config_kind *kind)
{
    for (size_t j = 0; j < NKEYS; j++) {
        if (!listed(&keys[j])) {
            continue;
        }
        if (i-- == 0) {
            const cfg_key *k = &keys[j];
            *path = k->path;
            *flag = k->flag;
            *kind = k->type == K_INT || k->type == K_I64 || k->type == K_U64 ? ZR_CFG_INTEGER
                    : k->type == K_BOOL                                     ? ZR_CFG_BOOLEAN
                                                                            : ZR_CFG_OTHER;
            return 1;
        }
    }
    return 0;
}
