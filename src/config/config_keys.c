/*
 * config_keys.c - the table of every key of "zr train" (DeepSpeed's and zr's
 * own under "zr"), lookups in it, the defaults, and the did-you-mean for an
 * unknown key or flag. config_impl.h says which file does what with it.
 */
#define _POSIX_C_SOURCE 200809L

#include "config_impl.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define F(m) offsetof(zr_train_config, m)
#define BIG  1e15

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
/* resume policy pol (zr/config.h: ZR_RESUME_*); the others are CHANGE (0) */
#define INTGP(p, m, d, l, h, fl, g, pol, hp) \
    {.path = p, .type = K_INT, .off = F(m), .off2 = NOFIELD, .def = d, .lo = l, .hi = h, .flag = fl, .given = g, .resume = pol, .help = hp}
/* an integer key --no-KEY sets to neg (hpZ: 1, off) */
#define INTGN(p, m, d, l, h, fl, g, neg, hp) \
    {.path = p, .type = K_INT, .off = F(m), .off2 = NOFIELD, .def = d, .lo = l, .hi = h, .flag = fl, .given = g, .negate = neg, .help = hp}
#define U64(p, m, d, fl, pol, hp) \
    {.path = p, .type = K_U64, .off = F(m), .off2 = NOFIELD, .def = d, .lo = 0, .hi = 18446744073709551615.0, .flag = fl, .resume = pol, .help = hp}
#define STRP(p, m, d, fl, pol, hp) \
    {.path = p, .type = K_STR, .off = F(m), .off2 = NOFIELD, .size = sizeof(((zr_train_config *)0)->m), .sdef = d, .flag = fl, .resume = pol, .help = hp}
#define BOOLP(p, m, d, fl, pol, hp) \
    {.path = p, .type = K_BOOL, .off = F(m), .off2 = NOFIELD, .def = d, .flag = fl, .resume = pol, .help = hp}
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
/* an enumeration with a flag and a resume policy */
#define ENUMFP(p, m, d, ch, fl, pol, hp) \
    {.path = p, .type = K_ENUM, .off = F(m), .off2 = NOFIELD, .size = sizeof(((zr_train_config *)0)->m), .sdef = d, .choices = ch, .flag = fl, .resume = pol, .help = hp}
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

