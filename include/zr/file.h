/*
 * zr/file.h - the one place where zr touches the file system.
 *
 * One rule for every file zr writes (checkpoints, metrics, exported models,
 * plots, configurations, probes, tokenised data):
 *   - it is never one of the run's inputs (data, model, configuration,
 *     probe, checkpoint, plotted metrics), told by device and inode (through
 *     symbolic and hard links), nor inside an input folder (a checkpoint);
 *   - it is never anything but a regular file, and never written through a
 *     symbolic link;
 *   - it is written to a temporary file created exclusively beside it
 *     (O_EXCL | O_NOFOLLOW), every write, the flush, the fsync and the close
 *     checked, then renamed over its final name and the directory fsynced, so
 *     a crash leaves the old file or the new one, never half of one;
 *   - a file it replaces is said to be replaced (zr_file_tmp.replaces), and
 *     one another run appends to (metrics) is not replaced by a fresh run.
 * zr_file_output_check (output.c) is the first point, zr_file_tmp_* the rest.
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

/*
 * Read the whole regular file at path into a buffer from the counted
 * allocator with a '\0' after the last byte; free it with zr_free.
 */
zr_status zr_file_read_all(const char *path, char **out, size_t *n);

/*
 * A path for a message: itself when short, else its start and end with its
 * length ("/tmp/aaaa...aaaa/x.bin (4012 characters)"), so that the reason
 * after it is never cut off. Returns path or buf.
 */
const char *zr_file_show(const char *path, char *buf, size_t n);

/*
 * May path be replaced by a file zr writes? ZR_OK when nothing is there
 * (*exists = 0) or a regular file (*exists = 1); ZR_ERR_INVALID naming what
 * it is when it is a symbolic link (zr never writes through one), a
 * directory, a device, a FIFO or a socket. (zr_file_output_check, below,
 * also refuses the inputs of the run.)
 */
zr_status zr_file_output_kind(const char *path, int *exists);

/* A file being written under a temporary name beside its final one. */
typedef struct zr_file_tmp {
    FILE *f;
    int replaces; /* a regular file stood at path when the write began */
    char path[ZR_PATH_MAX];
    char tmp[ZR_PATH_MAX + 48];
} zr_file_tmp;

/*
 * Start writing path: refused unless zr_file_output_kind accepts it; the
 * temporary file "<path>.tmp-<unique>" is created exclusively (O_EXCL |
 * O_NOFOLLOW), so a file or link planted under a temporary name is never
 * written through, and two writers never share one.
 */
zr_status zr_file_tmp_open(zr_file_tmp *t, const char *path);

/* Write n bytes; a short write (full disk) is an error naming the file. */
zr_status zr_file_tmp_write(zr_file_tmp *t, const void *data, size_t n);

/*
 * Finish the file: when st (the status of the writes so far) is ZR_OK, flush,
 * fsync, close, check path again (zr_file_output_kind: it may have changed
 * meanwhile), rename onto path and fsync the directory; otherwise, or when
 * any of those fails, close and remove the temporary file. Returns the first
 * failure (st itself when it was one). Always releases t->f.
 */
zr_status zr_file_tmp_commit(zr_file_tmp *t, zr_status st);

/* Write data to path atomically (tmp_open, tmp_write, tmp_commit). */
zr_status zr_file_write_atomic(const char *path, const void *data, size_t n);

/* ---- the inputs an output must not be (output.c) ----------------------------------- */

/* One input of a run (or an output already chosen, which another may not repeat). */
typedef struct zr_file_input {
    int has_id; /* dev/ino hold the file's (it exists) */
    uint64_t dev, ino;
    int folder;          /* a folder: nothing inside it may be an output */
    uint64_t pdev, pino; /* the folder holding it, with name: an output not yet written */
    char name[256];
    char what[128];  /* "the training data (zr.data.path)" */
    char shown[160]; /* its path, shortened for messages */
} zr_file_input;

typedef struct zr_file_inputs {
    zr_file_input *v; /* counted allocation */
    int n, cap;
} zr_file_inputs;

void zr_file_inputs_init(zr_file_inputs *in);
void zr_file_inputs_free(zr_file_inputs *in);

/*
 * Add path as an input described by what ("the training data (--data)"): a
 * file, or a folder whose files are inputs too, found through symbolic links.
 * A path that does not exist adds nothing (it cannot be overwritten).
 */
zr_status zr_file_inputs_add(zr_file_inputs *in, const char *path, const char *what);

/*
 * Add path as an output already chosen (what: "the --llmc output"), so that
 * a second output naming the same file, written or not, is refused.
 */
zr_status zr_file_inputs_add_output(zr_file_inputs *in, const char *path, const char *what);

/*
 * May path be written as the output what ("--metrics")? ZR_ERR_INVALID naming
 * both when it is one of inputs (same device and inode, through symbolic and
 * hard links) or inside an input folder, or when zr_file_output_kind refuses
 * it; *exists = 1 when a regular file stands there (the write replaces it).
 * inputs may be NULL.
 */
zr_status zr_file_output_check(const char *path, const char *what, const zr_file_inputs *inputs,
                               int *exists);

/*
 * Open the regular file at path (flags: O_RDWR or O_WRONLY, and O_APPEND), creating it (0644)
 * when missing, never through a symbolic link, and take an exclusive flock on it without
 * waiting; the kernel releases it when *fd is closed or the process ends, by a signal too.
 * *held = 1: locked, and path still names the file locked (one replaced between the open and
 * the lock is opened again); 0: another open file holds it (*fd is open, to read who; the
 * caller closes it); -1: the file system has no locks (*fd open, unlocked). A link, a folder, a
 * device or a FIFO is refused naming path.
 */
zr_status zr_file_lock(const char *path, int flags, int *fd, int *held);

/*
 * Is the file open as fd still the one at path (same device and inode)? ZR_ERR_IO otherwise:
 * "<what> <path> was deleted or moved away (or replaced by another file) while this run held
 * it; <then>".
 */
zr_status zr_file_check_held(int fd, const char *path, const char *what, const char *then);

/* fsync the directory holding path (or path itself if it is a directory). */
zr_status zr_file_sync_dir(const char *path);

/*
 * Flush stdout and stderr and wait (at most max_s seconds) until whoever
 * reads them (a launcher's pipe, a terminal, a socket) has taken every byte.
 * Before a job is torn down (MPI_Abort), a launcher may act on the abort
 * before it reads what the rank printed last, and the message saying why the
 * job ended would be lost; after this call it has been read.
 */
void zr_file_drain_std(double max_s);

#endif /* ZR_FILE_H */
