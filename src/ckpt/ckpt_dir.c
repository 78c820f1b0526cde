/*
 * ckpt_dir.c - the checkpoint directory around the checkpoints: finding the
 * newest (intact) one, rotating old ones out, clearing what crashed saves
 * left, setting newer ones aside (see zr/checkpoint.h). The lock that keeps two
 * runs out of one directory is ckpt_lock.c's.
 *
 * Every change to the directory is a rename first (to a name with a suffix
 * that no listing takes for a checkpoint), then the removal, so a crash at
 * any point leaves complete checkpoints and leftovers that zr_ckpt_recover
 * recognises by their suffix.
 */
#define _DEFAULT_SOURCE /* fdopendir, fstatat, unlinkat */

#include "ckpt_impl.h"

#include "zr/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

/* ---- small file helpers ----------------------------------------------------------- */

int zr_ckpt_exists(const char *path)
{
    struct stat sb;
    return lstat(path, &sb) == 0;
}

/* "" or the suffix zr_file_tmp gives a temporary file: ".tmp-<pid>-<hex digits>". */
static int tmp_suffix(const char *s)
{
    if (*s == '\0') {
        return 1;
    }
    if (strncmp(s, ".tmp-", 5) != 0) {
        return 0;
    }
    s += 5;
    size_t d = strspn(s, "0123456789");
    if (d == 0 || s[d] != '-') {
        return 0;
    }
    s += d + 1;
    size_t h = strspn(s, "0123456789abcdef");
    return h > 0 && s[h] == '\0';
}

/* A name zr writes in a checkpoint folder: manifest.json, COMPLETE, the rank files of world
   ranks (world < 0: no readable manifest, any rank), each also under its temporary name. */
static int zr_wrote(const char *name, int world)
{
    if (strncmp(name, "manifest.json", 13) == 0) {
        return tmp_suffix(name + 13);
    }
    if (strncmp(name, "COMPLETE", 8) == 0) {
        return tmp_suffix(name + 8);
    }
    size_t d = strncmp(name, "rank_", 5) == 0 ? strspn(name + 5, "0123456789") : 0;
    if (d < 5 || d > 9 || strncmp(name + 5 + d, ".bin", 4) != 0) {
        return 0;
    }
    if (world >= 0) {
        char canon[32];
        long r = strtol(name + 5, NULL, 10);
        snprintf(canon, sizeof canon, "rank_%05ld.bin", r);
        if (r >= world || strncmp(canon, name, 9 + d) != 0) {
            return 0;
        }
    }
    return tmp_suffix(name + 9 + d);
}

/* Remove dir/name if it is a regular file (never a link, a folder); 1 when removed or absent. */
static int remove_file(int dir, const char *name, const char *path, zr_ckpt_warn_fn fn, void *ctx)
{
    struct stat sb;
    if (fstatat(dir, name, &sb, AT_SYMLINK_NOFOLLOW) != 0) {
        return errno == ENOENT;
    }
    if (!S_ISREG(sb.st_mode)) {
        return 0; /* zr writes only regular files: this one is not zr's */
    }
    if (unlinkat(dir, name, 0) != 0 && errno != ENOENT) {
        warn(fn, ctx, "cannot remove %s/%s: %s", path, name, strerror(errno));
        return 0;
    }
    return 1;
}

/* Rename from to "<base><suffix>" or, if that exists, "<base><suffix>.1", ".2", ...;
 *out = the name. */
static zr_status rename_aside(const char *from, const char *base, const char *suffix, char *out,
                              size_t cap)
{
    for (int i = 0; i < 1000; i++) {
        ZR_CHECK(i == 0 ? zr_ckpt_pathf(out, cap, "%s%s", base, suffix)
                        : zr_ckpt_pathf(out, cap, "%s%s.%d", base, suffix, i));
        if (!zr_ckpt_exists(out)) {
            if (rename(from, out) != 0) {
                ZR_FAIL(ZR_ERR_IO, "cannot move %s aside to %s: %s", from, out, strerror(errno));
            }
            return ZR_OK;
        }
    }
    ZR_FAIL(ZR_ERR_IO, "cannot move %s aside: %s%s and 999 numbered names exist", from, base,
            suffix);
}

/* Remove what zr wrote in the open folder fd (path), rank files first, the manifest last;
   count what is left: files zr wrote that could not go, and the rest (list: the first names). */
