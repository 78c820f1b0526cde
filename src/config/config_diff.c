/*
 * config_diff.c - a run's configuration against the one a checkpoint saved
 * (zr_config_compare), so that a resume changes nothing silently: the key
 * table says per key what a resume may do with it (zr/config.h,
 * zr_config_policy), and this lists every key whose value differs, printed as
 * the printout prints it. The saved configuration is read with the same key
 * table (leniently: what an older zr wrote must not stop a resume), over a
 * copy of this run's; a key the checkpoint does not record (an older zr, an
 * edited manifest, a value this zr no longer takes) is listed as not recorded,
 * never taken as unchanged.
 */
#define _POSIX_C_SOURCE 200809L

#include "config_impl.h"

#include <stdio.h>
#include <string.h>

zr_status zr_config_compare(const zr_train_config *c, const char *saved_json, zr_config_change *out,
                            int *n)
{
    *n = 0;
    static zr_train_config was; /* large (paths): not on the stack */
    was = *c;
    unsigned char *present = NULL;
    zr_status st = ZR_OK;
    ZR_ALLOC_GOTO(present, zr_config_nkeys, st, done);
    if (saved_json != NULL) {
        ZR_CHECK_GOTO(
            zr_config_parse_saved(&was, saved_json, "the checkpoint's configuration", present), st,
            done);
    }
    for (size_t i = 0; i < zr_config_nkeys; i++) {
        const cfg_key *k = &zr_config_keys[i];
        if (!zr_config_listed(k) || k->resume == ZR_RESUME_LOCAL) {
            continue;
        }
        char a[sizeof out->was], b[sizeof out->now];
        zr_config_fmt_value(&was, k, a, sizeof a);
        zr_config_fmt_value(c, k, b, sizeof b);
        if (!present[i] || strcmp(a, b) != 0) {
            zr_config_change *ch = &out[(*n)++];
            ch->key = k->path;
            ch->policy = k->resume;
            ch->recorded = present[i];
            snprintf(ch->was, sizeof ch->was, "%s", present[i] ? a : "");
            snprintf(ch->now, sizeof ch->now, "%s", b);
        }
    }
done:
    zr_free(present);
    return st;
}
