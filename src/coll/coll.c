/*
 * coll.c - the life of a collective: begin, the posting gate, test, wait,
 * failure, workspace; and the public dispatchers that pick an algorithm
 * file by wire type.
 *
 * Every algorithm is a state machine behind op->advance(c, op, block):
 * block = 0 does whatever needs no waiting (posts, local work on completed
 * exchanges) and returns; block = 1 does not return before the op is
 * complete. Two ops in flight on one group (say an all-reduce and a
 * prefetching all-gather over the world) post in start order on every rank
 * through the gate below, so the transport's order-based matching pairs the
 * right messages:
 *
 *   start order:      A = all-reduce(world)     B = all-gather(world)
 *   A posts:          RS ....(A waits)........ AG
 *   B may post:                                   ^ only after A's last post
 *   every rank:       world sees A.RS, A.AG, B   (never A.RS, B, A.AG on one
 *                                                 rank and A.RS, A.AG, B on another)
 */
#include "coll_impl.h"

#include <string.h>

/*
 * Ops with posts still pending, in start order. One list per process: zr is
 * driven from one thread (MPI_THREAD_FUNNELED at most), and the list is
 * filtered by communicator where it matters.
 */
static zr_coll_state *registry_head, *registry_tail;

static void registry_add(zr_coll_state *s)
{
    s->prev = registry_tail;
    s->next = NULL;
    if (registry_tail != NULL) {
        registry_tail->next = s;
    } else {
        registry_head = s;
    }
    registry_tail = s;
    s->registered = 1;
}

static void registry_remove(zr_coll_state *s)
{
    if (!s->registered) {
        return;
    }
    if (s->prev != NULL) {
        s->prev->next = s->next;
    } else {
        registry_head = s->next;
    }
    if (s->next != NULL) {
        s->next->prev = s->prev;
    } else {
        registry_tail = s->prev;
    }
    s->prev = s->next = NULL;
    s->registered = 0;
}

zr_status zr_coll_begin(zr_comm *c, zr_coll_op *op, unsigned pending, zr_coll_advance_fn advance,
                        zr_coll_state **st)
{
    if (op == NULL) {
        ZR_FAIL(ZR_ERR_INVALID, "collective: NULL zr_coll_op");
    }
    if (op->active) {
        ZR_FAIL(ZR_ERR_INVALID,
                "collective: this zr_coll_op is still in flight; zr_coll_wait for it before "
                "starting another collective on it");
    }
    if (op->impl == NULL) {
        zr_coll_state *s;
        ZR_ALLOC(s, 1);
        op->impl = s;
    }
    zr_coll_state *s = op->impl;
    memset(s, 0, sizeof *s);
    s->comm = c;
    s->op = op;
    s->pending = pending;
    for (int i = 0; i < 4; i++) {
        ZR_ASSERT(!op->req[i].active);
    }
    op->advance = advance;
    op->phase = 0;
    op->nonfinite = 0;
    op->active = 1;
    if (pending != 0) {
        registry_add(s);
    }
    *st = s;
    return ZR_OK;
}

void zr_coll_end(zr_coll_op *op)
{
    zr_coll_state *s = op->impl;
    if (s != NULL) {
        registry_remove(s);
        s->pending = 0;
    }
    op->active = 0;
}

zr_status zr_coll_fail(zr_comm *c, zr_coll_op *op, zr_status st)
{
    /* where any failure ends the job, the other ranks hear of it before this
     * rank drains: they may be waiting for an exchange it will never post */
    if (c->fail_fast && st != ZR_ERR_REMOTE) {
        zr_comm_notify(c, st);
    }
    /* buffers of posted exchanges belong to MPI until they complete, so an op
     * that gives up still drains them before its workspace can be reused */
    for (int i = 0; i < 4; i++) {
        (void)zr_comm_wait(c, &op->req[i]);
    }
    zr_coll_end(op);
    return st;
}

