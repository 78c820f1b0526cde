/*
 * probe.c - `zr probe`: what the cost model needs, measured on this
 * allocation with every rank busy at once (as in training: ranks on one node
 * share cores, memory bandwidth and the node's link).
 *
 *   compute    the model's own units (embedding, one block, LM head) forward
 *              and backward at micro-batch sizes 1, 2, 4, ..., in the model's
 *              kernels, on a one-block GPT of the requested width, vocabulary
 *              and sequence length (a deeper model repeats the block)
 *   per element AdamW, sum of squares, bf16 conversions, fp32 accumulation,
 *              INT8/INT4 quantize and dequantize-add (the default group)
 *   transport  all-to-all of block-shard-sized, quarter-sized and 8-byte messages
 *              through zr's communicator inside each node (ZR_GROUP_NODE)
 *              and across nodes (ZR_GROUP_CROSS), every rank at once:
 *              bandwidth per rank at both sizes, and latency per exchange
 *   overlap    a transfer posted, computation without MPI calls for half its
 *              time, then the wait: how much of it moved meanwhile
 *   memory     this rank's resident bytes before any model state (program,
 *              MPI, BLAS, communicator), and the node's available memory
 *   references (CPU) a few steps of three configurations through the real
 *              engine, which the cost model is calibrated on (probe_ref.c)
 *
 * On GPUs (zr.device cuda, or auto where every rank has one, decided as the
 * trainer decides it) the probe measures what a GPU run spends: the compute
 * and per-element figures on each rank's GPU (probe_gpu.c), the transport
 * through the device transport zr.transport picks (NCCL or staged) on
 * device buffers, the overlap of a transfer with kernels queued on the GPU,
 * and the GPU's free memory per rank in place of the node's.
 *
 * Compute figures are means over a window of repetitions, transfers the
 * median of a few; each is then the slowest rank's (max over ranks), so every
 * rank returns the same probe.
 */
#define _POSIX_C_SOURCE 200809L

#include "probe_impl.h"

#include "zr/model_cuda.h"
#include "zr/optim.h"
#include "zr/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Compute is timed as a mean over a window of at least WINDOW_S seconds (and
 * REPS repetitions): ranks that share cores are time-sliced in slices of a
 * few milliseconds, so one short unit either runs alone on a core or waits a
 * slice; only a window many slices long sees the share a training step gets.
 */
enum { REPS = 5 };
#define WINDOW_S 0.3

/* Agree on the largest value over world, in units of 1/scale (picoseconds for times). */
static zr_status max_over(zr_comm *c, double *v, int n, double scale)
{
    int64_t w[64];
    ZR_ASSERT(n <= 64);
    for (int i = 0; i < n; i++) {
        w[i] = (int64_t)llround(v[i] * scale);
    }
    ZR_CHECK(zr_comm_allreduce_max_i64(c, ZR_GROUP_WORLD, w, n));
    for (int i = 0; i < n; i++) {
        v[i] = (double)w[i] / scale;
    }
    return ZR_OK;
}

/* Agree on the slowest rank's times (seconds, to the picosecond). */
zr_status zr_probe_slowest(zr_comm *c, double *v, int n)
{
    return max_over(c, v, n, 1e12);
}

/* ---- compute ---------------------------------------------------------------------- */

typedef struct bufs {
    float *p[3], *g[3];
    int *tok;
} bufs;

/* The six unit figures of one forward and backward of r's one-layer model. */
static zr_status time_pass(const zr_gpt_run *r, bufs *b, double *t)
{
    const zr_gpt_backend_i *be = r->be;
    void *m = r->model;
    t[0] = zr_now();
    ZR_CHECK(be->forward_begin(m, b->tok, b->tok + 1));
    ZR_CHECK(be->forward_unit(m, 0, b->p[0], NULL));
    t[1] = zr_now();
    ZR_CHECK(be->forward_unit(m, 1, b->p[1], NULL));
    t[2] = zr_now();
    ZR_CHECK(be->forward_unit(m, 2, b->p[2], b->p[0]));
    t[3] = zr_now();
    ZR_CHECK(be->backward_begin(m));
    ZR_CHECK(be->backward_unit(m, 2, b->p[2], b->p[0], b->g[2], b->g[0]));
    t[4] = zr_now();
    ZR_CHECK(be->backward_unit(m, 1, b->p[1], NULL, b->g[1], NULL));
    t[5] = zr_now();
    ZR_CHECK(be->backward_unit(m, 0, NULL, NULL, b->g[0], NULL));
    t[6] = zr_now();
    return ZR_OK;
}

