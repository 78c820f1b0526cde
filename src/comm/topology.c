/*
 * topology.c - the groups: how many ranks share a node (detected, or
 * emulated for tests and demos), the checks a layout must pass, the start-up
 * agreement that every rank was given the same layout, and the node, cross
 * and hpZ communicators; and the same groups without MPI
 * (zr_comm_init_layout), for what must know who is where before or instead
 * of running: the collectives' cost functions and dry engines.
 *
 * Every group is a strided set of world ranks (first + k*stride), which is
 * what node-major placement gives: NODE and HPZ groups are consecutive ranks,
 * CROSS groups have stride D. Keeping that arithmetic in zr_comm means
 * accounting can tell intra-node from inter-node bytes without asking MPI
 * anything, and a transport that is not MPI can map group ranks to world
 * ranks the same way.
 */
#include "comm_impl.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Parse ZR_RANKS_PER_NODE. Returns 0 when unset; -1 when set but not a
 * positive integer (every rank reads the same environment from mpirun, so the
 * verdict is the same everywhere).
 */
static int env_ranks_per_node(void)
{
    const char *s = getenv("ZR_RANKS_PER_NODE");
    if (s == NULL || s[0] == '\0') {
        return 0;
    }
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (*end != '\0' || v <= 0 || v > 1 << 20) {
        return -1;
    }
    return (int)v;
}

int zr_comm_check_placement(const int *leader, const int *local_size, int size, char *why,
                            size_t len)
{
    why[0] = '\0';
    if (size <= 0) {
        snprintf(why, len, "empty world");
        return 0;
    }
    int d = local_size[0];
    for (int r = 0; r < size; r++) {
        if (local_size[r] != d) {
            snprintf(why, len,
                     "nodes hold different numbers of ranks (rank 0's node has %d, rank %d's has "
                     "%d); zr needs the same number of ranks on every node",
                     d, r, local_size[r]);
            return 0;
        }
        if (leader[r] != r / d * d) {
            snprintf(why, len,
                     "ranks of a node are not consecutive (rank %d shares a node with rank %d); "
                     "launch with node-major placement (Open MPI: --map-by slot, the default; "
                     "Slurm: --distribution=block)",
                     r, leader[r]);
            return 0;
        }
    }
    return d;
}

/*
 * Real node detection: ranks sharing memory form a node, named by its lowest
 * world rank. The verdict comes from all-gathered data, so it is the same on
 * every rank.
 */
static zr_status detect_nodes(zr_comm *c, MPI_Comm world, int rank, int size, int *rpn, char *why,
                              size_t n)
{
    MPI_Comm shm;
    ZR_MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shm));
    int mine[2];
    MPI_Comm_size(shm, &mine[1]);
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_Iallreduce(&rank, &mine[0], 1, MPI_INT, MPI_MIN, shm, &req);
    zr_status st = rc == MPI_SUCCESS ? zr_comm_poll(c, &req, 1, NULL, 0, NULL, "node detection",
                                                    ZR_GROUP_NODE, -1, 0)
                                     : zr_mpi_status_at(rc, __FILE__, __LINE__, "MPI_Iallreduce");
    MPI_Comm_free(&shm);
    ZR_CHECK(st);
    /* the gathered pairs, then the same split into two arrays */
    int *all = NULL;
    ZR_ALLOC(all, 4 * (size_t)size);
    int *tmp = all + 2 * size;
    rc = MPI_Iallgather(mine, 2, MPI_INT, all, 2, MPI_INT, world, &req);
    st = rc == MPI_SUCCESS
             ? zr_comm_poll(c, &req, 1, NULL, 0, NULL, "node detection", ZR_GROUP_WORLD, -1, 0)
             : zr_mpi_status_at(rc, __FILE__, __LINE__, "MPI_Iallgather");
    if (st != ZR_OK) {
        goto done;
    }
    for (int r = 0; r < size; r++) {
        tmp[r] = all[2 * r];
        tmp[size + r] = all[2 * r + 1];
    }
    *rpn = zr_comm_check_placement(tmp, tmp + size, size, why, n);
done:
    zr_free(all);
    return st;
}

static zr_status split(zr_comm *c, zr_group g, int color, int key)
{
    ZR_MPI_CHECK(MPI_Comm_split(c->control->mpi[ZR_GROUP_WORLD], color, key, &c->control->mpi[g]));
    ZR_MPI_CHECK(MPI_Comm_rank(c->control->mpi[g], &c->rank[g]));
    ZR_MPI_CHECK(MPI_Comm_size(c->control->mpi[g], &c->size[g]));
    return ZR_OK;
}

