/*
 * export.c - "zr export": consolidate a sharded checkpoint into files the rest
 * of the world reads: llm.c's GPT-2 model file and a Hugging Face-named
 * safetensors file. Runs as a single process, without MPI, on any machine
 * that can read the checkpoint directory.
 */
#define _POSIX_C_SOURCE 200809L /* lstat */

#include "cli.h"

#include "zr/checkpoint.h"
#include "zr/file.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: zr export --checkpoint DIR [--llmc OUT.bin] [--safetensors OUT.safetensors]\n"
            "  DIR is one checkpoint (ckpt/step_00000200) or a checkpoint directory, in which\n"
            "  case its newest checkpoint (by the step its manifest says) is used. At least one\n"
            "  output is required; no output may be a file of the checkpoint, or the other.\n");
}

static void warn_export(void *ctx, const char *msg)
{
    (void)ctx;
    fprintf(stderr, "zr export: warning: %s\n", msg);
}

/*
 * The checkpoint to export: ckpt itself, or the newest in the checkpoint dir
 * ckpt (by what its manifest says). Its folder, and the dir's lock file, are
 * inputs no output may be.
 */
static zr_status pick(const char *ckpt, char *path, size_t n, zr_ckpt_meta *meta,
                      zr_file_inputs *in)
{
    char probe[4096];
    int found = 0;
    snprintf(probe, sizeof probe, "%s/manifest.json", ckpt);
    struct stat sb;
    if (lstat(probe, &sb) == 0) {
        /* one checkpoint (whatever its manifest is: a link loop, a dangling link, a folder): why
           it cannot be read is the message, not "not a checkpoint" */
        ZR_CHECK(zr_ckpt_read_meta(ckpt, meta));
        snprintf(path, n, "%s", ckpt);
    } else {
        ZR_CHECK(zr_ckpt_find_latest(ckpt, path, n, &found, warn_export, NULL));
        if (!found) {
            ZR_FAIL(ZR_ERR_IO, "%s is neither a complete checkpoint nor a directory holding one",
                    ckpt);
        }
        ZR_CHECK(zr_ckpt_read_meta(path, meta));
        snprintf(probe, sizeof probe, "%s/%s", ckpt, ZR_CKPT_LOCK_FILE);
        ZR_CHECK(zr_file_inputs_add(in, probe, "the lock file of the checkpoint dir"));
    }
    return zr_file_inputs_add(in, path, "the checkpoint exported");
}

/* Each output obeys the rule of zr/file.h; *replaces: a file stood there. */
static zr_status check_out(const char *out, const char *what, zr_file_inputs *in, int *replaces)
{
    if (out == NULL) {
        return ZR_OK;
    }
    ZR_CHECK(zr_file_output_check(out, what, in, replaces));
    char as[64];
    snprintf(as, sizeof as, "the %s output", what);
    return zr_file_inputs_add_output(in, out, as);
}

/* The checkpoint to read (into path, meta), and the outputs checked against every input. */
static zr_status pick_checked(const char *ckpt, const char *llmc, const char *st_path, char *path,
                              size_t len, zr_ckpt_meta *meta, int *rep_llmc, int *rep_st)
{
    zr_file_inputs in;
    zr_file_inputs_init(&in);
    zr_status st;
    ZR_CHECK_GOTO(pick(ckpt, path, len, meta, &in), st, done);
    /* before anything is read or written: no output may be an input or the other output */
    ZR_CHECK_GOTO(check_out(llmc, "--llmc", &in, rep_llmc), st, done);
    st = check_out(st_path, "--safetensors", &in, rep_st);
done:
    zr_file_inputs_free(&in);
    return st;
}

static zr_status run(const char *ckpt, const char *llmc, const char *st_path)
{
    char path[4096];
    zr_ckpt_meta meta;
    int rep_llmc = 0, rep_st = 0;
    ZR_CHECK(pick_checked(ckpt, llmc, st_path, path, sizeof path, &meta, &rep_llmc, &rep_st));
    /* every depth a run can train (zr.model.layers) can be exported: one buffer per unit */
    int n = zr_gpt_config_unit_count(&meta.model);
    float **units;
    ZR_ALLOC(units, (size_t)n);
    zr_status st = ZR_OK;
    for (int u = 0; u < n; u++) {
        ZR_ALLOC_GOTO(units[u], zr_gpt_config_unit_numel(&meta.model, u), st, done);
        ZR_CHECK_GOTO(zr_ckpt_read_unit(path, &meta, u, units[u]), st, done);
    }
    if (llmc != NULL) {
        ZR_CHECK_GOTO(zr_gpt_write_llmc(llmc, &meta.model, units), st, done);
        printf("wrote %s (llm.c GPT-2, fp32) from %s%s\n", llmc, path,
               rep_llmc ? "; it replaced the file that was there" : "");
    }
    if (st_path != NULL) {
        ZR_CHECK_GOTO(zr_gpt_write_safetensors(st_path, &meta.model, units), st, done);
        printf("wrote %s (safetensors, Hugging Face GPT-2 names) from %s%s\n", st_path, path,
               rep_st ? "; it replaced the file that was there" : "");
    }
done:
    for (int u = 0; u < n; u++) {
        zr_free(units[u]);
    }
    zr_free(units);
    return st;
}

int zr_cli_export(int argc, char **argv)
{
    const char *ckpt = NULL, *llmc = NULL, *st = NULL;
    for (int i = 1; i < argc; i++) {
        const char **dst = strcmp(argv[i], "--checkpoint") == 0    ? &ckpt
                           : strcmp(argv[i], "--llmc") == 0        ? &llmc
                           : strcmp(argv[i], "--safetensors") == 0 ? &st
                                                                   : NULL;
        if (strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (dst == NULL || i + 1 >= argc) {
            if (dst == NULL) {
                zr_cli_bad_arg("export", argc, argv, i);
            } else {
                fprintf(stderr, "zr export: error: %s needs a value\n", argv[i]);
            }
            usage(stderr);
            return 2;
        }
        *dst = argv[++i];
    }
    if (ckpt == NULL || (llmc == NULL && st == NULL)) {
        fprintf(stderr, "zr export: error: %s\n",
                ckpt == NULL ? "--checkpoint is missing"
                             : "give --llmc or --safetensors (or both)");
        usage(stderr);
        return 2;
    }
    zr_status s = run(ckpt, llmc, st);
    if (s != ZR_OK) {
        fprintf(stderr, "zr export: error: %s\n", zr_error_message());
        return s == ZR_ERR_INVALID || s == ZR_ERR_FORMAT ? 2 : 1;
    }
    return 0;
}
