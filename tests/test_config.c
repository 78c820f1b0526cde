/*
 * test_config.c - the configuration of "zr train" (defaults, DeepSpeed JSON,
 * flags, cross-field checks, the error messages of bad input) and the
 * metrics reader behind "zr plot". Single process.
 */
#define _POSIX_C_SOURCE 200809L

#include "test.h"

#include "zr/config.h"
#include "zr/launch.h"
#include "zr/model.h"
#include "zr/metrics.h"

#include <cJSON.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* Collects what the config reader reports through its warn callback. */
typedef struct notes {
    int warnings, notes;
    char last_warning[512], last_note[512];
} notes;

static void collect(void *ctx, const char *msg)
{
    notes *n = ctx;
    if (strncmp(msg, "note:", 5) == 0) {
        n->notes++;
        snprintf(n->last_note, sizeof n->last_note, "%s", msg);
    } else {
        n->warnings++;
        snprintf(n->last_warning, sizeof n->last_warning, "%s", msg);
    }
}

/* Parse text over the defaults (as "cfg.json"); warnings go to *n if given. */
static zr_status parse(zr_train_config *c, const char *text, notes *n)
{
    zr_config_defaults(c);
    notes ignore;
    memset(&ignore, 0, sizeof ignore);
    return zr_config_parse_json(c, text, "cfg.json", collect, n != NULL ? n : &ignore);
}

/* Parse then finalize at world ranks. */
static zr_status parse_final(const char *text, int world)
{
    zr_train_config c;
    ZR_CHECK(parse(&c, text, NULL));
    return zr_config_finalize(&c, world);
}

/* Flags over the defaults. */
static zr_status flags(zr_train_config *c, int argc, char **argv)
{
    zr_config_defaults(c);
    int help = 0;
    notes n;
    memset(&n, 0, sizeof n);
    return zr_config_from_args(c, argc, argv, &help, collect, &n);
}

/* A temporary file holding text; path receives its name. */
static void write_temp(char *path, size_t n, const char *text)
{
    snprintf(path, n, "/tmp/zr_test_config_XXXXXX");
    int fd = mkstemp(path);
    TEST_CHECK(fd >= 0);
    if (fd >= 0) {
        FILE *f = fdopen(fd, "w");
        fputs(text, f);
        fclose(f);
    }
}

static void test_defaults(void)
{
    zr_train_config c;
    zr_config_defaults(&c);
    TEST_OK(zr_config_finalize(&c, 4));
    TEST_EQ_INT(c.train_micro_batch_size_per_gpu, 4);
    TEST_EQ_INT(c.gradient_accumulation_steps, 1);
    TEST_EQ_INT(c.train_batch_size, 16);
    TEST_NEAR(c.gradient_clipping, 1.0, 0);
    TEST_EQ_INT(c.steps_per_print, 10);
    TEST_CHECK(strcmp(c.optimizer_type, "AdamW") == 0);
    TEST_NEAR(c.lr, 1e-3, 0);
    TEST_NEAR(c.beta1, 0.9, 0);
    TEST_NEAR(c.beta2, 0.95, 0);
    TEST_NEAR(c.eps, 1e-8, 0);
    TEST_NEAR(c.weight_decay, 0.1, 0);
    TEST_CHECK(strcmp(c.scheduler_type, "WarmupCosineLR") == 0);
    TEST_EQ_INT(c.warmup_num_steps, 20);
    TEST_NEAR(c.cos_min_ratio, 0.1, 0);
    TEST_NEAR(c.warmup_min_ratio, 0, 0);
    TEST_EQ_INT(c.total_num_steps, 200); /* derived from train_steps */
    TEST_NEAR(c.warmup_max_lr, 1e-3, 0); /* derived from lr */
    TEST_EQ_INT(c.bf16_enabled, 1);
    TEST_CHECK(strcmp(c.communication_data_type, "bf16") == 0);
    TEST_EQ_INT(c.stage, 3);
    TEST_EQ_INT(c.zero_quantized_weights, 1);
    TEST_EQ_INT(c.zero_hpz_partition_size, 0);
    TEST_EQ_INT(c.zero_quantized_gradients, 1);
    TEST_EQ_INT(c.overlap_comm, 1);
    TEST_EQ_INT(c.stage3_max_live_parameters, 1000000000LL);
    TEST_EQ_INT(c.stage3_prefetch_bucket_size, 50000000LL);
    TEST_EQ_INT(c.reduce_bucket_size, 10000000LL);
    TEST_EQ_INT(c.layers, 2);
    TEST_EQ_INT(c.heads, 4);
    TEST_EQ_INT(c.channels, 128);
    TEST_EQ_INT(c.seq_len, 64);
    TEST_CHECK(c.data_path[0] == '\0');
    TEST_EQ_INT(c.val_every, 50);
    TEST_EQ_INT(c.val_batches, 4);
    TEST_EQ_INT(c.train_steps, 200);
    TEST_EQ_INT(c.seed, 1337);
    TEST_EQ_INT(c.threads, 1);
    TEST_CHECK(c.metrics_path[0] == '\0');
    TEST_CHECK(c.checkpoint_dir[0] == '\0');
    TEST_EQ_INT(c.checkpoint_every, 0);
    TEST_EQ_INT(c.keep_checkpoints, 2);
    TEST_EQ_INT(c.resume, 0);
    TEST_EQ_INT(c.qwz_bits, 8);
    TEST_EQ_INT(c.qwz_group, 1024);
    TEST_EQ_INT(c.qgz_bits, 4);
    TEST_EQ_INT(c.qgz_group, 1024);
    TEST_EQ_INT(c.qgz_error_feedback, 0);
    TEST_EQ_INT(c.qgz_chunks, 1);
    TEST_EQ_INT(c.compare_zero3, 1);
    /* every world size works with the defaults (hpZ 0 = ranks per node) */
    for (int w = 1; w <= 8; w++) {
        zr_config_defaults(&c);
        TEST_OK(zr_config_finalize(&c, w));
        TEST_EQ_INT(c.train_batch_size, 4 * w);
    }
}

static const char *full_json =
    "{\n"
    "  \"train_batch_size\": 64,\n"
    "  \"train_micro_batch_size_per_gpu\": 2,\n"
    "  \"gradient_accumulation_steps\": 4,\n"
    "  \"gradient_clipping\": 0.5,\n"
    "  \"steps_per_print\": 5,\n"
    "  \"communication_data_type\": \"fp32\",\n"
    "  \"bf16\": {\"enabled\": false},\n"
    "  \"fp16\": {\"enabled\": false},\n"
    "  \"optimizer\": {\"type\": \"adamw\", \"params\": {\"lr\": 3e-4, \"betas\": [0.8, 0.99],\n"
    "                \"eps\": 1e-6, \"weight_decay\": 0.01}},\n"
    "  \"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"warmup_min_lr\": 1e-5,\n"
    "      \"warmup_max_lr\": 2e-4, \"warmup_num_steps\": 7, \"total_num_steps\": 90,\n"
    "      \"warmup_min_ratio\": 0.05, \"cos_min_ratio\": 0.2, \"warmup_type\": \"linear\"}},\n"
    "  \"zero_optimization\": {\n"
    "    \"stage\": 3, \"zero_quantized_weights\": true, \"zero_hpz_partition_size\": 4,\n"
    "    \"zero_quantized_gradients\": false, \"reduce_bucket_size\": 5e7,\n"
    "    \"stage3_prefetch_bucket_size\": 1e6, \"stage3_max_live_parameters\": 3e8,\n"
    "    \"overlap_comm\": false\n"
    "  },\n"
    "  \"zr\": {\n"
    "    \"model\": {\"layers\": 6, \"heads\": 8, \"channels\": 256, \"seq_len\": 128},\n"
    "    \"data\": {\"path\": \"data/tiny.txt\", \"val_every\": 25, \"val_batches\": 2},\n"
    "    \"train\": {\"train_steps\": 100, \"seed\": 42, \"threads\": 2,\n"
    "              \"metrics_path\": \"m.jsonl\"},\n"
    "    \"checkpoint\": {\"dir\": \"ck\", \"every\": 10, \"keep\": 3, \"resume\": true},\n"
    "    \"quant\": {\"qwz_bits\": 4, \"qwz_group\": 256, \"qgz_bits\": 8, \"qgz_group\": 512,\n"
    "              \"qgz_error_feedback\": true, \"qgz_chunks\": 4},\n"
    "    \"compare_zero3\": false\n"
    "  }\n"
    "}\n";

static void test_full_json(void)
{
    zr_train_config c;
    notes n;
    memset(&n, 0, sizeof n);
    TEST_OK(parse(&c, full_json, &n));
    TEST_EQ_INT(n.warnings, 0);
    TEST_EQ_INT(n.notes, 0);
    TEST_OK(zr_config_finalize(&c, 8));
    TEST_EQ_INT(c.train_batch_size, 64);
    TEST_EQ_INT(c.train_micro_batch_size_per_gpu, 2);
    TEST_EQ_INT(c.gradient_accumulation_steps, 4);
    TEST_NEAR(c.gradient_clipping, 0.5, 0);
    TEST_EQ_INT(c.steps_per_print, 5);
    TEST_CHECK(strcmp(c.communication_data_type, "fp32") == 0);
    TEST_EQ_INT(c.bf16_enabled, 0);
    TEST_CHECK(strcmp(c.optimizer_type, "AdamW") == 0); /* case-insensitive, stored canonically */
    TEST_NEAR(c.lr, 3e-4, 0);
    TEST_NEAR(c.beta1, 0.8, 0);
    TEST_NEAR(c.beta2, 0.99, 0);
    TEST_NEAR(c.eps, 1e-6, 0);
    TEST_NEAR(c.weight_decay, 0.01, 0);
    TEST_CHECK(strcmp(c.scheduler_type, "WarmupDecayLR") == 0);
    TEST_NEAR(c.warmup_min_lr, 1e-5, 0);
    TEST_NEAR(c.warmup_max_lr, 2e-4, 0);
    TEST_EQ_INT(c.warmup_num_steps, 7);
    TEST_EQ_INT(c.total_num_steps, 90);
    TEST_NEAR(c.warmup_min_ratio, 0.05, 0);
    TEST_NEAR(c.cos_min_ratio, 0.2, 0);
    TEST_CHECK(strcmp(c.warmup_type, "linear") == 0);
    TEST_EQ_INT(c.stage, 3);
    TEST_EQ_INT(c.zero_quantized_weights, 1);
    TEST_EQ_INT(c.zero_hpz_partition_size, 4);
    TEST_EQ_INT(c.zero_quantized_gradients, 0);
    TEST_EQ_INT(c.reduce_bucket_size, 50000000LL);
    TEST_EQ_INT(c.stage3_prefetch_bucket_size, 1000000LL);
    TEST_EQ_INT(c.stage3_max_live_parameters, 300000000LL);
    TEST_EQ_INT(c.overlap_comm, 0);
    TEST_EQ_INT(c.layers, 6);
    TEST_EQ_INT(c.heads, 8);
    TEST_EQ_INT(c.channels, 256);
    TEST_EQ_INT(c.seq_len, 128);
    TEST_CHECK(strcmp(c.data_path, "data/tiny.txt") == 0);
    TEST_EQ_INT(c.val_every, 25);
    TEST_EQ_INT(c.val_batches, 2);
    TEST_EQ_INT(c.train_steps, 100);
    TEST_EQ_INT(c.seed, 42);
    TEST_EQ_INT(c.threads, 2);
    TEST_CHECK(strcmp(c.metrics_path, "m.jsonl") == 0);
    TEST_CHECK(strcmp(c.checkpoint_dir, "ck") == 0);
    TEST_EQ_INT(c.checkpoint_every, 10);
    TEST_EQ_INT(c.keep_checkpoints, 3);
    TEST_EQ_INT(c.resume, 1);
    TEST_EQ_INT(c.qwz_bits, 4);
    TEST_EQ_INT(c.qwz_group, 256);
    TEST_EQ_INT(c.qgz_bits, 8);
    TEST_EQ_INT(c.qgz_group, 512);
    TEST_EQ_INT(c.qgz_error_feedback, 1);
    TEST_EQ_INT(c.qgz_chunks, 4);
    TEST_EQ_INT(c.compare_zero3, 0);
}

