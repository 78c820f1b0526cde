/*
 * safetensors.c - the safetensors reader (safetensors.h): the header parsed
 * with cJSON and checked against the file before any tensor is read; a
 * folder's shards found through model.safetensors.index.json.
 */
#define _POSIX_C_SOURCE 200809L

#include "safetensors.h"

#include "zr/file.h"

#include <cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
        if (!json_u64(cJSON_GetArrayItem(sh, i), &v)) {
            ZR_FAIL(ZR_ERR_FORMAT, "%s: tensor %s: shape[%d] is not a size", s->path, t->name, i);
        }
        if (v != 0 && numel > UINT64_MAX / v / es) {
            ZR_FAIL(ZR_ERR_FORMAT, "%s: tensor %s: shape[%d]: the shape's bytes pass 2^64", s->path,
                    t->name, i);
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

/*
 * No two tensors share a byte and no byte of the data is in none (empty
 * tensors aside): the format allows no hole, so that a file cannot carry
 * bytes nothing describes.
 */
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
        const zr_safetensors_tensor *t = order[i];
        if (t->begin == t->end) {
            continue;
        }
        if (prev != NULL && t->begin < prev->end) {
            ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT,
                         "%s: tensors %s [%llu, %llu] and %s [%llu, %llu] overlap", s->path,
                         prev->name, (unsigned long long)prev->begin, (unsigned long long)prev->end,
                         t->name, (unsigned long long)t->begin, (unsigned long long)t->end);
        }
        if (t->begin != (prev != NULL ? prev->end : 0)) {
            ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT,
                         "%s: bytes [%llu, %llu) of the data, before tensor %s, belong to no "
                         "tensor (the format allows no hole)",
                         s->path, (unsigned long long)(prev != NULL ? prev->end : 0),
                         (unsigned long long)t->begin, t->name);
        }
        prev = t;
    }
    if ((prev != NULL ? prev->end : 0) != s->size - s->data0) {
        ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT,
                     "%s: bytes [%llu, %llu) of the data, after the last tensor%s%s, belong to "
                     "no tensor (the format allows no hole)",
                     s->path, (unsigned long long)(prev != NULL ? prev->end : 0),
                     (unsigned long long)(s->size - s->data0), prev != NULL ? " " : "",
                     prev != NULL ? prev->name : "");
    }
done:
    zr_free(order);
    return st;
}

static int by_name(const void *a, const void *b)
{
    const zr_safetensors_tensor *x = *(const zr_safetensors_tensor *const *)a;
    const zr_safetensors_tensor *y = *(const zr_safetensors_tensor *const *)b;
    return strcmp(x->name, y->name);
}

/* No name twice (JSON allows a key twice; the format does not). */
static zr_status check_names(const zr_safetensors *s)
{
    zr_status st = ZR_OK;
    const zr_safetensors_tensor **order = NULL;
    ZR_ALLOC_GOTO(order, (size_t)s->count + 1, st, done);
    for (int i = 0; i < s->count; i++) {
        order[i] = &s->tensors[i];
    }
    qsort(order, (size_t)s->count, sizeof *order, by_name);
    for (int i = 1; i < s->count; i++) {
        if (strcmp(order[i - 1]->name, order[i]->name) == 0) {
            ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT, "%s: tensor %s is in the header twice", s->path,
                         order[i]->name);
        }
    }
done:
    zr_free(order);
    return st;
}

/* __metadata__, when there, is an object of strings (the format's map of strings). */
static zr_status check_metadata(const zr_safetensors *s, const cJSON *meta)
{
    const cJSON *e = NULL;
    if (!cJSON_IsObject(meta)) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: __metadata__ is not an object", s->path);
    }
    cJSON_ArrayForEach(e, meta)
    {
        if (!cJSON_IsString(e)) {
            ZR_FAIL(ZR_ERR_FORMAT, "%s: __metadata__ key \"%s\" is not a string", s->path,
                    e->string);
        }
    }
    return ZR_OK;
}

