/*
 * launch.c - ranks agree that they were started the same way (zr/launch.h).
 *
 * Two rounds, both collective over world: every rank all-gathers one 64-bit
 * digest of all its values; only if the digests differ do ranks all-gather
 * one hash per value and, for each differing value, broadcast the text of
 * each distinct value from the first rank holding it. Every rank builds the
 * message from the same gathered data, so it is identical everywhere.
 */
#include "zr/launch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_KEYS_SHOWN   6
#define MAX_VALUES_SHOWN 4
#define VALUE_BYTES      320

/* FNV-1a, 64 bits: a digest of short texts, not a defence against forgery. */
static uint64_t hash_text(uint64_t h, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++) {
        h = (h ^ *p) * 1099511628211ull;
    }
    return (h ^ 0xff) * 1099511628211ull; /* a terminator, so "ab","c" != "a","bc" */
}

/* Append the values of item i to msg: "NAME is A on ranks 0-1, B on rank 2". */
static zr_status explain(zr_comm *c, const char *name, const char *mine, const uint64_t *all, int n,
                         int i, int *cls, char *msg, size_t len)
{
    int W = c->size[ZR_GROUP_WORLD];
    int k = 0;
    for (int r = 0; r < W; r++) {
        cls[r] = -1;
        for (int q = 0; q < r && cls[r] < 0; q++) {
            if (all[(size_t)q * n + i] == all[(size_t)r * n + i]) {
                cls[r] = cls[q];
            }
        }
        if (cls[r] < 0) {
            cls[r] = k++;
        }
    }
    size_t used = strlen(msg);
    used += (size_t)snprintf(msg + used, len - used, "%s%s is", used > 0 ? "; " : "", name);
    for (int v = 0; v < k && v < MAX_VALUES_SHOWN; v++) {
        int first = 0;
        while (cls[first] != v) {
            first++;
        }
        char text[VALUE_BYTES];
        memset(text, 0, sizeof text);
        if (c->rank[ZR_GROUP_WORLD] == first) {
            snprintf(text, sizeof text, "%s", mine);
        }
        ZR_CHECK(zr_comm_bcast(c, text, sizeof text, first));
        text[sizeof text - 1] = '\0';
        char ranks[160];
        zr_comm_format_ranks(ranks, sizeof ranks, cls, W, v);
        if (used < len) {
            used += (size_t)snprintf(msg + used, len - used, "%s %s on %s", v ? "," : "",
                                     text[0] ? text : "(empty)", ranks);
        }
    }
    if (k > MAX_VALUES_SHOWN && used < len) {
        snprintf(msg + used, len - used, " and %d other values", k - MAX_VALUES_SHOWN);
    }
    return ZR_OK;
}

