/*
 * config_check.c - what holds between keys, checked once everything is read
 * (zr_config_finalize): batch sizes, ZeRO++ switches against the stage, the
 * scheduler, paths; and adopting the shape of a zr.model.init file.
 */
#define _POSIX_C_SOURCE 200809L

#include "config_impl.h"

#include "zr/model.h"

#include <stdio.h>
#include <string.h>

/* ---- cross-field checks ------------------------------------------------- */

/* Re-check every field against the table: a program may have set it directly. */
static zr_status check_fields(const zr_train_config *c)
{
    for (size_t i = 0; i < zr_config_nkeys; i++) {
        const cfg_key *k = &zr_config_keys[i];
        if (!zr_config_listed(k)) {
            continue;
        }
        char expect[200], got[300];
        zr_config_describe_expect(k, expect, sizeof expect);
        zr_config_fmt_value(c, k, got, sizeof got);
        int ok = 1;
        switch (k->type) {
        case K_BOOL: {
            int b = *(const int *)zr_config_cfield(c, k->off);
            ok = b == 0 || b == 1;
            break;
        }
        case K_STR: {
            const char *s = zr_config_cfield(c, k->off);
            ok = memchr(s, '\0', k->size) != NULL;
            break;
        }
        case K_ENUM: {
            const char *s = zr_config_cfield(c, k->off);
            char canon[64];
            ok = memchr(s, '\0', k->size) != NULL &&
                 zr_config_match_choice(k->choices, s, canon, sizeof canon) != NULL &&
                 strcmp(s, canon) == 0;
            break;
        }
        case K_PAIR:
            ok = zr_config_num_ok(k, zr_config_get_num(c, k, k->off)) &&
                 zr_config_num_ok(k, zr_config_get_num(c, k, k->off2));
            break;
        default:
            ok = zr_config_num_ok(k, zr_config_get_num(c, k, k->off));
            break;
        }
        if (!ok) {
            ZR_FAIL(ZR_ERR_INVALID, "\"%s\" must be %s, got %s", k->path, expect, got);
        }
    }
    return ZR_OK;
}

/*
 * train_batch_size = micro * accumulation * world. Keys the user gave are
 * fixed; the rest are derived where the given ones determine them and keep
 * their defaults otherwise (DeepSpeed's rules: with only train_batch_size
 * given, accumulation stays at its default and micro is derived).
 */
static zr_status batch_sizes(zr_train_config *c, int world)
{
    long long tb = c->train_batch_size, mb = c->train_micro_batch_size_per_gpu,
              ga = c->gradient_accumulation_steps, w = world;
    int g_tb = tb > 0;
    int g_mb = (c->given & ZR_GIVEN_MICRO_BATCH) && mb > 0;
    int g_ga = (c->given & ZR_GIVEN_GRAD_ACCUM) && ga > 0;
    if (g_tb && g_mb && g_ga) {
        if (tb != mb * ga * w) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "inconsistent batch sizes: train_batch_size (%lld) must equal "
                    "train_micro_batch_size_per_gpu (%lld) * gradient_accumulation_steps (%lld) "
                    "* world size (%lld) = %lld",
                    tb, mb, ga, w, mb * ga * w);
        }
    } else if (g_tb && g_mb) {
        if (tb % (mb * w) != 0) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "inconsistent batch sizes: train_batch_size (%lld) is not a multiple of "
                    "train_micro_batch_size_per_gpu (%lld) * world size (%lld) = %lld, so "
                    "gradient_accumulation_steps cannot be derived",
                    tb, mb, w, mb * w);
        }
        ga = tb / (mb * w);
    } else if (g_tb) {
        if (ga <= 0) {
            ga = 1;
        }
        if (tb % (ga * w) != 0) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "inconsistent batch sizes: train_batch_size (%lld) is not a multiple of "
                    "gradient_accumulation_steps (%lld) * world size (%lld) = %lld, so "
                    "train_micro_batch_size_per_gpu cannot be derived",
                    tb, ga, w, ga * w);
        }
        mb = tb / (ga * w);
    } else {
        if (mb <= 0) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "train_micro_batch_size_per_gpu is 0 (derived) but train_batch_size is not "
                    "given; set one of them");
        }
        if (ga <= 0) {
            ga = 1;
        }
        tb = mb * ga * w;
    }
    /* a derived size obeys the bound of its own key, or train_batch_size INT_MAX would ask
       for two billion sequences per rank and fail (or swap) only when allocated */
    double mb_max = zr_config_find_key("train_micro_batch_size_per_gpu")->hi;
    double ga_max = zr_config_find_key("gradient_accumulation_steps")->hi;
    if ((double)mb > mb_max || (double)ga > ga_max) {
        ZR_FAIL(ZR_ERR_INVALID,
                "train_batch_size (%lld) at %lld rank%s gives train_micro_batch_size_per_gpu %lld "
                "and gradient_accumulation_steps %lld, but each may be at most %.0f: lower "
                "train_batch_size or give the other two",
                tb, w, w == 1 ? "" : "s", mb, ga, mb_max > ga_max ? mb_max : ga_max);
    }
    if (tb > INT_MAX || mb > INT_MAX || ga > INT_MAX) {
        ZR_FAIL(ZR_ERR_INVALID, "train_batch_size = %lld * %lld * %lld ranks is too large", mb, ga,
                w);
    }
    c->train_batch_size = (int)tb;
    c->train_micro_batch_size_per_gpu = (int)mb;
    c->gradient_accumulation_steps = (int)ga;
    return ZR_OK;
}