static zr_status time_units(const zr_gpt_run *run, bufs *b, zr_probe_compute *out)
{
    double sum[6] = {0, 0, 0, 0, 0, 0}, start = 0;
    int n = 0;
    /* the first repetition warms caches and BLAS buffers and is not counted */
    for (int r = 0; r < REPS + 1 || zr_now() - start < WINDOW_S; r++) {
        double t[7];
        ZR_CHECK(time_pass(run, b, t));
        if (r == 0) {
            start = t[6];
            continue;
        }
        for (int k = 0; k < 6; k++) {
            sum[k] += t[k + 1] - t[k];
        }
        n++;
    }
    out->fwd_embed = sum[0] / n;
    out->fwd_block = sum[1] / n;
    out->fwd_head = sum[2] / n;
    out->bwd_head = sum[3] / n;
    out->bwd_block = sum[4] / n;
    out->bwd_embed = sum[5] / n;
    return ZR_OK;
}

/*
 * The units of g (one layer) at micro-batch b on the CPU, in the model of
 * g's architecture (zr_gpt_run_init picks its backend: GPT-2's host model or
 * the Llama family's), on parameters initialised as a run's.
 */
static zr_status probe_compute(zr_comm *c, const zr_gpt_config *g, int T, int recompute, int b,
                               zr_probe_compute *out, size_t *block_numel)
{
    zr_gpt_run run;
    memset(&run, 0, sizeof run);
    bufs bf;
    memset(&bf, 0, sizeof bf);
    zr_device dev = zr_device_cpu();
    zr_gpt_shape sh = {b, T, recompute, ZR_DTYPE_F32};
    zr_engine_config ecfg;
    memset(&ecfg, 0, sizeof ecfg);
    zr_status st = zr_gpt_run_init(&run, &dev, g, &sh, &ecfg);
    *block_numel = zr_gpt_config_unit_numel(g, 1);
    for (int u = 0; u < 3 && st == ZR_OK; u++) {
        size_t n = zr_gpt_config_unit_numel(g, u);
        st = ZR_ALLOC_STATUS(bf.p[u], n);
        if (st == ZR_OK) {
            st = ZR_ALLOC_STATUS(bf.g[u], n);
        }
        if (st == ZR_OK) {
            zr_gpt_config_unit_init(g, u, bf.p[u], 1);
        }
    }
    if (st == ZR_OK) {
        st = ZR_ALLOC_STATUS(bf.tok, (size_t)b * (size_t)T + 1);
    }
    for (size_t i = 0; st == ZR_OK && i < (size_t)b * (size_t)T + 1; i++) {
        bf.tok[i] = (int)((i * 2654435761u) % (size_t)g->vocab);
    }
    st = zr_comm_agree(c, st);
    if (st == ZR_OK) {
        st = zr_comm_barrier(c);
    }
    if (st == ZR_OK) {
        st = zr_comm_agree(c, time_units(&run, &bf, out));
    }
    for (int u = 0; u < 3; u++) {
        zr_free(bf.p[u]);
        zr_free(bf.g[u]);
    }
    zr_free(bf.tok);
    zr_gpt_run_free(&run);
    ZR_CHECK(st);
    out->batch = b;
    return zr_probe_slowest(c, &out->fwd_embed, 6);
}

/* ---- per-element costs -------------------------------------------------------------- */

enum { NEL = 1 << 20 };

typedef struct kern {
    float *x, *y, *m, *v;
    zr_bf16 *h;
    unsigned char *blk;
} kern;

