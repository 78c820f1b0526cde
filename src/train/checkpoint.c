/*
 * checkpoint.c - sharded checkpoints: crash-safe writes, checksums on every
 * file, strict validation of what is read back, and loading at a different
 * world size (see zr/checkpoint.h).
 *
 * Every rank file holds the same canonical slice of each unit whatever the
 * ZeRO stage, so resharding is a range intersection: new rank r' needs
 * [r'*S', (r'+1)*S') of the unit and old rank q holds [q*S, (q+1)*S).
 *
 * A manifest is trusted only as far as it is checked: its checksum can be
 * recomputed by anyone, so every field is checked for its JSON type and
 * range and cross-checked against the model, the unit layout and the headers
 * and sizes of the rank files before a single byte of state is used.
 */
#define _DEFAULT_SOURCE /* flock, gethostname */

#include "zr/checkpoint.h"

#include "zr/file.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define RANK_MAGIC   "ZRCKRANK"
#define HEADER_BYTES 64

/* Largest integer a manifest may hold: every integer up to it is exact in a
 * JSON number read as a double (RFC 7493), so no count is ever rounded. */
#define MAX_EXACT 9007199254740992.0 /* 2^53 */

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

static void warn(zr_ckpt_warn_fn fn, void *ctx, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void warn(zr_ckpt_warn_fn fn, void *ctx, const char *fmt, ...)
{
    char msg[2 * ZR_PATH_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (fn != NULL) {
        fn(ctx, msg);
    } else {
        ZR_WARN("%s", msg);
    }
}

/* ---- fault injection ------------------------------------------------------------ */

/*
 * ZR_FAULT_SAVE=k or k@N: world rank 0 kills itself with SIGKILL when the
 * save (of step N, or any save) reaches stage k. Tests use it to prove that a
 * crash at every point of a save leaves a directory that resumes; a SIGKILL
 * runs no handler and flushes nothing, like a power cut of the process.
 */
static void fault_point(int stage, int64_t step, int rank)
{
    const char *env = getenv("ZR_FAULT_SAVE");
    if (rank != 0 || env == NULL || env[0] == '\0') {
        return;
    }
    long long k = -1, at = -1;
    char tail;
    int n = sscanf(env, "%lld@%lld%c", &k, &at, &tail);
    if (n < 1 || n > 2 || (n == 1 && sscanf(env, "%lld%c", &k, &tail) != 1)) {
        return;
    }
    if (k == stage && (n == 1 || at == step)) {
        fprintf(stderr, "zr: ZR_FAULT_SAVE=%s: killing rank 0 at save stage %d of step %lld\n", env,
                stage, (long long)step);
        fflush(stderr);
        raise(SIGKILL);
    }
}

/* ---- small file helpers ----------------------------------------------------------- */

static int exists(const char *path)
{
    struct stat sb;
    return lstat(path, &sb) == 0;
}

/*
 * Remove a checkpoint-like directory and the files in it (one level deep).
 * fault > 0: fault_point(fault) after the first file is gone, so a test can
 * stop a removal halfway.
 */
static void remove_dir(const char *path, int fault, int64_t step)
{
    DIR *d = opendir(path);
    if (d != NULL) {
        struct dirent *ent;
        char p[ZR_PATH_MAX];
        int removed = 0;
        while ((ent = readdir(d)) != NULL) {
            if (strcmp(ent->d_name, ".") == 0 || strcmp(ent->d_name, "..") == 0) {
                continue;
            }
            if (pathf(p, sizeof p, "%s/%s", path, ent->d_name) == ZR_OK && unlink(p) == 0 &&
                removed++ == 0 && fault > 0) {
                fault_point(fault, step, 0);
            }
        }
        closedir(d);
    }
    rmdir(path);
}

/* Rename from to "<to_base>" or, if that exists, "<to_base>.1", ".2", ...; *out = the name. */
static zr_status rename_aside(const char *from, const char *to_base, char *out, size_t cap)
{
    for (int i = 0; i < 1000; i++) {
        ZR_CHECK(i == 0 ? pathf(out, cap, "%s", to_base) : pathf(out, cap, "%s.%d", to_base, i));
        if (!exists(out)) {
            if (rename(from, out) != 0) {
                ZR_FAIL(ZR_ERR_IO, "cannot move %s aside to %s: %s", from, out, strerror(errno));
            }
            return ZR_OK;
        }
    }
    ZR_FAIL(ZR_ERR_IO, "cannot move %s aside: %s and 999 numbered names exist", from, to_base);
}

/* "step_<digits>" + optional suffix: the step and what follows the digits. */
static int parse_step_name(const char *name, int64_t *step, const char **suffix)
{
    if (strncmp(name, "step_", 5) != 0) {
        return 0;
    }
    const char *p = name + 5;
    int64_t v = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++) {
        if (v > (INT64_MAX - 9) / 10) {
            return 0;
        }
        v = v * 10 + (*p - '0');
    }
    if (digits == 0) {
        return 0;
    }
    *step = v;
    *suffix = p;
    return 1;
}

/* ---- layout ------------------------------------------------------------------------ */

typedef struct unit_layout {
    size_t numel, padded, shard;
    uint64_t offset; /* byte offset of the unit's master slice in a rank file */
} unit_layout;

/*
 * Fill the slice sizes and file offsets of every unit for world W; *bytes =
 * the size of one rank file. Fails (no overflow) on a layout too large to
 * be a file.
 */
static zr_status layout_fill(unit_layout *lay, int nunits, int world, uint64_t *bytes)
{
    uint64_t off = HEADER_BYTES;
    for (int u = 0; u < nunits; u++) {
        lay[u].padded = zr_zero_padded(lay[u].numel, world);
        lay[u].shard = lay[u].padded / (size_t)world;
        lay[u].offset = off;
        uint64_t unit_bytes = (uint64_t)lay[u].shard * 3 * sizeof(float);
        if (lay[u].shard > (UINT64_C(1) << 58) || off > (UINT64_C(1) << 60) - unit_bytes) {
            ZR_FAIL(ZR_ERR_FORMAT, "unit %d makes the rank files larger than 2^60 bytes", u);
        }
        off += unit_bytes;
    }
    *bytes = off + sizeof(uint32_t);
    return ZR_OK;
}

/* Byte offset in a rank file of element i of array which (0 master, 1 m, 2 v) of unit u. */
static uint64_t file_offset(const unit_layout *lay, int u, int which, size_t i)
{
    return lay[u].offset + ((uint64_t)which * lay[u].shard + i) * sizeof(float);
}

/* ---- save ------------------------------------------------------------------------- */

/* Save stages (ZR_FAULT_SAVE=k): what is on disk when rank 0 dies there. */
enum {
    FAULT_PARTIAL_MADE = 1, /* step_N.partial exists, empty */
    FAULT_RANK_TMP = 2,     /* rank 0's file written as rank_00000.bin.tmp, not renamed */
    FAULT_RANK_FILES = 3,   /* every rank file in step_N.partial, no manifest */
    FAULT_MANIFEST = 4,     /* manifest.json in step_N.partial, no COMPLETE */
    FAULT_COMPLETE = 5,     /* COMPLETE in step_N.partial, not yet renamed */
    FAULT_RENAMED = 6,      /* step_N in place, parent directory not yet fsynced */
    FAULT_ROTATE_MOVED = 7, /* oldest checkpoint renamed to step_M.deleting, nothing removed */
    FAULT_ROTATE_HALF = 8,  /* one file of step_M.deleting removed */
    FAULT_DONE = 9,         /* rank 0 finished, before the ranks' final agreement */
};

static zr_status write_rank_file(zr_engine *e, const char *dir, int rank, int64_t step,
                                 uint32_t *crc_out, uint64_t *bytes_out)
{
    char path[ZR_PATH_MAX];
    ZR_CHECK(pathf(path, sizeof path, "%s/rank_%05d.bin", dir, rank));
    zr_file_tmp t;
    ZR_CHECK(zr_file_tmp_open(&t, path));
    rank_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, RANK_MAGIC, 8);
    h.version = ZR_CKPT_VERSION;
    h.rank = (uint32_t)rank;
    h.world = (uint32_t)e->comm->size[ZR_GROUP_WORLD];
    h.nunits = (uint32_t)e->nunits;
    h.step = step;
    uint32_t crc = zr_crc32c(0, &h, sizeof h);
    uint64_t bytes = sizeof h;
    zr_status st = zr_file_tmp_write(&t, &h, sizeof h);
    for (int u = 0; u < e->nunits && st == ZR_OK; u++) {
        float *arr[3];
        st = zr_engine_optim_shard(e, u, &arr[0], &arr[1], &arr[2]);
        size_t n = zr_engine_shard(e, u) * sizeof(float);
        for (int k = 0; k < 3 && st == ZR_OK; k++) {
            st = zr_file_tmp_write(&t, arr[k], n);
            crc = zr_crc32c(crc, arr[k], n);
            bytes += n;
        }
    }
    if (st == ZR_OK) {
        st = zr_file_tmp_write(&t, &crc, sizeof crc);
        bytes += sizeof crc;
    }
    if (st == ZR_OK && fflush(t.f) == 0) {
        fault_point(FAULT_RANK_TMP, step, rank);
    }
    ZR_CHECK(zr_file_tmp_commit(&t, st));
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

static const char *placement_name(zr_placement p)
{
    return p == ZR_SHARDED ? "sharded" : "replicated";
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
    cJSON_AddStringToObject(plan, "params", placement_name(e->plan.params));
    cJSON_AddStringToObject(plan, "grads", placement_name(e->plan.grads));
    cJSON_AddStringToObject(plan, "optimizer", placement_name(e->plan.optim));
    cJSON_AddBoolToObject(plan, "hpz_secondary", e->plan.secondary);
    cJSON_AddStringToObject(
        plan, "file_slices",
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

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Complete checkpoints under dir (step_N holding COMPLETE), sorted by step (ascending). */
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
    zr_status st = ZR_OK;
    int cap = 0;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        int64_t s;
        const char *suffix;
        char marker[ZR_PATH_MAX];
        if (!parse_step_name(ent->d_name, &s, &suffix) || suffix[0] != '\0' ||
            pathf(marker, sizeof marker, "%s/%s/COMPLETE", dir, ent->d_name) != ZR_OK ||
            !exists(marker)) {
            continue; /* also skips "step_N.partial" and other set-aside names */
        }
        if (*n == cap) {
            int64_t *grown = NULL;
            cap = cap ? 2 * cap : 16;
            st = zr_alloc_at((void **)&grown, sizeof(int64_t) * (size_t)cap, __FILE__, __LINE__);
            if (st != ZR_OK) {
                break;
            }
            if (*n > 0) {
                memcpy(grown, *steps, sizeof(int64_t) * (size_t)*n);
            }
            zr_free(*steps);
            *steps = grown;
        }
        (*steps)[(*n)++] = s;
    }
    closedir(d);
    if (st != ZR_OK) {
        zr_free(*steps);
        *steps = NULL;
        *n = 0;
        return st;
    }
    if (*n > 1) {
        qsort(*steps, (size_t)*n, sizeof(int64_t), cmp_i64);
    }
    return ZR_OK;
}

/* Delete the oldest complete checkpoints beyond keep, never the one just saved. */
static zr_status rotate(const char *dir, int64_t current, int keep)
{
    int64_t *steps;
    int n;
    ZR_CHECK(list_complete(dir, &steps, &n));
    zr_status st = ZR_OK;
    for (int i = 0; i + keep < n && st == ZR_OK; i++) {
        if (steps[i] == current) {
            continue;
        }
        /* one rename takes it out of the list, so a crash during the removal
           never leaves a "complete" checkpoint with files missing */
        char old[ZR_PATH_MAX], gone[ZR_PATH_MAX];
        st = pathf(old, sizeof old, "%s/step_%08lld", dir, (long long)steps[i]);
        if (st == ZR_OK) {
            st = pathf(gone, sizeof gone, "%s.deleting", old);
        }
        if (st == ZR_OK) {
            remove_dir(gone, 0, 0); /* a leftover of an earlier interrupted removal */
            if (rename(old, gone) != 0) {
                st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__, "cannot rename %s to %s: %s", old,
                                 gone, strerror(errno));
            }
        }
        if (st == ZR_OK) {
            fault_point(FAULT_ROTATE_MOVED, current, 0);
            remove_dir(gone, FAULT_ROTATE_HALF, current);
        }
    }
    zr_free(steps);
    return st;
}

