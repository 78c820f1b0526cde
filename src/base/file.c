/*
 * file.c - file-system helpers shared by every layer: mkdir -p without a
 * shell, reads that refuse non-regular files, and atomic writes (temporary
 * file, fsync, rename, fsync of the directory). See include/zr/file.h.
 */
#define _DEFAULT_SOURCE /* flock */
#include "zr/file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *kind_of(mode_t mode)
{
    if (S_ISDIR(mode)) {
        return "a directory";
    }
    if (S_ISFIFO(mode)) {
        return "a FIFO";
    }
    if (S_ISCHR(mode)) {
        return "a character device";
    }
    if (S_ISBLK(mode)) {
        return "a block device";
    }
    if (S_ISSOCK(mode)) {
        return "a socket";
    }
    return "not a regular file";
}

const char *zr_file_show(const char *path, char *buf, size_t n)
{
    size_t len = strlen(path);
    if (len < n && len <= 120) {
        return path;
    }
    /* the start says where, the end says which file; the reason follows the path */
    size_t keep = n > 48 ? (n - 40) / 2 : 4;
    keep = keep > 60 ? 60 : keep;
    snprintf(buf, n, "%.*s...%s (%zu characters)", (int)keep, path,
             path + len - (keep < len ? keep : len), len);
    return buf;
}

static zr_status copy_path(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n == 0) {
        ZR_FAIL(ZR_ERR_INVALID, "empty path");
    }
    if (n >= cap) {
        char shown[160];
        ZR_FAIL(ZR_ERR_INVALID, "path longer than %zu bytes: %s", cap - 1,
                zr_file_show(src, shown, sizeof shown));
    }
    memcpy(dst, src, n + 1);
    return ZR_OK;
}

/* Why path, which exists by name (EEXIST), is not a folder: a broken link, a loop, a file. */
static zr_status not_a_folder(const char *path)
{
    char shown[160], target[256];
    const char *p = zr_file_show(path, shown, sizeof shown);
    struct stat sb, lb;
    if (stat(path, &sb) == 0) {
        ZR_FAIL(ZR_ERR_IO, "cannot create directory %s: it exists and is %s", p,
                kind_of(sb.st_mode));
    }
    int err = errno;
    if (lstat(path, &lb) == 0 && S_ISLNK(lb.st_mode)) {
        ssize_t n = readlink(path, target, sizeof target - 1);
        target[n > 0 ? n : 0] = '\0';
        if (err == ELOOP) {
            ZR_FAIL(ZR_ERR_IO,
                    "cannot use directory %s: it is a symbolic link (to %s) in a loop of links "
                    "that never reaches a directory",
                    p, target);
        }
        if (err == ENOENT) {
            ZR_FAIL(ZR_ERR_IO,
                    "cannot use directory %s: it is a dangling symbolic link (to %s, which does "
                    "not exist); remove the link or create its target",
                    p, target);
        }
    }
    ZR_FAIL(ZR_ERR_IO, "cannot create directory %s: %s", p, strerror(err));
}

/* mkdir that accepts an existing directory (but not an existing file). */
static zr_status make_one(const char *path)
{
    if (mkdir(path, 0755) == 0) {
        return ZR_OK;
    }
    int err = errno;
    struct stat sb;
    if (err == EEXIST) {
        if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            return ZR_OK;
        }
        return not_a_folder(path);
    }
    char shown[160];
    ZR_FAIL(ZR_ERR_IO, "cannot create directory %s: %s", zr_file_show(path, shown, sizeof shown),
            strerror(err));
}

zr_status zr_file_mkdir_p(const char *path)
{
    char buf[ZR_PATH_MAX];
    ZR_CHECK(copy_path(buf, sizeof buf, path));
    for (char *p = buf + 1; *p != '\0'; p++) {
        if (*p == '/' && p[-1] != '/') {
            *p = '\0';
            ZR_CHECK(make_one(buf));
            *p = '/';
        }
    }
    return make_one(buf);
}

