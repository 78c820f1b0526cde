/*
 * output.c - the first half of the rule every file zr writes obeys (see
 * include/zr/file.h): an output is never one of the run's inputs, nor inside
 * an input folder (a checkpoint), nor a second name for another output of the
 * same command. Files are told apart by device and inode, not by name, so a
 * symbolic link, a hard link, "./x" or "../run/x" naming an input is that
 * input. What is at the output's path (a link, a device, a folder) is
 * zr_file_output_kind's to refuse, and the writing itself is file.c's.
 */
#define _DEFAULT_SOURCE /* realpath */

#include "zr/file.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void zr_file_inputs_init(zr_file_inputs *in)
{
    memset(in, 0, sizeof *in);
}

void zr_file_inputs_free(zr_file_inputs *in)
{
    zr_free(in->v);
    memset(in, 0, sizeof *in);
}

static zr_status grow(zr_file_inputs *in, zr_file_input **out)
{
    if (in->n == in->cap) {
        int cap = in->cap > 0 ? 2 * in->cap : 16;
        zr_file_input *v;
        ZR_ALLOC(v, (size_t)cap);
        if (in->n > 0) {
            memcpy(v, in->v, sizeof *v * (size_t)in->n);
        }
        zr_free(in->v);
        in->v = v;
        in->cap = cap;
    }
    *out = &in->v[in->n++];
    memset(*out, 0, sizeof **out);
    return ZR_OK;
}

/* The folder holding path ("a/b" -> "a", "b" -> ".", "/b" -> "/"). */
static void parent_of(const char *path, char *out, size_t n)
{
    snprintf(out, n, "%s", path);
    size_t len = strlen(out);
    while (len > 1 && out[len - 1] == '/') {
        out[--len] = '\0';
    }
    char *slash = strrchr(out, '/');
    if (slash == NULL) {
        snprintf(out, n, ".");
    } else if (slash == out) {
        out[1] = '\0';
    } else {
        *slash = '\0';
    }
}

static void set_shown(zr_file_input *e, const char *path)
{
    char buf[sizeof e->shown];
    snprintf(e->shown, sizeof e->shown, "%s", zr_file_show(path, buf, sizeof buf));
}

static const char *base_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash != NULL ? slash + 1 : path;
}

zr_status zr_file_inputs_add(zr_file_inputs *in, const char *path, const char *what)
{
    struct stat sb;
    if (path == NULL || path[0] == '\0' || stat(path, &sb) != 0) {
        return ZR_OK; /* nothing there: nothing to overwrite */
    }
    zr_file_input *e;
    ZR_CHECK(grow(in, &e));
    e->has_id = 1;
    e->dev = (uint64_t)sb.st_dev;
    e->ino = (uint64_t)sb.st_ino;
    e->folder = S_ISDIR(sb.st_mode);
    snprintf(e->what, sizeof e->what, "%s", what);
    set_shown(e, path);
    return ZR_OK;
}

zr_status zr_file_inputs_add_output(zr_file_inputs *in, const char *path, const char *what)
{
    zr_file_input *e;
    ZR_CHECK(grow(in, &e));
    struct stat sb;
    if (stat(path, &sb) == 0) {
        e->has_id = 1;
        e->dev = (uint64_t)sb.st_dev;
        e->ino = (uint64_t)sb.st_ino;
    }
    char dir[ZR_PATH_MAX];
    parent_of(path, dir, sizeof dir);
    if (stat(dir, &sb) == 0) {
        e->pdev = (uint64_t)sb.st_dev;
        e->pino = (uint64_t)sb.st_ino;
        snprintf(e->name, sizeof e->name, "%s", base_of(path));
    }
    snprintf(e->what, sizeof e->what, "%s", what);
    set_shown(e, path);
    return ZR_OK;
}

/* The input folder that holds path at any depth (through links), or NULL. */
static const zr_file_input *inside_folder(const char *path, const zr_file_inputs *in)
{
    char dir[ZR_PATH_MAX], real[PATH_MAX];
    parent_of(path, dir, sizeof dir);
    /* the nearest folder that exists: a metrics file may create the ones below it */
    while (realpath(dir, real) == NULL) {
        if (errno != ENOENT || strcmp(dir, ".") == 0 || strcmp(dir, "/") == 0) {
            return NULL;
        }
        char up[ZR_PATH_MAX];
        parent_of(dir, up, sizeof up);
        snprintf(dir, sizeof dir, "%s", up);
    }
    for (;;) {
        struct stat sb;
        if (stat(real, &sb) == 0) {
            for (int i = 0; i < in->n; i++) {
                const zr_file_input *e = &in->v[i];
                if (e->folder && e->dev == (uint64_t)sb.st_dev && e->ino == (uint64_t)sb.st_ino) {
                    return e;
                }
            }
        }
        char *slash = strrchr(real, '/');
        if (slash == NULL || (slash == real && real[1] == '\0')) {
            return NULL;
        }
        slash[slash == real ? 1 : 0] = '\0';
    }
}

zr_status zr_file_output_check(const char *path, const char *what, const zr_file_inputs *inputs,
                               int *exists)
{
    char buf[160];
    *exists = 0;
    if (path == NULL || path[0] == '\0') {
        ZR_FAIL(ZR_ERR_INVALID, "%s: empty path", what);
    }
    const char *shown = zr_file_show(path, buf, sizeof buf);
    for (int i = 0; inputs != NULL && i < inputs->n; i++) {
        const zr_file_input *e = &inputs->v[i];
        struct stat sb;
        int same = e->has_id && stat(path, &sb) == 0 && e->dev == (uint64_t)sb.st_dev &&
                   e->ino == (uint64_t)sb.st_ino;
        if (!same && e->name[0] != '\0' && strcmp(e->name, base_of(path)) == 0) {
            char dir[ZR_PATH_MAX];
            parent_of(path, dir, sizeof dir);
            same = stat(dir, &sb) == 0 && e->pdev == (uint64_t)sb.st_dev &&
                   e->pino == (uint64_t)sb.st_ino;
        }
        if (same) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "%s %s is %s (%s): an output never replaces an input or another output; "
                    "choose another path",
                    what, shown, e->what, e->shown);
        }
    }
    const zr_file_input *f = inputs != NULL ? inside_folder(path, inputs) : NULL;
    if (f != NULL) {
        ZR_FAIL(ZR_ERR_INVALID,
                "%s %s is inside %s (%s), an input of this command: nothing is written there; "
                "choose a path outside it",
                what, shown, f->what, f->shown);
    }
    zr_status st = zr_file_output_kind(path, exists);
    if (st != ZR_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", zr_error_message());
        ZR_FAIL(st, "%s: %s", what, why);
    }
    return ZR_OK;
}