/* Rank 0's part of a save, after every rank file is in step_N.partial. */
static zr_status commit(zr_engine *e, const char *partial, const char *final, const char *dir,
                        const zr_ckpt_meta *meta, const char *config_json, const uint32_t *crcs,
                        const uint64_t *bytes, int keep)
{
    fault_point(FAULT_RANK_FILES, meta->step, 0);
    char *text = manifest_text(e, meta, config_json, crcs, bytes);
    if (text == NULL) {
        ZR_FAIL(ZR_ERR_NOMEM, "out of memory writing the checkpoint manifest");
    }
    char path[ZR_PATH_MAX];
    zr_status st = pathf(path, sizeof path, "%s/manifest.json", partial);
    if (st == ZR_OK) {
        st = zr_file_write_atomic(path, text, strlen(text));
    }
    uint32_t mcrc = zr_crc32c(0, text, strlen(text));
    cJSON_free(text);
    ZR_CHECK(st);
    fault_point(FAULT_MANIFEST, meta->step, 0);
    /* COMPLETE (with the manifest's checksum) goes in before the rename, so
       that the rename below is the single point at which step_N appears,
       already complete; zr_file_write_atomic fsyncs step_N.partial */
    char body[64];
    int len = snprintf(body, sizeof body, "complete manifest-crc32c %u\n", mcrc);
    ZR_CHECK(pathf(path, sizeof path, "%s/COMPLETE", partial));
    ZR_CHECK(zr_file_write_atomic(path, body, (size_t)len));
    fault_point(FAULT_COMPLETE, meta->step, 0);
    if (rename(partial, final) != 0) {
        ZR_FAIL(ZR_ERR_IO, "cannot rename %s to %s: %s", partial, final, strerror(errno));
    }
    fault_point(FAULT_RENAMED, meta->step, 0);
    ZR_CHECK(zr_file_sync_dir(dir));
    if (keep > 0) {
        ZR_CHECK(rotate(dir, meta->step, keep));
    }
    fault_point(FAULT_DONE, meta->step, 0);
    return ZR_OK;
}