/*
 * ZeRO++ switches and the stage they need. Their defaults are on (the demo),
 * so a default below the stage quietly turns off; an explicit request is an
 * error, since the user asked for something that cannot happen.
 */
static zr_status zeropp_stages(zr_train_config *c, int world)
{
    if (c->stage < 3 && c->zero_quantized_weights) {
        if (c->given & ZR_GIVEN_QWZ) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "zero_optimization.zero_quantized_weights (qwZ) needs "
                    "zero_optimization.stage 3, got stage %d; set it to false or use stage 3",
                    c->stage);
        }
        c->zero_quantized_weights = 0;
    }
    if (c->stage < 3 && c->zero_hpz_partition_size != 1) {
        if ((c->given & ZR_GIVEN_HPZ) && c->zero_hpz_partition_size > 1) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "zero_optimization.zero_hpz_partition_size %d (hpZ) needs "
                    "zero_optimization.stage 3, got stage %d; use 1 to turn hpZ off",
                    c->zero_hpz_partition_size, c->stage);
        }
        c->zero_hpz_partition_size = 1;
    }
    if (c->stage < 2 && c->zero_quantized_gradients) {
        if (c->given & ZR_GIVEN_QGZ) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "zero_optimization.zero_quantized_gradients (qgZ) needs "
                    "zero_optimization.stage 2 or 3, got stage %d; set it to false or use stage "
                    ">= 2",
                    c->stage);
        }
        c->zero_quantized_gradients = 0;
    }
    int h = c->zero_hpz_partition_size;
    if (h > 1 && (h > world || world % h != 0)) {
        ZR_FAIL(ZR_ERR_INVALID,
                "zero_optimization.zero_hpz_partition_size (%d) must divide the world size (%d): "
                "use a divisor of the world size, usually the ranks per node "
                "(0 = ranks per node, 1 = hpZ off)",
                h, world);
    }
    return ZR_OK;
}

static zr_status scheduler(zr_train_config *c)
{
    if (c->warmup_max_lr == 0) {
        c->warmup_max_lr = c->lr;
    }
    int decays = strcmp(c->scheduler_type, "WarmupDecayLR") == 0 ||
                 strcmp(c->scheduler_type, "WarmupCosineLR") == 0;
    if (c->total_num_steps == 0) {
        /* derived: a warm-up longer than the run simply never ends, as in DeepSpeed */
        c->total_num_steps = c->train_steps;
    } else if (decays && c->total_num_steps < c->warmup_num_steps) {
        ZR_FAIL(ZR_ERR_INVALID,
                "scheduler.params.total_num_steps (%d) must be at least "
                "scheduler.params.warmup_num_steps (%d) for %s",
                c->total_num_steps, c->warmup_num_steps, c->scheduler_type);
    }
    return ZR_OK;
}