/* One advance call; a failure ends the op so that it never stays half-active. */
static zr_status step(zr_comm *c, zr_coll_op *op, int block)
{
    zr_status st = op->advance(c, op, block);
    if (st != ZR_OK) {
        return zr_coll_fail(c, op, st);
    }
    return ZR_OK;
}

zr_status zr_coll_kick(zr_comm *c, zr_coll_op *op)
{
    if (!op->active) {
        return ZR_OK;
    }
    return step(c, op, 0);
}

void zr_coll_posted_last(zr_coll_op *op, zr_group g)
{
    zr_coll_state *s = op->impl;
    s->pending &= ~ZR_COLL_BIT(g);
    if (s->pending == 0) {
        registry_remove(s);
    }
}

zr_status zr_coll_gate(zr_comm *c, zr_coll_op *op, zr_group g, int block, int *ok)
{
    zr_coll_state *me = op->impl;
    ZR_ASSERT(me->registered && (me->pending & ZR_COLL_BIT(g)));
again:
    for (zr_coll_state *e = registry_head; e != NULL && e != me; e = e->next) {
        if (e->comm != c || !(e->pending & ZR_COLL_BIT(g))) {
            continue;
        }
        /* an earlier op still has to post on g: it goes first */
        if (block) {
            ZR_CHECK(zr_coll_wait(c, e->op));
        } else {
            zr_coll_op *eop = e->op;
            ZR_CHECK(step(c, eop, 0));
            if (eop->active && e->registered && (e->pending & ZR_COLL_BIT(g))) {
                *ok = 0;
                return ZR_OK;
            }
        }
        goto again; /* the list may have changed under us */
    }
    *ok = 1;
    return ZR_OK;
}

zr_status zr_coll_progress(zr_comm *c, zr_request *req, int block, int *done)
{
    if (block) {
        ZR_CHECK(zr_comm_wait(c, req));
        *done = 1;
        return ZR_OK;
    }
    return zr_comm_test(c, req, done);
}

zr_status zr_coll_reserve(zr_coll_op *op, size_t bytes)
{
    if (bytes <= op->work_cap && op->work != NULL) {
        return ZR_OK;
    }
    zr_free(op->work);
    op->work = NULL;
    op->work_cap = 0;
    ZR_CHECK(zr_alloc_at(&op->work, bytes, __FILE__, __LINE__));
    op->work_cap = bytes;
    return ZR_OK;
}

size_t zr_coll_block_nonfinite(const void *block)
{
    zr_qheader h;
    memcpy(&h, block, sizeof h);
    return h.nonfinite_groups;
}

/* ---- public: life of an op -------------------------------------------------- */

void zr_coll_op_free(zr_coll_op *op)
{
    if (op == NULL) {
        return;
    }
    zr_coll_state *s = op->impl;
    if (op->active && s != NULL) {
        /* the exchanges own our buffers until they complete */
        (void)zr_coll_wait(s->comm, op);
    }
    if (s != NULL) {
        registry_remove(s);
    }
    zr_free(op->work);
    zr_free(op->impl);
    memset(op, 0, sizeof *op);
}

zr_status zr_coll_wait(zr_comm *c, zr_coll_op *op)
{
    if (op == NULL || !op->active) {
        return ZR_OK;
    }
    ZR_CHECK(step(c, op, 1));
    ZR_ASSERT(!op->active);
    return ZR_OK;
}

zr_status zr_coll_test(zr_comm *c, zr_coll_op *op, int *done)
{
    if (op == NULL || !op->active) {
        *done = 1;
        return ZR_OK;
    }
    ZR_CHECK(step(c, op, 0));
    *done = !op->active;
    return ZR_OK;
}

/* ---- public: dispatch by wire type ------------------------------------------ */

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