zr_status zr_ckpt_save(zr_comm *c, zr_engine *e, const char *dir, const zr_ckpt_meta *meta,
                       const char *config_json, int keep, char *path_out, size_t path_len)
{
    int R = c->rank[ZR_GROUP_WORLD], W = c->size[ZR_GROUP_WORLD];
    char final[ZR_PATH_MAX], partial[ZR_PATH_MAX];
    ZR_CHECK(pathf(final, sizeof final, "%s/step_%08lld", dir, (long long)meta->step));
    ZR_CHECK(pathf(partial, sizeof partial, "%s.partial", final));

    /* rank 0 prepares the directory; a leftover .partial is a crashed save's */
    zr_status st = ZR_OK;
    if (R == 0) {
        st = zr_file_mkdir_p(dir);
        if (st == ZR_OK && exists(final)) {
            st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__,
                             "checkpoint %s already exists; refusing to overwrite it", final);
        }
        if (st == ZR_OK) {
            if (exists(partial)) {
                warn(NULL, NULL, "removing %s, left by a save that did not finish", partial);
                remove_dir(partial, 0, 0);
            }
            if (mkdir(partial, 0755) != 0) {
                st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__, "cannot create %s: %s", partial,
                                 strerror(errno));
            }
        }
        if (st == ZR_OK) {
            st = zr_file_sync_dir(dir);
        }
        if (st == ZR_OK) {
            fault_point(FAULT_PARTIAL_MADE, meta->step, 0);
        }
    }
    ZR_CHECK(zr_comm_agree(c, st));

    uint32_t crc = 0;
    uint64_t bytes = 0;
    st = write_rank_file(e, partial, R, meta->step, &crc, &bytes);
    st = zr_comm_agree(c, st);
    if (st != ZR_OK) {
        if (R == 0) {
            remove_dir(partial, 0, 0);
        }
        return st;
    }
    uint64_t mine[2] = {crc, bytes};
    uint64_t *all = NULL, *sizes = NULL;
    uint32_t *crcs = NULL;
    st = zr_alloc_at((void **)&all, sizeof(uint64_t) * 2 * (size_t)W, __FILE__, __LINE__);
    if (st == ZR_OK) {
        st = zr_alloc_at((void **)&crcs, sizeof(uint32_t) * (size_t)W, __FILE__, __LINE__);
    }
    if (st == ZR_OK) {
        st = zr_alloc_at((void **)&sizes, sizeof(uint64_t) * (size_t)W, __FILE__, __LINE__);
    }
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
            if (st != ZR_OK) {
                remove_dir(partial, 0, 0);
            }
        }
        st = zr_comm_agree(c, st);
    }
    zr_free(all);
    zr_free(crcs);
    zr_free(sizes);
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
    zr_status st = ZR_OK;
    if (n > 0) {
        st = pathf(path, len, "%s/step_%08lld", dir, (long long)steps[n - 1]);
    }
    zr_free(steps);
    return st;
}

zr_status zr_ckpt_find_intact(const char *dir, int64_t before, char *path, size_t len, int *found)
{
    int64_t *steps;
    int n;
    *found = 0;
    ZR_CHECK(list_complete(dir, &steps, &n));
    zr_status st = ZR_OK;
    for (int i = n - 1; i >= 0 && st == ZR_OK && !*found; i--) {
        if (before >= 0 && steps[i] >= before) {
            continue;
        }
        st = pathf(path, len, "%s/step_%08lld", dir, (long long)steps[i]);
        if (st == ZR_OK) {
            *found = zr_ckpt_verify(path) == ZR_OK;
        }
    }
    zr_free(steps);
    return st;
}

/* ---- recovery and exclusive use of a directory --------------------------------------- */

