/*
 * zr/config.h - the configuration of "zr train": DeepSpeed's key names and
 * meanings where they apply, zr's own keys in the "zr" section.
 *
 * One table (src/config/config_keys.c) lists every key once with its type, default, range and
 * help; the JSON reader, the command-line flags, --help and the printout of
 * the effective configuration are all generated from it, so they cannot
 * drift apart.
 *
 * Precedence: defaults < JSON file (--config FILE) < command-line flags
 * (--key value, dotted names: --zero_optimization.stage 3, --zr.model.layers 4,
 * plus short aliases listed in the table).
 */
#ifndef ZR_CONFIG_H
#define ZR_CONFIG_H

#include "zr/base.h"
#include "zr/zero.h"

#include <stdio.h>

#define ZR_CFG_STR 256

typedef struct zr_train_config {
    /* ---- DeepSpeed top level ---- */
    int train_batch_size;               /* global sequences per step; 0 = derived */
    int train_micro_batch_size_per_gpu; /* sequences per rank per micro-batch */
    int gradient_accumulation_steps;    /* 0 = derived */
    double gradient_clipping;           /* global norm; 0 disables */
    int steps_per_print;
    int bf16_enabled; /* bf16.enabled: 16-bit wire; on a GPU also bf16 compute (fp32 on the CPU) */
    char communication_data_type[16]; /* "", "bf16" or "fp32" ("" = bf16 if bf16.enabled else fp32)
                                       */

    /* optimizer: {type, params: {lr, betas, eps, weight_decay}} */
    char optimizer_type[32]; /* "AdamW", or "Adam" (DeepSpeed's Adam is AdamW by default) */
    double lr;
    double beta1, beta2;
    double eps;
    double weight_decay;

    /* scheduler: {type, params: {...}}; type "" = constant lr */
    char scheduler_type[32]; /* "", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR" */
    double warmup_min_lr;    /* WarmupLR / WarmupDecayLR */
    double warmup_max_lr;    /* 0 = optimizer lr */
    int warmup_num_steps;
    int total_num_steps;     /* WarmupDecayLR / WarmupCosineLR; 0 = zr.train_steps */
    double cos_min_ratio;    /* WarmupCosineLR: final lr = ratio * lr */
    double warmup_min_ratio; /* WarmupCosineLR: first lr = ratio * lr */
    char warmup_type[16];    /* "log" (DeepSpeed's default) or "linear" warm-up curve */

    /* zero_optimization */
    int stage;
    int zero_quantized_weights;   /* qwZ */
    int zero_hpz_partition_size;  /* hpZ group size; 1 = off, 0 = ranks per node (resolved by the
                                     communicator) */
    int zero_quantized_gradients; /* qgZ */
    long long reduce_bucket_size; /* elements of gradient reductions in flight */
    long long stage3_prefetch_bucket_size; /* elements prefetched ahead (budget) */
    long long stage3_max_live_parameters;  /* elements gathered at once */
    int overlap_comm;

    /* ---- zr's own section: "zr": {...} ---- */
    /* zr.model */
    int layers, heads, channels, seq_len;
    int max_seq_len; /* positions the model has (rows of wpe; GPT-2: 1024), >= seq_len */
    int vocab_size;  /* 0 = from the data's kind (text 256, GPT-2 50257, llama-3 128256) */
    char init_path[ZR_CFG_STR]; /* "" = random init; else an llm.c GPT-2 model file to start from */
    int activation_checkpointing; /* recompute each block's forward in the backward */
    /* zr.data */
    char data_path[ZR_CFG_STR]; /* "" = the bundled corpus (Debian's fortunes); text file or llm.c
                                   .bin shard */
    char val_path[ZR_CFG_STR];  /* "" = data_path's last ZR_VAL_PERCENT; else a file or pattern */
    int shuffle;                /* windows in a permutation per epoch drawn from (seed, epoch) */
    int val_every;              /* steps between validation passes; 0 = never */
    int val_batches;
    /* zr.train */
    int train_steps;
    unsigned long long seed;
    int threads;                   /* BLAS threads per rank */
    char metrics_path[ZR_CFG_STR]; /* JSON lines, one per step; "" = <checkpoint_dir>/metrics.jsonl
                                      or none */
    int max_nonfinite_steps; /* stop after this many consecutive non-finite steps; 0 = never */
    double timeout_s;        /* watchdog: seconds a wait may go without progress; 0 = forever */
    /* zr.checkpoint */
    char checkpoint_dir[ZR_CFG_STR]; /* "" = no checkpoints */
    int checkpoint_every;            /* steps; 0 = only at the end */
    int keep_checkpoints;            /* newest complete checkpoints kept; 0 = all */
    int resume;                      /* continue from the newest complete checkpoint */
    char resume_from[ZR_CFG_STR];    /* "" = none; else continue from this checkpoint */
    int resume_new_data;             /* a resume may train on other data than the checkpoint's */
    /* zr.quant */
    int qwz_bits, qwz_group;
    int qgz_bits, qgz_group;
    int qgz_error_feedback;
    int qgz_chunks;
    /* zr.compare: also report what ZeRO-3 bf16 would have sent (demo) */
    int compare_zero3;
    /* zr.device: "auto" (the GPUs when every rank sees one, else the CPU), "cpu" or "cuda" */
    char device[16];
    /* zr.transport: how collectives move GPU memory: "auto", "nccl" or "staged" (zr/comm.h) */
    char transport[16];

    /* the --config file read (not a key: it names where the keys came from), "" = none */
    char config_path[4096];

    /*
     * ZR_GIVEN_* bits of the keys that a file or a flag set explicitly. The
     * batch sizes need it to know which two of the three to derive the third
     * from; the ZeRO++ switches need it because their defaults (on) quietly
     * turn off below the stage they need, while an explicit request is an error.
     */
    unsigned given;
} zr_train_config;

