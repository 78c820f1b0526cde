/*
 * manifest.c - a checkpoint's manifest.json: writing it, and reading it back
 * with every field checked (see zr/checkpoint.h and ckpt_impl.h).
 *
 * A manifest is trusted only as far as it is checked: its checksum can be
 * recomputed by anyone, so every field is checked for its JSON type and
 * range and cross-checked against the model and the unit layout before a
 * single byte of state is used. Each section of the manifest (the top-level
 * counts, "plan", "model", "units", "files", "config") has its own reader
 * below; read_fields calls them in order.
 */
#include "ckpt_impl.h"

#include "zr/file.h"

#include <cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Largest integer a manifest may hold: every integer up to it is exact in a
 * JSON number read as a double (RFC 7493), so no count is ever rounded. */
#define MAX_EXACT 9007199254740992.0 /* 2^53 */

static const char *placement_name(zr_placement p)
{
    return p == ZR_SHARDED ? "sharded" : "replicated";
}

/*
 * Fill the slice sizes and file offsets of every unit for world W; *bytes =
 * the size of one rank file. Fails (no overflow) on a layout too large to
 * be a file.
 */
static zr_status layout_fill(zr_ckpt_unit_layout *lay, int nunits, int world, uint64_t *bytes)
{
    uint64_t off = ZR_CKPT_HEADER_BYTES;
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

/* ---- writing ---------------------------------------------------------------------- */

static cJSON *model_json(const zr_gpt_config *m)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "max_t", m->max_t);
    cJSON_AddNumberToObject(o, "vocab", m->vocab);
    cJSON_AddNumberToObject(o, "padded_vocab", m->padded_vocab);
    cJSON_AddNumberToObject(o, "layers", m->layers);
    cJSON_AddNumberToObject(o, "heads", m->heads);
    cJSON_AddNumberToObject(o, "channels", m->channels);
    if (m->arch == ZR_ARCH_LLAMA) {
        cJSON_AddStringToObject(o, "arch", "llama");
        cJSON_AddItemToObject(o, "llama", zr_ckpt_llama_json(&m->llama));
    }
    return o;
}

static cJSON *plan_json(const zr_zero_plan *p)
{
    cJSON *plan = cJSON_CreateObject();
    cJSON_AddNumberToObject(plan, "stage", p->stage);
    cJSON_AddStringToObject(plan, "params", placement_name(p->params));
    cJSON_AddStringToObject(plan, "grads", placement_name(p->grads));
    cJSON_AddStringToObject(plan, "optimizer", placement_name(p->optim));
    cJSON_AddBoolToObject(plan, "hpz_secondary", p->secondary);
    cJSON_AddStringToObject(
        plan, "file_slices",
        "rank r holds [r*shard, (r+1)*shard) of each padded unit at every stage");
    return plan;
}

static cJSON *files_json(int world, const uint32_t *crcs, const uint64_t *bytes)
{
    cJSON *files = cJSON_CreateArray();
    for (int r = 0; r < world; r++) {
        cJSON *o = cJSON_CreateObject();
        char name[64];
        snprintf(name, sizeof name, "rank_%05d.bin", r);
        cJSON_AddStringToObject(o, "name", name);
        cJSON_AddNumberToObject(o, "bytes", (double)bytes[r]);
        cJSON_AddNumberToObject(o, "crc32c", (double)crcs[r]);
        cJSON_AddItemToArray(files, o);
    }
    return files;
}

char *zr_ckpt_manifest_text(zr_engine *e, const zr_ckpt_meta *meta, const zr_ckpt_save_opts *o,
                            const uint32_t *crcs, const uint64_t *bytes)
{
    int W = e->comm->size[ZR_GROUP_WORLD];
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", "zr-checkpoint");
    cJSON_AddNumberToObject(root, "version", ZR_CKPT_VERSION);
    cJSON_AddNumberToObject(root, "step", (double)meta->step);
    cJSON_AddNumberToObject(root, "optim_steps", (double)meta->optim_steps);
    cJSON_AddNumberToObject(root, "tokens", (double)meta->tokens);
    char seed[32];
    snprintf(seed, sizeof seed, "%" PRIu64, meta->seed);
    cJSON_AddStringToObject(root, "seed", seed);
    cJSON_AddNumberToObject(root, "world_size", W);
    cJSON_AddItemToObject(root, "plan", plan_json(&e->plan));
    cJSON_AddItemToObject(root, "model", model_json(&meta->model));
    cJSON *units = cJSON_AddArrayToObject(root, "units");
    for (int u = 0; u < e->nunits; u++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "numel", (double)zr_engine_numel(e, u));
        cJSON_AddItemToArray(units, o);
    }
    if (zr_ckpt_feedback_saved(e)) {
        cJSON_AddItemToObject(root, "qgz_feedback", zr_ckpt_feedback_json(e));
    }
    cJSON_AddItemToObject(root, "files", files_json(W, crcs, bytes));
    if (meta->data[0] != '\0') {
        cJSON_AddStringToObject(root, "data", meta->data);
    }
    if (o->history_json != NULL) {
        cJSON *h = cJSON_Parse(o->history_json);
        if (cJSON_IsArray(h)) {
            cJSON_AddItemToObject(root, "resumes", h);
        } else {
            cJSON_Delete(h);
        }
    }
    if (o->config_json != NULL) {
        cJSON *cfg = cJSON_Parse(o->config_json);
        if (cfg != NULL) {
            cJSON_AddItemToObject(root, "config", cfg);
        }
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    return text;
}

