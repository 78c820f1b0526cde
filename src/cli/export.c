/*
 * export.c - "zr export": consolidate a sharded checkpoint into files the rest
 * of the world reads: llm.c's GPT-2 model file and a Hugging Face-named
 * safetensors file. Runs as a single process, without MPI, on any machine
 * that can read the checkpoint directory.
 */
#include "cli.h"

#include "zr/checkpoint.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: zr export --checkpoint DIR [--llmc OUT.bin] [--safetensors OUT.safetensors]\n"
            "  DIR is one checkpoint (ckpt/step_00000200) or a checkpoint directory, in which\n"
            "  case the newest complete checkpoint is used. At least one output is required.\n");
}

static zr_status run(const char *ckpt, const char *llmc, const char *st_path)
{
    char path[4096];
    int found = 0;
    zr_ckpt_meta meta;
    char probe[4096];
    snprintf(probe, sizeof probe, "%s/manifest.json", ckpt);
    if (access(probe, F_OK) == 0) {
        /* one checkpoint: why it cannot be read is the message, not "not a checkpoint" */
        ZR_CHECK(zr_ckpt_read_meta(ckpt, &meta));
        snprintf(path, sizeof path, "%s", ckpt);
    } else {
        ZR_CHECK(zr_ckpt_find_latest(ckpt, path, sizeof path, &found));
        if (!found) {
            ZR_FAIL(ZR_ERR_IO, "%s is neither a complete checkpoint nor a directory holding one",
                    ckpt);
        }
        ZR_CHECK(zr_ckpt_read_meta(path, &meta));
    }
    /* every depth a run can train (zr.model.layers) can be exported: one buffer per unit */
    int n = zr_gpt_config_unit_count(&meta.model);
    float **units;
    ZR_ALLOC(units, (size_t)n);
    zr_status st = ZR_OK;
    for (int u = 0; u < n && st == ZR_OK; u++) {
        st = zr_alloc_at((void **)&units[u],
                         zr_gpt_config_unit_numel(&meta.model, u) * sizeof(float), __FILE__,
                         __LINE__);
        if (st == ZR_OK) {
            st = zr_ckpt_read_unit(path, &meta, u, units[u]);
        }
    }
    if (st == ZR_OK && llmc != NULL) {
        st = zr_gpt_write_llmc(llmc, &meta.model, units);
        if (st == ZR_OK) {
            printf("wrote %s (llm.c GPT-2, fp32) from %s\n", llmc, path);
        }
    }
    if (st == ZR_OK && st_path != NULL) {
        st = zr_gpt_write_safetensors(st_path, &meta.model, units);
        if (st == ZR_OK) {
            printf("wrote %s (safetensors, Hugging Face GPT-2 names) from %s\n", st_path, path);
        }
    }
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
            fprintf(stderr, "zr export: %s '%s'\n",
                    dst == NULL ? "unknown option" : "missing value for", argv[i]);
            usage(stderr);
            return 2;
        }
        *dst = argv[++i];
    }
    if (ckpt == NULL || (llmc == NULL && st == NULL)) {
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
