/*
 * pool.c - the worker threads of zr/pool.h.
 *
 * One job at a time: the caller publishes (fn, arg, n, parts), bumps a
 * generation counter and runs part 0 itself; worker t runs part t (or
 * nothing when t >= parts) and counts itself off. Every worker acknowledges
 * every generation, so when the caller sees the count reach zero no worker
 * can still be reading the job, and the next job may overwrite it.
 *
 * Waiting: a worker first spins on the generation for a short while (jobs
 * often come in bursts: LayerNorm, then attention, then GELU around the
 * matrix products), then sleeps on a condition variable. The spin is short
 * because OpenBLAS's threads run the matrix products in between, on the
 * same cores: a pool thread that kept spinning would take cycles from them.
 * The caller waits for the workers the same way.
 */
#define _POSIX_C_SOURCE 200809L

#include "zr/pool.h"

#include "blas.h" /* zr_cpu_cores */

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>

/* How long an idle thread spins before it sleeps. */
#define ZR_POOL_SPIN_S 30e-6

struct zr_pool {
    int threads; /* workers + the caller */
    int started; /* workers running */
    pthread_t tid[ZR_POOL_MAX_THREADS];
    struct worker_arg {
        struct zr_pool *pool;
        int t;
    } args[ZR_POOL_MAX_THREADS];
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    /* the job: written by the caller before gen is bumped */
    zr_pool_fn fn;
    void *arg;
    size_t n;
    int parts;
    atomic_uint gen;
    atomic_int left; /* workers that have not acknowledged gen */
    atomic_int stop;
    atomic_flag busy; /* a job is running (a second caller runs inline) */
    int owned;        /* allocated by zr_pool_init (not the process pool) */
};

/* Set while a thread runs a task, so that nested calls run inline. */
static _Thread_local int in_task;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void run_part(struct zr_pool *p, int t)
{
    size_t begin = p->n * (size_t)t / (size_t)p->parts;
    size_t end = p->n * (size_t)(t + 1) / (size_t)p->parts;
    if (begin < end) {
        p->fn(p->arg, begin, end, t);
    }
}

/* Spins for up to ZR_POOL_SPIN_S while gen == value; returns the last value read. */
static unsigned spin_while_gen(struct zr_pool *p, unsigned value)
{
    double t0 = 0;
    for (unsigned i = 0;; i++) {
        unsigned g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != value || atomic_load_explicit(&p->stop, memory_order_relaxed)) {
            return g;
        }
        if ((i & 63) == 0) {
            double now = zr_now();
            if (i == 0) {
                t0 = now;
            } else if (now - t0 > ZR_POOL_SPIN_S) {
                return g;
            }
        }
        cpu_relax();
    }
}

