/*
 * test_gpu_train.c - zr train on the GPU (zr.device cuda) end to end through
 * the library's trainer (the loop zr train runs), against the CPU path.
 *
 * A tiny GPT (1 block, C = 32, T = 16, B = 2) on the bundled corpus, fp32
 * compute, constant learning rate, 5 steps, every ZeRO stage and full
 * ZeRO++: the losses of the GPU run must equal the CPU run's to 1e-5 at
 * every step. The engine is the same on both devices, so what differs is
 * the model's arithmetic (cuBLAS and zr's kernels against the CPU ops, fp32
 * both, summed in other orders); in the quantized ZeRO++ mode a gradient
 * that lands on the other side of a quantization boundary moves the
 * trajectory further, so there the bound is the one test_zeropp grants
 * ZeRO++ against ZeRO-3 on the CPU (2% of the loss). Then a checkpoint
 * written by a GPU run after 3 steps resumes on the CPU and continues the
 * same trajectory (steps 4 and 5 within 1e-5 of the GPU-only run), and one
 * written on the CPU resumes on the GPU likewise. The
 * ZeRO engine's state is on the GPU (the communicator's device transport):
 * each run's model state there must be the host engine's formula exactly,
 * its peak device bytes the model, that state and the engine's pool, under
 * the start-up prediction. bf16 compute (bf16.enabled), where the engine's
 * working parameters and gradients are bf16, must follow the CPU's losses
 * within 2% at every stage and with ZeRO++, hold the same check of its
 * memory, and hold less than the fp32 run at stages 1-3: its stage 1-2
 * working copy is 2 bytes per element, and the model computes on the
 * engine's bf16 buffers with no unit buffers of its own where those are
 * bf16 (stage 2-3).
 *
 * With --no-gpu (emulator: ZR_EMU_DEVICES=0 set here before any CUDA call)
 * zr.device cuda fails at once on every rank saying no GPU was found, and
 * auto trains on the CPU, and zr bench model --device cuda exits 1 saying no
 * GPU was found. Without a GPU the comparisons are skipped.
 *
 * Suites: emu (build/emu, the emulated GPU: 1 rank; 4 ranks as 2 x 2 with a
 * GPU each (--gpus 2: NCCL) and two per GPU (the staged transport)), gpu
 * (the release build on a real GPU).
 */
#define _POSIX_C_SOURCE 200809L
#define ZR_TEST_MPI
#include "test.h"

#include "zr/model_cuda.h"
#include "zr/trainer.h"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

enum { STEPS = 5, CUT = 3 };

static int W;
static int shared_gpu; /* this run's ranks share GPUs: the staged transport, else NCCL */
static char last_transport[16];
/* test_modes' runs of stage 3, the trajectories resumed below */
static float stage3_gpu[STEPS], stage3_cpu[STEPS];
static int stage3_done;

typedef struct mode {
    const char *name;
    int stage, qwz, hpz, qgz;
    double tol; /* absolute, on the mean loss */
} mode;

static const mode modes[] = {
    {"stage 0", 0, 0, 0, 0, 1e-5},
    {"stage 1", 1, 0, 0, 0, 1e-5},
    {"stage 2", 2, 0, 0, 0, 1e-5},
    {"stage 3", 3, 0, 0, 0, 1e-5},
    {"ZeRO++ (qwZ + hpZ + qgZ)", 3, 1, 1, 1, 0.02 * 5.5},
};

/* test_modes' fp32 runs: the peak device memory of each mode, which bf16 runs undercut */
static double fp32_peak[sizeof modes / sizeof modes[0]];

