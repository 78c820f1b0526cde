/*
 * test_checkpoint.c - checkpoints through the library (no zr binary).
 *
 * Resharding: a checkpoint saved at W = 4 ranks loads at 1, 2 and 3 ranks
 * and at every ZeRO stage with every element of master weights and Adam
 * moments in place (padding zero), and one saved at 3 loads back at 4.
 * 64-bit counts (tokens beyond 2^32, a seed beyond 2^63) survive the trip.
 *
 * Forged manifests: a table of edits to a valid checkpoint, each with the
 * COMPLETE checksum recomputed so that only the manifest's validation can
 * catch it (huge, negative, fractional and string counts, missing, unknown
 * and repeated keys, wrong shapes, world sizes and file sizes), and of
 * damaged rank files (truncated, extra, missing, swapped, a FIFO, a flipped
 * byte). Each must fail with a message naming the key or the file.
 *
 * Values: a NaN or an infinity in a rank file whose checksums were made to
 * match is refused by every reader, naming the file, array, tensor and
 * element (test_nonfinite).
 *
 * Also: the directory lock refuses a second holder and names the first;
 * recovery clears what a crashed save leaves, with a warning for each; a
 * checkpoint is known by its manifest, not its name (test_identity); rotation and
 * the clearing of leftovers delete only what zr wrote (test_rotation_keeps_user_files).
 *
 * Run with 4 ranks (tests/testlist).
 */
#define _DEFAULT_SOURCE /* mkdtemp, mkfifo */
#define ZR_TEST_MPI
#include "test.h"

#include "zr/checkpoint.h"
#include "zr/file.h"
#include "zr/gpt_engine.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

/* paths in this test are short; a truncated one would fail its check loudly */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

static int W, R;
static char work[256];

static const zr_gpt_config CFG = {16, 64, 64, 2, 2, 32}; /* maxT, V, Vp, L, NH, C */

/* The value of element i of array which (0 master, 1 m, 2 v) of unit u: exact in fp32. */
static float val(int u, int which, size_t i)
{
    return (float)((u * 131 + which * 17 + (int)(i % 8191) * 3) % 8191) * 0.25f - 1000.0f;
}

typedef struct world {
    MPI_Comm mpi;
    zr_comm comm;
    zr_gpt_specs specs;
    zr_engine engine;
    int up;
} world;

/* The first n world ranks build a communicator and an engine at stage; others get up = 0. */
static void world_open(world *w, int n, int stage)
{
    memset(w, 0, sizeof *w);
    MPI_Comm_split(MPI_COMM_WORLD, R < n ? 0 : MPI_UNDEFINED, R, &w->mpi);
    if (R >= n) {
        return;
    }
    zr_comm_config cc = {n, 1};
    TEST_OK(zr_comm_init(&w->comm, w->mpi, &cc));
    TEST_OK(zr_gpt_specs_init(&w->specs, &CFG));
    zr_engine_config ec = zr_engine_config_default();
    ec.stage = stage;
    ec.param_wire.type = ZR_WIRE_F32;
    ec.grad_wire.type = ZR_WIRE_F32;
    TEST_OK(zr_engine_init(&w->engine, &w->comm, &ec, w->specs.nunits, w->specs.units));
    w->up = 1;
}

static void world_close(world *w)
{
    if (w->up) {
        zr_engine_free(&w->engine);
        zr_gpt_specs_free(&w->specs);
        zr_comm_free(&w->comm);
        MPI_Comm_free(&w->mpi);
    }
    memset(w, 0, sizeof *w);
}

/* Set every rank's optimizer shards to val (padding zero) and sync the params. */
static void fill(world *w)
{
    zr_engine *e = &w->engine;
    int r = w->comm.rank[ZR_GROUP_WORLD];
    for (int u = 0; u < e->nunits; u++) {
        size_t S = zr_engine_shard(e, u), n = zr_engine_numel(e, u);
        float *arr = malloc((S ? S : 1) * sizeof(float));
        for (int k = 0; k < 3; k++) {
            for (size_t j = 0; j < S; j++) {
                size_t g = (size_t)r * S + j;
                arr[j] = g < n ? val(u, k, g) : 0.0f;
            }
            TEST_OK(zr_engine_optim_write(e, u, (zr_optim_array)k, 0, S, arr));
        }
        free(arr);
    }
    TEST_OK(zr_engine_sync_from_shards(e));
}

/* Every element of this rank's shards and of the full parameters is val's; returns mismatches. */
static long check_state(world *w)
{
    zr_engine *e = &w->engine;
    int r = w->comm.rank[ZR_GROUP_WORLD];
    long bad = 0;
    for (int u = 0; u < e->nunits; u++) {
        size_t S = zr_engine_shard(e, u), n = zr_engine_numel(e, u);
        float *arr = malloc((S ? S : 1) * sizeof(float));
        for (int k = 0; k < 3; k++) {
            TEST_OK(zr_engine_optim_read(e, u, (zr_optim_array)k, 0, S, arr));
            for (size_t j = 0; j < S; j++) {
                size_t g = (size_t)r * S + j;
                bad += arr[j] != (g < n ? val(u, k, g) : 0.0f);
            }
        }
        free(arr);
        float *full = NULL;
        TEST_OK(zr_alloc_at((void **)&full, n * sizeof(float), __FILE__, __LINE__));
        if (full != NULL) {
            TEST_OK(zr_engine_get_params(e, u, full));
            for (size_t i = 0; i < n; i++) {
                bad += full[i] != val(u, 0, i);
            }
        }
        zr_free(full);
    }
    return bad;
}

static zr_ckpt_meta meta_for(int64_t step)
{
    zr_ckpt_meta m;
    memset(&m, 0, sizeof m);
    m.step = step;
    m.optim_steps = step - 1;
    m.tokens = UINT64_C(12345678901) + (uint64_t)step; /* beyond 32 bits */
    m.seed = UINT64_C(9223372036854775813);            /* beyond 2^63 */
    m.model = CFG;
    return m;
}