static int remove_pass(int fd, const char *path, int world, int fault, int64_t step,
                       zr_ckpt_warn_fn fn, void *ctx, int *kept_zr, char *list, size_t cap,
                       zr_status *fst)
{
    static const char *const last[] = {"manifest.json", "COMPLETE"};
    DIR *d = fdopendir(dup(fd));
    int removed = 0, others = 0;
    *kept_zr = 0;
    for (int pass = 0; pass < 2 && d != NULL; pass++) {
        rewinddir(d);
        struct dirent *ent;
        while ((ent = readdir(d)) != NULL) {
            const char *n = ent->d_name;
            int mine = zr_wrote(n, world),
                late = strcmp(n, last[0]) == 0 || strcmp(n, last[1]) == 0;
            if (strcmp(n, ".") == 0 || strcmp(n, "..") == 0) {
                continue;
            }
            if (pass == 0 && mine && !late && remove_file(fd, n, path, fn, ctx) && removed++ == 0 &&
                fault > 0) {
                *fst = zr_ckpt_fault_point(fault, step, 0);
            } else if (pass == 1 && mine) {
                (*kept_zr)++;
            } else if (pass == 1) {
                size_t used = strlen(list);
                if (others++ < 3) {
                    snprintf(list + used, cap - used, "%s%s", others == 1 ? "" : ", ", n);
                }
            }
        }
        for (int i = 0; pass == 0 && i < 2; i++) {
            (void)remove_file(fd, last[i], path, fn, ctx);
        }
    }
    if (d == NULL) {
        warn(fn, ctx, "cannot read %s: %s", path, strerror(errno));
        *kept_zr = 1;
    } else {
        closedir(d);
    }
    return others;
}

/*
 * zr_ckpt_remove_dir (ckpt_impl.h): the rank files before the manifest, so that an interrupted
 * removal still knows them; what zr did not write (a user's file, folder, link: never followed)
 * stays, and the folder becomes step_N.user-files, out of zr's way, with a warning naming it and
 * what it holds. A link or a file at path is left alone. 1 when the folder is gone. fault > 0:
 * *fst gets what zr_ckpt_fault_point returns (fst may be NULL with fault 0).
 */
static int remove_zr_files(const char *path, int fault, int64_t step, zr_ckpt_warn_fn fn, void *ctx,
                           zr_status *fst)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        int err = errno;
        if (err != ENOENT) {
            warn(fn, ctx, "%s is left alone: %s", path,
                 err == ELOOP || err == ENOTDIR
                     ? "it is a symbolic link or not a folder, which zr never makes there"
                     : strerror(err));
        }
        return err == ENOENT;
    }
    /* a removal cleans up after a failed save too: that failure's message stays the error */
    zr_error_saved pending;
    zr_error_save(&pending);
    int world = -1;
    zr_ckpt_manifest m;
    if (zr_ckpt_manifest_read(path, &m) == ZR_OK) {
        world = m.meta.world;
        zr_ckpt_manifest_free(&m);
    }
    zr_error_restore(&pending);
    int kept_zr = 0;
    char list[512] = "";
    int others =
        remove_pass(fd, path, world, fault, step, fn, ctx, &kept_zr, list, sizeof list, fst);
    close(fd);
    if (kept_zr > 0) {
        return 0; /* said above; a later run's zr_ckpt_recover tries again */
    }
    if (others == 0) {
        if (rmdir(path) != 0) {
            warn(fn, ctx, "cannot remove the folder %s: %s", path, strerror(errno));
            return 0;
        }
        return 1;
    }
    /* step_N(.suffix) -> step_N.user-files: no listing or recovery of zr takes that name */
    char base[ZR_PATH_MAX], to[ZR_PATH_MAX];
    snprintf(base, sizeof base, "%s", path);
    char *slash = strrchr(base, '/');
    char *dot = strchr(slash != NULL ? slash : base, '.');
    if (dot != NULL) {
        *dot = '\0';
    }
    if (rename_aside(path, base, ".user-files", to, sizeof to) != ZR_OK) {
        snprintf(to, sizeof to, "%s", path);
        zr_error_restore(&pending);
    }
    char more[32] = "";
    if (others > 3) {
        snprintf(more, sizeof more, " and %d more", others - 3);
    }
    warn(fn, ctx,
         "%s: removed the files zr wrote, but it also holds %s%s, which zr did not write and "
         "does not delete: the folder stays, as %s",
         path, list, more, to);
    return 0;
}