/* The tiny run; bf16: bf16.enabled (on the GPU bf16 compute; on the CPU only the wire). */
static zr_status config_ex(zr_train_config *c, const mode *m, const char *device, int steps,
                           int bf16)
{
    zr_config_defaults(c);
    c->bf16_enabled = bf16;
    c->stage = m->stage;
    c->layers = 1;
    c->channels = 32;
    c->heads = 2;
    c->seq_len = 16;
    c->max_seq_len = 16;
    c->train_micro_batch_size_per_gpu = 2;
    c->gradient_accumulation_steps = 1;
    c->train_batch_size = 0;
    c->lr = 1e-3;
    c->scheduler_type[0] = '\0'; /* constant: a shorter run follows the same schedule */
    c->zero_quantized_weights = m->qwz;
    c->zero_hpz_partition_size = m->hpz ? 0 : 1;
    c->zero_quantized_gradients = m->qgz;
    c->train_steps = steps;
    c->val_every = 0;
    c->seed = 7;
    c->threads = 1;
    snprintf(c->device, sizeof c->device, "%s", device);
    return zr_config_finalize(c, W);
}

/* fp32 compute on the GPU (TF32 off), fp32 on the wire: the mode compared with the CPU. */
static zr_status config(zr_train_config *c, const mode *m, const char *device, int steps)
{
    return config_ex(c, m, device, steps, 0);
}

/* The device memory of the last GPU run, read before its trainer goes. */
typedef struct gpu_memory {
    double peak;      /* zr_mem_device_peak: this run's (the trainer resets it) */
    double predicted; /* the trainer's start-up prediction */
    double model;     /* the device model: activations (and bf16 unit buffers) */
    double state;     /* the engine's model state, as it reports it */
    double pool_peak; /* the engine's pool at its peak */
    double formula;   /* model state by the engine's formula (zr_engine_plan_memory) */
    double params;    /* the engine's replicated working copy (stages 1-2) */
    double padded;    /* padded elements of every unit */
    double acts;      /* the device model's activations alone */
} gpu_memory;
static gpu_memory last_mem;

static void note_memory(zr_trainer *t)
{
    const zr_train_config *c = &t->cfg;
    zr_memory m = zr_trainer_memory(t);
    zr_engine_config ecfg = t->ecfg;
    zr_gpt_memory_prediction p;
    TEST_OK(zr_gpt_engine_predict(&t->mcfg, c->train_micro_batch_size_per_gpu, c->seq_len, 0, &ecfg,
                                  &t->comm, &p));
    last_mem.peak = (double)zr_mem_device_peak();
    last_mem.predicted = (double)t->gpu_predicted;
    zr_gpt_shape sh = {c->train_micro_batch_size_per_gpu, c->seq_len, 0,
                       c->bf16_enabled ? ZR_DTYPE_BF16 : ZR_DTYPE_F32};
    last_mem.model = (double)zr_gpt_cuda_engine_bytes(&t->mcfg, &sh, &ecfg);
    last_mem.state = (double)(m.params + m.grads + m.optim + m.secondary);
    last_mem.pool_peak = (double)m.pool_peak;
    last_mem.formula = (double)p.state;
    last_mem.params = (double)m.params;
    last_mem.padded = 0;
    for (int u = 0; u < t->engine.nunits; u++) {
        last_mem.padded += (double)zr_engine_padded(&t->engine, u);
    }
    last_mem.acts = (double)zr_gpt_cuda_activation_bytes(
        &t->mcfg, c->train_micro_batch_size_per_gpu, c->seq_len, sh.compute);
}

/* Losses no step has written: a run that fails compares as NaN, not as stack garbage. */
static void unwritten(float *losses)
{
    for (int s = 0; s < STEPS; s++) {
        losses[s] = NAN;
    }
}

