/*
 * safetensors.c - the safetensors reader (safetensors.h): the header parsed
 * with cJSON and checked against the file before any tensor is read.
 */
#include "safetensors.h"

#include "zr/file.h"

#include <cJSON.h>
#include <stdlib.h>
#include <string.h>

/* Bytes per element of a dtype safetensors names; 0 for one it does not. */
static size_t dtype_size(const char *d)
{
    static const struct {
        const char *name;
        size_t size;
    } sizes[] = {{"F64", 8}, {"F32", 4}, {"F16", 2},  {"BF16", 2},    {"I64", 8},
                 {"U64", 8}, {"I32", 4}, {"U32", 4},  {"I16", 2},     {"U16", 2},
                 {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        if (strcmp(d, sizes[i].name) == 0) {
            return sizes[i].size;
        }
    }
    return 0;
}

/* A JSON number that is a non-negative integer below 2^53, into *out. */
static int json_u64(const cJSON *x, uint64_t *out)
{
    if (!cJSON_IsNumber(x) || !(x->valuedouble >= 0) || x->valuedouble > 9007199254740992.0 ||
        x->valuedouble != (double)(uint64_t)x->valuedouble) {
        return 0;
    }
    *out = (uint64_t)x->valuedouble;
    return 1;
}

/* One header entry into t (name already set): dtype, shape, offsets and their agreement. */
static zr_status entry_read(const zr_safetensors *s, zr_safetensors_tensor *t, const cJSON *e)
{
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    size_t es = cJSON_IsString(dt) ? dtype_size(dt->valuestring) : 0;
    if (es == 0) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: tensor %s: dtype %s is not one safetensors defines", s->path,
                t->name, cJSON_IsString(dt) ? dt->valuestring : "(missing)");
    }
    snprintf(t->dtype, sizeof t->dtype, "%s", dt->valuestring);
    if (!cJSON_IsArray(sh) || cJSON_GetArraySize(sh) > ZR_SAFETENSORS_MAX_DIMS) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: tensor %s: shape is not an array of at most %d sizes", s->path,
                t->name, ZR_SAFETENSORS_MAX_DIMS);
    }
    uint64_t numel = 1, v = 0;
    t->ndim = cJSON_GetArraySize(sh);
    for (int i = 0; i < t->ndim; i++) {
        if (!json_u64(cJSON_GetArrayItem(sh, i), &v) || (v != 0 && numel > UINT64_MAX / v / es)) {
            ZR_FAIL(ZR_ERR_FORMAT, "%s: tensor %s: shape[%d] is not a size", s->path, t->name, i);
        }
        t->shape[i] = (int64_t)v;
        numel *= v;
    }
    t->numel = (size_t)numel;
    if (cJSON_GetArraySize(off) != 2 || !json_u64(cJSON_GetArrayItem(off, 0), &t->begin) ||
        !json_u64(cJSON_GetArrayItem(off, 1), &t->end) || t->end < t->begin) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: tensor %s: data_offsets is not [begin, end] with begin <= end",
                s->path, t->name);
    }
    if (t->end > s->size - s->data0) {
        ZR_FAIL(ZR_ERR_FORMAT,
                "%s: tensor %s: data_offsets [%llu, %llu] go past the end of the file's %llu "
                "bytes of data",
                s->path, t->name, (unsigned long long)t->begin, (unsigned long long)t->end,
                (unsigned long long)(s->size - s->data0));
    }
    if (t->end - t->begin != numel * es) {
        ZR_FAIL(ZR_ERR_FORMAT,
                "%s: tensor %s: %llu bytes for %llu elements of %s (%zu bytes each: %llu)", s->path,
                t->name, (unsigned long long)(t->end - t->begin), (unsigned long long)numel,
                t->dtype, es, (unsigned long long)(numel * es));
    }
    return ZR_OK;
}

static int by_begin(const void *a, const void *b)
{
    const zr_safetensors_tensor *x = *(const zr_safetensors_tensor *const *)a;
    const zr_safetensors_tensor *y = *(const zr_safetensors_tensor *const *)b;
    return x->begin < y->begin   ? -1
           : x->begin > y->begin ? 1
                                 : (x->end > y->end) - (x->end < y->end);
}

/* No two tensors share a byte (empty ones aside). */
static zr_status check_overlap(const zr_safetensors *s)
{
    zr_status st = ZR_OK;
    const zr_safetensors_tensor **order = NULL;
    ZR_ALLOC_GOTO(order, (size_t)s->count + 1, st, done);
    for (int i = 0; i < s->count; i++) {
        order[i] = &s->tensors[i];
    }
    qsort(order, (size_t)s->count, sizeof *order, by_begin);
    const zr_safetensors_tensor *prev = NULL;
    for (int i = 0; i < s->count; i++) {
        if (order[i]->begin == order[i]->end) {
            continue;
        }
        if (prev != NULL && order[i]->begin < prev->end) {
            ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT,
                         "%s: tensors %s [%llu, %llu] and %s [%llu, %llu] overlap", s->path,
                         prev->name, (unsigned long long)prev->begin, (unsigned long long)prev->end,
                         order[i]->name, (unsigned long long)order[i]->begin,
                         (unsigned long long)order[i]->end);
        }
        prev = order[i];
    }
done:
    zr_free(order);
    return st;
}

