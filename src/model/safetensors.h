/*
 * safetensors.h - a safetensors file read (issue 43): the u64 header length,
 * the JSON header (checked whole when the file is opened), then the bytes.
 * Internal to src/model and the layers above it.
 *
 * zr_safetensors_open checks every entry before anything is read: a dtype
 * it knows, a shape of non-negative sizes, data_offsets [begin, end] inside
 * the file's data, end - begin equal to the shape's elements times the
 * dtype's size, and no two tensors overlapping. Each failure is
 * ZR_ERR_FORMAT naming the file and the tensor. Tensors are read one at a
 * time into fp32 (F32, BF16 and F16 converted exactly).
 */
#ifndef ZR_MODEL_SAFETENSORS_H
#define ZR_MODEL_SAFETENSORS_H

#include "zr/base.h"

#include <stdint.h>
#include <stdio.h>

#define ZR_SAFETENSORS_MAX_DIMS 8

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
/* The tensor called name, or NULL. */
const zr_safetensors_tensor *zr_safetensors_find(const zr_safetensors *s, const char *name);
/*
 * Tensor t's numel values into out as fp32: F32, BF16 or F16 (another dtype:
 * ZR_ERR_INVALID naming it); a short read ZR_ERR_IO naming file and tensor.
 */
zr_status zr_safetensors_read_f32(const zr_safetensors *s, const zr_safetensors_tensor *t,
                                  float *out);

#endif