/* Steps [start, end) of a run of c; losses[s] for each step s run. */
static zr_status run(const zr_train_config *c, int resume, float *losses, int *on_gpu)
{
    static zr_trainer t;
    zr_status st = zr_trainer_init(&t, MPI_COMM_WORLD, c, NULL, NULL);
    if (st == ZR_OK && resume) {
        st = zr_trainer_resume(&t);
    }
    if (st == ZR_OK && on_gpu != NULL) {
        *on_gpu = t.device.kind == ZR_DEVICE_CUDA;
    }
    while (st == ZR_OK && !zr_trainer_done(&t)) {
        zr_step_record rec;
        st = zr_trainer_step(&t, &rec);
        if (st == ZR_OK) {
            losses[rec.step - 1] = rec.loss;
            /* exposed communication: on the GPU the stream's idle time waiting for collectives */
            TEST_CHECKF(rec.t_comm >= 0 && rec.t_comm <= rec.t_step,
                        "step %d: exposed communication %.6f s of a %.6f s step", rec.step,
                        rec.t_comm, rec.t_step);
        }
    }
    zr_train_summary sum;
    if (st == ZR_OK) {
        st = zr_trainer_finish(&t, &sum);
    }
    if (st == ZR_OK && t.device.kind == ZR_DEVICE_CUDA) {
        note_memory(&t);
        snprintf(last_transport, sizeof last_transport, "%s", t.comm.transport->name);
    }
    st = zr_trainer_conclude(&t, st);
    zr_trainer_free(&t, st == ZR_OK ? 0 : 1);
    return st;
}

/*
 * The GPU run's memory: the engine's model state on the device is what the
 * host engine's formula says, exactly, everything the GPU holds at the peak
 * is the model, that state and the engine's pool (nothing unaccounted beyond
 * 5%), and the start-up prediction bounds it.
 */
static void check_memory(const char *name)
{
    const gpu_memory *g = &last_mem;
    double known = g->model + g->state + g->pool_peak;
    TEST_CHECKF(g->state == g->formula,
                "%s: model state on the GPU %.0f bytes, the engine's formula %.0f", name, g->state,
                g->formula);
    TEST_CHECKF(g->peak >= g->model + g->state && g->peak <= 1.05 * known,
                "%s: peak device memory %.0f bytes, model %.0f + state %.0f + pool %.0f", name,
                g->peak, g->model, g->state, g->pool_peak);
    TEST_CHECKF(g->peak <= 1.05 * g->predicted,
                "%s: peak device memory %.0f bytes, predicted at start-up %.0f", name, g->peak,
                g->predicted);
    if (zr_test_rank == 0) {
        printf("  %-26s GPU peak %.0f bytes = model %.0f + state %.0f (formula %.0f) + pool %.0f; "
               "predicted %.0f\n",
               name, g->peak, g->model, g->state, g->formula, g->pool_peak, g->predicted);
    }
}

static void test_modes(void)
{
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        const mode *m = &modes[i];
        zr_train_config c;
        float cpu[STEPS], gpu[STEPS];
        unwritten(cpu);
        unwritten(gpu);
        int on_gpu = 0;
        TEST_OK(config(&c, m, "cpu", STEPS));
        TEST_OK(run(&c, 0, cpu, NULL));
        TEST_OK(config(&c, m, "cuda", STEPS));
        TEST_OK(run(&c, 0, gpu, &on_gpu));
        TEST_CHECKF(on_gpu, "%s: zr.device cuda trained on the GPU", m->name);
#if defined(ZR_NCCL) && ZR_NCCL
        const char *want = shared_gpu ? "staged" : "nccl";
#else
        const char *want = "staged";
#endif
        TEST_CHECKF(strcmp(last_transport, want) == 0,
                    "%s: transport %s, expected %s (zr.transport auto)", m->name, last_transport,
                    want);
        check_memory(m->name);
        fp32_peak[i] = last_mem.peak;
        double worst = 0;
        for (int s = 0; s < STEPS; s++) {
            TEST_CHECKF(isfinite(cpu[s]) && fabs(cpu[s] - gpu[s]) <= m->tol,
                        "%s step %d: GPU loss %.9g vs CPU %.9g (tol %.3g)", m->name, s + 1, gpu[s],
                        cpu[s], m->tol);
            worst = fmax(worst, fabs(cpu[s] - gpu[s]));
        }
        if (i == 3) {
            memcpy(stage3_gpu, gpu, sizeof gpu);
            memcpy(stage3_cpu, cpu, sizeof cpu);
            stage3_done = 1;
        }
        if (zr_test_rank == 0) {
            printf("  %-26s %d ranks, %s: losses %.6f .. %.6f, worst |GPU - CPU| %.3g\n", m->name,
                   W, last_transport, cpu[0], cpu[STEPS - 1], worst);
        }
    }
}

