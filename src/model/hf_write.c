/*
 * hf_write.c - safetensors files and Hugging Face folders written (see
 * hf_write.h): the dtypes and their rounding, a file's header and data, and
 * a folder made whole in a temporary folder, then renamed into place.
 */
#define _GNU_SOURCE /* renameat2, RENAME_NOREPLACE */
#include "hf_write.h"

#include "zr/file.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- dtypes and sizes --------------------------------------------------------------- */

static const struct {
    const char *st, *torch, *alias;
    size_t bytes;
} dtypes[] = {
    {"F32", "float32", "f32", 4}, {"BF16", "bfloat16", "bf16", 2}, {"F16", "float16", "f16", 2}};

zr_status zr_hf_dtype_parse(const char *s, zr_hf_dtype *out)
{
    for (int i = 0; i < 3; i++) {
        if (strcmp(s, dtypes[i].alias) == 0 || strcmp(s, dtypes[i].torch) == 0) {
            *out = (zr_hf_dtype)i;
            return ZR_OK;
        }
    }
    ZR_FAIL(ZR_ERR_INVALID, "dtype \"%s\" is not one zr writes (f32, bf16, f16)", s);
}

const char *zr_hf_dtype_torch(zr_hf_dtype d)
{
    return dtypes[d].torch;
}

zr_status zr_hf_size_parse(const char *s, uint64_t *out)
{
    static const struct {
        const char *unit;
        uint64_t mul;
    } units[] = {{"", 1},
                 {"B", 1},
                 {"KB", 1000},
                 {"MB", 1000000},
                 {"GB", 1000000000},
                 {"KiB", 1024},
                 {"MiB", 1024 * 1024},
                 {"GiB", 1u << 30}};
    uint64_t n = 0;
    const char *p = s;
    while (*p >= '0' && *p <= '9' && n <= UINT64_MAX / 10 - 10) {
        n = n * 10 + (uint64_t)(*p++ - '0');
    }
    for (size_t i = 0; p > s && i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(p, units[i].unit) == 0 && n > 0 && n <= UINT64_MAX / units[i].mul) {
            *out = n * units[i].mul;
            return ZR_OK;
        }
    }
    ZR_FAIL(ZR_ERR_INVALID,
            "size \"%s\" is not a positive number of bytes with a unit of B, KB, MB, GB, KiB, MiB "
            "or GiB (\"5GB\", \"200MiB\")",
            s);
}

uint16_t zr_hf_bf16_from_f32(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    /* round to nearest even on the 16 bits dropped; past the range this carries into inf */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

uint16_t zr_hf_f16_from_f32(float x, int *overflow)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    *overflow = a >= 0x477ff000u; /* 65520: rounds to 65536, past F16's 65504 (NaN too) */
    if (*overflow) {
        return (uint16_t)(sign | 0x7c00u);
    }
    if (a >= 0x38800000u) { /* 2^-14: a normal F16 */
        uint32_t h = ((a >> 23) - 112u) << 10 | (a & 0x7fffffu) >> 13, rem = a & 0x1fffu;
        h += rem > 0x1000u || (rem == 0x1000u && (h & 1u));
        return (uint16_t)(sign | h);
    }
    uint32_t e = a >> 23; /* a subnormal F16: units of 2^-24 */
    if (e < 102) {
        return sign; /* below 2^-25: rounds to zero */
    }
    uint32_t m = (a & 0x7fffffu) | 0x800000u, s = 126 - e, h = m >> s;
    uint32_t rem = m & ((1u << s) - 1u), half = 1u << (s - 1);
    h += rem > half || (rem == half && (h & 1u));
    return (uint16_t)(sign | h);
}

/* ---- one safetensors file ------------------------------------------------------------ */

static size_t numel(const zr_hf_tensor *t)
{
    return (size_t)t->rows * (size_t)t->cols;
}

static size_t tensor_bytes(const zr_hf_tensor *t, zr_hf_dtype d)
{
    return numel(t) * dtypes[d].bytes;
}