/* The header's entries (all but __metadata__) into s->tensors. */
static zr_status header_read(zr_safetensors *s, const cJSON *hdr)
{
    const cJSON *e = NULL;
    int n = 0;
    cJSON_ArrayForEach(e, hdr)
    {
        if (strcmp(e->string, "__metadata__") == 0) {
            ZR_CHECK(check_metadata(s, e));
        } else if (n == INT32_MAX) {
            ZR_FAIL(ZR_ERR_FORMAT, "%s: more than %d tensors", s->path, INT32_MAX);
        } else {
            n++;
        }
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
    ZR_CHECK(check_names(s));
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
    if (hl > s->size - 8 || hl > ZR_SAFETENSORS_MAX_HEADER) {
        ZR_FAIL_GOTO(st, fail, ZR_ERR_FORMAT,
                     "%s: header of %llu bytes in a file of %llu (at most %u): not a safetensors "
                     "file",
                     path, (unsigned long long)hl, (unsigned long long)s->size,
                     ZR_SAFETENSORS_MAX_HEADER);
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

void zr_safetensors_shape_text(char *out, size_t n, const int64_t *shape, int ndim)
{
    int k = snprintf(out, n, "[");
    for (int i = 0; i < ndim && (size_t)k + 24 < n; i++) {
        k += snprintf(out + k, n - (size_t)k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    }
    snprintf(out + k, n - (size_t)k, "]");
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

/* n bytes at file offset at into buf; a short read (a file cut since its open) names t. */
static zr_status pread_all(const zr_safetensors *s, const zr_safetensors_tensor *t, uint64_t at,
                           unsigned char *buf, size_t n)
{
    int fd = fileno(s->f);
    while (n > 0) {
        size_t want = n < ((size_t)1 << 30) ? n : (size_t)1 << 30;
        ssize_t got = pread(fd, buf, want, (off_t)at);
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got <= 0) {
            ZR_FAIL(ZR_ERR_IO, "%s: tensor %s: short read%s%s", s->path, t->name,
                    got < 0 ? ": " : " (the file is shorter than when opened)",
                    got < 0 ? strerror(errno) : "");
        }
        buf += got, at += (uint64_t)got, n -= (size_t)got;
    }
    return ZR_OK;
}

zr_status zr_safetensors_read_f32_range(const zr_safetensors *s, const zr_safetensors_tensor *t,
                                        size_t first, size_t count, float *out)
{
    int f32 = strcmp(t->dtype, "F32") == 0, bf16 = strcmp(t->dtype, "BF16") == 0;
    if (!f32 && !bf16 && strcmp(t->dtype, "F16") != 0) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: tensor %s is %s; zr reads F32, BF16 and F16", s->path, t->name,
                t->dtype);
    }
    if (first > t->numel || count > t->numel - first) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: tensor %s: elements [%zu, %zu + %zu) of its %zu", s->path,
                t->name, first, first, count, t->numel);
    }
    size_t es = f32 ? 4 : 2;
    /* the narrow types are read into the back half of out and widened from the front */
    unsigned char *raw = (unsigned char *)out + (f32 ? 0 : count * 2);
    ZR_CHECK(pread_all(s, t, s->data0 + t->begin + first * es, raw, count * es));
    for (size_t i = 0; !f32 && i < count; i++) {
        uint16_t h;
        memcpy(&h, raw + 2 * i, 2);
        uint32_t bits = (uint32_t)h << 16;
        float x;
        memcpy(&x, &bits, sizeof x);
        out[i] = bf16 ? x : half_to_float(h);
    }
    return ZR_OK;
}

zr_status zr_safetensors_read_f32(const zr_safetensors *s, const zr_safetensors_tensor *t,
                                  float *out)
{
    return zr_safetensors_read_f32_range(s, t, 0, t->numel, out);
}

/* ---- a folder's weights: one file or shards with an index ------------------------------ */

static int entry_by_name(const void *a, const void *b)
{
    return strcmp(((const zr_hf_weights_entry *)a)->name, ((const zr_hf_weights_entry *)b)->name);
}

/* dir/name into a new string *out. */
static zr_status join(const char *dir, const char *name, char **out)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    ZR_ALLOC(*out, n);
    snprintf(*out, n, "%s/%s", dir, name);
    return ZR_OK;
}

