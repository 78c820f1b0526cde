/*
 * test_st.h - safetensors fixtures for the tests of Hugging Face folders:
 * files written from a list of tensors (header by cJSON, data packed in
 * order), a model.safetensors.index.json, a file's tensors copied to F32.
 */
#ifndef ZR_TEST_ST_H
#define ZR_TEST_ST_H

#include "test.h"

#include "../src/model/safetensors.h" /* internal to src/model */

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct test_st_tensor {
    const char *name, *dtype;
    int ndim;
    int64_t shape[4];
    const void *data; /* bytes bytes; NULL: zeros */
    size_t bytes;
} test_st_tensor;

/* A safetensors file at path: a raw header (not NULL) or one made from t[0 .. n). */
static inline void test_st_write(const char *path, const char *raw, const test_st_tensor *t, int n)
{
    cJSON *hdr = cJSON_CreateObject();
    size_t at = 0;
    for (int i = 0; raw == NULL && i < n; i++) {
        cJSON *e = cJSON_AddObjectToObject(hdr, t[i].name);
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        cJSON *off = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddStringToObject(e, "dtype", t[i].dtype);
        for (int d = 0; d < t[i].ndim; d++) {
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t[i].shape[d]));
        }
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)at));
        at += t[i].bytes;
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)at));
    }
    char *text = raw != NULL ? NULL : cJSON_PrintUnformatted(hdr);
    const char *h = raw != NULL ? raw : text;
    size_t hl = strlen(h);
    for (int i = 0; raw != NULL && i < n; i++) {
        at += t[i].bytes;
    }
    unsigned char *buf = calloc(8 + hl + at + 1, 1);
    for (int i = 0; i < 8; i++) {
        buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    }
    memcpy(buf + 8, h, hl);
    for (int i = 0, o = 0; i < n; o += (int)t[i].bytes, i++) {
        if (t[i].data != NULL) {
            memcpy(buf + 8 + hl + o, t[i].data, t[i].bytes);
        }
    }
    zr_test_write_file(path, buf, 8 + hl + at);
    free(buf);
    cJSON_free(text);
    cJSON_Delete(hdr);
}

/* dir/model.safetensors.index.json mapping name[i] to file[i]. */
static inline void test_st_index(const char *dir, const char *const *name, const char *const *file,
                                 int n)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "metadata");
    cJSON_AddNumberToObject(meta, "total_size", 0);
    cJSON *map = cJSON_AddObjectToObject(root, "weight_map");
    for (int i = 0; i < n; i++) {
        cJSON_AddStringToObject(map, name[i], file[i]);
    }
    char *text = cJSON_Print(root), path[512];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    zr_test_write_file(path, text, strlen(text));
    cJSON_free(text);
    cJSON_Delete(root);
}

/* The tensors of a file, read to F32 (names and shapes point into s: keep it open). */
typedef struct test_st_copy {
    zr_safetensors s;
    test_st_tensor *t;
    float **data;
    const char **names;
    int n;
} test_st_copy;

static inline void test_st_copy_open(test_st_copy *c, const char *path)
{
    memset(c, 0, sizeof *c);
    TEST_OK(zr_safetensors_open(&c->s, path));
    c->n = c->s.count;
    c->t = calloc((size_t)c->n + 1, sizeof *c->t);
    c->data = calloc((size_t)c->n + 1, sizeof *c->data);
    c->names = calloc((size_t)c->n + 1, sizeof *c->names);
    for (int i = 0; i < c->n; i++) {
        const zr_safetensors_tensor *x = &c->s.tensors[i];
        c->data[i] = malloc(x->numel * sizeof(float) + 1);
        TEST_OK(zr_safetensors_read_f32(&c->s, x, c->data[i]));
        c->t[i] = (test_st_tensor){x->name, "F32", x->ndim, {0}, c->data[i], x->numel * 4};
        for (int d = 0; d < x->ndim && d < 4; d++) {
            c->t[i].shape[d] = x->shape[d];
        }
        c->names[i] = x->name;
    }
}

static inline void test_st_copy_close(test_st_copy *c)
{
    for (int i = 0; i < c->n; i++) {
        free(c->data[i]);
    }
    free(c->t), free(c->data), free(c->names);
    zr_safetensors_close(&c->s);
}

#endif /* ZR_TEST_ST_H */