/* The JSON header; *out from cJSON (cJSON_free). */
static zr_status header(const zr_hf_tensor *t, int n, zr_hf_dtype dtype, char **out)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    int ok = meta != NULL && cJSON_AddStringToObject(meta, "format", "pt") != NULL;
    size_t off = 0;
    for (int i = 0; ok && i < n; i++) {
        cJSON *e = cJSON_AddObjectToObject(root, t[i].name);
        ok = e != NULL && cJSON_AddStringToObject(e, "dtype", dtypes[dtype].st) != NULL;
        int tr = t[i].transpose;
        double shape[2] = {tr ? t[i].cols : t[i].rows, tr ? t[i].rows : t[i].cols};
        size_t end = off + tensor_bytes(&t[i], dtype);
        double offs[2] = {(double)off, (double)end};
        cJSON *sh = cJSON_CreateDoubleArray(shape, t[i].ndim);
        cJSON *of = cJSON_CreateDoubleArray(offs, 2);
        ok = ok && sh != NULL && of != NULL;
        if (ok) {
            cJSON_AddItemToObject(e, "shape", sh);
            cJSON_AddItemToObject(e, "data_offsets", of);
        } else {
            cJSON_Delete(sh);
            cJSON_Delete(of);
        }
        off = end;
    }
    char *s = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (s == NULL) {
        ZR_FAIL(ZR_ERR_NOMEM, "safetensors: cannot build the JSON header");
    }
    *out = s;
    return ZR_OK;
}

/* Elements converted and written at once. */
#define CHUNK ((size_t)1 << 16)

/* Elements [at, at + k) of t as written (transposed or not) into dst. */
static void gather(const zr_hf_tensor *t, size_t at, size_t k, float *dst)
{
    if (!t->transpose) {
        memcpy(dst, t->data + at, k * sizeof *dst);
        return;
    }
    /* written [cols, rows]: element i is data[r][c] with c = i / rows, r = i % rows */
    size_t R = (size_t)t->rows, C = (size_t)t->cols, c = at / R, r = at % R;
    for (size_t i = 0; i < k; i++) {
        dst[i] = t->data[r * C + c];
        if (++r == R) {
            r = 0;
            c++;
        }
    }
}

/* x[0..k) (elements from at of tensor t) into dtype's bytes at out; a value it cannot hold fails.
 */
static zr_status convert(const zr_hf_tensor *t, const char *shown, zr_hf_dtype dtype, size_t at,
                         const float *x, size_t k, uint16_t *out)
{
    for (size_t i = 0; i < k; i++) {
        int over = 0;
        out[i] = dtype == ZR_HF_F16 ? zr_hf_f16_from_f32(x[i], &over) : zr_hf_bf16_from_f32(x[i]);
        over |= dtype == ZR_HF_BF16 && (out[i] & 0x7fffu) == 0x7f80u;
        if (over) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "%s: %s element %zu (%g) is out of %s's range (largest %g): write %s", shown,
                    t->name, at + i, (double)x[i], dtypes[dtype].st,
                    dtype == ZR_HF_F16 ? 65504.0 : 3.3895313892515355e38,
                    dtype == ZR_HF_F16 ? "bf16 or f32" : "f32");
        }
    }
    return ZR_OK;
}

/* Tensor t's data into f in dtype; buf holds CHUNK floats, then CHUNK uint16. */
static zr_status write_data(zr_file_tmp *f, const char *shown, const zr_hf_tensor *t,
                            zr_hf_dtype dtype, float *buf)
{
    size_t n = numel(t), bad = zr_first_nonfinite(t->data, n);
    if (bad < n) {
        ZR_FAIL(ZR_ERR_INVALID,
                "%s would hold a non-finite weight (%g) in %s, element %zu: the weights are "
                "damaged or come from a diverged run",
                shown, (double)t->data[bad], t->name, bad);
    }
    uint16_t *half = (uint16_t *)(buf + CHUNK);
    for (size_t at = 0; at < n; at += CHUNK) {
        size_t k = n - at < CHUNK ? n - at : CHUNK;
        gather(t, at, k, buf);
        if (dtype == ZR_HF_F32) {
            ZR_CHECK(zr_file_tmp_write(f, buf, k * sizeof *buf));
            continue;
        }
        ZR_CHECK(convert(t, shown, dtype, at, buf, k, half));
        ZR_CHECK(zr_file_tmp_write(f, half, k * sizeof *half));
    }
    return ZR_OK;
}

