/*
 * test_recompute.c - activation checkpointing: the backward that recomputes
 * each block's forward gives bit-identical gradients, losses and trained
 * parameters, and holds fewer activation bytes.
 */
#define ZR_TEST_MPI
#include "test.h"

#include "zr/gpt_engine.h"

static int W, R;
static zr_comm comm;

static const zr_gpt_config CFG = {32, 64, 128, 3, 4, 32}; /* maxT, V, Vp, L, NH, C */
enum { B = 2, T = 24 };

static void batch(uint64_t seed, int *in, int *tg)
{
    zr_test_rng rng = {seed};
    for (int i = 0; i < B * T; i++) {
        in[i] = (int)(zr_test_rng_next(&rng) % (uint64_t)CFG.vocab);
        tg[i] = (int)(zr_test_rng_next(&rng) % (uint64_t)CFG.vocab);
    }
}

/* Two micro-batches of forward + backward, gradients accumulated; returns the losses' bits. */
static void model_run(int recompute, float **params, float **grads, uint32_t loss_bits[2],
                      size_t *act_bytes)
{
    zr_gpt m;
    TEST_OK(zr_gpt_init_ex(&m, &CFG, B, T, recompute));
    *act_bytes = zr_gpt_activation_bytes(&m);
    int n = zr_gpt_unit_count(&m), last = n - 1;
    int in[B * T], tg[B * T];
    for (int k = 0; k < 2; k++) {
        batch(77 + (uint64_t)k, in, tg);
        TEST_OK(zr_gpt_forward_begin(&m, in, tg));
        for (int u = 0; u < n; u++) {
            TEST_OK(zr_gpt_forward_unit(&m, u, params[u], params[0]));
        }
        float loss = zr_gpt_loss(&m);
        memcpy(&loss_bits[k], &loss, sizeof loss);
        TEST_OK(zr_gpt_backward_begin(&m));
        for (int u = last; u >= 0; u--) {
            TEST_OK(zr_gpt_backward_unit(&m, u, params[u], params[0], grads[u], grads[0]));
        }
    }
    zr_gpt_free(&m);
}

static void test_model_gradients_identical(void)
{
    zr_gpt m;
    TEST_OK(zr_gpt_init(&m, &CFG, B, T));
    int n = zr_gpt_unit_count(&m);
    float *p[8], *g0[8], *g1[8];
    for (int u = 0; u < n; u++) {
        size_t k = zr_gpt_unit_numel(&m, u);
        TEST_OK(zr_alloc_at((void **)&p[u], k * 4, __FILE__, __LINE__));
        TEST_OK(zr_alloc_at((void **)&g0[u], k * 4, __FILE__, __LINE__));
        TEST_OK(zr_alloc_at((void **)&g1[u], k * 4, __FILE__, __LINE__));
        zr_gpt_unit_init_params(&m, u, p[u], 3);
    }
    uint32_t l0[2], l1[2];
    size_t a0, a1;
    model_run(0, p, g0, l0, &a0);
    model_run(1, p, g1, l1, &a1);
    TEST_CHECK(l0[0] == l1[0] && l0[1] == l1[1]);
    int same = 1;
    for (int u = 0; u < n; u++) {
        same &= memcmp(g0[u], g1[u], zr_gpt_unit_numel(&m, u) * 4) == 0;
    }
    TEST_CHECKF(same, "gradients with recomputation differ from the stored-activation run");
    /* saved: L - 1 blocks' activations except their outputs */
    size_t BT = (size_t)B * T, C = (size_t)CFG.channels, NH = (size_t)CFG.heads;
    size_t block =
        4 * (BT * C * 4) + 2 * (BT * 4 * C * 4) + BT * 3 * C * 4 + B * NH * T * 4 + 4 * BT * 4;
    TEST_CHECKF(a1 < a0 && a0 - a1 >= (size_t)(CFG.layers - 1) * block,
                "activation bytes %zu with recomputation, %zu without", a1, a0);
    for (int u = 0; u < n; u++) {
        zr_free(p[u]), zr_free(g0[u]), zr_free(g1[u]);
    }
    zr_gpt_free(&m);
}

