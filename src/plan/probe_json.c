/*
 * probe_json.c - the probe as a JSON file: written atomically, read back
 * with every key checked (present, a number, finite, in range), so a plan is
 * never computed from a truncated, hand-edited or foreign file without an
 * error that names the file and the key.
 */
#define _POSIX_C_SOURCE 200809L

#include "zr/file.h"
#include "zr/plan.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * The scalar keys: name, offset of a double or int field, is it an int, the
 * valid range. A number that sets how much work the plan does has the range
 * a run can have: the ranks (ZR_PLAN_MAX_WORLD), the depth (zr.model.layers'
 * range: the dry run walks every block), the reference micro-batch (zr probe
 * --max-micro-batch's); a bound here is what keeps a plan's time and memory
 * bounded whatever the file says.
 */
typedef struct pkey {
    const char *name;
    size_t off;
    int is_int;
    double lo, hi;
} pkey;

#define D_(f, lo)                                                                                  \
    {                                                                                              \
#f, offsetof(zr_probe, f), 0, lo, 1e15                                                     \
    }
#define I_(f, lo, hi)                                                                              \
    {                                                                                              \
#f, offsetof(zr_probe, f), 1, lo, hi                                                       \
    }
/* element i of a reference's array field, under its own key */
#define R_(name, f, i)                                                                             \
    {                                                                                              \
        name, offsetof(zr_probe, f) + (i) * sizeof(double), 0, 0, 1e15                             \
    }
static const pkey keys[] = {
    I_(version, 1, 1e9),
    I_(gpu, 0, 1e9),
    I_(bf16, 0, 1e9),
    I_(world, 1, ZR_PLAN_MAX_WORLD),
    I_(nodes, 1, ZR_PLAN_MAX_WORLD),
    I_(ranks_per_node, 1, ZR_PLAN_MAX_WORLD),
    I_(threads, 1, 1e9),
    I_(layers, 1, 1024),
    I_(heads, 1, 1e9),
    I_(channels, 1, 1e9),
    I_(vocab, 1, 1e9),
    I_(padded_vocab, 1, 1e9),
    I_(seq_len, 1, 1e9),
    I_(max_seq_len, 1, 1e9),
    I_(recompute, 0, 1e9),
    D_(adamw, 0),
    D_(sumsq, 0),
    D_(bf16_enc, 0),
    D_(bf16_dec, 0),
    D_(f32_add, 0),
    D_(intra_bw, 0),
    D_(inter_bw, 0),
    D_(intra_lat, 0),
    D_(inter_lat, 0),
    D_(overlap, 0),
    D_(base_rss, 0),
    D_(mem_per_rank, 0),
    I_(cal_batch, 0, ZR_PROBE_MAX_MICRO),
    D_(cal_prefetch, 0),
    R_("cal_step", cal_step, 0),
    R_("cal_compute", cal_compute, 0),
    R_("cal_comm", cal_comm, 0),
    R_("cal_optim", cal_optim, 0),
    R_("calq_step", cal_step, 1),
    R_("calq_compute", cal_compute, 1),
    R_("calq_comm", cal_comm, 1),
    R_("calq_optim", cal_optim, 1),
    R_("cald_step", cal_step, 2),
    R_("cald_compute", cal_compute, 2),
    R_("cald_comm", cal_comm, 2),
    R_("cald_optim", cal_optim, 2),
};
/* Keys a probe of an earlier zr lacks (0 when missing): bandwidth at a second message size, and
   the model's architecture with the Llama family's fields (an earlier probe's model is GPT-2). */
static const pkey opt_keys[] = {
    D_(bw_msg, 0),         D_(bw_msg_small, 0),        D_(intra_bw_small, 0),
    D_(inter_bw_small, 0), I_(arch, 0, ZR_ARCH_LLAMA), I_(kv_heads, 0, 1e9),
    I_(head_dim, 0, 1e9),  I_(intermediate, 0, 1e9),   I_(tied, 0, 1),
    I_(qkv_bias, 0, 1),
};
#undef R_
#undef D_
#undef I_
enum { NKEYS = sizeof keys / sizeof keys[0], NOPT = sizeof opt_keys / sizeof opt_keys[0] };

static const char *const unit_keys[] = {"fwd_embed", "fwd_block", "fwd_head",
                                        "bwd_head",  "bwd_block", "bwd_embed"};

static double get(const zr_probe *p, const pkey *k)
{
    const char *b = (const char *)p + k->off;
    return k->is_int ? (double)*(const int *)b : *(const double *)b;
}

static void set(zr_probe *p, const pkey *k, double v)
{
    char *b = (char *)p + k->off;
    if (k->is_int) {
        *(int *)b = (int)v;
    } else {
        *(double *)b = v;
    }
}

zr_status zr_probe_write(const char *path, const zr_probe *p)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_CreateArray();
    int ok = o != NULL && arr != NULL;
    for (int i = 0; ok && i < NKEYS; i++) {
        ok = cJSON_AddNumberToObject(o, keys[i].name, get(p, &keys[i])) != NULL;
    }
    for (int i = 0; ok && i < NOPT; i++) {
        ok = cJSON_AddNumberToObject(o, opt_keys[i].name, get(p, &opt_keys[i])) != NULL;
    }
    const char *qn[4] = {"q8_enc", "q8_dec", "q4_enc", "q4_dec"};
    double qv[4] = {p->q_enc[0], p->q_dec[0], p->q_enc[1], p->q_dec[1]};
    for (int i = 0; ok && i < 4; i++) {
        ok = cJSON_AddNumberToObject(o, qn[i], qv[i]) != NULL;
    }
    for (int i = 0; ok && i < p->ncompute; i++) {
        const zr_probe_compute *c = &p->compute[i];
        cJSON *e = cJSON_CreateObject();
        ok = e != NULL && cJSON_AddItemToArray(arr, e);
        double v[6] = {c->fwd_embed, c->fwd_block, c->fwd_head,
                       c->bwd_head,  c->bwd_block, c->bwd_embed};
        ok = ok && cJSON_AddNumberToObject(e, "batch", c->batch) != NULL;
        for (int k = 0; ok && k < 6; k++) {
            ok = cJSON_AddNumberToObject(e, unit_keys[k], v[k]) != NULL;
        }
    }
    if (ok) {
        ok = cJSON_AddItemToObject(o, "compute", arr);
        arr = ok ? NULL : arr;
    }
    char *text = ok ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    cJSON_Delete(arr);
    if (text == NULL) {
        ZR_FAIL(ZR_ERR_NOMEM, "out of memory writing the probe as JSON");
    }
    size_t n = strlen(text);
    text[n] = '\n'; /* cJSON's terminator becomes the file's last newline */
    zr_status st = zr_file_write_atomic(path, text, n + 1);
    cJSON_free(text);
    return st;
}

