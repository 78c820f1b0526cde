/*
 * plan.c - "zr probe", "zr plan" and the --auto of "zr train": arguments in,
 * tables and files out. The measurements, the cost model and the ranking are
 * the library's (src/plan).
 *
 *   mpirun -np N zr probe [train keys] [-o probe.json] [--max-micro-batch B]
 *   zr plan [train keys] --probe probe.json [--memory-limit GB] [--top K]
 *           [--json] [--write-config FILE]
 *   mpirun -np N zr train --auto [train keys]      probe + plan + train the winner
 */
#define _POSIX_C_SOURCE 200809L

#include "cli.h"

#include "zr/file.h"
#include "zr/launch.h"
#include "zr/plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { EXIT_OK = 0, EXIT_RUNTIME = 1, EXIT_INPUT = 2 };

static void warn_rank0(void *ctx, const char *msg)
{
    if (ctx == NULL || *(int *)ctx == 0) {
        fprintf(stderr, "zr: %s%s\n", strncmp(msg, "note: ", 6) == 0 ? "" : "warning: ", msg);
    }
}

/*
 * The data the run will read, loaded as zr train loads it, and its vocabulary
 * (zr.model.vocab_size, or the data's). The probe keeps it loaded while it
 * measures what a rank holds besides the model: a training rank holds it too.
 */
static zr_status load_data(const zr_train_config *c, zr_dataset *d, int *vocab)
{
    memset(d, 0, sizeof *d);
    zr_status st = c->data_path[0] == '\0' ? zr_dataset_load_fortunes(d, ZR_FORTUNES_DIR)
                                           : zr_dataset_load(d, c->data_path, c->vocab_size);
    if (st == ZR_OK && c->data_path[0] == '\0') {
        st = zr_dataset_set_vocab(d, "the bundled corpus", c->vocab_size);
    }
    *vocab = d->vocab;
    return st;
}

/* The model's shape taken from zr.model.init where it is a Hugging Face folder, then the
   vocabulary of the data. */
static zr_status vocab_of(zr_train_config *c, int *vocab)
{
    ZR_CHECK(zr_plan_adopt_model(c));
    zr_dataset d;
    zr_status st = load_data(c, &d, vocab);
    zr_dataset_free(&d);
    return st;
}

/* argv[i], the last argument, is one of names, a flag that takes a value: said so (not "unknown").
 */
static zr_status value_missing(int argc, char **argv, int i, const char *const *names, int n)
{
    for (int k = 0; k < n && i + 1 == argc; k++) {
        if (strcmp(argv[i], names[k]) == 0) {
            ZR_FAIL(ZR_ERR_INVALID, "%s needs a value", names[k]);
        }
    }
    return ZR_OK;
}

/* Does argv[i] hold --name (with its value in argv[i+1] when want_value)? */
static int flag(int argc, char **argv, int i, const char *name, int want_value)
{
    return strcmp(argv[i], name) == 0 && (!want_value || i + 1 < argc);
}

/*
 * out (what: the flag naming it) obeys the output rule (zr/file.h): it is none
 * of the files the command reads (the probe, the configuration, the data,
 * the model file), no link, no device.
 */
static zr_status check_output(const char *out, const char *what, const zr_train_config *c,
                              const char *probe, int *exists)
{
    zr_file_inputs in;
    zr_file_inputs_init(&in);
    zr_status st;
    ZR_CHECK_GOTO(zr_file_inputs_add(&in, probe, "the probe file (--probe)"), st, done);
    ZR_CHECK_GOTO(zr_file_inputs_add(&in, c->config_path, "the configuration file (--config)"), st,
                  done);
    ZR_CHECK_GOTO(zr_file_inputs_add(&in, c->data_path, "the training data (zr.data.path)"), st,
                  done);
    ZR_CHECK_GOTO(zr_file_inputs_add(&in, c->init_path, "the model file (zr.model.init)"), st,
                  done);
    st = zr_file_output_check(out, what, &in, exists);
done:
    zr_file_inputs_free(&in);
    return st;
}