zr_status zr_ckpt_remove_dir(const char *path, int fault, int64_t step)
{
    zr_status st = ZR_OK;
    (void)remove_zr_files(path, fault, step, NULL, NULL, &st);
    return st;
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

/*
 * What an entry named step_<digits> (no suffix) of a checkpoint dir is.
 * Only a CKPT is a checkpoint: a folder (not a link) with COMPLETE, a
 * manifest that passes every check, and the name its manifest's step gives.
 * A DAMAGED one has a checkpoint's name and marker but a manifest that fails
 * (the load that picks it says why); anything else named like a checkpoint is
 * FOREIGN: a link, a file, a copy under another step's name. Only CKPTs are
 * resumed from, exported by default or rotated out; the rest is reported and
 * left alone.
 */
typedef enum { ENTRY_CKPT, ENTRY_DAMAGED, ENTRY_FOREIGN } entry_kind;

typedef struct ckpt_entry {
    int64_t step; /* the manifest's for a CKPT; the name's otherwise */
    entry_kind kind;
    char name[64];
    char why[256]; /* FOREIGN: what it is */
} ckpt_entry;

static int cmp_entry(const void *a, const void *b)
{
    const ckpt_entry *x = a, *y = b;
    return (x->step > y->step) - (x->step < y->step);
}

/* Classify dir/name (named step_<step>); 0 when it is no entry at all (no COMPLETE). */
static int classify(const char *dir, const char *name, int64_t step, ckpt_entry *e)
{
    char p[ZR_PATH_MAX], marker[ZR_PATH_MAX + 16];
    memset(e, 0, sizeof *e);
    e->step = step;
    snprintf(e->name, sizeof e->name, "%s", name);
    if (zr_ckpt_pathf(p, sizeof p, "%s/%s", dir, name) != ZR_OK) {
        return 0;
    }
    struct stat sb;
    if (lstat(p, &sb) != 0) {
        return 0;
    }
    e->kind = ENTRY_FOREIGN;
    if (S_ISLNK(sb.st_mode)) {
        char target[160];
        ssize_t n = readlink(p, target, sizeof target - 1);
        target[n > 0 ? n : 0] = '\0';
        snprintf(e->why, sizeof e->why, "it is a symbolic link (to %s), which zr never makes",
                 target);
        return 1;
    }
    if (!S_ISDIR(sb.st_mode)) {
        snprintf(e->why, sizeof e->why, "it is not a folder");
        return 1;
    }
    snprintf(marker, sizeof marker, "%s/COMPLETE", p);
    if (!zr_ckpt_exists(marker)) {
        return 0; /* a save that stopped midway: zr_ckpt_recover's */
    }
    zr_ckpt_manifest m;
    if (zr_ckpt_manifest_read(p, &m) != ZR_OK) {
        zr_error_clear();
        e->kind = ENTRY_DAMAGED;
        return 1;
    }
    char canon[64];
    snprintf(canon, sizeof canon, "step_%08lld", (long long)m.meta.step);
    if (strcmp(canon, name) != 0) {
        snprintf(e->why, sizeof e->why,
                 "its manifest says step %lld, which zr saves as %s: a copy or a rename, not a "
                 "checkpoint of step %lld",
                 (long long)m.meta.step, canon, (long long)step);
    } else {
        e->kind = ENTRY_CKPT;
        e->step = m.meta.step;
    }
    zr_ckpt_manifest_free(&m);
    return 1;
}

/* Every step_<digits> entry of dir (classified), sorted by step; a missing dir has none. */
static zr_status scan(const char *dir, ckpt_entry **out, int *n)
{
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (d == NULL) {
        if (errno == ENOENT) {
            return ZR_OK;
        }
        char shown[160];
        ZR_FAIL(ZR_ERR_IO, "cannot read checkpoint directory %s: %s",
                zr_file_show(dir, shown, sizeof shown), strerror(errno));
    }
    zr_status st = ZR_OK;
    int cap = 0;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        int64_t s;
        const char *suffix;
        ckpt_entry e;
        /* "step_N.partial" and other suffixed names are leftovers, never checkpoints */
        if (!parse_step_name(ent->d_name, &s, &suffix) || suffix[0] != '\0' ||
            strlen(ent->d_name) >= sizeof e.name || !classify(dir, ent->d_name, s, &e)) {
            continue;
        }
        if (*n == cap) {
            ckpt_entry *grown = NULL;
            cap = cap ? 2 * cap : 16;
            st = ZR_ALLOC_STATUS(grown, (size_t)cap);
            if (st != ZR_OK) {
                break;
            }
            if (*n > 0) {
                memcpy(grown, *out, sizeof *grown * (size_t)*n);
            }
            zr_free(*out);
            *out = grown;
        }
        (*out)[(*n)++] = e;
    }
    closedir(d);
    if (st != ZR_OK) {
        zr_free(*out);
        *out = NULL;
        *n = 0;
        return st;
    }
    if (*n > 1) {
        qsort(*out, (size_t)*n, sizeof **out, cmp_entry);
    }
    return ZR_OK;
}