static zr_status number(const cJSON *o, const char *key, const char *path, double lo, double hi,
                        double *v)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(x)) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: \"%s\" is %s (a number is needed; rerun zr probe)", path, key,
                x == NULL ? "missing" : "not a number");
    }
    if (!isfinite(x->valuedouble) || x->valuedouble < lo || x->valuedouble > hi) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: \"%s\" is %.15g, outside [%.15g, %.15g]%s", path, key,
                x->valuedouble, lo, hi,
                hi == ZR_PLAN_MAX_WORLD ? " (ranks no machine has: zr plans up to 2^24 ranks)"
                                        : "");
    }
    *v = x->valuedouble;
    return ZR_OK;
}

/*
 * A time or a rate that no machine measures (zero: an edited or damaged
 * file) would have the planner promise any speed: every per-element time,
 * every unit's compute time, and the bandwidth and latency of each level the
 * layout has must be above zero, and the memory per rank too.
 */
static zr_status possible(const zr_probe *p, const char *path)
{
    struct {
        const char *name;
        double v;
        int needed;
    } m[] = {{"adamw", p->adamw, 1},
             {"sumsq", p->sumsq, 1},
             {"bf16_enc", p->bf16_enc, 1},
             {"bf16_dec", p->bf16_dec, 1},
             {"f32_add", p->f32_add, 1},
             {"q8_enc", p->q_enc[0], 1},
             {"q8_dec", p->q_dec[0], 1},
             {"q4_enc", p->q_enc[1], 1},
             {"q4_dec", p->q_dec[1], 1},
             {"intra_bw", p->intra_bw, p->ranks_per_node > 1},
             {"intra_lat", p->intra_lat, p->ranks_per_node > 1},
             {"inter_bw", p->inter_bw, p->nodes > 1},
             {"inter_lat", p->inter_lat, p->nodes > 1},
             {"intra_bw_small", p->intra_bw_small, p->bw_msg_small > 0 && p->ranks_per_node > 1},
             {"inter_bw_small", p->inter_bw_small, p->bw_msg_small > 0 && p->nodes > 1},
             {"mem_per_rank", p->mem_per_rank, 1}};
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
        if (m[i].needed && !(m[i].v > 0)) {
            ZR_FAIL(ZR_ERR_FORMAT,
                    "%s: \"%s\" is %g, a measurement no machine gives (it must be above 0): the "
                    "file was edited or damaged; rerun zr probe",
                    path, m[i].name, m[i].v);
        }
    }
    for (int i = 0; i < p->ncompute; i++) {
        const zr_probe_compute *c = &p->compute[i];
        const double v[6] = {c->fwd_embed, c->fwd_block, c->fwd_head,
                             c->bwd_head,  c->bwd_block, c->bwd_embed};
        for (int k = 0; k < 6; k++) {
            if (!(v[k] > 0)) {
                ZR_FAIL(ZR_ERR_FORMAT,
                        "%s: \"compute[%d].%s\" is %g s, a time no machine measures (it must be "
                        "above 0): the file was edited or damaged; rerun zr probe",
                        path, i, unit_keys[k], v[k]);
            }
        }
    }
    return ZR_OK;
}