#define ZR_GIVEN_TRAIN_BATCH (1u << 0)
#define ZR_GIVEN_MICRO_BATCH (1u << 1)
#define ZR_GIVEN_GRAD_ACCUM  (1u << 2)
#define ZR_GIVEN_QWZ         (1u << 3)
#define ZR_GIVEN_HPZ         (1u << 4)
#define ZR_GIVEN_QGZ         (1u << 5)
/* the model's shape: with zr.model.init the file decides, and a key given must agree with it */
#define ZR_GIVEN_LAYERS      (1u << 6)
#define ZR_GIVEN_HEADS       (1u << 7)
#define ZR_GIVEN_CHANNELS    (1u << 8)
#define ZR_GIVEN_MAX_SEQ_LEN (1u << 9)
/* sizes whose defaults fit the input (the data, the model file); a value given is kept */
#define ZR_GIVEN_SEQ_LEN     (1u << 10)
#define ZR_GIVEN_VAL_BATCHES (1u << 11)

/* Defaults (the demo's small GPT with ZeRO++ on). */
void zr_config_defaults(zr_train_config *c);

/*
 * Read a JSON file over c. Errors: unreadable file (ZR_ERR_IO naming it),
 * malformed JSON (ZR_ERR_FORMAT with the file, line and column), wrong type
 * or out-of-range value (ZR_ERR_INVALID naming the key, its value and the
 * expected type/range), an unknown key inside a section zr knows (with a
 * did-you-mean), a key given twice, null, \u0000 in a string, an integer
 * that is not exactly a whole number in range. An unknown top-level key is
 * a warning through warn (the first 10 named, then their count) so the
 * caller can print it on rank 0 only; so are the notes on DeepSpeed keys
 * without effect ("note: " + text).
 */
zr_status zr_config_load_json(zr_train_config *c, const char *path,
                              void (*warn)(void *ctx, const char *msg), void *ctx);

/* Parse JSON text (same rules; name is used in messages). */
zr_status zr_config_parse_json(zr_train_config *c, const char *text, const char *name,
                               void (*warn)(void *ctx, const char *msg), void *ctx);

/*
 * Apply command-line flags (argv after "train"): --config FILE is read first
 * wherever it appears, then every --key value / --key=value in order.
 * Boolean keys also accept a bare --key (true) and --no-key. An unknown flag,
 * a missing value or a bad value is ZR_ERR_INVALID naming the flag.
 * *help is set when --help / -h is present (nothing else is checked then).
 */
zr_status zr_config_from_args(zr_train_config *c, int argc, char **argv, int *help,
                              void (*warn)(void *ctx, const char *msg), void *ctx);

/*
 * Cross-field checks once everything is read, for a world of world ranks:
 * batch-size arithmetic (train_batch_size = micro * accumulation * world,
 * deriving whichever is 0), channels % heads, world % hpZ size, qwZ/hpZ need
 * stage 3, qgZ stage >= 2, quantization bits/group, scheduler names and
 * parameters, communication_data_type. Fills derived fields. ZR_ERR_INVALID
 * naming the keys involved.
 */
zr_status zr_config_finalize(zr_train_config *c, int world);

struct zr_gpt_config;