zr_status zr_file_open_read(const char *path, FILE **out)
{
    char shown[160];
    *out = NULL;
    struct stat sb, fb;
    if (stat(path, &sb) != 0) {
        ZR_FAIL(ZR_ERR_IO, "cannot open %s: %s", zr_file_show(path, shown, sizeof shown),
                strerror(errno));
    }
    if (!S_ISREG(sb.st_mode)) {
        ZR_FAIL(ZR_ERR_INVALID, "%s is %s, not a regular file; refusing to read it",
                zr_file_show(path, shown, sizeof shown), kind_of(sb.st_mode));
    }
    /* O_NONBLOCK: if the path was swapped for a FIFO after the stat, the open
     * must not block; the fstat below then refuses it. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        ZR_FAIL(ZR_ERR_IO, "cannot open %s: %s", zr_file_show(path, shown, sizeof shown),
                strerror(errno));
    }
    if (fstat(fd, &fb) != 0 || !S_ISREG(fb.st_mode)) {
        close(fd);
        ZR_FAIL(ZR_ERR_INVALID, "%s changed while it was opened and is not a regular file",
                zr_file_show(path, shown, sizeof shown));
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) {
        (void)fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    }
    FILE *f = fdopen(fd, "rb");
    if (f == NULL) {
        int err = errno;
        close(fd);
        ZR_FAIL(ZR_ERR_IO, "cannot open %s: %s", zr_file_show(path, shown, sizeof shown),
                strerror(err));
    }
    *out = f;
    return ZR_OK;
}

zr_status zr_file_read_all(const char *path, char **out, size_t *n)
{
    char shown[160];
    *out = NULL;
    *n = 0;
    FILE *f;
    ZR_CHECK(zr_file_open_read(path, &f));
    zr_status st = ZR_OK;
    char *buf = NULL;
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        ZR_FAIL_GOTO(st, fail, ZR_ERR_IO, "cannot size %s: %s",
                     zr_file_show(path, shown, sizeof shown), strerror(errno));
    }
    size_t len = (size_t)sb.st_size;
    if ((uint64_t)sb.st_size >= (uint64_t)SIZE_MAX) {
        ZR_FAIL_GOTO(st, fail, ZR_ERR_NOMEM, "%s is too large to read",
                     zr_file_show(path, shown, sizeof shown));
    }
    ZR_ALLOC_GOTO(buf, len + 1, st, fail);
    if (len > 0 && fread(buf, 1, len, f) != len) {
        ZR_FAIL_GOTO(st, fail, ZR_ERR_IO, "cannot read %s: %s",
                     zr_file_show(path, shown, sizeof shown),
                     ferror(f) ? strerror(errno) : "file shrank while it was read");
    }
    buf[len] = '\0';
    fclose(f);
    *out = buf;
    *n = len;
    return ZR_OK;
fail:
    zr_free(buf);
    fclose(f);
    return st;
}

/*
 * What is at path now, for an output: nothing (*exists = 0), a regular file
 * (*exists = 1), or a refusal naming what else it is. A symbolic link is
 * refused, whatever it points to: the write would go through it to a file
 * zr was not given (or replace the link by a file).
 */
zr_status zr_file_output_kind(const char *path, int *exists)
{
    char shown[160];
    struct stat sb;
    *exists = 0;
    if (lstat(path, &sb) != 0) {
        if (errno == ENOENT) {
            return ZR_OK;
        }
        ZR_FAIL(ZR_ERR_IO, "cannot write %s: %s", zr_file_show(path, shown, sizeof shown),
                strerror(errno));
    }
    if (S_ISLNK(sb.st_mode)) {
        char target[256];
        ssize_t n = readlink(path, target, sizeof target - 1);
        target[n > 0 ? n : 0] = '\0';
        ZR_FAIL(ZR_ERR_INVALID,
                "%s is a symbolic link (to %s); zr does not write through links: give the path "
                "of the file itself",
                zr_file_show(path, shown, sizeof shown), n > 0 ? target : "?");
    }
    if (!S_ISREG(sb.st_mode)) {
        ZR_FAIL(ZR_ERR_INVALID, "%s is %s, not a regular file; refusing to write to it",
                zr_file_show(path, shown, sizeof shown), kind_of(sb.st_mode));
    }
    *exists = 1;
    return ZR_OK;
}

/* A name for the temporary file that no one else uses: "<path>.tmp-<pid>-<counter><clock>". */
static int tmp_name(char *out, size_t cap, const char *path, unsigned attempt)
{
    static unsigned counter;
    unsigned long long noise =
        (unsigned long long)(zr_now() * 1e9) ^ ((unsigned long long)attempt << 40);
    int n = snprintf(out, cap, "%s.tmp-%ld-%u%06llx", path, (long)getpid(), counter++,
                     noise & 0xffffffull);
    return n > 0 && (size_t)n < cap;
}

zr_status zr_file_tmp_open(zr_file_tmp *t, const char *path)
{
    char shown[160];
    t->f = NULL;
    t->replaces = 0;
    ZR_CHECK(copy_path(t->path, sizeof t->path, path));
    ZR_CHECK(zr_file_output_kind(path, &t->replaces));
    /* created here and nowhere else: O_EXCL fails on anything already there (a
       leftover, or a link planted to redirect the write), O_NOFOLLOW never
       follows a link */
    for (unsigned attempt = 0; attempt < 100; attempt++) {
        if (!tmp_name(t->tmp, sizeof t->tmp, path, attempt)) {
            ZR_FAIL(ZR_ERR_INVALID, "path too long for a temporary file beside it: %s",
                    zr_file_show(path, shown, sizeof shown));
        }
        int fd = open(t->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd < 0 && errno == EEXIST) {
            continue;
        }
        if (fd < 0) {
            ZR_FAIL(ZR_ERR_IO, "cannot create %s: %s", zr_file_show(t->tmp, shown, sizeof shown),
                    strerror(errno));
        }
        t->f = fdopen(fd, "wb");
        if (t->f == NULL) {
            int err = errno;
            close(fd);
            unlink(t->tmp);
            ZR_FAIL(ZR_ERR_IO, "cannot create %s: %s", zr_file_show(t->tmp, shown, sizeof shown),
                    strerror(err));
        }
        return ZR_OK;
    }
    ZR_FAIL(ZR_ERR_IO, "cannot create a temporary file beside %s: 100 names were taken",
            zr_file_show(path, shown, sizeof shown));
}

zr_status zr_file_tmp_write(zr_file_tmp *t, const void *data, size_t n)
{
    if (n > 0 && fwrite(data, 1, n, t->f) != n) {
        ZR_FAIL(ZR_ERR_IO, "cannot write %s: %s", t->tmp, strerror(errno));
    }
    return ZR_OK;
}

zr_status zr_file_sync_dir(const char *path)
{
    char dir[ZR_PATH_MAX];
    ZR_CHECK(copy_path(dir, sizeof dir, path));
    struct stat sb;
    if (!(stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode))) {
        char *slash = strrchr(dir, '/');
        if (slash == NULL) {
            strcpy(dir, ".");
        } else if (slash == dir) {
            dir[1] = '\0';
        } else {
            *slash = '\0';
        }
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        ZR_FAIL(ZR_ERR_IO, "cannot open directory %s: %s", dir, strerror(errno));
    }
    /* Some file systems cannot fsync a directory (EINVAL); the rename is then
     * as durable as they make it. */
    if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS) {
        int err = errno;
        close(fd);
        ZR_FAIL(ZR_ERR_IO, "cannot fsync directory %s: %s", dir, strerror(err));
    }
    close(fd);
    return ZR_OK;
}