zr_status zr_ckpt_recover(const char *dir, zr_ckpt_warn_fn fn, void *ctx)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        if (errno == ENOENT) {
            return ZR_OK;
        }
        ZR_FAIL(ZR_ERR_IO, "cannot read checkpoint directory %s: %s", dir, strerror(errno));
    }
    zr_status st = ZR_OK;
    struct dirent *ent;
    /* renames while reading a directory may show an entry twice or not at
       all; what is missed here is handled by the next save of that step */
    while ((ent = readdir(d)) != NULL && st == ZR_OK) {
        int64_t s;
        const char *suffix;
        char p[ZR_PATH_MAX], q[ZR_PATH_MAX];
        if (!parse_step_name(ent->d_name, &s, &suffix) ||
            pathf(p, sizeof p, "%s/%s", dir, ent->d_name) != ZR_OK) {
            continue;
        }
        struct stat sb;
        if (lstat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            continue;
        }
        if (strcmp(suffix, ".partial") == 0) {
            warn(fn, ctx,
                 "removed %s: a save of step %lld that did not finish (the job stopped during "
                 "it); the checkpoints before it are intact",
                 p, (long long)s);
            remove_dir(p, 0, 0);
        } else if (strcmp(suffix, ".deleting") == 0) {
            warn(fn, ctx, "removed %s: an old checkpoint whose rotation was interrupted", p);
            remove_dir(p, 0, 0);
        } else if (suffix[0] == '\0') {
            char marker[ZR_PATH_MAX];
            st = pathf(marker, sizeof marker, "%s/COMPLETE", p);
            if (st == ZR_OK && !exists(marker)) {
                /* only an older zr or a hand-made folder leaves this; its step
                   would block the save of that step, so it moves, whole */
                char base[ZR_PATH_MAX];
                st = pathf(base, sizeof base, "%s.incomplete", p);
                if (st == ZR_OK) {
                    st = rename_aside(p, base, q, sizeof q);
                }
                if (st == ZR_OK) {
                    warn(fn, ctx,
                         "moved %s aside to %s: it has no COMPLETE marker (a save that stopped "
                         "midway); nothing was deleted",
                         p, q);
                }
            }
        }
    }
    closedir(d);
    if (st == ZR_OK) {
        st = zr_file_sync_dir(dir);
    }
    return st;
}

zr_status zr_ckpt_set_aside_after(const char *dir, int64_t step, zr_ckpt_warn_fn fn, void *ctx)
{
    int64_t *steps;
    int n;
    ZR_CHECK(list_complete(dir, &steps, &n));
    zr_status st = ZR_OK;
    for (int i = 0; i < n && st == ZR_OK; i++) {
        char p[ZR_PATH_MAX], base[ZR_PATH_MAX], q[ZR_PATH_MAX];
        if (steps[i] <= step) {
            continue;
        }
        st = pathf(p, sizeof p, "%s/step_%08lld", dir, (long long)steps[i]);
        if (st == ZR_OK) {
            st = pathf(base, sizeof base, "%s.set-aside", p);
        }
        if (st == ZR_OK) {
            st = rename_aside(p, base, q, sizeof q);
        }
        if (st == ZR_OK) {
            warn(fn, ctx,
                 "moved %s aside to %s: it is newer than the checkpoint this run resumes "
                 "from; nothing was deleted",
                 p, q);
        }
    }
    zr_free(steps);
    if (st == ZR_OK && n > 0) {
        st = zr_file_sync_dir(dir);
    }
    return st;
}

zr_status zr_ckpt_lock(const char *dir, zr_ckpt_dir_lock *lk)
{
    lk->fd = -1;
    ZR_CHECK(zr_file_mkdir_p(dir));
    char path[ZR_PATH_MAX];
    ZR_CHECK(pathf(path, sizeof path, "%s/%s", dir, ZR_CKPT_LOCK_FILE));
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    if (fd < 0) {
        ZR_FAIL(ZR_ERR_IO, "cannot open the lock file %s: %s", path, strerror(errno));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        ZR_FAIL(ZR_ERR_INVALID, "the lock file %s is not a regular file", path);
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        if (err == EWOULDBLOCK) {
            char holder[512];
            ssize_t got = pread(fd, holder, sizeof holder - 1, 0);
            close(fd);
            holder[got > 0 ? got : 0] = '\0';
            holder[strcspn(holder, "\n")] = '\0';
            ZR_FAIL(ZR_ERR_INVALID,
                    "checkpoint dir %s is in use by another zr train (%s; lock file %s): two runs "
                    "in one folder would overwrite each other's checkpoints. Wait for that run to "
                    "end, or choose another zr.checkpoint.dir",
                    dir, holder[0] != '\0' ? holder : "which is just starting", path);
        }
        close(fd);
        if (err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS) {
            /* a file system without locks must not stop training */
            warn(NULL, NULL,
                 "cannot lock %s (%s): nothing stops a second run from using %s at the same time",
                 path, strerror(err), dir);
            return ZR_OK;
        }
        ZR_FAIL(ZR_ERR_IO, "cannot lock %s: %s", path, strerror(err));
    }
    /* who holds it, for the message a second run prints */
    char host[256] = "?", when[64] = "?", text[512];
    if (gethostname(host, sizeof host) != 0) {
        snprintf(host, sizeof host, "?");
    }
    host[sizeof host - 1] = '\0';
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm) != NULL) {
        strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
    }
    int len =
        snprintf(text, sizeof text, "pid %ld on host %s, started %s\n", (long)getpid(), host, when);
    if (len < 0 || (size_t)len >= sizeof text) {
        len = (int)strlen(text);
    }
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)len, 0) != (ssize_t)len) {
        int err = errno;
        close(fd);
        ZR_FAIL(ZR_ERR_IO, "cannot write the lock file %s: %s", path, strerror(err));
    }
    lk->fd = fd;
    return ZR_OK;
}

void zr_ckpt_unlock(zr_ckpt_dir_lock *lk)
{
    /* the file stays: removing it would let a run that opened it just before
       and a run that creates a new one both believe they hold the lock */
    if (lk->fd >= 0) {
        close(lk->fd);
    }
    lk->fd = -1;
}