/* ---- typed access to JSON values ---------------------------------------------------- */

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

/* ---- the sections, one reader each ----------------------------------------------------- */

/*
 * Top level: format, version, step, optim_steps, tokens, seed, world_size.
 * "data_position" (batches consumed) was written by earlier versions and never
 * used: an old manifest that has it still loads, it is checked and ignored.
 */
static zr_status read_top(const cJSON *root, const char *mpath, zr_ckpt_meta *meta)
{
    int64_t v = 0;
    const char *s;
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
    if (cJSON_GetObjectItemCaseSensitive(root, "data_position") != NULL) {
        ZR_CHECK(json_int(root, "", "data_position", mpath, 0, MAX_EXACT, &v));
    }
    ZR_CHECK(json_int(root, "", "tokens", mpath, 0, MAX_EXACT, &v));
    meta->tokens = (uint64_t)v;
    ZR_CHECK(json_str(root, "", "seed", mpath, &s));
    ZR_CHECK(parse_seed(s, mpath, &meta->seed));
    ZR_CHECK(json_int(root, "", "world_size", mpath, 1, 1 << 20, &v));
    meta->world = (int)v;
    return ZR_OK;
}

/* "plan": the stage, and placements that are the stage's (they are not free choices). */
static zr_status read_plan(const cJSON *root, const char *mpath, zr_ckpt_meta *meta)
{
    static const char *const plan_keys[] = {"stage",         "params",      "grads", "optimizer",
                                            "hpz_secondary", "file_slices", NULL};
    int64_t v = 0;
    const char *s;
    const cJSON *plan = cJSON_GetObjectItemCaseSensitive(root, "plan");
    ZR_CHECK(json_kind_is(plan, is_object, "an object", mpath, "plan"));
    ZR_CHECK(only_keys(plan, "plan", plan_keys, mpath));
    ZR_CHECK(json_int(plan, "plan", "stage", mpath, 0, 3, &v));
    meta->stage = (int)v;
    const cJSON *hpz = cJSON_GetObjectItemCaseSensitive(plan, "hpz_secondary");
    ZR_CHECK(json_kind_is(hpz, is_bool, "a boolean", mpath, "plan.hpz_secondary"));
    zr_zero_plan preset = zr_zero_plan_preset(meta->stage, cJSON_IsTrue(hpz));
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
    return ZR_OK;
}

/* "model": six dimensions that make a GPT-2; a Llama ("arch": "llama") adds its shape. */
static zr_status read_model(const cJSON *root, const char *mpath, zr_gpt_config *model)
{
    static const char *const model_keys[] = {"max_t",    "vocab", "padded_vocab", "layers", "heads",
                                             "channels", "arch",  "llama",        NULL};
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, "model");
    ZR_CHECK(json_kind_is(o, is_object, "an object", mpath, "model"));
    ZR_CHECK(only_keys(o, "model", model_keys, mpath));
    int *dims[] = {&model->max_t,  &model->vocab, &model->padded_vocab,
                   &model->layers, &model->heads, &model->channels};
    for (int i = 0; i < 6; i++) {
        int64_t v = 0;
        ZR_CHECK(json_int(o, "model", model_keys[i], mpath, 1, 1 << 24, &v));
        *dims[i] = (int)v;
    }
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(o, "arch");
    if (arch != NULL || cJSON_GetObjectItemCaseSensitive(o, "llama") != NULL) {
        if (!cJSON_IsString(arch) || strcmp(arch->valuestring, "llama") != 0) {
            ZR_FAIL(ZR_ERR_FORMAT,
                    "%s: \"model.arch\" is \"llama\" with \"model.llama\", or neither", mpath);
        }
        model->arch = ZR_ARCH_LLAMA;
        ZR_CHECK(
            zr_ckpt_llama_read(cJSON_GetObjectItemCaseSensitive(o, "llama"), mpath, &model->llama));
    }
    if (model->layers > 1 << 16) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: \"model.layers\" is %d, more than zr builds (65536)", mpath,
                model->layers);
    }
    if (zr_gpt_config_check(model) != ZR_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", zr_error_message());
        ZR_FAIL(ZR_ERR_FORMAT, "%s: \"model\" is not a valid GPT: %s", mpath, why);
    }
    return ZR_OK;
}