static void test_reshard(void)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/rs", work);
    world w4;
    world_open(&w4, W, 3);
    fill(&w4);
    zr_ckpt_meta m7 = meta_for(7);
    char path[ZR_PATH_MAX];
    zr_ckpt_save_opts o7 = {"{\"note\": 1}", NULL, 0, -1};
    TEST_OK(zr_ckpt_save(&w4.comm, &w4.engine, dir, &m7, &o7, path, sizeof path));
    world_close(&w4);
    for (int n = 1; n <= W; n++) {
        for (int stage = 0; stage <= 3; stage++) {
            world w;
            world_open(&w, n, stage);
            if (w.up) {
                zr_ckpt_meta got;
                TEST_OK(zr_ckpt_load(&w.comm, &w.engine, path, &got));
                long bad = check_state(&w);
                TEST_CHECKF(bad == 0, "saved at %d, loaded at %d ranks, stage %d: %ld wrong", W, n,
                            stage, bad);
                TEST_EQ_INT(got.step, 7);
                TEST_EQ_INT(got.optim_steps, 6);
                TEST_CHECK(got.tokens == m7.tokens && got.seed == m7.seed);
                TEST_EQ_INT(got.world, W);
                TEST_EQ_INT(w.engine.step, 6);
                if (n == 3 && stage == 1) {
                    /* and back up: saved at 3, loaded at W below */
                    zr_ckpt_meta m9 = meta_for(9);
                    zr_ckpt_save_opts o9 = {NULL, NULL, 0, -1};
                    TEST_OK(zr_ckpt_save(&w.comm, &w.engine, dir, &m9, &o9, NULL, 0));
                }
            }
            world_close(&w);
        }
    }
    snprintf(path, sizeof path, "%s/step_00000009", dir);
    world w;
    world_open(&w, W, 2);
    zr_ckpt_meta got;
    TEST_OK(zr_ckpt_load(&w.comm, &w.engine, path, &got));
    TEST_EQ_INT(check_state(&w), 0);
    TEST_EQ_INT(got.world, 3);
    world_close(&w);
    /* zr export's path: one full unit, no MPI */
    if (R == 0) {
        size_t n = zr_gpt_config_unit_numel(&CFG, 1);
        float *full = NULL;
        TEST_OK(zr_alloc_at((void **)&full, n * sizeof(float), __FILE__, __LINE__));
        TEST_OK(zr_ckpt_read_unit(path, &got, 1, full));
        long bad = 0;
        for (size_t i = 0; full != NULL && i < n; i++) {
            bad += full[i] != val(1, 0, i);
        }
        TEST_EQ_INT(bad, 0);
        zr_free(full);
        TEST_OK(zr_ckpt_verify(path));
    }
    if (R == 0) {
        printf("  saved at %d, loaded at 1..%d ranks and stages 0-3; saved at 3, loaded at %d\n", W,
               W, W);
    }
}

/* ---- forged checkpoints (rank 0) ---------------------------------------------- */

static void copy_dir(const char *from, const char *to)
{
    TEST_OK(zr_file_mkdir_p(to));
    DIR *d = opendir(from);
    TEST_CHECK(d != NULL);
    if (d == NULL) {
        return;
    }
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        if (ent->d_name[0] == '.') {
            continue;
        }
        char a[ZR_PATH_MAX], b[ZR_PATH_MAX];
        snprintf(a, sizeof a, "%s/%s", from, ent->d_name);
        snprintf(b, sizeof b, "%s/%s", to, ent->d_name);
        char *data;
        size_t n;
        TEST_OK(zr_file_read_all(a, &data, &n));
        TEST_OK(zr_file_write_atomic(b, data, n));
        zr_free(data);
    }
    closedir(d);
}

static void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        return;
    }
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        if (strcmp(ent->d_name, ".") == 0 || strcmp(ent->d_name, "..") == 0) {
            continue;
        }
        char p[ZR_PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", dir, ent->d_name);
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            remove_tree(p);
        } else {
            unlink(p);
        }
    }
    closedir(d);
    rmdir(dir);
}

/* Write text as dir's manifest with a matching COMPLETE (a checksum recomputed by hand). */
static void write_manifest(const char *dir, const char *text)
{
    char p[ZR_PATH_MAX], body[64];
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    TEST_OK(zr_file_write_atomic(p, text, strlen(text)));
    int len = snprintf(body, sizeof body, "complete manifest-crc32c %u\n",
                       zr_crc32c(0, text, strlen(text)));
    snprintf(p, sizeof p, "%s/COMPLETE", dir);
    TEST_OK(zr_file_write_atomic(p, body, (size_t)len));
}

/* The object holding the last component of a dotted path ("model.layers", "files[1].bytes"). */
static cJSON *parent_of(cJSON *root, const char *path, const char **last)
{
    static char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    cJSON *o = root;
    char *p = buf;
    for (char *dot; (dot = strchr(p, '.')) != NULL; p = dot + 1) {
        *dot = '\0';
        int idx = -1;
        char *br = strchr(p, '[');
        if (br != NULL) {
            idx = atoi(br + 1);
            *br = '\0';
        }
        o = cJSON_GetObjectItemCaseSensitive(o, p);
        if (idx >= 0) {
            o = cJSON_GetArrayItem(o, idx);
        }
    }
    *last = path + (p - buf);
    return o;
}

typedef enum edit_kind { SET, DEL, ADD, RAW, FILE_OP } edit_kind;

typedef struct forged {
    const char *name;
    edit_kind kind;
    const char *key;   /* SET/DEL/ADD: dotted path; FILE_OP: the operation */
    const char *value; /* SET/ADD: JSON text; RAW: the whole manifest */
    zr_status status;
    const char *expect; /* in the message */
} forged;