/* The header's entries (all but __metadata__) into s->tensors. */
static zr_status header_read(zr_safetensors *s, const cJSON *hdr)
{
    const cJSON *e = NULL;
    int n = 0;
    cJSON_ArrayForEach(e, hdr)
    {
        n += strcmp(e->string, "__metadata__") != 0;
    }
    ZR_ALLOC(s->tensors, (size_t)n + 1);
    cJSON_ArrayForEach(e, hdr)
    {
        if (strcmp(e->string, "__metadata__") == 0) {
            continue;
        }
        zr_safetensors_tensor *t = &s->tensors[s->count];
        size_t len = strlen(e->string);
        ZR_ALLOC(t->name, len + 1);
        memcpy(t->name, e->string, len + 1);
        s->count++;
        if (!cJSON_IsObject(e)) {
            ZR_FAIL(ZR_ERR_FORMAT, "%s: tensor %s: its entry is not an object", s->path, t->name);
        }
        ZR_CHECK(entry_read(s, t, e));
    }
    return check_overlap(s);
}

zr_status zr_safetensors_open(zr_safetensors *s, const char *path)
{
    zr_status st = ZR_OK;
    char *text = NULL;
    cJSON *hdr = NULL;
    unsigned char len8[8];
    uint64_t hl = 0;
    memset(s, 0, sizeof *s);
    size_t plen = strlen(path);
    ZR_ALLOC_GOTO(s->path, plen + 1, st, fail);
    memcpy(s->path, path, plen + 1);
    ZR_CHECK_GOTO(zr_file_open_read(path, &s->f), st, fail);
    long size = -1;
    if (fseek(s->f, 0, SEEK_END) != 0 || (size = ftell(s->f)) < 0 ||
        fseek(s->f, 0, SEEK_SET) != 0) {
        ZR_FAIL_GOTO(st, fail, ZR_ERR_IO, "%s: cannot find its size", path);
    }
    s->size = (uint64_t)size;
    if (s->size < 8 || fread(len8, 1, 8, s->f) != 8) {
        ZR_FAIL_GOTO(st, fail, ZR_ERR_FORMAT, "%s: %llu bytes, shorter than a safetensors header",
                     path, (unsigned long long)s->size);
    }
    for (int i = 7; i >= 0; i--) {
        hl = hl << 8 | len8[i];
    }
    if (hl > s->size - 8) {
        ZR_FAIL_GOTO(st, fail, ZR_ERR_FORMAT,
                     "%s: header of %llu bytes in a file of %llu: not a safetensors file", path,
                     (unsigned long long)hl, (unsigned long long)s->size);
    }
    s->data0 = 8 + hl;
    ZR_ALLOC_GOTO(text, (size_t)hl + 1, st, fail);
    if (fread(text, 1, (size_t)hl, s->f) != (size_t)hl) {
        ZR_FAIL_GOTO(st, fail, ZR_ERR_IO, "%s: cannot read its header", path);
    }
    hdr = cJSON_ParseWithLength(text, (size_t)hl);
    if (!cJSON_IsObject(hdr)) {
        ZR_FAIL_GOTO(st, fail, ZR_ERR_FORMAT, "%s: the header is not a JSON object", path);
    }
    ZR_CHECK_GOTO(header_read(s, hdr), st, fail);
    zr_free(text);
    cJSON_Delete(hdr);
    return ZR_OK;
fail:
    zr_free(text);
    cJSON_Delete(hdr);
    zr_safetensors_close(s);
    return st;
}

void zr_safetensors_close(zr_safetensors *s)
{
    for (int i = 0; s->tensors != NULL && i < s->count; i++) {
        zr_free(s->tensors[i].name);
    }
    zr_free(s->tensors);
    zr_free(s->path);
    if (s->f != NULL) {
        fclose(s->f);
    }
    memset(s, 0, sizeof *s);
}

const zr_safetensors_tensor *zr_safetensors_find(const zr_safetensors *s, const char *name)
{
    for (int i = 0; i < s->count; i++) {
        if (strcmp(s->tensors[i].name, name) == 0) {
            return &s->tensors[i];
        }
    }
    return NULL;
}

/* IEEE half to float, exactly (subnormals, infinities and NaN included). */
static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu, bits;
    if (e == 0x1f) {
        bits = sign | 0x7f800000u | m << 13;
    } else if (e != 0) {
        bits = sign | (e + 112) << 23 | m << 13;
    } else if (m == 0) {
        bits = sign;
    } else {
        e = 113;
        while ((m & 0x400u) == 0) {
            m <<= 1;
            e--;
        }
        bits = sign | e << 23 | (m & 0x3ffu) << 13;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

zr_status zr_safetensors_read_f32(const zr_safetensors *s, const zr_safetensors_tensor *t,
                                  float *out)
{
    int f32 = strcmp(t->dtype, "F32") == 0, bf16 = strcmp(t->dtype, "BF16") == 0;
    if (!f32 && !bf16 && strcmp(t->dtype, "F16") != 0) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: tensor %s is %s; zr reads F32, BF16 and F16", s->path, t->name,
                t->dtype);
    }
    if (fseek(s->f, (long)(s->data0 + t->begin), SEEK_SET) != 0) {
        ZR_FAIL(ZR_ERR_IO, "%s: tensor %s: cannot seek to its data", s->path, t->name);
    }
    size_t es = f32 ? 4 : 2;
    /* the narrow types are read into the back half of out and widened from the front */
    unsigned char *raw = (unsigned char *)out + (f32 ? 0 : t->numel * 2);
    if (fread(raw, es, t->numel, s->f) != t->numel) {
        ZR_FAIL(ZR_ERR_IO, "%s: tensor %s: short read", s->path, t->name);
    }
    for (size_t i = 0; !f32 && i < t->numel; i++) {
        uint16_t h;
        memcpy(&h, raw + 2 * i, 2);
        uint32_t bits = (uint32_t)h << 16;
        float x;
        memcpy(&x, &bits, sizeof x);
        out[i] = bf16 ? x : half_to_float(h);
    }
    return ZR_OK;
}