/* "units": the model's units, in order, with the model's sizes; fills the layout. */
static zr_status read_units(const cJSON *root, const char *mpath, zr_ckpt_manifest *m)
{
    static const char *const unit_keys[] = {"numel", NULL};
    const zr_gpt_config *model = &m->meta.model;
    const cJSON *units = cJSON_GetObjectItemCaseSensitive(root, "units");
    ZR_CHECK(json_kind_is(units, is_array, "an array", mpath, "units"));
    m->nunits = cJSON_GetArraySize(units);
    if (m->nunits != zr_gpt_config_unit_count(model)) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: \"units\" lists %d units; a model of %d layers has %d", mpath,
                m->nunits, model->layers, zr_gpt_config_unit_count(model));
    }
    ZR_ALLOC(m->lay, (size_t)m->nunits);
    int u = 0;
    for (const cJSON *it = units->child; it != NULL; it = it->next, u++) {
        char obj[32];
        int64_t v = 0;
        snprintf(obj, sizeof obj, "units[%d]", u);
        ZR_CHECK(json_kind_is(it, is_object, "an object", mpath, obj));
        ZR_CHECK(only_keys(it, obj, unit_keys, mpath));
        ZR_CHECK(json_int(it, obj, "numel", mpath, 1, MAX_EXACT, &v));
        size_t want = zr_gpt_config_unit_numel(model, u);
        if ((uint64_t)v != (uint64_t)want) {
            ZR_FAIL(ZR_ERR_FORMAT, "%s: \"%s.numel\" is %lld; the model says unit %d has %zu",
                    mpath, obj, (long long)v, u, want);
        }
        m->lay[u].numel = want;
    }
    if (layout_fill(m->lay, m->nunits, m->meta.world, &m->file_bytes) != ZR_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", zr_error_message());
        ZR_FAIL(ZR_ERR_FORMAT, "%s: %s", mpath, why);
    }
    return ZR_OK;
}

/*
 * "qgz_feedback" (optional): qgZ's residuals at the end of each rank file,
 * of a layout that divides the world size, each unit's none or all of them
 * (hop 0: W*S, hop 1: N*S); extends the layout and the rank files' size.
 */
static zr_status read_feedback(const cJSON *root, const char *mpath, zr_ckpt_manifest *m)
{
    static const char *const fb_keys[] = {"ranks_per_node", "bits", "group", "units", NULL};
    static const char *const unit_keys[] = {"hop0", "hop1", NULL};
    const cJSON *fb = cJSON_GetObjectItemCaseSensitive(root, "qgz_feedback");
    if (fb == NULL) {
        return ZR_OK;
    }
    int64_t D = 0, bits = 0, group = 0, W = m->meta.world;
    ZR_CHECK(json_kind_is(fb, is_object, "an object", mpath, "qgz_feedback"));
    ZR_CHECK(only_keys(fb, "qgz_feedback", fb_keys, mpath));
    ZR_CHECK(json_int(fb, "qgz_feedback", "ranks_per_node", mpath, 1, (double)W, &D));
    ZR_CHECK(json_int(fb, "qgz_feedback", "bits", mpath, 4, 8, &bits));
    ZR_CHECK(json_int(fb, "qgz_feedback", "group", mpath, 8, 65536, &group));
    if (W % D != 0) {
        ZR_FAIL(ZR_ERR_FORMAT,
                "%s: \"qgz_feedback.ranks_per_node\" (%lld) does not divide "
                "\"world_size\" (%lld)",
                mpath, (long long)D, (long long)W);
    }
    const cJSON *units = cJSON_GetObjectItemCaseSensitive(fb, "units");
    ZR_CHECK(json_kind_is(units, is_array, "an array", mpath, "qgz_feedback.units"));
    if (cJSON_GetArraySize(units) != m->nunits) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: \"qgz_feedback.units\" lists %d units, \"units\" %d", mpath,
                cJSON_GetArraySize(units), m->nunits);
    }
    uint64_t off = m->file_bytes - sizeof(uint32_t);
    int u = 0;
    for (const cJSON *it = units->child; it != NULL; it = it->next, u++) {
        char obj[48];
        snprintf(obj, sizeof obj, "qgz_feedback.units[%d]", u);
        ZR_CHECK(json_kind_is(it, is_object, "an object", mpath, obj));
        ZR_CHECK(only_keys(it, obj, unit_keys, mpath));
        m->lay[u].fb_offset = off;
        for (int hop = 0; hop < 2; hop++) {
            int64_t v = 0;
            size_t all = m->lay[u].shard * (size_t)(hop == 0 ? W : W / D);
            ZR_CHECK(json_int(it, obj, unit_keys[hop], mpath, 0, MAX_EXACT, &v));
            if (v != 0 && (uint64_t)v != (uint64_t)all) {
                ZR_FAIL(ZR_ERR_FORMAT, "%s: \"%s.%s\" is %lld; the layout has 0 or %zu", mpath, obj,
                        unit_keys[hop], (long long)v, all);
            }
            m->lay[u].fb[hop] = (size_t)v;
            off += (uint64_t)v * sizeof(float);
        }
    }
    m->fb = (zr_ckpt_feedback){1, (int)D, (int)bits, (int)group};
    m->file_bytes = off + sizeof(uint32_t);
    return ZR_OK;
}