static double time_kernel(kern *k, int which)
{
    double sum = 0, start = 0;
    int n = 0;
    zr_adamw h = zr_adamw_default();
    zr_quant_params q8 = {8, ZR_QUANT_DEFAULT_GROUP, ZR_QUANT_SYM},
                    q4 = {4, ZR_QUANT_DEFAULT_GROUP, ZR_QUANT_SYM};
    volatile double sink = 0;
    for (int r = 0; r < REPS + 1 || zr_now() - start < WINDOW_S / 4; r++) {
        double t0 = zr_now();
        switch (which) {
        case 0:
            zr_adamw_update(&h, 1e-4f, 1, 1.0f, 1, k->x, k->y, k->m, k->v, NEL);
            break;
        case 1:
            sink += zr_sumsq(k->x, NEL);
            break;
        case 2:
            zr_bf16_from_f32_n(k->h, k->x, NEL);
            break;
        case 3:
            zr_bf16_to_f32_n(k->y, k->h, NEL);
            break;
        case 4:
            for (size_t i = 0; i < NEL; i++) {
                k->m[i] += k->y[i];
            }
            break;
        case 5:
        case 7:
            (void)zr_quant_encode(which == 5 ? &q8 : &q4, ZR_DTYPE_F32, k->x, NEL, 1.0f, NULL,
                                  k->blk, NULL);
            break;
        default:
            (void)zr_quant_decode_add(k->blk, k->m, NEL);
            break;
        }
        double t1 = zr_now();
        if (r == 0) {
            start = t1;
        } else {
            sum += (t1 - t0) / NEL;
            n++;
        }
    }
    (void)sink;
    return sum / n;
}

static zr_status probe_kernels(zr_comm *c, zr_probe *p)
{
    kern k;
    memset(&k, 0, sizeof k);
    zr_quant_params q4 = {4, ZR_QUANT_DEFAULT_GROUP, ZR_QUANT_SYM};
    size_t qb = zr_quant_block_bytes(&q4, NEL) * 2 + 64;
    zr_status st = ZR_OK;
    float **f[4] = {&k.x, &k.y, &k.m, &k.v};
    for (int i = 0; i < 4 && st == ZR_OK; i++) {
        st = ZR_ALLOC_STATUS(*f[i], NEL);
    }
    if (st == ZR_OK) {
        st = ZR_ALLOC_STATUS(k.h, NEL);
    }
    if (st == ZR_OK) {
        st = ZR_ALLOC_STATUS(k.blk, qb);
    }
    for (size_t i = 0; st == ZR_OK && i < NEL; i++) {
        k.x[i] = (float)((int)(i % 2001) - 1000) * 1e-3f;
        k.y[i] = k.x[i] * 0.5f;
    }
    st = zr_comm_agree(c, st);
    double v[9] = {0};
    if (st == ZR_OK) {
        st = zr_comm_barrier(c);
        /* order: adamw sumsq bf16_enc bf16_dec f32_add q8 enc, q8 dec, q4 enc, q4 dec */
        for (int w = 0; w < 9 && st == ZR_OK; w++) {
            v[w] = time_kernel(&k, w);
        }
    }
    zr_free(k.x), zr_free(k.y), zr_free(k.m), zr_free(k.v), zr_free(k.h), zr_free(k.blk);
    ZR_CHECK(st);
    ZR_CHECK(zr_probe_slowest(c, v, 9));
    p->adamw = v[0], p->sumsq = v[1], p->bf16_enc = v[2], p->bf16_dec = v[3], p->f32_add = v[4];
    p->q_enc[0] = v[5], p->q_dec[0] = v[6], p->q_enc[1] = v[7], p->q_dec[1] = v[8];
    return ZR_OK;
}

/* ---- transport ------------------------------------------------------------------------- */

/* Median seconds of an all-to-all of `bytes` to every peer of group g, every rank at once. */
static zr_status time_exchange(zr_comm *c, zr_group g, size_t bytes, int reps, char *sbuf,
                               char *rbuf, double *out)
{
    double t[32];
    ZR_ASSERT(reps <= 32);
    for (int r = 0; r < reps + 1; r++) {
        ZR_CHECK(zr_comm_barrier(c));
        double t0 = zr_now();
        ZR_CHECK(zr_comm_alltoall(c, g, ZR_KIND_ALLTOALL, sbuf, bytes, rbuf));
        if (r > 0) {
            t[r - 1] = zr_now() - t0;
        }
    }
    *out = zr_median(t, reps);
    return ZR_OK;
}

