/*
 * gpt_engine.c - the GPT's forward and backward scheduled through the ZeRO
 * engine (see zr/gpt_engine.h for the schedule). This is the only place that
 * knows both the model's unit structure and the engine's life cycle; the
 * model knows nothing of sharding and the engine nothing of transformers.
 * It lives in src/model (whose layer stands above the engine's) rather than
 * with the trainer, because the planner predicts memory with it too
 * (zr_gpt_engine_predict) and the trainer and the planner stand side by side.
 *
 * The schedule is written once: a real micro-batch runs it with the model,
 * and a dry walk (zr_gpt_engine_walk, for the planner) runs it with no model
 * on a dry engine, each unit's computation reported to the engine's observer
 * in its place.
 */
#include "zr/gpt_engine.h"

#include "gpt_backend_impl.h"

#include <string.h>

zr_status zr_gpt_specs_init(zr_gpt_specs *s, const zr_gpt_config *cfg)
{
    memset(s, 0, sizeof *s);
    ZR_CHECK(zr_gpt_config_check(cfg));
    int n = zr_gpt_config_unit_count(cfg);
    ZR_ALLOC(s->units, (size_t)n);
    zr_status st = ZR_ALLOC_STATUS(s->ranges, (size_t)n * ZR_GPT_MAX_UNIT_TENSORS);
    if (st != ZR_OK) {
        zr_gpt_specs_free(s);
        return st;
    }
    s->nunits = n;
    for (int u = 0; u < n; u++) {
        zr_tensor_desc t[ZR_GPT_MAX_UNIT_TENSORS];
        int nt = zr_gpt_config_unit_tensors(cfg, u, t);
        zr_range *r = s->ranges + (size_t)u * ZR_GPT_MAX_UNIT_TENSORS;
        for (int i = 0; i < nt; i++) {
            r[i] = (zr_range){t[i].offset, t[i].numel, t[i].decay};
        }
        s->units[u] = (zr_unit_spec){zr_gpt_config_unit_numel(cfg, u), nt, r};
    }
    return ZR_OK;
}

void zr_gpt_specs_free(zr_gpt_specs *s)
{
    zr_free(s->units);
    zr_free(s->ranges);
    memset(s, 0, sizeof *s);
}

zr_status zr_gpt_engine_predict(const zr_gpt_config *cfg, int B, int T, int recompute,
                                const zr_engine_config *ecfg, const zr_comm *comm,
                                zr_gpt_memory_prediction *out)
{
    memset(out, 0, sizeof *out);
    zr_gpt_specs sp;
    ZR_CHECK(zr_gpt_specs_init(&sp, cfg)); /* a few bytes per unit */
    zr_memory_plan plan =
        zr_engine_plan_memory(ecfg, comm, sp.nunits, sp.units, ZR_GPT_HELD_UNITS, 1);
    zr_gpt_specs_free(&sp);
    out->state = plan.state;
    out->pool = plan.pool;
    out->activations = zr_gpt_config_activation_bytes(cfg, B, T, recompute);
    out->allowance = ZR_MEM_ALLOWANCE;
    out->total = out->state + out->activations + out->pool + out->allowance;
    return ZR_OK;
}

zr_status zr_gpt_engine_init_params(zr_engine *e, const zr_gpt_config *cfg, uint64_t seed)
{
    int n = zr_gpt_config_unit_count(cfg);
    ZR_ASSERT(n == e->nunits);
    for (int u = 0; u < n; u++) {
        float *full;
        ZR_ALLOC(full, zr_gpt_config_unit_numel(cfg, u));
        zr_gpt_config_unit_init(cfg, u, full, seed);
        zr_status st = zr_engine_set_params(e, u, full);
        zr_free(full);
        ZR_CHECK(st);
    }
    return ZR_OK;
}

/* ---- the backends ----------------------------------------------------------------- */

/*
 * The build's backends of the GPT, by device kind: the one place that knows
 * which exist. The CUDA backend's files (gpt_backend_cuda.c, ops_cuda.c) are
 * compiled only where CUDA is built (the Makefile's CUDA_ONLY_SRC), and so
 * is its line here; its sizes, which the planner needs anywhere, are
 * cuda_host.c's.
 */
static const zr_gpt_backend_i *const backends[][ZR_DEVICE_CUDA + 1] = {
    [ZR_ARCH_GPT2] =
        {
            [ZR_DEVICE_CPU] = &zr_gpt_backend_cpu,
#if ZR_CUDA
            [ZR_DEVICE_CUDA] = &zr_gpt_backend_cuda,
#endif
        },
    [ZR_ARCH_LLAMA] = {[ZR_DEVICE_CPU] = &zr_llama_backend_cpu},
};