static const forged CASES[] = {
    {"huge step", SET, "step", "1e300", ZR_ERR_FORMAT, "\"step\""},
    {"step beyond 2^53", SET, "step", "9007199254740994", ZR_ERR_FORMAT, "\"step\""},
    {"step beyond 32 bits", SET, "step", "3000000000", ZR_ERR_FORMAT, "step 3000000000"},
    {"negative step", SET, "step", "-1", ZR_ERR_FORMAT, "\"step\""},
    {"fractional step", SET, "step", "6.5", ZR_ERR_FORMAT, "\"step\""},
    {"string step", SET, "step", "\"7\"", ZR_ERR_FORMAT, "\"step\" must be an integer"},
    {"missing step", DEL, "step", NULL, ZR_ERR_FORMAT, "key \"step\" is missing"},
    {"repeated step", ADD, "step", "7", ZR_ERR_FORMAT, "\"step\" appears twice"},
    {"optim_steps beyond step", SET, "optim_steps", "8", ZR_ERR_FORMAT, "\"optim_steps\""},
    {"string tokens", SET, "tokens", "\"many\"", ZR_ERR_FORMAT, "\"tokens\""},
    {"huge tokens", SET, "tokens", "1e19", ZR_ERR_FORMAT, "\"tokens\""},
    {"negative legacy data_position", ADD, "data_position", "-3", ZR_ERR_FORMAT,
     "\"data_position\""},
    {"number seed", SET, "seed", "1337", ZR_ERR_FORMAT, "\"seed\" must be a string"},
    {"non-digit seed", SET, "seed", "\"13x7\"", ZR_ERR_FORMAT, "\"seed\""},
    {"seed beyond 64 bits", SET, "seed", "\"18446744073709551616\"", ZR_ERR_FORMAT, "\"seed\""},
    {"missing seed", DEL, "seed", NULL, ZR_ERR_FORMAT, "\"seed\" is missing"},
    {"unknown key", ADD, "extra", "1", ZR_ERR_FORMAT, "unknown key \"extra\""},
    {"unknown model key", ADD, "model.dropout", "0.1", ZR_ERR_FORMAT, "\"model.dropout\""},
    {"other version", SET, "version", "2", ZR_ERR_FORMAT, "\"version\""},
    {"other format", SET, "format", "\"zr-other\"", ZR_ERR_FORMAT, "\"format\""},
    {"world size 5", SET, "world_size", "5", ZR_ERR_FORMAT, "\"world_size\" is 5"},
    {"world size 0", SET, "world_size", "0", ZR_ERR_FORMAT, "\"world_size\""},
    {"string world size", SET, "world_size", "\"4\"", ZR_ERR_FORMAT, "\"world_size\""},
    {"stage 4", SET, "plan.stage", "4", ZR_ERR_FORMAT, "\"plan.stage\""},
    {"plan not the stage's", SET, "plan.params", "\"replicated\"", ZR_ERR_FORMAT,
     "\"plan.params\""},
    {"hpz not a boolean", SET, "plan.hpz_secondary", "\"yes\"", ZR_ERR_FORMAT,
     "\"plan.hpz_secondary\""},
    {"missing model key", DEL, "model.layers", NULL, ZR_ERR_FORMAT, "\"model.layers\" is missing"},
    {"wider model", SET, "model.channels", "64", ZR_ERR_FORMAT, "\"units[0].numel\""},
    {"deeper model", SET, "model.layers", "3", ZR_ERR_FORMAT, "\"units\" lists"},
    {"heads not dividing", SET, "model.heads", "3", ZR_ERR_FORMAT, "\"model\""},
    {"huge vocab", SET, "model.vocab", "1e12", ZR_ERR_FORMAT, "\"model.vocab\""},
    {"model a string", SET, "model", "\"gpt2\"", ZR_ERR_FORMAT, "\"model\" must be an object"},
    {"unit numel a string", SET, "units[1].numel", "\"123\"", ZR_ERR_FORMAT, "\"units[1].numel\""},
    {"unit numel off by one", SET, "units[2].numel", "12929", ZR_ERR_FORMAT, "\"units[2].numel\""},
    {"missing units", DEL, "units", NULL, ZR_ERR_FORMAT, "\"units\" is missing"},
    {"file bytes off", SET, "files[1].bytes", "100", ZR_ERR_FORMAT, "\"files[1].bytes\""},
    {"file renamed", SET, "files[2].name", "\"rank_00003.bin\"", ZR_ERR_FORMAT,
     "\"files[2].name\""},
    {"negative crc", SET, "files[0].crc32c", "-1", ZR_ERR_FORMAT, "\"files[0].crc32c\""},
    {"config a string", SET, "config", "\"{}\"", ZR_ERR_FORMAT, "\"config\""},
    {"not an object", RAW, NULL, "[1, 2, 3]", ZR_ERR_FORMAT, "not a JSON object"},
    {"not JSON", RAW, NULL, "{\"format\": ", ZR_ERR_FORMAT, "not valid JSON"},
    {"step not the files'", SET, "step", "8", ZR_ERR_FORMAT, "rank_00000.bin: its header"},
    {"truncated rank file", FILE_OP, "truncate", NULL, ZR_ERR_FORMAT,
     "rank_00002.bin is truncated"},
    {"longer rank file", FILE_OP, "append", NULL, ZR_ERR_FORMAT, "rank_00001.bin is longer"},
    {"extra rank file", FILE_OP, "extra", NULL, ZR_ERR_FORMAT, "rank_00004.bin"},
    {"missing rank file", FILE_OP, "missing", NULL, ZR_ERR_IO, "rank_00003.bin"},
    {"swapped rank files", FILE_OP, "swap", NULL, ZR_ERR_FORMAT, "rank_00000.bin: its header"},
    {"rank file a FIFO", FILE_OP, "fifo", NULL, ZR_ERR_INVALID, "rank_00001.bin is a FIFO"},
    {"flipped byte", FILE_OP, "flip", NULL, ZR_ERR_FORMAT, "rank_00002.bin fails its checksum"},
    {"edited, checksum kept", FILE_OP, "edit", NULL, ZR_ERR_FORMAT, "COMPLETE"},
    {"no COMPLETE", FILE_OP, "nomarker", NULL, ZR_ERR_FORMAT, "incomplete"},
};

