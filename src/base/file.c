/*
 * file.c - file-system helpers shared by every layer: mkdir -p without a
 * shell, reads that refuse non-regular files, and atomic writes (temporary
 * file, fsync, rename, fsync of the directory). See include/zr/file.h.
 */
#define _POSIX_C_SOURCE 200809L
#include "zr/file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
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

static zr_status copy_path(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n == 0) {
        ZR_FAIL(ZR_ERR_INVALID, "empty path");
    }
    if (n >= cap) {
        ZR_FAIL(ZR_ERR_INVALID, "path longer than %zu bytes: %.64s...", cap - 1, src);
    }
    memcpy(dst, src, n + 1);
    return ZR_OK;
}

/* mkdir that accepts an existing directory (but not an existing file). */
static zr_status make_one(const char *path)
{
    if (mkdir(path, 0755) == 0) {
        return ZR_OK;
    }
    int err = errno;
    struct stat sb;
    if (err == EEXIST && stat(path, &sb) == 0) {
        if (S_ISDIR(sb.st_mode)) {
            return ZR_OK;
        }
        ZR_FAIL(ZR_ERR_IO, "cannot create directory %s: it exists and is %s", path,
                kind_of(sb.st_mode));
    }
    ZR_FAIL(ZR_ERR_IO, "cannot create directory %s: %s", path, strerror(err));
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
    *out = NULL;
    struct stat sb, fb;
    if (stat(path, &sb) != 0) {
        ZR_FAIL(ZR_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    }
    if (!S_ISREG(sb.st_mode)) {
        ZR_FAIL(ZR_ERR_INVALID, "%s is %s, not a regular file; refusing to read it", path,
                kind_of(sb.st_mode));
    }
    /* O_NONBLOCK: if the path was swapped for a FIFO after the stat, the open
     * must not block; the fstat below then refuses it. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        ZR_FAIL(ZR_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    }
    if (fstat(fd, &fb) != 0 || !S_ISREG(fb.st_mode)) {
        close(fd);
        ZR_FAIL(ZR_ERR_INVALID, "%s changed while it was opened and is not a regular file", path);
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) {
        (void)fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    }
    FILE *f = fdopen(fd, "rb");
    if (f == NULL) {
        int err = errno;
        close(fd);
        ZR_FAIL(ZR_ERR_IO, "cannot open %s: %s", path, strerror(err));
    }
    *out = f;
    return ZR_OK;
}

zr_status zr_file_size(const char *path, uint64_t *out)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        ZR_FAIL(ZR_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    }
    if (!S_ISREG(sb.st_mode)) {
        ZR_FAIL(ZR_ERR_INVALID, "%s is %s, not a regular file", path, kind_of(sb.st_mode));
    }
    *out = (uint64_t)sb.st_size;
    return ZR_OK;
}

zr_status zr_file_read_all(const char *path, char **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    FILE *f;
    ZR_CHECK(zr_file_open_read(path, &f));
    zr_status st = ZR_OK;
    char *buf = NULL;
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        ZR_FAIL_GOTO(st, fail, ZR_ERR_IO, "cannot size %s: %s", path, strerror(errno));
    }
    size_t len = (size_t)sb.st_size;
    if ((uint64_t)sb.st_size >= (uint64_t)SIZE_MAX) {
        ZR_FAIL_GOTO(st, fail, ZR_ERR_NOMEM, "%s is too large to read", path);
    }
    st = zr_alloc_at((void **)&buf, len + 1, __FILE__, __LINE__);
    if (st != ZR_OK) {
        goto fail;
    }
    if (len > 0 && fread(buf, 1, len, f) != len) {
        ZR_FAIL_GOTO(st, fail, ZR_ERR_IO, "cannot read %s: %s", path,
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

zr_status zr_file_tmp_open(zr_file_tmp *t, const char *path)
{
    t->f = NULL;
    ZR_CHECK(copy_path(t->path, sizeof t->path, path));
    snprintf(t->tmp, sizeof t->tmp, "%s.tmp", path);
    t->f = fopen(t->tmp, "wb");
    if (t->f == NULL) {
        ZR_FAIL(ZR_ERR_IO, "cannot create %s: %s", t->tmp, strerror(errno));
    }
    return ZR_OK;
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
    ZR_ASSERT(t->f != NULL);
    if (st == ZR_OK && (fflush(t->f) != 0 || fsync(fileno(t->f)) != 0)) {
        st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__, "cannot write %s: %s", t->tmp,
                         strerror(errno));
    }
    if (fclose(t->f) != 0 && st == ZR_OK) {
        st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__, "cannot close %s: %s", t->tmp,
                         strerror(errno));
    }
    t->f = NULL;
    if (st == ZR_OK && rename(t->tmp, t->path) != 0) {
        st = zr_error_at(ZR_ERR_IO, __FILE__, __LINE__, "cannot rename %s to %s: %s", t->tmp,
                         t->path, strerror(errno));
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
