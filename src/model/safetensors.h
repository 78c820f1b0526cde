/*
 * safetensors.h - a safetensors file read (issue 43): the u64 header length,
 * the JSON header (checked whole when the file is opened), then the bytes;
 * and a Hugging Face folder's weights, one file or a sharded set.
 * Internal to src/model and the layers above it.
 *
 * zr_safetensors_open checks every entry before anything is read, every
 * integer of the file bounded before use: a header of at most
 * ZR_SAFETENSORS_MAX_HEADER bytes inside the file, a JSON object whose
 * __metadata__ (if any) is an object of strings, a dtype it knows, a shape
 * of at most ZR_SAFETENSORS_MAX_DIMS non-negative integer sizes whose byte
 * count fits in 64 bits, data_offsets [begin, end] inside the file's data,
 * end - begin equal to the shape's elements times the dtype's size, no two
 * tensors overlapping, no byte of the data in none (no hole: the format's
 * rule) and no name twice. Each failure is ZR_ERR_FORMAT
 * naming the file and the tensor. Tensors are read whole or in part into
 * fp32 (F32, BF16 and F16 converted exactly), with pread: no shared file
 * position, so threads may read one open file at once.
 */
#ifndef ZR_MODEL_SAFETENSORS_H
#define ZR_MODEL_SAFETENSORS_H

#include "zr/base.h"

#include <stdint.h>
#include <stdio.h>

#define ZR_SAFETENSORS_MAX_DIMS 8
/* The largest header read (the format's reference implementation's bound: 100 MB). */
#define ZR_SAFETENSORS_MAX_HEADER 100000000u

typedef struct zr_safetensors_tensor {
    char *name;
    char dtype[8]; /* "F32", "BF16", ... */
    int ndim;
    int64_t shape[ZR_SAFETENSORS_MAX_DIMS];
    uint64_t begin, end; /* byte offsets from the start of the data */
    size_t numel;
} zr_safetensors_tensor;

typedef struct zr_safetensors {
    char *path;
    FILE *f;
    uint64_t size, data0; /* file size; where the data start */
    int count;
    zr_safetensors_tensor *tensors; /* [count], in the header's order */
} zr_safetensors;

/* Opens path and checks its header (above). Free with zr_safetensors_close. */
zr_status zr_safetensors_open(zr_safetensors *s, const char *path);
/* Safe on a zeroed struct and after a failed open. */
void zr_safetensors_close(zr_safetensors *s);
/* "[a, b, ...]" of ndim sizes into out (n bytes; 96 hold any 3 sizes), for messages. */
void zr_safetensors_shape_text(char *out, size_t n, const int64_t *shape, int ndim);
/* The tensor called name, or NULL. */
const zr_safetensors_tensor *zr_safetensors_find(const zr_safetensors *s, const char *name);
/*
 * Tensor t's numel values into out as fp32: F32, BF16 or F16 (another dtype:
 * ZR_ERR_INVALID naming it); a short read ZR_ERR_IO naming file and tensor.
 */
zr_status zr_safetensors_read_f32(const zr_safetensors *s, const zr_safetensors_tensor *t,
                                  float *out);
/*
 * Elements [first, first + count) of tensor t (row-major, as stored) into
 * out[0 .. count) as fp32, reading only their bytes; a range past the
 * tensor is ZR_ERR_INVALID naming it.
 */
zr_status zr_safetensors_read_f32_range(const zr_safetensors *s, const zr_safetensors_tensor *t,
                                        size_t first, size_t count, float *out);

/*
 * A Hugging Face folder's weights: model.safetensors when the folder has
 * one (as transformers looks), else the shards model.safetensors.index.json
 * names in its weight_map (tensor -> file), each opened and its header
 * checked once, here. The index must agree with the shards exactly: each
 * file name a plain name inside the folder (no '/', no ".."), each file
 * present, each tensor listed once and found in the file it names and in
 * no other, and no tensor of a listed file left out of weight_map; each
 * failure ZR_ERR_FORMAT naming the index file and the key.
 */
typedef struct zr_hf_weights_entry {
    const char *name; /* owned by its file's tensor */
    int file, tensor; /* files[file].tensors[tensor] */
} zr_hf_weights_entry;

typedef struct zr_hf_weights {
    char *index;           /* the index file's path; NULL for a single file */
    int nfiles;            /* 1 for a single file */
    zr_safetensors *files; /* [nfiles] */
    int count;
    zr_hf_weights_entry *entries; /* [count], every file's tensors, sorted by name */
} zr_hf_weights;

/* Opens the folder dir (above). Free with zr_hf_weights_close. */
zr_status zr_hf_weights_open(zr_hf_weights *w, const char *dir);
/* Safe on a zeroed struct and after a failed open. */
void zr_hf_weights_close(zr_hf_weights *w);
/* The tensor called name and (file non-NULL) the file holding it; NULL when none has it. */
const zr_safetensors_tensor *zr_hf_weights_find(const zr_hf_weights *w, const char *name,
                                                const zr_safetensors **file);
/* The tensors of every file, by name: count, then tensor i of them (0 <= i < count). */
int zr_hf_weights_count(const zr_hf_weights *w);
const zr_safetensors_tensor *zr_hf_weights_tensor(const zr_hf_weights *w, int i,
                                                  const zr_safetensors **file);

#endif