static void file_op(const char *dir, const char *op)
{
    char a[ZR_PATH_MAX], b[ZR_PATH_MAX];
    if (strcmp(op, "truncate") == 0) {
        snprintf(a, sizeof a, "%s/rank_00002.bin", dir);
        TEST_CHECK(truncate(a, 100) == 0);
    } else if (strcmp(op, "append") == 0) {
        snprintf(a, sizeof a, "%s/rank_00001.bin", dir);
        FILE *f = fopen(a, "ab");
        TEST_CHECK(f != NULL && fputc(0, f) == 0 && fclose(f) == 0);
    } else if (strcmp(op, "extra") == 0) {
        snprintf(a, sizeof a, "%s/rank_00000.bin", dir);
        snprintf(b, sizeof b, "%s/rank_00004.bin", dir);
        TEST_CHECK(link(a, b) == 0);
    } else if (strcmp(op, "missing") == 0) {
        snprintf(a, sizeof a, "%s/rank_00003.bin", dir);
        TEST_CHECK(unlink(a) == 0);
    } else if (strcmp(op, "swap") == 0) {
        char t[ZR_PATH_MAX];
        snprintf(a, sizeof a, "%s/rank_00000.bin", dir);
        snprintf(b, sizeof b, "%s/rank_00001.bin", dir);
        snprintf(t, sizeof t, "%s/swap", dir);
        TEST_CHECK(rename(a, t) == 0 && rename(b, a) == 0 && rename(t, b) == 0);
    } else if (strcmp(op, "fifo") == 0) {
        snprintf(a, sizeof a, "%s/rank_00001.bin", dir);
        TEST_CHECK(unlink(a) == 0 && mkfifo(a, 0644) == 0);
    } else if (strcmp(op, "flip") == 0) {
        snprintf(a, sizeof a, "%s/rank_00002.bin", dir);
        FILE *f = fopen(a, "r+b");
        TEST_CHECK(f != NULL && fseek(f, 300, SEEK_SET) == 0 && fputc(0x7f, f) == 0x7f);
        if (f != NULL) {
            fclose(f);
        }
    } else if (strcmp(op, "edit") == 0) {
        snprintf(a, sizeof a, "%s/manifest.json", dir);
        FILE *f = fopen(a, "ab");
        TEST_CHECK(f != NULL && fputc(' ', f) == ' ' && fclose(f) == 0);
    } else if (strcmp(op, "nomarker") == 0) {
        snprintf(a, sizeof a, "%s/COMPLETE", dir);
        TEST_CHECK(unlink(a) == 0);
    }
}

static void test_forged_manifests(void)
{
    if (R != 0 || W != 4) {
        return; /* the cases name rank files 0..3 of the 4-rank checkpoint */
    }
    char good[512], dir[512];
    snprintf(good, sizeof good, "%s/rs/step_00000007", work);
    snprintf(dir, sizeof dir, "%s/forged/step_00000007", work);
    char *orig;
    size_t n;
    char mpath[ZR_PATH_MAX];
    snprintf(mpath, sizeof mpath, "%s/manifest.json", good);
    TEST_OK(zr_file_read_all(mpath, &orig, &n));
    if (orig == NULL) {
        return;
    }
    /* the copy itself is valid: the cases below fail for their edit alone */
    copy_dir(good, dir);
    zr_ckpt_meta meta;
    TEST_OK(zr_ckpt_read_meta(dir, &meta));
    TEST_OK(zr_ckpt_verify(dir));
    remove_tree(dir);
    /* a manifest of an earlier zr carries "data_position" (never used): it still loads */
    copy_dir(good, dir);
    cJSON *legacy = cJSON_Parse(orig);
    cJSON_AddNumberToObject(legacy, "data_position", 21);
    char *legacy_text = cJSON_Print(legacy);
    write_manifest(dir, legacy_text);
    cJSON_free(legacy_text);
    cJSON_Delete(legacy);
    zr_ckpt_meta old;
    TEST_OK(zr_ckpt_read_meta(dir, &old));
    TEST_CHECK(old.step == meta.step && old.tokens == meta.tokens && old.seed == meta.seed);
    TEST_OK(zr_ckpt_verify(dir));
    remove_tree(dir);
    int ncases = (int)(sizeof CASES / sizeof CASES[0]);
    for (int i = 0; i < ncases; i++) {
        const forged *c = &CASES[i];
        copy_dir(good, dir);
        if (c->kind == FILE_OP) {
            file_op(dir, c->key);
        } else if (c->kind == RAW) {
            write_manifest(dir, c->value);
        } else {
            cJSON *root = cJSON_Parse(orig);
            const char *last;
            cJSON *parent = parent_of(root, c->key, &last);
            TEST_CHECKF(parent != NULL, "%s: no parent for %s", c->name, c->key);
            if (parent != NULL && c->kind == DEL) {
                cJSON_DeleteItemFromObjectCaseSensitive(parent, last);
            } else if (parent != NULL) {
                cJSON *v = cJSON_Parse(c->value);
                if (c->kind == SET) {
                    TEST_CHECK(cJSON_ReplaceItemInObjectCaseSensitive(parent, last, v));
                } else {
                    cJSON_AddItemToObject(parent, last, v);
                }
            }
            char *text = cJSON_Print(root);
            write_manifest(dir, text);
            cJSON_free(text);
            cJSON_Delete(root);
        }
        zr_error_clear();
        /* a flipped data byte passes the manifest checks; the CRC catches it */
        zr_status st = strcmp(c->name, "flipped byte") == 0 ? zr_ckpt_verify(dir)
                                                            : zr_ckpt_read_meta(dir, &meta);
        TEST_CHECKF(st == c->status, "%s: %s, expected %s (%s)", c->name, zr_status_str(st),
                    zr_status_str(c->status), zr_error_message());
        TEST_CHECKF(strstr(zr_error_message(), c->expect) != NULL, "%s: message lacks '%s': %s",
                    c->name, c->expect, zr_error_message());
        remove_tree(dir);
    }
    zr_free(orig);
    printf("  %d forged or damaged checkpoints refused, each naming its key or file\n", ncases);
}