/* ---- manifest ---------------------------------------------------------------------- */

static const char *json_kind(const cJSON *it)
{
    if (cJSON_IsString(it)) {
        return "a string";
    }
    if (cJSON_IsNumber(it)) {
        return "a number";
    }
    if (cJSON_IsBool(it)) {
        return "a boolean";
    }
    if (cJSON_IsNull(it)) {
        return "null";
    }
    if (cJSON_IsArray(it)) {
        return "an array";
    }
    return "an object";
}

/* Where a manifest value lives, for messages: the file and the key's full name. */
typedef struct where {
    const char *file;
    char key[96];
} where;

static const cJSON *member(const cJSON *o, const char *obj, const char *key, where *w)
{
    snprintf(w->key, sizeof w->key, "%s%s%s", obj, obj[0] != '\0' ? "." : "", key);
    return cJSON_GetObjectItemCaseSensitive(o, key);
}

/* Integer at o.key in [lo, hi] (hi <= 2^53): a JSON number without a fraction. */
static zr_status json_int(const cJSON *o, const char *obj, const char *key, const char *file,
                          double lo, double hi, int64_t *out)
{
    where w = {file, ""};
    const cJSON *it = member(o, obj, key, &w);
    if (it == NULL) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: key \"%s\" is missing", file, w.key);
    }
    if (!cJSON_IsNumber(it)) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: \"%s\" must be an integer, not %s", file, w.key, json_kind(it));
    }
    double d = it->valuedouble;
    if (!(d >= lo && d <= hi) || d != floor(d)) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: \"%s\" is %.17g, not an integer in [%.0f, %.0f]", file, w.key,
                d, lo, hi);
    }
    *out = (int64_t)d;
    return ZR_OK;
}

static zr_status json_str(const cJSON *o, const char *obj, const char *key, const char *file,
                          const char **out)
{
    where w = {file, ""};
    const cJSON *it = member(o, obj, key, &w);
    if (it == NULL) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: key \"%s\" is missing", file, w.key);
    }
    if (!cJSON_IsString(it)) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: \"%s\" must be a string, not %s", file, w.key, json_kind(it));
    }
    *out = it->valuestring;
    return ZR_OK;
}

static zr_status json_kind_is(const cJSON *it, int (*is)(const cJSON *), const char *what,
                              const char *file, const char *key)
{
    if (it == NULL) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: key \"%s\" is missing", file, key);
    }
    if (!is(it)) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: \"%s\" must be %s, not %s", file, key, what, json_kind(it));
    }
    return ZR_OK;
}

static int is_object(const cJSON *it)
{
    return cJSON_IsObject(it);
}

static int is_array(const cJSON *it)
{
    return cJSON_IsArray(it);
}

static int is_bool(const cJSON *it)
{
    return cJSON_IsBool(it);
}

/* Every member of object o is one of keys (NULL-terminated), each at most once. */
static zr_status only_keys(const cJSON *o, const char *obj, const char *const *keys,
                           const char *file)
{
    unsigned seen = 0;
    for (const cJSON *it = o->child; it != NULL; it = it->next) {
        int k = 0;
        while (keys[k] != NULL && (it->string == NULL || strcmp(keys[k], it->string) != 0)) {
            k++;
        }
        if (keys[k] == NULL) {
            ZR_FAIL(ZR_ERR_FORMAT, "%s: unknown key \"%s%s%s\" (this zr writes version %d)", file,
                    obj, obj[0] != '\0' ? "." : "", it->string ? it->string : "?", ZR_CKPT_VERSION);
        }
        if (seen & (1u << k)) {
            ZR_FAIL(ZR_ERR_FORMAT, "%s: key \"%s%s%s\" appears twice", file, obj,
                    obj[0] != '\0' ? "." : "", keys[k]);
        }
        seen |= 1u << k;
    }
    return ZR_OK;
}

/* The seed: a string of decimal digits that fits in 64 bits (JSON numbers cannot hold it). */
static zr_status parse_seed(const char *s, const char *file, uint64_t *out)
{
    uint64_t v = 0;
    size_t n = strlen(s);
    int ok = n > 0 && n <= 20;
    for (size_t i = 0; i < n && ok; i++) {
        unsigned d = (unsigned)(s[i] - '0');
        ok = s[i] >= '0' && s[i] <= '9' && v <= (UINT64_MAX - d) / 10;
        v = v * 10 + d;
    }
    if (!ok) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: \"seed\" is \"%.40s\", not a decimal number below 2^64", file,
                s);
    }
    *out = v;
    return ZR_OK;
}

/* What parse_manifest found: the meta, the unit layout and the files' sizes and CRCs. */
typedef struct manifest {
    zr_ckpt_meta meta;
    int nunits;
    unit_layout *lay;
    uint32_t *crcs;
    uint64_t file_bytes; /* every rank file has this size */
} manifest;

static void manifest_free(manifest *m)
{
    zr_free(m->lay);
    zr_free(m->crcs);
    m->lay = NULL;
    m->crcs = NULL;
}