zr_status zr_gpt_backend_for(const zr_gpt_config *cfg, zr_device_kind kind,
                             const zr_gpt_backend_i **out)
{
    size_t a = (size_t)cfg->arch, k = (size_t)kind;
    int known = a < sizeof backends / sizeof *backends;
    *out = known && k < sizeof *backends / sizeof **backends ? backends[a][k] : NULL;
    if (*out == NULL && a == ZR_ARCH_GPT2) {
        ZR_FAIL(ZR_ERR_DEVICE,
                "the GPT has no backend for device kind %d in this build: zr was built without "
                "CUDA (make CUDA=0, or no nvcc at build time)",
                (int)kind);
    }
    if (*out == NULL) {
        ZR_FAIL(ZR_ERR_DEVICE,
                "the %s architecture has no backend for device kind %d (a GPU) yet: train it with "
                "--device cpu",
                known ? "Llama-family" : "unknown", (int)kind);
    }
    return ZR_OK;
}

zr_status zr_gpt_backend_of(zr_device_kind kind, const zr_gpt_backend_i **out)
{
    const zr_gpt_config gpt2 = {.arch = ZR_ARCH_GPT2};
    return zr_gpt_backend_for(&gpt2, kind, out);
}

zr_status zr_gpt_engine_predict_on(const zr_gpt_backend_i *be, const zr_gpt_config *cfg,
                                   const zr_gpt_shape *s, const zr_engine_config *ecfg,
                                   const zr_comm *comm, zr_gpt_memory_prediction *host,
                                   zr_gpt_memory_prediction *device)
{
    zr_gpt_memory_prediction p;
    ZR_CHECK(zr_gpt_engine_predict(cfg, s->B, s->T, s->recompute, ecfg, comm, &p));
    p.activations = be->model_bytes(cfg, s, ecfg);
    memset(host, 0, sizeof *host);
    memset(device, 0, sizeof *device);
    host->allowance = p.allowance;
    zr_gpt_memory_prediction *where = be->device_memory ? device : host;
    where->state = p.state;
    where->activations = p.activations;
    where->pool = p.pool;
    host->total = host->state + host->activations + host->pool + host->allowance;
    device->total = device->state + device->activations + device->pool;
    return ZR_OK;
}

zr_status zr_gpt_run_init(zr_gpt_run *r, const zr_device *dev, const zr_gpt_config *cfg,
                          const zr_gpt_shape *s, const zr_engine_config *ecfg)
{
    memset(r, 0, sizeof *r);
    const zr_gpt_backend_i *be;
    ZR_CHECK(zr_gpt_backend_for(cfg, dev->kind, &be));
    if (be->check_shape != NULL) {
        ZR_CHECK(be->check_shape(cfg, s));
    }
    ZR_CHECK(be->init(&r->model, dev, cfg, s, ecfg));
    r->be = be;
    r->owned = 1;
    return ZR_OK;
}

zr_gpt_run zr_gpt_run_host(zr_gpt *m)
{
    return (zr_gpt_run){&zr_gpt_backend_cpu, m, 0};
}

void zr_gpt_run_free(zr_gpt_run *r)
{
    if (r == NULL || r->be == NULL) {
        return;
    }
    if (r->owned) {
        r->be->free(r->model);
    }
    memset(r, 0, sizeof *r);
}

zr_stream *zr_gpt_run_stream(const zr_gpt_run *r)
{
    return r->be->stream != NULL ? r->be->stream(r->model) : NULL;
}

/* ---- the schedule ------------------------------------------------------------------ */

/*
 * A dry walk's backend: no model; each unit's computation reported to the
 * engine (its model pointer) in its place.
 */
static zr_status dry_fwd(void *model, int u, const void *p, const void *p0)
{
    zr_engine_note_compute(model, u, ZR_PHASE_FORWARD);
    return ZR_OK;
}

static zr_status dry_bwd(void *model, int u, const void *p, const void *p0, void *g, void *g0)
{
    zr_engine_note_compute(model, u, ZR_PHASE_BACKWARD);
    return ZR_OK;
}

static zr_status dry_nothing(void *model)
{
    return ZR_OK;
}

static zr_status dry_begin(void *model, const int *inputs, const int *targets)
{
    return ZR_OK;
}

static const zr_gpt_backend_i dry = {
    .name = "dry walk",
    .forward_begin = dry_begin,
    .forward_unit = dry_fwd,
    .backward_begin = dry_nothing,
    .backward_unit = dry_bwd,
};

/* Forward through every unit; leaves units last (L+1) and 0 gathered for the backward. */
static zr_status forward(const zr_gpt_run *r, zr_engine *e, const int *inputs, const int *targets,
                         const void **p_last, const void **p_unit0)
{
    int last = e->nunits - 1;
    ZR_CHECK(r->be->forward_begin(r->model, inputs, targets));
    ZR_CHECK(zr_engine_prefetch(e, 0, ZR_PHASE_FORWARD));
    for (int u = 0; u < last; u++) {
        const void *p;
        ZR_CHECK(zr_engine_fetch(e, u, ZR_PHASE_FORWARD, &p));
        ZR_CHECK(zr_engine_prefetch(e, u + 1, ZR_PHASE_FORWARD));
        ZR_CHECK(r->be->forward_unit(r->model, u, p, NULL));
        ZR_CHECK(zr_engine_release(e, u));
    }
    /* the tied LM head: unit 0 comes back (from the hpZ secondary when there is one) */
    ZR_CHECK(zr_engine_prefetch(e, 0, ZR_PHASE_FORWARD));
    ZR_CHECK(zr_engine_fetch(e, last, ZR_PHASE_FORWARD, p_last));
    ZR_CHECK(zr_engine_fetch(e, 0, ZR_PHASE_FORWARD, p_unit0));
    return r->be->forward_unit(r->model, last, *p_last, *p_unit0);
}