static void test_load_file_and_flags(void)
{
    char path[64];
    write_temp(path, sizeof path, full_json);
    zr_train_config c;
    /* flags win over the file whatever their order */
    char *argv[] = {"--stage",       "2",           "--zr.model.layers=3",
                    "--config",      path,          "--lr",
                    "0.01",          "--no-resume", "--qgz",
                    "--micro-batch", "8",           "--optimizer.params.betas",
                    "0.7,0.9"};
    TEST_OK(flags(&c, (int)(sizeof argv / sizeof argv[0]), argv));
    TEST_EQ_INT(c.stage, 2);
    TEST_EQ_INT(c.layers, 3);
    TEST_EQ_INT(c.heads, 8); /* from the file */
    TEST_NEAR(c.lr, 0.01, 0);
    TEST_EQ_INT(c.resume, 0);
    TEST_EQ_INT(c.zero_quantized_gradients, 1);
    TEST_NEAR(c.beta1, 0.7, 0);
    TEST_NEAR(c.beta2, 0.9, 0);
    TEST_EQ_INT(c.train_micro_batch_size_per_gpu, 8);
    /* the file asks for qwZ and hpZ 4 explicitly: stage 2 cannot do that */
    TEST_FAILS(zr_config_finalize(&c, 2), ZR_ERR_INVALID, "zero_quantized_weights");
    /* micro 8 * accumulation 4 * 2 ranks = 64 matches train_batch_size 64 */
    char *argv2[] = {"--config", path, "--micro-batch", "8", "--world-is-not-a-flag"};
    TEST_FAILS(flags(&c, 5, argv2), ZR_ERR_INVALID, "--world-is-not-a-flag");
    char *argv3[] = {"--config=", "--stage", "3"};
    TEST_FAILS(flags(&c, 3, argv3), ZR_ERR_INVALID, "flag --config: the path is empty");
    char *argv4[] = {"--config",
                     path,
                     "--micro-batch",
                     "8",
                     "--resume=true",
                     "--zero_optimization.zero_quantized_weights",
                     "off",
                     "--hpz",
                     "1"};
    TEST_OK(flags(&c, 9, argv4));
    TEST_EQ_INT(c.resume, 1);
    TEST_EQ_INT(c.zero_quantized_weights, 0);
    TEST_OK(zr_config_finalize(&c, 2));
    TEST_EQ_INT(c.gradient_accumulation_steps, 4);
    unlink(path);

    /* bare booleans: --resume alone, and followed by another flag */
    char *argv5[] = {"--ckpt-dir", "ck", "--resume", "--steps", "7"};
    TEST_OK(flags(&c, 5, argv5));
    TEST_EQ_INT(c.resume, 1);
    TEST_EQ_INT(c.train_steps, 7);
    TEST_OK(zr_config_finalize(&c, 1));
    TEST_CHECK(strcmp(c.metrics_path, "ck/metrics.jsonl") == 0); /* derived */
    TEST_EQ_INT(c.total_num_steps, 7);

    /* --help short-circuits everything else */
    int help = 0;
    char *argv6[] = {"--bogus", "-h"};
    zr_config_defaults(&c);
    TEST_OK(zr_config_from_args(&c, 2, argv6, &help, collect, NULL));
    TEST_EQ_INT(help, 1);
}

static void test_bad_input(void)
{
    zr_train_config c;
    /* 1: malformed JSON, with line and column (the missing comma before "b") */
    TEST_FAILS(parse(&c, "{\n  \"a\": 1\n  \"b\": 2\n}\n", NULL), ZR_ERR_FORMAT,
               "cfg.json:3:3: malformed JSON near");
    /* 2: truncated JSON */
    TEST_FAILS(parse(&c, "{\"zero_optimization\": {\"stage\": 3,\n", NULL), ZR_ERR_FORMAT,
               "unexpected end of input");
    /* 3: string for an integer */
    TEST_FAILS(parse(&c, "{\"zero_optimization\": {\"stage\": \"three\"}}", NULL), ZR_ERR_INVALID,
               "cfg.json: \"zero_optimization.stage\" must be an integer in [0, 3], got \"three\"");
    /* 4: float for an integer */
    TEST_FAILS(parse(&c, "{\"zero_optimization\": {\"stage\": 2.5}}", NULL), ZR_ERR_INVALID,
               "got 2.5");
    /* 5: array for an object */
    TEST_FAILS(parse(&c, "{\"zero_optimization\": [3]}", NULL), ZR_ERR_INVALID,
               "\"zero_optimization\" must be an object (a section of keys), got an array");
    /* 6: out of range */
    TEST_FAILS(parse(&c, "{\"zero_optimization\": {\"stage\": 4}}", NULL), ZR_ERR_INVALID,
               "\"zero_optimization.stage\" must be an integer in [0, 3], got 4");
    /* 7: negative lr */
    TEST_FAILS(parse(&c, "{\"optimizer\": {\"params\": {\"lr\": -0.1}}}", NULL), ZR_ERR_INVALID,
               "\"optimizer.params.lr\" must be a number > 0, got -0.1");
    /* 8: betas outside [0, 1) */
    TEST_FAILS(parse(&c, "{\"optimizer\": {\"params\": {\"betas\": [0.9, 1.0]}}}", NULL),
               ZR_ERR_INVALID,
               "\"optimizer.params.betas\" must be an array of 2 numbers in [0, 1)");
    /* 9: three betas */
    TEST_FAILS(parse(&c, "{\"optimizer\": {\"params\": {\"betas\": [0.9, 0.9, 0.9]}}}", NULL),
               ZR_ERR_INVALID, "got [0.9,0.9,0.9]");
    /* 10: bits 5 */
    TEST_FAILS(parse(&c, "{\"zr\": {\"quant\": {\"qwz_bits\": 5}}}", NULL), ZR_ERR_INVALID,
               "\"zr.quant.qwz_bits\" must be one of 4 or 8, got 5");
    /* 11: group 12 */
    TEST_FAILS(parse(&c, "{\"zr\": {\"quant\": {\"qgz_group\": 12}}}", NULL), ZR_ERR_INVALID,
               "\"zr.quant.qgz_group\" must be a multiple of 8 in [32, 65536], got 12");
    /* 12: inconsistent batch sizes name all three values */
    TEST_FAILS(parse_final("{\"train_batch_size\": 64, \"train_micro_batch_size_per_gpu\": 4,"
                           " \"gradient_accumulation_steps\": 2}",
                           4),
               ZR_ERR_INVALID,
               "train_batch_size (64) must equal train_micro_batch_size_per_gpu (4) * "
               "gradient_accumulation_steps (2) * world size (4) = 32");
    /* 13: underivable accumulation */
    TEST_FAILS(parse_final("{\"train_batch_size\": 30, \"train_micro_batch_size_per_gpu\": 4}", 4),
               ZR_ERR_INVALID, "train_batch_size (30) is not a multiple of");
    /* 14: world not divisible by the hpZ size */
    TEST_FAILS(parse_final("{\"zero_optimization\": {\"zero_hpz_partition_size\": 3}}", 4),
               ZR_ERR_INVALID,
               "zero_optimization.zero_hpz_partition_size (3) must divide the world size (4): "
               "use a divisor of the world size, usually the ranks per node");
    /* 15: qwZ asked for with stage 2 */
    TEST_FAILS(
        parse_final("{\"zero_optimization\": {\"stage\": 2, \"zero_quantized_weights\": true}}", 4),
        ZR_ERR_INVALID,
        "zero_quantized_weights (qwZ) needs zero_optimization.stage 3, got stage 2");
    /* 16: qgZ asked for with stage 1 */
    TEST_FAILS(
        parse_final("{\"zero_optimization\": {\"stage\": 1, \"zero_quantized_gradients\": true,"
                    " \"zero_quantized_weights\": false}}",
                    4),
        ZR_ERR_INVALID, "zero_quantized_gradients (qgZ) needs zero_optimization.stage 2 or 3");
    /* 17: hpZ asked for with stage 2 */
    TEST_FAILS(
        parse_final("{\"zero_optimization\": {\"stage\": 2, \"zero_hpz_partition_size\": 2}}", 4),
        ZR_ERR_INVALID, "zero_hpz_partition_size 2 (hpZ) needs zero_optimization.stage 3");
    /* 18: unknown scheduler */
    TEST_FAILS(parse(&c, "{\"scheduler\": {\"type\": \"OneCycle\"}}", NULL), ZR_ERR_INVALID,
               "\"scheduler.type\" must be one of \"\", \"WarmupLR\", \"WarmupDecayLR\" or "
               "\"WarmupCosineLR\", got \"OneCycle\"");
    /* 19: fp16 */
    TEST_FAILS(parse(&c, "{\"fp16\": {\"enabled\": true}}", NULL), ZR_ERR_INVALID,
               "\"fp16.enabled\": true is not supported: zr uses bf16, not fp16");
    /* 20: fp16 on the wire */
    TEST_FAILS(parse(&c, "{\"communication_data_type\": \"fp16\"}", NULL), ZR_ERR_INVALID,
               "\"communication_data_type\": \"fp16\" is not supported");
    /* 21: missing file */
    zr_config_defaults(&c);
    TEST_FAILS(zr_config_load_json(&c, "/nonexistent/zr.json", collect, NULL), ZR_ERR_IO,
               "cannot open config file \"/nonexistent/zr.json\"");
    /* 22: unknown flag, with a suggestion */
    char *a1[] = {"--stgae", "3"};
    TEST_FAILS(flags(&c, 2, a1), ZR_ERR_INVALID, "unknown flag --stgae (did you mean --stage?)");
    /* 23: a flag missing its value, at the end and before another flag */
    char *a2[] = {"--steps"};
    TEST_FAILS(flags(&c, 1, a2), ZR_ERR_INVALID,
               "flag --steps (zr.train.train_steps) needs a value");
    char *a3[] = {"--data", "--steps", "3"};
    TEST_FAILS(flags(&c, 3, a3), ZR_ERR_INVALID, "needs a value, got the flag --steps");
    /* 24: a bad flag value goes through the same checks as the file */
    char *a4[] = {"--zero_optimization.stage=three"};
    TEST_FAILS(flags(&c, 1, a4), ZR_ERR_INVALID,
               "flag --zero_optimization.stage must be an integer in [0, 3], got \"three\"");
    /* 25: a boolean given as a string */
    TEST_FAILS(parse(&c, "{\"zero_optimization\": {\"overlap_comm\": \"yes\"}}", NULL),
               ZR_ERR_INVALID, "must be true or false, got \"yes\"");
    /* 26: the top level is not an object */
    TEST_FAILS(parse(&c, "[1, 2]", NULL), ZR_ERR_INVALID, "top level must be a JSON object");
    /* 27: channels not a multiple of heads */
    TEST_FAILS(parse_final("{\"zr\": {\"model\": {\"heads\": 3}}}", 1), ZR_ERR_INVALID,
               "zr.model.channels (128) must be a multiple of zr.model.heads (3)");
    /* 28: resume without a checkpoint folder */
    TEST_FAILS(parse_final("{\"zr\": {\"checkpoint\": {\"resume\": true}}}", 1), ZR_ERR_INVALID,
               "zr.checkpoint.resume needs zr.checkpoint.dir");
    /* 29: total steps shorter than the warm-up */
    TEST_FAILS(parse_final("{\"scheduler\": {\"params\": {\"total_num_steps\": 5}}}", 1),
               ZR_ERR_INVALID, "total_num_steps (5) must be at least");
    /* 30: a string too long for its buffer */
    char longpath[600];
    snprintf(longpath, sizeof longpath, "{\"zr\": {\"data\": {\"path\": \"%0300d\"}}}", 0);
    TEST_FAILS(parse(&c, longpath, NULL), ZR_ERR_INVALID,
               "\"zr.data.path\" must be a string of at most 255 characters");
    /* 31: a stray positional argument, first (zr train my.txt), last or between flags */
    char *a5[] = {"my.txt"};
    TEST_FAILS(flags(&c, 1, a5), ZR_ERR_INVALID, "unexpected argument \"my.txt\"");
    char *a5b[] = {"--steps", "3", "config.json"};
    TEST_FAILS(flags(&c, 3, a5b), ZR_ERR_INVALID, "unexpected argument \"config.json\"");
    char *a5c[] = {"train", "--steps", "3"};
    TEST_FAILS(flags(&c, 3, a5c), ZR_ERR_INVALID, "unexpected argument \"train\"");
    /* 32: Adam without decoupled weight decay */
    TEST_FAILS(parse(&c,
                     "{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"adam_w_mode\": false}}}",
                     NULL),
               ZR_ERR_INVALID, "adam_w_mode\": false is not supported");
    /* 33: a field set directly by a program is checked by finalize too */
    zr_config_defaults(&c);
    c.stage = 7;
    TEST_FAILS(zr_config_finalize(&c, 1), ZR_ERR_INVALID,
               "\"zero_optimization.stage\" must be an integer in [0, 3], got 7");
    zr_config_defaults(&c);
    snprintf(c.scheduler_type, sizeof c.scheduler_type, "Cosine");
    TEST_FAILS(zr_config_finalize(&c, 1), ZR_ERR_INVALID, "\"scheduler.type\" must be one of");
    /* 34: no ranks */
    zr_config_defaults(&c);
    TEST_FAILS(zr_config_finalize(&c, 0), ZR_ERR_INVALID, "world size must be >= 1, got 0");
    /* 35: an empty file */
    TEST_FAILS(parse(&c, "", NULL), ZR_ERR_FORMAT, "cfg.json:1:1:");
    /* 36: a bad value in a file read through the flags names the file */
    char path[64];
    write_temp(path, sizeof path, "{\n  \"optimizer\": {\"params\": {\"eps\": 0}}\n}\n");
    char *a6[] = {"--config", path};
    TEST_FAILS(flags(&c, 2, a6), ZR_ERR_INVALID, path);
    TEST_CHECK(strstr(zr_error_message(), "\"optimizer.params.eps\" must be a number > 0") != NULL);
    unlink(path);
    /* 37: an object for a number */
    TEST_FAILS(parse(&c, "{\"gradient_clipping\": {\"value\": 1}}", NULL), ZR_ERR_INVALID,
               "\"gradient_clipping\" must be a number >= 0, got {\"value\":1}");
    zr_error_clear();
}