/* Delete the oldest checkpoints zr wrote beyond keep (current counts), never protect. */
zr_status zr_ckpt_rotate(const char *dir, int64_t current, int keep, int64_t protect)
{
    ckpt_entry *v;
    int n;
    ZR_CHECK(scan(dir, &v, &n));
    zr_status st = ZR_OK;
    int kept = 1; /* the one just written */
    for (int i = n - 1; i >= 0; i--) {
        /* only checkpoints zr wrote and verified, older than the one just written: nothing
           newer (it is another run's future or was set aside), nothing it cannot vouch for */
        if (v[i].kind != ENTRY_CKPT || v[i].step >= current) {
            continue;
        }
        if (kept < keep || v[i].step == protect) {
            kept += v[i].step != protect;
            continue;
        }
        /* one rename takes it out of the list, so a crash during the removal
           never leaves a "complete" checkpoint with files missing */
        char old[ZR_PATH_MAX], gone[ZR_PATH_MAX];
        ZR_CHECK_GOTO(zr_ckpt_pathf(old, sizeof old, "%s/%s", dir, v[i].name), st, done);
        ZR_CHECK_GOTO(zr_ckpt_pathf(gone, sizeof gone, "%s.deleting", old), st, done);
        (void)remove_zr_files(gone, 0, 0, NULL, NULL, NULL); /* an earlier interrupted removal's */
        if (rename(old, gone) != 0) {
            ZR_FAIL_GOTO(st, done, ZR_ERR_IO, "cannot rename %s to %s: %s", old, gone,
                         strerror(errno));
        }
        ZR_CHECK_GOTO(zr_ckpt_fault_point(ZR_CKPT_FAULT_ROTATE_MOVED, current, 0), st, done);
        /* only what its manifest lists: a file a user put there stays, with its folder */
        zr_status fst = ZR_OK;
        (void)remove_zr_files(gone, ZR_CKPT_FAULT_ROTATE_HALF, current, NULL, NULL, &fst);
        ZR_CHECK_GOTO(fst, st, done);
    }
done:
    zr_free(v);
    return st;
}

/* Report what is named like a checkpoint but is none; it is left alone. */
static void report_foreign(const char *dir, const ckpt_entry *v, int n, zr_ckpt_warn_fn fn,
                           void *ctx)
{
    char shown[160];
    for (int i = 0; i < n; i++) {
        if (v[i].kind == ENTRY_FOREIGN) {
            warn(fn, ctx,
                 "%s/%s is not a checkpoint zr can use (%s); it is left alone: never resumed "
                 "from, exported or deleted by zr",
                 zr_file_show(dir, shown, sizeof shown), v[i].name, v[i].why);
        }
    }
}

zr_status zr_ckpt_find_latest(const char *dir, char *path, size_t len, int *found,
                              zr_ckpt_warn_fn fn, void *ctx)
{
    ckpt_entry *v;
    int n;
    *found = 0;
    ZR_CHECK(scan(dir, &v, &n));
    report_foreign(dir, v, n, fn, ctx);
    zr_status st = ZR_OK;
    /* the newest by its manifest; a damaged one newer than that is taken too, so that
       loading it says why it cannot be used (and names the newest intact one) */
    for (int i = n - 1; i >= 0 && !*found; i--) {
        if (v[i].kind != ENTRY_FOREIGN) {
            *found = 1;
            st = zr_ckpt_pathf(path, len, "%s/%s", dir, v[i].name);
        }
    }
    zr_free(v);
    return st;
}

