/*
 * test_cli_llama.c - `zr train --init` of a Hugging Face folder, end to end
 * through the binary (issue 43): a Llama folder trains, checkpoints record
 * its shape, a resume continues it exactly (at the same and at another
 * world size), and what does not fit is refused with a message naming it,
 * nothing written: a folder whose tensors do not match its config (a tied
 * config with an lm_head, an untied one without), an architecture zr does
 * not train, a sequence past max_position_embeddings, data of another
 * vocabulary, a resume that does not name the folder, and an export to
 * GPT-2's formats. A GPT-2 folder (GPT2LMHeadModel) trains too.
 */
#define _DEFAULT_SOURCE /* mkdtemp */
#include "test.h"

#include <stdarg.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

static char zr_bin[4096], work[4096], root[4096];
static int code;
static char out[1 << 16];

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A shell command in the work folder; its output (stdout and stderr) in out. */
static int sh(const char *fmt, ...)
{
    static char cmd[8192], full[8448];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(full, sizeof full, "(cd %s && %s) 2>&1 </dev/null", work, cmd);
    FILE *p = popen(full, "r");
    if (p == NULL) {
        return code = -1;
    }
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    char rest[4096];
    while (fread(rest, 1, sizeof rest, p) > 0) {
    }
    int st = pclose(p);
    code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    TEST_CHECKF(strstr(out, "Sanitizer") == NULL && strstr(out, "runtime error:") == NULL,
                "sanitizer report from %.300s:\n%s", cmd, out);
    return code;
}

#define OUT_HAS(s) TEST_CHECKF(strstr(out, s) != NULL, "output lacks \"%s\":\n%.3000s", s, out)

