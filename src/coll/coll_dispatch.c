/*
 * coll_dispatch.c - the public collectives that have more than one
 * algorithm behind them, and the blocking conveniences.
 *
 * Each such collective has a table of its algorithms (as MPICH lists its
 * algorithms as data): one row per algorithm, naming the wire types it
 * carries, its cost and its start. The dispatcher walks the table and takes
 * the first row that carries the wire's type: all-gather has the exact
 * all-gather (fp32 or bf16 on the wire) and qwZ (quantized wire);
 * reduce-scatter has the exact reduce-scatter, and a quantized wire is
 * refused there (qgZ has its own entry point). The arguments every algorithm
 * shares are checked here, once; the op core (coll.c) never sees which
 * algorithm was chosen.
 */
#include "coll_algo.h"

static zr_status check_group(const zr_comm *c, zr_group g, const char *what)
{
    if ((unsigned)g >= ZR_GROUP_COUNT) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: unknown group %d", what, (int)g);
    }
    if (c == NULL) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: NULL communicator", what);
    }
    return ZR_OK;
}

static zr_status check_dtype(zr_dtype t, const char *what, const char *which)
{
    if (t != ZR_DTYPE_F32 && t != ZR_DTYPE_BF16) {
        ZR_FAIL(ZR_ERR_INVALID, "%s: %s type must be fp32 or bf16, got %d", what, which, (int)t);
    }
    return ZR_OK;
}

/* ---- the algorithms, as data ----------------------------------------------- */

#define WIRE_BIT(t) (1u << (unsigned)(t))

/* the wire a NULL wire means: exact, fp32 */
static const zr_wire F32_WIRE = {.type = ZR_WIRE_F32};

typedef zr_coll_cost (*ag_cost_fn)(const zr_comm *c, zr_group g, zr_kind kind, const zr_wire *w,
                                   zr_dtype in_type, size_t count, zr_dtype out_type);
typedef zr_status (*ag_start_fn)(zr_comm *c, zr_group g, zr_kind kind, const zr_wire *w,
                                 zr_dtype in_type, const void *in, size_t count, zr_dtype out_type,
                                 void *out, zr_coll_op *op);
typedef zr_coll_cost (*rs_cost_fn)(const zr_comm *c, zr_group g, const zr_wire *w, zr_dtype in_type,
                                   size_t count);
typedef zr_status (*rs_start_fn)(zr_comm *c, zr_group g, const zr_wire *w, zr_dtype in_type,
                                 const void *in, size_t count, float *out, zr_coll_op *op);

/* One algorithm of a collective: the wire types it carries (WIRE_BIT each), its cost and its
   start. A row with no start refuses those wires with its reason. A wire that no row prices
   (a row with no cost, or a type no row carries) is priced by the table's first row, the
   exact algorithm, which prices any wire but bf16 as fp32. */
typedef struct ag_algo {
    unsigned wires;
    ag_cost_fn cost;
    ag_start_fn start;
    const char *refusal;
} ag_algo;

typedef struct rs_algo {
    unsigned wires;
    rs_cost_fn cost;
    rs_start_fn start;
    const char *refusal;
} rs_algo;

static zr_coll_cost ag_direct_cost(const zr_comm *c, zr_group g, zr_kind kind, const zr_wire *w,
                                   zr_dtype in_type, size_t count, zr_dtype out_type)
{
    return zr_allgather_direct_cost(c, g, kind, w->type, in_type, count, out_type);
}

static zr_status ag_direct_start(zr_comm *c, zr_group g, zr_kind kind, const zr_wire *w,
                                 zr_dtype in_type, const void *in, size_t count, zr_dtype out_type,
                                 void *out, zr_coll_op *op)
{
    return zr_allgather_direct_start(c, g, kind, w->type, in_type, in, count, out_type, out, op);
}