/* "files": one entry per rank, in order, each with the size the layout implies and a CRC. */
static zr_status read_files(const cJSON *root, const char *mpath, zr_ckpt_manifest *m)
{
    static const char *const file_keys[] = {"name", "bytes", "crc32c", NULL};
    int world = m->meta.world;
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    ZR_CHECK(json_kind_is(files, is_array, "an array", mpath, "files"));
    if (cJSON_GetArraySize(files) != world) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: \"files\" lists %d rank files; \"world_size\" is %d", mpath,
                cJSON_GetArraySize(files), world);
    }
    ZR_ALLOC(m->crcs, (size_t)world);
    int r = 0;
    for (const cJSON *it = files->child; it != NULL; it = it->next, r++) {
        char obj[32], name[32];
        const char *s;
        int64_t v = 0;
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
    return ZR_OK;
}

/*
 * "config" (optional): the run's configuration, which a resume compares
 * with its own; "data" (optional): what the run trained on; "resumes"
 * (optional): one object per resume that led to this state.
 */
static zr_status read_config(const cJSON *root, const char *mpath, zr_ckpt_meta *meta)
{
    static const char *const resume_keys[] = {"step", "from", "changed", NULL};
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(root, "config");
    if (cfg != NULL && !cJSON_IsObject(cfg)) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: \"config\" must be an object, not %s", mpath, json_kind(cfg));
    }
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(root, "data");
    if (data != NULL) {
        if (!cJSON_IsString(data) || strlen(data->valuestring) >= sizeof meta->data) {
            ZR_FAIL(ZR_ERR_FORMAT, "%s: \"data\" must be a string of at most %zu characters", mpath,
                    sizeof meta->data - 1);
        }
        snprintf(meta->data, sizeof meta->data, "%s", data->valuestring);
    }
    const cJSON *res = cJSON_GetObjectItemCaseSensitive(root, "resumes");
    if (res == NULL) {
        return ZR_OK;
    }
    ZR_CHECK(json_kind_is(res, is_array, "an array", mpath, "resumes"));
    int i = 0;
    for (const cJSON *it = res->child; it != NULL; it = it->next, i++) {
        char obj[32];
        int64_t v = 0;
        const char *from;
        snprintf(obj, sizeof obj, "resumes[%d]", i);
        ZR_CHECK(json_kind_is(it, is_object, "an object", mpath, obj));
        ZR_CHECK(only_keys(it, obj, resume_keys, mpath));
        ZR_CHECK(json_int(it, obj, "step", mpath, 0, MAX_EXACT, &v));
        ZR_CHECK(json_str(it, obj, "from", mpath, &from));
        char key[48];
        snprintf(key, sizeof key, "%s.changed", obj);
        ZR_CHECK(json_kind_is(cJSON_GetObjectItemCaseSensitive(it, "changed"), is_object,
                              "an object", mpath, key));
    }
    return ZR_OK;
}