/* The manifest's fields, their types and ranges, and the layout they imply. */
static zr_status parse_fields(const cJSON *root, const char *mpath, manifest *m)
{
    static const char *const top_keys[] = {
        "format",     "version", "step",  "optim_steps", "data_position", "tokens", "seed",
        "world_size", "plan",    "model", "units",       "files",         "config", NULL};
    static const char *const plan_keys[] = {"stage",         "params",      "grads", "optimizer",
                                            "hpz_secondary", "file_slices", NULL};
    static const char *const model_keys[] = {"max_t",    "vocab", "padded_vocab", "layers", "heads",
                                             "channels", NULL};
    static const char *const unit_keys[] = {"numel", NULL};
    static const char *const file_keys[] = {"name", "bytes", "crc32c", NULL};
    zr_ckpt_meta *meta = &m->meta;
    int64_t v;
    const char *s;
    if (!cJSON_IsObject(root)) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s is not a JSON object", mpath);
    }
    ZR_CHECK(only_keys(root, "", top_keys, mpath));
    ZR_CHECK(json_str(root, "", "format", mpath, &s));
    if (strcmp(s, "zr-checkpoint") != 0) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: \"format\" is \"%.40s\": not a zr checkpoint manifest", mpath,
                s);
    }
    ZR_CHECK(json_int(root, "", "version", mpath, 0, MAX_EXACT, &v));
    if (v != ZR_CKPT_VERSION) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: \"version\" is %lld; this zr reads version %d", mpath,
                (long long)v, ZR_CKPT_VERSION);
    }
    ZR_CHECK(json_int(root, "", "step", mpath, 0, MAX_EXACT, &meta->step));
    ZR_CHECK(json_int(root, "", "optim_steps", mpath, 0, MAX_EXACT, &meta->optim_steps));
    if (meta->optim_steps > meta->step) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: \"optim_steps\" (%lld) exceeds \"step\" (%lld)", mpath,
                (long long)meta->optim_steps, (long long)meta->step);
    }
    ZR_CHECK(json_int(root, "", "data_position", mpath, 0, MAX_EXACT, &v));
    meta->data_position = (uint64_t)v;
    ZR_CHECK(json_int(root, "", "tokens", mpath, 0, MAX_EXACT, &v));
    meta->tokens = (uint64_t)v;
    ZR_CHECK(json_str(root, "", "seed", mpath, &s));
    ZR_CHECK(parse_seed(s, mpath, &meta->seed));
    ZR_CHECK(json_int(root, "", "world_size", mpath, 1, 1 << 20, &v));
    meta->world = (int)v;

    const cJSON *plan = cJSON_GetObjectItemCaseSensitive(root, "plan");
    ZR_CHECK(json_kind_is(plan, is_object, "an object", mpath, "plan"));
    ZR_CHECK(only_keys(plan, "plan", plan_keys, mpath));
    ZR_CHECK(json_int(plan, "plan", "stage", mpath, 0, 3, &v));
    meta->stage = (int)v;
    const cJSON *hpz = cJSON_GetObjectItemCaseSensitive(plan, "hpz_secondary");
    ZR_CHECK(json_kind_is(hpz, is_bool, "a boolean", mpath, "plan.hpz_secondary"));
    zr_plan preset = zr_plan_preset(meta->stage, cJSON_IsTrue(hpz));
    if (preset.secondary != cJSON_IsTrue(hpz)) {
        ZR_FAIL(ZR_ERR_FORMAT,
                "%s: \"plan.hpz_secondary\" is true at stage %d (hpZ is stage 3 only)", mpath,
                meta->stage);
    }
    const struct {
        const char *key;
        zr_placement want;
    } places[] = {{"params", preset.params}, {"grads", preset.grads}, {"optimizer", preset.optim}};
    for (int i = 0; i < 3; i++) {
        ZR_CHECK(json_str(plan, "plan", places[i].key, mpath, &s));
        if (strcmp(s, placement_name(places[i].want)) != 0) {
            ZR_FAIL(ZR_ERR_FORMAT, "%s: \"plan.%s\" is \"%.20s\"; stage %d has it %s", mpath,
                    places[i].key, s, meta->stage, placement_name(places[i].want));
        }
    }
    ZR_CHECK(json_str(plan, "plan", "file_slices", mpath, &s));

    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    ZR_CHECK(json_kind_is(model, is_object, "an object", mpath, "model"));
    ZR_CHECK(only_keys(model, "model", model_keys, mpath));
    int *dims[] = {&meta->model.max_t,  &meta->model.vocab, &meta->model.padded_vocab,
                   &meta->model.layers, &meta->model.heads, &meta->model.channels};
    for (int i = 0; i < 6; i++) {
        ZR_CHECK(json_int(model, "model", model_keys[i], mpath, 1, 1 << 24, &v));
        *dims[i] = (int)v;
    }
    if (meta->model.layers > 1 << 16) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: \"model.layers\" is %d, more than zr builds (65536)", mpath,
                meta->model.layers);
    }
    zr_status st = zr_gpt_config_check(&meta->model);
    if (st != ZR_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", zr_error_message());
        ZR_FAIL(ZR_ERR_FORMAT, "%s: \"model\" is not a valid GPT: %s", mpath, why);
    }

    const cJSON *units = cJSON_GetObjectItemCaseSensitive(root, "units");
    ZR_CHECK(json_kind_is(units, is_array, "an array", mpath, "units"));
    m->nunits = cJSON_GetArraySize(units);
    if (m->nunits != zr_gpt_config_unit_count(&meta->model)) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: \"units\" lists %d units; a model of %d layers has %d", mpath,
                m->nunits, meta->model.layers, zr_gpt_config_unit_count(&meta->model));
    }
    ZR_CHECK(
        zr_alloc_at((void **)&m->lay, sizeof(unit_layout) * (size_t)m->nunits, __FILE__, __LINE__));
    int u = 0;
    for (const cJSON *it = units->child; it != NULL; it = it->next, u++) {
        char obj[32];
        snprintf(obj, sizeof obj, "units[%d]", u);
        ZR_CHECK(json_kind_is(it, is_object, "an object", mpath, obj));
        ZR_CHECK(only_keys(it, obj, unit_keys, mpath));
        ZR_CHECK(json_int(it, obj, "numel", mpath, 1, MAX_EXACT, &v));
        size_t want = zr_gpt_config_unit_numel(&meta->model, u);
        if ((uint64_t)v != (uint64_t)want) {
            ZR_FAIL(ZR_ERR_FORMAT, "%s: \"%s.numel\" is %lld; the model says unit %d has %zu",
                    mpath, obj, (long long)v, u, want);
        }
        m->lay[u].numel = want;
    }
    st = layout_fill(m->lay, m->nunits, meta->world, &m->file_bytes);
    if (st != ZR_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", zr_error_message());
        ZR_FAIL(ZR_ERR_FORMAT, "%s: %s", mpath, why);
    }

    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    ZR_CHECK(json_kind_is(files, is_array, "an array", mpath, "files"));
    if (cJSON_GetArraySize(files) != meta->world) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: \"files\" lists %d rank files; \"world_size\" is %d", mpath,
                cJSON_GetArraySize(files), meta->world);
    }
    ZR_CHECK(
        zr_alloc_at((void **)&m->crcs, sizeof(uint32_t) * (size_t)meta->world, __FILE__, __LINE__));
    int r = 0;
    for (const cJSON *it = files->child; it != NULL; it = it->next, r++) {
        char obj[32], name[32];
        snprintf(obj, sizeof obj, "files[%d]", r);
        snprintf(name, sizeof name, "rank_%05d.bin", r);
        ZR_CHECK(json_kind_is(it, is_object, "an object", mpath, obj));
        ZR_CHECK(only_keys(it, obj, file_keys, mpath));
        ZR_CHECK(json_str(it, obj, "name", mpath, &s));
        if (strcmp(s, name) != 0) {
            ZR_FAIL(ZR_ERR_FORMAT, "%s: \"%s.name\" is \"%.40s\", expected \"%s\"", mpath, obj, s,
                    name);
        }
        ZR_CHECK(json_int(it, obj, "bytes", mpath, 0, MAX_EXACT, &v));
        if ((uint64_t)v != m->file_bytes) {
            ZR_FAIL(ZR_ERR_FORMAT,
                    "%s: \"%s.bytes\" is %lld; the units and world size make every rank file "
                    "%llu bytes",
                    mpath, obj, (long long)v, (unsigned long long)m->file_bytes);
        }
        ZR_CHECK(json_int(it, obj, "crc32c", mpath, 0, 4294967295.0, &v));
        m->crcs[r] = (uint32_t)v;
    }
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(root, "config");
    if (cfg != NULL && !cJSON_IsObject(cfg)) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: \"config\" must be an object, not %s", mpath, json_kind(cfg));
    }
    return ZR_OK;
}