static int fail_msg(const char *cmd, zr_status st)
{
    fprintf(stderr, "zr %s: error: %s\n", cmd, zr_error_message());
    return st == ZR_ERR_INVALID || st == ZR_ERR_FORMAT ? EXIT_INPUT : EXIT_RUNTIME;
}

/* ---- zr probe ------------------------------------------------------------------ */

/*
 * zr probe's own flags into out and max_b, the rest (train keys) into rest[*n].
 * A bad value is reported after MPI_Init, by rank 0 only.
 */
static zr_status probe_args(int argc, char **argv, char **rest, int *n, const char **out,
                            int *max_b)
{
    static const char *const valued[] = {"-o", "--output", "--max-micro-batch"};
    zr_status st = ZR_OK;
    for (int i = 0; i < argc; i++) {
        st = st == ZR_OK ? value_missing(argc, argv, i, valued, 3) : st;
        if (flag(argc, argv, i, "-o", 1) || flag(argc, argv, i, "--output", 1)) {
            *out = argv[++i];
        } else if (flag(argc, argv, i, "--max-micro-batch", 1)) {
            double v = 0;
            if (st == ZR_OK) {
                st = zr_cli_number("--max-micro-batch", argv[i + 1], 1, ZR_PROBE_MAX_MICRO, 1, &v);
            }
            *max_b = (int)v, i++;
        } else {
            rest[(*n)++] = argv[i];
        }
    }
    return st;
}

/* Measure on c and write the probe (rank 0); every rank returns the agreed status. */
static zr_status probe_measure(zr_comm *c, const zr_train_config *cfg, int vocab, int max_b,
                               const char *out, int replaces, int rank)
{
    zr_probe p;
    int b = max_b > 0 ? max_b : cfg->train_micro_batch_size_per_gpu;
    double t0 = zr_now();
    zr_status st = zr_probe_run(c, cfg, vocab, b, &p);
    if (st == ZR_OK && rank == 0) {
        st = zr_probe_write(out, &p);
        if (st == ZR_OK) {
            printf("zr probe: %d nodes x %d ranks on %s, %.1f s: block fwd %.2f bwd %.2f ms at "
                   "micro-batch %d; inter-node %.1f MB/s per rank (%.1f at a quarter the "
                   "message; latency %.0f us), intra-node %.1f MB/s (%.1f; %.0f us), overlap "
                   "%.2f; wrote %s%s\n",
                   p.nodes, p.ranks_per_node,
                   !p.gpu   ? "the CPU"
                   : p.bf16 ? "GPUs (bf16 compute)"
                            : "GPUs (fp32 compute)",
                   zr_now() - t0, 1e3 * p.compute[0].fwd_block, 1e3 * p.compute[0].bwd_block,
                   p.compute[0].batch, p.inter_bw / 1e6, p.inter_bw_small / 1e6, 1e6 * p.inter_lat,
                   p.intra_bw / 1e6, p.intra_bw_small / 1e6, 1e6 * p.intra_lat, p.overlap, out,
                   replaces ? " (it replaced the file that was there)" : "");
            if (p.cal_batch > 0) {
                printf(
                    "zr probe: reference steps at micro-batch %d: ZeRO-3 %.1f ms, ZeRO-3 + qwZ + "
                    "qgZ %.1f ms, stage 0 %s%.1f ms\n",
                    p.cal_batch, 1e3 * p.cal_step[0], 1e3 * p.cal_step[1],
                    p.cal_step[2] > 0 ? "" : "(did not fit) ", 1e3 * p.cal_step[2]);
            }
        }
    }
    return zr_comm_agree(c, st);
}

