/*
 * coll.c - the op core: the life of a collective (begin, the posting gate,
 * test, wait, failure, workspace). It runs every algorithm through the
 * zr_coll_algo the algorithm registered at start and keeps the algorithm's
 * state in storage it does not look into, so it names no algorithm; the
 * public dispatchers that pick one live in coll_dispatch.c.
 *
 * Every algorithm is a state machine behind algo->advance(c, op, block):
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
 *
 * Device buffers. When the communicator's transport is a device one, an op
 * runs its local work through the CUDA table of coll_local.c on a codec
 * stream it keeps (with its workspace in device memory), and its exchanges
 * follow that stream. Its last step then only queues work, so the op stays
 * in flight (finishing) until the host sees the codec stream's final event
 * and the received headers pass validation; test and wait poll that here,
 * and a failure drains the codec stream before the workspace can be reused.
 * All of it goes through the op's table (zr_coll_local: start, finish,
 * poll, drain, follow), picked once at begin; the CPU's members do nothing.
 */
#include "coll_impl.h"

#include <stddef.h>
#include <string.h>

/* What an op keeps from one collective to the next (its resources). */
typedef struct zr_coll_keep {
    zr_coll_dev *dev;   /* the device part (codec stream, events); NULL until a device op */
    zr_device work_dev; /* where op->work lives (the CPU: host memory) */
    void *scratch;      /* zr_coll_host_scratch */
    size_t scratch_cap;
} zr_coll_keep;

/* What zr_coll_op.impl points to: the op core's bookkeeping and the algorithm's state. */
typedef struct zr_coll_state {
    zr_comm *comm;
    struct zr_coll_op *op;
    const zr_coll_algo *algo;          /* what runs the op */
    struct zr_coll_state *prev, *next; /* registry of ops with posts pending, start order */
    unsigned pending;                  /* bit g: this op will still post on group g */
    int registered;
    const zr_coll_local *local; /* the local work: zr_coll_local_cpu or _cuda */
    zr_device where;            /* where the op's buffers and workspace live */
    int finishing;              /* the last step is queued, completion is polled (a device) */
    zr_coll_keep keep;
    union {
        max_align_t align;
        unsigned char bytes[ZR_COLL_STATE_BYTES];
    } algo_state; /* the algorithm's own, opaque here */
} zr_coll_state;

/*
 * Ops with posts still pending, in start order. One list per process: zr is
 * driven from one thread (MPI_THREAD_FUNNELED at most), and the list is
 * filtered by communicator where it matters.
 */
static zr_coll_state *registry_head, *registry_tail;

/* The local work of each device kind. */
static const zr_coll_local *const by_kind[] = {
    [ZR_DEVICE_CPU] = &zr_coll_local_cpu,
    [ZR_DEVICE_CUDA] = &zr_coll_local_cuda,
};

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

zr_status zr_coll_begin(zr_comm *c, zr_coll_op *op, const zr_coll_algo *algo, unsigned pending,
                        void **state)
{
    ZR_ASSERT(algo != NULL && algo->advance != NULL);
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
    zr_coll_keep keep = s->keep;
    memset(s, 0, sizeof *s);
    s->keep = keep;
    s->comm = c;
    s->op = op;
    s->algo = algo;
    s->pending = pending;
    for (int i = 0; i < 4; i++) {
        ZR_ASSERT(!op->req[i].active);
    }
    zr_stream *follow = NULL;
    s->local = zr_coll_local_for(c, &s->where, &follow);
    /* device buffers: the op's local work goes to its codec stream, after the followed
       stream's work (which wrote the inputs) */
    ZR_CHECK(s->local->start(&s->keep.dev, &s->where, follow));
    op->phase = 0;
    op->nonfinite = 0;
    op->active = 1;
    if (pending != 0) {
        registry_add(s);
    }
    *state = s->algo_state.bytes;
    return ZR_OK;
}

const zr_coll_local *zr_coll_local_for(const zr_comm *c, zr_device *where, zr_stream **follow)
{
    const zr_device *dev = zr_comm_device(c, follow);
    *where = dev != NULL ? *dev : zr_device_cpu();
    return by_kind[where->kind];
}

void *zr_coll_algo_state(zr_coll_op *op)
{
    zr_coll_state *s = op->impl;
    return s->algo_state.bytes;
}

void zr_coll_end(zr_coll_op *op)
{
    zr_coll_state *s = op->impl;
    if (s != NULL) {
        registry_remove(s);
        s->pending = 0;
        s->finishing = 0;
    }
    op->active = 0;
}

zr_status zr_coll_finish(zr_coll_op *op)
{
    zr_coll_state *s = op->impl;
    registry_remove(s);
    s->pending = 0;
    int done = 0;
    ZR_CHECK(s->local->finish(s->keep.dev, &done));
    if (done) {
        zr_coll_end(op);
    } else {
        s->finishing = 1;
    }
    return ZR_OK;
}

const zr_coll_local *zr_coll_local_of(zr_coll_op *op, void **x)
{
    zr_coll_state *s = op->impl;
    *x = s->keep.dev; /* the CPU's members do not look at it */
    return s->local;
}

