/*
 * zr/file.h - the one place where zr touches the file system.
 *
 * Every file zr writes (checkpoints, metrics, exported models, tokenised
 * data) goes through a temporary file that is written fully, fsynced and then
 * renamed over its final name, followed by an fsync of the directory, so a
 * crash leaves either the old file or the new one, never half of one.
 * Every file zr reads as data goes through zr_file_open_read, which refuses
 * anything that is not a regular file (a FIFO would block, a directory or a
 * device would be read as garbage) before opening it.
 * Directories are made with mkdir(2), never through a shell, so no path is
 * ever interpreted: quotes, spaces, newlines and "$()" are just bytes.
 */
#ifndef ZR_FILE_H
#define ZR_FILE_H

#include <stdint.h>
#include <stdio.h>

#include "zr/base.h"

/* Longest path zr builds or accepts, terminator included. */
#define ZR_PATH_MAX 4096

/* Create path and every missing parent (mode 0755); an existing directory is fine. */
zr_status zr_file_mkdir_p(const char *path);

/*
 * Open path for reading ("rb") if it is a regular file. A FIFO, directory,
 * socket or device is refused with ZR_ERR_INVALID naming the path and its
 * kind, before any open that could block or read it.
 */
zr_status zr_file_open_read(const char *path, FILE **out);

/* Size in bytes of the regular file at path. */
zr_status zr_file_size(const char *path, uint64_t *out);

/*
 * Read the whole regular file at path into a buffer from the counted
 * allocator with a '\0' after the last byte; free it with zr_free.
 */
zr_status zr_file_read_all(const char *path, char **out, size_t *n);

/* A file being written under a temporary name ("<path>.tmp"). */
typedef struct zr_file_tmp {
    FILE *f;
    char path[ZR_PATH_MAX];
    char tmp[ZR_PATH_MAX + 8];
} zr_file_tmp;

/* Create "<path>.tmp" for writing (truncating a leftover of a crashed run). */
zr_status zr_file_tmp_open(zr_file_tmp *t, const char *path);

/* Write n bytes; a short write (full disk) is an error naming the file. */
zr_status zr_file_tmp_write(zr_file_tmp *t, const void *data, size_t n);

/*
 * Finish the file: when st (the status of the writes so far) is ZR_OK, flush,
 * fsync, close, rename onto path and fsync the directory; otherwise, or when
 * any of those fails, close and remove the temporary file. Returns the first
 * failure (st itself when it was one). Always releases t->f.
 */
zr_status zr_file_tmp_commit(zr_file_tmp *t, zr_status st);

/* Write data to path atomically (tmp_open, tmp_write, tmp_commit). */
zr_status zr_file_write_atomic(const char *path, const void *data, size_t n);

/* fsync the directory holding path (or path itself if it is a directory). */
zr_status zr_file_sync_dir(const char *path);

#endif /* ZR_FILE_H */