static void test_warnings_and_notes(void)
{
    zr_train_config c;
    notes n;
    memset(&n, 0, sizeof n);
    /* an unknown key inside a section zr knows is refused (as DeepSpeed refuses it), with its
       path, the file and a suggestion: a typo there would train with the default */
    TEST_FAILS(parse(&c, "{\"zero_optimization\": {\"stgae\": 2}}", &n), ZR_ERR_INVALID,
               "cfg.json: unknown key \"zero_optimization.stgae\" in section "
               "\"zero_optimization\" (did you mean \"stage\"?)");
    TEST_FAILS(parse(&c, "{\"zr\": {\"train\": {\"sed\": 2}}}", &n), ZR_ERR_INVALID,
               "unknown key \"zr.train.sed\" in section \"zr.train\" (did you mean \"seed\"?)");
    TEST_EQ_INT(n.warnings, 0);
    /* unknown top-level keys warn (the section of a DeepSpeed feature zr does not have) */
    memset(&n, 0, sizeof n);
    TEST_OK(parse(&c, "{\"zero_optimisation\": {\"stage\": 1}, \"stage\": 2, \"zzz\": 1}", &n));
    TEST_EQ_INT(n.warnings, 3);
    TEST_CHECKF(strstr(n.last_warning, "unknown key \"zzz\"") != NULL &&
                    strstr(n.last_warning, "did you mean") == NULL,
                "%s", n.last_warning);
    /* the misspelt section and the misplaced key get their suggestions */
    memset(&n, 0, sizeof n);
    TEST_OK(parse(&c, "{\"zero_optimisation\": {\"stage\": 1}}", &n));
    TEST_CHECKF(strstr(n.last_warning, "(did you mean \"zero_optimization\"?)") != NULL, "%s",
                n.last_warning);
    memset(&n, 0, sizeof n);
    TEST_OK(parse(&c, "{\"stage\": 1}", &n));
    TEST_CHECKF(strstr(n.last_warning, "(did you mean \"zero_optimization.stage\"?)") != NULL, "%s",
                n.last_warning);
    /* DeepSpeed keys without effect: a note, not a warning */
    memset(&n, 0, sizeof n);
    TEST_OK(
        parse(&c,
              "{\"zero_optimization\": {\"contiguous_gradients\": true, \"reduce_scatter\": true,"
              " \"offload_optimizer\": {\"device\": \"cpu\"}}, \"wall_clock_breakdown\": false,"
              " \"fp16\": {\"enabled\": false, \"loss_scale\": 0}}",
              &n));
    TEST_EQ_INT(n.warnings, 0);
    TEST_EQ_INT(n.notes, 5);
    TEST_CHECKF(strstr(n.last_note, "\"fp16.loss_scale\" accepted, has no effect in zr") != NULL,
                "%s", n.last_note);
    /* DeepSpeed's non-stage3 names */
    memset(&n, 0, sizeof n);
    TEST_OK(parse(&c,
                  "{\"zero_optimization\": {\"prefetch_bucket_size\": 1234, "
                  "\"max_live_parameters\": 5678}}",
                  &n));
    TEST_EQ_INT(n.warnings, 0);
    TEST_EQ_INT(c.stage3_prefetch_bucket_size, 1234);
    TEST_EQ_INT(c.stage3_max_live_parameters, 5678);
    TEST_EQ_INT(c.overlap_comm, 1);
    /* a no-effect key as a flag notes too */
    char *argv[] = {"--zero_optimization.contiguous_gradients", "false"};
    int help = 0;
    memset(&n, 0, sizeof n);
    zr_config_defaults(&c);
    TEST_OK(zr_config_from_args(&c, 2, argv, &help, collect, &n));
    TEST_EQ_INT(n.notes, 1);
    TEST_EQ_INT(n.warnings, 0);
}

