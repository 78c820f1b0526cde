/*
 * pool.c - the engine's pool of transient memory: gathered units, gradient
 * buffers and staging buffers being reduced, and the collective ops with
 * their workspaces are taken from it and handed back, never freed during a
 * run.
 *
 * Buffers are bytes, whatever their elements (an fp32 staging buffer, a bf16
 * gathered unit). A buffer is reused for a request of its size (or up to 1/8
 * smaller), so the pool holds, per size, the most buffers of that size ever
 * in use at once: after the first steps it stops growing, and it does not grow with
 * the number of units. An idle op is handed out most recently used first,
 * so its workspace is warm; a later step can hand a small op a large
 * collective and grow it, which is why the pool's peak settles only after a
 * few steps. The pool's bytes are its buffers plus every op's workspace.
 *
 * A dry engine's pool runs the same logic over sizes: each buffer is a
 * one-float token (distinct, never read), and its ops' workspaces are the
 * sizes the collectives say they would reserve, so its peak is the real
 * engine's, exactly.
 *
 * Buffers are the engine's memory (buffers.c): host memory, or a device
 * engine's GPU, where a fresh buffer is zeroed on the engine's stream and a
 * reused one is handed out at once (whatever still reads it was queued on
 * that stream, or on a collective that has completed).
 */
#include "zero_impl.h"

#include <string.h>

typedef struct pool_buf {
    void *ptr;
    size_t cap; /* bytes */
    int busy;
} pool_buf;

typedef struct pool_op {
    zr_coll_op op;
    int busy;
} pool_op;

struct zr_engine_pool {
    pool_buf *bufs;
    int nbufs, cap_bufs;
    pool_op **ops; /* ops do not move: the collective layer keeps pointers to them */
    int nops, cap_ops;
    size_t buf_bytes; /* pooled buffers, busy or not */
    size_t now, peak; /* buffers + op workspaces */
    int dry;          /* buffers are tokens */
};

/* Grow an array of elem-byte entries from *cap to at least need entries. */
static zr_status grow_array(void **arr, int *cap, int need, size_t elem)
{
    if (need <= *cap) {
        return ZR_OK;
    }
    int ncap = *cap < 8 ? 8 : *cap * 2;
    while (ncap < need) {
        ncap *= 2;
    }
    unsigned char *n;
    ZR_ALLOC(n, (size_t)ncap * elem);
    if (*arr != NULL) {
        memcpy(n, *arr, (size_t)*cap * elem);
    }
    zr_free(*arr);
    *arr = n;
    *cap = ncap;
    return ZR_OK;
}

zr_status zr_engine_pool_init(zr_engine *e)
{
    ZR_ALLOC(e->pool, 1);
    e->pool->dry = zr_engine_is_dry(e);
    return ZR_OK;
}

void zr_engine_pool_account(zr_engine_pool *p)
{
    size_t now = p->buf_bytes;
    for (int i = 0; i < p->nops; i++) {
        now += p->ops[i]->op.work_cap;
    }
    p->now = now;
    if (now > p->peak) {
        p->peak = now;
    }
}

zr_status zr_engine_pool_get(zr_engine *e, size_t n, int zero, void **out)
{
    zr_engine_pool *p = e->pool;
    int best = -1;
    for (int i = 0; i < p->nbufs; i++) {
        pool_buf *b = &p->bufs[i];
        if (!b->busy && b->cap >= n && b->cap - n <= n / 8 &&
            (best < 0 || b->cap < p->bufs[best].cap)) {
            best = i;
        }
    }
    if (best < 0) {
        ZR_CHECK(grow_array((void **)&p->bufs, &p->cap_bufs, p->nbufs + 1, sizeof(pool_buf)));
        pool_buf *b = &p->bufs[p->nbufs];
        /* a zero-byte request still gets a distinct buffer (the tokens of a dry engine too) */
        ZR_CHECK(zr_engine_buf_alloc(e, &b->ptr, n == 0 ? sizeof(float) : n, __FILE__, __LINE__));
        b->cap = n;
        b->busy = 0;
        best = p->nbufs++;
        p->buf_bytes += n;
        zr_engine_pool_account(p);
        zero = 0; /* fresh allocations are zero */
    }
    pool_buf *b = &p->bufs[best];
    b->busy = 1;
    if (zero) {
        ZR_CHECK(zr_engine_buf_zero(e, b->ptr, n));
    }
    *out = b->ptr;
    return ZR_OK;
}

void zr_engine_pool_put(zr_engine_pool *p, void *ptr)
{
    if (ptr == NULL) {
        return;
    }
    for (int i = 0; i < p->nbufs; i++) {
        if (p->bufs[i].ptr == ptr) {
            ZR_ASSERT(p->bufs[i].busy);
            p->bufs[i].busy = 0;
            return;
        }
    }
    ZR_ASSERT(!"buffer handed back to a pool that does not own it");
}

zr_status zr_engine_pool_get_op(zr_engine_pool *p, zr_coll_op **out)
{
    for (int i = p->nops - 1; i >= 0; i--) {
        if (!p->ops[i]->busy) {
            p->ops[i]->busy = 1;
            *out = &p->ops[i]->op;
            return ZR_OK;
        }
    }
    ZR_CHECK(grow_array((void **)&p->ops, &p->cap_ops, p->nops + 1, sizeof(pool_op *)));
    pool_op *o;
    ZR_ALLOC(o, 1);
    o->busy = 1;
    p->ops[p->nops++] = o;
    *out = &o->op;
    return ZR_OK;
}

void zr_engine_pool_put_op(zr_engine_pool *p, zr_coll_op *op)
{
    if (op == NULL) {
        return;
    }
    zr_engine_pool_account(p); /* the op's workspace may have grown */
    /* op is the first member of its pool_op */
    pool_op *o = (pool_op *)(void *)op;
    ZR_ASSERT(o->busy);
    o->busy = 0;
}

void zr_engine_pool_bytes(const zr_engine_pool *p, size_t *now, size_t *peak)
{
    *now = p->now;
    *peak = p->peak;
}

void zr_engine_pool_free(zr_engine *e)
{
    zr_engine_pool *p = e->pool;
    if (p == NULL) {
        return;
    }
    for (int i = 0; i < p->nops; i++) {
        if (!p->dry) {
            (void)zr_coll_wait(e->comm, &p->ops[i]->op); /* buffers go only after their exchanges */
        }
        zr_coll_op_free(&p->ops[i]->op);
        zr_free(p->ops[i]);
    }
    for (int i = 0; i < p->nbufs; i++) {
        zr_engine_buf_free(e, p->bufs[i].ptr);
    }
    zr_free(p->ops);
    zr_free(p->bufs);
    zr_free(p);
    e->pool = NULL;
}
