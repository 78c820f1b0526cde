/*
 * checkpoint.c - sharded checkpoints: crash-safe writes, checksums on every
 * file, and loading at a different world size (see zr/checkpoint.h).
 *
 * Every rank file holds the same canonical slice of each unit whatever the
 * ZeRO stage, so resharding is a range intersection: new rank r' needs
 * [r'*S', (r'+1)*S') of the unit and old rank q holds [q*S, (q+1)*S).
 */
#define _POSIX_C_SOURCE 200809L

#include "zr/checkpoint.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define RANK_MAGIC "ZRCKRANK"
#define HEADER_BYTES 64

typedef struct rank_header {
    char magic[8];
    uint32_t version;
    uint32_t rank;
    uint32_t world;
    uint32_t nunits;
    int64_t step;
    unsigned char pad[HEADER_BYTES - 8 - 4 * 4 - 8];
} rank_header;

_Static_assert(sizeof(rank_header) == HEADER_BYTES, "rank file header is part of the format");

/* Format a path; a path that does not fit is an error, never a silent truncation. */
static zr_status pathf(char *out, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static zr_status pathf(char *out, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap) {
        ZR_FAIL(ZR_ERR_INVALID, "path too long (%d bytes): %.200s...", n, out);
    }
    return ZR_OK;
}

/* ---- small file helpers ----------------------------------------------------- */

static zr_status fsync_path(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        ZR_FAIL(ZR_ERR_IO, "cannot open %s to sync it: %s", path, strerror(errno));
    }
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    if (rc != 0) {
        ZR_FAIL(ZR_ERR_IO, "fsync of %s failed: %s", path, strerror(err));
    }
    return ZR_OK;
}

static zr_status write_all(FILE *f, const void *p, size_t n, const char *path, uint32_t *crc)
{
    if (n > 0 && fwrite(p, 1, n, f) != n) {
        ZR_FAIL(ZR_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    }
    if (crc != NULL) {
        *crc = zr_crc32c(*crc, p, n);
    }
    return ZR_OK;
}

/* Open "<path>.tmp" for writing; its name goes to tmp. */
static zr_status open_tmp(const char *path, char *tmp, size_t cap, FILE **f)
{
    ZR_CHECK(pathf(tmp, cap, "%s.tmp", path));
    *f = fopen(tmp, "wb");
    if (*f == NULL) {
        ZR_FAIL(ZR_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    }
    return ZR_OK;
}

/*
 * Finish a file opened by open_tmp: flush, fsync, close and rename it to path
 * when st (the status of the writes) is ZR_OK; otherwise, or on any failure
 * here, remove the temporary file. Returns the first failure.
 */
static zr_status commit_tmp(FILE *f, const char *tmp, const char *path, zr_status st)
{
    if (st == ZR_OK && (fflush(f) != 0 || fsync(fileno(f)) != 0)) {
        st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__, "cannot flush %s: %s", tmp,
                         strerror(errno));
    }
    if (fclose(f) != 0 && st == ZR_OK) {
        st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__, "cannot close %s: %s", tmp,
                         strerror(errno));
    }
    if (st == ZR_OK && rename(tmp, path) != 0) {
        st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__, "cannot rename %s to %s: %s", tmp, path,
                         strerror(errno));
    }
    if (st != ZR_OK) {
        unlink(tmp);
    }
    return st;
}

/* Write bytes to path through "<path>.tmp", fsync, rename. */
static zr_status write_file_atomic(const char *path, const void *data, size_t n)
{
    char tmp[4096];
    FILE *f;
    ZR_CHECK(open_tmp(path, tmp, sizeof tmp, &f));
    return commit_tmp(f, tmp, path, write_all(f, data, n, tmp, NULL));
}

