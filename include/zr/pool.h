/*
 * zr/pool.h - worker threads for the compute loops of one rank.
 *
 * A rank's compute alternates between matrix products, which OpenBLAS runs
 * on its own threads, and the loops around them (LayerNorm, attention, GELU,
 * softmax, AdamW), which run here. The two never run at once, so the pool
 * and OpenBLAS share the cores phase by phase instead of fighting over them.
 *
 * The pool splits [0, n) into contiguous ranges, one per thread, and the
 * caller's own thread takes the first. Users make their results independent
 * of the split: every item is computed alone, in an order fixed by the item
 * (per-row work split by rows, sums over rows split by columns), so the
 * thread count never changes a bit of the output.
 *
 * With one thread, or a range smaller than two grains, fn runs on the
 * caller's thread with no synchronisation at all. A call made from inside a
 * task, or while another thread is running a job on the same pool, also runs
 * inline. Tasks must not record errors (ZR_FAIL) or allocate: the error
 * buffer and the allocation counters belong to the rank's main thread.
 */
#ifndef ZR_POOL_H
#define ZR_POOL_H

#include "zr/base.h"

#include <stddef.h>

/* The most threads a pool holds (zr.train.threads has the same bound). */
#define ZR_POOL_MAX_THREADS 1024

/* Runs items [begin, end); thread is in [0, threads) and unique among the running tasks. */
typedef void (*zr_pool_fn)(void *arg, size_t begin, size_t end, int thread);

typedef struct zr_pool zr_pool;

/* A pool of threads - 1 workers plus the caller (1 <= threads <= ZR_POOL_MAX_THREADS). */
zr_status zr_pool_init(zr_pool **out, int threads);
/* Joins the workers; safe on NULL. */
void zr_pool_free(zr_pool *pool);
int zr_pool_threads(const zr_pool *pool);

/*
 * Runs fn over [0, n) and returns when every range is done. Ranges hold at
 * least grain items (grain 0 counts as 1), so small loops use fewer threads.
 */
void zr_pool_run(zr_pool *pool, size_t n, size_t grain, zr_pool_fn fn, void *arg);

/*
 * The process's pool, which the model, AdamW and the codecs (zr/quant.h) use. zr_threads_set(n)
 * replaces it by one of n threads (1: no workers); it holds no memory that
 * zr_mem_current counts. When workers cannot be started it keeps the ones
 * that did, warns and returns ZR_OK: results never depend on the count.
 */
zr_status zr_threads_set(int threads);
int zr_threads_get(void);
void zr_parallel_for(size_t n, size_t grain, zr_pool_fn fn, void *arg);

#endif /* ZR_POOL_H */
