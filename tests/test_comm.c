/*
 * test_comm.c - the communicator at any rank count and emulated layout:
 * group membership and sizes, layout errors (same message on every rank),
 * exchanges moving the right bytes, traffic counters against hand-computed
 * values, control all-reduces, error agreement (the failing rank's message
 * wins over the notices it sent), ranks started with different
 * ZR_RANKS_PER_NODE / ZR_TIMEOUT (a user error naming ranks and values), and
 * the transport table (a transport's set-up agreed on, its state, control
 * values kept on MPI, the peers a wait names).
 *
 * The layout under test comes from ZR_RANKS_PER_NODE (set by the runner) or,
 * without it, from real detection (one machine: one node).
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#define ZR_TEST_MPI
#include "test.h"

#include "zr/comm.h"

static int W, R, D;

/* The message of the last error, identical on every rank? */
static int same_everywhere(const char *msg)
{
    uint32_t h = zr_crc32c(0, msg, strlen(msg)), lo = h, hi = h;
    MPI_Allreduce(&h, &lo, 1, MPI_UINT32_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&h, &hi, 1, MPI_UINT32_T, MPI_MAX, MPI_COMM_WORLD);
    return lo == hi;
}

static void test_groups(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    int n = W / D;
    TEST_EQ_INT(c.ranks_per_node, D);
    TEST_EQ_INT(c.n_nodes, n);
    TEST_EQ_INT(c.node, R / D);
    TEST_EQ_INT(c.size[ZR_GROUP_WORLD], W);
    TEST_EQ_INT(c.size[ZR_GROUP_NODE], D);
    TEST_EQ_INT(c.size[ZR_GROUP_CROSS], n);
    TEST_EQ_INT(c.size[ZR_GROUP_HPZ], D);
    TEST_EQ_INT(c.rank[ZR_GROUP_NODE], R % D);
    TEST_EQ_INT(c.rank[ZR_GROUP_CROSS], R / D);
    /* ask MPI who is in each group and compare with zr's arithmetic */
    for (int g = 1; g < ZR_GROUP_COUNT; g++) {
        int sz = c.size[g];
        int *members = malloc(sizeof(int) * (size_t)sz);
        MPI_Allgather(&R, 1, MPI_INT, members, 1, MPI_INT, zr_comm_mpi(&c, (zr_group)g));
        for (int k = 0; k < sz; k++) {
            TEST_CHECKF(members[k] == zr_comm_world_rank(&c, (zr_group)g, k),
                        "group %s member %d: MPI says world rank %d, zr says %d",
                        zr_group_name((zr_group)g), k, members[k],
                        zr_comm_world_rank(&c, (zr_group)g, k));
            if (g == ZR_GROUP_NODE || g == ZR_GROUP_HPZ) {
                TEST_EQ_INT(zr_comm_node_of(&c, members[k]), c.node);
            }
            if (g == ZR_GROUP_CROSS) {
                TEST_EQ_INT(members[k] % D, R % D);
                TEST_EQ_INT(zr_comm_node_of(&c, members[k]), k);
            }
        }
        free(members);
    }
    char desc[200];
    zr_comm_describe(&c, desc, sizeof desc);
    TEST_CHECKF(strstr(desc, " rank") != NULL, "describe: %s", desc);
    zr_comm_free(&c);

    /* an hpZ group smaller than a node: h = 1 always divides */
    zr_comm_config cfg = {0, 1};
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, &cfg));
    TEST_EQ_INT(c.size[ZR_GROUP_HPZ], 1);
    zr_comm_free(&c);
    /* an hpZ group of two whole nodes when there are at least two */
    if (n % 2 == 0) {
        cfg.hpz_size = 2 * D;
        TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, &cfg));
        TEST_EQ_INT(c.size[ZR_GROUP_HPZ], 2 * D);
        TEST_EQ_INT(c.first[ZR_GROUP_HPZ], R / (2 * D) * 2 * D);
        zr_comm_free(&c);
    }
}