zr_status zr_hf_write_safetensors(const char *path, const char *shown, const zr_hf_tensor *t, int n,
                                  zr_hf_dtype dtype)
{
    shown = shown != NULL ? shown : path;
    zr_status st = ZR_OK;
    char *json = NULL;
    float *buf = NULL;
    zr_file_tmp f;
    ZR_CHECK(header(t, n, dtype, &json));
    size_t jlen = strlen(json), hlen = zr_round_up(jlen, 8); /* the data 8-byte aligned */
    uint64_t hlen64 = hlen;
    ZR_ALLOC_GOTO(buf, CHUNK + CHUNK / 2, st, done);
    ZR_CHECK_GOTO(zr_file_tmp_open(&f, path), st, done);
    /* safetensors is little-endian; so are the machines zr runs on */
    st = zr_file_tmp_write(&f, &hlen64, sizeof hlen64);
    if (st == ZR_OK) {
        st = zr_file_tmp_write(&f, json, jlen);
    }
    if (st == ZR_OK && hlen > jlen) {
        st = zr_file_tmp_write(&f, "        ", hlen - jlen); /* padded with spaces */
    }
    for (int i = 0; st == ZR_OK && i < n; i++) {
        st = write_data(&f, shown, &t[i], dtype, buf);
    }
    st = zr_file_tmp_commit(&f, st);
done:
    cJSON_free(json);
    zr_free(buf);
    return st;
}

/* ---- a folder ------------------------------------------------------------------------ */

/* Removes the temporary folder tmp and what is in it (only zr's files are). */
static void remove_tmp(const char *tmp)
{
    DIR *d = opendir(tmp);
    struct dirent *e;
    char p[ZR_PATH_MAX + 64];
    while (d != NULL && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0 &&
            snprintf(p, sizeof p, "%s/%s", tmp, e->d_name) < (int)sizeof p) {
            unlink(p);
        }
    }
    if (d != NULL) {
        closedir(d);
    }
    rmdir(tmp);
}

static zr_status fsync_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd < 0 || fsync(fd) != 0) {
        int e = errno;
        if (fd >= 0) {
            close(fd);
        }
        ZR_FAIL(ZR_ERR_IO, "cannot fsync the folder %s: %s", path, strerror(e));
    }
    close(fd);
    return ZR_OK;
}

/*
 * dir without its trailing slashes (into name), its parent (made when missing) into parent,
 * and a fresh temporary folder beside it into tmp.
 */
static zr_status make_tmp(const char *dir, char *name, char *parent, char *tmp, size_t nt)
{
    struct stat sb;
    if (lstat(dir, &sb) == 0) {
        ZR_FAIL(ZR_ERR_INVALID,
                "%s already exists: a Hugging Face folder is written new, never over another "
                "(remove it or choose another name)",
                dir);
    }
    snprintf(name, ZR_PATH_MAX, "%s", dir);
    size_t len = strlen(name);
    while (len > 1 && name[len - 1] == '/') {
        name[--len] = '\0';
    }
    snprintf(parent, ZR_PATH_MAX, "%s", name);
    char *slash = strrchr(parent, '/');
    if (slash == NULL) {
        snprintf(parent, ZR_PATH_MAX, ".");
    } else if (slash == parent) {
        parent[1] = '\0';
    } else {
        *slash = '\0';
        ZR_CHECK(zr_file_mkdir_p(parent));
    }
    static unsigned counter;
    for (int i = 0; i < 100; i++) {
        snprintf(tmp, nt, "%s.tmp-%ld-%u", name, (long)getpid(), counter++);
        if (mkdir(tmp, 0755) == 0) {
            return ZR_OK;
        }
        if (errno != EEXIST) {
            ZR_FAIL(ZR_ERR_IO, "cannot make the folder %s: %s", tmp, strerror(errno));
        }
    }
    ZR_FAIL(ZR_ERR_IO, "cannot make a temporary folder beside %s", dir);
}

/* tmp renamed onto dir, never over something that appeared there meanwhile. */
static zr_status place(const char *tmp, const char *dir, const char *parent)
{
    ZR_CHECK(fsync_dir(tmp));
    int rc = -1;
#ifdef RENAME_NOREPLACE
    rc = renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_NOREPLACE);
    if (rc != 0 && errno != EINVAL && errno != ENOSYS) {
        ZR_FAIL(ZR_ERR_IO, "cannot rename %s to %s: %s", tmp, dir, strerror(errno));
    }
#endif
    if (rc != 0) { /* a file system without RENAME_NOREPLACE: checked, then renamed */
        struct stat sb;
        if (lstat(dir, &sb) == 0) {
            ZR_FAIL(ZR_ERR_INVALID, "%s appeared while it was written: not replaced", dir);
        }
        if (rename(tmp, dir) != 0) {
            ZR_FAIL(ZR_ERR_IO, "cannot rename %s to %s: %s", tmp, dir, strerror(errno));
        }
    }
    return fsync_dir(parent);
}