zr_status zr_config_finalize(zr_train_config *c, int world)
{
    if (world < 1) {
        ZR_FAIL(ZR_ERR_INVALID, "world size must be >= 1, got %d", world);
    }
    ZR_CHECK(check_fields(c));
    ZR_CHECK(batch_sizes(c, world));
    ZR_CHECK(zeropp_stages(c, world));
    if (c->channels % c->heads != 0) {
        ZR_FAIL(ZR_ERR_INVALID, "zr.model.channels (%d) must be a multiple of zr.model.heads (%d)",
                c->channels, c->heads);
    }
    /* with zr.model.init and no explicit max_seq_len the file decides (zr_config_adopt_model) */
    int own_max = c->init_path[0] == '\0' || (c->given & ZR_GIVEN_MAX_SEQ_LEN);
    if (own_max && c->seq_len > c->max_seq_len) {
        ZR_FAIL(ZR_ERR_INVALID,
                "zr.model.seq_len (%d) must be at most zr.model.max_seq_len (%d), the positions "
                "the model has; raise zr.model.max_seq_len or train on shorter sequences",
                c->seq_len, c->max_seq_len);
    }
    if (c->communication_data_type[0] == '\0') {
        snprintf(c->communication_data_type, sizeof c->communication_data_type, "%s",
                 c->bf16_enabled ? "bf16" : "fp32");
    }
    ZR_CHECK(scheduler(c));
    if (c->resume && c->checkpoint_dir[0] == '\0') {
        ZR_FAIL(ZR_ERR_INVALID,
                "zr.checkpoint.resume needs zr.checkpoint.dir (--ckpt-dir) to resume from");
    }
    if (c->metrics_path[0] == '\0' && c->checkpoint_dir[0] != '\0') {
        int n = snprintf(c->metrics_path, sizeof c->metrics_path, "%s/metrics.jsonl",
                         c->checkpoint_dir);
        if (n < 0 || (size_t)n >= sizeof c->metrics_path) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "zr.checkpoint.dir \"%s\" is too long to hold metrics.jsonl (at most %zu "
                    "characters); set zr.train.metrics_path",
                    c->checkpoint_dir, sizeof c->metrics_path - 1);
        }
    }
    return ZR_OK;
}

/* One shape key against the file: a value given explicitly must be the file's. */
static zr_status adopt_int(int *field, int given, int file_value, const char *key, const char *what,
                           const char *path)
{
    if (given && *field != file_value) {
        ZR_FAIL(ZR_ERR_INVALID,
                "%s is %d, but the model file %s (zr.model.init) has %d %s; leave %s out to "
                "take the file's value, or start from a file of that shape",
                key, *field, path, file_value, what, key);
    }
    *field = file_value;
    return ZR_OK;
}

zr_status zr_config_adopt_model(zr_train_config *c, const struct zr_gpt_config *file,
                                const char *path)
{
    ZR_CHECK(adopt_int(&c->layers, (c->given & ZR_GIVEN_LAYERS) != 0, file->layers,
                       "zr.model.layers", "layers", path));
    ZR_CHECK(adopt_int(&c->heads, (c->given & ZR_GIVEN_HEADS) != 0, file->heads, "zr.model.heads",
                       "heads", path));
    ZR_CHECK(adopt_int(&c->channels, (c->given & ZR_GIVEN_CHANNELS) != 0, file->channels,
                       "zr.model.channels", "channels", path));
    ZR_CHECK(adopt_int(&c->max_seq_len, (c->given & ZR_GIVEN_MAX_SEQ_LEN) != 0, file->max_t,
                       "zr.model.max_seq_len", "positions", path));
    ZR_CHECK(adopt_int(&c->vocab_size, c->vocab_size != 0, file->vocab, "zr.model.vocab_size",
                       "tokens in its vocabulary", path));
    if (c->seq_len > c->max_seq_len) {
        ZR_FAIL(ZR_ERR_INVALID,
                "zr.model.seq_len (%d) must be at most the %d positions of the model file %s "
                "(zr.model.init)",
                c->seq_len, c->max_seq_len, path);
    }
    return ZR_OK;
}
