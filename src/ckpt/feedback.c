/*
 * feedback.c - qgZ's error-feedback residuals in checkpoints (ckpt_impl.h).
 *
 * With zr.quant.qgz_error_feedback each rank carries, per unit, what its
 * quantizations left out (hop 0: its whole gradient's, W*S elements; hop 1:
 * its partial sums', N*S), to add to the next step's gradient. They are the
 * rank's own, tied to its place in the layout: each rank file ends with its
 * rank's residuals, and a resume at the same layout continues from them
 * exactly as if the run had not stopped. At another world size, node layout
 * or quantization they mean nothing to any rank, so they start from zero,
 * with a note (as in a checkpoint that holds none).
 */
#include "ckpt_impl.h"

#include <cJSON.h>
#include <stdio.h>

int zr_ckpt_feedback_saved(const zr_engine *e)
{
    return e->cfg.qgz && e->cfg.qgz_cfg.error_feedback;
}

cJSON *zr_ckpt_feedback_json(zr_engine *e)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "ranks_per_node", e->comm->size[ZR_GROUP_NODE]);
    cJSON_AddNumberToObject(o, "bits", e->cfg.qgz_cfg.q.bits);
    cJSON_AddNumberToObject(o, "group", e->cfg.qgz_cfg.q.group);
    cJSON *units = cJSON_AddArrayToObject(o, "units");
    for (int u = 0; u < e->nunits; u++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "hop0", (double)zr_engine_feedback_count(e, u, 0));
        cJSON_AddNumberToObject(x, "hop1", (double)zr_engine_feedback_count(e, u, 1));
        cJSON_AddItemToArray(units, x);
    }
    return o;
}

int zr_ckpt_feedback_usable(const zr_engine *e, const zr_ckpt_manifest *m, const char *path,
                            char *note, size_t len)
{
    const zr_ckpt_feedback *fb = &m->fb;
    const zr_quant_params *q = &e->cfg.qgz_cfg.q;
    int W = e->comm->size[ZR_GROUP_WORLD], D = e->comm->size[ZR_GROUP_NODE];
    note[0] = '\0';
    if (!zr_ckpt_feedback_saved(e)) {
        return 0;
    }
    if (!fb->present) {
        snprintf(note, len,
                 "%s holds no qgZ error-feedback residuals (saved without "
                 "zr.quant.qgz_error_feedback or by an earlier zr): they start from zero",
                 path);
        return 0;
    }
    if (m->meta.world != W || fb->ranks_per_node != D || fb->bits != q->bits ||
        fb->group != q->group) {
        snprintf(note, len,
                 "the qgZ error-feedback residuals of %s belong to %d ranks, %d per node, INT%d in "
                 "groups of %d (now %d, %d, INT%d, %d): they start from zero",
                 path, m->meta.world, fb->ranks_per_node, fb->bits, fb->group, W, D, q->bits,
                 q->group);
        return 0;
    }
    return 1;
}