/* out = dir/name, or a message when it is too long. */
static zr_status join(char *out, size_t n, const char *dir, const char *name)
{
    if (snprintf(out, n, "%s/%s", dir, name) >= (int)n) {
        ZR_FAIL(ZR_ERR_INVALID, "%.200s.../%s: the path is too long", dir, name);
    }
    return ZR_OK;
}

/* model.safetensors.index.json for the shards (shard[i]: tensor i's file, from 1). */
static zr_status write_index(const char *tmp, const zr_hf_tensor *t, int n, const int *shard,
                             int shards, zr_hf_dtype dtype)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "metadata");
    cJSON *map = cJSON_AddObjectToObject(root, "weight_map");
    double total = 0;
    for (int i = 0; i < n; i++) {
        total += (double)tensor_bytes(&t[i], dtype);
    }
    int ok = meta != NULL && map != NULL && cJSON_AddNumberToObject(meta, "total_size", total);
    for (int i = 0; ok && i < n; i++) {
        char file[64];
        snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", shard[i], shards);
        ok = cJSON_AddStringToObject(map, t[i].name, file) != NULL;
    }
    char *s = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (s == NULL) {
        ZR_FAIL(ZR_ERR_NOMEM, "cannot build model.safetensors.index.json");
    }
    char path[ZR_PATH_MAX + 64];
    zr_status st = join(path, sizeof path, tmp, "model.safetensors.index.json");
    st = st == ZR_OK ? zr_file_write_atomic(path, s, strlen(s)) : st;
    cJSON_free(s);
    return st;
}

/* The tensors into tmp: one file, or shards of at most o->max_shard_bytes (and the index). */
static zr_status write_shards(const char *tmp, const char *dir, const zr_hf_tensor *t, int n,
                              const zr_hf_write_opts *o, int *shard)
{
    int shards = n > 0 ? 1 : 0;
    uint64_t used = 0;
    for (int i = 0; i < n; i++) {
        uint64_t b = tensor_bytes(&t[i], o->dtype);
        if (o->max_shard_bytes > 0 && used > 0 && used + b > o->max_shard_bytes) {
            shards++;
            used = 0;
        }
        used += b;
        shard[i] = shards;
    }
    char path[ZR_PATH_MAX + 64], shown[ZR_PATH_MAX + 64], file[64];
    if (shards <= 1) {
        ZR_CHECK(join(path, sizeof path, tmp, "model.safetensors"));
        ZR_CHECK(join(shown, sizeof shown, dir, "model.safetensors"));
        return zr_hf_write_safetensors(path, shown, t, n, o->dtype);
    }
    for (int s = 1, first = 0; s <= shards; s++) {
        int end = first;
        while (end < n && shard[end] == s) {
            end++;
        }
        snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s, shards);
        ZR_CHECK(join(path, sizeof path, tmp, file));
        ZR_CHECK(join(shown, sizeof shown, dir, file));
        ZR_CHECK(zr_hf_write_safetensors(path, shown, t + first, end - first, o->dtype));
        first = end;
    }
    return write_index(tmp, t, n, shard, shards, o->dtype);
}

zr_status zr_hf_write_folder(const char *dir, const char *config_json, const zr_hf_tensor *t, int n,
                             const zr_hf_write_opts *o)
{
    char name[ZR_PATH_MAX], parent[ZR_PATH_MAX], tmp[ZR_PATH_MAX + 48], path[ZR_PATH_MAX + 64];
    if (strlen(dir) >= ZR_PATH_MAX - 16) {
        ZR_FAIL(ZR_ERR_INVALID, "%.200s...: the folder's name is too long", dir);
    }
    int *shard;
    ZR_ALLOC(shard, (size_t)n + 1);
    zr_status st = make_tmp(dir, name, parent, tmp, sizeof tmp);
    if (st != ZR_OK) {
        zr_free(shard);
        return st;
    }
    st = join(path, sizeof path, tmp, "config.json");
    st = st == ZR_OK ? zr_file_write_atomic(path, config_json, strlen(config_json)) : st;
    if (st == ZR_OK) {
        st = write_shards(tmp, name, t, n, o, shard);
    }
    if (st == ZR_OK) {
        st = place(tmp, name, parent);
    }
    if (st != ZR_OK) {
        remove_tmp(tmp); /* nothing at dir, nothing beside it */
    }
    zr_free(shard);
    return st;
}