static void test_layout_errors(void)
{
    zr_comm c;
    zr_comm_config cfg = {W + 1, 0};
    TEST_FAILS(zr_comm_init(&c, MPI_COMM_WORLD, &cfg), ZR_ERR_INVALID, "not divisible by");
    TEST_CHECK(same_everywhere(zr_error_message()));

    cfg.ranks_per_node = D;
    cfg.hpz_size = W + 1;
    TEST_FAILS(zr_comm_init(&c, MPI_COMM_WORLD, &cfg), ZR_ERR_INVALID, "hpZ partition size");
    TEST_CHECK(same_everywhere(zr_error_message()));

    if (W % 6 == 0) {
        /* 2 ranks per node, hpZ 3: divides the world but straddles nodes */
        cfg.ranks_per_node = 2;
        cfg.hpz_size = 3;
        TEST_FAILS(zr_comm_init(&c, MPI_COMM_WORLD, &cfg), ZR_ERR_INVALID, "straddle");
        TEST_CHECK(same_everywhere(zr_error_message()));
    }

    /* placement checks on made-up detections */
    char why[300];
    int leader_ok[6] = {0, 0, 0, 3, 3, 3}, size_ok[6] = {3, 3, 3, 3, 3, 3};
    TEST_EQ_INT(zr_comm_check_placement(leader_ok, size_ok, 6, why, sizeof why), 3);
    int leader_rr[4] = {0, 1, 0, 1}, size_rr[4] = {2, 2, 2, 2};
    TEST_EQ_INT(zr_comm_check_placement(leader_rr, size_rr, 4, why, sizeof why), 0);
    TEST_CHECKF(strstr(why, "not consecutive") != NULL, "%s", why);
    int leader_uneven[3] = {0, 0, 2}, size_uneven[3] = {2, 2, 1};
    TEST_EQ_INT(zr_comm_check_placement(leader_uneven, size_uneven, 3, why, sizeof why), 0);
    TEST_CHECKF(strstr(why, "different numbers") != NULL, "%s", why);
}

/* Fill a byte pattern that names sender, receiver and position. */
static unsigned char pat(int from, int to, size_t i)
{
    return (unsigned char)(from * 31 + to * 7 + i * 13 + 1);
}