size_t zr_allgather_work(const zr_comm *c, zr_group g, const zr_wire *wire, zr_dtype in_type,
                         size_t count)
{
    if (wire != NULL && wire->type == ZR_WIRE_QUANT) {
        return zr_allgather_qwz_work(c, g, &wire->q, count);
    }
    return zr_allgather_direct_work(c, g, wire != NULL ? wire->type : ZR_WIRE_F32, in_type, count);
}

size_t zr_reduce_scatter_work(const zr_comm *c, zr_group g, const zr_wire *wire, size_t count)
{
    return zr_rs_direct_work(c, g, wire != NULL ? wire->type : ZR_WIRE_F32, count);
}

zr_status zr_allgather_start(zr_comm *c, zr_group g, zr_kind kind, const zr_wire *wire,
                             zr_dtype in_type, const void *in, size_t count, float *out,
                             zr_coll_op *op)
{
    ZR_CHECK(check_group(c, g, "all-gather"));
    if ((unsigned)kind >= ZR_KIND_COUNT) {
        ZR_FAIL(ZR_ERR_INVALID, "all-gather: unknown traffic kind %d", (int)kind);
    }
    if (in_type != ZR_DTYPE_F32 && in_type != ZR_DTYPE_BF16) {
        ZR_FAIL(ZR_ERR_INVALID, "all-gather: input type must be fp32 or bf16, got %d",
                (int)in_type);
    }
    if (count > 0 && (in == NULL || out == NULL)) {
        ZR_FAIL(ZR_ERR_INVALID, "all-gather: NULL %s buffer", in == NULL ? "input" : "output");
    }
    zr_wire_type t = wire != NULL ? wire->type : ZR_WIRE_F32;
    switch (t) {
    case ZR_WIRE_F32:
    case ZR_WIRE_BF16:
        return zr_allgather_direct_start(c, g, kind, t, in_type, in, count, out, op);
    case ZR_WIRE_QUANT:
        return zr_allgather_qwz_start(c, g, kind, &wire->q, in_type, in, count, out, op);
    }
    ZR_FAIL(ZR_ERR_INVALID, "all-gather: unknown wire type %d", (int)t);
}

zr_status zr_reduce_scatter_start(zr_comm *c, zr_group g, const zr_wire *wire, const float *in,
                                  size_t count, float *out, zr_coll_op *op)
{
    ZR_CHECK(check_group(c, g, "reduce-scatter"));
    if (count > 0 && (in == NULL || out == NULL)) {
        ZR_FAIL(ZR_ERR_INVALID, "reduce-scatter: NULL %s buffer", in == NULL ? "input" : "output");
    }
    zr_wire_type t = wire != NULL ? wire->type : ZR_WIRE_F32;
    if (t == ZR_WIRE_QUANT) {
        ZR_FAIL(ZR_ERR_INVALID, "reduce-scatter: a quantized wire is qgZ's job (zr_qgz_start); "
                                "the exact reduce-scatter takes ZR_WIRE_F32 or ZR_WIRE_BF16");
    }
    if (t != ZR_WIRE_F32 && t != ZR_WIRE_BF16) {
        ZR_FAIL(ZR_ERR_INVALID, "reduce-scatter: unknown wire type %d", (int)t);
    }
    return zr_reduce_scatter_direct_start(c, g, t, in, count, out, op);
}

/* ---- public: blocking conveniences ------------------------------------------ */

zr_status zr_allgather(zr_comm *c, zr_group g, zr_kind kind, const zr_wire *wire, zr_dtype in_type,
                       const void *in, size_t count, float *out, zr_coll_op *op)
{
    ZR_CHECK(zr_allgather_start(c, g, kind, wire, in_type, in, count, out, op));
    return zr_coll_wait(c, op);
}

zr_status zr_reduce_scatter(zr_comm *c, zr_group g, const zr_wire *wire, const float *in,
                            size_t count, float *out, zr_coll_op *op)
{
    ZR_CHECK(zr_reduce_scatter_start(c, g, wire, in, count, out, op));
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