static zr_status read_file(const char *path, char **out, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        ZR_FAIL(ZR_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    }
    zr_status st = ZR_OK;
    char *buf = NULL;
    long len = -1;
    if (fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__, "cannot size %s: %s", path,
                         strerror(errno));
    } else if ((buf = malloc((size_t)len + 1)) == NULL) {
        st = zr_error_at(ZR_ERR_NOMEM, __FILE__, __LINE__, "out of memory reading %s", path);
    } else if ((size_t)len > 0 && fread(buf, 1, (size_t)len, f) != (size_t)len) {
        st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__, "cannot read %s", path);
    }
    fclose(f);
    if (st != ZR_OK) {
        free(buf);
        return st;
    }
    buf[len] = '\0';
    *out = buf;
    *n = (size_t)len;
    return ZR_OK;
}

static int exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Remove a checkpoint directory and the files in it (one level deep). */
static void remove_dir(const char *path)
{
    DIR *d = opendir(path);
    if (d == NULL) {
        return;
    }
    struct dirent *ent;
    char p[4096];
    while ((ent = readdir(d)) != NULL) {
        if (strcmp(ent->d_name, ".") == 0 || strcmp(ent->d_name, "..") == 0) {
            continue;
        }
        if (pathf(p, sizeof p, "%s/%s", path, ent->d_name) == ZR_OK) {
            unlink(p);
        }
    }
    closedir(d);
    rmdir(path);
}

static zr_status mkdir_p(const char *path)
{
    char buf[4096];
    ZR_CHECK(pathf(buf, sizeof buf, "%s", path));
    for (char *p = buf + 1; *p != '\0'; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
                ZR_FAIL(ZR_ERR_IO, "cannot create directory %s: %s", buf, strerror(errno));
            }
            *p = '/';
        }
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
        ZR_FAIL(ZR_ERR_IO, "cannot create directory %s: %s", buf, strerror(errno));
    }
    return ZR_OK;
}

/* ---- layout ------------------------------------------------------------------- */

typedef struct unit_layout {
    size_t numel, padded, shard;
} unit_layout;

static size_t padded_of(size_t numel, int world)
{
    return zr_round_up(numel == 0 ? 1 : numel, (size_t)world * ZR_ZERO_PAD);
}

/* Byte offset in a rank file of element i of array which (0 master, 1 m, 2 v) of unit u. */
static size_t file_offset(const unit_layout *lay, int u, int which, size_t i)
{
    size_t off = 0;
    for (int k = 0; k < u; k++) {
        off += 3 * lay[k].shard;
    }
    return HEADER_BYTES + (off + (size_t)which * lay[u].shard + i) * sizeof(float);
}

static size_t file_bytes(const unit_layout *lay, int nunits)
{
    return file_offset(lay, nunits, 0, 0) + sizeof(uint32_t);
}

/* ---- save ----------------------------------------------------------------------- */

static zr_status write_rank_file(zr_engine *e, const char *dir, int rank, int64_t step,
                                 uint32_t *crc_out, uint64_t *bytes_out)
{
    char path[4096], tmp[4200];
    ZR_CHECK(pathf(path, sizeof path, "%s/rank_%05d.bin", dir, rank));
    FILE *f;
    ZR_CHECK(open_tmp(path, tmp, sizeof tmp, &f));
    rank_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, RANK_MAGIC, 8);
    h.version = ZR_CKPT_VERSION;
    h.rank = (uint32_t)rank;
    h.world = (uint32_t)e->comm->size[ZR_GROUP_WORLD];
    h.nunits = (uint32_t)e->nunits;
    h.step = step;
    uint32_t crc = 0;
    uint64_t bytes = sizeof h;
    zr_status st = write_all(f, &h, sizeof h, tmp, &crc);
    for (int u = 0; u < e->nunits && st == ZR_OK; u++) {
        float *arr[3];
        st = zr_engine_optim_shard(e, u, &arr[0], &arr[1], &arr[2]);
        size_t n = zr_engine_shard(e, u) * sizeof(float);
        for (int k = 0; k < 3 && st == ZR_OK; k++) {
            st = write_all(f, arr[k], n, tmp, &crc);
            bytes += n;
        }
    }
    if (st == ZR_OK) {
        st = write_all(f, &crc, sizeof crc, tmp, NULL);
        bytes += sizeof crc;
    }
    ZR_CHECK(commit_tmp(f, tmp, path, st));
    *crc_out = crc;
    *bytes_out = bytes;
    return ZR_OK;
}

