/*
 * test_plan_llama.c - the planner for a Llama-family model from a Hugging
 * Face folder (issue 43; tests/data/hf/llama_gqa: GQA 8:2, untied, llama3
 * rope scaling).
 *
 *   model      zr_plan_adopt_model takes the folder's shape into the zr.model
 *              keys, zr_plan_model gives the trainer's own model (equal to
 *              its mcfg), a vocabulary the folder does not have refused
 *   bytes      for stages 0-3 and ZeRO++, the plan's bytes and exchanges per
 *              collective kind, model state and pool peak equal the engine's
 *              while the trainer runs the folder
 *   probe      zr_probe_run on this layout measures the Llama units and runs
 *              the reference steps; the file records the architecture and
 *              the Llama fields and reads back equal; the plan runs on it
 *   refusals   a GPT-2 probe for the Llama plan and a Llama probe for a GPT-2
 *              plan, naming the architectures; a probe of another Llama
 *              (kv heads, MLP width, tied) naming the field; a probe file of an
 *              earlier zr (no architecture keys) is a GPT-2's
 *
 * Runs under mpirun at several layouts (tests/testlist), from the repository
 * root (ZR_HF_DATA: where tests/data/hf is otherwise).
 */
#define _POSIX_C_SOURCE 200809L
#define ZR_TEST_MPI
#include "test.h"

#include "zr/plan.h"
#include "zr/trainer.h"

#include <unistd.h>

static int W, R;

static const char *data_dir(void)
{
    const char *r = getenv("ZR_HF_DATA");
    return r != NULL ? r : "tests/data/hf";
}

/* A few steps of the folder at T = 16 on the CPU, its shape adopted. */
static void llama(zr_train_config *c)
{
    zr_config_defaults(c);
    snprintf(c->init_path, sizeof c->init_path, "%s/llama_gqa", data_dir());
    c->seq_len = 16;
    c->vocab_size = 256;
    c->train_micro_batch_size_per_gpu = 1;
    c->gradient_accumulation_steps = 1;
    c->train_batch_size = 0;
    c->train_steps = 4;
    c->val_every = 0;
    c->steps_per_print = 100;
    c->scheduler_type[0] = '\0';
    c->threads = 1;
    c->reduce_bucket_size = 3000; /* a few units in flight */
    snprintf(c->device, sizeof c->device, "cpu");
    TEST_OK(zr_plan_adopt_model(c));
}

static void test_model(void)
{
    zr_train_config c;
    llama(&c);
    TEST_EQ_INT(c.layers, 2);
    TEST_EQ_INT(c.heads, 8);
    TEST_EQ_INT(c.channels, 64);
    TEST_EQ_INT(c.max_seq_len, 256);
    zr_gpt_config m;
    TEST_OK(zr_plan_model(&c, 256, &m));
    TEST_CHECK(m.arch == ZR_ARCH_LLAMA && m.llama.kv_heads == 2 && m.llama.head_dim == 8 &&
               m.llama.intermediate == 136 && !m.llama.tied && m.padded_vocab == 256);
    /* the trainer's model is the plan's */
    static zr_train_config t_cfg;
    t_cfg = c;
    TEST_OK(zr_config_finalize(&t_cfg, W));
    static zr_trainer t;
    TEST_OK(zr_trainer_init(&t, MPI_COMM_WORLD, &t_cfg, NULL, NULL));
    TEST_CHECK(zr_gpt_config_equal(&t.mcfg, &m));
    TEST_OK(zr_trainer_conclude(&t, ZR_OK));
    zr_trainer_free(&t, 0);
    TEST_FAILS(zr_plan_model(&c, 300, &m), ZR_ERR_INVALID, "has 256");
    /* a key given otherwise is refused as zr train refuses it */
    zr_train_config d;
    zr_config_defaults(&d);
    snprintf(d.init_path, sizeof d.init_path, "%s/llama_gqa", data_dir());
    d.channels = 96;
    d.given |= ZR_GIVEN_CHANNELS;
    TEST_FAILS(zr_plan_adopt_model(&d), ZR_ERR_INVALID, "zr.model.channels is 96");
    /* a GPT-2 (no folder) is the keys' */
    zr_config_defaults(&d);
    TEST_OK(zr_plan_adopt_model(&d));
    TEST_OK(zr_plan_model(&d, 256, &m));
    TEST_CHECK(m.arch == ZR_ARCH_GPT2 && m.layers == d.layers && m.padded_vocab == 256);
}