zr_status zr_launch_agree(zr_comm *c, int n, const char *const *names, const char *const *values,
                          const char *what, const char *hint)
{
    int W = c->size[ZR_GROUP_WORLD];
    if (W == 1) {
        return ZR_OK;
    }
    uint64_t digest = 14695981039346656037ull, *all = NULL, *mine = NULL;
    int *cls = NULL;
    ZR_ALLOC(all, (size_t)W);
    zr_status st = ZR_OK;
    for (int i = 0; i < n; i++) {
        digest = hash_text(hash_text(digest, names[i]), values[i]);
    }
    ZR_CHECK_GOTO(
        zr_comm_allgather(c, ZR_GROUP_WORLD, ZR_KIND_CONTROL, &digest, sizeof digest, all), st,
        done);
    int same = 1;
    for (int r = 1; r < W; r++) {
        same &= all[r] == all[0];
    }
    if (same) {
        goto done; /* nothing to explain: st is ZR_OK */
    }
    zr_free(all);
    all = NULL;
    ZR_ALLOC_GOTO(all, (size_t)W * (size_t)n, st, done);
    ZR_ALLOC_GOTO(mine, (size_t)n, st, done);
    ZR_ALLOC_GOTO(cls, (size_t)W, st, done);
    for (int i = 0; i < n; i++) {
        mine[i] = hash_text(hash_text(14695981039346656037ull, names[i]), values[i]);
    }
    ZR_CHECK_GOTO(zr_comm_allgather(c, ZR_GROUP_WORLD, ZR_KIND_CONTROL, mine,
                                    sizeof(uint64_t) * (size_t)n, all),
                  st, done);
    char msg[1000] = "";
    int shown = 0, more = 0;
    for (int i = 0; i < n; i++) {
        int differ = 0;
        for (int r = 1; r < W; r++) {
            differ |= all[(size_t)r * n + i] != all[i];
        }
        if (!differ) {
            continue;
        }
        if (shown == MAX_KEYS_SHOWN) {
            more++;
            continue;
        }
        ZR_CHECK_GOTO(explain(c, names[i], values[i], all, n, i, cls, msg, sizeof msg), st, done);
        shown++;
    }
    if (shown == 0) {
        /* the digests differ but no value does: a hash collision inside one rank's digest */
        snprintf(msg, sizeof msg, "the digests differ but every value agrees");
    }
    ZR_FAIL_GOTO(st, done, ZR_ERR_INVALID, "%s: %s%s%s%s%s", what, msg, more > 0 ? "; and " : "",
                 more > 0 ? "other keys" : "", hint != NULL && hint[0] ? "; " : "",
                 hint != NULL ? hint : "");
done:
    zr_free(cls);
    zr_free(mine);
    zr_free(all);
    return st;
}

zr_status zr_launch_check_config(zr_comm *c, const zr_train_config *cfg, int help)
{
    size_t nk = zr_config_key_count();
    const char **names = NULL, **values = NULL;
    char *text = NULL;
    zr_status st = ZR_OK;
    ZR_ALLOC(names, nk + 1);
    ZR_ALLOC_GOTO(values, nk + 1, st, done);
    ZR_ALLOC_GOTO(text, (nk + 1) * VALUE_BYTES, st, done);
    int n = 0;
    names[n] = "--help";
    values[n++] = help ? "given" : "not given";
    for (size_t i = 0; i < nk; i++) {
        char *buf = text + (size_t)n * VALUE_BYTES;
        const char *name = zr_config_key_value(cfg, i, buf, VALUE_BYTES);
        if (name != NULL) {
            names[n] = name;
            values[n++] = buf;
        }
    }
    st = zr_launch_agree(c, n, names, values, "ranks were started with different configurations",
                         "start every rank with the same flags and config file");
done:
    zr_free(text);
    zr_free(values);
    zr_free(names);
    return st;
}

/* CRC-32C of the tokens' first and last MiB: cheap for any size, catches another file. */
static uint32_t ends_crc(const zr_dataset *d)
{
    return zr_dataset_ends_crc(d);
}

void zr_launch_data_id(const zr_dataset *d, char *buf, size_t n)
{
    snprintf(buf, n, "%s, %zu tokens, vocabulary %d, CRC-32C of the first and last MiB %08x",
             zr_data_kind_name(d->kind), d->n, d->vocab, (unsigned)ends_crc(d));
    size_t len = strlen(buf);
    if (d->nshards > 1 && len < n) { /* one file's id as before */
        snprintf(buf + len, n - len, ", %d shards", d->nshards);
    }
}

zr_status zr_launch_check_data(zr_comm *c, const zr_dataset *d, const char *path)
{
    uint32_t crc = ends_crc(d);
    char count[32], vocab[32], sum[32], files[64];
    snprintf(count, sizeof count, "%zu", d->n);
    snprintf(vocab, sizeof vocab, "%d", d->vocab);
    snprintf(sum, sizeof sum, "%08x", (unsigned)crc);
    snprintf(files, sizeof files, "%d, CRC-32C of their names %08x", d->nshards,
             (unsigned)zr_dataset_names_crc(d));
    const char *names[5] = {"the kind", "the token count", "the vocabulary",
                            "the CRC-32C of its first and last MiB", "the files"};
    const char *values[5] = {zr_data_kind_name(d->kind), count, vocab, sum, files};
    char what[400];
    snprintf(what, sizeof what, "ranks read different training data from %s",
             path != NULL && path[0] ? path : "the bundled corpus");
    return zr_launch_agree(c, 5, names, values, what,
                           "every rank must read the same file (zr.data.path); copy it to every "
                           "node or put it on a shared file system");
}