zr_status zr_file_tmp_commit(zr_file_tmp *t, zr_status st)
{
    char a[160], b[160];
    ZR_ASSERT(t->f != NULL);
    if (st == ZR_OK && (fflush(t->f) != 0 || fsync(fileno(t->f)) != 0)) {
        st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__, "cannot write %s: %s",
                         zr_file_show(t->tmp, a, sizeof a), strerror(errno));
    }
    if (fclose(t->f) != 0 && st == ZR_OK) {
        st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__, "cannot close %s: %s",
                         zr_file_show(t->tmp, a, sizeof a), strerror(errno));
    }
    t->f = NULL;
    /* what stands at the final name may have changed since the open: the
       rename must not replace a device, a folder's entry or a link either */
    int exists = 0;
    if (st == ZR_OK) {
        st = zr_file_output_kind(t->path, &exists);
    }
    if (st == ZR_OK && rename(t->tmp, t->path) != 0) {
        st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__, "cannot rename %s to %s: %s",
                         zr_file_show(t->tmp, a, sizeof a), zr_file_show(t->path, b, sizeof b),
                         strerror(errno));
    }
    if (st != ZR_OK) {
        unlink(t->tmp);
        return st;
    }
    return zr_file_sync_dir(t->path);
}

zr_status zr_file_write_atomic(const char *path, const void *data, size_t n)
{
    zr_file_tmp t;
    ZR_CHECK(zr_file_tmp_open(&t, path));
    return zr_file_tmp_commit(&t, zr_file_tmp_write(&t, data, n));
}