/*
 * Post a transfer of about t_x seconds, compute for half of that without any
 * MPI call, wait: the part of the transfer that moved during the computation
 * is f * t_c, so t_total = t_c + (t_x - f * t_c).
 */
static zr_status time_overlap(zr_comm *c, zr_group g, size_t bytes, double t_x, char *sbuf,
                              char *rbuf, float *work, size_t nwork, zr_probe_busy *gpu, double *f)
{
    double est[3];
    for (int r = 0; r < 3; r++) {
        ZR_CHECK(zr_comm_barrier(c));
        double t0 = zr_now();
        zr_request req = ZR_REQUEST_INIT;
        ZR_CHECK(zr_comm_ialltoall(c, g, ZR_KIND_ALLTOALL, sbuf, bytes, rbuf, &req));
        double t_c = 0;
        if (gpu != NULL) {
            /* kernels queued on the GPU while the host drives the transfer in its wait */
            ZR_CHECK(zr_probe_gpu_busy(gpu, 0.5 * t_x));
            ZR_CHECK(zr_comm_wait(c, &req));
            ZR_CHECK(zr_stream_sync(gpu->s));
            t_c = (double)(int)(0.5 * t_x / fmax(gpu->t_kernel, 1e-9) + 1) * gpu->t_kernel;
        } else {
            volatile double sink = 0;
            double t_c0 = zr_now();
            while (zr_now() - t_c0 < 0.5 * t_x) {
                sink += zr_sumsq(work, nwork);
            }
            (void)sink;
            t_c = zr_now() - t_c0;
            ZR_CHECK(zr_comm_wait(c, &req));
        }
        double total = zr_now() - t0;
        double moved = t_x - (total - t_c);
        est[r] = fmin(1.0, fmax(0.0, moved / t_c));
    }
    *f = zr_median(est, 3);
    return ZR_OK;
}

/*
 * Bandwidth is measured at two message sizes: the engine's largest frequent
 * message (one rank's shard of a block's bf16 weights, sent to every peer;
 * 64 KiB to 4 MiB) and a quarter of it, near what qwZ's INT8 and qgZ's INT4
 * blocks send. Throughput depends on the size, and not in one direction: on
 * the emulated cluster (4 nodes, bench/cluster), one rank's 1.5 MiB to
 * every peer at once moved 101 MB/s per rank on 1 Gbit/s links and 385 KiB
 * moved 124 (the link's queue drops less of a shorter burst), while on the
 * unshaped links, where the CPU's work per message counts, the smaller moved
 * 784 MB/s against 999. The cost model prices each hop at its own message
 * size between the two (cost.c). A much smaller message measures latency.
 */
/*
 * Seconds an exchange of t seconds spent moving bytes: t less the latency lat,
 * but at least a quarter of t. Ranks sharing cores with other work can be
 * descheduled through the 8-byte exchanges: 4 ranks on a busy 2-core
 * machine measured 16 ms of latency between nodes, more than a 1.7 MB
 * message's whole exchange, and t - lat gave 1.8e15 bytes/s (a file zr plan
 * refused). Latency that large is the scheduler's, not the link's.
 */
static double moving(double t, double lat)
{
    return fmax(fmax(t - lat, 0.25 * t), 1e-9);
}