int zr_cli_probe(int argc, char **argv)
{
    const char *out = "probe.json";
    int max_b = 0, n = 0;
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (rest == NULL) {
        return EXIT_RUNTIME;
    }
    zr_status arg_st = probe_args(argc, argv, rest, &n, &out, &max_b);
    MPI_Init(&argc, &argv);
    int rank, help = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    static zr_train_config cfg;
    zr_status st = arg_st;
    if (st == ZR_OK) {
        st = zr_launch_read_config(MPI_COMM_WORLD, n, rest, &cfg, &help, warn_rank0, &rank);
    }
    if (st == ZR_OK && !help) {
        st = zr_plan_adopt_model(&cfg); /* a Hugging Face folder's shape (zr.model.init) */
    }
    if (st == ZR_OK && help) {
        if (rank == 0) {
            printf("usage: mpirun -np N zr probe [zr train keys: model shape, micro-batch, "
                   "threads, data] [-o probe.json] [--max-micro-batch B]\n"
                   "Measures compute (the model's own units at micro-batch 1, 2, 4, ... up to B, "
                   "default the configuration's micro-batch), codecs, AdamW, and bandwidth and "
                   "latency inside and between nodes, with every rank busy, and a few steps of "
                   "ZeRO-3, ZeRO-3 + qwZ + qgZ and stage 0 through the engine (on the CPU or "
                   "the GPUs, as zr.device says), which zr plan calibrates on; writes JSON for "
                   "zr plan.\n");
        }
        MPI_Finalize();
        free(rest);
        return EXIT_OK;
    }
    int vocab = 0;
    zr_dataset data;
    memset(&data, 0, sizeof data);
    int replaces = 0;
    if (st == ZR_OK) {
        st = check_output(out, "zr probe -o", &cfg, NULL, &replaces);
    }
    if (st == ZR_OK) {
        st = load_data(&cfg, &data, &vocab);
    }
    zr_comm c;
    int up = 0;
    if (st == ZR_OK) {
        zr_comm_config cc = {0, 1};
        st = zr_comm_init(&c, MPI_COMM_WORLD, &cc);
        up = st == ZR_OK;
    }
    if (st == ZR_OK) {
        st = probe_measure(&c, &cfg, vocab, max_b, out, replaces, rank);
    }
    int code = st == ZR_OK ? EXIT_OK : EXIT_RUNTIME;
    if (st != ZR_OK) {
        code = rank == 0 ? fail_msg("probe", st) : (st == ZR_ERR_INVALID ? EXIT_INPUT : code);
    }
    if (up) {
        zr_comm_free(&c);
    }
    zr_dataset_free(&data);
    MPI_Finalize();
    free(rest);
    return code;
}

/* ---- zr plan ------------------------------------------------------------------- */

/* The calibration in one line (line), and a warning where the probe's transfers look far off. */
static void print_calibration(const zr_plan_result *r, int line, int layers)
{
    const zr_plan_calibration *k = &r->cal;
    if (!k->calibrated) {
        if (line) {
            printf("(not calibrated: the probe ran no reference steps)\n");
        }
        return;
    }
    if (line) {
        printf(
            "(calibrated on the probe's reference steps: computation x%.2f + %.2f ns per "
            "inter-node byte, optimizer x%.2f (stage 0 x%.2f); transfers x%.2f and a wait floor of "
            "%.2f ms at stage 3, x%.2f and %.2f ms at stages 0-2)\n",
            k->stage3.k_compute, 1e9 * k->stage3.c_byte, k->stage3.k_optim, k->k_optim_replicated,
            k->stage3.k_comm, 1e3 * k->stage3.t_sync, k->stage012.k_comm, 1e3 * k->stage012.t_sync);
        if (k->layers != layers) {
            printf("(the probe ran %d layers, this run has %d: the factors are those of the "
                   "probe's depth, the blocks priced one by one)\n",
                   k->layers, layers);
        }
    }
    double shrink = zr_plan_link_shrink(k);
    if (shrink < 0.5) {
        char msg[320];
        snprintf(msg, sizeof msg,
                 "the probe's reference steps waited less than half of what its transfer "
                 "measurements predict (x%.2f): its link figures are probably off (a loaded or "
                 "shaped network while it ran); probing again may give a better plan",
                 shrink);
        warn_rank0(NULL, msg);
    }
}