/* Every rank file exists, has the manifest's size and a header that agrees with it; no extra ones.
 */
static zr_status check_rank_files(const char *path, const manifest *m)
{
    for (int r = 0; r < m->meta.world; r++) {
        char p[ZR_PATH_MAX];
        ZR_CHECK(pathf(p, sizeof p, "%s/rank_%05d.bin", path, r));
        FILE *f;
        ZR_CHECK(zr_file_open_read(p, &f));
        struct stat sb;
        rank_header h;
        zr_status st = ZR_OK;
        if (fstat(fileno(f), &sb) != 0) {
            st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__, "cannot size %s: %s", p,
                             strerror(errno));
        } else if ((uint64_t)sb.st_size < m->file_bytes) {
            st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                             "%s is truncated: %llu bytes, the manifest says %llu", p,
                             (unsigned long long)sb.st_size, (unsigned long long)m->file_bytes);
        } else if ((uint64_t)sb.st_size > m->file_bytes) {
            st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                             "%s is longer than its manifest says: %llu bytes, not %llu", p,
                             (unsigned long long)sb.st_size, (unsigned long long)m->file_bytes);
        } else if (fread(&h, 1, sizeof h, f) != sizeof h || memcmp(h.magic, RANK_MAGIC, 8) != 0 ||
                   h.version != ZR_CKPT_VERSION) {
            st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                             "%s is not a zr rank file of version %d (bad header)", p,
                             ZR_CKPT_VERSION);
        } else if (h.rank != (uint32_t)r || h.world != (uint32_t)m->meta.world ||
                   h.nunits != (uint32_t)m->nunits || h.step != m->meta.step) {
            st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                             "%s: its header says rank %u of %u, %u units, step %lld; the "
                             "manifest says rank %d of %d, %d units, step %lld",
                             p, h.rank, h.world, h.nunits, (long long)h.step, r, m->meta.world,
                             m->nunits, (long long)m->meta.step);
        }
        fclose(f);
        ZR_CHECK(st);
    }
    DIR *d = opendir(path);
    if (d == NULL) {
        ZR_FAIL(ZR_ERR_IO, "cannot read checkpoint %s: %s", path, strerror(errno));
    }
    struct dirent *ent;
    zr_status st = ZR_OK;
    while ((ent = readdir(d)) != NULL && st == ZR_OK) {
        unsigned q;
        char tail;
        if (sscanf(ent->d_name, "rank_%u.bi%c", &q, &tail) == 2 &&
            (q >= (unsigned)m->meta.world || strlen(ent->d_name) != 14)) {
            st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                             "%s/%s is not one of the %d rank files its manifest lists: the "
                             "checkpoint was modified",
                             path, ent->d_name, m->meta.world);
        }
    }
    closedir(d);
    return st;
}

/* Read, verify and parse the manifest of checkpoint path; cross-check the rank files. */
static zr_status parse_manifest(const char *path, manifest *m)
{
    memset(m, 0, sizeof *m);
    char mpath[ZR_PATH_MAX], marker[ZR_PATH_MAX];
    ZR_CHECK(pathf(mpath, sizeof mpath, "%s/manifest.json", path));
    ZR_CHECK(pathf(marker, sizeof marker, "%s/COMPLETE", path));
    struct stat sb;
    if (stat(path, &sb) != 0) {
        ZR_FAIL(ZR_ERR_IO, "checkpoint %s does not exist", path);
    }
    if (!S_ISDIR(sb.st_mode)) {
        ZR_FAIL(ZR_ERR_INVALID, "%s is not a checkpoint (a step_N folder)", path);
    }
    if (!exists(marker)) {
        if (!exists(mpath)) {
            ZR_FAIL(ZR_ERR_INVALID, "%s is not a checkpoint (no manifest.json, no COMPLETE)", path);
        }
        ZR_FAIL(ZR_ERR_FORMAT,
                "checkpoint %s is incomplete (no COMPLETE marker): it was being written when "
                "the job stopped",
                path);
    }
    char *text = NULL, *mtext = NULL;
    size_t n, mn;
    cJSON *root = NULL;
    zr_status st;
    ZR_CHECK_GOTO(zr_file_read_all(mpath, &text, &n), st, fail);
    /* the marker carries the manifest's checksum */
    ZR_CHECK_GOTO(zr_file_read_all(marker, &mtext, &mn), st, fail);
    unsigned mcrc = 0;
    int marker_ok = sscanf(mtext, "complete manifest-crc32c %u", &mcrc) == 1;
    if (!marker_ok || mcrc != zr_crc32c(0, text, n)) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                         "%s does not match the checksum in its COMPLETE marker: the manifest "
                         "was modified or damaged",
                         mpath);
        goto fail;
    }
    root = cJSON_ParseWithLength(text, n);
    if (root == NULL) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__, "%s is not valid JSON", mpath);
        goto fail;
    }
    ZR_CHECK_GOTO(parse_fields(root, mpath, m), st, fail);
    ZR_CHECK_GOTO(check_rank_files(path, m), st, fail);
    cJSON_Delete(root);
    zr_free(text);
    zr_free(mtext);
    return ZR_OK;
