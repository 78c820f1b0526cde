/*
 * config_diff.c - a run's configuration against the one a checkpoint saved
 * (zr_config_compare), so that a resume changes nothing silently: the key
 * table says per key what a resume may do with it (zr/config.h,
 * zr_config_policy), and this lists every key whose value differs, printed as
 * the printout prints it. The saved configuration is read with the same key
 * table (leniently: what an older zr wrote must not stop a resume), over a
 * copy of this run's, so a key the checkpoint does not record never differs.
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
    ZR_CHECK(zr_config_parse_saved(&was, saved_json, "the checkpoint's configuration"));
    for (size_t i = 0; i < zr_config_nkeys; i++) {
        const cfg_key *k = &zr_config_keys[i];
        if (!zr_config_listed(k) || k->resume == ZR_RESUME_LOCAL) {
            continue;
        }
        char a[sizeof out->was], b[sizeof out->now];
        zr_config_fmt_value(&was, k, a, sizeof a);
        zr_config_fmt_value(c, k, b, sizeof b);
        if (strcmp(a, b) != 0) {
            zr_config_change *ch = &out[(*n)++];
            ch->key = k->path;
            ch->policy = k->resume;
            snprintf(ch->was, sizeof ch->was, "%s", a);
            snprintf(ch->now, sizeof ch->now, "%s", b);
        }
    }
    return ZR_OK;
}