/* the decode writes either type: no conversion of its own */
static zr_coll_cost ag_qwz_cost(const zr_comm *c, zr_group g, zr_kind kind, const zr_wire *w,
                                zr_dtype in_type, size_t count, zr_dtype out_type)
{
    (void)in_type;
    (void)out_type;
    return zr_allgather_qwz_cost(c, g, kind, &w->q, count);
}

static zr_status ag_qwz_start(zr_comm *c, zr_group g, zr_kind kind, const zr_wire *w,
                              zr_dtype in_type, const void *in, size_t count, zr_dtype out_type,
                              void *out, zr_coll_op *op)
{
    return zr_allgather_qwz_start(c, g, kind, &w->q, in_type, in, count, out_type, out, op);
}

static zr_coll_cost rs_direct_cost(const zr_comm *c, zr_group g, const zr_wire *w, zr_dtype in_type,
                                   size_t count)
{
    return zr_reduce_scatter_direct_cost(c, g, w->type, in_type, count);
}

static zr_status rs_direct_start(zr_comm *c, zr_group g, const zr_wire *w, zr_dtype in_type,
                                 const void *in, size_t count, float *out, zr_coll_op *op)
{
    return zr_reduce_scatter_direct_start(c, g, w->type, in_type, in, count, out, op);
}

static const ag_algo allgather_algos[] = {
    {WIRE_BIT(ZR_WIRE_F32) | WIRE_BIT(ZR_WIRE_BF16), ag_direct_cost, ag_direct_start, NULL},
    {WIRE_BIT(ZR_WIRE_QUANT), ag_qwz_cost, ag_qwz_start, NULL},
};

static const rs_algo reduce_scatter_algos[] = {
    {WIRE_BIT(ZR_WIRE_F32) | WIRE_BIT(ZR_WIRE_BF16), rs_direct_cost, rs_direct_start, NULL},
    {WIRE_BIT(ZR_WIRE_QUANT), NULL, NULL,
     "a quantized wire is qgZ's job (zr_qgz_start); the exact reduce-scatter takes ZR_WIRE_F32 "
     "or ZR_WIRE_BF16"},
};

#define NALGOS(tab) (sizeof(tab) / sizeof((tab)[0]))

/* Does a row with wire bits `wires` carry wire type t? (an out-of-range t: no row does) */
static int carries(unsigned wires, zr_wire_type t)
{
    return (unsigned)t < 32 && (wires & WIRE_BIT(t)) != 0;
}

/* The first all-gather row that carries t, or NULL. */
static const ag_algo *allgather_algo(zr_wire_type t)
{
    for (size_t i = 0; i < NALGOS(allgather_algos); i++) {
        if (carries(allgather_algos[i].wires, t)) {
            return &allgather_algos[i];
        }
    }
    return NULL;
}

/* The first reduce-scatter row that carries t, or NULL. */
static const rs_algo *reduce_scatter_algo(zr_wire_type t)
{
    for (size_t i = 0; i < NALGOS(reduce_scatter_algos); i++) {
        if (carries(reduce_scatter_algos[i].wires, t)) {
            return &reduce_scatter_algos[i];
        }
    }
    return NULL;
}

/* ---- public: costs and starts ------------------------------------------------ */

zr_coll_cost zr_allgather_cost(const zr_comm *c, zr_group g, zr_kind kind, const zr_wire *wire,
                               zr_dtype in_type, size_t count, zr_dtype out_type)
{
    const zr_wire *w = wire != NULL ? wire : &F32_WIRE;
    const ag_algo *a = allgather_algo(w->type);
    ag_cost_fn cost = a != NULL && a->cost != NULL ? a->cost : allgather_algos[0].cost;
    return cost(c, g, kind, w, in_type, count, out_type);
}

zr_coll_cost zr_reduce_scatter_cost(const zr_comm *c, zr_group g, const zr_wire *wire,
                                    zr_dtype in_type, size_t count)
{
    const zr_wire *w = wire != NULL ? wire : &F32_WIRE;
    const rs_algo *a = reduce_scatter_algo(w->type);
    rs_cost_fn cost = a != NULL && a->cost != NULL ? a->cost : reduce_scatter_algos[0].cost;
    return cost(c, g, w, in_type, count);
}

