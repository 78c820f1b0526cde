/*
 * zero_impl.h - what the files of src/zero share: a unit's state, the pool
 * of transient buffers and ops (pool.c), and the engine's door to the
 * collectives (exchange.c), through which a dry engine reports instead of
 * running.
 *
 *   engine.c     plan, configuration, init / free, parameters in and out,
 *                memory accounting and prediction
 *   pool.c       transient buffers and collective ops, reused by size
 *   lifecycle.c  stage-3 gathers (prefetch, fetch, release, hpZ secondaries)
 *                and gradient reductions in flight
 *   step.c       the optimizer step: remaining reductions, norm, AdamW,
 *                refresh of replicated parameters
 *   exchange.c   every collective start and wait, real or dry; dry runs
 *   buffers.c    the engine's buffer work behind a table (zr_engine_bufs):
 *                placement, the host and dry instances; buffers_cuda.c
 *                the device instance
 */
#ifndef ZR_ZERO_IMPL_H
#define ZR_ZERO_IMPL_H

#include "zr/optim.h"
#include "zr/zero.h"

struct zr_unit_state {
    size_t numel, padded, shard;
    int nranges;
    const zr_range *ranges;

    void *full;         /* zr_engine_param_type; owned (stages 0-2) or pooled; see engine.c */
    int full_is_master; /* full aliases master (stage 0) */
    int gathered;       /* stage 3: full holds the current parameters */
    int inflight;       /* stage 3: a gather into full is in flight */
    int from_primary;   /* the gather in full came from the primary shards */
    int prefetched;     /* the gather was started ahead of use (counts in e->prefetched) */
    zr_coll_op *gop;    /* pooled; the gather in flight into full */

    void *secondary; /* owned; hpZ slice, sec_count elements of sec_type */
    size_t sec_count;
    zr_dtype sec_type;
    int sec_valid;

    void *grad_full;   /* zr_engine_grad_type: owned fp32 (replicated grads) or pooled (sharded) */
    float *grad_shard; /* owned; sharded grads: S floats */
    float *grad_tmp;   /* reduce-scatter output, S floats: owned (stage 1) or pooled */
    int grad_inflight;
    zr_coll_op *rop; /* pooled; the reduction in flight */
    zr_qgz_feedback fb;

    float *master, *m, *v; /* owned; S or P floats each */
};

static inline int zr_engine_is_dry(const zr_engine *e)
{
    return e->dry.event != NULL;
}

static inline int zr_engine_rank(const zr_engine *e)
{
    return e->comm->rank[ZR_GROUP_WORLD];
}

/* The types of a unit's `full` and `grad_full`. */
static inline zr_dtype zr_engine_full_type(const zr_engine *e)
{
    return zr_engine_param_type(&e->cfg);
}

static inline zr_dtype zr_engine_grad_full_type(const zr_engine *e)
{
    return zr_engine_grad_type(&e->cfg);
}

/* ---- buffers.c, buffers_cuda.c -------------------------------------------- */

/*
 * The engine's buffer work, in ggml_backend_i's manner: one table per place
 * the state can live, chosen once by zr_engine_place (e->bufs) and called
 * through by the rest of src/zero, which never asks where it runs.
 *   zr_engine_bufs_host    host memory, every operation done at once
 *   zr_engine_bufs_cuda    the communicator's GPU, work queued on the stream
 *                          it follows (buffers_cuda.c)
 *   zr_engine_bufs_dry     host tokens; nothing runs, waits are reported
 * Every member is set in every instance.
 */
struct zr_engine_bufs {
    const char *name; /* "host", "cuda", "dry" */
    /* set up / free what the instance keeps per engine (the device's step scratch) */
    zr_status (*place)(zr_engine *e, zr_stream *follow);
    void (*unplace)(zr_engine *e);
    /* bytes of zeroed engine memory (a dry engine: a host token) */
    zr_status (*alloc)(zr_engine *e, void **p, size_t bytes, const char *file, int line);
    void (*free)(zr_engine *e, void *p);
    /* engine memory set to zero; copied (engine memory, or host memory on either side) */
    zr_status (*zero)(zr_engine *e, void *p, size_t bytes);
    zr_status (*copy)(zr_engine *e, void *dst, const void *src, size_t bytes);
    /* wait until the engine's queued work has run (the host's is done already) */
    zr_status (*sync)(zr_engine *e);
    /* acc[i] += x[i] */
    zr_status (*add)(zr_engine *e, float *acc, const float *x, size_t n);
    /* zr_adamw_update at step e->step */
    zr_status (*adamw)(zr_engine *e, const zr_adamw *h, float lr, float grad_scale, int decay,
                       float *param, const float *grad, float *m, float *v, size_t n);
    /* unit u's sum of squares of x into *sq (host: added now; device: queued, added in unit
       order by sumsq_finish) */
    zr_status (*sumsq)(zr_engine *e, int u, const float *x, size_t n, double *sq);
    zr_status (*sumsq_finish)(zr_engine *e, double *sq);
    /*
     * Wait for the collective on op, counting the blocked time as exposed
     * communication: the host adds the wall clock since `since` to
     * e->t_comm; a device marks its stream just before and just after the
     * wait (buffers_cuda.c's head); a dry engine reports the wait.
     */
    zr_status (*wait)(zr_engine *e, zr_coll_op *op, double since);
    /* a new step: forget the marks of the last */
    void (*marks_reset)(zr_engine *e);
    /* once the step's work has run: a device sets e->t_comm to the stream's idle time between
       its marks since the reset; the host's e->t_comm is counted already */
    zr_status (*exposed)(zr_engine *e);
};

