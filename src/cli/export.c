/*
 * export.c - "zr export": consolidate a sharded checkpoint into files the rest
 * of the world reads: llm.c's GPT-2 model file and a Hugging Face-named
 * safetensors file, and a Hugging Face folder (--hf: config.json and
 * safetensors, sharded past a size, that transformers' from_pretrained
 * loads). Runs as a single process, without MPI, on any machine that can
 * read the checkpoint directory.
 */
#define _POSIX_C_SOURCE 200809L /* lstat */

#include "cli.h"

#include "../model/hf_write.h"

#include "zr/checkpoint.h"
#include "zr/gpt_engine.h" /* zr_gpt_config_describe */
#include "zr/file.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: zr export --checkpoint DIR [--llmc OUT.bin] [--safetensors OUT.safetensors]\n"
            "                 [--hf OUTDIR [--dtype f32|bf16|f16] [--max-shard-size N[KMG]B]]\n"
            "  DIR is one checkpoint (ckpt/step_00000200) or a checkpoint directory, in which\n"
            "  case its newest checkpoint (by the step its manifest says) is used. At least one\n"
            "  output is required; no output may be a file of the checkpoint, or the other.\n"
            "  --hf writes a new Hugging Face folder (an existing OUTDIR is refused): config.json\n"
            "  and the weights in --dtype (default f32; bf16 and f16 round to nearest even, a\n"
            "  value out of f16's range is an error), one model.safetensors or, past\n"
            "  --max-shard-size (default 5GB, as transformers), model-0000k-of-0000N.safetensors\n"
            "  and model.safetensors.index.json.\n");
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
static zr_status pick_checked(const char *ckpt, const char *llmc, const char *st_path,
                              const char *hf, char *path, size_t len, zr_ckpt_meta *meta,
                              int *rep_llmc, int *rep_st)
{
    struct stat sb;
    /* a folder is written new: whatever stands there (a folder too) is refused, by its name */
    if (hf != NULL && lstat(hf, &sb) == 0) {
        ZR_FAIL(ZR_ERR_INVALID,
                "--hf %s already exists: a Hugging Face folder is written new, never over "
                "another (remove it or choose another name)",
                hf);
    }
    zr_file_inputs in;
    zr_file_inputs_init(&in);
    zr_status st;
    int rep_hf = 0;
    ZR_CHECK_GOTO(pick(ckpt, path, len, meta, &in), st, done);
    /* before anything is read or written: no output may be an input or another output */
    ZR_CHECK_GOTO(check_out(llmc, "--llmc", &in, rep_llmc), st, done);
    ZR_CHECK_GOTO(check_out(st_path, "--safetensors", &in, rep_st), st, done);
    st = check_out(hf, "--hf", &in, &rep_hf);
done:
    zr_file_inputs_free(&in);
    return st;
}

static zr_status run(const char *ckpt, const char *llmc, const char *st_path, const char *hf,
                     const zr_hf_write_opts *o)
{
    char path[4096];
    zr_ckpt_meta meta;
    int rep_llmc = 0, rep_st = 0;
    ZR_CHECK(pick_checked(ckpt, llmc, st_path, hf, path, sizeof path, &meta, &rep_llmc, &rep_st));
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
    if (hf != NULL) {
        ZR_CHECK_GOTO(zr_hf_write_model(hf, &meta.model, units, o), st, done);
        char shape[256];
        zr_gpt_config_describe(&meta.model, shape, sizeof shape);
        printf("wrote %s (Hugging Face %s folder, %s; %s) from %s\n", hf,
               meta.model.arch == ZR_ARCH_LLAMA ? "Llama-family" : "GPT2LMHeadModel",
               zr_hf_dtype_torch(o->dtype), shape, path);
    }
done:
    for (int u = 0; u < n; u++) {
        zr_free(units[u]);
    }
    zr_free(units);
    return st;
}

/* --dtype and --max-shard-size into o (only with --hf); 0, or 2 after a message. */
static int hf_options(const char *hf, const char *dtype, const char *shard, zr_hf_write_opts *o)
{
    *o = (zr_hf_write_opts){.dtype = ZR_HF_F32, .max_shard_bytes = 5000000000ull};
    if (hf == NULL && (dtype != NULL || shard != NULL)) {
        fprintf(stderr, "zr export: error: %s applies to --hf only\n",
                dtype != NULL ? "--dtype" : "--max-shard-size");
        return 2;
    }
    const char *bad = dtype != NULL && zr_hf_dtype_parse(dtype, &o->dtype) != ZR_OK ? "--dtype"
                      : shard != NULL && zr_hf_size_parse(shard, &o->max_shard_bytes) != ZR_OK
                          ? "--max-shard-size"
                          : NULL;
    if (bad != NULL) {
        fprintf(stderr, "zr export: error: %s: %s\n", bad, zr_error_message());
        return 2;
    }
    return 0;
}

int zr_cli_export(int argc, char **argv)
{
    const char *ckpt = NULL, *llmc = NULL, *st = NULL, *hf = NULL, *dtype = NULL, *shard = NULL;
    for (int i = 1; i < argc; i++) {
        const char **dst = strcmp(argv[i], "--checkpoint") == 0       ? &ckpt
                           : strcmp(argv[i], "--llmc") == 0           ? &llmc
                           : strcmp(argv[i], "--safetensors") == 0    ? &st
                           : strcmp(argv[i], "--hf") == 0             ? &hf
                           : strcmp(argv[i], "--dtype") == 0          ? &dtype
                           : strcmp(argv[i], "--max-shard-size") == 0 ? &shard
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
    if (ckpt == NULL || (llmc == NULL && st == NULL && hf == NULL)) {
        fprintf(stderr, "zr export: error: %s\n",
                ckpt == NULL ? "--checkpoint is missing"
                             : "give --llmc, --safetensors or --hf (or several)");
        usage(stderr);
        return 2;
    }
    zr_hf_write_opts o;
    if (hf_options(hf, dtype, shard, &o) != 0) {
        return 2;
    }
    zr_status s = run(ckpt, llmc, st, hf, &o);
    if (s != ZR_OK) {
        fprintf(stderr, "zr export: error: %s\n", zr_error_message());
        return s == ZR_ERR_INVALID || s == ZR_ERR_FORMAT ? 2 : 1;
    }
    return 0;
}
