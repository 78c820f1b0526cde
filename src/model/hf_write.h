/*
 * hf_write.h - models written as Hugging Face files (issue 43): a
 * safetensors file, and a folder `transformers` loads with from_pretrained
 * (config.json + model.safetensors, or model-0000k-of-0000N.safetensors
 * with model.safetensors.index.json past a size). Internal to src/model and
 * the layers above it; hf_write.c writes, hf_export.c describes GPT-2's and
 * the Llama family's tensors and config.json.
 *
 * A tensor is written in the dtype asked: F32 as it is, BF16 and F16 rounded
 * to nearest even. A value that is not finite, or that F16 (or BF16) cannot
 * hold, is ZR_ERR_INVALID naming the file, the tensor and the element:
 * never an infinity in a file. Tensors go into the file in the order given,
 * the header's __metadata__ is {"format": "pt"} as transformers writes it.
 *
 * A folder is written whole or not at all: into a temporary folder beside
 * it ("<dir>.tmp-<pid>-<n>", made exclusively), every file fsynced, then
 * renamed onto dir without replacing anything. An existing dir (a folder, a
 * file, a link) is refused naming it: an export never overwrites.
 */
#ifndef ZR_MODEL_HF_WRITE_H
#define ZR_MODEL_HF_WRITE_H

#include "zr/base.h"
#include "zr/llama.h"
#include "zr/model.h"

#include <stdint.h>

typedef enum zr_hf_dtype { ZR_HF_F32 = 0, ZR_HF_BF16, ZR_HF_F16 } zr_hf_dtype;

/* One tensor: its values in zr's layout, [rows, cols] row-major (cols 1: a vector). */
typedef struct zr_hf_tensor {
    char name[112];
    const float *data;
    int ndim;       /* 1 or 2 */
    int rows, cols; /* as held in data */
    int transpose;  /* written as [cols, rows] (GPT-2's Conv1D weights) */
} zr_hf_tensor;

typedef struct zr_hf_write_opts {
    zr_hf_dtype dtype;
    uint64_t
        max_shard_bytes; /* tensor bytes per file at most (a larger tensor alone); 0: one file */
    int max_pos;         /* Llama family: max_position_embeddings (0: the family's default) */
} zr_hf_write_opts;

/* "f32", "bf16", "f16" (also "float32", "bfloat16", "float16"); else ZR_ERR_INVALID naming s. */
zr_status zr_hf_dtype_parse(const char *s, zr_hf_dtype *out);
/* transformers' torch dtype name: "float32", "bfloat16", "float16". */
const char *zr_hf_dtype_torch(zr_hf_dtype d);
/*
 * A size as transformers' max_shard_size: "N", "NB", "NKB"/"NMB"/"NGB" (powers of 1000) or
 * "NKiB"/"NMiB"/"NGiB" (of 1024); at least 1 byte. Else ZR_ERR_INVALID naming s.
 */
zr_status zr_hf_size_parse(const char *s, uint64_t *out);

/* x rounded to nearest even; bf16's infinity when |x| is past its range (the caller refuses it). */
uint16_t zr_hf_bf16_from_f32(float x);
/* x rounded to nearest even; *overflow = 1 (and an infinity) when |x| >= 65520. */
uint16_t zr_hf_f16_from_f32(float x, int *overflow);

/*
 * One safetensors file at path (temporary name, fsync, rename: zr/file.h); shown names the
 * file in messages (NULL: path).
 */
zr_status zr_hf_write_safetensors(const char *path, const char *shown, const zr_hf_tensor *t, int n,
                                  zr_hf_dtype dtype);
/*
 * The folder dir: config_json as config.json (text), the tensors as one file or shards
 * (o->max_shard_bytes), written atomically (above). Refuses an existing dir.
 */
zr_status zr_hf_write_folder(const char *dir, const char *config_json, const zr_hf_tensor *t, int n,
                             const zr_hf_write_opts *o);

/*
 * GPT-2's tensors from its units with Hugging Face names after prefix ("transformer." for a
 * GPT2LMHeadModel folder, "" for zr_gpt_write_safetensors' file): wte [V, C] (the padded rows
 * cut), wpe, h.{l}.* (Conv1D weights transposed to [in, out]), ln_f; no lm_head (tied). *t is
 * a counted allocation (zr_free); the data point into units.
 */
zr_status zr_hf_gpt2_tensors(const zr_gpt_config *cfg, float *const *units, const char *prefix,
                             zr_hf_tensor **t, int *n);
/* The Llama family's tensors (src/model/llama.c's units: HF names, [out, in]); as above. */
zr_status zr_hf_llama_tensors(const zr_llama_config *cfg, float *const *units, zr_hf_tensor **t,
                              int *n);

/* config.json text (a counted allocation: zr_free) for GPT2LMHeadModel / the Llama family. */
zr_status zr_hf_gpt2_config_json(const zr_gpt_config *cfg, zr_hf_dtype dtype, char **out);
zr_status zr_hf_llama_config_json(const zr_llama_config *cfg, const zr_hf_write_opts *o,
                                  char **out);

/* A whole folder of each (the two above and zr_hf_write_folder). */
zr_status zr_hf_write_gpt2(const char *dir, const zr_gpt_config *cfg, float *const *units,
                           const zr_hf_write_opts *o);
zr_status zr_hf_write_llama(const char *dir, const zr_llama_config *cfg, float *const *units,
                            const zr_hf_write_opts *o);
/* The folder of the model cfg describes, whichever its architecture (max_pos: cfg's max_t). */
zr_status zr_hf_write_model(const char *dir, const zr_gpt_config *cfg, float *const *units,
                            const zr_hf_write_opts *o);

#endif