static void print_table(const zr_plan_result *r, int top, const zr_train_config *c)
{
    printf("%4s  %-64s %9s %8s %7s %8s %6s %9s %8s %9s\n", "rank", "configuration", "step ms",
           "compute", "codecs", "exposed", "optim", "tokens/s", "mem GB", "inter MB");
    for (int i = 0; i < r->n && i < top; i++) {
        const zr_plan_entry *e = &r->entries[i];
        char d[160];
        zr_plan_describe(&e->choice, d, sizeof d);
        const zr_plan_cost *k = &e->cost;
        printf("%4d  %-64s %9.1f %8.1f %7.1f %8.1f %6.1f %9.0f %8.3f %9.3f\n", i + 1, d,
               1e3 * k->t_step, 1e3 * k->t_compute, 1e3 * k->t_codec, 1e3 * k->t_exposed,
               1e3 * k->t_optim, k->tokens_per_s, k->mem.total / 1e9, k->bytes_inter / 1e6);
    }
    printf("(%d configurations considered, %d over the memory limit, %d shown; times per step "
           "and rank, inter MB sent across nodes per rank and step; weights quantized to no "
           "fewer than %d bits, gradients %d: zr.quant.qwz_bits / qgz_bits)\n",
           r->considered, r->over_memory, r->n < top ? r->n : top, c->qwz_bits, c->qgz_bits);
    printf("%s\n", r->why);
    print_calibration(r, 1, c->layers);
}

static void print_json(const zr_plan_result *r, const zr_probe *p, double limit)
{
    printf("{\"nodes\": %d, \"ranks_per_node\": %d, \"memory_limit\": %.0f, \"considered\": %d, "
           "\"over_memory\": %d, \"why\": \"",
           p->nodes, p->ranks_per_node, limit, r->considered, r->over_memory);
    for (const char *s = r->why; *s; s++) {
        if (*s == '"' || *s == '\\') {
            putchar('\\');
        }
        putchar(*s);
    }
    const zr_plan_calib *f[2] = {&r->cal.stage3, &r->cal.stage012};
    printf("\", \"calibrated\": %s, \"k_optim_replicated\": %.6g, \"cal_layers\": %d",
           r->cal.calibrated ? "true" : "false", r->cal.k_optim_replicated, r->cal.layers);
    for (int i = 0; i < 2; i++) {
        printf(", \"%s\": {\"k_compute\": %.6g, \"c_byte\": %.6g, \"k_optim\": %.6g, "
               "\"k_comm\": %.6g, \"t_sync\": %.6g}",
               i == 0 ? "cal_stage3" : "cal_stage012", f[i]->k_compute, f[i]->c_byte, f[i]->k_optim,
               f[i]->k_comm, f[i]->t_sync);
    }
    printf(", \"configs\": [");
    for (int i = 0; i < r->n; i++) {
        const zr_plan_choice *c = &r->entries[i].choice;
        const zr_plan_cost *k = &r->entries[i].cost;
        printf("%s\n {\"rank\": %d, \"stage\": %d, \"qwz\": %d, \"qwz_bits\": %d, \"hpz\": %d, "
               "\"qgz\": %d, \"qgz_bits\": %d, \"prefetch_bucket\": %lld, \"micro_batch\": %d, "
               "\"accum\": %d, \"step_ms\": %.4f, \"compute_ms\": %.4f, \"codec_ms\": %.4f, "
               "\"comm_ms\": %.4f, \"exposed_ms\": %.4f, \"optim_ms\": %.4f, \"tokens_per_s\": "
               "%.3f, \"memory_bytes\": %zu, \"state_bytes\": %zu, \"activation_bytes\": %zu, "
               "\"pool_bytes\": %zu, \"intra_bytes\": %.0f, \"inter_bytes\": %.0f}",
               i == 0 ? "" : ",", i + 1, c->stage, c->qwz, c->qwz_bits, c->hpz, c->qgz, c->qgz_bits,
               c->prefetch_bucket, c->micro_batch, c->accum, 1e3 * k->t_step, 1e3 * k->t_compute,
               1e3 * k->t_codec, 1e3 * k->t_comm, 1e3 * k->t_exposed, 1e3 * k->t_optim,
               k->tokens_per_s, k->mem.total, k->mem.state, k->mem.activations, k->mem.pool,
               k->bytes_intra, k->bytes_inter);
    }
    printf("\n]}\n");
    fflush(stdout);
    print_calibration(r, 0, r->cal.layers); /* the warning, on stderr */
}