static cJSON *model_json(const zr_gpt_config *m)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "max_t", m->max_t);
    cJSON_AddNumberToObject(o, "vocab", m->vocab);
    cJSON_AddNumberToObject(o, "padded_vocab", m->padded_vocab);
    cJSON_AddNumberToObject(o, "layers", m->layers);
    cJSON_AddNumberToObject(o, "heads", m->heads);
    cJSON_AddNumberToObject(o, "channels", m->channels);
    return o;
}

static char *manifest_text(zr_engine *e, const zr_ckpt_meta *meta, const char *config_json,
                           const uint32_t *crcs, const uint64_t *bytes)
{
    int W = e->comm->size[ZR_GROUP_WORLD];
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", "zr-checkpoint");
    cJSON_AddNumberToObject(root, "version", ZR_CKPT_VERSION);
    cJSON_AddNumberToObject(root, "step", (double)meta->step);
    cJSON_AddNumberToObject(root, "optim_steps", (double)meta->optim_steps);
    cJSON_AddNumberToObject(root, "data_position", (double)meta->data_position);
    cJSON_AddNumberToObject(root, "tokens", (double)meta->tokens);
    char seed[32];
    snprintf(seed, sizeof seed, "%" PRIu64, meta->seed);
    cJSON_AddStringToObject(root, "seed", seed);
    cJSON_AddNumberToObject(root, "world_size", W);
    cJSON *plan = cJSON_AddObjectToObject(root, "plan");
    cJSON_AddNumberToObject(plan, "stage", e->plan.stage);
    cJSON_AddStringToObject(plan, "params", e->plan.params == ZR_SHARDED ? "sharded" : "replicated");
    cJSON_AddStringToObject(plan, "grads", e->plan.grads == ZR_SHARDED ? "sharded" : "replicated");
    cJSON_AddStringToObject(plan, "optimizer", e->plan.optim == ZR_SHARDED ? "sharded" : "replicated");
    cJSON_AddBoolToObject(plan, "hpz_secondary", e->plan.secondary);
    cJSON_AddStringToObject(plan, "file_slices",
                            "rank r holds [r*shard, (r+1)*shard) of each padded unit at every stage");
    cJSON_AddItemToObject(root, "model", model_json(&meta->model));
    cJSON *units = cJSON_AddArrayToObject(root, "units");
    for (int u = 0; u < e->nunits; u++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "numel", (double)zr_engine_numel(e, u));
        cJSON_AddItemToArray(units, o);
    }
    cJSON *files = cJSON_AddArrayToObject(root, "files");
    for (int r = 0; r < W; r++) {
        cJSON *o = cJSON_CreateObject();
        char name[64];
        snprintf(name, sizeof name, "rank_%05d.bin", r);
        cJSON_AddStringToObject(o, "name", name);
        cJSON_AddNumberToObject(o, "bytes", (double)bytes[r]);
        cJSON_AddNumberToObject(o, "crc32c", (double)crcs[r]);
        cJSON_AddItemToArray(files, o);
    }
    if (config_json != NULL) {
        cJSON *cfg = cJSON_Parse(config_json);
        if (cfg != NULL) {
            cJSON_AddItemToObject(root, "config", cfg);
        }
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    return text;
}

/* Complete checkpoints under dir, sorted by step (ascending). */
static zr_status list_complete(const char *dir, int64_t **steps, int *n)
{
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (d == NULL) {
        if (errno == ENOENT) {
            return ZR_OK;
        }
        ZR_FAIL(ZR_ERR_IO, "cannot read checkpoint directory %s: %s", dir, strerror(errno));
    }
    int cap = 0;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        long long s;
        char tail;
        if (sscanf(ent->d_name, "step_%lld%c", &s, &tail) != 1) {
            continue; /* also skips "step_N.partial" */
        }
        char marker[4096];
        if (pathf(marker, sizeof marker, "%s/%s/COMPLETE", dir, ent->d_name) != ZR_OK ||
            !exists(marker)) {
            continue;
        }
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *grown = realloc(*steps, sizeof(int64_t) * (size_t)cap);
            if (grown == NULL) {
                closedir(d);
                free(*steps);
                *steps = NULL;
                ZR_FAIL(ZR_ERR_NOMEM, "out of memory listing %s", dir);
            }
            *steps = grown;
        }
        (*steps)[(*n)++] = s;
    }
    closedir(d);
    for (int i = 1; i < *n; i++) { /* few entries: insertion sort */
        int64_t v = (*steps)[i];
        int j = i - 1;
        while (j >= 0 && (*steps)[j] > v) {
            (*steps)[j + 1] = (*steps)[j];
            j--;
        }
        (*steps)[j + 1] = v;
    }
    return ZR_OK;
}