/* The training loss of each step in a metrics file, into l (at most n); returns the count. */
static int losses_of(const char *metrics, double *l, int n)
{
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", work, metrics);
    FILE *f = fopen(path, "r");
    int k = 0;
    char line[8192];
    while (f != NULL && k < n && fgets(line, sizeof line, f) != NULL) {
        const char *at = strstr(line, "\"loss\":");
        if (at != NULL && strstr(line, "\"step\"") != NULL) {
            l[k++] = strtod(at + 7, NULL);
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    return k;
}

#define GQA "%s/tests/data/hf/llama_gqa"
#define BASE                                                                                       \
    " --seq-len 32 --val-every 0 --warmup 2 --scheduler.params.total_num_steps 6"                  \
    " --communication_data_type fp32 --no-qwz --no-qgz --hpz 1"

/* 6 steps straight; 3, a checkpoint, then 3 more resumed: the same losses, bit for bit. */
static void test_resume_exact(void)
{
    double a[8], b[8];
    TEST_EQ_INT(sh("%s train --init " GQA BASE
                   " --micro-batch 2 --steps 6 --metrics straight.jsonl",
                   zr_bin, root),
                0);
    OUT_HAS("LlamaForCausalLM: L=2 NH=8 KV=2 head_dim=8");
    TEST_EQ_INT(
        sh("%s train --init " GQA BASE " --micro-batch 2 --steps 3 --ckpt-dir ck", zr_bin, root),
        0);
    TEST_EQ_INT(sh("grep -q '\"arch\":[[:space:]]*\"llama\"' ck/step_00000003/manifest.json"), 0);
    TEST_EQ_INT(sh("%s train --init " GQA BASE " --micro-batch 2 --steps 6 --ckpt-dir ck --resume",
                   zr_bin, root),
                0);
    OUT_HAS("resumed from");
    int na = losses_of("straight.jsonl", a, 8), nb = losses_of("ck/metrics.jsonl", b, 8);
    TEST_EQ_INT(na, 6);
    TEST_EQ_INT(nb, 6);
    for (int i = 0; i < na && i < nb; i++) {
        TEST_CHECKF(a[i] == b[i], "step %d: %.9g straight, %.9g resumed", i + 1, a[i], b[i]);
    }
}

/*
 * The 1-rank checkpoint resumed at 2 ranks of micro-batch 1: the same global batch, exact
 * collectives (fp32 on the wire, ZeRO++'s quantization off: it is on by default at stage 3), the
 * same losses within the sums' order (1e-5).
 */
static void test_resume_resharded(void)
{
    double a[8], b[8];
    TEST_EQ_INT(
        sh("%s train --init " GQA BASE " --micro-batch 2 --steps 3 --ckpt-dir rs", zr_bin, root),
        0);
    TEST_EQ_INT(sh("mpirun.openmpi --oversubscribe -np 2 %s train --init " GQA BASE
                   " --micro-batch 1 --steps 6 --ckpt-dir rs --resume",
                   zr_bin, root),
                0);
    OUT_HAS("now 2");
    int na = losses_of("straight.jsonl", a, 8), nb = losses_of("rs/metrics.jsonl", b, 8);
    TEST_EQ_INT(nb, 6);
    for (int i = 3; i < na && i < nb; i++) {
        TEST_CHECKF(fabs(a[i] - b[i]) <= 1e-5 * fabs(a[i]), "step %d: %.9g at 1 rank, %.9g at 2",
                    i + 1, a[i], b[i]);
    }
}

/* A copy of reference folder `from` as folder `to` with config.json's `key` set to `value`. */
static void edited(const char *from, const char *to, const char *key, const char *value)
{
    TEST_EQ_INT(sh("rm -rf %s && mkdir %s && cp %s/tests/data/hf/%s/model.safetensors %s/ && "
                   "sed 's/\"%s\": [^,]*/\"%s\": %s/' %s/tests/data/hf/%s/config.json > "
                   "%s/config.json && grep -q '\"%s\": %s' %s/config.json",
                   to, to, root, from, to, key, key, value, root, from, to, key, value, to),
                0);
}

static void test_refusals(void)
{
    /* tied in the config, an lm_head in the file: an extra tensor */
    edited("llama_gqa", "tied", "tie_word_embeddings", "true");
    TEST_CHECK(sh("%s train --init tied --seq-len 32 --steps 1 --ckpt-dir c1", zr_bin) != 0);
    OUT_HAS("tensor lm_head.weight is not one of the model's");
    TEST_EQ_INT(sh("test -e c1"), 1);
    /* untied in the config, no lm_head in the file: a missing tensor */
    edited("llama_mha_tied", "untied", "tie_word_embeddings", "false");
    TEST_CHECK(sh("%s train --init untied --vocab-size 320 --seq-len 32 --steps 1", zr_bin) != 0);
    OUT_HAS("tensor lm_head.weight is missing");
    /* a tensor whose shape is not the config's (intermediate_size 136 in the file) */
    edited("llama_gqa", "narrow", "intermediate_size", "128");
    TEST_CHECK(sh("%s train --init narrow --seq-len 32 --steps 1", zr_bin) != 0);
    OUT_HAS("tensor model.layers.0.mlp.gate_proj.weight has shape [136, 64], the model's is [128, "
            "64]");
    /* an architecture zr does not train */
    edited("llama_gqa", "other", "model_type", "\"gemma\"");
    TEST_EQ_INT(sh("sed -i 's/LlamaForCausalLM/GemmaForCausalLM/' other/config.json"), 0);
    TEST_CHECK(sh("%s train --init other --seq-len 32 --steps 1", zr_bin) != 0);
    OUT_HAS("GemmaForCausalLM");
    /* past max_position_embeddings (256) */
    TEST_CHECK(sh("%s train --init " GQA " --seq-len 512 --steps 1", zr_bin, root) != 0);
    OUT_HAS("256");
    /* a vocabulary key that is not the folder's */
    TEST_CHECK(
        sh("%s train --init " GQA " --vocab-size 1000 --seq-len 32 --steps 1", zr_bin, root) != 0);
    OUT_HAS("zr.model.vocab_size is 1000, but the model file");
    /* the bundled corpus's byte tokens fit Qwen2's 384: the model's vocabulary decides */
    TEST_EQ_INT(sh("%s train --init %s/tests/data/hf/qwen2 --seq-len 32 --steps 1", zr_bin, root),
                0);
}

/* A Llama checkpoint: a resume must name the folder; GPT-2's formats refuse it, nothing written. */
static void test_llama_checkpoint_rules(void)
{
    TEST_EQ_INT(sh("test -d ck/step_00000006"), 0);
    TEST_CHECK(sh("%s train --seq-len 32 --steps 8 --ckpt-dir ck --resume", zr_bin) != 0);
    OUT_HAS("is a Llama-family model (LlamaForCausalLM");
    OUT_HAS("--init");
    TEST_CHECK(sh("%s export --checkpoint ck --llmc x.bin", zr_bin) != 0);
    OUT_HAS("export it as a Hugging Face folder");
    TEST_CHECK(sh("%s export --checkpoint ck --safetensors x.safetensors", zr_bin) != 0);
    OUT_HAS("export it as a Hugging Face folder");
    TEST_EQ_INT(sh("ls | grep -c '^x\\.'"), 1); /* grep -c finds none: exit 1 */
    /* its Hugging Face folder: the family's config.json, and zr trains from it again, from the
       loss the checkpoint's own resume starts at */
    TEST_EQ_INT(sh("%s export --checkpoint ck --hf ck_hf --dtype f32", zr_bin), 0);
    OUT_HAS("Hugging Face Llama-family folder, float32; LlamaForCausalLM: L=2 NH=8 KV=2");
    TEST_EQ_INT(sh("grep -q LlamaForCausalLM ck_hf/config.json"), 0);
    TEST_EQ_INT(
        sh("%s train --init ck_hf" BASE " --micro-batch 2 --steps 1 --metrics again.jsonl", zr_bin),
        0);
    TEST_CHECK(sh("%s export --checkpoint ck --hf ck_hf", zr_bin) != 0); /* never over a folder */
    OUT_HAS("already exists");
}

/*
 * GPT-2 from a Hugging Face folder (GPT2LMHeadModel): it trains at 2 ranks, each reading its
 * shards, from the same first loss as at 1 rank (the weights are the folder's, exactly), and its
 * checkpoint is a GPT-2 that llm.c's format takes.
 */
static void test_gpt2_folder(void)
{
    double a[4], b[4];
    const char *args = " --init %s/tests/data/hf/gpt2 --vocab-size 320" BASE;
    char fmt[512];
    snprintf(fmt, sizeof fmt, "%%s train%s --steps 2 --micro-batch 2 --metrics g1.jsonl", args);
    TEST_EQ_INT(sh(fmt, zr_bin, root), 0);
    OUT_HAS("(L=2 NH=4 C=64 V=320 max_seq_len=64) from");
    snprintf(fmt, sizeof fmt,
             "mpirun.openmpi --oversubscribe -np 2 %%s train%s --steps 2 --ckpt-dir g2 "
             "--micro-batch 1",
             args);
    TEST_EQ_INT(sh(fmt, zr_bin, root), 0);
    TEST_EQ_INT(losses_of("g1.jsonl", a, 4), 2);
    TEST_EQ_INT(losses_of("g2/metrics.jsonl", b, 4), 2);
    TEST_CHECKF(fabs(a[0] - b[0]) <= 1e-6 * a[0], "first loss %.9g at 1 rank, %.9g at 2", a[0],
                b[0]);
    TEST_EQ_INT(sh("%s export --checkpoint g2 --llmc g2.bin && test -s g2.bin", zr_bin), 0);
}

int main(int argc, char **argv)
{
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "cannot find myself\n");
        return 1;
    }
    self[n] = '\0';
    for (int up = 0; up < 2; up++) { /* build/<variant>/tests/test_x -> build/<variant> */
        *strrchr(self, '/') = '\0';
    }
    snprintf(zr_bin, sizeof zr_bin, "%s/zr", self);
    for (int up = 0; up < 2; up++) { /* build/<variant> -> the repository */
        *strrchr(self, '/') = '\0';
    }
    snprintf(root, sizeof root, "%s", self);
    snprintf(work, sizeof work, "/tmp/zr-test-llama-XXXXXX");
    if (access(zr_bin, X_OK) != 0 || mkdtemp(work) == NULL) {
        fprintf(stderr, "no zr at %s, or no temporary folder\n", zr_bin);
        return 1;
    }
    (void)argc, (void)argv;
    setenv("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=0:halt_on_error=1", 1);
    setenv("ZR_PROGRESS", "0", 1);
    unsetenv("ZR_RANKS_PER_NODE");
    TEST_RUN(test_resume_exact);
    TEST_RUN(test_resume_resharded);
    TEST_RUN(test_refusals);
    TEST_RUN(test_llama_checkpoint_rules);
    TEST_RUN(test_gpt2_folder);
    sh("rm -rf %s", work);
    return zr_test_finish();
}