static zr_status probe_transport(zr_comm *c, zr_probe *p, size_t block_numel, const zr_device *dev,
                                 zr_stream *s)
{
    int D = c->size[ZR_GROUP_NODE], N = c->size[ZR_GROUP_CROSS];
    size_t big = block_numel * 2 / (size_t)c->size[ZR_GROUP_WORLD];
    big = big < ((size_t)64 << 10)  ? (size_t)64 << 10
          : big > ((size_t)4 << 20) ? (size_t)4 << 20
                                    : big;
    size_t peers = (size_t)(D > N ? D : N);
    char *sbuf = NULL, *rbuf = NULL;
    float *work = NULL;
    size_t nwork = (size_t)1 << 18;
    zr_probe_busy busy, *gpu = s != NULL ? &busy : NULL;
    memset(&busy, 0, sizeof busy);
    /* the transport's memory: the GPU's on a device transport */
    zr_status st = zr_device_alloc_at(dev, (void **)&sbuf, big * peers, __FILE__, __LINE__);
    if (st == ZR_OK) {
        st = zr_device_alloc_at(dev, (void **)&rbuf, big * peers, __FILE__, __LINE__);
    }
    if (st == ZR_OK) {
        st = ZR_ALLOC_STATUS(work, nwork);
    }
    if (st == ZR_OK && gpu != NULL) {
        st = zr_probe_gpu_busy_init(s, gpu);
    }
    st = zr_comm_agree(c, st);
    size_t small = big / 4;
    /* per level (intra, inter): big t, latency, small t; then the overlap */
    double v[7] = {0, 0, 0, 0, 0, 0, 0};
    for (int l = 0; l < 2; l++) {
        zr_group g = l == 0 ? ZR_GROUP_NODE : ZR_GROUP_CROSS;
        if (st == ZR_OK && (l == 0 ? D : N) > 1) {
            st = time_exchange(c, g, big, REPS, sbuf, rbuf, &v[3 * l]);
            if (st == ZR_OK) {
                st = time_exchange(c, g, 8, 20, sbuf, rbuf, &v[3 * l + 1]);
            }
            if (st == ZR_OK) {
                st = time_exchange(c, g, small, REPS, sbuf, rbuf, &v[3 * l + 2]);
            }
        }
    }
    if (st == ZR_OK) {
        st = zr_probe_slowest(c, v, 6);
    }
    if (st == ZR_OK && (N > 1 || D > 1)) {
        zr_group g = N > 1 ? ZR_GROUP_CROSS : ZR_GROUP_NODE;
        st = time_overlap(c, g, big, N > 1 ? v[3] : v[0], sbuf, rbuf, work, nwork, gpu, &v[6]);
        if (st == ZR_OK) {
            v[6] = -v[6]; /* the smallest fraction over ranks */
            st = max_over(c, &v[6], 1, 1e9);
            v[6] = -v[6];
        }
    }
    zr_device_free(dev, sbuf), zr_device_free(dev, rbuf), zr_free(work);
    zr_probe_gpu_busy_free(&busy);
    ZR_CHECK(st);
    p->intra_bw = D > 1 ? (double)big * (D - 1) / moving(v[0], v[1]) : 0;
    p->intra_lat = v[1];
    p->intra_bw_small = D > 1 ? (double)small * (D - 1) / moving(v[2], v[1]) : 0;
    p->inter_bw = N > 1 ? (double)big * (N - 1) / moving(v[3], v[4]) : 0;
    p->inter_lat = v[4];
    p->inter_bw_small = N > 1 ? (double)small * (N - 1) / moving(v[5], v[4]) : 0;
    p->bw_msg = (double)big;
    p->bw_msg_small = (double)small;
    p->overlap = v[6] > 0 ? v[6] : 0; /* never -0 in the file */
    return ZR_OK;
}

/* ---- memory ---------------------------------------------------------------------------- */

static double proc_kb(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    char line[256];
    double v = 0;
    size_t n = strlen(key);
    while (fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, key, n) == 0) {
            v = atof(line + n);
            break;
        }
    }
    fclose(f);
    return v * 1024.0;
}

/*
 * Where the probe measures, decided as the trainer decides zr.device: the
 * CPU, or every rank's GPU (by node-local rank) with c's data plane a device
 * transport (zr.transport) following a stream of the probe's own.
 */