/*
 * What must be the same on every rank before any group is built: the
 * emulated node size (a config field or ZR_RANKS_PER_NODE, which MPMD
 * launches and per-node environments can set differently) and the hpZ size.
 * A difference used to surface as an assertion or a hang; here it is a user
 * error naming the ranks and their values. Malformed zr environment knobs are
 * reported at the same point, so that every rank returns the same error.
 */
typedef struct launch_rec {
    int32_t cfg_rpn, hpz, bad_timeout, bad_fault;
    char rpn[64], timeout[64], fault[64];
} launch_rec;

static void env_copy(char *dst, size_t n, const char *name)
{
    const char *v = getenv(name);
    snprintf(dst, n, "%s", v != NULL ? v : "");
}

static void rec_value(const launch_rec *r, int field, char *buf, size_t n)
{
    if (field == 0) {
        snprintf(buf, n, "%s%s%s", r->rpn[0] ? "'" : "", r->rpn[0] ? r->rpn : "unset",
                 r->rpn[0] ? "'" : "");
    } else if (field == 1) {
        snprintf(buf, n, "%d", (int)r->cfg_rpn);
    } else {
        snprintf(buf, n, "%d", (int)r->hpz);
    }
}

static int rec_same(const launch_rec *a, const launch_rec *b, int field)
{
    if (field == 0) {
        return strcmp(a->rpn, b->rpn) == 0;
    }
    return field == 1 ? a->cfg_rpn == b->cfg_rpn : a->hpz == b->hpz;
}

/* The first rank whose ZR_TIMEOUT or ZR_FAULT_STEP did not parse, reported by every rank. */
static zr_status check_env(const launch_rec *all, int W)
{
    for (int r = 0; r < W; r++) {
        char who[32] = "";
        if (W > 1) {
            snprintf(who, sizeof who, "rank %d: ", r);
        }
        if (all[r].bad_timeout) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "%sZR_TIMEOUT='%s' is not a number of seconds from 0 (wait forever) to 1e9",
                    who, all[r].timeout);
        }
        if (all[r].bad_fault) {
            ZR_FAIL(ZR_ERR_INVALID,
                    "%sZR_FAULT_STEP='%s' is not RANK:STEP, RANK:STEP:fail or RANK:STEP:stall", who,
                    all[r].fault);
        }
    }
    return ZR_OK;
}

/*
 * Whether every rank has the same value of one field; if not, an error that
 * lists up to four distinct values with the ranks holding each. cls is
 * scratch space of W ints.
 */
static zr_status check_field(const launch_rec *all, int W, int field, int *cls)
{
    static const char *const names[3] = {"ZR_RANKS_PER_NODE", "ranks_per_node",
                                         "hpZ partition sizes"};
    int differ = 0, k = 0;
    for (int r = 0; r < W; r++) {
        cls[r] = -1;
        for (int q = 0; q < r && cls[r] < 0; q++) {
            if (rec_same(&all[q], &all[r], field)) {
                cls[r] = cls[q];
            }
        }
        if (cls[r] < 0) {
            cls[r] = k++;
        }
        differ |= cls[r] != 0;
    }
    if (!differ) {
        return ZR_OK;
    }
    char msg[900];
    size_t used =
        (size_t)snprintf(msg, sizeof msg, "ranks were started with different %s:", names[field]);
    for (int v = 0; v < k && v < 4 && used < sizeof msg; v++) {
        int first = 0;
        while (cls[first] != v) {
            first++;
        }
        char val[80], ranks[160];
        rec_value(&all[first], field, val, sizeof val);
        zr_comm_format_ranks(ranks, sizeof ranks, cls, W, v);
        used += (size_t)snprintf(msg + used, sizeof msg - used, "%s %s on %s", v ? "," : "", val,
                                 ranks);
    }
    if (field == 0) {
        ZR_FAIL(ZR_ERR_INVALID,
                "%s; give every rank the same value (Open MPI: mpirun -x "
                "ZR_RANKS_PER_NODE=N; MPICH: mpiexec -genv ZR_RANKS_PER_NODE N)",
                msg);
    }
    ZR_FAIL(ZR_ERR_INVALID, "%s; every rank must build the same groups", msg);
}

