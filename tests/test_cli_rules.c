/*
 * test_cli_rules.c - the rules the zr program keeps whatever it is given
 * (issue 25), end to end through the binary, most of it as one process
 * without a launcher (fast):
 *
 *   - no output ever destroys an input: every output flag (--metrics,
 *     --llmc, --safetensors, plot -o, --write-config, probe -o) against every
 *     kind of input (data, model file, config, probe, a checkpoint's files and
 *     folder, the lock, plotted metrics, another run's metrics), named
 *     directly, through a symbolic link and a hard link; and never a FIFO, a
 *     folder or a link, never through a planted temporary name;
 *   - a checkpoint is known by what it holds (a copy under a newer name is
 *     not resumed from nor exported); zr deletes only what it wrote, and a
 *     metrics file another run holds is refused (issue 39);
 *   - a resume changes nothing silently (refused or listed and recorded);
 *     what the checkpoint does not record is said not compared, never taken
 *     as unchanged, and its data unrecorded is refused like other data; at
 *     another world size the global batch is the checkpoint's;
 *   - defaults that depend on the input's size fit a small input (with a
 *     note), explicit values keep their refusal;
 *   - a stop under a real mpirun (SIGINT, SIGTERM) in the middle of a
 *     multi-second save: the previous checkpoint stays intact, the new one is
 *     complete or absent, and with the grace period of scripts/mpienv.sh the
 *     stop saves;
 *   - messages a user can act on: every command names the flag it refuses and an empty
 *     argument, and never prints bytes from a file raw.
 *
 * Arguments select tests by name (substrings).
 */
#define _DEFAULT_SOURCE /* mkdtemp, usleep, mkfifo */
#include "test.h"

#include "zr/checkpoint.h"
#include "zr/file.h"
#include "zr/plan.h"

#include <cJSON.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

static char zr_bin[4096], work[4096], root[4096];

#define TINY                                                                                       \
    " --layers 1 --channels 32 --heads 2 --seq-len 32 --micro-batch 2 --val-every 0"               \
    " --steps_per_print 1000 --warmup 2"