/* Rank 0's part of a save, after every rank file is in place. */
static zr_status commit(zr_engine *e, const char *partial, const char *final, const char *dir,
                        const zr_ckpt_meta *meta, const char *config_json, const uint32_t *crcs,
                        const uint64_t *bytes, int keep)
{
    char *text = manifest_text(e, meta, config_json, crcs, bytes);
    if (text == NULL) {
        ZR_FAIL(ZR_ERR_NOMEM, "out of memory writing the checkpoint manifest");
    }
    char path[4096];
    ZR_CHECK(pathf(path, sizeof path, "%s/manifest.json", partial));
    zr_status st = write_file_atomic(path, text, strlen(text));
    uint32_t mcrc = zr_crc32c(0, text, strlen(text));
    cJSON_free(text);
    ZR_CHECK(st);
    ZR_CHECK(fsync_path(partial));
    if (rename(partial, final) != 0) {
        ZR_FAIL(ZR_ERR_IO, "cannot rename %s to %s: %s", partial, final, strerror(errno));
    }
    char marker[4096], body[64];
    ZR_CHECK(pathf(marker, sizeof marker, "%s/COMPLETE", final));
    int len = snprintf(body, sizeof body, "complete manifest-crc32c %u\n", mcrc);
    ZR_CHECK(write_file_atomic(marker, body, (size_t)len));
    ZR_CHECK(fsync_path(final));
    ZR_CHECK(fsync_path(dir));
    if (keep > 0) {
        int64_t *steps;
        int n;
        ZR_CHECK(list_complete(dir, &steps, &n));
        for (int i = 0; i + keep < n; i++) {
            char old[4096];
            if (pathf(old, sizeof old, "%s/step_%08lld", dir, (long long)steps[i]) == ZR_OK &&
                steps[i] != meta->step) {
                remove_dir(old);
            }
        }
        free(steps);
    }
    return ZR_OK;
}

zr_status zr_ckpt_save(zr_comm *c, zr_engine *e, const char *dir, const zr_ckpt_meta *meta,
                       const char *config_json, int keep, char *path_out, size_t path_len)
{
    int R = c->rank[ZR_GROUP_WORLD], W = c->size[ZR_GROUP_WORLD];
    char final[4096], partial[4200];
    ZR_CHECK(pathf(final, sizeof final, "%s/step_%08lld", dir, (long long)meta->step));
    ZR_CHECK(pathf(partial, sizeof partial, "%s.partial", final));

    /* rank 0 prepares the directory; a leftover .partial from a crash is garbage */
    zr_status st = ZR_OK;
    if (R == 0) {
        st = mkdir_p(dir);
        if (st == ZR_OK && exists(final)) {
            st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__,
                             "checkpoint %s already exists; refusing to overwrite it", final);
        }
        if (st == ZR_OK) {
            remove_dir(partial);
            if (mkdir(partial, 0755) != 0) {
                st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__, "cannot create %s: %s", partial,
                                 strerror(errno));
            }
        }
    }
    ZR_CHECK(zr_comm_agree(c, st));

    uint32_t crc = 0;
    uint64_t bytes = 0;
    st = write_rank_file(e, partial, R, meta->step, &crc, &bytes);
    st = zr_comm_agree(c, st);
    if (st != ZR_OK) {
        if (R == 0) {
            remove_dir(partial);
        }
        return st;
    }
    uint64_t mine[2] = {crc, bytes};
    uint64_t *all = malloc(sizeof(uint64_t) * 2 * (size_t)W);
    uint32_t *crcs = malloc(sizeof(uint32_t) * (size_t)W);
    uint64_t *sizes = malloc(sizeof(uint64_t) * (size_t)W);
    st = all && crcs && sizes ? ZR_OK
                              : zr_error_at(ZR_ERR_NOMEM, __FILE__, __LINE__,
                                            "out of memory saving a checkpoint");
    st = zr_comm_agree(c, st);
    if (st == ZR_OK) {
        st = zr_comm_allgather(c, ZR_GROUP_WORLD, ZR_KIND_CONTROL, mine, sizeof mine, all);
    }
    if (st == ZR_OK) {
        for (int r = 0; r < W; r++) {
            crcs[r] = (uint32_t)all[2 * r];
            sizes[r] = all[2 * r + 1];
        }
        if (R == 0) {
            st = commit(e, partial, final, dir, meta, config_json, crcs, sizes, keep);
        }
        st = zr_comm_agree(c, st);
    }
    free(all);
    free(crcs);
    free(sizes);
    if (st == ZR_OK && path_out != NULL) {
        snprintf(path_out, path_len, "%s", final);
    }
    return st;
}