/* ZeRO-3's reference steps ran wherever cal_batch says so; stage 0's may not have fitted. */
static zr_status check_references(const zr_probe *p, const char *path)
{
    static const char *const ref[3] = {"cal", "calq", "cald"};
    for (int r = 0; r < 3 && p->cal_batch > 0; r++) {
        int ran = p->cal_step[r] > 0 && p->cal_compute[r] > 0;
        int none = p->cal_step[r] == 0 && p->cal_compute[r] == 0 && p->cal_comm[r] == 0 &&
                   p->cal_optim[r] == 0;
        if (!ran && !(r == 2 && none)) {
            ZR_FAIL(ZR_ERR_FORMAT,
                    "%s: \"%s_step\" and \"%s_compute\" are %g and %g s: the reference steps "
                    "(cal_batch %d) take time on every machine (above 0); the file was edited or "
                    "damaged; rerun zr probe",
                    path, ref[r], ref[r], p->cal_step[r], p->cal_compute[r], p->cal_batch);
        }
    }
    return ZR_OK;
}

/* The second message size, where measured, below the first (its rates: possible()). */
static zr_status check_sizes(const zr_probe *p, const char *path)
{
    if (p->bw_msg_small > 0 && !(p->bw_msg > p->bw_msg_small)) {
        ZR_FAIL(ZR_ERR_FORMAT,
                "%s: \"bw_msg_small\" (%g bytes) must be below \"bw_msg\" (%g bytes): the file "
                "was edited or damaged; rerun zr probe",
                path, p->bw_msg_small, p->bw_msg);
    }
    return ZR_OK;
}

/* The keys an earlier zr's file may lack: 0 where missing. */
static zr_status parse_optional(const cJSON *o, const char *path, zr_probe *p)
{
    for (int i = 0; i < NOPT; i++) {
        double v = 0;
        if (cJSON_GetObjectItemCaseSensitive(o, opt_keys[i].name) != NULL) {
            ZR_CHECK(number(o, opt_keys[i].name, path, opt_keys[i].lo, opt_keys[i].hi, &v));
        }
        if (opt_keys[i].is_int && v != floor(v)) {
            ZR_FAIL(ZR_ERR_FORMAT, "%s: \"%s\" must be a whole number, got %g", path,
                    opt_keys[i].name, v);
        }
        set(p, &opt_keys[i], v);
    }
    return ZR_OK;
}