static zr_status exchange(zr_comm *c, zr_coll_op *op, int alltoall, zr_group g, zr_kind kind,
                          const void *send, size_t bytes, void *recv, zr_request *req)
{
    zr_coll_state *s = op->impl;
    zr_stream *prev = NULL;
    ZR_CHECK(s->local->follow(s->keep.dev, c, &prev));
    zr_status st = alltoall ? zr_comm_ialltoall(c, g, kind, send, bytes, recv, req)
                            : zr_comm_iallgather(c, g, kind, send, bytes, recv, req);
    zr_status back = s->local->unfollow(s->keep.dev, c, prev);
    return st != ZR_OK ? st : back;
}

zr_status zr_coll_iallgather(zr_comm *c, zr_coll_op *op, zr_group g, zr_kind kind, const void *send,
                             size_t bytes, void *recv, zr_request *req)
{
    return exchange(c, op, 0, g, kind, send, bytes, recv, req);
}

zr_status zr_coll_ialltoall(zr_comm *c, zr_coll_op *op, zr_group g, zr_kind kind, const void *send,
                            size_t bytes, void *recv, zr_request *req)
{
    return exchange(c, op, 1, g, kind, send, bytes, recv, req);
}

zr_status zr_coll_host_scratch(zr_coll_op *op, size_t bytes, void **out)
{
    zr_coll_state *s = op->impl;
    if (s->keep.scratch == NULL || s->keep.scratch_cap < bytes) {
        zr_free(s->keep.scratch);
        s->keep.scratch = NULL;
        s->keep.scratch_cap = 0;
        unsigned char *scratch;
        ZR_ALLOC(scratch, bytes);
        s->keep.scratch = scratch;
        s->keep.scratch_cap = bytes;
    }
    *out = s->keep.scratch;
    return ZR_OK;
}

zr_status zr_coll_fail(zr_comm *c, zr_coll_op *op, zr_status st)
{
    const zr_coll_state *s = op->impl;
    ZR_DEBUG("collective %s failed (%s); draining its exchanges", s->algo->name, zr_status_str(st));
    /* where any failure ends the job, the other ranks hear of it before this
     * rank drains: they may be waiting for an exchange it will never post */
    if (c->fail_fast && st != ZR_ERR_REMOTE) {
        zr_comm_notify(c, st);
    }
    /* buffers of posted exchanges belong to the transport until they complete,
     * so an op that gives up still drains them before its workspace is reused */
    for (int i = 0; i < 4; i++) {
        (void)zr_comm_wait(c, &op->req[i]);
    }
    /* and so does the work queued on the codec stream */
    s->local->drain(s->keep.dev);
    zr_coll_end(op);
    return st;
}

/*
 * One advance call; a failure ends the op so that it never stays half-active.
 * On a device the op completes once its codec stream has run everything.
 */
static zr_status step(zr_comm *c, zr_coll_op *op, int block)
{
    const zr_coll_state *s = op->impl;
    zr_status st = ZR_OK;
    if (!s->finishing) {
        st = s->algo->advance(c, op, block);
    }
    if (st == ZR_OK && s->finishing) {
        int done = 0;
        st = s->local->poll(c, s->keep.dev, op, block, &done);
        if (st == ZR_OK && done) {
            zr_coll_end(op);
        }
    }
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

/* The workspace goes back to where it lives (an op never begun has none). */
static void work_free(zr_coll_op *op, zr_coll_state *s)
{
    if (s != NULL) {
        zr_device_free(&s->keep.work_dev, op->work);
    } else {
        zr_free(op->work);
    }
    op->work = NULL;
    op->work_cap = 0;
}

zr_status zr_coll_reserve(zr_coll_op *op, size_t bytes)
{
    zr_coll_state *s = op->impl;
    if (bytes <= op->work_cap && op->work != NULL && zr_device_same(&s->where, &s->keep.work_dev)) {
        return ZR_OK;
    }
    work_free(op, s);
    /* device memory through the counted allocator; host memory zeroed, as before */
    ZR_CHECK(zr_device_alloc_at(&s->where, &op->work, bytes, __FILE__, __LINE__));
    s->keep.work_dev = s->where;
    op->work_cap = bytes;
    return ZR_OK;
}

void zr_coll_cost_send(const zr_comm *c, zr_group g, size_t bytes, int hop, zr_coll_cost *k)
{
    int on, off;
    zr_comm_peers(c, g, &on, &off);
    k->exchanges++;
    k->intra[hop] += (uint64_t)on * bytes;
    k->inter[hop] += (uint64_t)off * bytes;
    k->intra_msgs[hop] += bytes > 0 ? (uint64_t)on : 0;
    k->inter_msgs[hop] += bytes > 0 ? (uint64_t)off : 0;
}

size_t zr_coll_block_nonfinite(const void *block)
{
    zr_quant_header h;
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
        zr_free(s->keep.scratch);
    }
    work_free(op, s);
    if (s != NULL) {
        zr_coll_dev_free(s->keep.dev);
    }
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