/*
 * Through the ZeRO engine at stage 3: same losses and parameters, bit for
 * bit, as long as the backward gathers the weights the forward used (qwZ
 * quantizes the same shard the same way twice). hpZ's secondary holds them
 * rounded to bf16 unless the wire is fp32, and the recomputation then runs
 * on those, as DeepSpeed's would; so hpZ is checked with fp32 on the wire.
 */
static uint32_t engine_run(int recompute, int hpz, uint32_t *loss_crc)
{
    zr_engine_config cfg = zr_engine_config_default();
    cfg.qwz = cfg.qgz = !hpz;
    cfg.hpz = hpz;
    if (hpz) {
        cfg.param_wire.type = cfg.grad_wire.type = ZR_WIRE_F32;
    }
    zr_gpt m;
    zr_gpt_specs sp;
    zr_engine e;
    TEST_OK(zr_gpt_init_ex(&m, &CFG, B, T, recompute));
    TEST_OK(zr_gpt_specs_init(&sp, &CFG));
    TEST_OK(zr_engine_init(&e, &comm, &cfg, sp.nunits, sp.units));
    TEST_OK(zr_gpt_engine_init_params(&e, &m.cfg, 5));
    zr_gpt_run run = zr_gpt_run_host(&m);
    int in[B * T], tg[B * T];
    *loss_crc = 0;
    for (int s = 0; s < 3; s++) {
        for (int k = 0; k < 2; k++) {
            batch(1000 + (uint64_t)(s * 2 + k) * 31 + (uint64_t)R, in, tg);
            float loss;
            TEST_OK(zr_gpt_engine_micro(&run, &e, in, tg, &loss));
            *loss_crc = zr_crc32c(*loss_crc, &loss, sizeof loss);
        }
        zr_step_stats st;
        TEST_OK(zr_engine_step(&e, 1e-3f, &st));
        /* evaluation in between must not disturb the recomputation state */
        batch(5000 + (uint64_t)s, in, tg);
        float vloss;
        TEST_OK(zr_gpt_engine_eval(&run, &e, in, tg, &vloss));
        *loss_crc = zr_crc32c(*loss_crc, &vloss, sizeof vloss);
    }
    uint32_t crc = 0;
    for (int u = 0; u < sp.nunits; u++) {
        size_t k = zr_gpt_unit_numel(&m, u);
        float *full;
        TEST_OK(zr_alloc_at((void **)&full, k * 4, __FILE__, __LINE__));
        TEST_OK(zr_engine_get_params(&e, u, full));
        crc = zr_crc32c(crc, full, k * 4);
        zr_free(full);
    }
    zr_engine_free(&e);
    zr_gpt_specs_free(&sp);
    zr_gpt_free(&m);
    return crc;
}

static void test_engine_training_identical(void)
{
    for (int hpz = 0; hpz <= 1; hpz++) {
        uint32_t l0, l1;
        uint32_t c0 = engine_run(0, hpz, &l0);
        uint32_t c1 = engine_run(1, hpz, &l1);
        TEST_CHECKF(c0 == c1, "hpZ %d: parameters after 3 steps differ (%08x vs %08x)", hpz, c0,
                    c1);
        TEST_CHECKF(l0 == l1, "hpZ %d: losses differ", hpz);
    }
}

int main(int argc, char **argv)
{
    zr_test_mpi_init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    zr_gpt_set_threads(1);
    if (zr_comm_init(&comm, MPI_COMM_WORLD, NULL) != ZR_OK) {
        fprintf(stderr, "communicator: %s\n", zr_error_message());
        return 1;
    }
    TEST_RUN(test_model_gradients_identical);
    TEST_RUN(test_engine_training_identical);
    zr_comm_free(&comm);
    return zr_test_finish();
}
