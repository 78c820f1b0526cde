/*
 * comm.c - the life of a communicator: zr_comm_init builds the control plane
 * (a duplicate of world for agreements and notices, the start-up agreement),
 * the groups (topology.c) and the data plane (the MPI transport until
 * zr_comm_use_transport chooses another); zr_comm_free takes them down in
 * the opposite order. Also here: the environment knobs read at start-up
 * (ZR_TIMEOUT, ZR_FAULT_STEP), the abort hook, the settings of the watchdog,
 * and the names of groups and kinds.
 */
#include "comm_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const kind_names[ZR_KIND_COUNT] = {
    [ZR_KIND_ALLGATHER] = "allgather",
    [ZR_KIND_REDUCE_SCATTER] = "reduce_scatter",
    [ZR_KIND_ALLREDUCE] = "allreduce",
    [ZR_KIND_QWZ] = "qwz",
    [ZR_KIND_HPZ] = "hpz",
    [ZR_KIND_QGZ] = "qgz",
    [ZR_KIND_ALLTOALL] = "alltoall",
    [ZR_KIND_CONTROL] = "control",
};

static const char *const group_names[ZR_GROUP_COUNT] = {
    [ZR_GROUP_WORLD] = "world",
    [ZR_GROUP_NODE] = "node",
    [ZR_GROUP_CROSS] = "cross",
    [ZR_GROUP_HPZ] = "hpz",
};

const char *zr_kind_name(zr_kind kind)
{
    return (unsigned)kind < ZR_KIND_COUNT ? kind_names[kind] : "?";
}

const char *zr_group_name(zr_group group)
{
    return (unsigned)group < ZR_GROUP_COUNT ? group_names[group] : "?";
}

zr_status zr_mpi_status_at(int rc, const char *file, int line, const char *call)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) {
        snprintf(msg, sizeof msg, "MPI error code %d", rc);
    }
    return zr_error_at(ZR_ERR_MPI, file, line, "%s failed: %s", call, msg);
}

static MPI_Comm abort_world = MPI_COMM_NULL;

static void abort_with_mpi(int code)
{
    if (abort_world != MPI_COMM_NULL) {
        MPI_Abort(abort_world, code);
    }
    exit(code);
}

void zr_comm_set_timeout(zr_comm *c, double seconds)
{
    c->timeout_s = seconds > 0 ? seconds : 0;
}

void zr_comm_set_step(zr_comm *c, long long step)
{
    c->step = step;
}

void zr_comm_set_fail_fast(zr_comm *c, int on)
{
    c->fail_fast = on;
}

/* ZR_TIMEOUT: seconds (>= 0, 0 = forever); -1 when set but not such a number. */
static double env_timeout(void)
{
    const char *s = getenv("ZR_TIMEOUT");
    if (s == NULL || s[0] == '\0') {
        return ZR_COMM_TIMEOUT_DEFAULT;
    }
    char *end = NULL;
    double v = strtod(s, &end);
    if (*end != '\0' || !(v >= 0.0 && v <= 1e9)) {
        return -1.0;
    }
    return v;
}

/* ZR_FAULT_STEP=R:S[:fail|:stall]; returns 0 when set but malformed. */
static int env_fault(zr_comm *c)
{
    struct zr_comm_control *cp = c->control;
    cp->fault = ZR_FAULT_NONE;
    const char *s = getenv("ZR_FAULT_STEP");
    if (s == NULL || s[0] == '\0') {
        return 1;
    }
    char *end = NULL;
    long r = strtol(s, &end, 10);
    if (end == s || *end != ':' || r < 0) {
        return 0;
    }
    const char *p = end + 1;
    long long step = strtoll(p, &end, 10);
    if (end == p || step < 0) {
        return 0;
    }
    zr_fault_mode mode = ZR_FAULT_FAIL;
    if (strcmp(end, ":stall") == 0) {
        mode = ZR_FAULT_STALL;
    } else if (*end != '\0' && strcmp(end, ":fail") != 0) {
        return 0;
    }
    cp->fault = mode;
    cp->fault_rank = (int)r;
    cp->fault_step = step;
    return 1;
}