zr_status zr_comm_layout_agree(zr_comm *c, const zr_comm_config *cfg, int bad_timeout,
                               int bad_fault)
{
    int W = c->size[ZR_GROUP_WORLD];
    launch_rec mine;
    memset(&mine, 0, sizeof mine);
    mine.cfg_rpn = cfg->ranks_per_node;
    mine.hpz = cfg->hpz_size;
    mine.bad_timeout = bad_timeout;
    mine.bad_fault = bad_fault;
    env_copy(mine.rpn, sizeof mine.rpn, "ZR_RANKS_PER_NODE");
    env_copy(mine.timeout, sizeof mine.timeout, "ZR_TIMEOUT");
    env_copy(mine.fault, sizeof mine.fault, "ZR_FAULT_STEP");
    launch_rec *all = NULL;
    int *cls = NULL;
    zr_status st;
    ZR_ALLOC(all, (size_t)W);
    ZR_ALLOC_GOTO(cls, (size_t)W, st, done);
    ZR_CHECK_GOTO(zr_comm_ctl_exchange(c, &mine, sizeof mine, all, -1, "the start-up agreement"),
                  st, done);
    ZR_CHECK_GOTO(check_env(all, W), st, done);
    /* the environment matters only where no config field overrides it */
    int env_used = 1;
    for (int r = 0; r < W; r++) {
        env_used &= all[r].cfg_rpn == 0;
    }
    for (int field = env_used ? 0 : 1; field < 3; field++) {
        ZR_CHECK_GOTO(check_field(all, W, field, cls), st, done);
    }
done:
    zr_free(cls);
    zr_free(all);
    return st;
}

/* The hpZ group size of hpz_size (0: the ranks per node), checked with rpn against size. */
static zr_status check_layout(int size, int rpn, int hpz_size, int *h_out)
{
    if (rpn < 0 || size % rpn != 0) {
        ZR_FAIL(ZR_ERR_INVALID,
                "world of %d ranks is not divisible by %d ranks per node; use a rank count that "
                "is a multiple of the ranks per node",
                size, rpn);
    }
    int h = hpz_size > 0 ? hpz_size : rpn;
    if (hpz_size < 0 || size % h != 0) {
        ZR_FAIL(ZR_ERR_INVALID,
                "world of %d ranks is not divisible by the hpZ partition size %d; choose "
                "zero_hpz_partition_size dividing the world size (usually the ranks per node)",
                size, h);
    }
    if (rpn % h != 0 && h % rpn != 0) {
        ZR_FAIL(ZR_ERR_INVALID,
                "hpZ partition size %d neither divides nor is a multiple of the %d ranks per "
                "node, so its groups would straddle node boundaries",
                h, rpn);
    }
    *h_out = h;
    return ZR_OK;
}

/*
 * Every group's rank, size, first and stride, the node and the node count of
 * world rank `rank` in a layout check_layout accepted (node-major: rank r is
 * on node r / rpn; hpZ groups are h consecutive ranks).
 */
static void set_layout(zr_comm *c, int rank, int size, int rpn, int h)
{
    c->rank[ZR_GROUP_WORLD] = rank;
    c->size[ZR_GROUP_WORLD] = size;
    c->first[ZR_GROUP_WORLD] = 0;
    c->stride[ZR_GROUP_WORLD] = 1;
    c->ranks_per_node = rpn;
    c->n_nodes = size / rpn;
    c->node = rank / rpn;
    c->rank[ZR_GROUP_NODE] = rank % rpn;
    c->size[ZR_GROUP_NODE] = rpn;
    c->first[ZR_GROUP_NODE] = rank / rpn * rpn;
    c->stride[ZR_GROUP_NODE] = 1;
    c->rank[ZR_GROUP_CROSS] = rank / rpn;
    c->size[ZR_GROUP_CROSS] = size / rpn;
    c->first[ZR_GROUP_CROSS] = rank % rpn;
    c->stride[ZR_GROUP_CROSS] = rpn;
    c->rank[ZR_GROUP_HPZ] = rank % h;
    c->size[ZR_GROUP_HPZ] = h;
    c->first[ZR_GROUP_HPZ] = rank / h * h;
    c->stride[ZR_GROUP_HPZ] = 1;
}

/*
 * The ranks per node (from the config, ZR_RANKS_PER_NODE or the hosts the
 * ranks run on) and the hpZ partition size, checked against the world size.
 */
static zr_status choose_layout(zr_comm *c, MPI_Comm world, const zr_comm_config *cfg, int *rpn_out,
                               int *h_out)
{
    int rank = c->rank[ZR_GROUP_WORLD], size = c->size[ZR_GROUP_WORLD];
    char why[512] = "";
    int rpn = cfg->ranks_per_node;
    if (rpn == 0) {
        rpn = env_ranks_per_node();
        if (rpn < 0) {
            ZR_FAIL(ZR_ERR_INVALID, "ZR_RANKS_PER_NODE='%s' is not a positive integer",
                    getenv("ZR_RANKS_PER_NODE"));
        }
    }
    if (rpn > 0) {
        c->emulated = 1;
    } else {
        ZR_CHECK(detect_nodes(c, world, rank, size, &rpn, why, sizeof why));
        if (rpn == 0) {
            ZR_FAIL(ZR_ERR_INVALID, "cannot use this rank placement: %s", why);
        }
    }
    *rpn_out = rpn;
    return check_layout(size, rpn, cfg->hpz_size, h_out);
}