/* ---- values that are not numbers (issue 39, item 2) ------------------------------ */

/* Byte offset in a rank file of the checkpoint saved at W ranks of element j of array k of unit u.
 */
static uint64_t rank_file_offset(int u, int k, size_t j)
{
    uint64_t off = 64; /* the header */
    for (int x = 0; x < u; x++) {
        off += 3 * (zr_zero_padded(zr_gpt_config_unit_numel(&CFG, x), W) / (size_t)W) * 4;
    }
    size_t S = zr_zero_padded(zr_gpt_config_unit_numel(&CFG, u), W) / (size_t)W;
    return off + ((uint64_t)k * S + j) * 4;
}

/*
 * value written at byte off of rank file q of the checkpoint dir, with the file's CRC trailer,
 * the manifest's CRC of the file and COMPLETE's CRC of the manifest made to match: only the
 * values themselves say that something is wrong.
 */
static void forge_value(const char *dir, int q, uint64_t off, float value)
{
    char p[ZR_PATH_MAX];
    snprintf(p, sizeof p, "%s/rank_%05d.bin", dir, q);
    char *data = NULL;
    size_t n = 0;
    TEST_OK(zr_file_read_all(p, &data, &n));
    if (data == NULL) {
        return;
    }
    memcpy(data + off, &value, sizeof value);
    uint32_t crc = zr_crc32c(0, data, n - 4);
    memcpy(data + n - 4, &crc, sizeof crc);
    TEST_OK(zr_file_write_atomic(p, data, n));
    zr_free(data);
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    TEST_OK(zr_file_read_all(p, &data, &n));
    cJSON *root = cJSON_Parse(data);
    cJSON *file = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "files"), q);
    cJSON_ReplaceItemInObject(file, "crc32c", cJSON_CreateNumber((double)crc));
    char *text = cJSON_Print(root);
    write_manifest(dir, text);
    cJSON_free(text);
    cJSON_Delete(root);
    zr_free(data);
}

/*
 * A NaN in an Adam moment and an infinity in the master weights, each in a
 * rank file whose checksums were made to match (a bad copy, an edited file,
 * a faulty writer): the manifest reads, but verifying, loading (every rank,
 * the same error) and reading a unit for export refuse, naming the file,
 * the array, the tensor and the element.
 */