/* ---- init and free ----------------------------------------------------------- */

static void teardown(zr_comm *c)
{
    struct zr_comm_control *cp = c->control;
    if (cp == NULL) {
        return;
    }
    zr_comm_transport_free(c);
    zr_comm_groups_free(c);
    zr_comm_notice_free(c);
    if (cp->ctl != MPI_COMM_NULL) {
        MPI_Comm_free(&cp->ctl);
    }
    if (abort_world == cp->mpi[ZR_GROUP_WORLD]) {
        abort_world = MPI_COMM_NULL;
        zr_set_abort_hook(NULL);
    }
    zr_free(cp);
    c->control = NULL;
}

/* World as given, errors as return codes, the log rank and the abort hook. */
static zr_status adopt_world(zr_comm *c, MPI_Comm world)
{
    c->control->mpi[ZR_GROUP_WORLD] = world;
    /* errors come back as return codes so that zr can report them itself */
    ZR_MPI_CHECK(MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN));
    int rank, size;
    ZR_MPI_CHECK(MPI_Comm_rank(world, &rank));
    ZR_MPI_CHECK(MPI_Comm_size(world, &size));
    c->rank[ZR_GROUP_WORLD] = rank;
    c->size[ZR_GROUP_WORLD] = size;
    c->first[ZR_GROUP_WORLD] = 0;
    c->stride[ZR_GROUP_WORLD] = 1;
    zr_log_set_rank(rank);
    abort_world = world;
    zr_set_abort_hook(abort_with_mpi);
    return ZR_OK;
}

static zr_status init_planes(zr_comm *c, MPI_Comm world, const zr_comm_config *cfg)
{
    struct zr_comm_control *cp = c->control;
    ZR_CHECK(adopt_world(c, world));
    zr_comm_config none = {0, 0};
    if (cfg == NULL) {
        cfg = &none;
    }
    double timeout = env_timeout();
    c->timeout_s = timeout >= 0 ? timeout : ZR_COMM_TIMEOUT_DEFAULT;
    int fault_ok = env_fault(c);
    ZR_CHECK(zr_comm_notice_init(c));
    /* the control communicator first: from here on every wait is bounded */
    MPI_Request req = MPI_REQUEST_NULL;
    ZR_MPI_CHECK(MPI_Comm_idup(world, &cp->ctl, &req));
    ZR_CHECK(zr_comm_poll(c, &req, 1, NULL, 0, NULL, "zr_comm_init", ZR_GROUP_WORLD, -1, 0));
    ZR_MPI_CHECK(MPI_Comm_set_errhandler(cp->ctl, MPI_ERRORS_RETURN));
    ZR_CHECK(zr_comm_layout_agree(c, cfg, timeout < 0, !fault_ok));
    ZR_CHECK(zr_comm_notice_post_recv(c));
    ZR_CHECK(zr_comm_groups_build(c, world, cfg));
    /* the data plane: MPI keeps no state of its own (it uses the groups' communicators) */
    c->transport = &zr_transport_mpi;
    c->transport_state = NULL;
    return ZR_OK;
}

zr_status zr_comm_init(zr_comm *c, MPI_Comm world, const zr_comm_config *cfg)
{
    memset(c, 0, sizeof *c);
    c->step = -1;
    ZR_ALLOC(c->control, 1);
    struct zr_comm_control *cp = c->control;
    for (int g = 0; g < ZR_GROUP_COUNT; g++) {
        cp->mpi[g] = MPI_COMM_NULL;
    }
    cp->ctl = MPI_COMM_NULL;
    cp->notice_req = MPI_REQUEST_NULL;
    zr_status st = init_planes(c, world, cfg);
    if (st != ZR_OK) {
        teardown(c);
    }
    return st;
}

void zr_comm_free(zr_comm *c)
{
    teardown(c);
    memset(c, 0, sizeof *c);
}