/* Every file's tensors into w->entries, sorted; a name in two files is refused. */
static zr_status entries_build(zr_hf_weights *w)
{
    size_t n = 0;
    for (int f = 0; f < w->nfiles; f++) {
        n += (size_t)w->files[f].count;
    }
    if (n > INT32_MAX) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: more than %d tensors", w->index, INT32_MAX);
    }
    /* (only an index lists several files: a single file's names were checked at its open) */
    ZR_ALLOC(w->entries, n + 1);
    for (int f = 0; f < w->nfiles; f++) {
        for (int i = 0; i < w->files[f].count; i++) {
            w->entries[w->count++] =
                (zr_hf_weights_entry){.name = w->files[f].tensors[i].name, .file = f, .tensor = i};
        }
    }
    qsort(w->entries, n, sizeof *w->entries, entry_by_name);
    for (int i = 1; i < w->count; i++) {
        const zr_hf_weights_entry *a = &w->entries[i - 1], *b = &w->entries[i];
        if (strcmp(a->name, b->name) == 0) {
            ZR_FAIL(ZR_ERR_FORMAT, "%s: tensor %s is in both %s and %s", w->index, b->name,
                    w->files[a->file].path, w->files[b->file].path);
        }
    }
    return ZR_OK;
}

/* The shard a weight_map value names, opened once (index into w->files). */
static zr_status shard_open(zr_hf_weights *w, const char *dir, const cJSON *e, int *file)
{
    const char *name = cJSON_IsString(e) ? e->valuestring : NULL;
    if (name == NULL || name[0] == '\0' || strchr(name, '/') != NULL ||
        strchr(name, '\\') != NULL || strstr(name, "..") != NULL) {
        ZR_FAIL(ZR_ERR_FORMAT,
                "%s: weight_map[\"%s\"] is not the name of a file in the folder (a plain name, "
                "no '/' or '..')",
                w->index, e->string);
    }
    for (*file = 0; *file < w->nfiles; (*file)++) {
        const char *p = w->files[*file].path;
        size_t pl = strlen(p), nl = strlen(name);
        if (pl > nl && p[pl - nl - 1] == '/' && strcmp(p + pl - nl, name) == 0) {
            return ZR_OK;
        }
    }
    zr_status st = ZR_OK;
    char *path = NULL;
    struct stat sb;
    ZR_CHECK_GOTO(join(dir, name, &path), st, done);
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT, "%s: weight_map[\"%s\"]: file %s is missing",
                     w->index, e->string, name);
    }
    ZR_CHECK_GOTO(zr_safetensors_open(&w->files[w->nfiles], path), st, done);
    w->nfiles++;
done:
    zr_free(path);
    return st;
}

/* Each weight_map entry found once, in its file; every tensor of the files listed. */
static zr_status index_agree(zr_hf_weights *w, const cJSON *map, const int *file_of)
{
    zr_status st = ZR_OK;
    unsigned char *listed = NULL;
    const cJSON *e = NULL;
    int k = 0;
    ZR_ALLOC_GOTO(listed, (size_t)w->count + 1, st, done);
    cJSON_ArrayForEach(e, map)
    {
        zr_hf_weights_entry key = {.name = e->string};
        const zr_hf_weights_entry *x =
            bsearch(&key, w->entries, (size_t)w->count, sizeof key, entry_by_name);
        const char *want = w->files[file_of[k++]].path;
        if (x == NULL || x->file != file_of[k - 1]) {
            ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT,
                         "%s: weight_map[\"%s\"]: the tensor is not in %s%s%s", w->index, e->string,
                         want, x != NULL ? " but in " : "",
                         x != NULL ? w->files[x->file].path : "");
        }
        if (listed[x - w->entries]++) {
            ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT, "%s: weight_map lists \"%s\" twice", w->index,
                         e->string);
        }
    }
    for (int i = 0; i < w->count; i++) {
        if (!listed[i]) {
            ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT, "%s: tensor %s of %s is not in weight_map",
                         w->index, w->entries[i].name, w->files[w->entries[i].file].path);
        }
    }
done:
    zr_free(listed);
    return st;
}

