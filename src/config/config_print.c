/*
 * config_print.c - the configuration as people and files see it: --help
 * (generated from the key table), the key = value printout, the values key by
 * key for comparing ranks, and the JSON dump stored in checkpoint manifests.
 */
#define _POSIX_C_SOURCE 200809L

#include "config_impl.h"

#include <stdio.h>
#include <string.h>

/* ---- help and printout -------------------------------------------------- */

void zr_config_print_help(FILE *f)
{
    zr_train_config d;
    zr_config_defaults(&d);
    fprintf(
        f, "usage: mpirun -np N zr train [--config FILE.json] [--KEY VALUE | --KEY=VALUE ...]\n"
           "\n"
           "Keys are DeepSpeed's config keys (dotted: --zero_optimization.stage 3) plus zr's own\n"
           "under \"zr\". Precedence: defaults < --config file < flags. Booleans also take a bare\n"
           "--KEY (true) or --no-KEY (and --no-hpz: hpZ off). Short aliases are shown after the\n"
           "dotted name. A resume lists every setting that differs from the checkpoint's, and\n"
           "refuses those marked \"on resume\".\n");
    char section[128] = "?";
    for (size_t i = 0; i < zr_config_nkeys; i++) {
        const cfg_key *k = &zr_config_keys[i];
        if (!zr_config_listed(k)) {
            continue;
        }
        size_t pl = zr_config_parent_len(k->path);
        if (strlen(section) != pl || strncmp(section, k->path, pl) != 0) {
            snprintf(section, sizeof section, "%.*s", (int)pl, k->path);
            fprintf(f, "\n%s\n", pl == 0 ? "top level (DeepSpeed)" : section);
        }
        char expect[200], def[300];
        zr_config_describe_expect(k, expect, sizeof expect);
        zr_config_fmt_value(&d, k, def, sizeof def);
        static const char *const on_resume[] = {
            [ZR_RESUME_CHANGE] = "",
            [ZR_RESUME_MATCH] = "; on resume: must be the checkpoint's",
            [ZR_RESUME_MODEL] = "; on resume: the checkpoint's model must be this one",
            [ZR_RESUME_DATA] = "; on resume: the checkpoint's data unless --resume-new-data",
            [ZR_RESUME_LOCAL] = "",
        };
        fprintf(f, "  --%s%s%s\n      %s; default %s%s\n      %s\n", k->path, k->flag ? ", --" : "",
                k->flag ? k->flag : "", expect, def, on_resume[k->resume], k->help);
    }
    fprintf(f, "\nAccepted with a note, no effect in zr (DeepSpeed keys):\n ");
    int col = 1;
    for (size_t i = 0; i < zr_config_nkeys; i++) {
        if (zr_config_keys[i].type != K_NOEFFECT) {
            continue;
        }
        int w = (int)strlen(zr_config_keys[i].path) + 1;
        if (col + w > 98) {
            fprintf(f, "\n ");
            col = 1;
        }
        fprintf(f, " %s", zr_config_keys[i].path);
        col += w;
    }
    fprintf(f, "\n\nRefused: fp16.enabled true, communication_data_type \"fp16\", "
               "optimizer.params.adam_w_mode false,\n  optimizer.params.bias_correction false, "
               "optimizer.params.amsgrad true.\n"
               "Other DeepSpeed names: zero_optimization.max_live_parameters and "
               "prefetch_bucket_size\n  are the stage3_ keys.\n");
}

void zr_config_print(FILE *f, const zr_train_config *c)
{
    for (size_t i = 0; i < zr_config_nkeys; i++) {
        if (zr_config_listed(&zr_config_keys[i])) {
            char v[300];
            zr_config_fmt_value(c, &zr_config_keys[i], v, sizeof v);
            fprintf(f, "%-46s = %s\n", zr_config_keys[i].path, v);
        }
    }
}

const char *zr_config_key_value(const zr_train_config *c, size_t i, char *buf, size_t n)
{
    buf[0] = '\0';
    if (i >= zr_config_nkeys || !zr_config_listed(&zr_config_keys[i])) {
        return NULL;
    }
    zr_config_fmt_value(c, &zr_config_keys[i], buf, n);
    return zr_config_keys[i].path;
}

/* The object at the dotted parent of path inside root, created as needed. */
static cJSON *json_parent(cJSON *root, const char *path)
{
    cJSON *obj = root;
    const char *p = path;
    for (const char *dot = strchr(p, '.'); dot != NULL; p = dot + 1, dot = strchr(p, '.')) {
        char comp[128];
        snprintf(comp, sizeof comp, "%.*s", (int)(dot - p), p);
        cJSON *next = cJSON_GetObjectItemCaseSensitive(obj, comp);
        if (next == NULL) {
            next = cJSON_AddObjectToObject(obj, comp);
        }
        if (next == NULL) {
            return NULL;
        }
        obj = next;
    }
    return obj;
}

/* Add key k of c under its leaf name to obj; 0 when out of memory. */
static int add_key(cJSON *obj, const zr_train_config *c, const cfg_key *k)
{
    const char *name = zr_config_leaf(k->path);
    const void *p = zr_config_cfield(c, k->off);
    switch (k->type) {
    case K_BOOL:
        return cJSON_AddBoolToObject(obj, name, *(const int *)p) != NULL;
    case K_STR:
    case K_ENUM:
        return cJSON_AddStringToObject(obj, name, (const char *)p) != NULL;
    case K_PAIR: {
        const double two[2] = {*(const double *)p, *(const double *)zr_config_cfield(c, k->off2)};
        cJSON *v = cJSON_CreateDoubleArray(two, 2);
        if (v != NULL && !cJSON_AddItemToObject(obj, name, v)) {
            cJSON_Delete(v);
            v = NULL;
        }
        return v != NULL;
    }
    case K_U64:
    case K_I64: {
        /* as digits: a double would round a seed beyond 2^53 */
        char digits[32];
        zr_config_fmt_value(c, k, digits, sizeof digits);
        return cJSON_AddRawToObject(obj, name, digits) != NULL;
    }
    default:
        return cJSON_AddNumberToObject(obj, name, zr_config_get_num(c, k, k->off)) != NULL;
    }
}

zr_status zr_config_to_json(const zr_train_config *c, char **out)
{
    *out = NULL;
    cJSON *root = cJSON_CreateObject();
    int ok = root != NULL;
    for (size_t i = 0; ok && i < zr_config_nkeys; i++) {
        const cfg_key *k = &zr_config_keys[i];
        if (zr_config_listed(k)) {
            cJSON *obj = json_parent(root, k->path);
            ok = obj != NULL && add_key(obj, c, k);
        }
    }
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (text == NULL) {
        ZR_FAIL(ZR_ERR_NOMEM, "out of memory writing the configuration as JSON");
    }
    /* cJSON allocates with plain malloc: the caller gets counted memory, freed with zr_free */
    size_t n = strlen(text) + 1;
    zr_status st = ZR_OK;
    ZR_ALLOC_GOTO(*out, n, st, done);
    memcpy(*out, text, n);
done:
    cJSON_free(text);
    return st;
}