/* Write cfg with the winner applied as a config file `zr train --config` reads. */
static zr_status write_config(const char *path, const zr_train_config *cfg,
                              const zr_plan_choice *ch, int world)
{
    static zr_train_config c;
    c = *cfg;
    zr_plan_apply(&c, ch);
    ZR_CHECK(zr_config_finalize(&c, world));
    char *text;
    ZR_CHECK(zr_config_to_json(&c, &text));
    zr_status st = zr_file_write_atomic(path, text, strlen(text));
    zr_free(text);
    return st;
}

/* zr plan's own flags; what they are not is passed on as train keys. */
typedef struct plan_flags {
    const char *probe_path, *out_cfg; /* --probe, --write-config */
    double limit, top;                /* --memory-limit (bytes; -1: the probe's), --top */
    int json;                         /* --json */
} plan_flags;

/* zr plan's own flags into f, the rest (train keys) into rest[*n]. */
static zr_status plan_args(int argc, char **argv, char **rest, int *n, plan_flags *f)
{
    static const char *const valued[] = {"--probe", "--memory-limit", "--top", "--write-config"};
    zr_status st = ZR_OK;
    for (int i = 0; i < argc; i++) {
        st = st == ZR_OK ? value_missing(argc, argv, i, valued, 4) : st;
        if (flag(argc, argv, i, "--probe", 1)) {
            f->probe_path = argv[++i];
        } else if (flag(argc, argv, i, "--memory-limit", 1)) {
            if (st == ZR_OK) {
                st = zr_cli_number("--memory-limit", argv[i + 1], 1e-6, 1e9, 0, &f->limit);
                f->limit *= 1e9; /* GB */
            }
            i++;
        } else if (flag(argc, argv, i, "--top", 1)) {
            if (st == ZR_OK) {
                st = zr_cli_number("--top", argv[i + 1], 1, 1e6, 1, &f->top);
            }
            i++;
        } else if (flag(argc, argv, i, "--write-config", 1)) {
            f->out_cfg = argv[++i];
        } else if (strcmp(argv[i], "--json") == 0) {
            f->json = 1;
        } else {
            rest[(*n)++] = argv[i];
        }
    }
    return st;
}