zr_status zr_ckpt_find_latest(const char *dir, char *path, size_t len, int *found)
{
    int64_t *steps;
    int n;
    ZR_CHECK(list_complete(dir, &steps, &n));
    *found = n > 0;
    if (n > 0) {
        zr_status st = pathf(path, len, "%s/step_%08lld", dir, (long long)steps[n - 1]);
        free(steps);
        return st;
    }
    free(steps);
    return ZR_OK;
}

/* ---- manifest ------------------------------------------------------------------ */

static zr_status get_num(const cJSON *o, const char *key, const char *file, double lo, double hi,
                         double *out)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(it) || it->valuedouble < lo || it->valuedouble > hi ||
        it->valuedouble != (double)(int64_t)it->valuedouble) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: \"%s\" is missing or not an integer in [%.0f, %.0f]", file,
                key, lo, hi);
    }
    *out = it->valuedouble;
    return ZR_OK;
}

/* Parse the manifest; fills meta and the unit layout (caller frees *lay) and file CRCs. */
static zr_status parse_manifest(const char *path, zr_ckpt_meta *meta, unit_layout **lay,
                                int *nunits, uint32_t **crcs, uint64_t **sizes)
{
    char mpath[4096], marker[4096];
    ZR_CHECK(pathf(mpath, sizeof mpath, "%s/manifest.json", path));
    ZR_CHECK(pathf(marker, sizeof marker, "%s/COMPLETE", path));
    if (!exists(path)) {
        ZR_FAIL(ZR_ERR_IO, "checkpoint %s does not exist", path);
    }
    if (!exists(marker)) {
        ZR_FAIL(ZR_ERR_FORMAT, "checkpoint %s is incomplete (no COMPLETE marker): it was being "
                "written when the job stopped",
                path);
    }
    char *text;
    size_t n;
    ZR_CHECK(read_file(mpath, &text, &n));
    /* the marker carries the manifest's checksum */
    char *mtext;
    size_t mn;
    zr_status st = read_file(marker, &mtext, &mn);
    if (st != ZR_OK) {
        free(text);
        return st;
    }
    unsigned mcrc = 0;
    int marker_ok = sscanf(mtext, "complete manifest-crc32c %u", &mcrc) == 1;
    free(mtext);
    if (!marker_ok || mcrc != zr_crc32c(0, text, n)) {
        free(text);
        ZR_FAIL(ZR_ERR_FORMAT, "%s does not match the checksum in its COMPLETE marker: the "
                "manifest was modified or damaged",
                mpath);
    }
    cJSON *root = cJSON_ParseWithLength(text, n);
    free(text);
    if (root == NULL) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s is not valid JSON", mpath);
    }
    double v;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *units = cJSON_GetObjectItemCaseSensitive(root, "units");
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(root, "seed");
    const cJSON *plan = cJSON_GetObjectItemCaseSensitive(root, "plan");
    memset(meta, 0, sizeof *meta);
    *lay = NULL;
    *crcs = NULL;
    *sizes = NULL;