static void test_derivations(void)
{
    zr_train_config c;
    /* train_batch_size and micro: accumulation derived */
    TEST_OK(parse(&c, "{\"train_batch_size\": 64, \"train_micro_batch_size_per_gpu\": 2}", NULL));
    TEST_OK(zr_config_finalize(&c, 4));
    TEST_EQ_INT(c.gradient_accumulation_steps, 8);
    /* train_batch_size and accumulation: micro derived */
    TEST_OK(parse(&c, "{\"train_batch_size\": 64, \"gradient_accumulation_steps\": 2}", NULL));
    TEST_OK(zr_config_finalize(&c, 4));
    TEST_EQ_INT(c.train_micro_batch_size_per_gpu, 8);
    /* only train_batch_size: accumulation 1 */
    TEST_OK(parse(&c, "{\"train_batch_size\": 24}", NULL));
    TEST_OK(zr_config_finalize(&c, 3));
    TEST_EQ_INT(c.train_micro_batch_size_per_gpu, 8);
    TEST_EQ_INT(c.gradient_accumulation_steps, 1);
    /* micro and accumulation: train_batch_size derived */
    TEST_OK(parse(&c, "{\"train_micro_batch_size_per_gpu\": 3, \"gradient_accumulation_steps\": 5}",
                  NULL));
    TEST_OK(zr_config_finalize(&c, 2));
    TEST_EQ_INT(c.train_batch_size, 30);
    /* stage 2 with the ZeRO++ defaults: qwZ and hpZ turn off quietly, qgZ stays */
    TEST_OK(parse(&c, "{\"zero_optimization\": {\"stage\": 2}}", NULL));
    TEST_OK(zr_config_finalize(&c, 4));
    TEST_EQ_INT(c.zero_quantized_weights, 0);
    TEST_EQ_INT(c.zero_hpz_partition_size, 1);
    TEST_EQ_INT(c.zero_quantized_gradients, 1);
    TEST_OK(parse(&c, "{\"zero_optimization\": {\"stage\": 0}}", NULL));
    TEST_OK(zr_config_finalize(&c, 4));
    TEST_EQ_INT(c.zero_quantized_gradients, 0);
    /* hpZ dividing the world; fp32 wire when bf16 is off */
    TEST_OK(parse(&c,
                  "{\"zero_optimization\": {\"zero_hpz_partition_size\": 2}, \"bf16\": "
                  "{\"enabled\": false}}",
                  NULL));
    TEST_OK(zr_config_finalize(&c, 6));
    TEST_CHECK(strcmp(c.communication_data_type, "fp32") == 0);
    /* finalize twice is harmless (derived values are consistent) */
    TEST_OK(zr_config_finalize(&c, 6));
}

/* The model's positions apart from the trained length, and a shape taken from an llm.c file. */
static void test_model_shape(void)
{
    zr_train_config c;
    TEST_OK(parse(&c, "{}", NULL));
    TEST_EQ_INT(c.max_seq_len, 1024);
    TEST_EQ_INT(c.vocab_size, 0);
    TEST_OK(parse(&c, "{\"zr\": {\"model\": {\"seq_len\": 1024}}}", NULL));
    TEST_OK(zr_config_finalize(&c, 1));
    TEST_OK(parse(&c, "{\"zr\": {\"model\": {\"seq_len\": 1025}}}", NULL));
    TEST_FAILS(zr_config_finalize(&c, 1), ZR_ERR_INVALID,
               "zr.model.seq_len (1025) must be at most zr.model.max_seq_len (1024)");
    TEST_OK(parse(&c, "{\"zr\": {\"model\": {\"seq_len\": 2048, \"max_seq_len\": 2048}}}", NULL));
    TEST_OK(zr_config_finalize(&c, 1));
    TEST_FAILS(parse(&c, "{\"zr\": {\"model\": {\"vocab_size\": 16777217}}}", NULL), ZR_ERR_INVALID,
               "zr.model.vocab_size");
    /* zr.model.init: keys left out take the file's values, keys given must agree */
    const zr_gpt_config gpt2 = {1024, 50257, 50304, 12, 12, 768};
    char *a1[] = {"--init", "gpt2_124M.bin", "--seq-len", "2048"};
    TEST_OK(flags(&c, 4, a1));
    TEST_OK(zr_config_finalize(&c, 1)); /* max_seq_len is the file's, not yet known */
    TEST_FAILS(zr_config_adopt_model(&c, &gpt2, "gpt2_124M.bin"), ZR_ERR_INVALID,
               "zr.model.seq_len (2048) must be at most the 1024 positions of the model file "
               "gpt2_124M.bin");
    char *a2[] = {"--init", "gpt2_124M.bin"};
    TEST_OK(flags(&c, 2, a2));
    TEST_OK(zr_config_adopt_model(&c, &gpt2, "gpt2_124M.bin"));
    TEST_EQ_INT(c.layers, 12);
    TEST_EQ_INT(c.heads, 12);
    TEST_EQ_INT(c.channels, 768);
    TEST_EQ_INT(c.max_seq_len, 1024);
    TEST_EQ_INT(c.vocab_size, 50257);
    char *a3[] = {"--init",  "g.bin", "--layers",      "12",   "--channels",   "768",
                  "--heads", "12",    "--max-seq-len", "1024", "--vocab-size", "50257"};
    TEST_OK(flags(&c, 12, a3));
    TEST_OK(zr_config_adopt_model(&c, &gpt2, "g.bin"));
    static const struct {
        const char *flag, *value, *expect;
    } bad[] = {
        {"--layers", "2", "zr.model.layers is 2, but the model file g.bin (zr.model.init) has 12"},
        {"--heads", "4", "zr.model.heads is 4"},
        {"--channels", "128", "zr.model.channels is 128"},
        {"--max-seq-len", "512", "zr.model.max_seq_len is 512"},
        {"--vocab-size", "256", "zr.model.vocab_size is 256"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *a[] = {"--init", "g.bin", (char *)bad[i].flag, (char *)bad[i].value};
        TEST_OK(flags(&c, 4, a));
        TEST_FAILS(zr_config_adopt_model(&c, &gpt2, "g.bin"), ZR_ERR_INVALID, bad[i].expect);
    }
}

static void test_print_json_help(void)
{
    zr_train_config c, d;
    TEST_OK(parse(&c, full_json, NULL));
    TEST_OK(zr_config_finalize(&c, 8));
    char *text = NULL;
    TEST_OK(zr_config_to_json(&c, &text));
    if (text != NULL) {
        /* the dump reads back to the same configuration */
        TEST_OK(parse(&d, text, NULL));
        TEST_OK(zr_config_finalize(&d, 8));
        char *again = NULL;
        TEST_OK(zr_config_to_json(&d, &again));
        TEST_CHECK(again != NULL && strcmp(text, again) == 0);
        TEST_CHECK(strstr(text, "\"betas\":") != NULL);
        zr_free(again);
        zr_free(text);
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    zr_config_print(f, &c);
    fclose(f);
    TEST_CHECK(strstr(buf, "zero_optimization.stage") != NULL);
    TEST_CHECK(strstr(buf, "= 3\n") != NULL);
    TEST_CHECK(strstr(buf, "optimizer.params.betas                         = [0.8, 0.99]") != NULL);
    TEST_CHECK(strstr(buf, "zr.data.path                                   = \"data/tiny.txt\"") !=
               NULL);
    free(buf);
    buf = NULL;
    f = open_memstream(&buf, &len);
    zr_config_print_help(f);
    fclose(f);
    const char *expect[] = {
        "--zero_optimization.stage, --stage",
        "--zr.train.train_steps, --steps",
        "--zr.checkpoint.resume, --resume",
        "zero_optimization\n",
        "default 0.001",
        "zero_optimization.contiguous_gradients",
        "--zr.quant.qgz_group\n      a multiple of 8 in [32, 65536]; default 1024"};
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++) {
        TEST_CHECKF(strstr(buf, expect[i]) != NULL, "help lacks \"%s\"", expect[i]);
    }
    free(buf);
}

/* ---- every key at its extremes ------------------------------------------ */

/* The value of a dotted key in the JSON dump of c ("" when absent). */
static void json_value(const zr_train_config *c, const char *path, char *out, size_t n)
{
    char *text = NULL;
    TEST_OK(zr_config_to_json(c, &text));
    out[0] = '\0';
    cJSON *root = text != NULL ? cJSON_Parse(text) : NULL;
    cJSON *v = root;
    char comp[128];
    for (const char *p = path; v != NULL && *p != '\0';) {
        size_t len = strcspn(p, ".");
        snprintf(comp, sizeof comp, "%.*s", (int)len, p);
        v = cJSON_GetObjectItemCaseSensitive(v, comp);
        p += len + (p[len] == '.');
    }
    char *s = v != NULL ? cJSON_PrintUnformatted(v) : NULL;
    if (s != NULL) {
        snprintf(out, n, "%s", s);
        free(s);
    }
    /* a number as the dump wrote it: cJSON would read 2^63 - 1 back as a double */
    char key[160];
    const char *leaf = strrchr(path, '.');
    snprintf(key, sizeof key, "\"%s\":", leaf != NULL ? leaf + 1 : path);
    const char *at = text != NULL && cJSON_IsNumber(v) ? strstr(text, key) : NULL;
    if (at != NULL) {
        at += strlen(key);
        at += strspn(at, " \t");
        snprintf(out, n, "%.*s", (int)strspn(at, "-0123456789.eE+"), at);
    }
    cJSON_Delete(root);
    zr_free(text);
}

/*
 * Every integer key at INT_MAX, INT64_MAX, -1 and 0, as a flag and in a file:
 * either refused with a message that names the key, or accepted with the
 * value read exactly (whether it is then cheap is test_cli's business). A
 * number beyond a double (1e999, 5000 digits) is reported as written.
 */
static void test_integer_extremes(void)
{
    static const char *const values[] = {"2147483647", "9223372036854775807", "-1", "0"};
    const char *path, *flag;
    zr_config_kind kind;
    int keys = 0, refused = 0, accepted = 0;
    for (size_t i = 0; zr_config_key_info(i, &path, &flag, &kind); i++) {
        if (kind != ZR_CFG_INTEGER) {
            continue;
        }
        keys++;
        for (size_t j = 0; j < sizeof values / sizeof values[0]; j++) {
            zr_train_config c;
            char name[160], json[400];
            snprintf(name, sizeof name, "--%s", path);
            char *argv[] = {name, (char *)values[j]};
            zr_error_clear();
            zr_status st = flags(&c, 2, argv);
            if (st == ZR_OK) {
                st = zr_config_finalize(&c, 1);
            }
            if (st != ZR_OK) {
                refused++;
                TEST_CHECKF(strstr(zr_error_message(), path) != NULL,
                            "%s %s: message does not name the key: %s", path, values[j],
                            zr_error_message());
            } else {
                accepted++;
                char got[64];
                json_value(&c, path, got, sizeof got);
                /* 0 may be derived into another value (0 = derived / ranks per node) */
                TEST_CHECKF(strcmp(got, values[j]) == 0 || strcmp(values[j], "0") == 0,
                            "%s %s read back as %s", path, values[j], got);
            }
            /* the same value from a file: same verdict, the key named */
            char *dot = strrchr(path, '.');
            if (dot == NULL) {
                snprintf(json, sizeof json, "{\"%s\": %s}", path, values[j]);
            } else {
                /* nest a.b.c as {"a": {"b": {"c": v}}} */
                int depth = 0, w = 0;
                for (const char *p = path; *p != '\0'; depth++) {
                    size_t len = strcspn(p, ".");
                    w += snprintf(json + w, sizeof json - (size_t)w, "{\"%.*s\": ", (int)len, p);
                    p += len + (p[len] == '.');
                }
                w += snprintf(json + w, sizeof json - (size_t)w, "%s", values[j]);
                for (int d = 0; d < depth; d++) {
                    w += snprintf(json + w, sizeof json - (size_t)w, "}");
                }
            }
            zr_error_clear();
            zr_status st2 = parse(&c, json, NULL);
            if (st2 == ZR_OK) {
                st2 = zr_config_finalize(&c, 1);
            }
            TEST_CHECKF((st2 == ZR_OK) == (st == ZR_OK), "%s: flag and file disagree on %s", path,
                        values[j]);
            if (st2 != ZR_OK) {
                TEST_CHECKF(strstr(zr_error_message(), path) != NULL, "%s: %s", json,
                            zr_error_message());
            }
        }
    }
    TEST_CHECK(keys >= 20);
    printf("  %d integer keys x 4 extremes: %d refused naming the key, %d accepted exactly\n", keys,
           refused, accepted);

    /* numbers a double cannot hold are shown as written, not as "null" or "inf" */
    zr_train_config c;
    char *a1[] = {"--lr", "1e999"};
    TEST_FAILS(flags(&c, 2, a1), ZR_ERR_INVALID,
               "flag --lr (optimizer.params.lr): 1e999 is out of range: it must be a number > 0");
    char digits[5001];
    memset(digits, '7', 5000);
    digits[5000] = '\0';
    char *a2[] = {"--stage", digits};
    TEST_FAILS(flags(&c, 2, a2), ZR_ERR_INVALID,
               "flag --stage (zero_optimization.stage): 777777777777777777777777... (5000 "
               "characters) is out of range");
    TEST_FAILS(parse(&c, "{\"optimizer\": {\"params\": {\"lr\": 1e999}}}", NULL), ZR_ERR_INVALID,
               "cfg.json:1:33: \"optimizer.params.lr\": 1e999 is out of range: it must be a "
               "number > 0");
    char *big = malloc(5100);
    snprintf(big, 5100, "{\"zero_optimization\":\n {\"stage\": %s}}", digits);
    TEST_FAILS(parse(&c, big, NULL), ZR_ERR_INVALID,
               "cfg.json:2:12: \"zero_optimization.stage\": 777777777777777777777777... (5000 "
               "characters) is out of range: it must be an integer in [0, 3]");
    free(big);
    TEST_FAILS(parse(&c, "{\"optimizer\": {\"params\": {\"betas\": [0.9, -1e400]}}}", NULL),
               ZR_ERR_INVALID, "\"optimizer.params.betas\": -1e400 is out of range");
    TEST_FAILS(parse(&c, "{\"optimizer\": {\"params\": {\"eps\": 1e-400}}}", NULL), ZR_ERR_INVALID,
               "\"optimizer.params.eps\": 1e-400 is out of range");
    /* a number inside a string is text */
    TEST_OK(parse(&c, "{\"zr\": {\"data\": {\"path\": \"1e999\"}}}", NULL));
    /* a derived micro-batch obeys its key's bound */
    TEST_FAILS(
        parse_final("{\"train_batch_size\": 2147483647, \"gradient_accumulation_steps\": 1}", 1),
        ZR_ERR_INVALID,
        "train_batch_size (2147483647) at 1 rank gives "
        "train_micro_batch_size_per_gpu 2147483647");
    zr_error_clear();
}

/*
 * One grammar for every boolean flag: --KEY, --KEY=WORD, --KEY WORD and
 * --no-KEY, under its dotted name and its short alias; --no-KEY takes no
 * value and says so naming itself; --no- of a non-boolean names the key.
 */
static void test_boolean_flags(void)
{
    const char *path, *flag;
    zr_config_kind kind;
    int tested = 0;
    for (size_t i = 0; zr_config_key_info(i, &path, &flag, &kind); i++) {
        if (kind != ZR_CFG_BOOLEAN) {
            continue;
        }
        const char *names[2] = {path, flag};
        for (int n = 0; n < 2 && names[n] != NULL; n++) {
            char key[160], eq_t[170], eq_f[170], no[170], no_eq[180];
            snprintf(key, sizeof key, "--%s", names[n]);
            snprintf(eq_t, sizeof eq_t, "--%s=on", names[n]);
            snprintf(eq_f, sizeof eq_f, "--%s=false", names[n]);
            snprintf(no, sizeof no, "--no-%s", names[n]);
            snprintf(no_eq, sizeof no_eq, "--no-%s=true", names[n]);
            struct {
                int argc;
                char *argv[3];
                const char *want;
            } forms[] = {
                {1, {key}, "true"},          {1, {eq_t}, "true"},
                {1, {eq_f}, "false"},        {2, {key, "0"}, "false"},
                {2, {key, "yes"}, "true"},   {1, {no}, "false"},
                {3, {no, key, "1"}, "true"}, {3, {key, "off", no}, "false"},
            };
            for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
                zr_train_config c;
                TEST_OK(flags(&c, forms[f].argc, forms[f].argv));
                char got[16];
                json_value(&c, path, got, sizeof got);
                TEST_CHECKF(strcmp(got, forms[f].want) == 0, "%s %s: got %s, want %s",
                            forms[f].argv[0], forms[f].argc > 1 ? forms[f].argv[1] : "", got,
                            forms[f].want);
            }
            zr_train_config c;
            char *bad1[] = {no_eq};
            TEST_FAILS(flags(&c, 1, bad1), ZR_ERR_INVALID, "takes no value");
            TEST_CHECKF(strstr(zr_error_message(), no) != NULL && strstr(zr_error_message(), path),
                        "%s", zr_error_message());
            char *bad2[] = {no, "false"};
            TEST_FAILS(flags(&c, 2, bad2), ZR_ERR_INVALID, "takes no value (got \"false\")");
            char *bad3[] = {key, "maybe"};
            TEST_FAILS(flags(&c, 2, bad3), ZR_ERR_INVALID, "unexpected argument \"maybe\"");
            char bad_eq[180];
            snprintf(bad_eq, sizeof bad_eq, "--%s=maybe", names[n]);
            char *bad4[] = {bad_eq};
            TEST_FAILS(flags(&c, 1, bad4), ZR_ERR_INVALID, "must be true or false, got \"maybe\"");
            tested++;
        }
    }
    TEST_CHECK(tested >= 8);
    zr_train_config c;
    char *a[] = {"--no-steps"};
    TEST_FAILS(flags(&c, 1, a), ZR_ERR_INVALID,
               "flag --no-steps: --no- applies to true/false keys and --no-hpz only, and "
               "zr.train.train_steps");
    printf("  %d boolean flag names x 12 spellings\n", tested);
    zr_error_clear();
}