static zr_status parse(const cJSON *o, const char *path, zr_probe *p)
{
    if (!cJSON_IsObject(o)) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s is not a JSON object (a file written by zr probe is)", path);
    }
    for (int i = 0; i < NKEYS; i++) {
        double v = 0;
        ZR_CHECK(number(o, keys[i].name, path, keys[i].lo, keys[i].hi, &v));
        if (keys[i].is_int && v != floor(v)) {
            ZR_FAIL(ZR_ERR_FORMAT, "%s: \"%s\" must be a whole number, got %g", path, keys[i].name,
                    v);
        }
        set(p, &keys[i], v);
        if (i == 0 && p->version != ZR_PROBE_VERSION) {
            /* the version first: an older file lacks keys this one needs */
            ZR_FAIL(ZR_ERR_FORMAT, "%s: probe version %d, this zr reads version %d; rerun zr probe",
                    path, p->version, ZR_PROBE_VERSION);
        }
    }
    if (p->gpu > 1 || p->bf16 > 1 || (p->bf16 && !p->gpu)) {
        ZR_FAIL(ZR_ERR_FORMAT,
                "%s: \"gpu\" and \"bf16\" are 0 or 1, and bf16 (a GPU's compute type) needs gpu 1",
                path);
    }
    if (p->world != (long long)p->nodes * p->ranks_per_node) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: world %d is not nodes %d x ranks_per_node %d", path, p->world,
                p->nodes, p->ranks_per_node);
    }
    if (p->overlap > 1 || (p->nodes > 1 && !(p->inter_bw > 0)) ||
        (p->ranks_per_node > 1 && !(p->intra_bw > 0))) {
        ZR_FAIL(ZR_ERR_FORMAT,
                "%s: overlap must be <= 1 and the bandwidth of every level the "
                "layout has must be > 0",
                path);
    }
    ZR_CHECK(parse_optional(o, path, p));
    ZR_CHECK(check_sizes(p, path));
    const char *qn[4] = {"q8_enc", "q8_dec", "q4_enc", "q4_dec"};
    double *qv[4] = {&p->q_enc[0], &p->q_dec[0], &p->q_enc[1], &p->q_dec[1]};
    for (int i = 0; i < 4; i++) {
        ZR_CHECK(number(o, qn[i], path, 0, 1e15, qv[i]));
    }
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "compute");
    int n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : 0;
    if (n < 1 || n > ZR_PROBE_MAX_B) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s: \"compute\" must be an array of 1 to %d measurements", path,
                ZR_PROBE_MAX_B);
    }
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(arr, i);
        zr_probe_compute *c = &p->compute[i];
        double b = 0, *v[6] = {&c->fwd_embed, &c->fwd_block, &c->fwd_head,
                               &c->bwd_head,  &c->bwd_block, &c->bwd_embed};
        char key[64];
        snprintf(key, sizeof key, "compute[%d].batch", i);
        if (!cJSON_IsObject(e)) {
            ZR_FAIL(ZR_ERR_FORMAT, "%s: \"compute[%d]\" is not an object", path, i);
        }
        ZR_CHECK(number(e, "batch", path, 1, ZR_PROBE_MAX_MICRO, &b));
        if (b != floor(b) || (i > 0 && b <= p->compute[i - 1].batch)) {
            ZR_FAIL(ZR_ERR_FORMAT, "%s: \"%s\" must be a whole number above the one before", path,
                    key);
        }
        c->batch = (int)b;
        for (int k = 0; k < 6; k++) {
            ZR_CHECK(number(e, unit_keys[k], path, 0, 1e15, v[k]));
        }
    }
    p->ncompute = n;
    ZR_CHECK(possible(p, path));
    return check_references(p, path);
}

zr_status zr_probe_read(const char *path, zr_probe *p)
{
    memset(p, 0, sizeof *p);
    char *text = NULL;
    size_t n = 0;
    ZR_CHECK(zr_file_read_all(path, &text, &n));
    cJSON *o = cJSON_ParseWithLength(text, n);
    zr_free(text);
    if (o == NULL) {
        ZR_FAIL(ZR_ERR_FORMAT, "%s is not valid JSON (a file written by zr probe is)", path);
    }
    zr_status st = parse(o, path, p);
    cJSON_Delete(o);
    return st;
}