zr_status zr_allgather_start(zr_comm *c, zr_group g, zr_kind kind, const zr_wire *wire,
                             zr_dtype in_type, const void *in, size_t count, zr_dtype out_type,
                             void *out, zr_coll_op *op)
{
    ZR_CHECK(check_group(c, g, "all-gather"));
    if ((unsigned)kind >= ZR_KIND_COUNT) {
        ZR_FAIL(ZR_ERR_INVALID, "all-gather: unknown traffic kind %d", (int)kind);
    }
    ZR_CHECK(check_dtype(in_type, "all-gather", "input"));
    ZR_CHECK(check_dtype(out_type, "all-gather", "output"));
    if (count > 0 && (in == NULL || out == NULL)) {
        ZR_FAIL(ZR_ERR_INVALID, "all-gather: NULL %s buffer", in == NULL ? "input" : "output");
    }
    const zr_wire *w = wire != NULL ? wire : &F32_WIRE;
    const ag_algo *a = allgather_algo(w->type);
    if (a == NULL) {
        ZR_FAIL(ZR_ERR_INVALID, "all-gather: unknown wire type %d", (int)w->type);
    }
    if (a->start == NULL) {
        ZR_FAIL(ZR_ERR_INVALID, "all-gather: %s", a->refusal);
    }
    return a->start(c, g, kind, w, in_type, in, count, out_type, out, op);
}

zr_status zr_reduce_scatter_start(zr_comm *c, zr_group g, const zr_wire *wire, zr_dtype in_type,
                                  const void *in, size_t count, float *out, zr_coll_op *op)
{
    ZR_CHECK(check_group(c, g, "reduce-scatter"));
    ZR_CHECK(check_dtype(in_type, "reduce-scatter", "input"));
    if (count > 0 && (in == NULL || out == NULL)) {
        ZR_FAIL(ZR_ERR_INVALID, "reduce-scatter: NULL %s buffer", in == NULL ? "input" : "output");
    }
    const zr_wire *w = wire != NULL ? wire : &F32_WIRE;
    const rs_algo *a = reduce_scatter_algo(w->type);
    if (a == NULL) {
        ZR_FAIL(ZR_ERR_INVALID, "reduce-scatter: unknown wire type %d", (int)w->type);
    }
    if (a->start == NULL) {
        ZR_FAIL(ZR_ERR_INVALID, "reduce-scatter: %s", a->refusal);
    }
    return a->start(c, g, w, in_type, in, count, out, op);
}

/* ---- public: blocking conveniences ------------------------------------------ */

zr_status zr_allgather(zr_comm *c, zr_group g, zr_kind kind, const zr_wire *wire, zr_dtype in_type,
                       const void *in, size_t count, zr_dtype out_type, void *out, zr_coll_op *op)
{
    ZR_CHECK(zr_allgather_start(c, g, kind, wire, in_type, in, count, out_type, out, op));
    return zr_coll_wait(c, op);
}

zr_status zr_reduce_scatter(zr_comm *c, zr_group g, const zr_wire *wire, zr_dtype in_type,
                            const void *in, size_t count, float *out, zr_coll_op *op)
{
    ZR_CHECK(zr_reduce_scatter_start(c, g, wire, in_type, in, count, out, op));
    return zr_coll_wait(c, op);
}

zr_status zr_allreduce(zr_comm *c, zr_group g, const zr_wire *wire, float *buf, size_t count,
                       zr_coll_op *op)
{
    ZR_CHECK(zr_allreduce_start(c, g, wire, buf, count, op));
    return zr_coll_wait(c, op);
}

zr_status zr_qgz(zr_comm *c, const zr_qgz_config *cfg, zr_dtype in_type, const void *in,
                 size_t count, float *out, zr_qgz_feedback *fb, zr_coll_op *op)
{
    ZR_CHECK(zr_qgz_start(c, cfg, in_type, in, count, out, fb, op));
    return zr_coll_wait(c, op);
}