#define NUM(obj, key, lo, hi, dst)                                                                 \
    do {                                                                                           \
        ZR_CHECK_GOTO(get_num((obj), (key), mpath, (lo), (hi), &v), st, fail);                     \
        (dst) = v;                                                                                 \
    } while (0)
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "zr-checkpoint") != 0) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__, "%s is not a zr checkpoint manifest",
                         mpath);
        goto fail;
    }
    NUM(root, "version", ZR_CKPT_VERSION, ZR_CKPT_VERSION, v);
    NUM(root, "step", 0, 1e15, meta->step);
    NUM(root, "optim_steps", 0, 1e15, meta->optim_steps);
    NUM(root, "data_position", 0, 1e15, meta->data_position);
    NUM(root, "tokens", 0, 1e18, meta->tokens);
    NUM(root, "world_size", 1, 1 << 20, meta->world);
    if (!cJSON_IsString(seed) || !cJSON_IsObject(model) || !cJSON_IsArray(units) ||
        !cJSON_IsArray(files) || !cJSON_IsObject(plan)) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                         "%s lacks one of seed, model, units, files, plan", mpath);
        goto fail;
    }
    meta->seed = strtoull(seed->valuestring, NULL, 10);
    NUM(plan, "stage", 0, 3, meta->stage);
    NUM(model, "max_t", 1, 1 << 24, meta->model.max_t);
    NUM(model, "vocab", 1, 1 << 24, meta->model.vocab);
    NUM(model, "padded_vocab", 1, 1 << 24, meta->model.padded_vocab);
    NUM(model, "layers", 1, 1 << 16, meta->model.layers);
    NUM(model, "heads", 1, 1 << 16, meta->model.heads);
    NUM(model, "channels", 1, 1 << 20, meta->model.channels);
    st = zr_gpt_config_check(&meta->model);
    if (st != ZR_OK) {
        goto fail;
    }
    *nunits = cJSON_GetArraySize(units);
    if (*nunits != zr_gpt_config_unit_count(&meta->model) ||
        cJSON_GetArraySize(files) != meta->world) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                         "%s: %d units and %d files do not fit the model and world size", mpath,
                         *nunits, cJSON_GetArraySize(files));
        goto fail;
    }
    *lay = calloc((size_t)*nunits, sizeof(unit_layout));
    *crcs = calloc((size_t)meta->world, sizeof(uint32_t));
    *sizes = calloc((size_t)meta->world, sizeof(uint64_t));
    if (*lay == NULL || *crcs == NULL || *sizes == NULL) {
        st = zr_error_at(ZR_ERR_NOMEM, __FILE__, __LINE__, "out of memory reading %s", mpath);
        goto fail;
    }
    for (int u = 0; u < *nunits; u++) {
        NUM(cJSON_GetArrayItem(units, u), "numel", 0, 1e15, (*lay)[u].numel);
        if ((*lay)[u].numel != zr_gpt_config_unit_numel(&meta->model, u)) {
            st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                             "%s: unit %d has %zu elements, its model config says %zu", mpath, u,
                             (*lay)[u].numel, zr_gpt_config_unit_numel(&meta->model, u));
            goto fail;
        }
        (*lay)[u].padded = padded_of((*lay)[u].numel, meta->world);
        (*lay)[u].shard = (*lay)[u].padded / (size_t)meta->world;
    }
    for (int r = 0; r < meta->world; r++) {
        const cJSON *f = cJSON_GetArrayItem(files, r);
        NUM(f, "crc32c", 0, 4294967295.0, (*crcs)[r]);
        NUM(f, "bytes", 0, 1e18, (*sizes)[r]);
        if ((*sizes)[r] != file_bytes(*lay, *nunits)) {
            st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                             "%s: rank file %d should hold %zu bytes, manifest says %llu", mpath,
                             r, file_bytes(*lay, *nunits), (unsigned long long)(*sizes)[r]);
            goto fail;
        }
    }