/*
 * zr.model.init: take the model's shape from the llm.c file at path (whose
 * header is file). Keys given explicitly (layers, heads, channels,
 * max_seq_len, vocab_size) must equal the file's, and seq_len must fit its
 * max_seq_len; otherwise ZR_ERR_INVALID naming the key, both values and the
 * file. On success c holds the file's shape.
 */
zr_status zr_config_adopt_model(zr_train_config *c, const struct zr_gpt_config *file,
                                const char *path);

/*
 * The engine settings a finalized configuration asks for (stage, wire type,
 * ZeRO++ switches and their quantization, buckets, AdamW, clipping, working
 * type); the trainer runs with them and the planner costs them. bf16_work is
 * the working type bf16.enabled gives on the device the model computes on
 * (zr_gpt_backend_i.bf16_work_type): bf16 on GPUs (bf16 working parameters
 * and gradients, the model computing in bf16 on them, as DeepSpeed does);
 * fp32 on the CPU (the model rounds its matrix products' inputs to bf16
 * itself where the CPU has bf16 products).
 */
zr_engine_config zr_config_engine(const zr_train_config *c, zr_dtype bf16_work);

/* --help: every key with its type, default and meaning, grouped by section. */
void zr_config_print_help(FILE *f);

/* The effective configuration, one "key = value" line each (rank 0 prints it). */
void zr_config_print(FILE *f, const zr_train_config *c);

/*
 * The effective configuration key by key, for comparing ranks: entry i of
 * zr_config_key_count() is a key with its dotted name returned and its value
 * printed into buf, or not a key of the configuration (NULL, buf empty).
 */
size_t zr_config_key_count(void);
const char *zr_config_key_value(const zr_train_config *c, size_t i, char *buf, size_t n);

/*
 * The effective configuration as one JSON object (stored in checkpoint
 * manifests): *out is '\0'-terminated text from the counted allocator, freed
 * with zr_free (NULL on failure).
 */
zr_status zr_config_to_json(const zr_train_config *c, char **out);

/*
 * What a resume may do with a key, decided once per key in the key table
 * (src/config/config_keys.c):
 *   MATCH   must be the checkpoint's (the seed, zr.model.init): refused, naming
 *           the key, both values and the checkpoint;
 *   MODEL   a dimension of the model: the checkpoint's model must be this one
 *           (compared as the model's shape, whatever the keys said);
 *   DATA    the training data: compared by content; other data is refused
 *           unless zr.checkpoint.resume_new_data;
 *   CHANGE  may change on purpose (a new learning rate, batch, stage...): every
 *           change is listed at start-up and recorded in the manifest and the
 *           metrics file;
 *   LOCAL   how this launch resumes (--resume, --resume-from): not compared.
 */
typedef enum zr_config_policy {
    ZR_RESUME_CHANGE = 0,
    ZR_RESUME_MATCH,
    ZR_RESUME_MODEL,
    ZR_RESUME_DATA,
    ZR_RESUME_LOCAL
} zr_config_policy;

/* One key whose value differs from the checkpoint's configuration, or that it does not record. */
typedef struct zr_config_change {
    const char *key; /* dotted path */
    zr_config_policy policy;
    int recorded;            /* 0: the checkpoint does not record the key (was is "") */
    char was[160], now[160]; /* as printed: 3, 0.001, true, "AdamW" */
} zr_config_change;

/*
 * Compare c with saved_json, the configuration a checkpoint's manifest
 * recorded (NULL: it records none): out[0..*n) gets every key (not LOCAL)
 * whose value differs, and every key (not LOCAL) that the saved text does not
 * record or records with a value this zr does not take (recorded = 0: it
 * cannot be compared, which is not "unchanged"). out must hold
 * zr_config_key_count() entries.
 */
zr_status zr_config_compare(const zr_train_config *c, const char *saved_json, zr_config_change *out,
                            int *n);

/* What a key holds, for tools and tests that walk every key. */
typedef enum zr_config_kind { ZR_CFG_INTEGER, ZR_CFG_BOOLEAN, ZR_CFG_OTHER } zr_config_kind;

/*
 * The i-th key (from 0) that sets a field, in table order: its dotted path,
 * its short flag without "--" (NULL if none) and its kind. Returns 0 when i
 * is past the last key.
 */
int zr_config_key_info(size_t i, const char **path, const char **flag, zr_config_kind *kind);

/* The resume policy of the key at dotted path (ZR_RESUME_CHANGE for an unknown path). */
zr_config_policy zr_config_key_policy(const char *path);

#endif /* ZR_CONFIG_H */