zr_status zr_file_lock(const char *path, int flags, int *fd, int *held)
{
    char shown[160];
    const char *p = zr_file_show(path, shown, sizeof shown);
    *fd = -1;
    *held = 0;
    /* a file replaced between the open and the lock (a run ending that removes it, a user) is
       opened again: the lock must be on the file the path names */
    for (int attempt = 0; attempt < 8; attempt++) {
        int f = open(path, flags | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
        if (f < 0) {
            ZR_FAIL(ZR_ERR_IO, "cannot open %s: %s", p,
                    errno == ELOOP ? "it is a symbolic link, which zr does not write through"
                                   : strerror(errno));
        }
        struct stat fb, pb;
        if (fstat(f, &fb) != 0 || !S_ISREG(fb.st_mode)) {
            close(f);
            ZR_FAIL(ZR_ERR_INVALID, "%s is not a regular file; refusing to write to it", p);
        }
        int fl = fcntl(f, F_GETFL);
        if (fl >= 0) {
            (void)fcntl(f, F_SETFL, fl & ~O_NONBLOCK);
        }
        if (flock(f, LOCK_EX | LOCK_NB) != 0) {
            int err = errno;
            *fd = f;
            if (err == EWOULDBLOCK) {
                return ZR_OK; /* *held = 0: the caller reads who holds it, and closes */
            }
            if (err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS) {
                *held = -1; /* a file system without locks */
                return ZR_OK;
            }
            close(f);
            *fd = -1;
            ZR_FAIL(ZR_ERR_IO, "cannot lock %s: %s", p, strerror(err));
        }
        if (lstat(path, &pb) == 0 && pb.st_dev == fb.st_dev && pb.st_ino == fb.st_ino) {
            *fd = f;
            *held = 1;
            return ZR_OK;
        }
        close(f);
    }
    ZR_FAIL(ZR_ERR_IO, "cannot lock %s: it was replaced each time it was opened", p);
}

zr_status zr_file_check_held(int fd, const char *path, const char *what, const char *then)
{
    char shown[160];
    struct stat fb, pb;
    if (fstat(fd, &fb) != 0) {
        ZR_FAIL(ZR_ERR_IO, "cannot check %s %s: %s", what, zr_file_show(path, shown, sizeof shown),
                strerror(errno));
    }
    int gone = lstat(path, &pb) != 0;
    if (gone || pb.st_dev != fb.st_dev || pb.st_ino != fb.st_ino) {
        ZR_FAIL(ZR_ERR_IO, "%s %s was %s while this run held it; %s", what,
                zr_file_show(path, shown, sizeof shown),
                gone ? "deleted or moved away" : "replaced by another file", then);
    }
    return ZR_OK;
}

/* Bytes written to fd that its reader has not taken yet (0 when unknown or not a pipe). */
static int unread_bytes(int fd)
{
    struct stat sb;
    int n = 0;
    if (fstat(fd, &sb) != 0) {
        return 0;
    }
    if (S_ISFIFO(sb.st_mode)) {
        /* Linux answers FIONREAD on either end of a pipe: what is in its buffer */
        return ioctl(fd, FIONREAD, &n) == 0 ? n : 0;
    }
    if (S_ISSOCK(sb.st_mode) || isatty(fd)) {
        /* sockets (SIOCOUTQ) and terminals: what is queued for the other side */
        return ioctl(fd, TIOCOUTQ, &n) == 0 ? n : 0;
    }
    return 0;
}

void zr_file_drain_std(double max_s)
{
    fflush(stdout);
    fflush(stderr);
    double t0 = zr_now();
    while ((unread_bytes(STDOUT_FILENO) > 0 || unread_bytes(STDERR_FILENO) > 0) &&
           zr_now() - t0 < max_s) {
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}