const cfg_key zr_config_keys[] = {
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
         "16-bit (bf16) wire for exact collectives, and bf16 compute: on a GPU (zr.device) on "
         "bf16 working parameters and gradients (fp32 master weights); on a CPU with AMX-BF16 or "
         "AVX512_BF16 the matrix products on bf16 inputs, fp32 accumulation (ZR_CPU_BF16=0: fp32; "
         "other CPUs: fp32)"),
    REFUSE("fp16.enabled", 0, "true",
           "zr uses bf16, not fp16, on the wire and in products; use \"bf16\": {\"enabled\": true} instead"),
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
    INTGN("zero_optimization.zero_hpz_partition_size", zero_hpz_partition_size, 0, 0, 1 << 20, "hpz", ZR_GIVEN_HPZ, "1",
          "hpZ: secondary weight partition group size (stage 3); 1 = off (also --no-hpz), 0 = ranks per node"),
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
    INTGP("zr.model.layers", layers, 2, 1, 1024, "layers", ZR_GIVEN_LAYERS, ZR_RESUME_MODEL, "transformer blocks"),
    INTGP("zr.model.heads", heads, 4, 1, 1024, "heads", ZR_GIVEN_HEADS, ZR_RESUME_MODEL, "attention heads (must divide channels)"),
    INTGP("zr.model.channels", channels, 128, 1, 1 << 16, "channels", ZR_GIVEN_CHANNELS, ZR_RESUME_MODEL, "embedding width"),
    INTG("zr.model.seq_len", seq_len, 64, 1, 1 << 20, "seq-len", ZR_GIVEN_SEQ_LEN, "tokens per training sequence (at most zr.model.max_seq_len)"),
    INTGP("zr.model.max_seq_len", max_seq_len, 1024, 1, 1 << 20, "max-seq-len", ZR_GIVEN_MAX_SEQ_LEN, ZR_RESUME_MODEL,
          "positions the model has (rows of wpe; GPT-2: 1024); with zr.model.init: the file's"),
    INTGP("zr.model.vocab_size", vocab_size, 0, 0, 1 << 24, "vocab-size", 0, ZR_RESUME_MODEL,
          "vocabulary; 0 = the data's (text 256, llm.c GPT-2 shard 50257, llama-3 shard 128256); must exceed every token"),
    STRP("zr.model.init", init_path, "", "init", ZR_RESUME_MATCH,
        "llm.c GPT-2 model file (e.g. gpt2_124M.bin) to start from instead of a random init; "
        "its shape is the model's (zr.model.* keys given must match it)"),
    BOOL("zr.model.activation_checkpointing", activation_checkpointing, 0, "checkpoint-activations",
         "keep only each block's input and recompute the block's forward in the backward "
         "(bit-identical gradients without hpZ; about a third more compute, far fewer activations)"),
    STRP("zr.data.path", data_path, "", "data", ZR_RESUME_DATA,
        "UTF-8 text file or llm.c token shard (GPT-2 or llama-3, recognised by its header), or a pattern of shards ('train_*.bin', read in sorted order); \"\" = the bundled corpus"),
    STR("zr.data.val_path", val_path, "", "val-data",
        "validation data: a file or a pattern of shards as zr.data.path; \"\" = the last 5% of zr.data.path"),
    BOOL("zr.data.shuffle", shuffle, 0, "shuffle",
         "sequences in a new order each epoch, drawn from zr.train.seed and the epoch (a resume continues it at any world size); false = in file order"),
    INT("zr.data.val_every", val_every, 50, 0, IMAX, "val-every", "steps between validation passes; 0 = never"),
    INTG("zr.data.val_batches", val_batches, 4, 1, IMAX, NULL, ZR_GIVEN_VAL_BATCHES, "micro-batches per validation pass"),
    INT("zr.train.train_steps", train_steps, 200, 0, IMAX, "steps",
        "optimizer steps to run; 0 = none: the initial weights are saved as step_00000000 (with zr.checkpoint.dir), e.g. to export them"),
    U64("zr.train.seed", seed, 1337, "seed", ZR_RESUME_MATCH, "seed of initialization and data order; a resume keeps the checkpoint's"),
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
    BOOLP("zr.checkpoint.resume", resume, 0, "resume", ZR_RESUME_LOCAL,
          "continue from the newest checkpoint in zr.checkpoint.dir (the highest step its manifest says)"),
    STRP("zr.checkpoint.resume_from", resume_from, "", "resume-from", ZR_RESUME_LOCAL,
        "continue from this checkpoint (a step_N folder), e.g. the newest intact one when the newest is damaged; newer checkpoints in zr.checkpoint.dir are moved aside, not deleted"),
    BOOLP("zr.checkpoint.resume_new_data", resume_new_data, 0, "resume-new-data", ZR_RESUME_LOCAL,
          "let a resume train on other data than the checkpoint's (refused otherwise); the data position carries over by token count"),
    INTC("zr.quant.qwz_bits", qwz_bits, 8, "4|8", "qwZ weight bits"),
    INTM("zr.quant.qwz_group", qwz_group, 1024, 32, 65536, 8, "qwZ elements per quantization group"),
    INTC("zr.quant.qgz_bits", qgz_bits, 4, "4|8", "qgZ gradient bits"),
    INTM("zr.quant.qgz_group", qgz_group, 1024, 32, 65536, 8, "qgZ elements per quantization group"),
    BOOL("zr.quant.qgz_error_feedback", qgz_error_feedback, 0, NULL,
         "qgZ: carry each rank's quantization error into the next step"),
    INT("zr.quant.qgz_chunks", qgz_chunks, 1, 1, 64, NULL, "qgZ: pipeline the all-to-all in this many chunks"),
    BOOL("zr.compare_zero3", compare_zero3, 1, NULL, "also report the traffic plain ZeRO-3 (bf16) would have sent"),
    ENUMFP("zr.device", device, "auto", "auto|cpu|cuda", "device", ZR_RESUME_CHANGE,
           "where the model computes: \"cuda\" one GPU per rank (by node-local rank; fails at once "
           "without one), \"cpu\" the host, \"auto\" the GPUs when every rank sees one, else the "
           "CPU; a resume may change it (checkpoints are the same on both)"),
    ENUMFP("zr.transport", transport, "auto", "auto|nccl|staged", "transport", ZR_RESUME_CHANGE,
           "on GPUs, how the collectives move device memory: \"nccl\" NCCL (one GPU per rank), "
           "\"staged\" through pinned host memory and MPI (any placement, ranks sharing a GPU), "
           "\"auto\" NCCL when every rank has a GPU of its own and zr was built with NCCL, else "
           "staged; no effect on the CPU"),
};
/* clang-format on */

const size_t zr_config_nkeys = sizeof zr_config_keys / sizeof zr_config_keys[0];

/* ---- lookups ------------------------------------------------------------ */

void *zr_config_field(zr_train_config *c, size_t off)
{
    return (char *)c + off;
}

const void *zr_config_cfield(const zr_train_config *c, size_t off)
{
    return (const char *)c + off;
}

int zr_config_has_field(const cfg_key *k)
{
    return k->off != NOFIELD;
}