zr_status zr_launch_read_config(MPI_Comm world, int argc, char **argv, zr_train_config *cfg,
                                int *help, void (*warn)(void *ctx, const char *msg), void *ctx)
{
    int size;
    MPI_Comm_size(world, &size);
    zr_comm plain; /* no hpZ group: only to agree */
    zr_comm_config cc = {0, 1};
    ZR_CHECK(zr_comm_init(&plain, world, &cc));
    zr_config_defaults(cfg);
    *help = 0;
    zr_status st = zr_config_from_args(cfg, argc - 1, argv + 1, help, warn, ctx);
    if (st == ZR_OK && !*help) {
        st = zr_config_finalize(cfg, size);
    }
    st = zr_comm_agree(&plain, st);
    if (st == ZR_OK) {
        /* ranks started with other arguments would issue other collectives and hang */
        zr_comm_set_timeout(&plain, cfg->timeout_s);
        st = zr_launch_check_config(&plain, cfg, *help);
    }
    zr_comm_free(&plain);
    return st;
}

/* "key = value" in an Open MPI MCA parameter file: the value of key, or -1. */
static double mca_file_value(const char *path, const char *key)
{
    FILE *f = path != NULL && path[0] != '\0' ? fopen(path, "r") : NULL;
    double v = -1;
    char line[512];
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        char k[128];
        double x;
        if (sscanf(line, " %127[A-Za-z0-9_] = %lf", k, &x) == 2 && strcmp(k, key) == 0) {
            v = x; /* the last one counts */
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    return v;
}

double zr_launch_grace_s(char *const *envp, char *how, size_t n)
{
    static const char *const names[] = {"OMPI_MCA_odls_base_sigkill_timeout",
                                        "PRTE_MCA_odls_base_sigkill_timeout"};
    int hnp = 0, ompi = 0, slurm = 0;
    for (char *const *e = envp; e != NULL && *e != NULL; e++) {
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            size_t len = strlen(names[i]);
            if (strncmp(*e, names[i], len) == 0 && (*e)[len] == '=') {
                snprintf(how, n, "%s", names[i] + 9);
                return atof(*e + len + 1);
            }
        }
        hnp |= strncmp(*e, "OMPI_MCA_orte_hnp_uri=", 22) == 0; /* started by mpirun (4.x) */
        ompi |= strncmp(*e, "OMPI_COMM_WORLD_SIZE=", 21) == 0;
        slurm |= strncmp(*e, "SLURM_STEP_ID=", 14) == 0;
    }
    /* Open MPI's ranks started by srun are Slurm's to stop, not mpirun's */
    if (!hnp && !(ompi && !slurm)) {
        snprintf(how, n, "unknown");
        return -1; /* MPICH waits for the ranks; Slurm's KillWait is not visible to a job */
    }
    /* set in a parameter file: the user's, then the system's (Debian's path) */
    const char *home = getenv("HOME");
    char path[4096];
    double v = -1;
    if (home != NULL &&
        snprintf(path, sizeof path, "%s/.openmpi/mca-params.conf", home) < (int)sizeof path) {
        v = mca_file_value(path, "odls_base_sigkill_timeout");
    }
    if (v < 0) {
        v = mca_file_value("/etc/openmpi/openmpi-mca-params.conf", "odls_base_sigkill_timeout");
    }
    snprintf(how, n, "%s",
             v >= 0 ? "odls_base_sigkill_timeout (from an MCA parameter file)"
                    : "odls_base_sigkill_timeout (Open MPI's default)");
    return v >= 0 ? v : 1.0;
}