static struct {
    int code;
    char out[1 << 16];
} res;

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Run a shell command; its output (stdout and stderr) in res.out; sanitizer reports fail. */
static int sh(const char *fmt, ...)
{
    static char cmd[16384], full[16640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(full, sizeof full, "(%s) 2>&1 </dev/null", cmd);
    FILE *p = popen(full, "r");
    if (p == NULL) {
        res.code = -1;
        return -1;
    }
    size_t n = fread(res.out, 1, sizeof res.out - 1, p);
    res.out[n] = '\0';
    char rest[4096];
    while (fread(rest, 1, sizeof rest, p) > 0) {
    }
    int st = pclose(p);
    res.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    TEST_CHECKF(strstr(res.out, "Sanitizer") == NULL && strstr(res.out, "runtime error:") == NULL,
                "sanitizer report from %.300s:\n%s", cmd, res.out);
    return res.code;
}

#define OUT_HAS(s)                                                                                 \
    TEST_CHECKF(strstr(res.out, (s)) != NULL, "output lacks \"%s\":\n%s", (s), res.out)

/* CRC-32C of a file's bytes (0 when unreadable), to see that an input did not change. */
static uint32_t file_crc(const char *path)
{
    FILE *f = fopen(path, "rb");
    uint32_t crc = 0;
    char buf[8192];
    size_t k;
    while (f != NULL && (k = fread(buf, 1, sizeof buf, f)) > 0) {
        crc = zr_crc32c(crc, buf, k);
    }
    if (f != NULL) {
        fclose(f);
    }
    return crc;
}

static void wpath(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", work, name);
}

/* A probe file as zr probe writes it, for one rank (no measuring needed). */
static void write_probe(const char *name, double fwd_block)
{
    zr_probe p;
    memset(&p, 0, sizeof p);
    p.version = ZR_PROBE_VERSION;
    p.world = p.nodes = p.ranks_per_node = p.threads = 1;
    p.layers = 1, p.heads = 2, p.channels = 32, p.vocab = 256, p.padded_vocab = 256;
    p.seq_len = 32, p.max_seq_len = 1024;
    p.ncompute = 2;
    for (int i = 0; i < 2; i++) {
        zr_probe_compute *c = &p.compute[i];
        c->batch = 1 << i;
        c->fwd_embed = c->fwd_head = c->bwd_head = c->bwd_embed = 1e-4 * c->batch;
        c->fwd_block = fwd_block * c->batch;
        c->bwd_block = 2e-4 * c->batch;
    }
    p.adamw = p.sumsq = p.bf16_enc = p.bf16_dec = p.f32_add = 1e-9;
    p.q_enc[0] = p.q_dec[0] = p.q_enc[1] = p.q_dec[1] = 1e-9;
    p.base_rss = 1e8;
    p.mem_per_rank = 4e9;
    char path[4200];
    wpath(path, sizeof path, name);
    TEST_OK(zr_probe_write(path, &p));
}

/* The fixtures: data, config, probe, a checkpoint with metrics, a model file. */
static void setup(void)
{
    static char text[40000];
    for (size_t i = 0; i < sizeof text; i++) {
        text[i] = (char)("abcdefgh ijklmnop\n"[(i * 7 + i / 13) % 18]);
    }
    char p[4200];
    wpath(p, sizeof p, "data.txt");
    zr_test_write_file(p, text, sizeof text);
    text[0] = 'Z';
    wpath(p, sizeof p, "data2.txt");
    zr_test_write_file(p, text, sizeof text);
    wpath(p, sizeof p, "cfg.json");
    zr_test_write_file(p, "{\"zr\": {\"model\": {\"layers\": 1}}}\n", 33);
    write_probe("probe.json", 2e-4);
    TEST_EQ_INT(
        sh("cd %s && %s train" TINY " --steps 2 --data data.txt --ckpt-dir ck", work, zr_bin), 0);
    TEST_EQ_INT(sh("cd %s && %s export --checkpoint ck --llmc init.bin", work, zr_bin), 0);
}

/* ---- 1. no output ever destroys an input --------------------------------------------------- */

typedef struct out_case {
    const char *name;
    const char *cmd;    /* %s: zr; run in work; OUT where the output goes */
    const char *input;  /* the file (in work) that must not change */
    const char *expect; /* in the message */
} out_case;

static void test_outputs_never_inputs(void)
{
    /* the same inputs under other names: a link and a hard link */
    TEST_EQ_INT(sh("cd %s && ln -sf data.txt data.link && ln -f data.txt data.hard && "
                   "ln -f init.bin init.hard && ln -sf ck/step_00000002 ckpt.link && "
                   "mkfifo fifo && mkdir -p adir && ln -sf nowhere dangling && "
                   "cp ck/metrics.jsonl other.jsonl",
                   work),
                0);
    static const out_case cases[] = {
        /* zr train --metrics */
        {"metrics = data", "%s train" TINY " --steps 1 --data data.txt --metrics data.txt",
         "data.txt", "is the training data"},
        {"metrics = data via link",
         "%s train" TINY " --steps 1 --data data.txt --metrics data.link", "data.txt",
         "is the training data"},
        {"metrics = data via hard link",
         "%s train" TINY " --steps 1 --data data.hard --metrics data.txt", "data.txt",
         "is the training data"},
        {"metrics = init", "%s train" TINY " --steps 1 --init init.bin --metrics init.hard",
         "init.bin", "is the model file"},
        {"metrics = config", "%s train" TINY " --steps 1 --config cfg.json --metrics cfg.json",
         "cfg.json", "is the configuration file"},
        {"metrics = manifest on resume",
         "%s train" TINY " --steps 3 --data data.txt --ckpt-dir ck --resume "
         "--metrics ck/step_00000002/manifest.json",
         "ck/step_00000002/manifest.json", "is inside a checkpoint"},
        {"metrics = rank file via a linked folder",
         "%s train" TINY " --steps 3 --data data.txt --ckpt-dir ck --resume "
         "--metrics ckpt.link/rank_00000.bin",
         "ck/step_00000002/rank_00000.bin", "is inside a checkpoint"},
        {"metrics = the lock",
         "%s train" TINY " --steps 3 --data data.txt --ckpt-dir ck --resume --metrics ck/zr.lock",
         "ck/metrics.jsonl", "is the lock file"},
        {"metrics = a future checkpoint's name",
         "%s train" TINY " --steps 3 --data data.txt --ckpt-dir ck --resume "
         "--metrics ck/step_00000003",
         "ck/metrics.jsonl", "is zr's for its checkpoints"},
        {"fresh run over another run's metrics",
         "%s train" TINY " --steps 1 --data data.txt --metrics other.jsonl", "other.jsonl",
         "written by another run"},
        {"metrics = a FIFO", "%s train" TINY " --steps 1 --metrics fifo", "data.txt", "is a FIFO"},
        {"metrics = a dangling link", "%s train" TINY " --steps 1 --metrics dangling", "data.txt",
         "symbolic link"},
        /* zr export */
        {"llmc = rank file", "%s export --checkpoint ck --llmc ck/step_00000002/rank_00000.bin",
         "ck/step_00000002/rank_00000.bin", "is inside the checkpoint exported"},
        {"safetensors = manifest",
         "%s export --checkpoint ck/step_00000002 --safetensors ck/step_00000002/manifest.json",
         "ck/step_00000002/manifest.json", "is inside the checkpoint exported"},
        {"llmc = the lock", "%s export --checkpoint ck --llmc ck/zr.lock", "ck/zr.lock",
         "is the lock file"},
        {"llmc = safetensors", "%s export --checkpoint ck --llmc m.bin --safetensors ./m.bin",
         "data.txt", "is the --llmc output"},
        {"llmc = a FIFO", "%s export --checkpoint ck --llmc fifo", "data.txt", "is a FIFO"},
        {"llmc = a folder", "%s export --checkpoint ck --llmc adir", "data.txt", "a directory"},
        {"llmc = a link to data", "%s export --checkpoint ck --llmc data.link", "data.txt",
         "symbolic link"},
        /* zr plot -o */
        {"plot over its input", "%s plot -o other.jsonl other.jsonl", "other.jsonl",
         "is a metrics file plotted"},
        {"plot over its input through a linked folder",
         "%s plot -o ckpt.link/../metrics.jsonl ck/metrics.jsonl", "ck/metrics.jsonl",
         "is a metrics file plotted"},
        /* zr plan --write-config, zr probe -o */
        {"write-config = probe", "%s plan" TINY " --probe probe.json --write-config probe.json",
         "probe.json", "is the probe file"},
        {"write-config = config",
         "%s plan --config cfg.json --probe probe.json --write-config cfg.json", "cfg.json",
         "is the configuration file"},
        {"write-config = data",
         "%s plan" TINY " --data data.txt --probe probe.json --write-config data.hard", "data.txt",
         "is the training data"},
        {"probe -o = config", "%s probe --config cfg.json -o cfg.json", "cfg.json",
         "is the configuration file"},
        {"probe -o = init", "%s probe" TINY " --init init.bin -o init.bin", "init.bin",
         "is the model file"},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; i++) {
        char in[4200], cmd[4096];
        wpath(in, sizeof in, cases[i].input);
        uint32_t before = file_crc(in);
        snprintf(cmd, sizeof cmd, cases[i].cmd, zr_bin);
        int code = sh("cd %s && %s", work, cmd);
        TEST_CHECKF(code == 2 && strstr(res.out, cases[i].expect) != NULL,
                    "%s: exit %d, expected 2 and \"%s\":\n%s", cases[i].name, code, cases[i].expect,
                    res.out);
        TEST_CHECKF(file_crc(in) == before && before != 0, "%s: %s changed", cases[i].name,
                    cases[i].input);
    }
    /* a link planted where a temporary file could go is never written through: the
       temporary name is new each time and created exclusively */
    TEST_EQ_INT(sh("cd %s && ln -sf data.txt out.bin.tmp && %s export --checkpoint ck --llmc "
                   "out.bin && test -f out.bin && test -L out.bin.tmp && ls | grep -c tmp-",
                   work, zr_bin),
                1); /* grep finds no leftover temporary file */
    char in[4200];
    wpath(in, sizeof in, "data.txt");
    uint32_t data_crc = file_crc(in);
    TEST_CHECK(file_crc(in) == data_crc);
    /* a replaced output is said to be replaced */
    TEST_EQ_INT(sh("cd %s && %s export --checkpoint ck --llmc out.bin", work, zr_bin), 0);
    OUT_HAS("replaced the file that was there");
    printf("  %d output/input cases refused, every input unchanged\n", n);
}

/* Full disks: a plot or an export that cannot be written whole fails and leaves nothing. */
static void test_full_disk(void)
{
    char mnt[4200];
    wpath(mnt, sizeof mnt, "small");
    TEST_CHECK(mkdir(mnt, 0755) == 0);
    if (sh("mount -t tmpfs -o size=64k tmpfs %s", mnt) != 0) {
        printf("  skipped: a small tmpfs needs root (mount failed)\n");
        return;
    }
    TEST_EQ_INT(sh("dd if=/dev/zero of=%s/fill bs=4k count=64 2>/dev/null; true", mnt), 0);
    int code = sh("cd %s && %s plot -o small/c.png ck/metrics.jsonl", work, zr_bin);
    TEST_CHECKF(code != 0 && strstr(res.out, "wrote") == NULL, "plot to a full disk: exit %d\n%s",
                code, res.out);
    code = sh("cd %s && %s export --checkpoint ck --llmc small/m.bin", work, zr_bin);
    TEST_CHECKF(code == 1 && strstr(res.out, "No space left on device") != NULL,
                "export to a full disk: exit %d\n%s", code, res.out);
    code = sh("cd %s && %s train" TINY " --steps 2 --metrics small/m.jsonl", work, zr_bin);
    TEST_CHECKF(code == 1 && strstr(res.out, "cannot write metrics file") != NULL &&
                    strstr(res.out, "done:") == NULL,
                "metrics on a full disk: exit %d\n%s", code, res.out);
    /* m.jsonl only: no temporary file left behind */
    TEST_EQ_INT(sh("ls -A %s | grep -v '^fill$' | tr '\\n' ' '", mnt), 0);
    TEST_CHECKF(strcmp(res.out, "m.jsonl ") == 0, "left in the full folder: %s", res.out);
    sh("umount %s", mnt);
    /* and a device: refused before anything is written */
    code = sh("cd %s && %s plot -o /dev/full ck/metrics.jsonl", work, zr_bin);
    TEST_CHECKF(code == 2 && strstr(res.out, "character device") != NULL, "exit %d\n%s", code,
                res.out);
}

/* ---- 2. a checkpoint is known by what it holds -------------------------------------------- */

static void test_identity_end_to_end(void)
{
    /* a copy of step 2 under a newer name and a link: reported, never resumed from; since a
       save would collide with them and zr does not move what it did not write, the resume is
       refused before its first step, naming them */
    TEST_EQ_INT(sh("cd %s && %s train" TINY " --steps 4 --ckpt-every 2 --zr.checkpoint.keep 0 "
                   "--data data.txt --ckpt-dir id && cp -r id/step_00000002 id/step_00000030 && "
                   "ln -s step_00000002 id/step_00000040",
                   work, zr_bin),
                0);
    int code = sh("cd %s && %s train" TINY " --steps 5 --zr.checkpoint.keep 1 --data data.txt "
                  "--ckpt-dir id --resume",
                  work, zr_bin);
    TEST_CHECKF(code == 2, "exit %d\n%s", code, res.out);
    OUT_HAS("id/step_00000030 is not a checkpoint zr can use (its manifest says step 2");
    OUT_HAS("id/step_00000040 is not a checkpoint zr can use (it is a symbolic link");
    OUT_HAS(
        "holds 2 entries named like a checkpoint of a later step than this run starts from (4)");
    /* under an earlier step's name the copy blocks nothing: left alone, and the run goes on */
    TEST_EQ_INT(sh("cd %s && mv id/step_00000030 id/step_00000001 && rm id/step_00000040", work),
                0);
    code = sh("cd %s && %s train" TINY " --steps 5 --zr.checkpoint.keep 1 --data data.txt "
              "--ckpt-dir id --resume",
              work, zr_bin);
    TEST_CHECKF(code == 0, "exit %d\n%s", code, res.out);
    OUT_HAS("resumed from id/step_00000004");
    OUT_HAS("id/step_00000001 is not a checkpoint zr can use (its manifest says step 2");
    /* every step once in the metrics: the real run's lines were not cut back to step 2 */
    TEST_EQ_INT(sh("cd %s && grep -c '\"step\": [0-9]*, \"loss\"' id/metrics.jsonl", work), 0);
    TEST_CHECKF(atoi(res.out) == 5, "metrics lines: %s", res.out);
    /* rotation (keep 1) removed the real step 2, kept 4 (resumed from), never the copy */
    TEST_EQ_INT(sh("cd %s && ls id | tr '\\n' ' '", work), 0);
    TEST_CHECKF(strstr(res.out, "step_00000001 ") && strstr(res.out, "step_00000005 ") &&
                    strstr(res.out, "step_00000004 ") && !strstr(res.out, "step_00000002 "),
                "%s", res.out);
    TEST_EQ_INT(sh("cd %s && %s export --checkpoint id --llmc id5.bin", work, zr_bin), 0);
    OUT_HAS("from id/step_00000005");
}

/* ---- issue 39 items 4 and 5: zr deletes only what it wrote; one run per output ------------- */

/*
 * A user's notes.txt in a checkpoint that zr.checkpoint.keep rotates out survives, with its
 * folder and a warning naming both. A metrics file that another run holds (here this test
 * holds its lock, as a run started at the same moment would: deterministic) is refused, fresh
 * or resumed, and left as it was; once the lock is gone the same command runs.
 */
static void test_own_outputs(void)
{
    TEST_EQ_INT(sh("cd %s && %s train" TINY " --steps 2 --ckpt-every 1 --zr.checkpoint.keep 0 "
                   "--data data.txt --ckpt-dir own && echo mine > own/step_00000001/notes.txt",
                   work, zr_bin),
                0);
    int code = sh("cd %s && %s train" TINY " --steps 3 --zr.checkpoint.keep 1 --data data.txt "
                  "--ckpt-dir own --resume",
                  work, zr_bin);
    TEST_CHECKF(code == 0, "exit %d\n%s", code, res.out);
    OUT_HAS("own/step_00000001.deleting: removed the files zr wrote, but it also holds "
            "notes.txt, which zr did not write");
    OUT_HAS("the folder stays, as own/step_00000001.user-files");
    TEST_EQ_INT(
        sh("cd %s && cat own/step_00000001.user-files/notes.txt && ls own | tr '\\n' ' '", work),
        0);
    TEST_CHECKF(strstr(res.out, "mine\n") == res.out && !strstr(res.out, "step_00000001 ") &&
                    strstr(res.out, "step_00000002 ") && strstr(res.out, "step_00000003 "),
                "%s", res.out);

    char m[4200];
    wpath(m, sizeof m, "shared.jsonl");
    int fd = open(m, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    TEST_CHECK(fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0);
    const char *runs[] = {"--steps 2 --ckpt-dir own2 --metrics shared.jsonl",
                          "--steps 4 --ckpt-dir own3 --metrics shared.jsonl --resume-from "
                          "own/step_00000003"};
    for (int i = 0; i < 2; i++) {
        code = sh("cd %s && %s train" TINY " --data data.txt %s", work, zr_bin, runs[i]);
        TEST_CHECKF(code == 2, "%s: exit %d\n%s", runs[i], code, res.out);
        OUT_HAS("metrics file shared.jsonl is in use by another zr train that is running now");
        struct stat sb;
        TEST_CHECK(stat(m, &sb) == 0 && sb.st_size == 0);
    }
    if (fd >= 0) {
        close(fd);
    }
    code = sh("cd %s && %s train" TINY " --data data.txt %s", work, zr_bin, runs[0]);
    TEST_CHECKF(code == 0, "exit %d\n%s", code, res.out);
    printf("  a user's file outlives rotation (step_N.user-files, warned); a metrics file held by "
           "another run is refused\n");
}

/* ---- 3. a resume changes nothing silently ------------------------------------------------- */

static void test_resume_changes(void)
{
    const char *base = TINY " --data data.txt --ckpt-dir rs";
    TEST_EQ_INT(sh("cd %s && %s train %s --steps 2", work, zr_bin, base), 0);
    /* what must match: refused, naming the key, both values and the checkpoint */
    int code = sh("cd %s && %s train %s --steps 3 --resume --seed 7", work, zr_bin, base);
    TEST_CHECKF(code == 2, "exit %d", code);
    OUT_HAS("cannot resume from rs/step_00000002: zr.train.seed is 7 here, 1337 in the checkpoint");
    code = sh("cd %s && %s train" TINY " --data data2.txt --ckpt-dir rs --steps 3 --resume", work,
              zr_bin);
    TEST_CHECKF(code == 2, "exit %d", code);
    OUT_HAS("the training data is other data");
    OUT_HAS("--resume-new-data");
    code = sh("cd %s && %s train %s --steps 3 --resume --layers 2", work, zr_bin, base);
    TEST_CHECKF(code == 2, "exit %d", code);
    OUT_HAS("zr.model.layers is 2 here, 1 in the checkpoint");
    /* what may change: listed, and recorded in the manifest and the metrics file */
    code =
        sh("cd %s && %s train %s --steps 3 --resume --lr 0.01 --micro-batch 1", work, zr_bin, base);
    TEST_CHECKF(code == 0, "exit %d\n%s", code, res.out);
    OUT_HAS("resuming step 2 of rs/step_00000002 with");
    OUT_HAS("optimizer.params.lr 0.001 -> 0.01");
    OUT_HAS("train_micro_batch_size_per_gpu 2 -> 1");
    TEST_EQ_INT(sh("cd %s && grep -c '\"event\": *\"resume\"' rs/metrics.jsonl && "
                   "grep -c 'optimizer.params.lr' rs/step_00000003/manifest.json",
                   work),
                0);
    TEST_EQ_INT(sh("cd %s && %s plot -o rs.png rs/metrics.jsonl", work, zr_bin), 0);
    /* other data on purpose */
    code = sh("cd %s && %s train" TINY " --data data2.txt --ckpt-dir rs --steps 4 --resume "
              "--micro-batch 1 --lr 0.01 --resume-new-data",
              work, zr_bin);
    TEST_CHECKF(code == 0, "exit %d\n%s", code, res.out);
    OUT_HAS("training data text, 40000 tokens");
    OUT_HAS("zr.data.path \"data.txt\" -> \"data2.txt\"");
    /* the history is carried from checkpoint to checkpoint */
    TEST_EQ_INT(sh("cd %s && grep -c '\"from\"' rs/step_00000004/manifest.json", work), 0);
    TEST_CHECKF(atoi(res.out) == 2, "resumes recorded: %s", res.out);
}

/*
 * Remove the member at dotted path ("config", "config.zr") from the manifest
 * of checkpoint dir (under work) and sign it again, as an edit or an older
 * zr would leave it: a manifest that passes its checksum but lacks it.
 */
static int drop_member(const char *dir, const char *dotted)
{
    char p[4400], *text = NULL;
    size_t n = 0;
    snprintf(p, sizeof p, "%s/%s/manifest.json", work, dir);
    if (zr_file_read_all(p, &text, &n) != ZR_OK) {
        return 0;
    }
    cJSON *root = cJSON_ParseWithLength(text, n), *at = root;
    zr_free(text);
    char path[128];
    snprintf(path, sizeof path, "%s", dotted);
    char *dot = strchr(path, '.');
    if (dot != NULL) {
        *dot = '\0';
        at = cJSON_GetObjectItemCaseSensitive(root, path);
    }
    int ok = at != NULL && cJSON_GetObjectItemCaseSensitive(at, dot ? dot + 1 : path) != NULL;
    cJSON_DeleteItemFromObjectCaseSensitive(at, dot ? dot + 1 : path);
    char *out = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (out == NULL) {
        return 0;
    }
    zr_test_write_file(p, out, strlen(out));
    snprintf(p, sizeof p, "%s/%s/COMPLETE", work, dir);
    char marker[64];
    snprintf(marker, sizeof marker, "complete manifest-crc32c %u\n",
             zr_crc32c(0, out, strlen(out)));
    cJSON_free(out);
    zr_test_write_file(p, marker, strlen(marker));
    return ok;
}

/* What a checkpoint does not record is never taken as unchanged (issue 39, item 3). */
static void test_resume_unrecorded(void)
{
    const char *base = TINY " --data data.txt";
    TEST_EQ_INT(sh("cd %s && %s train %s --steps 2 --ckpt-dir un && cp -r un un_cfg && "
                   "cp -r un un_zr && cp -r un un_data",
                   work, zr_bin, base),
                0);
    TEST_CHECK(drop_member("un_cfg/step_00000002", "config"));
    TEST_CHECK(drop_member("un_zr/step_00000002", "config.zr"));
    TEST_CHECK(drop_member("un_data/step_00000002", "data"));
    /* --ckpt-dir naming a checkpoint rather than its folder: refused, nothing written there */
    int code = sh("cd %s && %s train %s --steps 3 --ckpt-dir un/step_00000002 --resume", work,
                  zr_bin, base);
    TEST_CHECKF(code == 2, "exit %d\n%s", code, res.out);
    OUT_HAS("zr.checkpoint.dir un/step_00000002 is a checkpoint (step 2), not a folder of "
            "checkpoints: resume with --ckpt-dir un --resume");
    TEST_EQ_INT(sh("cd %s && ! ls -d un/step_00000002/step_* 2>/dev/null", work), 0);
    /* no configuration: said, not "none changed"; the seed is still the manifest's */
    code = sh("cd %s && %s train %s --steps 3 --ckpt-dir un_cfg --resume --lr 0.01", work, zr_bin,
              base);
    TEST_CHECKF(code == 0, "exit %d\n%s", code, res.out);
    OUT_HAS("un_cfg/step_00000002 records no configuration");
    OUT_HAS("could not be compared");
    TEST_CHECKF(strstr(res.out, "none changed") == NULL, "%s", res.out);
    code = sh("cd %s && %s train %s --steps 3 --ckpt-dir un_cfg --resume --seed 7", work, zr_bin,
              base);
    TEST_CHECKF(code == 2, "exit %d\n%s", code, res.out);
    OUT_HAS("zr.train.seed is 7 here, 1337 in the checkpoint");
    /* a key that must match, set here, cannot be shown to match: refused */
    code = sh("cd %s && %s train %s --steps 3 --ckpt-dir un_zr --resume --init init.bin", work,
              zr_bin, TINY " --data data.txt");
    TEST_CHECKF(code == 2, "exit %d\n%s", code, res.out);
    OUT_HAS("zr.model.init is \"init.bin\" here, and the checkpoint does not record it");
    /* no "zr" section: its keys named as not compared, the other sections' changes listed */
    code = sh("cd %s && %s train %s --steps 3 --ckpt-dir un_zr --resume --lr 0.01", work, zr_bin,
              base);
    TEST_CHECKF(code == 0, "exit %d\n%s", code, res.out);
    OUT_HAS("un_zr/step_00000002 does not record");
    OUT_HAS("zr.train.train_steps");
    OUT_HAS("optimizer.params.lr 0.001 -> 0.01");
    TEST_CHECKF(strstr(res.out, "none changed") == NULL, "%s", res.out);
    /* no data recorded: the same rule as other data */
    code = sh("cd %s && %s train %s --steps 3 --ckpt-dir un_data --resume", work, zr_bin, base);
    TEST_CHECKF(code == 2, "exit %d\n%s", code, res.out);
    OUT_HAS("the checkpoint does not record its training data");
    OUT_HAS("--resume-new-data");
    code = sh("cd %s && %s train %s --steps 3 --ckpt-dir un_data --resume --resume-new-data", work,
              zr_bin, base);
    TEST_CHECKF(code == 0, "exit %d\n%s", code, res.out);
    OUT_HAS("training data (not recorded) -> text, 40000 tokens");
}

/* At another world size the checkpoint's global batch is kept (issue 39, item 7). */
static void test_world_batch(void)
{
    /* 2 ranks x micro-batch 2: a global batch of 4 */
    const char *base = TINY " --data data.txt";
    TEST_EQ_INT(sh("cd %s && mpirun.openmpi -np 2 %s train %s --steps 2 --ckpt-dir wb && "
                   "cp -r wb wb3 && cp -r wb wbx",
                   work, zr_bin, base),
                0);
    int code = sh("cd %s && %s train %s --steps 3 --ckpt-dir wb --resume", work, zr_bin, base);
    TEST_CHECKF(code == 0, "exit %d\n%s", code, res.out);
    OUT_HAS("gradient_accumulation_steps is 2, not 1, to keep the checkpoint's "
            "train_batch_size 4");
    OUT_HAS("gradient_accumulation_steps 1 -> 2");
    TEST_EQ_INT(sh("cd %s && grep -A0 '\"train_batch_size\"' wb/step_00000003/manifest.json && "
                   "grep -c '\"gradient_accumulation_steps\":[[:space:]]*2' "
                   "wb/step_00000003/manifest.json",
                   work),
                0);
    OUT_HAS("4,");
    /* 1 rank x micro-batch 3 does not divide 4: refused naming the three numbers */
    code = sh("cd %s && %s train %s --steps 3 --ckpt-dir wb3 --resume --micro-batch 3", work,
              zr_bin, base);
    TEST_CHECKF(code == 2, "exit %d\n%s", code, res.out);
    OUT_HAS("the checkpoint's train_batch_size 4 (at 2 ranks) cannot be kept at 1 rank with "
            "train_micro_batch_size_per_gpu 3");
    /* another batch set explicitly: the user's, listed */
    code =
        sh("cd %s && %s train %s --steps 3 --ckpt-dir wbx --resume --batch 2", work, zr_bin, base);
    TEST_CHECKF(code == 0, "exit %d\n%s", code, res.out);
    OUT_HAS("train_batch_size 4 -> 2");
    TEST_CHECKF(strstr(res.out, "to keep the checkpoint's") == NULL, "%s", res.out);
}

/* Defaults that depend on the input's size fit a small one (issue 39, item 8). */
static void test_small_input(void)
{
    /* 2400 bytes: a validation split of 120 tokens, one batch of 1 x 64 at the defaults */
    TEST_EQ_INT(sh("cd %s && head -c 2400 data.txt > small.txt", work), 0);
    int code = sh("cd %s && %s train --layers 1 --channels 32 --heads 2 --steps 2 --data small.txt",
                  work, zr_bin);
    TEST_CHECKF(code == 0, "exit %d\n%s", code, res.out);
    OUT_HAS("train_micro_batch_size_per_gpu is 1, not 4: the validation split of small.txt holds "
            "120 tokens");
    OUT_HAS("zr.data.val_batches is 1, not 4");
    /* smaller still: the sequence fits too */
    TEST_EQ_INT(sh("cd %s && head -c 1000 data.txt > tiny.txt", work), 0);
    code = sh("cd %s && %s train --layers 1 --channels 32 --heads 2 --steps 2 --data tiny.txt",
              work, zr_bin);
    TEST_CHECKF(code == 0, "exit %d\n%s", code, res.out);
    OUT_HAS("zr.model.seq_len is 49, not 64");
    /* explicit values keep their refusal */
    code = sh("cd %s && %s train --layers 1 --channels 32 --heads 2 --steps 2 --data small.txt "
              "--micro-batch 1 --zr.data.val_batches 4",
              work, zr_bin);
    TEST_CHECKF(code == 2, "exit %d\n%s", code, res.out);
    OUT_HAS("zr.data.val_batches (4) is more than the 1 batches");
    code = sh("cd %s && %s train --layers 1 --channels 32 --heads 2 --steps 2 --data small.txt "
              "--micro-batch 4 --seq-len 64",
              work, zr_bin);
    TEST_CHECKF(code == 2, "exit %d\n%s", code, res.out);
    OUT_HAS("the validation split has 120 tokens");
    /* no validation: its split need not hold a batch */
    code = sh("cd %s && %s train --layers 1 --channels 32 --heads 2 --steps 2 --data small.txt "
              "--micro-batch 4 --val-every 0",
              work, zr_bin);
    TEST_CHECKF(code == 0, "exit %d\n%s", code, res.out);
}

/* ---- 4. a stop under mpirun saves ----------------------------------------------------------- */

/* Start mpirun (2 ranks; a save takes 2 s) with a grace period of grace seconds; its pid. */
static pid_t start_job(const char *dir, const char *log, int grace)
{
    pid_t pid = fork();
    if (pid == 0) {
        char g[32], cmd[8192];
        snprintf(g, sizeof g, "%d", grace);
        setenv("OMPI_MCA_odls_base_sigkill_timeout", g, 1);
        snprintf(cmd, sizeof cmd,
                 "exec mpirun.openmpi -np 2 -x ZR_SLOW_SAVE=2 %s train" TINY
                 " --steps 1000000 --ckpt-every 2 --data %s/data.txt --ckpt-dir %s >%s 2>&1 "
                 "</dev/null",
                 zr_bin, work, dir, log);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static int wait_path(const char *path, double seconds)
{
    double t0 = zr_now();
    while (zr_now() - t0 < seconds) {
        if (access(path, F_OK) == 0) {
            return 1;
        }
        usleep(20000);
    }
    return 0;
}

/*
 * Every entry of dir named step_N: complete and intact (zr_ckpt_verify), or a
 * leftover with a suffix; returns the highest intact step (-1 if none).
 */
static long long check_dir(const char *dir)
{
    DIR *d = opendir(dir);
    long long best = -1;
    struct dirent *ent;
    while (d != NULL && (ent = readdir(d)) != NULL) {
        long long s;
        char tail;
        if (sscanf(ent->d_name, "step_%lld%c", &s, &tail) != 1) {
            continue;
        }
        char p[8200];
        snprintf(p, sizeof p, "%s/%s", dir, ent->d_name);
        zr_status st = zr_ckpt_verify(p);
        TEST_CHECKF(st == ZR_OK, "%s is not an intact checkpoint: %s", p, zr_error_message());
        best = st == ZR_OK && s > best ? s : best;
    }
    if (d != NULL) {
        closedir(d);
    }
    zr_error_clear();
    return best;
}

/*
 * SIGTERM or SIGINT to mpirun while the ranks are in a save of 2 s
 * (ZR_SLOW_SAVE=2). Open MPI 4's mpirun sends the ranks SIGCONT at once,
 * SIGTERM grace seconds later, SIGKILL as long again after that (measured;
 * README "Stopping a run"). With a grace period longer than a step and a
 * save, the stop saves; with Open MPI's default of 1 s the ranks are killed
 * in the save. Either way the previous checkpoint is intact and nothing
 * incomplete stands under a checkpoint's name; mpirun exits 1 either way.
 */
static void stop_case(const char *name, int sig, int grace)
{
    char dir[4200], log[4200], first[4400], partial[4400];
    snprintf(dir, sizeof dir, "%s/%s", work, name);
    snprintf(log, sizeof log, "%s/%s.log", work, name);
    snprintf(first, sizeof first, "%s/step_00000002/COMPLETE", dir);
    snprintf(partial, sizeof partial, "%s/step_00000004.partial", dir);
    pid_t job = start_job(dir, log, grace);
    int saving = wait_path(first, 90) && wait_path(partial, 60);
    TEST_CHECKF(saving, "%s: no save in progress to stop", name);
    kill(job, sig);
    int status = 0;
    double t0 = zr_now();
    while (waitpid(job, &status, WNOHANG) == 0 && zr_now() - t0 < 90) {
        usleep(50000);
    }
    if (zr_now() - t0 >= 90) {
        TEST_CHECKF(0, "%s: mpirun still running 90 s after the signal", name);
        kill(job, SIGKILL);
        waitpid(job, &status, 0);
    }
    sh("cat %s", log);
    long long newest = check_dir(dir);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (grace > 1) {
        /* the stop finished the save or step under way and saved */
        TEST_CHECKF(strstr(res.out, "stop requested; finished step") != NULL && newest >= 4,
                    "%s: exit %d, newest %lld\n%s", name, code, newest, res.out);
    } else {
        /* killed in the save: the one before stands, and zr had said the save would not fit */
        TEST_CHECKF(newest >= 2 && strstr(res.out, "took") != NULL &&
                        strstr(res.out, "odls_base_sigkill_timeout") != NULL,
                    "%s: newest %lld; the warning that the save exceeds the grace period:\n%s",
                    name, newest, res.out);
    }
    printf("  %s: signal %d during a save, grace %d s: mpirun exit %d after %.1f s, newest "
           "intact step %lld\n",
           name, sig, grace, code, zr_now() - t0, newest);
    if (grace > 1) {
        /* and the run goes on from it */
        int c = sh("cd %s && timeout -k 5 120 mpirun.openmpi -np 2 %s train" TINY
                   " --steps %lld --data data.txt --ckpt-dir %s --resume",
                   work, zr_bin, newest + 1, name);
        TEST_CHECKF(c == 0 && strstr(res.out, "resumed from") != NULL, "resume: exit %d\n%s", c,
                    res.out);
    }
}

static void test_stop_during_save(void)
{
    /* what scripts/mpienv.sh gives a launch: enough for a step and a save of many GB */
    TEST_EQ_INT(sh("env -u OMPI_MCA_odls_base_sigkill_timeout sh -c '. %s/scripts/mpienv.sh && "
                   "echo $OMPI_MCA_odls_base_sigkill_timeout'",
                   root),
                0);
    TEST_CHECKF(atoi(res.out) >= 30, "scripts/mpienv.sh gives %s", res.out);
    /* the same mechanism at a grace period the suite can afford (mpirun waits it twice) */
    stop_case("stop_term", SIGTERM, 4);
    stop_case("stop_int", SIGINT, 4);
    stop_case("stop_nograce", SIGTERM, 1);
}

/* ---- 5. messages a user can act on --------------------------------------------------------- */

static void test_messages(void)
{
    /* a long path: shortened, and the reason shows */
    char longp[4200];
    memset(longp, 'a', 4000);
    longp[4000] = '\0';
    int code = sh("cd %s && %s export --checkpoint ck --llmc %s/%s", work, zr_bin, work, longp);
    TEST_CHECKF(code != 0 && strstr(res.out, "File name too long") != NULL &&
                    strstr(res.out, "characters)") != NULL,
                "exit %d\n%.600s", code, res.out);
    /* a link loop and a dangling link as the checkpoint dir: named as such */
    TEST_EQ_INT(sh("cd %s && ln -s loop loop && ln -s missing/dir dangle", work), 0);
    code = sh("cd %s && %s train" TINY " --steps 1 --ckpt-dir loop", work, zr_bin);
    TEST_CHECKF(code == 1 && strstr(res.out, "loop of links") != NULL, "exit %d\n%s", code,
                res.out);
    code = sh("cd %s && %s train" TINY " --steps 1 --ckpt-dir dangle", work, zr_bin);
    TEST_CHECKF(code == 1 && strstr(res.out, "dangling symbolic link") != NULL, "exit %d\n%s", code,
                res.out);
    /* one rank, one step; "warning:" once; --no-hpz */
    wpath(longp, sizeof longp, "unknown.json");
    zr_test_write_file(longp, "{\"zzz\": 1}", 10);
    code = sh("cd %s && %s train" TINY " --steps 1 --no-hpz --config unknown.json", work, zr_bin);
    TEST_CHECKF(code == 0, "exit %d\n%s", code, res.out);
    OUT_HAS("zr train: 1 rank = 1 node x 1");
    OUT_HAS("done: 1 step in");
    OUT_HAS("zr train: warning: unknown.json: unknown key \"zzz\"");
    TEST_CHECK(strstr(res.out, "warning: warning") == NULL);
    TEST_CHECK(strstr(res.out, "1 ranks") == NULL && strstr(res.out, "1 steps") == NULL);
    /* with --init the printout shows the file's shape, not the defaults */
    code = sh("cd %s && %s train --init init.bin --seq-len 32 --micro-batch 2 --val-every 0 "
              "--steps 1",
              work, zr_bin);
    TEST_CHECKF(code == 0, "exit %d\n%s", code, res.out);
    char line[128];
    snprintf(line, sizeof line, "%-46s = 1\n", "zr.model.layers");
    OUT_HAS(line);
    snprintf(line, sizeof line, "%-46s = 32\n", "zr.model.channels");
    OUT_HAS(line);
    /* --steps 0: the initial weights are the checkpoint, and export */
    code = sh("cd %s && %s train" TINY " --steps 0 --ckpt-dir zero && %s export --checkpoint zero "
              "--llmc zero.bin",
              work, zr_bin, zr_bin);
    TEST_CHECKF(code == 0 && strstr(res.out, "zero/step_00000000") != NULL, "exit %d\n%s", code,
                res.out);
    /* a model file holding a NaN: refused before any step */
    char nan_path[4200];
    wpath(nan_path, sizeof nan_path, "nan.bin");
    TEST_EQ_INT(sh("cp %s/init.bin %s", work, nan_path), 0);
    int fd = open(nan_path, O_WRONLY);
    float nan_value = NAN;
    TEST_CHECK(fd >= 0 && pwrite(fd, &nan_value, sizeof nan_value, 256 * 4 + 4 * 100) == 4);
    if (fd >= 0) {
        close(fd);
    }
    code = sh("cd %s && %s train" TINY " --steps 1 --init nan.bin", work, zr_bin);
    TEST_CHECKF(code == 2 && strstr(res.out, "holds a non-finite weight") != NULL &&
                    strstr(res.out, "step     1/") == NULL,
                "exit %d\n%s", code, res.out);
    /* a probe with an impossible time */
    write_probe("zero_probe.json", 0.0);
    code = sh("cd %s && %s plan" TINY " --probe zero_probe.json", work, zr_bin);
    TEST_CHECKF(code == 2 && strstr(res.out, "compute[0].fwd_block") != NULL &&
                    strstr(res.out, "no machine measures") != NULL,
                "exit %d\n%s", code, res.out);
}

/* Bytes in res.out that a terminal would take raw: control bytes but the newline, DEL, and any byte
   of 0x80 and above (the inputs below hold none that could be valid UTF-8). */
static int raw_bytes(void)
{
    int n = 0;
    for (const unsigned char *p = (const unsigned char *)res.out; *p != 0; p++) {
        n += (*p < 0x20 && *p != '\n') || *p >= 0x7f;
    }
    return n;
}

/*
 * Every command names what it refuses (issue 39, item 9): an unknown or
 * misplaced flag, a flag missing its value, an empty argument (as the value
 * of a flag, --flag=, or on its own) are said as such, exit 2; bytes read
 * from a file (a metrics file of random bytes, a config's keys, a
 * manifest) are never printed raw, nor without bound; a link loop or a
 * dangling link as a step folder's manifest is named.
 */
static void test_messages_named(void)
{
    static const struct {
        const char *args, *expect;
    } named[] = {
        {"selfcheck --bogus", "--bogus: unknown flag"},
        {"selfcheck --device cuda", "unknown flag --device"},
        {"selfcheck stray", "unexpected argument \"stray\""},
        {"export --checkpoint ck --frob x", "unknown flag --frob"},
        {"export --llmc out.bin", "--checkpoint is missing"},
        {"plot --bogus m.jsonl", "unknown flag --bogus"},
        {"plan" TINY " --probe", "--probe needs a value"},
        {"plan" TINY " --probe probe.json --top", "--top needs a value"},
        {"bench quant --bogus 1", "unknown flag --bogus"},
        {"bench memory --frobnicate 3", "unknown flag --frobnicate"},
        {"bench noise --fast", "--fast: unknown flag"},
        {"bench model --nope", "--nope: unknown flag"},
        {"bench train --device tpu", "unknown flag --device"},
        /* empty */
        {"export --checkpoint '' --llmc out.bin", "--checkpoint is empty"},
        {"export --checkpoint ck --llmc ''", "--llmc is empty"},
        {"plan" TINY " --probe ''", "--probe is empty"},
        {"plan" TINY " --probe probe.json --write-config=", "--write-config is empty"},
        {"plot ''", "argument 1 is empty"},
        {"plot -o '' ck/metrics.jsonl", "-o is empty"},
        {"train" TINY " --data ''", "--data is empty"},
        {"train" TINY " --config=", "--config is empty"},
        {"train" TINY " --ckpt-dir ''", "--ckpt-dir is empty"},
        {"selfcheck --hpz ''", "--hpz is empty"},
        {"bench quant --device ''", "--device is empty"},
        {"bench comm --transport ''", "--transport is empty"},
        {"probe" TINY " -o ''", "-o is empty"},
    };
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
        int code = sh("cd %s && %s %s", work, zr_bin, named[i].args);
        TEST_CHECKF(code == 2 && strstr(res.out, named[i].expect) != NULL,
                    "zr %s: exit %d, wanted \"%s\":\n%.800s", named[i].args, code, named[i].expect,
                    res.out);
    }
    /* 2 MB of bytes that are no text as a metrics file, in lines of 64 KB: the message shows a
       short, printable excerpt */
    static char junk[2 << 20];
    static const unsigned char pick[] = {0x1b, 0x07, 0x08, 0x0d, 0x7f, 0x80, 0x9b, 0xbf,
                                         0xff, 0xfe, 0x01, 0x00, 0x9d, 0xf8, 0x85, 0x1f};
    for (size_t i = 0; i < sizeof junk; i++) {
        junk[i] = (char)pick[(i * 7 + i / 5) % sizeof pick];
        junk[i] = i % 65536 == 65535 ? '\n' : junk[i]; /* complete lines (a last one is not) */
    }
    char path[4200];
    wpath(path, sizeof path, "junk.jsonl");
    zr_test_write_file(path, junk, sizeof junk);
    int code = sh("cd %s && %s plot -o junk.png junk.jsonl", work, zr_bin);
    TEST_CHECKF(code == 1 && raw_bytes() == 0 && strlen(res.out) < 2000 &&
                    strstr(res.out, "junk.jsonl") != NULL,
                "exit %d, %d raw bytes in %zu:\n%.300s", code, raw_bytes(), strlen(res.out),
                res.out);
    /* a config's keys with terminal escapes: refused (in a section) or warned of (on top),
       printable */
    static const char *const cfgs[] = {
        "{\"zero_optimization\": {\"st\\u001b[2Jage\\u0007\": 1}}",
        "{\"zz\\u001b]0;title\\u0007\\u009b\": 1}",
        "{\"zero_optimization\": {\"stage\": \"\\u001b[31m\"}}",
    };
    for (int i = 0; i < 3; i++) {
        wpath(path, sizeof path, "esc.json");
        zr_test_write_file(path, cfgs[i], strlen(cfgs[i]));
        code = sh("cd %s && %s train" TINY " --steps 1 --config esc.json", work, zr_bin);
        TEST_CHECKF(raw_bytes() == 0 && strstr(res.out, "esc.json") != NULL,
                    "config %d: exit %d, %d raw bytes:\n%.600s", i, code, raw_bytes(), res.out);
    }
    /* a step folder whose manifest is a link loop, or a dangling link: named, with the reason */
    static const char *const link[][2] = {{"manifest.json", "symbolic links"},
                                          {"gone.json", "No such file"}};
    for (int i = 0; i < 2; i++) {
        TEST_EQ_INT(sh("cd %s && rm -rf lk && cp -r ck lk && cd lk/step_00000002 && "
                       "rm manifest.json && ln -s %s manifest.json",
                       work, link[i][0]),
                    0);
        code = sh("cd %s && %s export --checkpoint lk/step_00000002 --llmc lk.bin", work, zr_bin);
        TEST_CHECKF(code == 1 && strstr(res.out, "lk/step_00000002/manifest.json") != NULL &&
                        strstr(res.out, link[i][1]) != NULL,
                    "%s: exit %d\n%s", link[i][0], code, res.out);
    }
}

/* zr bench noise: its JSON line holds what the table says; bad arguments refused. */
static void test_bench_noise(void)
{
    int code = sh("%s bench noise --seconds 1 --threads 2 --json", zr_bin);
    TEST_CHECKF(code == 0, "exit %d\n%s", code, res.out);
    const char *j = strstr(res.out, "{\"bench\": \"noise\"");
    int threads = 0, pieces = 0;
    double fast = 0, mean = 0, slow = -1, best = 0, worst = 0;
    TEST_CHECKF(j != NULL && sscanf(j,
                                    "{\"bench\": \"noise\", \"threads\": %d, \"seconds\": 1, "
                                    "\"fast_piece_ms\": %lf, \"all\": {\"who\": \"all\", "
                                    "\"pieces\": %d, \"mean_over_fast\": %lf, \"slow_share\": "
                                    "%lf, \"best_window\": %lf, \"worst_window\": %lf}}",
                                    &threads, &fast, &pieces, &mean, &slow, &best, &worst) == 7,
                "%s", res.out);
    /* at least 95% of the pieces take the fast piece's time or more */
    TEST_CHECKF(threads == 2 && fast > 0 && pieces > 2 && mean > 0.9 && slow >= 0 && slow <= 1 &&
                    best > 0.9 && worst >= best,
                "%s", res.out);
    OUT_HAS("thread    pieces");
    const char *bad[] = {"--seconds 0", "--threads 0", "--seconds x", "--threads 100000"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        code = sh("%s bench noise %s", zr_bin, bad[i]);
        TEST_CHECKF(code == 2 && strstr(res.out, "--seconds is 1-3600, --threads 1-256") != NULL,
                    "%s: exit %d\n%s", bad[i], code, res.out);
    }
    code = sh("%s bench noise --fast", zr_bin);
    TEST_CHECKF(code == 2 && strstr(res.out, "usage: zr bench noise") != NULL, "exit %d\n%s", code,
                res.out);
}

/*
 * The benchmarks' numeric flags: every one read whole (atoi and atof had read
 * "2x" as 2 and "x" as 0), out-of-range values and unknown choices refused
 * with exit 2 and the flag named; and zr bench quant --threads times each
 * codec on 1 thread too, in the same run.
 */
static void test_bench_flags(void)
{
    static const struct {
        const char *args, *expect;
    } bad[] = {
        {"quant --threads 2x", "--threads \"2x\": expected a whole number from 1 to 1024"},
        {"quant --reps 65", "--reps \"65\""},
        {"quant --group 33", "group must be a multiple of 8"},
        {"quant --sizes 1Mx", "--sizes \"1Mx\": expected a whole count"},
        {"quant --sizes 1.5", "--sizes \"1.5\""},
        {"quant --sizes 1e99", "--sizes \"1e99\""},
        {"quant --impl fast", "--impl \"fast\" is not auto, scalar, avx2 or avx512"},
        {"noise --seconds 5x", "--seconds is 1-3600"},
        {"noise --threads 2x", "--threads 1-256"},
        {"comm --min 1x", "--min \"1x\": expected a whole count"},
        {"comm --chunks 0", "--chunks \"0\""},
        {"memory --layers 2x", "--layers \"2x\": expected a whole number"},
        {"memory --stage 4", "--stage \"4\": expected a whole number from 0 to 3"},
        {"memory --prefetch-bucket -1", "--prefetch-bucket \"-1\""},
        {"train --layers 4x", "--layers \"4x\": expected a whole number"},
        {"train --steps 0", "--steps \"0\""},
        {"train --threads 1.5", "--threads \"1.5\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int code = sh("%s bench %s", zr_bin, bad[i].args);
        TEST_CHECKF(code == 2 && strstr(res.out, bad[i].expect) != NULL, "zr bench %s: exit %d\n%s",
                    bad[i].args, code, res.out);
    }
    int code = sh("%s bench quant --sizes 256K,512K --threads 2 --reps 3 --json", zr_bin);
    const char *j = strstr(res.out, "{\"bench\":\"quant\"");
    TEST_CHECKF(code == 0 && j != NULL && strstr(j, "\"threads\":2,") != NULL &&
                    zr_test_count(j, "\"gbps_1thread\":") == 16 &&
                    strstr(j, "\"quant_int8_vs_1thread\":") != NULL,
                "exit %d\n%s", code, res.out);
    OUT_HAS("x 1 thread");
}

static int n_names;
static char **names;

static int selected(const char *name)
{
    for (int i = 0; i < n_names; i++) {
        if (strstr(name, names[i]) != NULL) {
            return 1;
        }
    }
    return n_names == 0;
}

#define RUN(fn)                                                                                    \
    do {                                                                                           \
        if (selected(#fn)) {                                                                       \
            TEST_RUN(fn);                                                                          \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv)
{
    n_names = argc - 1;
    names = argv + 1;
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
    snprintf(work, sizeof work, "/tmp/zr-test-rules-XXXXXX");
    if (access(zr_bin, X_OK) != 0 || mkdtemp(work) == NULL) {
        fprintf(stderr, "no zr at %s, or no temporary folder\n", zr_bin);
        return 1;
    }
    setenv("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=0:halt_on_error=1", 1);
    setenv("ZR_PROGRESS", "0", 1);
    unsetenv("ZR_RANKS_PER_NODE");
    RUN(test_bench_noise); /* the two tests that need none of setup's files */
    RUN(test_bench_flags);
    int setup_free = n_names > 0; /* only those two asked for (the ThreadSanitizer line) */
    for (int i = 0; i < n_names; i++) {
        setup_free &=
            strcmp(names[i], "test_bench_noise") == 0 || strcmp(names[i], "test_bench_flags") == 0;
    }
    if (!setup_free) {
        TEST_RUN(setup);
    }
    RUN(test_outputs_never_inputs);
    RUN(test_full_disk);
    RUN(test_identity_end_to_end);
    RUN(test_own_outputs);
    RUN(test_resume_changes);
    RUN(test_resume_unrecorded);
    RUN(test_world_batch);
    RUN(test_small_input);
    RUN(test_messages);
    RUN(test_messages_named);
    RUN(test_stop_during_save);
    if (zr_test_failed == 0) {
        sh("rm -rf %s", work);
    } else {
        printf("work directory kept: %s\n", work);
    }
    return zr_test_finish();
}