fail:
    cJSON_Delete(root);
    zr_free(text);
    zr_free(mtext);
    manifest_free(m);
    return st;
}

zr_status zr_ckpt_read_meta(const char *path, zr_ckpt_meta *meta)
{
    manifest m;
    ZR_CHECK(parse_manifest(path, &m));
    *meta = m.meta;
    manifest_free(&m);
    return ZR_OK;
}

/* ---- reading rank files ----------------------------------------------------------- */

typedef struct reader {
    const char *path;
    manifest m;
    FILE **files; /* opened and verified on first use */
} reader;

static void reader_close(reader *rd)
{
    if (rd->files != NULL) {
        for (int r = 0; r < rd->m.meta.world; r++) {
            if (rd->files[r] != NULL) {
                fclose(rd->files[r]);
            }
        }
    }
    zr_free(rd->files);
    manifest_free(&rd->m);
    memset(rd, 0, sizeof *rd);
}

static zr_status reader_open(reader *rd, const char *path)
{
    memset(rd, 0, sizeof *rd);
    rd->path = path;
    ZR_CHECK(parse_manifest(path, &rd->m));
    zr_status st = zr_alloc_at((void **)&rd->files, sizeof(FILE *) * (size_t)rd->m.meta.world,
                               __FILE__, __LINE__);
    if (st != ZR_OK) {
        reader_close(rd);
    }
    return st;
}

/* Open rank file q and check its checksum once (size and header: parse_manifest). */
static zr_status reader_file(reader *rd, int q, FILE **out)
{
    if (rd->files[q] != NULL) {
        *out = rd->files[q];
        return ZR_OK;
    }
    char p[ZR_PATH_MAX];
    ZR_CHECK(pathf(p, sizeof p, "%s/rank_%05d.bin", rd->path, q));
    FILE *f;
    ZR_CHECK(zr_file_open_read(p, &f));
    zr_status st = ZR_OK;
    uint32_t crc = 0, stored = 0;
    uint64_t total = 0;
    unsigned char buf[1 << 16];
    uint64_t body = rd->m.file_bytes - sizeof(uint32_t);
    while (st == ZR_OK && total < body) {
        size_t want = body - total < sizeof buf ? (size_t)(body - total) : sizeof buf;
        size_t got = fread(buf, 1, want, f);
        if (got != want) {
            st = zr_error_at(
                ZR_ERR_FORMAT, __FILE__, __LINE__, "%s is truncated: %llu of %llu bytes", p,
                (unsigned long long)(total + got), (unsigned long long)rd->m.file_bytes);
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
    if (st == ZR_OK && (crc != stored || crc != rd->m.crcs[q])) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                         "%s fails its checksum (computed %08x, file %08x, manifest %08x): the "
                         "file is damaged or was modified",
                         p, crc, stored, rd->m.crcs[q]);
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
    const unit_layout *L = &rd->m.lay[u];
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
        uint64_t off = file_offset(rd->m.lay, u, which, a - (size_t)q * L->shard);
        if (off > (uint64_t)LONG_MAX || fseek(f, (long)off, SEEK_SET) != 0 ||
            fread(dst + (a - lo), sizeof(float), b - a, f) != b - a) {
            ZR_FAIL(ZR_ERR_IO, "cannot read unit %d from rank file %d of %s", u, q, rd->path);
        }
        a = b;
    }
    return ZR_OK;
}

zr_status zr_ckpt_verify(const char *path)
{
    reader rd;
    ZR_CHECK(reader_open(&rd, path));
    zr_status st = ZR_OK;
    for (int q = 0; q < rd.m.meta.world && st == ZR_OK; q++) {
        FILE *f;
        st = reader_file(&rd, q, &f);
    }
    reader_close(&rd);
    return st;
}

zr_status zr_ckpt_read_unit(const char *path, const zr_ckpt_meta *meta, int u, float *full)
{
    (void)meta;
    reader rd;
    ZR_CHECK(reader_open(&rd, path));
    zr_status st = u >= 0 && u < rd.m.nunits ? reader_range(&rd, u, 0, 0, rd.m.lay[u].numel, full)
                                             : zr_error_at(ZR_ERR_INVALID, __FILE__, __LINE__,
                                                           "no unit %d in %s", u, path);
    reader_close(&rd);
    return st;
}

static zr_status load_local(zr_engine *e, const char *path, zr_ckpt_meta *meta)
{
    reader rd;
    ZR_CHECK(reader_open(&rd, path));
    zr_status st = ZR_OK;
    if (rd.m.nunits != e->nunits) {
        st = zr_error_at(ZR_ERR_INVALID, __FILE__, __LINE__,
                         "checkpoint %s has %d units, this model has %d", path, rd.m.nunits,
                         e->nunits);
    }
    for (int u = 0; u < e->nunits && st == ZR_OK; u++) {
        if (rd.m.lay[u].numel != zr_engine_numel(e, u)) {
            st = zr_error_at(ZR_ERR_INVALID, __FILE__, __LINE__,
                             "checkpoint %s: unit %d has %zu parameters, this model has %zu "
                             "(a different model shape)",
                             path, u, rd.m.lay[u].numel, zr_engine_numel(e, u));
        }
    }
    if (st == ZR_OK && rd.m.meta.optim_steps > INT_MAX) {
        st = zr_error_at(ZR_ERR_FORMAT, __FILE__, __LINE__,
                         "checkpoint %s: %lld optimizer steps is more than the engine counts "
                         "(%d)",
                         path, (long long)rd.m.meta.optim_steps, INT_MAX);
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
        *meta = rd.m.meta;
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