static void test_nonfinite(void)
{
    char good[512], dir[512];
    snprintf(good, sizeof good, "%s/rs/step_00000007", work);
    snprintf(dir, sizeof dir, "%s/nan/step_00000007", work);
    static const struct {
        int q, u, k;
        size_t j; /* element of rank q's slice */
        float value;
        const char *expect[4];
    } cases[] = {
        /* unit 1 (layer 0): ln1w, ln1b (32 each), then qkvw: slice element 70 is its 6th */
        {0, 1, 2, 70, NAN, {"rank_00000.bin", "Adam v", "qkvw of layer 0 (unit 1), element 6"}},
        /* the last unit: lnfw (32), lnfb (32); W = 4 ranks of 16 elements: rank 2's 3rd is
           element 35 of the unit, lnfb's 3rd */
        {2, 3, 0, 3, INFINITY, {"rank_00002.bin", "master weights", "lnfb (unit 3), element 3"}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        if (R == 0) {
            copy_dir(good, dir);
            forge_value(dir, cases[c].q, rank_file_offset(cases[c].u, cases[c].k, cases[c].j),
                        cases[c].value);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        zr_status st[3] = {ZR_OK, ZR_OK, ZR_OK};
        char msg[3][1024] = {"", "", ""};
        world w;
        world_open(&w, W, 2);
        zr_ckpt_meta got;
        zr_error_clear();
        st[0] = zr_ckpt_load(&w.comm, &w.engine, dir, &got);
        snprintf(msg[0], sizeof msg[0], "%s", zr_error_message());
        world_close(&w);
        if (R == 0) {
            zr_ckpt_meta meta;
            TEST_OK(zr_ckpt_read_meta(dir, &meta)); /* the manifest is sound */
            zr_error_clear();
            st[1] = zr_ckpt_verify(dir);
            snprintf(msg[1], sizeof msg[1], "%s", zr_error_message());
            float *full = NULL;
            size_t n = zr_gpt_config_unit_numel(&CFG, cases[c].u);
            TEST_OK(zr_alloc_at((void **)&full, n * sizeof(float), __FILE__, __LINE__));
            zr_error_clear();
            st[2] = zr_ckpt_read_unit(dir, &meta, cases[c].u, full);
            snprintf(msg[2], sizeof msg[2], "%s", zr_error_message());
            zr_free(full);
        }
        for (int i = 0; i < (R == 0 ? 3 : 1); i++) {
            TEST_CHECKF(st[i] == ZR_ERR_FORMAT, "case %zu, call %d: %s (%s)", c, i,
                        zr_status_str(st[i]), msg[i]);
            for (int e = 0; e < 4 && cases[c].expect[e] != NULL; e++) {
                TEST_CHECKF(strstr(msg[i], cases[c].expect[e]) != NULL,
                            "case %zu, call %d: no '%s' in: %s", c, i, cases[c].expect[e], msg[i]);
            }
            TEST_CHECKF(strstr(msg[i], "non-finite") != NULL, "case %zu, call %d: %s", c, i,
                        msg[i]);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        if (R == 0) {
            remove_tree(dir);
        }
    }
    zr_error_clear();
    if (R == 0) {
        printf("  a NaN and an infinity with matching checksums refused by verify, load and "
               "read_unit, naming file, array, tensor and element\n");
    }
}

/* ---- the directory lock and recovery (rank 0) ------------------------------------ */

static int warnings;
static char last_warning[2 * ZR_PATH_MAX];

static void count_warning(void *ctx, const char *msg)
{
    (void)ctx;
    warnings++;
    snprintf(last_warning, sizeof last_warning, "%s", msg);
}

static int is_dir(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static void test_lock_and_recover(void)
{
    if (R != 0) {
        return;
    }
    char dir[512], p[ZR_PATH_MAX];
    snprintf(dir, sizeof dir, "%s/locked", work);
    zr_ckpt_dir_lock a, b;
    TEST_OK(zr_ckpt_lock(dir, &a));
    TEST_CHECK(a.fd >= 0);
    /* flock is per open file: a second open in the same process conflicts too */
    char pid[32];
    snprintf(pid, sizeof pid, "pid %ld on host", (long)getpid());
    TEST_FAILS(zr_ckpt_lock(dir, &b), ZR_ERR_INVALID, pid);
    TEST_CHECK(strstr(zr_error_message(), "in use by another zr train") != NULL);
    zr_ckpt_unlock(&a);
    TEST_OK(zr_ckpt_lock(dir, &b));
    /* issue 39 item 5: the folder deleted or replaced under its holder is told apart */
    TEST_OK(zr_ckpt_lock_check(dir, &b));
    char moved[600];
    snprintf(moved, sizeof moved, "%s.moved", dir);
    TEST_CHECK(rename(dir, moved) == 0);
    TEST_OK(zr_file_mkdir_p(dir));
    TEST_FAILS(zr_ckpt_lock_check(dir, &b), ZR_ERR_IO,
               "was deleted, moved or replaced while this run held it");
    TEST_CHECK(rmdir(dir) == 0 && rename(moved, dir) == 0);
    TEST_OK(zr_ckpt_lock_check(dir, &b));
    snprintf(p, sizeof p, "%s/%s", dir, ZR_CKPT_LOCK_FILE);
    TEST_CHECK(unlink(p) == 0);
    TEST_FAILS(zr_ckpt_lock_check(dir, &b), ZR_ERR_IO, "zr.lock was deleted or moved away");
    zr_ckpt_unlock(&b);

    /* what crashed saves leave: recover clears each with a warning */
    const char *made[] = {"step_00000003.partial", "step_00000001.deleting", "step_00000002"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, made[i]);
        TEST_OK(zr_file_mkdir_p(p));
        snprintf(p, sizeof p, "%s/%s/rank_00000.bin", dir, made[i]);
        TEST_OK(zr_file_write_atomic(p, "x", 1));
    }
    warnings = 0;
    TEST_OK(zr_ckpt_recover(dir, count_warning, NULL));
    TEST_EQ_INT(warnings, 3);
    snprintf(p, sizeof p, "%s/step_00000003.partial", dir);
    TEST_CHECK(!is_dir(p));
    snprintf(p, sizeof p, "%s/step_00000001.deleting", dir);
    TEST_CHECK(!is_dir(p));
    snprintf(p, sizeof p, "%s/step_00000002", dir);
    TEST_CHECK(!is_dir(p));
    snprintf(p, sizeof p, "%s/step_00000002.incomplete/rank_00000.bin", dir);
    TEST_CHECKF(access(p, F_OK) == 0, "the incomplete checkpoint was not moved aside whole");
    /* nothing left to do: no warning */
    warnings = 0;
    TEST_OK(zr_ckpt_recover(dir, count_warning, NULL));
    TEST_EQ_INT(warnings, 0);

    /* the newest intact checkpoint and setting newer ones aside */
    char rs[512], path[ZR_PATH_MAX];
    int found = 0;
    snprintf(rs, sizeof rs, "%s/rs", work);
    TEST_OK(zr_ckpt_find_intact(rs, 9, path, sizeof path, &found));
    TEST_CHECK(found && strstr(path, "step_00000007") != NULL);
    TEST_OK(zr_ckpt_find_intact(rs, 7, path, sizeof path, &found));
    TEST_CHECK(!found);
    warnings = 0;
    TEST_OK(zr_ckpt_set_aside_after(rs, 7, count_warning, NULL));
    TEST_EQ_INT(warnings, 1);
    snprintf(p, sizeof p, "%s/step_00000009.set-aside", rs);
    TEST_CHECK(is_dir(p));
    TEST_OK(zr_ckpt_find_latest(rs, path, sizeof path, &found, count_warning, NULL));
    TEST_CHECK(found && strstr(path, "step_00000007") != NULL);
}

/* ---- a checkpoint is known by what it holds ------------------------------------------ */

static void keep_warning(void *ctx, const char *msg)
{
    (*(int *)ctx)++;
    snprintf(last_warning, sizeof last_warning, "%s", msg);
}

/* Save the filled state of w as step under dir (collective); keep/protect as rotation asks. */
static void save_at(world *w, const char *dir, int64_t step, int keep, int64_t protect)
{
    zr_ckpt_meta m = meta_for(step);
    zr_ckpt_save_opts o = {NULL, NULL, keep, protect};
    TEST_OK(zr_ckpt_save(&w->comm, &w->engine, dir, &m, &o, NULL, 0));
}

static int exists_in(const char *dir, const char *name)
{
    char p[ZR_PATH_MAX];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return lstat(p, &sb) == 0;
}

/* The newest checkpoint of dir by zr_ckpt_find_latest ("" if none); *warned counts reports. */
static void latest(const char *dir, char *name, size_t n, int *warned)
{
    char path[ZR_PATH_MAX];
    int found = 0;
    *warned = 0;
    last_warning[0] = '\0';
    TEST_OK(zr_ckpt_find_latest(dir, path, sizeof path, &found, keep_warning, warned));
    const char *slash = strrchr(path, '/');
    snprintf(name, n, "%s", found && slash != NULL ? slash + 1 : "");
}

/*
 * Issue 25 item 2: what stands in a checkpoint dir under a checkpoint's name
 * is a checkpoint only when its checked manifest says that step. A copy of
 * step 10 named step_00000030, a folder step_2147483648 holding step 20 and a
 * link step_00000040 -> step_00000010 are reported, never taken as the
 * newest, never rotated away; rotation deletes only zr's checkpoints older
 * than the one just written, never a newer one, never the one protected (a
 * resume's own). A damaged folder newer than every checkpoint is taken, so
 * that loading it says why.
 */
static void test_identity(void)
{
    char dir[512], name[64];
    snprintf(dir, sizeof dir, "%s/ident", work);
    world w;
    world_open(&w, W, 3);
    fill(&w);
    save_at(&w, dir, 10, 0, -1);
    save_at(&w, dir, 20, 0, -1);
    int warned = 0;
    if (R == 0) {
        char a[ZR_PATH_MAX], b[ZR_PATH_MAX];
        snprintf(a, sizeof a, "%s/step_00000010", dir);
        snprintf(b, sizeof b, "%s/step_00000030", dir);
        copy_dir(a, b);
        snprintf(a, sizeof a, "%s/step_00000020", dir);
        snprintf(b, sizeof b, "%s/step_2147483648", dir);
        copy_dir(a, b);
        snprintf(b, sizeof b, "%s/step_00000040", dir);
        TEST_CHECK(symlink("step_00000010", b) == 0);
        latest(dir, name, sizeof name, &warned);
        TEST_CHECKF(strcmp(name, "step_00000020") == 0, "newest is %s", name);
        TEST_EQ_INT(warned, 3);
        TEST_CHECKF(strstr(last_warning, "left alone") != NULL, "%s", last_warning);
        /* the newest intact one before 30 is 20, not the copy */
        char path[ZR_PATH_MAX];
        int found = 0;
        TEST_OK(zr_ckpt_find_intact(dir, -1, path, sizeof path, &found));
        TEST_CHECKF(found && strstr(path, "step_00000020") != NULL, "%s", path);
    }
    /* rotation keeps 1: the real 10 and 20 go, the foreign entries stay */
    save_at(&w, dir, 50, 1, -1);
    if (R == 0) {
        TEST_CHECK(!exists_in(dir, "step_00000010") && !exists_in(dir, "step_00000020"));
        TEST_CHECK(exists_in(dir, "step_00000030") && exists_in(dir, "step_2147483648") &&
                   exists_in(dir, "step_00000040") && exists_in(dir, "step_00000050"));
    }
    /* a resumed run protects its checkpoint; a newer one is never deleted */
    save_at(&w, dir, 70, 0, -1);
    save_at(&w, dir, 60, 1, 50);
    if (R == 0) {
        TEST_CHECK(exists_in(dir, "step_00000050") && exists_in(dir, "step_00000060") &&
                   exists_in(dir, "step_00000070"));
        latest(dir, name, sizeof name, &warned);
        TEST_CHECKF(strcmp(name, "step_00000070") == 0, "newest is %s", name);
        /* setting aside after 55 moves 60 and 70, never the foreign copies */
        int moved = 0;
        TEST_OK(zr_ckpt_set_aside_after(dir, 55, keep_warning, &moved));
        TEST_EQ_INT(moved, 2);
        TEST_CHECK(exists_in(dir, "step_00000030") && exists_in(dir, "step_2147483648") &&
                   exists_in(dir, "step_00000040"));
        /* a damaged manifest under a checkpoint's name, newest by its name: taken, so that
           loading it reports why (and the newest intact one is found before it) */
        char a[ZR_PATH_MAX], b[ZR_PATH_MAX];
        snprintf(a, sizeof a, "%s/step_00000050", dir);
        snprintf(b, sizeof b, "%s/step_00000080", dir);
        copy_dir(a, b);
        snprintf(a, sizeof a, "%s/manifest.json", b);
        FILE *f = fopen(a, "a");
        TEST_CHECK(f != NULL && fputs(" ", f) >= 0);
        if (f != NULL) {
            fclose(f);
        }
        latest(dir, name, sizeof name, &warned);
        TEST_CHECKF(strcmp(name, "step_00000080") == 0, "newest is %s", name);
        zr_ckpt_meta meta;
        TEST_FAILS(zr_ckpt_read_meta(b, &meta), ZR_ERR_FORMAT, "checksum in its COMPLETE");
        char path[ZR_PATH_MAX];
        int found = 0;
        TEST_OK(zr_ckpt_find_intact(dir, 80, path, sizeof path, &found));
        TEST_CHECKF(found && strstr(path, "step_00000050") != NULL, "%s", path);
        printf("  a copy, a rename and a link under checkpoint names: reported, never newest, "
               "never rotated; rotation spares newer and protected checkpoints\n");
    }
    world_close(&w);
    zr_error_clear();
}

/* ---- zr deletes only what it wrote ------------------------------------------------------- */

static void put_file(const char *dir, const char *name, const char *text)
{
    char p[ZR_PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    zr_test_write_file(p, text, strlen(text));
}

static int holds(const char *dir, const char *name, const char *text)
{
    char p[ZR_PATH_MAX], buf[64] = "";
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "r");
    size_t n = f != NULL ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f != NULL) {
        fclose(f);
    }
    buf[n] = '\0';
    return f != NULL && strcmp(buf, text) == 0;
}

/*
 * Issue 39 item 4: rotation removes only the files its manifest lists. A user's file, folder,
 * link and a rank file the manifest does not list, put in a checkpoint that rotation takes out,
 * stay (and the link's target), in the folder renamed step_N.user-files; a crashed save's or an
 * interrupted rotation's leftover likewise; a step_N.partial that is a link to a user's folder
 * is never followed (the old removal emptied the folder it points to).
 */
static void test_rotation_keeps_user_files(void)
{
    char dir[512], a[ZR_PATH_MAX], b[ZR_PATH_MAX], victim[512];
    snprintf(dir, sizeof dir, "%s/own", work);
    snprintf(victim, sizeof victim, "%s/victim", work);
    world w;
    world_open(&w, W, 3);
    fill(&w);
    save_at(&w, dir, 10, 0, -1);
    if (R == 0) {
        snprintf(a, sizeof a, "%s/step_00000010", dir);
        put_file(a, "notes.txt", "mine");
        put_file(a, "rank_00009.bin", "not listed"); /* the manifest lists 4 rank files */
        snprintf(b, sizeof b, "%s/eval", a);
        TEST_OK(zr_file_mkdir_p(b));
        put_file(b, "scores.txt", "0.5");
        TEST_OK(zr_file_mkdir_p(victim));
        put_file(victim, "keep.txt", "theirs");
        snprintf(b, sizeof b, "%s/link", a);
        TEST_CHECK(symlink(victim, b) == 0);
    }
    save_at(&w, dir, 20, 1, -1);
    if (R == 0) {
        snprintf(a, sizeof a, "%s/step_00000010.user-files", dir);
        TEST_CHECK(!exists_in(dir, "step_00000010") && !exists_in(dir, "step_00000010.deleting"));
        TEST_CHECKF(holds(a, "notes.txt", "mine") && holds(a, "rank_00009.bin", "not listed") &&
                        holds(a, "eval/scores.txt", "0.5") && exists_in(a, "link") &&
                        holds(victim, "keep.txt", "theirs"),
                    "a user's file in a rotated checkpoint is gone");
        TEST_CHECK(!exists_in(a, "manifest.json") && !exists_in(a, "COMPLETE") &&
                   !exists_in(a, "rank_00000.bin") && !exists_in(a, "rank_00003.bin"));
        TEST_CHECK(exists_in(dir, "step_00000020"));
        /* a link under a crashed save's name is not followed into the folder it names */
        snprintf(b, sizeof b, "%s/step_00000030.partial", dir);
        TEST_CHECK(symlink(victim, b) == 0);
    }
    zr_ckpt_meta m = meta_for(30);
    zr_ckpt_save_opts o = {NULL, NULL, 1, -1};
    TEST_CHECK(zr_ckpt_save(&w.comm, &w.engine, dir, &m, &o, NULL, 0) != ZR_OK);
    zr_error_clear();
    if (R == 0) {
        TEST_CHECKF(holds(victim, "keep.txt", "theirs"), "removed through a link");
        snprintf(b, sizeof b, "%s/step_00000030.partial", dir);
        TEST_CHECK(unlink(b) == 0);
        /* leftovers of a crashed save and an interrupted rotation holding a user's file */
        const char *left[] = {"step_00000040.partial", "step_00000005.deleting"};
        for (int i = 0; i < 2; i++) {
            snprintf(a, sizeof a, "%s/%s", dir, left[i]);
            TEST_OK(zr_file_mkdir_p(a));
            put_file(a, "rank_00000.bin", "x");
            put_file(a, "rank_00001.bin.tmp-123-4abc0f", "x");
            put_file(a, "mine.txt", "kept");
        }
        warnings = 0;
        TEST_OK(zr_ckpt_recover(dir, count_warning, NULL));
        TEST_EQ_INT(warnings, 2);
        TEST_CHECKF(strstr(last_warning, "mine.txt, which zr did not write") != NULL, "%s",
                    last_warning);
        const char *kept[] = {"step_00000040.user-files", "step_00000005.user-files"};
        for (int i = 0; i < 2; i++) {
            snprintf(a, sizeof a, "%s/%s", dir, kept[i]);
            TEST_CHECKF(holds(a, "mine.txt", "kept") && !exists_in(a, "rank_00000.bin") &&
                            !exists_in(a, "rank_00001.bin.tmp-123-4abc0f"),
                        "%s", kept[i]);
        }
        printf("  a user's file, folder and link in a rotated checkpoint or a leftover stay, "
               "in step_N.user-files; a link is never followed\n");
    }
    world_close(&w);
    zr_error_clear();
}

int main(int argc, char **argv)
{
    zr_test_mpi_init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    zr_gpt_set_threads(1);
    if (R == 0) {
        snprintf(work, sizeof work, "/tmp/zr-test-ckpt-XXXXXX");
        if (mkdtemp(work) == NULL) {
            fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    MPI_Bcast(work, sizeof work, MPI_CHAR, 0, MPI_COMM_WORLD);
    TEST_RUN(test_reshard);
    TEST_RUN(test_forged_manifests);
    TEST_RUN(test_nonfinite);
    TEST_RUN(test_lock_and_recover);
    TEST_RUN(test_identity);
    TEST_RUN(test_rotation_keeps_user_files);
    if (R == 0) {
        if (zr_test_failed == 0) {
            remove_tree(work);
        } else {
            printf("work directory kept: %s\n", work);
        }
    }
    return zr_test_finish();
}