static void test_exchanges(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    for (int g = 0; g < ZR_GROUP_COUNT; g++) {
        int n = c.size[g], me = c.rank[g];
        size_t blk = 1000 + (size_t)g * 17;
        unsigned char *send = malloc(blk * n), *recv = malloc(blk * n);
        /* all-gather */
        for (size_t i = 0; i < blk; i++) {
            send[i] = pat(me, 0, i);
        }
        memset(recv, 0, blk * n);
        TEST_OK(zr_comm_allgather(&c, (zr_group)g, ZR_KIND_ALLGATHER, send, blk, recv));
        int ok = 1;
        for (int p = 0; p < n; p++) {
            for (size_t i = 0; i < blk; i++) {
                ok &= recv[p * blk + i] == pat(p, 0, i);
            }
        }
        TEST_CHECKF(ok, "allgather over %s", zr_group_name((zr_group)g));
        /* in place: my block already sits in recv */
        TEST_OK(zr_comm_allgather(&c, (zr_group)g, ZR_KIND_ALLGATHER, recv + me * blk, blk, recv));
        /* all-to-all */
        for (int p = 0; p < n; p++) {
            for (size_t i = 0; i < blk; i++) {
                send[p * blk + i] = pat(me, p, i);
            }
        }
        TEST_OK(zr_comm_alltoall(&c, (zr_group)g, ZR_KIND_ALLTOALL, send, blk, recv));
        ok = 1;
        for (int p = 0; p < n; p++) {
            for (size_t i = 0; i < blk; i++) {
                ok &= recv[p * blk + i] == pat(p, me, i);
            }
        }
        TEST_CHECKF(ok, "alltoall over %s", zr_group_name((zr_group)g));
        free(send);
        free(recv);
    }
    /* uneven exchange: peer p gets p+1 bytes from me, I get me+1 bytes from each */
    int n = W;
    size_t *sc = calloc(n, sizeof *sc), *sd = calloc(n, sizeof *sd);
    size_t *rc = calloc(n, sizeof *rc), *rd = calloc(n, sizeof *rd);
    size_t soff = 0, roff = 0;
    for (int p = 0; p < n; p++) {
        sc[p] = (size_t)p + 1;
        sd[p] = soff;
        soff += sc[p];
        rc[p] = (size_t)R + 1;
        rd[p] = roff;
        roff += rc[p];
    }
    unsigned char *s = malloc(soff), *r = malloc(roff);
    for (int p = 0; p < n; p++) {
        for (size_t i = 0; i < sc[p]; i++) {
            s[sd[p] + i] = pat(R, p, i);
        }
    }
    zr_request req = ZR_REQUEST_INIT;
    TEST_OK(zr_comm_iexchange(&c, ZR_GROUP_WORLD, ZR_KIND_ALLTOALL, s, sc, sd, r, rc, rd, &req));
    int done = 0;
    while (!done) {
        TEST_OK(zr_comm_test(&c, &req, &done));
    }
    TEST_OK(zr_comm_wait(&c, &req)); /* no-op after test said done */
    int ok = 1;
    for (int p = 0; p < n; p++) {
        for (size_t i = 0; i < rc[p]; i++) {
            ok &= r[rd[p] + i] == pat(p, R, i);
        }
    }
    TEST_CHECK(ok);
    free(s), free(r), free(sc), free(sd), free(rc), free(rd);

    /* two exchanges in flight on the same group complete in posting order */
    int a = R, b = -R, ga[64], gb[64];
    if (W <= 64) {
        zr_request r1 = ZR_REQUEST_INIT, r2 = ZR_REQUEST_INIT;
        TEST_OK(zr_comm_iallgather(&c, ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, &a, sizeof a, ga, &r1));
        TEST_OK(zr_comm_iallgather(&c, ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, &b, sizeof b, gb, &r2));
        TEST_OK(zr_comm_wait(&c, &r2));
        TEST_OK(zr_comm_wait(&c, &r1));
        ok = 1;
        for (int p = 0; p < W; p++) {
            ok &= ga[p] == p && gb[p] == -p;
        }
        TEST_CHECK(ok);
    }
    zr_comm_free(&c);
}