/*
 * bf16 compute (bf16.enabled) at every stage and with ZeRO++: the engine's
 * working parameters and gradients are bf16 (zr_config_engine on GPUs), the
 * model computes on them; the losses follow the CPU's fp32 trajectory within
 * 2% of the loss, and the memory is what the formulas say (check_memory).
 */
static void test_bf16(void)
{
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        const mode *m = &modes[i];
        zr_train_config c;
        float cpu[STEPS], gpu[STEPS];
        unwritten(cpu);
        unwritten(gpu);
        int on_gpu = 0;
        TEST_OK(config_ex(&c, m, "cpu", STEPS, 1));
        TEST_OK(run(&c, 0, cpu, NULL));
        TEST_OK(config_ex(&c, m, "cuda", STEPS, 1));
        TEST_OK(run(&c, 0, gpu, &on_gpu));
        TEST_CHECK(on_gpu);
        char name[64];
        snprintf(name, sizeof name, "bf16 %s", m->name);
        check_memory(name);
        const gpu_memory *g = &last_mem;
        if (m->stage == 1 || m->stage == 2) {
            TEST_CHECKF(g->params == 2 * g->padded,
                        "%s: working copy %.0f bytes for %.0f elements, not bf16", name, g->params,
                        g->padded);
        }
        /* unit buffers only for stage 0's fp32 master and stage 0-1's fp32 gradients */
        TEST_CHECKF(m->stage < 2 ? g->model > g->acts : g->model == g->acts,
                    "%s: the device model holds %.0f bytes, its activations %.0f", name, g->model,
                    g->acts);
        TEST_CHECKF(m->stage == 0 || fp32_peak[i] == 0 || g->peak < fp32_peak[i],
                    "%s: peak device memory %.0f bytes, the fp32 run's %.0f", name, g->peak,
                    fp32_peak[i]);
        double worst = 0;
        for (int s = 0; s < STEPS; s++) {
            TEST_CHECKF(isfinite(gpu[s]) && fabs(cpu[s] - gpu[s]) <= 0.02 * cpu[s],
                        "%s step %d: GPU loss %.9g vs CPU fp32 %.9g", name, s + 1, gpu[s], cpu[s]);
            worst = fmax(worst, fabs(cpu[s] - gpu[s]));
        }
        TEST_CHECK(gpu[STEPS - 1] < gpu[0]); /* it trains */
        if (zr_test_rank == 0) {
            printf("  %-26s %d ranks, %s: worst |GPU - CPU fp32| %.3g\n", name, W, last_transport,
                   worst);
        }
    }
}

/* Nothing is left on the device after the runs. */
/*
 * A micro-batch the device model cannot take (B heads attention blocks over 65535: here 2 heads
 * take at most 32767) is refused at start-up, naming the key, before anything is allocated.
 */
static void test_micro_batch_limit(void)
{
    zr_train_config c;
    TEST_OK(config(&c, &modes[3], "cuda", 1));
    c.train_micro_batch_size_per_gpu = 32768;
    c.train_batch_size = 0;
    TEST_OK(zr_config_finalize(&c, W));
    float losses[STEPS];
    unwritten(losses);
    TEST_FAILS(run(&c, 0, losses, NULL), ZR_ERR_INVALID,
               "train_micro_batch_size_per_gpu 32768 at zr.model.seq_len 16 is more than the GPU "
               "model takes (32767:");
    TEST_CHECK(zr_mem_device_current() == 0);
}