const cfg_key *zr_config_find_key(const char *path)
{
    for (size_t i = 0; i < zr_config_nkeys; i++) {
        if (strcmp(zr_config_keys[i].path, path) == 0) {
            return &zr_config_keys[i];
        }
    }
    return NULL;
}

const cfg_key *zr_config_find_flag(const char *flag)
{
    for (size_t i = 0; i < zr_config_nkeys; i++) {
        if (zr_config_keys[i].flag != NULL && strcmp(zr_config_keys[i].flag, flag) == 0) {
            return &zr_config_keys[i];
        }
    }
    return NULL;
}

/* An alias stands for its target everywhere except in messages. */
const cfg_key *zr_config_resolve(const cfg_key *k)
{
    if (k != NULL && k->type == K_ALIAS) {
        k = zr_config_find_key(k->target);
        ZR_ASSERT(k != NULL);
    }
    return k;
}

/* Is path a section (an object holding keys), e.g. "zero_optimization"? */
int zr_config_is_section(const char *path)
{
    size_t n = strlen(path);
    for (size_t i = 0; i < zr_config_nkeys; i++) {
        if (strncmp(zr_config_keys[i].path, path, n) == 0 && zr_config_keys[i].path[n] == '.') {
            return 1;
        }
    }
    return 0;
}

/* Length of the parent part of a dotted path ("a.b.c" -> 3, "a" -> 0). */
size_t zr_config_parent_len(const char *path)
{
    const char *dot = strrchr(path, '.');
    return dot == NULL ? 0 : (size_t)(dot - path);
}

const char *zr_config_leaf(const char *path)
{
    const char *dot = strrchr(path, '.');
    return dot == NULL ? path : dot + 1;
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
void zr_config_suggest_json(const char *parent, const char *name, char *out, size_t n)
{
    size_t plen = strlen(parent);
    int best = INT_MAX;
    out[0] = '\0';
    for (size_t i = 0; i < zr_config_nkeys; i++) {
        const char *p = zr_config_keys[i].path;
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
        if (strcmp(zr_config_leaf(p), name) == 0 && best > 1) {
            best = 1;
            snprintf(out, n, "%s", p);
        }
    }
}

/* Suggest a flag (path or short alias) for an unknown one. */
void zr_config_suggest_flag(const char *name, char *out, size_t n)
{
    int best = INT_MAX;
    out[0] = '\0';
    for (size_t i = 0; i < zr_config_nkeys; i++) {
        const char *cands[3] = {zr_config_keys[i].path, zr_config_keys[i].flag,
                                zr_config_leaf(zr_config_keys[i].path)};
        for (int j = 0; j < 3; j++) {
            if (cands[j] == NULL || zr_config_keys[i].type == K_NOEFFECT) {
                continue;
            }
            int d = edit_distance(name, cands[j]);
            if (j == 2 && d == 0) {
                d = 1; /* the leaf of a dotted key: suggest the full path */
            }
            if (close_enough(name, d) && d < best) {
                best = d;
                snprintf(out, n, "--%s", j == 1 ? zr_config_keys[i].flag : zr_config_keys[i].path);
            }
        }
    }
}

/* ---- defaults and the key list ----------------------------------------- */

void zr_config_defaults(zr_train_config *c)
{
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < zr_config_nkeys; i++) {
        const cfg_key *k = &zr_config_keys[i];
        if (!zr_config_has_field(k)) {
            continue;
        }
        void *p = zr_config_field(c, k->off);
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
            *(double *)zr_config_field(c, k->off2) = k->def2;
            break;
        case K_NOEFFECT:
        case K_ALIAS:
            break;
        }
    }
}

zr_config_policy zr_config_key_policy(const char *path)
{
    const cfg_key *k = zr_config_resolve(zr_config_find_key(path));
    return k != NULL ? k->resume : ZR_RESUME_CHANGE;
}

int zr_config_listed(const cfg_key *k)
{
    return zr_config_has_field(k) && k->type != K_NOEFFECT && k->type != K_ALIAS;
}

size_t zr_config_key_count(void)
{
    return zr_config_nkeys;
}

int zr_config_key_info(size_t i, const char **path, const char **flag, zr_config_kind *kind)
{
    for (size_t j = 0; j < zr_config_nkeys; j++) {
        if (!zr_config_listed(&zr_config_keys[j])) {
            continue;
        }
        if (i-- == 0) {
            const cfg_key *k = &zr_config_keys[j];
            *path = k->path;
            *flag = k->flag;
            *kind = k->type == K_INT || k->type == K_I64 || k->type == K_U64 ? ZR_CFG_INTEGER
                    : k->type == K_BOOL                                      ? ZR_CFG_BOOLEAN
                                                                             : ZR_CFG_OTHER;
            return 1;
        }
    }
    return 0;
}