static void test_traffic(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    int n = W / D;
    size_t B = 4096;
    unsigned char *send = calloc(B * W, 1), *recv = calloc(B * W, 1);
    zr_comm_traffic_reset(&c);
    TEST_OK(zr_comm_allgather(&c, ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, send, B, recv));
    TEST_OK(zr_comm_allgather(&c, ZR_GROUP_NODE, ZR_KIND_HPZ, send, B, recv));
    TEST_OK(zr_comm_alltoall(&c, ZR_GROUP_CROSS, ZR_KIND_QGZ, send, B, recv));
    TEST_OK(zr_comm_alltoall(&c, ZR_GROUP_NODE, ZR_KIND_QGZ, send, B, recv));
    zr_traffic t = zr_comm_traffic_get(&c);
    /* world all-gather: B to each of D-1 node peers and W-D remote ranks */
    TEST_EQ_INT(t.kind[ZR_KIND_ALLGATHER].calls, 1);
    TEST_EQ_INT(t.kind[ZR_KIND_ALLGATHER].bytes_intra, (D - 1) * B);
    TEST_EQ_INT(t.kind[ZR_KIND_ALLGATHER].bytes_inter, (W - D) * B);
    /* node all-gather never leaves the node */
    TEST_EQ_INT(t.kind[ZR_KIND_HPZ].bytes_intra, (D - 1) * B);
    TEST_EQ_INT(t.kind[ZR_KIND_HPZ].bytes_inter, 0);
    /* cross all-to-all only leaves it; node all-to-all only stays */
    TEST_EQ_INT(t.kind[ZR_KIND_QGZ].calls, 2);
    TEST_EQ_INT(t.kind[ZR_KIND_QGZ].bytes_inter, (n - 1) * B);
    TEST_EQ_INT(t.kind[ZR_KIND_QGZ].bytes_intra, (D - 1) * B);
    TEST_EQ_INT(t.kind[ZR_KIND_REDUCE_SCATTER].calls, 0);
    zr_traffic tot;
    TEST_OK(zr_comm_traffic_total(&c, &tot));
    TEST_EQ_INT(tot.kind[ZR_KIND_ALLGATHER].bytes_inter, (uint64_t)W * (W - D) * B);
    TEST_EQ_INT(tot.kind[ZR_KIND_ALLGATHER].calls, W);
    zr_comm_traffic_reset(&c);
    t = zr_comm_traffic_get(&c);
    TEST_EQ_INT(t.kind[ZR_KIND_ALLGATHER].calls + t.kind[ZR_KIND_QGZ].bytes_inter, 0);
    /* bcast from the last rank: only the root sends */
    TEST_OK(zr_comm_bcast(&c, send, B, W - 1));
    t = zr_comm_traffic_get(&c);
    uint64_t expect_inter = R == W - 1 ? (uint64_t)(W - D) * B : 0;
    TEST_EQ_INT(t.kind[ZR_KIND_CONTROL].bytes_inter, expect_inter);
    free(send);
    free(recv);
    zr_comm_free(&c);
}