/* ---- the live progress bar ---------------------------------------------- */

/*
 * The bar is for a person at a terminal: on for a terminal with a TERM,
 * off under every launcher (whose ranks may sit on a pseudo-terminal that
 * ends in a log file), under CI and for TERM dumb or unset, unless
 * ZR_PROGRESS forces it either way.
 */
static void test_progress_decision(void)
{
    struct {
        const char *env[4];
        int tty, want;
    } cases[] = {
        {{"TERM=xterm"}, 1, 1},
        {{"TERM=xterm"}, 0, 0},
        {{NULL}, 1, 0},
        {{"TERM=dumb"}, 1, 0},
        {{"TERM=xterm", "CI=true"}, 1, 0},
        {{"TERM=xterm", "CI="}, 1, 1},
        {{"TERM=xterm", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_RANK=0"}, 1, 0},
        {{"TERM=xterm", "OMPI_COMM_WORLD_RANK=0"}, 1, 0},
        {{"TERM=xterm", "PMIX_RANK=0"}, 1, 0},
        {{"TERM=xterm", "PMI_RANK=0", "PMI_SIZE=2"}, 1, 0},
        {{"TERM=xterm", "PMI_SIZE=2"}, 1, 0},
        {{"TERM=xterm", "SLURM_PROCID=0"}, 1, 0},
        {{"TERM=xterm", "SLURM_JOB_ID=123"}, 1, 0},
        {{"TERM=xterm", "OMPI_COMM_WORLD_SIZE=4", "ZR_PROGRESS=1"}, 1, 1},
        {{"SLURM_JOB_ID=1", "ZR_PROGRESS=1"}, 0, 1},
        {{"TERM=xterm", "ZR_PROGRESS=0"}, 1, 0},
        {{"TERM=xterm", "ZR_PROGRESS="}, 1, 1},
        {{"TERM=xterm", "SLURM_JOB_ID_X=1", "XPMI_RANK=1"}, 1, 1}, /* names must match exactly */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *envp[5] = {NULL};
        for (int k = 0; k < 4 && cases[i].env[k] != NULL; k++) {
            envp[k] = (char *)cases[i].env[k];
        }
        TEST_CHECKF(zr_progress_bar_wanted(envp, cases[i].tty) == cases[i].want,
                    "case %zu (%s %s %s, tty %d): want %d", i, envp[0] ? envp[0] : "",
                    envp[1] ? envp[1] : "", envp[2] ? envp[2] : "", cases[i].tty, cases[i].want);
    }
    TEST_EQ_INT(zr_progress_bar_wanted(NULL, 1), 0);
}

/* ---- metrics ------------------------------------------------------------ */

/* DeepSpeed's activation_checkpointing section: partition_activations turns zr's on */
static void test_activation_checkpointing(void)
{
    zr_train_config c;
    notes n;
    memset(&n, 0, sizeof n);
    TEST_OK(parse(&c, "{}", &n));
    TEST_EQ_INT(c.activation_checkpointing, 0);
    TEST_OK(parse(&c,
                  "{\"activation_checkpointing\": {\"partition_activations\": true, "
                  "\"number_checkpoints\": 4}}",
                  &n));
    TEST_EQ_INT(c.activation_checkpointing, 1);
    TEST_EQ_INT(n.warnings, 0);
    TEST_EQ_INT(n.notes, 1); /* number_checkpoints: no effect */
    memset(&n, 0, sizeof n);
    TEST_OK(parse(&c, "{\"zr\": {\"model\": {\"activation_checkpointing\": true}}}", &n));
    TEST_EQ_INT(c.activation_checkpointing, 1);
    TEST_FAILS(parse(&c, "{\"activation_checkpointing\": {\"partition_activations\": 2}}", &n),
               ZR_ERR_INVALID, "partition_activations");
}

static void test_metrics(void)
{
    zr_metrics_point p;
    TEST_OK(zr_metrics_parse_line(
        "{\"step\": 3, \"loss\": 2.5, \"tokens_per_s\": 1000, \"lr\": 0.001}", "m", 1, &p));
    TEST_EQ_INT(p.step, 3);
    TEST_NEAR(p.loss, 2.5, 0);
    TEST_NEAR(p.tokens_per_s, 1000, 0);
    TEST_NEAR(p.lr, 0.001, 0);
    TEST_CHECK(isnan(p.val_loss));
    TEST_OK(zr_metrics_parse_line("{\"step\": 50, \"val_loss\": 2.0}", "m", 2, &p));
    TEST_NEAR(p.val_loss, 2.0, 0);
    TEST_CHECK(isnan(p.loss));
    TEST_OK(
        zr_metrics_parse_line("{\"step\": 4, \"loss\": null, \"tokens_per_s\": 5}", "m", 3, &p));
    TEST_CHECK(isnan(p.loss));
    TEST_FAILS(zr_metrics_parse_line("{\"step\": 4, \"loss\": 1", "run/m.jsonl", 7, &p),
               ZR_ERR_FORMAT, "run/m.jsonl:7: malformed JSON line");
    TEST_FAILS(zr_metrics_parse_line("{\"loss\": 1, \"tokens_per_s\": 1}", "m", 8, &p),
               ZR_ERR_FORMAT, "m:8: \"step\" must be a non-negative integer (missing)");
    TEST_FAILS(
        zr_metrics_parse_line("{\"step\": 1, \"loss\": 1}", "m", 9, &p), ZR_ERR_FORMAT,
        "m:9: a training line needs \"loss\" and \"tokens_per_s\" (missing \"tokens_per_s\")");
    TEST_FAILS(
        zr_metrics_parse_line("{\"step\": 1, \"loss\": \"x\", \"tokens_per_s\": 1}", "m", 10, &p),
        ZR_ERR_FORMAT, "m:10: \"loss\" must be a number");
    TEST_FAILS(zr_metrics_parse_line("[1]", "m", 11, &p), ZR_ERR_FORMAT, "must be a JSON object");

    char label[64];
    zr_metrics_label("runs/a/metrics.jsonl", label, sizeof label);
    TEST_CHECK(strcmp(label, "a") == 0);
    zr_metrics_label("metrics.jsonl", label, sizeof label);
    TEST_CHECK(strcmp(label, "metrics") == 0);
    zr_metrics_label("./x.jsonl", label, sizeof label);
    TEST_CHECK(strcmp(label, "x") == 0);
    zr_metrics_label("/abs/run2//metrics.jsonl", label, sizeof label);
    TEST_CHECK(strcmp(label, "run2") == 0);

    /* a file written by zr_metrics_write reads back; a cut-off last line is skipped */
    char path[64];
    write_temp(path, sizeof path, "");
    FILE *f = fopen(path, "w");
    for (int s = 0; s < 300; s++) {
        zr_metrics_point q = {s, 5.0 - s * 0.01, 1000 + s, s % 50 == 0 ? 4.0 : NAN, 1e-3, 0};
        TEST_OK(zr_metrics_write(f, &q));
    }
    fputs("\n{\"step\": 300, \"lo", f);
    fclose(f);
    zr_metrics_series ser;
    TEST_OK(zr_metrics_read(path, &ser));
    TEST_EQ_INT(ser.count, 300);
    TEST_EQ_INT(ser.points[299].step, 299);
    TEST_NEAR(ser.points[299].loss, 5.0 - 2.99, 1e-9);
    TEST_NEAR(ser.points[50].val_loss, 4.0, 0);
    TEST_CHECK(isnan(ser.points[51].val_loss));
    zr_metrics_free(&ser);
    /* a bad complete line is an error naming file:line */
    f = fopen(path, "w");
    fputs("{\"step\": 0, \"loss\": 1, \"tokens_per_s\": 1}\n{\"step\": 1, oops}\n", f);
    fclose(f);
    TEST_FAILS(zr_metrics_read(path, &ser), ZR_ERR_FORMAT, ":2: malformed JSON line");
    zr_metrics_free(&ser);
    f = fopen(path, "w");
    fputs("\n\n", f);
    fclose(f);
    TEST_FAILS(zr_metrics_read(path, &ser), ZR_ERR_FORMAT, "holds no metrics lines");
    zr_metrics_free(&ser);
    unlink(path);
    TEST_FAILS(zr_metrics_read("/nonexistent/m.jsonl", &ser), ZR_ERR_IO,
               "cannot open metrics file \"/nonexistent/m.jsonl\"");
    zr_metrics_free(&ser);
    zr_error_clear();
}

/*
 * The trainer's writer: non-finite values as null, floats and doubles that
 * read back bit for bit, a resume that cuts the file back to the
 * checkpoint's step atomically, and a write to a full disk that fails.
 */
static void test_metrics_writer(void)
{
    zr_metrics_line l;
    zr_metrics_line_begin(&l, 7);
    float f = 0.1f + 1e-8f;
    double d = 1.0 / 3.0;
    zr_metrics_line_f32(&l, "loss", f);
    zr_metrics_line_f64(&l, "tokens_per_s", d);
    zr_metrics_line_f64(&l, "grad_norm", NAN);
    zr_metrics_line_f32(&l, "val_loss", -INFINITY);
    zr_metrics_line_f64(&l, "lr", INFINITY);
    zr_metrics_line_i64(&l, "bytes", 9007199254740993LL);
    const char *text = zr_metrics_line_end(&l);
    TEST_CHECKF(strstr(text, "\"grad_norm\": null") && strstr(text, "\"val_loss\": null") &&
                    strstr(text, "\"lr\": null") && strstr(text, "9007199254740993}\n"),
                "%s", text);
    cJSON *obj = cJSON_Parse(text);
    TEST_CHECKF(obj != NULL, "not JSON: %s", text);
    cJSON_Delete(obj);
    zr_metrics_point p;
    TEST_OK(zr_metrics_parse_line(text, "m", 1, &p));
    TEST_CHECK((float)p.loss == f);
    TEST_CHECK(p.tokens_per_s == d);
    TEST_CHECK(isnan(p.val_loss) && isnan(p.lr));

    /* resume: steps 1..6 written, a cut-off 7; the checkpoint is at step 4 */
    char dir[64] = "/tmp/zr_test_metrics_XXXXXX", path[128], tmp[160];
    TEST_CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/sub dir/metrics.jsonl", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    zr_metrics_file m;
    size_t dropped = 99;
    TEST_OK(zr_metrics_open(&m, path, 0, 0, &dropped)); /* fresh: makes "sub dir" */
    TEST_EQ_INT(dropped, 0);
    for (int s = 1; s <= 6; s++) {
        zr_metrics_line_begin(&l, s);
        zr_metrics_line_f32(&l, "loss", 10.0f - s);
        zr_metrics_line_f64(&l, "tokens_per_s", 100);
        TEST_OK(zr_metrics_append(&m, zr_metrics_line_end(&l)));
    }
    TEST_OK(zr_metrics_append(&m, "not json\n\n{\"step\": 7, \"lo"));
    TEST_OK(zr_metrics_close(&m));
    TEST_OK(zr_metrics_open(&m, path, 1, 4, &dropped));
    TEST_EQ_INT(dropped, 4); /* steps 5 and 6, the foreign line and the cut-off one */
    TEST_CHECK(access(tmp, F_OK) != 0);
    for (int s = 5; s <= 8; s++) {
        zr_metrics_line_begin(&l, s);
        zr_metrics_line_f32(&l, "loss", 1.0f);
        zr_metrics_line_f64(&l, "tokens_per_s", 100);
        TEST_OK(zr_metrics_append(&m, zr_metrics_line_end(&l)));
    }
    TEST_OK(zr_metrics_close(&m));
    TEST_OK(zr_metrics_close(&m)); /* closing twice is harmless */
    zr_metrics_series ser;
    TEST_OK(zr_metrics_read(path, &ser));
    TEST_EQ_INT(ser.count, 8);
    for (size_t i = 0; i < ser.count && i < 8; i++) {
        TEST_EQ_INT(ser.points[i].step, (long long)i + 1);
        TEST_NEAR(ser.points[i].loss, i < 4 ? 9.0 - i : 1.0, 0);
    }
    zr_metrics_free(&ser);
    /* resuming from step 0 (no checkpoint found) empties it; a missing file is fine */
    TEST_OK(zr_metrics_keep_through(path, 0, &dropped));
    TEST_EQ_INT(dropped, 8);
    unlink(path);
    TEST_OK(zr_metrics_keep_through(path, 3, &dropped));
    TEST_EQ_INT(dropped, 0);
    /* a write that fails (here beyond RLIMIT_FSIZE, as on a full disk) fails naming the file,
       it never passes silently */
    char full[128];
    snprintf(full, sizeof full, "%s/full.jsonl", dir);
    TEST_OK(zr_metrics_open(&m, full, 0, 0, &dropped));
    struct rlimit old_fsize, small = {64, 64};
    TEST_CHECK(getrlimit(RLIMIT_FSIZE, &old_fsize) == 0);
    small.rlim_max = old_fsize.rlim_max;
    void (*old_xfsz)(int) = signal(SIGXFSZ, SIG_IGN);
    TEST_CHECK(setrlimit(RLIMIT_FSIZE, &small) == 0);
    zr_metrics_line_begin(&l, 1);
    for (int k = 0; k < 8; k++) {
        zr_metrics_line_f64(&l, "tokens_per_s", 1e9 + k);
    }
    TEST_FAILS(zr_metrics_append(&m, zr_metrics_line_end(&l)), ZR_ERR_IO,
               "cannot write metrics file");
    TEST_CHECK(strstr(zr_error_message(), "full.jsonl") != NULL);
    TEST_CHECK(setrlimit(RLIMIT_FSIZE, &old_fsize) == 0);
    signal(SIGXFSZ, old_xfsz);
    zr_metrics_close(&m);
    unlink(full);
    /* a resume (or a fresh run) over something that is not a regular file is refused, not
       rewritten: a link (zr never writes through one), a device */
    TEST_CHECK(symlink("/dev/full", full) == 0);
    TEST_FAILS(zr_metrics_open(&m, full, 1, 3, &dropped), ZR_ERR_INVALID, "symbolic link");
    TEST_FAILS(zr_metrics_open(&m, full, 0, 0, &dropped), ZR_ERR_INVALID, "symbolic link");
    unlink(full);
    TEST_FAILS(zr_metrics_open(&m, "/dev/full", 0, 0, &dropped), ZR_ERR_INVALID,
               "a character device");
    /* a fresh run never cuts another run's metrics file short */
    TEST_OK(zr_metrics_open(&m, full, 0, 0, &dropped));
    zr_metrics_line_begin(&l, 1);
    TEST_OK(zr_metrics_append(&m, zr_metrics_line_end(&l)));
    TEST_OK(zr_metrics_close(&m));
    TEST_FAILS(zr_metrics_open(&m, full, 0, 0, &dropped), ZR_ERR_INVALID,
               "written by another run; a fresh run does not overwrite them");
    /* issue 39 item 5: one run per metrics file, by a lock (flock is per open file, so a
       second open in this process stands for another run): held from zr_metrics_lock, across
       a resume's rewrite (the new file is locked before it replaces the old), to the close */
    zr_metrics_file other;
    TEST_OK(zr_metrics_lock(&m, full, 0));
    TEST_FAILS(zr_metrics_lock(&other, full, 0), ZR_ERR_INVALID,
               "is in use by another zr train that is running now");
    TEST_OK(zr_metrics_start(&m, 1, 0, &dropped));
    TEST_EQ_INT(dropped, 1);
    TEST_FAILS(zr_metrics_lock(&other, full, 1), ZR_ERR_INVALID, "is in use by another zr train");
    TEST_OK(zr_metrics_check_held(&m));
    /* deleted or replaced under the run: said, naming the file */
    unlink(full);
    TEST_FAILS(zr_metrics_check_held(&m), ZR_ERR_IO, "was deleted or moved away");
    zr_test_write_file(full, "", 0);
    TEST_FAILS(zr_metrics_check_held(&m), ZR_ERR_IO, "was replaced by another file");
    TEST_OK(zr_metrics_close(&m));
    TEST_OK(zr_metrics_lock(&other, full, 1));
    TEST_OK(zr_metrics_close(&other));
    unlink(full);
    char sub[128];
    snprintf(sub, sizeof sub, "%s/sub dir", dir);
    rmdir(sub);
    TEST_CHECK(rmdir(dir) == 0);
    zr_error_clear();
}

/*
 * Files named by the user that are not regular files: a FIFO would block the
 * reading (or writing) rank forever while the others wait in a collective,
 * so the config reader, the metrics reader (zr plot, resume) and the metrics
 * writer refuse one at once, naming it.
 */
static void test_not_regular_files(void)
{
    char dir[] = "/tmp/zr-test-fifo-XXXXXX";
    TEST_CHECK(mkdtemp(dir) != NULL);
    char fifo[128];
    snprintf(fifo, sizeof fifo, "%s/pipe", dir);
    TEST_CHECK(mkfifo(fifo, 0600) == 0);
    zr_train_config c;
    zr_config_defaults(&c);
    TEST_FAILS(zr_config_load_json(&c, fifo, NULL, NULL), ZR_ERR_INVALID, "not a regular file");
    TEST_FAILS(zr_config_load_json(&c, dir, NULL, NULL), ZR_ERR_INVALID, "a directory");
    zr_metrics_series ser;
    TEST_FAILS(zr_metrics_read(fifo, &ser), ZR_ERR_INVALID, "FIFO");
    zr_metrics_file m;
    memset(&m, 0, sizeof m);
    size_t dropped = 0;
    TEST_FAILS(zr_metrics_open(&m, fifo, 0, 0, &dropped), ZR_ERR_INVALID, "is a FIFO");
    TEST_CHECK(m.f == NULL);
    unlink(fifo);
    rmdir(dir);
    zr_error_clear();
}

/* ---- strictness: duplicates, null, NUL, unknown keys, exact integers ----------------------- */

static void test_strict_files(void)
{
    zr_train_config c;
    notes n;
    /* a key or a section twice: one would be kept silently */
    TEST_FAILS(parse(&c, "{\"zero_optimization\": {\"stage\": 1, \"stage\": 2}}", NULL),
               ZR_ERR_INVALID, "key \"zero_optimization.stage\" appears twice");
    TEST_FAILS(parse(&c,
                     "{\"zero_optimization\": {\"stage\": 1}, \"bf16\": {\"enabled\": true}, "
                     "\"zero_optimization\": {\"overlap_comm\": false}}",
                     NULL),
               ZR_ERR_INVALID, "key \"zero_optimization\" appears twice");
    /* one key under two names (DeepSpeed's and its stage3_ name) */
    TEST_FAILS(parse(&c,
                     "{\"zero_optimization\": {\"max_live_parameters\": 1, "
                     "\"stage3_max_live_parameters\": 2}}",
                     NULL),
               ZR_ERR_INVALID, "set the same key; give it once");
    /* null where a value is required: refused, naming what it must be */
    TEST_FAILS(parse(&c, "{\"zero_optimization\": {\"stage\": null}}", NULL), ZR_ERR_INVALID,
               "\"zero_optimization.stage\" is null; it must be an integer in [0, 3]");
    TEST_FAILS(parse(&c, "{\"communication_data_type\": null}", NULL), ZR_ERR_INVALID, "is null");
    TEST_FAILS(parse(&c, "{\"zero_optimization\": null}", NULL), ZR_ERR_INVALID,
               "must be an object (a section of keys), got null");
    /* a NUL would cut a path short: refused with its place */
    TEST_FAILS(parse(&c, "{\"zr\": {\"data\": {\"path\": \"corpus.txt\\u0000.bak\"}}}", NULL),
               ZR_ERR_INVALID, "cfg.json:1:37: \"zr.data.path\": a string holds \\u0000");
    TEST_FAILS(parse(&c, "{\"zr\\u0000\": 1}", NULL), ZR_ERR_INVALID, "\\u0000");
    /* DeepSpeed keys without effect still take anything, null included */
    memset(&n, 0, sizeof n);
    TEST_OK(parse(&c, "{\"zero_optimization\": {\"offload_param\": null}}", &n));
    TEST_EQ_INT(n.notes, 1);
    /* notes and warnings carry no "warning:" of their own (the program adds it once) */
    memset(&n, 0, sizeof n);
    TEST_OK(parse(&c, "{\"zzz\": 1, \"wall_clock_breakdown\": true}", &n));
    TEST_CHECKF(strncmp(n.last_warning, "warning", 7) != 0 && strstr(n.last_warning, "zzz"), "%s",
                n.last_warning);
    TEST_CHECKF(strncmp(n.last_note, "note: ", 6) == 0, "%s", n.last_note);
    /* 100,000 unknown top-level keys: ten named, then one line with the rest */
    enum { MANY = 100000 };
    size_t cap = (size_t)MANY * 16 + 16, used = 0;
    char *text = malloc(cap);
    TEST_CHECK(text != NULL);
    if (text != NULL) {
        used += (size_t)snprintf(text + used, cap - used, "{");
        for (int i = 0; i < MANY; i++) {
            used += (size_t)snprintf(text + used, cap - used, "%s\"k%d\": %d", i ? "," : "", i, i);
        }
        snprintf(text + used, cap - used, "}");
        memset(&n, 0, sizeof n);
        double t0 = zr_now();
        TEST_OK(parse(&c, text, &n));
        TEST_EQ_INT(n.warnings, 11);
        TEST_CHECKF(strstr(n.last_warning, "99990 more unknown top-level keys") != NULL, "%s",
                    n.last_warning);
        printf("  100000 unknown top-level keys: %d warnings, read in %.2f s\n", n.warnings,
               zr_now() - t0);
        free(text);
    }
    zr_error_clear();
}

static void test_exact_integers(void)
{
    zr_train_config c;
    /* 2^53 + 1 is read exactly, as a flag and from a file (a double rounds it to 2^53) */
    char *a1[] = {"--seed", "9007199254740993"};
    TEST_OK(flags(&c, 2, a1));
    TEST_CHECK(c.seed == 9007199254740993ull);
    TEST_OK(parse(&c, "{\"zr\": {\"train\": {\"seed\": 9007199254740993}}}", NULL));
    TEST_CHECK(c.seed == 9007199254740993ull);
    /* the whole 64-bit range of the seed, and not one more */
    char *a2[] = {"--seed", "18446744073709551615"};
    TEST_OK(flags(&c, 2, a2));
    TEST_CHECK(c.seed == 18446744073709551615ull);
    char *a3[] = {"--seed", "18446744073709551616"};
    TEST_FAILS(flags(&c, 2, a3), ZR_ERR_INVALID,
               "must be an integer in [0, 18446744073709551615], got 18446744073709551616");
    char *a4[] = {"--seed", "9223372036854775807"};
    TEST_OK(flags(&c, 2, a4));
    TEST_CHECK(c.seed == 9223372036854775807ull);
    /* refusals state the real range and the value as written */
    char *a5[] = {"--steps", "2147483648"};
    TEST_FAILS(flags(&c, 2, a5), ZR_ERR_INVALID,
               "must be an integer in [0, 2147483647], got 2147483648");
    TEST_FAILS(parse(&c, "{\"train_batch_size\": 2147483648}", NULL), ZR_ERR_INVALID,
               "\"train_batch_size\" must be an integer in [0, 2147483647], got 2147483648");
    /* exponents are fine where exact; not beyond 2^53 */
    char *a6[] = {"--steps", "1e3"};
    TEST_OK(flags(&c, 2, a6));
    TEST_EQ_INT(c.train_steps, 1000);
    char *a7[] = {"--seed", "1e19"};
    TEST_FAILS(flags(&c, 2, a7), ZR_ERR_INVALID, "not exactly such an integer");
    TEST_FAILS(parse(&c, "{\"zr\": {\"train\": {\"seed\": 1.5}}}", NULL), ZR_ERR_INVALID,
               "got 1.5");
    /* the dump (manifests, --write-config) keeps every digit, and reads back */
    char *a8[] = {"--seed", "18446744073709551557"};
    TEST_OK(flags(&c, 2, a8));
    char *text = NULL;
    TEST_OK(zr_config_to_json(&c, &text));
    TEST_CHECKF(text != NULL && strstr(text, "18446744073709551557") != NULL, "%s",
                text ? text : "");
    zr_train_config back;
    if (text != NULL) {
        TEST_OK(parse(&back, text, NULL));
        TEST_CHECK(back.seed == 18446744073709551557ull);
    }
    zr_free(text);
    /* --help states each integer key's real range */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    zr_config_print_help(f);
    fclose(f);
    TEST_CHECK(buf != NULL && strstr(buf, "an integer in [0, 18446744073709551615]") != NULL);
    TEST_CHECK(buf != NULL && strstr(buf, "an integer in [1, 2147483647]") != NULL);
    TEST_CHECK(buf != NULL && strstr(buf, ">= 1;") == NULL);
    free(buf);
    zr_error_clear();
}

static void test_flag_spellings(void)
{
    zr_train_config c;
    /* --no-hpz like --no-qwz and --no-qgz: hpZ off (partition size 1) */
    char *a1[] = {"--no-hpz", "--no-qwz", "--no-qgz"};
    TEST_OK(flags(&c, 3, a1));
    TEST_EQ_INT(c.zero_hpz_partition_size, 1);
    TEST_EQ_INT(c.zero_quantized_weights, 0);
    TEST_EQ_INT(c.zero_quantized_gradients, 0);
    TEST_OK(zr_config_finalize(&c, 4));
    char *a2[] = {"--no-hpz=2"};
    TEST_FAILS(flags(&c, 1, a2), ZR_ERR_INVALID, "flag --no-hpz takes no value");
    /* --steps 0: allowed (the initial weights are the checkpoint) */
    char *a3[] = {"--steps", "0"};
    TEST_OK(flags(&c, 2, a3));
    TEST_OK(zr_config_finalize(&c, 2));
    TEST_EQ_INT(c.train_steps, 0);
    /* one configuration file */
    char path[64];
    write_temp(path, sizeof path, "{}");
    char *a4[] = {"--config", path, "--config", path};
    TEST_FAILS(flags(&c, 4, a4), ZR_ERR_INVALID, "--config is given twice");
    TEST_OK(flags(&c, 2, a4));
    TEST_CHECK(strcmp(c.config_path, path) == 0);
    unlink(path);
    zr_error_clear();
}

/* ---- the resume table ---------------------------------------------------------------------- */

/*
 * Every key of the table against a checkpoint's saved configuration: a value
 * that differs is listed by zr_config_compare with both values and the key's
 * policy, except the LOCAL keys, which are not compared. The policies are the
 * table's; the sets below pin them, so that moving a key from one to another
 * is a decision a test sees.
 */
static void test_resume_table(void)
{
    static const char *const cands[] = {"7",      "3",       "2",     "1",    "0",
                                        "64",     "8",       "4",     "true", "false",
                                        "0.5",    "0.25",    "fp32",  "Adam", "WarmupLR",
                                        "linear", "0.8,0.9", "x.txt", "cpu",  "123456789012345",
                                        "staged"};
    static const struct {
        const char *key;
        zr_config_policy p;
    } pinned[] = {
        {"zr.train.seed", ZR_RESUME_MATCH},
        {"zr.model.init", ZR_RESUME_MATCH},
        {"zr.model.layers", ZR_RESUME_MODEL},
        {"zr.model.heads", ZR_RESUME_MODEL},
        {"zr.model.channels", ZR_RESUME_MODEL},
        {"zr.model.max_seq_len", ZR_RESUME_MODEL},
        {"zr.model.vocab_size", ZR_RESUME_MODEL},
        {"zr.data.path", ZR_RESUME_DATA},
        {"zr.checkpoint.resume", ZR_RESUME_LOCAL},
        {"zr.checkpoint.resume_from", ZR_RESUME_LOCAL},
        {"zr.checkpoint.resume_new_data", ZR_RESUME_LOCAL},
    };
    static zr_train_config base, c;
    zr_config_defaults(&base);
    char *saved = NULL;
    TEST_OK(zr_config_to_json(&base, &saved));
    size_t nk = zr_config_key_count();
    zr_config_change *out = calloc(nk, sizeof *out);
    TEST_CHECK(out != NULL && saved != NULL);
    int keys = 0, listed = 0, local = 0;
    for (size_t i = 0; out != NULL && saved != NULL && i < nk; i++) {
        char was[300], now[300], flag[200];
        const char *path = zr_config_key_value(&base, i, was, sizeof was);
        if (path == NULL) {
            continue;
        }
        keys++;
        snprintf(flag, sizeof flag, "--%s", path);
        int found = 0;
        for (size_t j = 0; j < sizeof cands / sizeof cands[0] && !found; j++) {
            char *argv[] = {flag, (char *)cands[j]};
            found = flags(&c, 2, argv) == ZR_OK &&
                    strcmp(zr_config_key_value(&c, i, now, sizeof now) ? now : "", was) != 0;
        }
        zr_error_clear();
        TEST_CHECKF(found, "%s: no other value to try", path);
        if (!found) {
            continue;
        }
        int n = -1;
        TEST_OK(zr_config_compare(&c, saved, out, &n));
        zr_config_policy p = zr_config_key_policy(path);
        for (size_t k = 0; k < sizeof pinned / sizeof pinned[0]; k++) {
            if (strcmp(pinned[k].key, path) == 0) {
                TEST_CHECKF(p == pinned[k].p, "%s: policy %d, pinned %d", path, p, pinned[k].p);
            }
        }
        if (p == ZR_RESUME_LOCAL) {
            local++;
            TEST_CHECKF(n == 0, "%s: a LOCAL key was compared (%d differences)", path, n);
            continue;
        }
        listed++;
        TEST_CHECKF(n == 1 && strcmp(out[0].key, path) == 0 && out[0].policy == p &&
                        strcmp(out[0].was, was) == 0 && strcmp(out[0].now, now) == 0,
                    "%s %s -> %s: %d differences (%s: %s -> %s)", path, was, now, n,
                    n > 0 ? out[0].key : "-", n > 0 ? out[0].was : "", n > 0 ? out[0].now : "");
    }
    /* a key the checkpoint does not record (an older zr, an edited manifest) is listed as not
       recorded, never taken as unchanged; unknown keys are ignored */
    c = base;
    c.lr = 0.5;
    int n = -1;
    TEST_OK(
        zr_config_compare(&c, "{\"zr\": {\"train\": {\"seed\": 1337}}, \"future\": 1}", out, &n));
    TEST_EQ_INT(n, listed - 1);
    int lr_seen = 0, seed_seen = 0;
    for (int i = 0; i < n; i++) {
        TEST_CHECKF(!out[i].recorded && out[i].was[0] == '\0', "%s: recorded %d, was %s",
                    out[i].key, out[i].recorded, out[i].was);
        lr_seen += strcmp(out[i].key, "optimizer.params.lr") == 0 && strcmp(out[i].now, "0.5") == 0;
        seed_seen += strcmp(out[i].key, "zr.train.seed") == 0;
    }
    TEST_CHECK(lr_seen == 1 && seed_seen == 0);
    /* no configuration at all: every compared key, none LOCAL */
    TEST_OK(zr_config_compare(&c, NULL, out, &n));
    TEST_EQ_INT(n, listed);
    for (int i = 0; i < n; i++) {
        TEST_CHECKF(!out[i].recorded && out[i].policy != ZR_RESUME_LOCAL, "%s", out[i].key);
    }
    /* a value this zr does not take is not a record of the key */
    TEST_OK(zr_config_compare(&base, "{\"optimizer\": {\"type\": \"Bogus\"}}", out, &n));
    int type_seen = 0;
    for (int i = 0; i < n; i++) {
        type_seen += strcmp(out[i].key, "optimizer.type") == 0 && !out[i].recorded;
    }
    TEST_EQ_INT(type_seen, 1);
    /* the whole configuration as saved: nothing listed */
    TEST_OK(zr_config_compare(&base, saved, out, &n));
    TEST_EQ_INT(n, 0);
    /* the seed compared exactly beyond 2^53 */
    c = base;
    c.seed = 18446744073709551557ull;
    TEST_OK(zr_config_compare(&c, saved, out, &n));
    TEST_EQ_INT(n, 1);
    c = base;
    c.seed = 18446744073709551557ull;
    static zr_train_config s2;
    s2 = base;
    s2.seed = 18446744073709551556ull;
    char *saved2 = NULL;
    TEST_OK(zr_config_to_json(&s2, &saved2));
    TEST_OK(zr_config_compare(&c, saved2, out, &n));
    zr_free(saved2);
    TEST_CHECKF(n == 1 && strcmp(out[0].was, "18446744073709551556") == 0 &&
                    strcmp(out[0].now, "18446744073709551557") == 0 &&
                    out[0].policy == ZR_RESUME_MATCH,
                "%d %s %s", n, n ? out[0].was : "", n ? out[0].now : "");
    printf("  %d keys: %d compared on resume, %d local to the launch\n", keys, listed, local);
    free(out);
    zr_free(saved);
    zr_error_clear();
}

/* The grace period a launcher gives a stop, where zr can see it (zr_launch_grace_s). */
static void test_grace_period(void)
{
    char how[128];
    char *given[] = {"OMPI_COMM_WORLD_SIZE=2", "OMPI_MCA_odls_base_sigkill_timeout=30", NULL};
    TEST_NEAR(zr_launch_grace_s(given, how, sizeof how), 30, 0);
    TEST_CHECKF(strstr(how, "odls_base_sigkill_timeout") != NULL, "%s", how);
    /* mpirun without the parameter: Open MPI's default (or a parameter file's) */
    char *plain[] = {"OMPI_COMM_WORLD_SIZE=2", "OMPI_MCA_orte_hnp_uri=1.0;tcp://x", NULL};
    TEST_CHECK(zr_launch_grace_s(plain, how, sizeof how) >= 1);
    /* MPICH waits for the ranks; srun's KillWait is not visible: unknown */
    char *mpich[] = {"PMI_RANK=0", "PMI_SIZE=2", NULL};
    TEST_NEAR(zr_launch_grace_s(mpich, how, sizeof how), -1, 0);
    char *srun[] = {"OMPI_COMM_WORLD_SIZE=2", "SLURM_STEP_ID=0", NULL};
    TEST_NEAR(zr_launch_grace_s(srun, how, sizeof how), -1, 0);
    TEST_NEAR(zr_launch_grace_s(NULL, how, sizeof how), -1, 0);
}

int main(void)
{
    TEST_RUN(test_defaults);
    TEST_RUN(test_full_json);
    TEST_RUN(test_load_file_and_flags);
    TEST_RUN(test_bad_input);
    TEST_RUN(test_warnings_and_notes);
    TEST_RUN(test_derivations);
    TEST_RUN(test_model_shape);
    TEST_RUN(test_print_json_help);
    TEST_RUN(test_integer_extremes);
    TEST_RUN(test_boolean_flags);
    TEST_RUN(test_progress_decision);
    TEST_RUN(test_activation_checkpointing);
    TEST_RUN(test_metrics);
    TEST_RUN(test_metrics_writer);
    TEST_RUN(test_not_regular_files);
    TEST_RUN(test_strict_files);
    TEST_RUN(test_exact_integers);
    TEST_RUN(test_flag_spellings);
    TEST_RUN(test_resume_table);
    TEST_RUN(test_grace_period);
    return zr_test_finish();
}