/* One step's bytes per kind, model state and pool peak through the trainer against the plan's. */
static void check_choice(const zr_train_config *base, const zr_plan_choice *ch)
{
    static zr_train_config cfg;
    cfg = *base;
    zr_plan_apply(&cfg, ch);
    TEST_OK(zr_config_finalize(&cfg, W));
    static zr_trainer t;
    TEST_OK(zr_trainer_init(&t, MPI_COMM_WORLD, &cfg, NULL, NULL));
    zr_step_record rec;
    TEST_OK(zr_trainer_step(&t, &rec)); /* the first steps warm the pools */
    TEST_OK(zr_trainer_step(&t, &rec));
    zr_traffic a = zr_comm_traffic_get(&t.comm);
    TEST_OK(zr_trainer_step(&t, &rec));
    zr_traffic b = zr_comm_traffic_get(&t.comm);
    zr_memory mem = zr_engine_memory(&t.engine);
    int N = t.comm.n_nodes, D = t.comm.ranks_per_node;
    TEST_OK(zr_trainer_conclude(&t, ZR_OK));
    zr_trainer_free(&t, 0);
    zr_plan_cost cost;
    TEST_OK(zr_plan_cost_of(base, 256, N, D, ch, NULL, &cost));
    char d[160];
    zr_plan_describe(ch, d, sizeof d);
    for (int k = 0; k < ZR_KIND_COUNT; k++) {
        if (k == ZR_KIND_CONTROL) {
            continue;
        }
        unsigned long long ei = b.kind[k].bytes_intra - a.kind[k].bytes_intra,
                           ex = b.kind[k].bytes_inter - a.kind[k].bytes_inter,
                           ec = b.kind[k].calls - a.kind[k].calls;
        TEST_CHECKF(ei == cost.traffic.kind[k].bytes_intra &&
                        ex == cost.traffic.kind[k].bytes_inter && ec == cost.traffic.kind[k].calls,
                    "%s, %s: engine intra %llu inter %llu in %llu, plan intra %llu inter %llu in "
                    "%llu",
                    d, zr_kind_name((zr_kind)k), ei, ex, ec,
                    (unsigned long long)cost.traffic.kind[k].bytes_intra,
                    (unsigned long long)cost.traffic.kind[k].bytes_inter,
                    (unsigned long long)cost.traffic.kind[k].calls);
    }
    size_t state = mem.params + mem.grads + mem.optim + mem.secondary;
    TEST_CHECKF(state == cost.mem.state, "%s: engine state %zu, plan %zu", d, state,
                cost.mem.state);
    TEST_CHECKF(mem.pool_peak == cost.mem.pool, "%s: engine pool peak %zu, plan %zu", d,
                mem.pool_peak, cost.mem.pool);
}

static void test_bytes_match_engine(void)
{
    zr_train_config base;
    llama(&base);
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    int D = c.ranks_per_node;
    zr_comm_free(&c);
    int hpz = D > 1 ? D : 0;
    const zr_plan_choice list[] = {
        {0, 0, 0, 1, 0, 0, 0, 1, 1},          {2, 0, 0, 1, 1, 4, 0, 1, 2},
        {3, 0, 0, 1, 0, 0, 50000000, 1, 1},   {3, 1, 8, 1, 0, 0, 3000, 1, 1},
        {3, 1, 8, hpz, 1, 4, 50000000, 1, 2}, {3, 1, 8, hpz, 1, 8, 0, 2, 1},
    };
    for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) {
        check_choice(&base, &list[i]);
    }
}

