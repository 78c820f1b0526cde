/*
 * ckpt_dir.c - the checkpoint directory around the checkpoints: finding the
 * newest (intact) one, rotating old ones out, clearing what crashed saves
 * left, setting newer ones aside, and the lock that keeps two runs out of one
 * directory (see zr/checkpoint.h).
 *
 * Every change to the directory is a rename first (to a name with a suffix
 * that no listing takes for a checkpoint), then the removal, so a crash at
 * any point leaves complete checkpoints and leftovers that zr_ckpt_recover
 * recognises by their suffix.
 */
#define _DEFAULT_SOURCE /* flock, gethostname */

#include "ckpt_impl.h"

#include "zr/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
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

/*
 * Remove a checkpoint-like directory and the files in it (one level deep).
 * fault > 0: zr_ckpt_fault_point(fault) after the first file is gone, so a test can
 * stop a removal halfway (or fail it: the only failure returned).
 */
zr_status zr_ckpt_remove_dir(const char *path, int fault, int64_t step)
{
    zr_status st = ZR_OK;
    DIR *d = opendir(path);
    if (d != NULL) {
        struct dirent *ent;
        char p[ZR_PATH_MAX];
        int removed = 0;
        while ((ent = readdir(d)) != NULL) {
            if (strcmp(ent->d_name, ".") == 0 || strcmp(ent->d_name, "..") == 0) {
                continue;
            }
            if (zr_ckpt_pathf(p, sizeof p, "%s/%s", path, ent->d_name) == ZR_OK && unlink(p) == 0 &&
                removed++ == 0 && fault > 0) {
                st = zr_ckpt_fault_point(fault, step, 0);
            }
        }
        closedir(d);
    }
    rmdir(path);
    return st;
}

/* Rename from to "<from><suffix>" or, if that exists, "<from><suffix>.1", ".2", ...;
 *out = the name. */
static zr_status rename_aside(const char *from, const char *suffix, char *out, size_t cap)
{
    for (int i = 0; i < 1000; i++) {
        ZR_CHECK(i == 0 ? zr_ckpt_pathf(out, cap, "%s%s", from, suffix)
                        : zr_ckpt_pathf(out, cap, "%s%s.%d", from, suffix, i));
        if (!zr_ckpt_exists(out)) {
            if (rename(from, out) != 0) {
                ZR_FAIL(ZR_ERR_IO, "cannot move %s aside to %s: %s", from, out, strerror(errno));
            }
            return ZR_OK;
        }
    }
    ZR_FAIL(ZR_ERR_IO, "cannot move %s aside: %s%s and 999 numbered names exist", from, from,
            suffix);
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
        zr_ckpt_remove_dir(gone, 0, 0); /* a leftover of an earlier interrupted removal */
        if (rename(old, gone) != 0) {
            ZR_FAIL_GOTO(st, done, ZR_ERR_IO, "cannot rename %s to %s: %s", old, gone,
                         strerror(errno));
        }
        ZR_CHECK_GOTO(zr_ckpt_fault_point(ZR_CKPT_FAULT_ROTATE_MOVED, current, 0), st, done);
        ZR_CHECK_GOTO(zr_ckpt_remove_dir(gone, ZR_CKPT_FAULT_ROTATE_HALF, current), st, done);
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
        if (strcmp(suffix, ".partial") == 0) {
            warn(fn, ctx,
                 "removed %s: a save of step %lld that did not finish (the job stopped during "
                 "it); the checkpoints before it are intact",
                 p, (long long)s);
            zr_ckpt_remove_dir(p, 0, 0);
        } else if (strcmp(suffix, ".deleting") == 0) {
            warn(fn, ctx, "removed %s: an old checkpoint whose rotation was interrupted", p);
            zr_ckpt_remove_dir(p, 0, 0);
        } else if (suffix[0] == '\0') {
            char marker[ZR_PATH_MAX];
            ZR_CHECK_GOTO(zr_ckpt_pathf(marker, sizeof marker, "%s/COMPLETE", p), st, done);
            if (!zr_ckpt_exists(marker)) {
                /* only an older zr or a hand-made folder leaves this; its step
                   would block the save of that step, so it moves, whole */
                ZR_CHECK_GOTO(rename_aside(p, ".incomplete", q, sizeof q), st, done);
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
        ZR_CHECK_GOTO(rename_aside(p, ".set-aside", q, sizeof q), st, done);
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

zr_status zr_ckpt_lock(const char *dir, zr_ckpt_dir_lock *lk)
{
    lk->fd = -1;
    ZR_CHECK(zr_file_mkdir_p(dir));
    char path[ZR_PATH_MAX];
    ZR_CHECK(zr_ckpt_pathf(path, sizeof path, "%s/%s", dir, ZR_CKPT_LOCK_FILE));
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