static zr_status pick_device(zr_comm *c, const zr_train_config *cfg, zr_device *dev, zr_stream **s)
{
    *dev = zr_device_cpu();
    *s = NULL;
    if (strcmp(cfg->device, "cpu") == 0) {
        return ZR_OK;
    }
    char why[512] = "";
    int has = 0, all = 0;
    ZR_CHECK(zr_comm_gpus_everywhere(c, &has, &all, why, sizeof why));
    if (!all) {
        zr_status st = ZR_OK;
        if (strcmp(cfg->device, "cuda") == 0 && !has) {
            st = zr_error_at(ZR_ERR_DEVICE, __FILE__, __LINE__,
                             "zr.device cuda (--device cuda): %s; use --device cpu, or --device "
                             "auto to take the GPUs only where every rank has one",
                             why);
        }
        return zr_comm_agree(c, st); /* auto: the CPU */
    }
    zr_status st = zr_device_open_for_rank(c->rank[ZR_GROUP_NODE], c->size[ZR_GROUP_NODE], dev);
    if (st == ZR_OK) {
        st = zr_stream_create(dev, s);
    }
    ZR_CHECK(zr_comm_agree(c, st));
    int nccl = 0, shared = 0;
    return zr_comm_use_device(c, dev, *s, cfg->transport, &nccl, &shared);
}

/* The GPU's free memory per rank sharing it (the smallest over ranks), as mem_per_rank. */
static zr_status gpu_memory(zr_comm *c, const zr_device *dev, zr_probe *out)
{
    size_t free_b = 0, total_b = 0;
    int count = 0;
    zr_status st = zr_device_mem_info(dev, &free_b, &total_b);
    if (st == ZR_OK) {
        st = zr_device_cuda_count(&count);
    }
    ZR_CHECK(zr_comm_agree(c, st));
    int per_node = c->size[ZR_GROUP_NODE];
    int sharing = count > 0 && per_node > count ? (per_node + count - 1) / count : 1;
    double mem = -(double)free_b / sharing;
    ZR_CHECK(max_over(c, &mem, 1, 1.0));
    out->mem_per_rank = -mem;
    out->base_rss = 0; /* the device holds nothing of zr's before the model */
    return ZR_OK;
}

/* The compute figures at micro-batch b, on the CPU or the GPU. */
static zr_status probe_compute_at(zr_comm *c, const zr_train_config *cfg, const zr_gpt_config *g,
                                  zr_stream *s, int b, zr_probe_compute *out, size_t *block_numel)
{
    if (s == NULL) {
        return probe_compute(c, g, cfg->seq_len, cfg->activation_checkpointing, b, out,
                             block_numel);
    }
    *block_numel = zr_gpt_config_unit_numel(g, 1);
    ZR_CHECK(zr_probe_gpu_compute(c, g, cfg->seq_len, b,
                                  cfg->bf16_enabled ? ZR_DTYPE_BF16 : ZR_DTYPE_F32, s, out));
    return zr_probe_slowest(c, &out->fwd_embed, 6);
}

static zr_status probe_all(zr_comm *c, const zr_train_config *cfg, int vocab, int max_b,
                           const zr_device *dev, zr_stream *s, zr_probe *out)
{
    out->gpu = s != NULL;
    out->bf16 = out->gpu && cfg->bf16_enabled;
    if (out->gpu) {
        ZR_CHECK(gpu_memory(c, dev, out));
    }
    zr_gpt_set_threads(cfg->threads);
    /* the run's model (a Hugging Face folder's where zr.model.init is one), and its one-layer
       version whose units are timed */
    zr_gpt_config whole, g;
    ZR_CHECK(zr_plan_model(cfg, vocab, &whole));
    g = whole;
    g.layers = g.llama.layers = 1;
    ZR_CHECK(zr_gpt_config_check(&g));
    if (s != NULL) {
        const zr_gpt_backend_i *be; /* a GPU backend of this architecture, or why not */
        ZR_CHECK(zr_comm_agree(c, zr_gpt_backend_for(&g, ZR_DEVICE_CUDA, &be)));
    }
    /* first, in a process as fresh as a training run's: after the rest of the probe, ZeRO-3's
       steps measured 290-310 ms where zr bench train's launches measured 211-287 (emulated 2x2
       at 10 Gbit/s on the CPU, three of each) */
    zr_probe_reference_steps(c, cfg, &whole, s, out);
    /* the device model takes at most zr_gpt_cuda_max_batch: a larger micro-batch cannot run
       there, so the plan must not be offered one (where not even B = 1 can, the measurement at 1
       says why) */
    int cap = s != NULL ? zr_gpt_cuda_max_batch(&g, cfg->seq_len) : max_b;
    if (max_b > cap) {
        max_b = cap > 0 ? cap : 1;
    }
    size_t block_numel = 0;
    for (int b = 1; b <= max_b && out->ncompute < ZR_PROBE_MAX_B; b *= 2) {
        ZR_CHECK(probe_compute_at(c, cfg, &g, s, b, &out->compute[out->ncompute], &block_numel));
        out->ncompute++;
        if (b < max_b && b * 2 > max_b && out->ncompute < ZR_PROBE_MAX_B) {
            ZR_CHECK(
                probe_compute_at(c, cfg, &g, s, max_b, &out->compute[out->ncompute], &block_numel));
            out->ncompute++;
        }
    }
    if (s != NULL) {
        double v[9];
        ZR_CHECK(zr_probe_gpu_kernels(c, s, v));
        ZR_CHECK(zr_probe_slowest(c, v, 9));
        out->adamw = v[0], out->sumsq = v[1], out->bf16_enc = v[2], out->bf16_dec = v[3];
        out->f32_add = v[4], out->q_enc[0] = v[5], out->q_dec[0] = v[6];
        out->q_enc[1] = v[7], out->q_dec[1] = v[8];
    } else {
        ZR_CHECK(probe_kernels(c, out));
    }
    return probe_transport(c, out, block_numel, dev, s);
}