int zr_cli_plan(int argc, char **argv)
{
    plan_flags f = {NULL, NULL, -1, 15, 0};
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (rest == NULL) {
        return EXIT_RUNTIME;
    }
    int n = 0;
    zr_status arg_st = plan_args(argc, argv, rest, &n, &f);
    const char *probe_path = f.probe_path, *out_cfg = f.out_cfg;
    double limit = f.limit, top_v = f.top;
    int json = f.json;
    static zr_train_config cfg;
    zr_config_defaults(&cfg);
    int help = 0, vocab = 0, code = EXIT_OK;
    zr_probe p;
    zr_plan_result r;
    memset(&r, 0, sizeof r);
    int top = (int)top_v;
    zr_status st = arg_st;
    if (st == ZR_OK) {
        st = zr_config_from_args(&cfg, n - 1, rest + 1, &help, warn_rank0, NULL);
    }
    if (st == ZR_OK && (help || probe_path == NULL)) {
        printf("usage: zr plan [zr train keys] --probe probe.json [--memory-limit GB] [--top K] "
               "[--json] [--write-config FILE]\n"
               "Ranks every configuration (stage, qwZ, hpZ, qgZ, prefetch, micro-batch x "
               "accumulation) for train_batch_size on the probe's layout by predicted tokens/s; "
               "the memory limit defaults to the probe's available memory per rank.\n");
        free(rest);
        return help ? EXIT_OK : EXIT_INPUT;
    }
    int replaces = 0;
    if (st == ZR_OK && out_cfg != NULL) {
        st = check_output(out_cfg, "--write-config", &cfg, probe_path, &replaces);
    }
    if (st == ZR_OK) {
        st = zr_probe_read(probe_path, &p);
    }
    if (st == ZR_OK && cfg.train_batch_size > 0) {
        /* the split of train_batch_size into micro-batch x accumulation is the plan's to
           choose: a configured one only says how the configuration was run before */
        cfg.given &= ~(ZR_GIVEN_MICRO_BATCH | ZR_GIVEN_GRAD_ACCUM);
        cfg.gradient_accumulation_steps = 1;
    }
    if (st == ZR_OK) {
        st = zr_config_finalize(&cfg, p.world);
    }
    if (st == ZR_OK) {
        st = vocab_of(&cfg, &vocab);
    }
    if (st == ZR_OK && (st = zr_plan_check_probe(&cfg, vocab, &p)) != ZR_OK) {
        char msg[1400];
        snprintf(msg, sizeof msg, "%s: %s", probe_path, zr_error_message());
        zr_error_set_message(msg);
    }
    if (st == ZR_OK) {
        limit = limit >= 0 ? limit : p.mem_per_rank;
        st = zr_plan_run(&cfg, vocab, &p, limit, &r);
    }
    if (st == ZR_OK && out_cfg != NULL) {
        st = write_config(out_cfg, &cfg, &r.entries[0].choice, p.world);
    }
    if (st == ZR_OK) {
        if (json) {
            print_json(&r, &p, limit);
        } else {
            print_table(&r, top, &cfg);
        }
        if (out_cfg != NULL && !json) {
            printf("wrote %s (zr train --config %s)%s\n", out_cfg, out_cfg,
                   replaces ? "; it replaced the file that was there" : "");
        }
    } else {
        code = fail_msg("plan", st);
    }
    zr_plan_result_free(&r);
    free(rest);
    return code;
}

/* ---- zr train --auto ------------------------------------------------------------ */

int zr_cli_take_flag(int *argc, char **argv, const char *flag)
{
    int found = 0, n = 0;
    for (int i = 0; i < *argc; i++) {
        if (strcmp(argv[i], flag) == 0) {
            found = 1;
        } else {
            argv[n++] = argv[i];
        }
    }
    *argc = n;
    return found;
}

zr_status zr_cli_auto(MPI_Comm world, zr_train_config *cfg, int rank)
{
    int vocab = 0;
    zr_dataset data;
    memset(&data, 0, sizeof data);
    zr_status st = zr_plan_adopt_model(cfg);
    if (st == ZR_OK) {
        st = load_data(cfg, &data, &vocab);
    }
    zr_comm c;
    zr_comm_config cc = {0, 1};
    if (st == ZR_OK) {
        st = zr_comm_init(&c, world, &cc);
    }
    if (st != ZR_OK) {
        zr_dataset_free(&data);
        return st;
    }
    zr_comm_set_timeout(&c, cfg->timeout_s);
    zr_probe p;
    int per = cfg->train_batch_size / c.size[ZR_GROUP_WORLD];
    st = zr_probe_run(&c, cfg, vocab, per < 8 ? per : 8, &p);
    zr_comm_free(&c);
    zr_dataset_free(&data);
    ZR_CHECK(st);
    zr_plan_result r;
    /* every rank plans from the same agreed probe: the same winner everywhere */
    ZR_CHECK(zr_plan_run(cfg, vocab, &p, p.mem_per_rank, &r));
    zr_plan_apply(cfg, &r.entries[0].choice);
    st = zr_config_finalize(cfg, p.world);
    if (rank == 0) {
        printf("zr train --auto: probed %d nodes x %d ranks; %s\n", p.nodes, p.ranks_per_node,
               r.why);
        print_calibration(&r, 1, cfg->layers);
        fflush(stdout);
    }
    zr_plan_result_free(&r);
    return st;
}