/* The sharded form: the index read, its files opened, the two checked against each other. */
static zr_status index_open(zr_hf_weights *w, const char *dir)
{
    zr_status st = ZR_OK;
    char *text = NULL;
    size_t n = 0;
    cJSON *root = NULL;
    int *file_of = NULL;
    struct stat sb;
    if (stat(w->index, &sb) == 0 && (uint64_t)sb.st_size > ZR_SAFETENSORS_MAX_HEADER) {
        ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT, "%s: %lld bytes, more than the %u an index may have",
                     w->index, (long long)sb.st_size, ZR_SAFETENSORS_MAX_HEADER);
    }
    ZR_CHECK_GOTO(zr_file_read_all(w->index, &text, &n), st, done);
    root = cJSON_ParseWithLength(text, n);
    if (!cJSON_IsObject(root)) {
        ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT, "%s: not a JSON object", w->index);
    }
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
        ZR_FAIL_GOTO(st, done, ZR_ERR_FORMAT, "%s: key \"weight_map\" is %s", w->index,
                     map == NULL ? "missing" : "not an object");
    }
    int count = cJSON_GetArraySize(map), k = 0;
    ZR_ALLOC_GOTO(w->files, (size_t)count + 1, st, done);
    ZR_ALLOC_GOTO(file_of, (size_t)count + 1, st, done);
    const cJSON *e = NULL;
    cJSON_ArrayForEach(e, map)
    {
        ZR_CHECK_GOTO(shard_open(w, dir, e, &file_of[k++]), st, done);
    }
    ZR_CHECK_GOTO(entries_build(w), st, done);
    ZR_CHECK_GOTO(index_agree(w, map, file_of), st, done);
done:
    zr_free(file_of);
    cJSON_Delete(root);
    zr_free(text);
    return st;
}

zr_status zr_hf_weights_open(zr_hf_weights *w, const char *dir)
{
    zr_status st = ZR_OK;
    char *single = NULL;
    struct stat sb;
    memset(w, 0, sizeof *w);
    ZR_CHECK_GOTO(join(dir, "model.safetensors", &single), st, fail);
    if (stat(single, &sb) == 0) {
        ZR_ALLOC_GOTO(w->files, 1, st, fail);
        ZR_CHECK_GOTO(zr_safetensors_open(&w->files[0], single), st, fail);
        w->nfiles = 1;
        ZR_CHECK_GOTO(entries_build(w), st, fail);
    } else {
        ZR_CHECK_GOTO(join(dir, "model.safetensors.index.json", &w->index), st, fail);
        if (stat(w->index, &sb) != 0) {
            ZR_FAIL_GOTO(st, fail, ZR_ERR_IO,
                         "%s: neither model.safetensors nor model.safetensors.index.json is "
                         "there",
                         dir);
        }
        ZR_CHECK_GOTO(index_open(w, dir), st, fail);
    }
    zr_free(single);
    return ZR_OK;
fail:
    zr_free(single);
    zr_hf_weights_close(w);
    return st;
}

void zr_hf_weights_close(zr_hf_weights *w)
{
    for (int f = 0; w->files != NULL && f < w->nfiles; f++) {
        zr_safetensors_close(&w->files[f]);
    }
    zr_free(w->files);
    zr_free(w->entries);
    zr_free(w->index);
    memset(w, 0, sizeof *w);
}

const zr_safetensors_tensor *zr_hf_weights_find(const zr_hf_weights *w, const char *name,
                                                const zr_safetensors **file)
{
    zr_hf_weights_entry key = {.name = name};
    const zr_hf_weights_entry *x =
        w->count > 0 ? bsearch(&key, w->entries, (size_t)w->count, sizeof key, entry_by_name)
                     : NULL;
    return x != NULL ? zr_hf_weights_tensor(w, (int)(x - w->entries), file) : NULL;
}

int zr_hf_weights_count(const zr_hf_weights *w)
{
    return w->count;
}

const zr_safetensors_tensor *zr_hf_weights_tensor(const zr_hf_weights *w, int i,
                                                  const zr_safetensors **file)
{
    const zr_hf_weights_entry *x = &w->entries[i];
    if (file != NULL) {
        *file = &w->files[x->file];
    }
    return &w->files[x->file].tensors[x->tensor];
}