zr_status zr_probe_run(zr_comm *c, const zr_train_config *cfg, int vocab, int max_b, zr_probe *out)
{
    memset(out, 0, sizeof *out);
    out->version = ZR_PROBE_VERSION;
    out->world = c->size[ZR_GROUP_WORLD];
    out->nodes = c->n_nodes;
    out->ranks_per_node = c->ranks_per_node;
    out->threads = cfg->threads;
    out->layers = cfg->layers, out->heads = cfg->heads, out->channels = cfg->channels;
    out->vocab = vocab, out->padded_vocab = (int)zr_round_up((size_t)vocab, 128);
    out->seq_len = cfg->seq_len, out->max_seq_len = cfg->max_seq_len;
    out->recompute = cfg->activation_checkpointing;
    zr_gpt_config m;
    ZR_CHECK(zr_plan_model(cfg, vocab, &m));
    out->padded_vocab = m.padded_vocab;
    if (m.arch == ZR_ARCH_LLAMA) {
        const zr_llama_config *l = &m.llama;
        out->arch = ZR_ARCH_LLAMA, out->kv_heads = l->kv_heads, out->head_dim = l->head_dim;
        out->intermediate = l->intermediate, out->tied = l->tied, out->qkv_bias = l->qkv_bias;
    }
    /* before anything of the probe's own: what a rank holds with no model */
    double mem[2] = {proc_kb("/proc/self/status", "VmRSS:"),
                     -proc_kb("/proc/meminfo", "MemAvailable:") / c->ranks_per_node};
    ZR_CHECK(max_over(c, mem, 2, 1.0)); /* bytes */
    out->base_rss = mem[0];
    out->mem_per_rank = -mem[1];
    zr_device dev;
    zr_stream *s = NULL;
    zr_status st = pick_device(c, cfg, &dev, &s);
    if (st == ZR_OK) {
        st = probe_all(c, cfg, vocab, max_b, &dev, s, out);
    }
    if (s != NULL) {
        /* c moves host memory again; the stream its device transport followed can go */
        zr_status back = zr_comm_use_transport(c, &zr_transport_mpi, NULL);
        st = st != ZR_OK ? st : back;
        zr_stream_destroy(s);
    }
    ZR_CHECK(st);
    if (!out->gpu) {
        /* what stays resident once the probe's buffers are gone: the program, the data, MPI's
           buffers for every peer and BLAS's, all of which a training rank holds too */
        double after = proc_kb("/proc/self/status", "VmRSS:");
        ZR_CHECK(max_over(c, &after, 1, 1.0));
        out->base_rss = after > out->base_rss ? after : out->base_rss;
    }
    return ZR_OK;
}