/* The manifest's sections, in the order of their dependencies (units need model and world). */
static zr_status read_fields(const cJSON *root, const char *mpath, zr_ckpt_manifest *m)
{
    static const char *const top_keys[] = {
        "format",     "version",      "step",  "optim_steps", "data_position", "tokens", "seed",
        "world_size", "plan",         "model", "units",       "files",         "config", "data",
        "resumes",    "qgz_feedback", NULL};
    if (!cJSON_IsObject(root)) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s is not a JSON object", mpath);
    }
    ZR_CHECK(only_keys(root, "", top_keys, mpath));
    ZR_CHECK(read_top(root, mpath, &m->meta));
    ZR_CHECK(read_plan(root, mpath, &m->meta));
    ZR_CHECK(read_model(root, mpath, &m->meta.model));
    ZR_CHECK(read_units(root, mpath, m));
    ZR_CHECK(read_feedback(root, mpath, m));
    ZR_CHECK(read_files(root, mpath, m));
    ZR_CHECK(read_config(root, mpath, &m->meta));
    return ZR_OK;
}

/* ---- reading the file ----------------------------------------------------------------- */

/* path is a checkpoint folder with a COMPLETE marker (else: what it is instead). */
static zr_status check_complete(const char *path, const char *mpath, const char *marker)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        ZR_FAIL(ZR_ERR_IO, "checkpoint %s does not exist", path);
    }
    if (!S_ISDIR(sb.st_mode)) {
        ZR_FAIL(ZR_ERR_INVALID, "%s is not a checkpoint (a step_N folder)", path);
    }
    if (!zr_ckpt_exists(marker)) {
        if (!zr_ckpt_exists(mpath)) {
            ZR_FAIL(ZR_ERR_INVALID, "%s is not a checkpoint (no manifest.json, no COMPLETE)", path);
        }
        ZR_FAIL(ZR_ERR_FORMAT,
                "checkpoint %s is incomplete (no COMPLETE marker): it was being written when "
                "the job stopped",
                path);
    }
    return ZR_OK;
}

void zr_ckpt_manifest_free(zr_ckpt_manifest *m)
{
    zr_free(m->lay);
    zr_free(m->crcs);
    m->lay = NULL;
    m->crcs = NULL;
}

zr_status zr_ckpt_manifest_read(const char *path, zr_ckpt_manifest *m)
{
    return zr_ckpt_manifest_read_section(path, m, NULL, NULL);
}

/* The section of root as unformatted text in counted memory (NULL when absent). */
static zr_status section_text(const cJSON *root, const char *section, char **out)
{
    *out = NULL;
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, section);
    if (it == NULL) {
        return ZR_OK;
    }
    char *text = cJSON_PrintUnformatted(it);
    if (text == NULL) {
        ZR_FAIL(ZR_ERR_NOMEM, "out of memory reading the manifest's \"%s\"", section);
    }
    size_t n = strlen(text) + 1;
    zr_status st = ZR_OK;
    ZR_ALLOC_GOTO(*out, n, st, done);
    memcpy(*out, text, n);
done:
    cJSON_free(text);
    return st;
}

zr_status zr_ckpt_manifest_read_section(const char *path, zr_ckpt_manifest *m, const char *section,
                                        char **out)
{
    if (out != NULL) {
        *out = NULL;
    }
    memset(m, 0, sizeof *m);
    char mpath[ZR_PATH_MAX], marker[ZR_PATH_MAX];
    ZR_CHECK(zr_ckpt_pathf(mpath, sizeof mpath, "%s/manifest.json", path));
    ZR_CHECK(zr_ckpt_pathf(marker, sizeof marker, "%s/COMPLETE", path));
    ZR_CHECK(check_complete(path, mpath, marker));
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
        ZR_FAIL_GOTO(st, fail, ZR_ERR_FORMAT,
                     "%s does not match the checksum in its COMPLETE marker: the manifest "
                     "was modified or damaged",
                     mpath);
    }
    root = cJSON_ParseWithLength(text, n);
    if (root == NULL) {
        ZR_FAIL_GOTO(st, fail, ZR_ERR_FORMAT, "%s is not valid JSON", mpath);
    }
    ZR_CHECK_GOTO(read_fields(root, mpath, m), st, fail);
    if (section != NULL) {
        ZR_CHECK_GOTO(section_text(root, section, out), st, fail);
    }
    cJSON_Delete(root);
    zr_free(text);
    zr_free(mtext);
    return ZR_OK;
fail:
    cJSON_Delete(root);
    zr_free(text);
    zr_free(mtext);
    zr_ckpt_manifest_free(m);
    return st;
}