#undef NUM
    cJSON_Delete(root);
    return ZR_OK;
fail:
    cJSON_Delete(root);
    free(*lay);
    free(*crcs);
    free(*sizes);
    *lay = NULL;
    *crcs = NULL;
    *sizes = NULL;
    return st;
}

zr_status zr_ckpt_read_meta(const char *path, zr_ckpt_meta *meta)
{
    unit_layout *lay;
    uint32_t *crcs;
    uint64_t *sizes;
    int nunits;
    ZR_CHECK(parse_manifest(path, meta, &lay, &nunits, &crcs, &sizes));
    free(lay);
    free(crcs);
    free(sizes);
    return ZR_OK;
}

/* ---- reading rank files ---------------------------------------------------------- */

typedef struct reader {
    const char *path;
    zr_ckpt_meta meta;
    unit_layout *lay;
    int nunits;
    uint32_t *crcs;
    uint64_t *sizes;
    FILE **files;     /* opened and verified on first use */
} reader;

static zr_status reader_open(reader *rd, const char *path)
{
    memset(rd, 0, sizeof *rd);
    rd->path = path;
    ZR_CHECK(parse_manifest(path, &rd->meta, &rd->lay, &rd->nunits, &rd->crcs, &rd->sizes));
    rd->files = calloc((size_t)rd->meta.world, sizeof(FILE *));
    if (rd->files == NULL) {
        ZR_FAIL(ZR_ERR_NOMEM, "out of memory opening %s", path);
    }
    return ZR_OK;
}

static void reader_close(reader *rd)
{
    if (rd->files != NULL) {
        for (int r = 0; r < rd->meta.world; r++) {
            if (rd->files[r] != NULL) {
                fclose(rd->files[r]);
            }
        }
    }
    free(rd->files);
    free(rd->lay);
    free(rd->crcs);
    free(rd->sizes);
    memset(rd, 0, sizeof *rd);
}

/* Open rank file q and check its size, header and checksum once. */
static zr_status reader_file(reader *rd, int q, FILE **out)
{
    if (rd->files[q] != NULL) {
        *out = rd->files[q];
        return ZR_OK;
    }
    char p[4096];
    ZR_CHECK(pathf(p, sizeof p, "%s/rank_%05d.bin", rd->path, q));
    FILE *f = fopen(p, "rb");
    if (f == NULL) {
        ZR_FAIL(ZR_ERR_IO, "cannot open %s: %s", p, strerror(errno));
    }
    zr_status st = ZR_OK;
    uint32_t crc = 0, stored = 0;
    uint64_t total = 0;
    unsigned char buf[1 << 16];
    uint64_t body = rd->sizes[q] - sizeof(uint32_t);
    rank_header h;
    if (fread(&h, 1, sizeof h, f) != sizeof h || memcmp(h.magic, RANK_MAGIC, 8) != 0 ||
        h.version != ZR_CKPT_VERSION || h.rank != (uint32_t)q ||
        h.world != (uint32_t)rd->meta.world || h.nunits != (uint32_t)rd->nunits) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                         "%s: bad header (not rank %d of %d of this checkpoint)", p, q,
                         rd->meta.world);
    }
    if (st == ZR_OK && fseek(f, 0, SEEK_SET) != 0) {
        st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__, "cannot seek in %s", p);
    }
    while (st == ZR_OK && total < body) {
        size_t want = body - total < sizeof buf ? (size_t)(body - total) : sizeof buf;
        size_t got = fread(buf, 1, want, f);
        if (got != want) {
            st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                             "%s is truncated: %llu of %llu bytes", p,
                             (unsigned long long)(total + got),
                             (unsigned long long)rd->sizes[q]);
            break;
        }
        crc = zr_crc32c(crc, buf, got);
        total += got;
    }
    if (st == ZR_OK && fread(&stored, 1, sizeof stored, f) != sizeof stored) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__, "%s is truncated (no checksum)", p);
    }
    if (st == ZR_OK && fgetc(f) != EOF) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__, "%s is longer than its manifest says",
                         p);
    }
    if (st == ZR_OK && (crc != stored || crc != rd->crcs[q])) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                         "%s fails its checksum (computed %08x, file %08x, manifest %08x): the "
                         "file is damaged or was modified",
                         p, crc, stored, rd->crcs[q]);
    }
    if (st != ZR_OK) {
        fclose(f);
        return st;
    }
    rd->files[q] = f;
    *out = f;
    return ZR_OK;
}