/* One micro-batch; the dry backend walks it on a dry engine (no loss, no inputs). */
static zr_status micro(const zr_gpt_run *r, zr_engine *e, const int *inputs, const int *targets,
                       float *loss)
{
    int last = e->nunits - 1;
    const void *p_last, *p0;
    ZR_CHECK(zr_engine_micro_begin(e));
    ZR_CHECK(forward(r, e, inputs, targets, &p_last, &p0));
    if (loss != NULL) {
        ZR_CHECK(r->be->loss(r->model, loss));
    }
    ZR_CHECK(r->be->backward_begin(r->model));
    void *g_last, *g0;
    ZR_CHECK(zr_engine_grads(e, last, &g_last));
    ZR_CHECK(zr_engine_grads(e, 0, &g0));
    ZR_CHECK(zr_engine_prefetch(e, last - 1, ZR_PHASE_BACKWARD));
    ZR_CHECK(r->be->backward_unit(r->model, last, p_last, p0, g_last, g0));
    ZR_CHECK(zr_engine_release(e, last));
    ZR_CHECK(zr_engine_release(e, 0));
    ZR_CHECK(zr_engine_grads_done(e, last));
    for (int u = last - 1; u >= 1; u--) {
        const void *p;
        void *g;
        ZR_CHECK(zr_engine_fetch(e, u, ZR_PHASE_BACKWARD, &p));
        ZR_CHECK(zr_engine_prefetch(e, u - 1 >= 1 ? u - 1 : -1, ZR_PHASE_BACKWARD));
        ZR_CHECK(zr_engine_grads(e, u, &g));
        ZR_CHECK(r->be->backward_unit(r->model, u, p, NULL, g, NULL));
        ZR_CHECK(zr_engine_release(e, u));
        ZR_CHECK(zr_engine_grads_done(e, u));
    }
    /* the embedding's backward reads no parameters: no gather */
    ZR_CHECK(r->be->backward_unit(r->model, 0, NULL, NULL, g0, NULL));
    return zr_engine_grads_done(e, 0);
}

zr_status zr_gpt_engine_micro(zr_gpt_run *r, zr_engine *e, const int *inputs, const int *targets,
                              float *loss)
{
    ZR_ASSERT(r != NULL && r->be != NULL && loss != NULL);
    ZR_CHECK(r->be->check_engine(r->model, e));
    return micro(r, e, inputs, targets, loss);
}

zr_status zr_gpt_engine_walk(zr_engine *e)
{
    ZR_ASSERT(e->dry.event != NULL && e->nunits >= 2);
    zr_gpt_run r = {&dry, e, 0};
    return micro(&r, e, NULL, NULL, NULL);
}

zr_status zr_gpt_engine_eval(zr_gpt_run *r, zr_engine *e, const int *inputs, const int *targets,
                             float *loss)
{
    ZR_ASSERT(r != NULL && r->be != NULL && loss != NULL);
    ZR_CHECK(r->be->check_engine(r->model, e));
    const void *p_last, *p0;
    ZR_CHECK(forward(r, e, inputs, targets, &p_last, &p0));
    ZR_CHECK(r->be->loss(r->model, loss));
    ZR_CHECK(zr_engine_release(e, e->nunits - 1));
    ZR_CHECK(zr_engine_release(e, 0));
    /* The releases above cut hpZ secondaries from this forward's gathers. A
     * training step starts by gathering from the primary shards; if these
     * secondaries stayed valid it would read them instead (a qwZ gather cut
     * to bf16 is not the primary's value), and a run that validates would
     * train differently from one that does not, or from its own resume. */
    zr_engine_invalidate_secondary(e);
    return ZR_OK;
}

/* Unit u of the model file at path into the engine, through a full-size buffer. */
static zr_status load_llmc_unit(zr_engine *e, const zr_gpt_config *cfg, const char *path, int u)
{
    float *full;
    ZR_ALLOC(full, zr_gpt_config_unit_numel(cfg, u));
    zr_status st;
    ZR_CHECK_GOTO(zr_gpt_read_llmc_unit(path, cfg, u, full), st, done);
    st = zr_engine_set_params(e, u, full);
done:
    zr_free(full);
    return st;
}

zr_status zr_gpt_engine_load_llmc(zr_engine *e, const zr_gpt_config *cfg, const char *path)
{
    int n = zr_gpt_config_unit_count(cfg);
    ZR_ASSERT(n == e->nunits);
    for (int u = 0; u < n; u++) {
        ZR_CHECK(load_llmc_unit(e, cfg, path, u));
    }
    return ZR_OK;
}