/* The probe of the folder, written and read back, the plan made on it, and the refusals. */
static void test_probe(void)
{
    zr_train_config c;
    llama(&c);
    zr_comm comm;
    TEST_OK(zr_comm_init(&comm, MPI_COMM_WORLD, NULL));
    zr_probe p;
    TEST_OK(zr_probe_run(&comm, &c, 256, 2, &p));
    zr_comm_free(&comm);
    TEST_CHECK(p.arch == ZR_ARCH_LLAMA && p.kv_heads == 2 && p.head_dim == 8 &&
               p.intermediate == 136 && p.tied == 0 && p.qkv_bias == 0);
    TEST_CHECK(p.layers == 2 && p.channels == 64 && p.heads == 8 && p.padded_vocab == 256);
    TEST_EQ_INT(p.ncompute, 2);
    TEST_CHECK(p.compute[1].fwd_block > 0 && p.compute[1].bwd_block > 0 &&
               p.compute[1].fwd_head > 0 && p.compute[1].bwd_head > 0);
    TEST_CHECK(p.cal_batch == 1 && p.cal_step[0] > 0 && p.cal_step[1] > 0);
    TEST_OK(zr_plan_check_probe(&c, 256, &p));
    zr_plan_result r;
    static zr_train_config f; /* the global batch derived, as zr plan does */
    f = c;
    TEST_OK(zr_config_finalize(&f, W));
    TEST_OK(zr_plan_run(&f, 256, &p, 0, &r));
    TEST_CHECK(r.n > 0 && r.entries[0].cost.t_step > 0 && r.cal.calibrated);
    zr_plan_result_free(&r);
    if (R != 0) {
        return;
    }
    char path[] = "/tmp/zr-test-plan-llama-XXXXXX";
    int fd = mkstemp(path);
    TEST_CHECK(fd >= 0);
    close(fd);
    TEST_OK(zr_probe_write(path, &p));
    zr_probe q;
    TEST_OK(zr_probe_read(path, &q));
    TEST_CHECK(q.arch == p.arch && q.kv_heads == p.kv_heads && q.head_dim == p.head_dim &&
               q.intermediate == p.intermediate && q.tied == p.tied && q.qkv_bias == p.qkv_bias);
    TEST_OK(zr_plan_check_probe(&c, 256, &q));
    /* the other architecture, both ways */
    zr_train_config g;
    zr_config_defaults(&g);
    g.layers = 2, g.heads = 8, g.channels = 64, g.seq_len = 16, g.max_seq_len = 256;
    g.threads = 1;
    snprintf(g.device, sizeof g.device, "cpu");
    TEST_FAILS(zr_plan_check_probe(&g, 256, &q), ZR_ERR_INVALID,
               "a Llama-family model there, GPT-2 here");
    zr_probe gp = q;
    gp.arch = gp.kv_heads = gp.head_dim = gp.intermediate = gp.tied = gp.qkv_bias = 0;
    TEST_OK(zr_plan_check_probe(&g, 256, &gp));
    TEST_FAILS(zr_plan_check_probe(&c, 256, &gp), ZR_ERR_INVALID,
               "GPT-2 there, a Llama-family model here");
    /* another Llama */
    zr_probe o = q;
    o.kv_heads = 8;
    TEST_FAILS(zr_plan_check_probe(&c, 256, &o), ZR_ERR_INVALID,
               "num_key_value_heads is 8 there, 2 here");
    o = q;
    o.intermediate = 128;
    TEST_FAILS(zr_plan_check_probe(&c, 256, &o), ZR_ERR_INVALID, "intermediate_size is 128");
    o = q;
    o.tied = 1;
    TEST_FAILS(zr_plan_check_probe(&c, 256, &o), ZR_ERR_INVALID, "tie_word_embeddings is 1");
    /* damaged, and an earlier zr's file (no architecture keys): a GPT-2's */
    o = q;
    o.arch = 2;
    TEST_OK(zr_probe_write(path, &o));
    TEST_FAILS(zr_probe_read(path, &o), ZR_ERR_FORMAT, "\"arch\"");
    char cmd[256];
    TEST_OK(zr_probe_write(path, &q));
    snprintf(cmd, sizeof cmd,
             "sed -i '/\"\\(arch\\|kv_heads\\|head_dim\\|intermediate\\|tied\\|qkv_bias\\)\"/d' %s",
             path);
    TEST_EQ_INT(system(cmd), 0);
    TEST_OK(zr_probe_read(path, &o));
    TEST_CHECK(o.arch == 0 && o.kv_heads == 0 && o.tied == 0);
    TEST_FAILS(zr_plan_check_probe(&c, 256, &o), ZR_ERR_INVALID, "GPT-2 there");
    unlink(path);
}

int main(int argc, char **argv)
{
    zr_test_mpi_init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    TEST_RUN(test_model);
    TEST_RUN(test_bytes_match_engine);
    TEST_RUN(test_probe);
    return zr_test_finish();
}