static void test_control(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    /* values whose float sum depends on order: every rank must get the same bits */
    double v[2] = {1e16 * (R % 2 ? 1 : -1) + R * 0.1, (double)R};
    TEST_OK(zr_comm_allreduce_sum_f64(&c, ZR_GROUP_WORLD, v, 2));
    TEST_EQ_INT((int64_t)v[1], (int64_t)W * (W - 1) / 2);
    double lo, hi;
    MPI_Allreduce(&v[0], &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&v[0], &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    TEST_CHECK(lo == hi);
    int64_t m[2] = {R, -R};
    TEST_OK(zr_comm_allreduce_max_i64(&c, ZR_GROUP_NODE, m, 2));
    TEST_EQ_INT(m[0], c.first[ZR_GROUP_NODE] + D - 1);
    TEST_EQ_INT(m[1], -c.first[ZR_GROUP_NODE]);
    zr_comm_free(&c);
}

static zr_status fail_on(int rank, int me)
{
    if (rank == me) {
        ZR_FAIL(ZR_ERR_IO, "cannot open config.json on this node");
    }
    return ZR_OK;
}

static void test_agree(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    TEST_OK(zr_comm_agree(&c, ZR_OK));
    /* only the last rank fails; everyone returns its error and message */
    zr_error_clear();
    zr_status st = zr_comm_agree(&c, fail_on(W - 1, R));
    TEST_EQ_INT(st, ZR_ERR_IO);
    TEST_CHECKF(strstr(zr_error_message(), "cannot open config.json") != NULL, "%s",
                zr_error_message());
    if (W > 1) {
        char expect[32];
        snprintf(expect, sizeof expect, "rank %d:", W - 1);
        TEST_CHECKF(strstr(zr_error_message(), expect) != NULL, "%s", zr_error_message());
    }
    TEST_CHECK(same_everywhere(zr_error_message()));
    /* several fail: the lowest failing rank's message wins */
    st = zr_comm_agree(&c, R % 2 == 1 || W == 1 ? fail_on(R, R) : ZR_OK);
    TEST_EQ_INT(st, ZR_ERR_IO);
    TEST_CHECK(same_everywhere(zr_error_message()));
    /* agreeing again on an agreed error (every layer on the way up may) adds no second prefix */
    st = zr_comm_agree(&c, st);
    TEST_EQ_INT(st, ZR_ERR_IO);
    const char *msg = zr_error_message();
    if (W > 1) {
        TEST_CHECKF(strncmp(msg, "rank ", 5) == 0 && strstr(msg + 5, "rank ") == NULL,
                    "doubled prefix: %s", msg);
    } else {
        TEST_CHECKF(strstr(msg, "rank ") == NULL, "prefix at one rank: %s", msg);
    }
    TEST_CHECK(same_everywhere(msg));
    zr_comm_free(&c);
}

/* Set (or with NULL unset) an environment variable, remembering the old value in save. */
static void env_swap(const char *name, const char *value, char *save, size_t n, int *had)
{
    const char *old = getenv(name);
    *had = old != NULL;
    snprintf(save, n, "%s", old != NULL ? old : "");
    if (value != NULL) {
        setenv(name, value, 1);
    } else {
        unsetenv(name);
    }
}

static void env_restore(const char *name, const char *save, int had)
{
    if (had) {
        setenv(name, save, 1);
    } else {
        unsetenv(name);
    }
}

static void test_launch_env(void)
{
    zr_comm c;
    char save[64], expect[128];
    int had;
    if (W > 1) {
        /* the last rank gets another node size; rank 1 of 3+ has none at all */
        char mine[16];
        snprintf(mine, sizeof mine, "%d", R == W - 1 ? W : 1);
        env_swap("ZR_RANKS_PER_NODE", R == 1 && W > 2 ? NULL : mine, save, sizeof save, &had);
        TEST_FAILS(zr_comm_init(&c, MPI_COMM_WORLD, NULL), ZR_ERR_INVALID,
                   "ranks were started with different ZR_RANKS_PER_NODE");
        TEST_CHECK(same_everywhere(zr_error_message()));
        snprintf(expect, sizeof expect, "'%d' on rank %d", W, W - 1);
        TEST_CHECKF(strstr(zr_error_message(), expect) != NULL, "%s lacks %s", zr_error_message(),
                    expect);
        TEST_CHECKF(strstr(zr_error_message(), "'1' on rank") != NULL, "%s", zr_error_message());
        if (W > 2) {
            TEST_CHECKF(strstr(zr_error_message(), "unset on rank 1") != NULL, "%s",
                        zr_error_message());
        }
        env_restore("ZR_RANKS_PER_NODE", save, had);

        /* a config field overrides the environment, so only the field must agree */
        zr_comm_config cfg = {R == 0 ? 1 : W, 1};
        TEST_FAILS(zr_comm_init(&c, MPI_COMM_WORLD, &cfg), ZR_ERR_INVALID, "ranks_per_node");
        TEST_CHECK(same_everywhere(zr_error_message()));
    }
    /* a malformed knob on one rank: the same error everywhere, naming that rank */
    env_swap("ZR_TIMEOUT", R == W - 1 ? "soon" : "30", save, sizeof save, &had);
    TEST_FAILS(zr_comm_init(&c, MPI_COMM_WORLD, NULL), ZR_ERR_INVALID, "ZR_TIMEOUT='soon'");
    TEST_CHECK(same_everywhere(zr_error_message()));
    env_restore("ZR_TIMEOUT", save, had);
    env_swap("ZR_FAULT_STEP", "1:x", save, sizeof save, &had);
    TEST_FAILS(zr_comm_init(&c, MPI_COMM_WORLD, NULL), ZR_ERR_INVALID, "ZR_FAULT_STEP");
    env_restore("ZR_FAULT_STEP", save, had);
    /* and a good timeout is taken */
    env_swap("ZR_TIMEOUT", "12.5", save, sizeof save, &had);
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    TEST_NEAR(c.timeout_s, 12.5, 0);
    zr_comm_free(&c);
    env_restore("ZR_TIMEOUT", save, had);
}

static void test_format_ranks(void)
{
    char buf[200];
    int cls[12] = {0, 1, 1, 0, 1, 1, 1, 0, 1, 0, 1, 0};
    zr_comm_format_ranks(buf, sizeof buf, cls, 3, 0);
    TEST_CHECKF(strcmp(buf, "rank 0") == 0, "%s", buf);
    zr_comm_format_ranks(buf, sizeof buf, cls, 7, 1);
    TEST_CHECKF(strcmp(buf, "ranks 1-2, 4-6") == 0, "%s", buf);
    zr_comm_format_ranks(buf, sizeof buf, cls, 12, 1);
    TEST_CHECKF(strcmp(buf, "ranks 1-2, 4-6, 8, 10") == 0, "%s", buf);
    zr_comm_format_ranks(buf, sizeof buf, cls, 12, 0);
    TEST_CHECKF(strcmp(buf, "ranks 0, 3, 7, 9 and 1 more") == 0, "%s", buf);
}

/* ---- the transport table ---------------------------------------------------------- */

/* A transport that counts its set-ups, tear-downs and exchanges, moving bytes through MPI's. */
static struct {
    int inits, frees, posted, copies;
    int fail_rank; /* its init fails on this world rank (-1: nowhere) */
} counted;

static zr_status counting_init(zr_comm *c, const void *arg, void **state)
{
    if (c->rank[ZR_GROUP_WORLD] == counted.fail_rank) {
        ZR_FAIL(ZR_ERR_INVALID, "no device for the counting transport");
    }
    int *s = NULL;
    ZR_ALLOC(s, 1);
    *s = *(const int *)arg;
    *state = s;
    counted.inits++;
    return ZR_OK;
}

static void counting_free(zr_comm *c, void *state)
{
    (void)c;
    zr_free(state);
    counted.frees++;
}

static zr_status counting_iexchange(zr_comm *c, zr_group g, const void *send, const size_t *scount,
                                    const size_t *sdisp, void *recv, const size_t *rcount,
                                    const size_t *rdisp, zr_request *req)
{
    counted.posted++;
    return zr_transport_mpi.iexchange(c, g, send, scount, sdisp, recv, rcount, rdisp, req);
}

static zr_status counting_self_copy(zr_comm *c, void *dst, const void *src, size_t bytes)
{
    (void)c;
    counted.copies++;
    memmove(dst, src, bytes);
    return ZR_OK;
}

static void test_transport(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    TEST_CHECK(c.transport == &zr_transport_mpi && c.transport_state == NULL);
    zr_transport counting = zr_transport_mpi;
    counting.name = "counting";
    counting.init = counting_init;
    counting.free = counting_free;
    counting.iexchange = counting_iexchange;
    counting.self_copy = counting_self_copy;
    int arg = 42;
    /* a table of another version, or one that lacks a required member, is refused everywhere */
    zr_transport bad = counting;
    bad.version = ZR_TRANSPORT_VERSION - 1;
    TEST_FAILS(zr_comm_use_transport(&c, &bad, &arg), ZR_ERR_INVALID, "version");
    TEST_CHECK(same_everywhere(zr_error_message()));
    bad = counting;
    bad.pending = NULL;
    TEST_FAILS(zr_comm_use_transport(&c, &bad, &arg), ZR_ERR_INVALID, "required");
    /* set-up failing on one rank: every rank says so and keeps MPI, the others tear down */
    memset(&counted, 0, sizeof counted);
    counted.fail_rank = W - 1;
    TEST_FAILS(zr_comm_use_transport(&c, &counting, &arg), ZR_ERR_INVALID, "no device");
    TEST_CHECK(same_everywhere(zr_error_message()));
    TEST_CHECK(c.transport == &zr_transport_mpi);
    TEST_EQ_INT(counted.inits, R == W - 1 ? 0 : 1);
    TEST_EQ_INT(counted.frees, counted.inits);
    /* a working one: its state; exchanges go through it, control values over MPI */
    memset(&counted, 0, sizeof counted);
    counted.fail_rank = -1;
    TEST_OK(zr_comm_use_transport(&c, &counting, &arg));
    TEST_CHECK(c.transport == &counting);
    TEST_EQ_INT(*(const int *)c.transport_state, 42);
    int mine = R, all[64], ok = 1;
    if (W <= 64) {
        TEST_OK(zr_comm_allgather(&c, ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, &mine, sizeof mine, all));
        for (int p = 0; p < W; p++) {
            ok &= all[p] == p;
        }
        TEST_CHECK(ok);
        TEST_EQ_INT(counted.posted, 1);
        TEST_EQ_INT(counted.copies, 1); /* my block, by the transport */
    }
    double v = 1.0;
    TEST_OK(zr_comm_allreduce_sum_f64(&c, ZR_GROUP_WORLD, &v, 1));
    TEST_NEAR(v, (double)W, 0);
    TEST_EQ_INT(counted.posted, W <= 64 ? 1 : 0);
    TEST_EQ_INT(counted.copies, W <= 64 ? 1 : 0);
    zr_comm_free(&c);
    TEST_EQ_INT(counted.inits, 1);
    TEST_EQ_INT(counted.frees, 1);
}

/*
 * What a wait still waits for, as the MPI transport names it: rank 0 posts an
 * all-gather, the others post theirs only after a barrier rank 0 has not
 * entered yet, so every receive of rank 0 is still open when it asks.
 */
static void test_pending(void)
{
    zr_comm c;
    TEST_OK(zr_comm_init(&c, MPI_COMM_WORLD, NULL));
    int mine = R, *all = calloc((size_t)W, sizeof *all);
    zr_request req = ZR_REQUEST_INIT;
    if (R == 0) {
        TEST_OK(zr_comm_iallgather(&c, ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, &mine, sizeof mine, all,
                                   &req));
        TEST_EQ_INT(req.active, W > 1);
        if (W > 1) {
            zr_pending *out = calloc(2 * (size_t)W, sizeof *out);
            int n = req.transport->pending(&c, &req, out, 2 * W), seen = 0;
            for (int i = 0; i < n; i++) {
                /* receives first, from rank W-1 down to 1 (sends may be done already) */
                if (out[i].recv) {
                    TEST_CHECKF(i == seen && out[i].rank == W - 1 - i, "entry %d: rank %d", i,
                                out[i].rank);
                    seen++;
                }
            }
            TEST_EQ_INT(seen, W - 1);
            free(out);
        }
    }
    TEST_OK(zr_comm_barrier(&c));
    if (R != 0) {
        TEST_OK(zr_comm_iallgather(&c, ZR_GROUP_WORLD, ZR_KIND_ALLGATHER, &mine, sizeof mine, all,
                                   &req));
    }
    TEST_OK(zr_comm_wait(&c, &req));
    TEST_CHECK(!req.active && req.impl == NULL);
    for (int p = 0; p < W; p++) {
        TEST_EQ_INT(all[p], p);
    }
    free(all);
    zr_comm_free(&c);
}

int main(int argc, char **argv)
{
    zr_test_mpi_init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    const char *env = getenv("ZR_RANKS_PER_NODE");
    D = env != NULL ? atoi(env) : W; /* one machine: one real node */
    TEST_RUN(test_groups);
    TEST_RUN(test_layout_errors);
    TEST_RUN(test_exchanges);
    TEST_RUN(test_traffic);
    TEST_RUN(test_control);
    TEST_RUN(test_agree);
    TEST_RUN(test_launch_env);
    TEST_RUN(test_format_ranks);
    TEST_RUN(test_transport);
    TEST_RUN(test_pending);
    return zr_test_finish();
}