extern const zr_engine_bufs zr_engine_bufs_host;
extern const zr_engine_bufs zr_engine_bufs_cuda;
extern const zr_engine_bufs zr_engine_bufs_dry;

/*
 * Place the engine's state: on the communicator's GPU when its transport is a
 * device one (allocating the norm's scratch), else in host memory; sets
 * e->bufs. Called once by init, before anything is allocated; unplace frees
 * the scratch.
 */
zr_status zr_engine_place(zr_engine *e);
void zr_engine_unplace(zr_engine *e);

/* The table's members as the engine's files call them. */
static inline zr_status zr_engine_buf_alloc(zr_engine *e, void **p, size_t bytes, const char *file,
                                            int line)
{
    return e->bufs->alloc(e, p, bytes, file, line);
}

static inline void zr_engine_buf_free(zr_engine *e, void *p)
{
    e->bufs->free(e, p);
}

#define ZR_ENGINE_ALLOC(e, ptr, count)                                                             \
    ZR_CHECK(zr_engine_buf_alloc((e), (void **)&(ptr), zr_mul_size_((count), sizeof *(ptr)),       \
                                 __FILE__, __LINE__))

static inline zr_status zr_engine_buf_zero(zr_engine *e, void *p, size_t bytes)
{
    return e->bufs->zero(e, p, bytes);
}

static inline zr_status zr_engine_buf_copy(zr_engine *e, void *dst, const void *src, size_t bytes)
{
    return e->bufs->copy(e, dst, src, bytes);
}

static inline zr_status zr_engine_buf_sync(zr_engine *e)
{
    return e->bufs->sync(e);
}

static inline zr_status zr_engine_buf_add(zr_engine *e, float *acc, const float *x, size_t n)
{
    return e->bufs->add(e, acc, x, n);
}

/* ---- pool.c ---------------------------------------------------------------- */

/*
 * e's pool (in e->pool), in the engine's memory (buffers.c); dry: buffers are
 * one-float tokens (sizes are tracked, payloads are not held).
 */
zr_status zr_engine_pool_init(zr_engine *e);
/* Hand every buffer and op of e's pool back; a real engine finishes ops in flight first. */
void zr_engine_pool_free(zr_engine *e);
/* A buffer of at least bytes, zeroed if asked; reused when one of close size is free. */
zr_status zr_engine_pool_get(zr_engine *e, size_t bytes, int zero, void **out);
void zr_engine_pool_put(zr_engine_pool *p, void *ptr);
/* An idle collective op; the most recently used first (its workspace is warm). */
zr_status zr_engine_pool_get_op(zr_engine_pool *p, zr_coll_op **out);
void zr_engine_pool_put_op(zr_engine_pool *p, zr_coll_op *op);
/* Recount the pool's bytes (buffers + op workspaces) after a workspace may have grown. */
void zr_engine_pool_account(zr_engine_pool *p);
/* Bytes held now and at the peak since the pool was made. */
void zr_engine_pool_bytes(const zr_engine_pool *p, size_t *now, size_t *peak);

/* ---- exchange.c ------------------------------------------------------------- */

/* Start a collective on op (zr_*_start), or report it when dry. */
zr_status zr_engine_allgather(zr_engine *e, zr_group g, zr_kind kind, const zr_wire *wire,
                              zr_dtype in_type, const void *in, size_t count, zr_dtype out_type,
                              void *out, zr_coll_op *op);
zr_status zr_engine_reduce_scatter(zr_engine *e, zr_dtype in_type, const void *in, size_t count,
                                   float *out, zr_coll_op *op);
zr_status zr_engine_allreduce(zr_engine *e, float *buf, size_t count, zr_coll_op *op);
zr_status zr_engine_qgz(zr_engine *e, zr_dtype in_type, const void *in, size_t count, float *out,
                        zr_qgz_feedback *fb, zr_coll_op *op);
/* Wait for the collective on op; the blocked time counts as exposed communication. */
zr_status zr_engine_wait(zr_engine *e, zr_coll_op *op);
/*
 * Exact all-gather of every rank's fp32 slice of unit s (mine: this rank's,
 * shard elements) into buf (padded elements of type), blocking; mine may be
 * this rank's slot of an fp32 buf (in place).
 */
zr_status zr_engine_gather_slices(zr_engine *e, zr_unit_state *s, const float *mine, void *buf,
                                  zr_dtype type, const zr_wire *wire);
/* Tell a dry engine's observer of CPU work of the engine itself. */
void zr_engine_report_work(zr_engine *e, zr_engine_work work, size_t elements);

/* ---- engine.c --------------------------------------------------------------------- */

/* Stages 1-2: the replicated working copy `full` gathered from the master shards (blocking). */
zr_status zr_engine_refresh_full(zr_engine *e, zr_unit_state *s);

/* ---- lifecycle.c --------------------------------------------------------------- */

/* Make room for a reduction of s and take its op (the caller starts it). */
zr_status zr_engine_reduce_begin(zr_engine *e, zr_unit_state *s);
/* Complete the oldest reduction in flight. */
zr_status zr_engine_finish_oldest(zr_engine *e);

#endif /* ZR_ZERO_IMPL_H */
