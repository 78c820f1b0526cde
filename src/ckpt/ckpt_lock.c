/*
 * ckpt_lock.c - the lock that keeps two runs out of one checkpoint directory
 * (zr.lock, an flock held for the whole run and released by the kernel
 * however the process ends), and the check before each save that the folder
 * and its lock file are still the ones this run locked: a folder deleted
 * under a job is never silently re-created without its lock.
 */
#define _DEFAULT_SOURCE /* gethostname */

#include "ckpt_impl.h"

#include "zr/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

zr_status zr_ckpt_lock(const char *dir, zr_ckpt_dir_lock *lk)
{
    lk->fd = -1;
    lk->dir_known = 0;
    ZR_CHECK(zr_file_mkdir_p(dir));
    char path[ZR_PATH_MAX];
    ZR_CHECK(zr_ckpt_pathf(path, sizeof path, "%s/%s", dir, ZR_CKPT_LOCK_FILE));
    int fd = -1, held = 0;
    ZR_CHECK(zr_file_lock(path, O_RDWR, &fd, &held));
    if (held == 0) {
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
    /* the folder as it was locked: a save checks that it is still this one */
    struct stat ds;
    if (stat(dir, &ds) == 0) {
        lk->dir_known = 1;
        lk->dev = (uint64_t)ds.st_dev;
        lk->ino = (uint64_t)ds.st_ino;
    }
    if (held < 0) {
        close(fd);
        /* a file system without locks must not stop training */
        ZR_WARN("cannot lock %s (no locks on this file system): nothing stops a second run from "
                "using %s at the same time",
                path, dir);
        return ZR_OK;
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

zr_status zr_ckpt_lock_check(const char *dir, const zr_ckpt_dir_lock *lk)
{
    char path[ZR_PATH_MAX], shown[160];
    const char *then = "zr does not re-create a checkpoint dir deleted under its run (another run "
                       "may use that name now), so the run stops here, before this save";
    struct stat ds;
    if (lk->dir_known &&
        (stat(dir, &ds) != 0 || (uint64_t)ds.st_dev != lk->dev || (uint64_t)ds.st_ino != lk->ino)) {
        ZR_FAIL(ZR_ERR_IO,
                "checkpoint dir %s was deleted, moved or replaced while this run held it; %s",
                zr_file_show(dir, shown, sizeof shown), then);
    }
    if (lk->fd >= 0) {
        ZR_CHECK(zr_ckpt_pathf(path, sizeof path, "%s/%s", dir, ZR_CKPT_LOCK_FILE));
        ZR_CHECK(zr_file_check_held(lk->fd, path, "the lock file of the checkpoint dir", then));
    }
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