/* The node, cross-node and hpZ communicators of a layout chose_layout accepted. */
static zr_status split_groups(zr_comm *c, int rpn, int h)
{
    int rank = c->rank[ZR_GROUP_WORLD];
    zr_comm want; /* the groups by arithmetic */
    set_layout(&want, rank, c->size[ZR_GROUP_WORLD], rpn, h);
    c->ranks_per_node = want.ranks_per_node;
    c->n_nodes = want.n_nodes;
    c->node = want.node;
    ZR_CHECK(split(c, ZR_GROUP_NODE, rank / rpn, rank));
    ZR_CHECK(split(c, ZR_GROUP_CROSS, rank % rpn, rank));
    ZR_CHECK(split(c, ZR_GROUP_HPZ, rank / h, rank));
    /* the arithmetic must agree with what MPI built */
    for (int g = 1; g < ZR_GROUP_COUNT; g++) {
        ZR_ASSERT(c->rank[g] == want.rank[g] && c->size[g] == want.size[g]);
        c->first[g] = want.first[g];
        c->stride[g] = want.stride[g];
        ZR_ASSERT(zr_comm_world_rank(c, (zr_group)g, c->rank[g]) == rank);
    }
    return ZR_OK;
}

zr_status zr_comm_init_layout(zr_comm *c, int nodes, int ranks_per_node, int hpz_size, int rank)
{
    memset(c, 0, sizeof *c);
    c->step = -1;
    if (nodes < 1 || ranks_per_node < 1) {
        ZR_FAIL(ZR_ERR_INVALID, "a layout needs at least one node and one rank per node, got %dx%d",
                nodes, ranks_per_node);
    }
    if ((long long)nodes * ranks_per_node > INT_MAX) {
        ZR_FAIL(ZR_ERR_INVALID, "a layout of %d nodes x %d ranks has more ranks than an int counts",
                nodes, ranks_per_node);
    }
    int size = nodes * ranks_per_node, h;
    if (rank < 0 || rank >= size) {
        ZR_FAIL(ZR_ERR_INVALID, "rank %d is outside a layout of %d ranks", rank, size);
    }
    ZR_CHECK(check_layout(size, ranks_per_node, hpz_size, &h));
    set_layout(c, rank, size, ranks_per_node, h);
    return ZR_OK;
}

/*
 * Counted, not visited: a group is the strided set first + k*stride, and my
 * node is the world ranks node*D .. node*D+D-1, so the members on my node are
 * the k of one interval (myself among them). The planner prices a layout of
 * millions of ranks in the time of one.
 */
void zr_comm_peers(const zr_comm *c, zr_group g, int *on_node, int *off_node)
{
    long long n = c->size[g], first = c->first[g], stride = c->stride[g] > 0 ? c->stride[g] : 1;
    long long lo = (long long)c->node * c->ranks_per_node - first, hi = lo + c->ranks_per_node - 1;
    /* k in [ceil(lo / stride), floor(hi / stride)] within [0, n - 1] */
    long long k_lo = lo <= 0 ? 0 : (lo + stride - 1) / stride;
    long long k_hi = hi < 0 ? -1 : hi / stride;
    k_hi = k_hi < n - 1 ? k_hi : n - 1;
    long long on = k_hi >= k_lo ? k_hi - k_lo + 1 : 0;
    *on_node = on > 0 ? (int)(on - 1) : 0;
    *off_node = (int)(n - 1 - *on_node);
}

zr_status zr_comm_groups_build(zr_comm *c, MPI_Comm world, const zr_comm_config *cfg)
{
    int rpn, h;
    ZR_CHECK(choose_layout(c, world, cfg, &rpn, &h));
    return split_groups(c, rpn, h);
}

void zr_comm_groups_free(zr_comm *c)
{
    for (int g = 1; g < ZR_GROUP_COUNT; g++) {
        if (c->control->mpi[g] != MPI_COMM_NULL) {
            MPI_Comm_free(&c->control->mpi[g]);
        }
    }
}

MPI_Comm zr_comm_mpi(const zr_comm *c, zr_group g)
{
    ZR_ASSERT((unsigned)g < ZR_GROUP_COUNT && c->control != NULL);
    return c->control->mpi[g];
}

void zr_comm_describe(const zr_comm *c, char *buf, size_t len)
{
    snprintf(buf, len, "%d rank%s = %d node%s x %d (%s), hpZ group %d", c->size[ZR_GROUP_WORLD],
             c->size[ZR_GROUP_WORLD] == 1 ? "" : "s", c->n_nodes, c->n_nodes == 1 ? "" : "s",
             c->ranks_per_node, c->emulated ? "emulated" : "detected", c->size[ZR_GROUP_HPZ]);
}