static void *worker_main(void *arg)
{
    struct zr_pool *p = ((struct worker_arg *)arg)->pool;
    int t = ((struct worker_arg *)arg)->t;
    unsigned seen = 0;
    in_task = 1;
    for (;;) {
        unsigned g = spin_while_gen(p, seen);
        if (g == seen && !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->mu);
            while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop)) {
                pthread_cond_wait(&p->wake, &p->mu);
            }
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) {
            return NULL;
        }
        seen = g;
        if (t < p->parts) {
            run_part(p, t);
        }
        if (atomic_fetch_sub_explicit(&p->left, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

/* Starts threads - 1 workers on a zeroed pool; fewer if the system refuses some. */
static void pool_start(struct zr_pool *p, int threads)
{
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->left, 0);
    atomic_init(&p->stop, 0);
    atomic_flag_clear(&p->busy);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    /* room for the attention kernels' tiles, like a main thread's stack */
    pthread_attr_setstacksize(&attr, (size_t)8 << 20);
    /* workers block every signal, so SIGINT / SIGTERM still reach the main thread */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    p->started = 0;
    for (int t = 1; t < threads; t++) {
        p->args[t].pool = p;
        p->args[t].t = t;
        if (pthread_create(&p->tid[t], &attr, worker_main, &p->args[t]) != 0) {
            ZR_WARN("thread pool: started %d of %d threads; running with %d", t, threads, t);
            break;
        }
        p->started++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    p->threads = p->started + 1;
}

static void pool_stop(struct zr_pool *p)
{
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int t = 1; t <= p->started; t++) {
        pthread_join(p->tid[t], NULL);
    }
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    p->started = 0;
    p->threads = 1;
}

zr_status zr_pool_init(zr_pool **out, int threads)
{
    *out = NULL;
    if (threads < 1 || threads > ZR_POOL_MAX_THREADS) {
        ZR_FAIL(ZR_ERR_INVALID, "thread pool: %d threads (need 1 .. %d)", threads,
                ZR_POOL_MAX_THREADS);
    }
    struct zr_pool *p;
    ZR_ALLOC(p, 1);
    p->owned = 1;
    pool_start(p, threads);
    *out = p;
    return ZR_OK;
}

void zr_pool_free(zr_pool *pool)
{
    if (pool == NULL) {
        return;
    }
    pool_stop(pool);
    if (pool->owned) {
        zr_free(pool);
    }
}

int zr_pool_threads(const zr_pool *pool)
{
    return pool != NULL ? pool->threads : 1;
}

void zr_pool_run(zr_pool *p, size_t n, size_t grain, zr_pool_fn fn, void *arg)
{
    grain = grain > 0 ? grain : 1;
    size_t parts = n / grain;
    if (p != NULL && parts > (size_t)p->threads) {
        parts = (size_t)p->threads;
    }
    if (p == NULL || parts < 2 || in_task || atomic_flag_test_and_set(&p->busy)) {
        if (n > 0) {
            fn(arg, 0, n, 0);
        }
        return;
    }
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->parts = (int)parts;
    atomic_store_explicit(&p->left, p->threads - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);

    in_task = 1;
    run_part(p, 0);
    in_task = 0;

    double t0 = zr_now();
    for (unsigned i = 1; atomic_load_explicit(&p->left, memory_order_acquire) != 0; i++) {
        if ((i & 63) == 0 && zr_now() - t0 > ZR_POOL_SPIN_S) {
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->left) != 0) {
                pthread_cond_wait(&p->done, &p->mu);
            }
            pthread_mutex_unlock(&p->mu);
            break;
        }
        cpu_relax();
    }
    atomic_flag_clear(&p->busy);
}

/* ---- the process's pool --------------------------------------------------- */

static struct zr_pool process_pool; /* static: never counted as zr memory */
static int process_threads = 1;

/*
 * More threads than the process has cores (its affinity mask: a launcher that binds each
 * rank to one core, Open MPI's default for up to 2 ranks) share those cores and gain
 * nothing: said once per process, with the launcher's option that gives the cores.
 */
static void check_cores(int threads)
{
    static int warned;
    int cores = zr_cpu_cores();
    if (threads > cores && !warned) {
        char advice[256];
        warned = 1;
        ZR_WARN("%d threads, but this process may run on %d core%s only (its affinity mask), "
                "so they share %s: %s",
                threads, cores, cores == 1 ? "" : "s", cores == 1 ? "it" : "them",
                zr_cpu_cores_advice(cores, threads, advice, sizeof advice));
    }
}

zr_status zr_threads_set(int threads)
{
    if (threads < 1 || threads > ZR_POOL_MAX_THREADS) {
        ZR_FAIL(ZR_ERR_INVALID, "threads = %d (need 1 .. %d)", threads, ZR_POOL_MAX_THREADS);
    }
    check_cores(threads);
    if (threads == process_threads) {
        return ZR_OK;
    }
    if (process_threads > 1) {
        pool_stop(&process_pool);
    }
    memset(&process_pool, 0, sizeof process_pool);
    process_threads = 1;
    if (threads > 1) {
        pool_start(&process_pool, threads);
        process_threads = process_pool.threads;
    }
    return ZR_OK;
}

int zr_threads_get(void)
{
    return process_threads;
}

void zr_parallel_for(size_t n, size_t grain, zr_pool_fn fn, void *arg)
{
    zr_pool_run(process_threads > 1 ? &process_pool : NULL, n, grain, fn, arg);
}