zr_status zr_ckpt_check_ahead(const char *dir, int64_t step)
{
    ckpt_entry *v;
    int n;
    ZR_CHECK(scan(dir, &v, &n));
    char list[1024] = "", shown[160];
    int count = 0;
    for (int i = 0; i < n; i++) {
        if (v[i].kind == ENTRY_FOREIGN && v[i].step > step) {
            size_t used = strlen(list);
            snprintf(list + used, sizeof list - used, "%s%s (%s)", count ? "; " : "", v[i].name,
                     v[i].why);
            count++;
        }
    }
    zr_free(v);
    if (count > 0) {
        ZR_FAIL(ZR_ERR_INVALID,
                "%s holds %d entr%s named like a checkpoint of a later step than this run starts "
                "from (%lld) that %s not one zr can use: %s. A save of this run would collide "
                "with %s, and zr does not move or delete what it did not write: move %s out of "
                "the folder (or rename %s without the step_ prefix)",
                zr_file_show(dir, shown, sizeof shown), count, count == 1 ? "y" : "ies",
                (long long)step, count == 1 ? "is" : "are", list, count == 1 ? "it" : "them",
                count == 1 ? "it" : "them", count == 1 ? "it" : "them");
    }
    return ZR_OK;
}

zr_status zr_ckpt_find_intact(const char *dir, int64_t before, char *path, size_t len, int *found)
{
    ckpt_entry *v;
    int n;
    *found = 0;
    ZR_CHECK(scan(dir, &v, &n));
    zr_status st = ZR_OK;
    for (int i = n - 1; i >= 0 && !*found; i--) {
        if (v[i].kind != ENTRY_CKPT || (before >= 0 && v[i].step >= before)) {
            continue;
        }
        ZR_CHECK_GOTO(zr_ckpt_pathf(path, len, "%s/%s", dir, v[i].name), st, done);
        *found = zr_ckpt_verify(path) == ZR_OK;
        zr_error_clear();
    }
done:
    zr_free(v);
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
    while ((ent = readdir(d)) != NULL) {
        int64_t s;
        const char *suffix;
        char p[ZR_PATH_MAX], q[ZR_PATH_MAX];
        if (!parse_step_name(ent->d_name, &s, &suffix) ||
            zr_ckpt_pathf(p, sizeof p, "%s/%s", dir, ent->d_name) != ZR_OK) {
            continue;
        }
        struct stat sb;
        if (lstat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            continue;
        }
        if (strcmp(suffix, ".partial") == 0 && remove_zr_files(p, 0, 0, fn, ctx, NULL)) {
            warn(fn, ctx,
                 "removed %s: a save of step %lld that did not finish (the job stopped during "
                 "it); the checkpoints before it are intact",
                 p, (long long)s);
        } else if (strcmp(suffix, ".deleting") == 0 && remove_zr_files(p, 0, 0, fn, ctx, NULL)) {
            warn(fn, ctx, "removed %s: an old checkpoint whose rotation was interrupted", p);
        } else if (suffix[0] == '\0') {
            char marker[ZR_PATH_MAX];
            ZR_CHECK_GOTO(zr_ckpt_pathf(marker, sizeof marker, "%s/COMPLETE", p), st, done);
            if (!zr_ckpt_exists(marker)) {
                /* only an older zr or a hand-made folder leaves this; its step
                   would block the save of that step, so it moves, whole */
                ZR_CHECK_GOTO(rename_aside(p, p, ".incomplete", q, sizeof q), st, done);
                warn(fn, ctx,
                     "moved %s aside to %s: it has no COMPLETE marker (a save that stopped "
                     "midway); nothing was deleted",
                     p, q);
            }
        }
    }
    st = zr_file_sync_dir(dir);
done:
    closedir(d);
    return st;
}

zr_status zr_ckpt_set_aside_after(const char *dir, int64_t step, zr_ckpt_warn_fn fn, void *ctx)
{
    ckpt_entry *v;
    int n;
    ZR_CHECK(scan(dir, &v, &n));
    zr_status st = ZR_OK;
    int moved = 0;
    for (int i = 0; i < n; i++) {
        char p[ZR_PATH_MAX], q[ZR_PATH_MAX];
        /* checkpoints (damaged ones too) whose step a later save of this run would take;
           what is not zr's stays where it is */
        if (v[i].kind == ENTRY_FOREIGN || v[i].step <= step) {
            continue;
        }
        ZR_CHECK_GOTO(zr_ckpt_pathf(p, sizeof p, "%s/%s", dir, v[i].name), st, done);
        ZR_CHECK_GOTO(rename_aside(p, p, ".set-aside", q, sizeof q), st, done);
        moved++;
        warn(fn, ctx,
             "moved %s aside to %s: it is newer than the checkpoint this run resumes "
             "from; nothing was deleted",
             p, q);
    }
    if (moved > 0) {
        st = zr_file_sync_dir(dir);
    }
done:
    zr_free(v);
    return st;
}