static void test_device_memory(void)
{
    TEST_CHECKF(zr_mem_device_current() == 0, "%zu device bytes still held after the runs",
                zr_mem_device_current());
}

/*
 * A checkpoint written after CUT steps on device `from`, resumed on device
 * `to`, continues the trajectory of an uninterrupted run on `from`.
 */
static void resume_across(const char *from, const char *to, const float *full)
{
    char dir[64] = "/tmp/zr_gpu_train_XXXXXX";
    if (zr_test_rank == 0 && mkdtemp(dir) == NULL) {
        dir[0] = '\0';
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    TEST_CHECK(dir[0] != '\0');
    if (dir[0] == '\0') {
        return;
    }
    const mode *m = &modes[3]; /* stage 3 */
    zr_train_config c;
    float part[STEPS];
    TEST_OK(config(&c, m, from, CUT));
    snprintf(c.checkpoint_dir, sizeof c.checkpoint_dir, "%s/ckpt", dir);
    TEST_OK(run(&c, 0, part, NULL));
    int on_gpu = -1;
    TEST_OK(config(&c, m, to, STEPS));
    snprintf(c.checkpoint_dir, sizeof c.checkpoint_dir, "%s/ckpt", dir);
    c.resume = 1;
    TEST_OK(run(&c, 1, part, &on_gpu));
    TEST_CHECK(on_gpu == (strcmp(to, "cuda") == 0));
    for (int s = CUT; s < STEPS; s++) {
        TEST_CHECKF(fabs(part[s] - full[s]) <= 1e-5,
                    "step %d resumed on %s: %.9g vs %.9g on %s all along", s + 1, to, part[s],
                    full[s], from);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (zr_test_rank == 0) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        TEST_CHECK(system(cmd) == 0);
    }
}

/* Checkpoints are the same files on both devices: GPU -> CPU and CPU -> GPU. */
static void test_resume_across(void)
{
    if (!stage3_done) {
        zr_train_config c;
        TEST_OK(config(&c, &modes[3], "cuda", STEPS));
        TEST_OK(run(&c, 0, stage3_gpu, NULL));
        TEST_OK(config(&c, &modes[3], "cpu", STEPS));
        TEST_OK(run(&c, 0, stage3_cpu, NULL));
    }
    resume_across("cuda", "cpu", stage3_gpu);
    resume_across("cpu", "cuda", stage3_cpu);
}

/* No GPU: cuda fails at once on every rank, naming the cause; auto trains on the CPU. */
static void test_no_gpu(void)
{
    zr_train_config c;
    float l[STEPS];
    TEST_OK(config(&c, &modes[3], "cuda", 1));
    zr_status st = run(&c, 0, l, NULL);
    TEST_CHECK(st == ZR_ERR_DEVICE);
    TEST_CHECKF(strstr(zr_error_message(), "no GPU") != NULL &&
                    strstr(zr_error_message(), "--device cpu") != NULL,
                "message: %s", zr_error_message());
    zr_error_clear();
    int on_gpu = 1;
    TEST_OK(config(&c, &modes[3], "auto", 1));
    TEST_OK(run(&c, 0, l, &on_gpu));
    TEST_CHECK(!on_gpu && isfinite(l[0]));
}

/* Run `zr bench model ARGS` (this build's zr) into out; its wait status, or -1. */
static int bench_model(const char *args, char *out, size_t size)
{
    char exe[4096], cmd[4400];
    out[0] = '\0';
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    TEST_CHECK(n > 0);
    if (n <= 0) {
        return -1;
    }
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    *slash = '\0'; /* build/<variant>/tests */
    snprintf(cmd, sizeof cmd, "'%s/../zr' bench model %s 2>&1", exe, args);
    FILE *p = popen(cmd, "r");
    TEST_CHECK(p != NULL);
    if (p == NULL) {
        return -1;
    }
    size_t got = fread(out, 1, size - 1, p);
    out[got] = '\0';
    return pclose(p);
}

/* No GPU: zr bench model --device cuda exits 1 at once, saying so (rank 0; no MPI in it). */
static void test_bench_no_gpu(void)
{
    if (zr_test_rank != 0) {
        return;
    }
    char out[4096];
    int status = bench_model("--device cuda --json", out, sizeof out);
    TEST_CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 1 && strstr(out, "no GPU found"),
                "zr bench model --device cuda without a GPU: status %d, output: %s", status, out);
}