/*
 * Fill dst with elements [lo, hi) of array which (0 master, 1 m, 2 v) of unit
 * u, in unit coordinates, from the old ranks' slices; padding reads as zero.
 */
static zr_status reader_range(reader *rd, int u, int which, size_t lo, size_t hi, float *dst)
{
    const unit_layout *L = &rd->lay[u];
    memset(dst, 0, (hi - lo) * sizeof(float));
    size_t end = hi < L->numel ? hi : L->numel;
    for (size_t a = lo; a < end;) {
        int q = (int)(a / L->shard);
        size_t b = ((size_t)q + 1) * L->shard;
        if (b > end) {
            b = end;
        }
        FILE *f;
        ZR_CHECK(reader_file(rd, q, &f));
        size_t off = file_offset(rd->lay, u, which, a - (size_t)q * L->shard);
        if (fseek(f, (long)off, SEEK_SET) != 0 ||
            fread(dst + (a - lo), sizeof(float), b - a, f) != b - a) {
            ZR_FAIL(ZR_ERR_IO, "cannot read unit %d from rank file %d of %s", u, q, rd->path);
        }
        a = b;
    }
    return ZR_OK;
}

zr_status zr_ckpt_read_unit(const char *path, const zr_ckpt_meta *meta, int u, float *full)
{
    (void)meta;
    reader rd;
    zr_status st = reader_open(&rd, path);
    if (st == ZR_OK) {
        st = u >= 0 && u < rd.nunits
                 ? reader_range(&rd, u, 0, 0, rd.lay[u].numel, full)
                 : zr_error_at(ZR_ERR_INVALID, __FILE__, __LINE__, "no unit %d in %s", u, path);
    }
    reader_close(&rd);
    return st;
}

static zr_status load_local(zr_engine *e, const char *path, zr_ckpt_meta *meta)
{
    reader rd;
    ZR_CHECK(reader_open(&rd, path));
    zr_status st = ZR_OK;
    if (rd.nunits != e->nunits) {
        st = zr_error_at(ZR_ERR_INVALID, __FILE__, __LINE__,
                         "checkpoint %s has %d units, this model has %d", path, rd.nunits,
                         e->nunits);
    }
    for (int u = 0; u < e->nunits && st == ZR_OK; u++) {
        if (rd.lay[u].numel != zr_engine_numel(e, u)) {
            st = zr_error_at(ZR_ERR_INVALID, __FILE__, __LINE__,
                             "checkpoint %s: unit %d has %zu parameters, this model has %zu "
                             "(a different model shape)",
                             path, u, rd.lay[u].numel, zr_engine_numel(e, u));
        }
    }
    int R = e->comm->rank[ZR_GROUP_WORLD];
    for (int u = 0; u < e->nunits && st == ZR_OK; u++) {
        float *arr[3];
        st = zr_engine_optim_shard(e, u, &arr[0], &arr[1], &arr[2]);
        size_t S = zr_engine_shard(e, u), lo = (size_t)R * S;
        for (int k = 0; k < 3 && st == ZR_OK; k++) {
            st = reader_range(&rd, u, k, lo, lo + S, arr[k]);
        }
    }
    if (st == ZR_OK) {
        *meta = rd.meta;
    }
    reader_close(&rd);
    return st;
}

zr_status zr_ckpt_load(zr_comm *c, zr_engine *e, const char *path, zr_ckpt_meta *meta)
{
    ZR_CHECK(zr_comm_agree(c, load_local(e, path, meta)));
    ZR_CHECK(zr_engine_sync_from_shards(e));
    e->step = (int)meta->optim_steps;
    return ZR_OK;
}