/*
 * On a GPU, zr bench model --device cuda --quick splits a step into its
 * phases: each is timed (a number, not negative) and, --quick timing one
 * step, they add up to that step (phased_step_ms, from the same events:
 * equal up to rounding, whatever the machine's speed).
 */
static void test_bench_phases(void)
{
    if (zr_test_rank != 0) {
        return;
    }
    char out[8192];
    int status = bench_model("--device cuda --quick --json", out, sizeof out);
    TEST_CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "zr bench model --device cuda --quick: status %d, output: %s", status, out);
    const char *step = strstr(out, "\"phased_step_ms\":");
    double ms = -1, sum = 0;
    TEST_CHECKF(step != NULL && sscanf(step, "\"phased_step_ms\":%lf", &ms) == 1 && ms > 0,
                "no phased_step_ms in: %s", out);
    static const char *const keys[] = {"fwd_embed",  "fwd_blocks", "fwd_head", "bwd_head",
                                       "bwd_blocks", "bwd_embed",  "optim"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        char key[64];
        snprintf(key, sizeof key, "\"%s\":", keys[k]);
        const char *at = strstr(out, key);
        double v = -1;
        TEST_CHECKF(at != NULL && sscanf(at + strlen(key), "%lf", &v) == 1 && v >= 0,
                    "phase %s missing or negative in: %s", keys[k], out);
        sum += v;
    }
    /* 7 values printed to 1e-4 ms, float intervals of one clock */
    TEST_CHECKF(fabs(sum - ms) <= 1e-3 + 1e-4 * ms, "phases sum to %.4f ms, the step is %.4f ms",
                sum, ms);
}

int main(int argc, char **argv)
{
    int no_gpu = argc > 1 && strcmp(argv[1], "--no-gpu") == 0;
#if ZR_CUDA_EMU
    /* --gpus N: N emulated GPUs per process (node), so that ranks get one each */
    setenv("ZR_EMU_DEVICES",
           no_gpu                                       ? "0"
           : argc > 2 && strcmp(argv[1], "--gpus") == 0 ? argv[2]
                                                        : "1",
           1);
#endif
    zr_test_mpi_init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    int n = 0, has = zr_device_cuda_count(&n) == ZR_OK, all = 0;
    MPI_Allreduce(&has, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (no_gpu) {
        zr_error_clear();
        if (has) {
            return zr_test_skip("this machine has a GPU; --no-gpu checks a machine without one");
        }
        TEST_RUN(test_no_gpu);
        TEST_RUN(test_bench_no_gpu);
    } else {
        if (!all) {
            return zr_test_skip("%s", has ? "a rank sees no GPU" : zr_error_message());
        }
        zr_comm probe;
        zr_comm_config cc = {0, 0};
        TEST_OK(zr_comm_init(&probe, MPI_COMM_WORLD, &cc));
        int local = probe.size[ZR_GROUP_NODE], mine = local > n;
        zr_comm_free(&probe);
        MPI_Allreduce(&mine, &shared_gpu, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        TEST_RUN(test_modes);
        TEST_RUN(test_bf16);
        TEST_RUN(test_resume_across);
        TEST_RUN(test_micro_batch_limit);
        TEST_RUN(test_bench_phases);
        TEST_RUN(test_device_memory);
    }
    return zr_test_finish();
}
