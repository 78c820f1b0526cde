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

#include "gpt_gpu_impl.h"

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

zr_status zr_gpt_engine_init_params(zr_engine *e, const zr_gpt *m, uint64_t seed)
{
    int n = zr_gpt_unit_count(m);
    ZR_ASSERT(n == e->nunits);
    for (int u = 0; u < n; u++) {
        float *full;
        ZR_ALLOC(full, zr_gpt_unit_numel(m, u));
        zr_gpt_unit_init_params(m, u, full, seed);
        zr_status st = zr_engine_set_params(e, u, full);
        zr_free(full);
        ZR_CHECK(st);
    }
    return ZR_OK;
}

/*
 * What computes the units: the CPU model, the GPU model, or neither (a dry
 * walk, each unit's computation reported to the engine instead).
 */
typedef struct runner {
    zr_gpt *cpu;
    zr_gpt_gpu *gpu;
} runner;

static int is_dry(const runner *r)
{
    return r->cpu == NULL && r->gpu == NULL;
}

/*
 * Unit u's forward: the model's, or (a dry walk) its report. p and p0 are the
 * engine's buffers, of zr_engine_param_type (the CPU model's are fp32:
 * check_cpu_engine).
 */
static zr_status fwd(const runner *r, zr_engine *e, int u, const void *p, const void *p0)
{
    if (r->gpu != NULL) {
        return zr_gpt_gpu_forward_unit(r->gpu, u, p, p0);
    }
    if (r->cpu != NULL) {
        return zr_gpt_forward_unit(r->cpu, u, p, p0);
    }
    zr_engine_note_compute(e, u, ZR_PHASE_FORWARD);
    return ZR_OK;
}

static zr_status bwd(const runner *r, zr_engine *e, int u, const void *p, const void *p0, void *g,
                     void *g0)
{
    if (r->gpu != NULL) {
        return zr_gpt_gpu_backward_unit(r->gpu, u, p, p0, g, g0);
    }
    if (r->cpu != NULL) {
        return zr_gpt_backward_unit(r->cpu, u, p, p0, g, g0);
    }
    zr_engine_note_compute(e, u, ZR_PHASE_BACKWARD);
    return ZR_OK;
}

static zr_status loss_of(const runner *r, float *loss)
{
    if (r->gpu != NULL) {
        return zr_gpt_gpu_loss(r->gpu, loss);
    }
    *loss = zr_gpt_loss(r->cpu);
    return ZR_OK;
}

/* Forward through every unit; leaves units last (L+1) and 0 gathered for the backward. */
static zr_status forward(const runner *r, zr_engine *e, const int *inputs, const int *targets,
                         const void **p_last, const void **p_unit0)
{
    int last = e->nunits - 1;
    if (r->cpu != NULL) {
        ZR_ASSERT(zr_gpt_unit_count(r->cpu) == e->nunits);
        ZR_CHECK(zr_gpt_forward_begin(r->cpu, inputs, targets));
    }
    if (r->gpu != NULL) {
        ZR_ASSERT(r->gpu->model.cfg.layers + 2 == e->nunits);
        ZR_CHECK(zr_gpt_gpu_forward_begin(r->gpu, inputs, targets));
    }
    ZR_CHECK(zr_engine_prefetch(e, 0, ZR_PHASE_FORWARD));
    for (int u = 0; u < last; u++) {
        const void *p;
        ZR_CHECK(zr_engine_fetch(e, u, ZR_PHASE_FORWARD, &p));
        ZR_CHECK(zr_engine_prefetch(e, u + 1, ZR_PHASE_FORWARD));
        ZR_CHECK(fwd(r, e, u, p, NULL));
        ZR_CHECK(zr_engine_release(e, u));
    }
    /* the tied LM head: unit 0 comes back (from the hpZ secondary when there is one) */
    ZR_CHECK(zr_engine_prefetch(e, 0, ZR_PHASE_FORWARD));
    ZR_CHECK(zr_engine_fetch(e, last, ZR_PHASE_FORWARD, p_last));
    ZR_CHECK(zr_engine_fetch(e, 0, ZR_PHASE_FORWARD, p_unit0));
    return fwd(r, e, last, *p_last, *p_unit0);
}

/* One micro-batch; a dry runner walks it on a dry engine (no loss, no inputs). */
static zr_status micro(const runner *r, zr_engine *e, const int *inputs, const int *targets,
                       float *loss)
{
    int last = e->nunits - 1;
    const void *p_last, *p0;
    ZR_CHECK(zr_engine_micro_begin(e));
    ZR_CHECK(forward(r, e, inputs, targets, &p_last, &p0));
    if (!is_dry(r)) {
        ZR_CHECK(loss_of(r, loss));
    }
    if (r->cpu != NULL) {
        ZR_CHECK(zr_gpt_backward_begin(r->cpu));
    }
    if (r->gpu != NULL) {
        ZR_CHECK(zr_gpt_gpu_backward_begin(r->gpu));
    }
    void *g_last, *g0;
    ZR_CHECK(zr_engine_grads(e, last, &g_last));
    ZR_CHECK(zr_engine_grads(e, 0, &g0));
    ZR_CHECK(zr_engine_prefetch(e, last - 1, ZR_PHASE_BACKWARD));
    ZR_CHECK(bwd(r, e, last, p_last, p0, g_last, g0));
    ZR_CHECK(zr_engine_release(e, last));
    ZR_CHECK(zr_engine_release(e, 0));
    ZR_CHECK(zr_engine_grads_done(e, last));
    for (int u = last - 1; u >= 1; u--) {
        const void *p;
        void *g;
        ZR_CHECK(zr_engine_fetch(e, u, ZR_PHASE_BACKWARD, &p));
        ZR_CHECK(zr_engine_prefetch(e, u - 1 >= 1 ? u - 1 : -1, ZR_PHASE_BACKWARD));
        ZR_CHECK(zr_engine_grads(e, u, &g));
        ZR_CHECK(bwd(r, e, u, p, NULL, g, NULL));
        ZR_CHECK(zr_engine_release(e, u));
        ZR_CHECK(zr_engine_grads_done(e, u));
    }
    /* the embedding's backward reads no parameters: no gather */
    ZR_CHECK(bwd(r, e, 0, NULL, NULL, g0, NULL));
    return zr_engine_grads_done(e, 0);
}

/* The CPU model computes in fp32 on the engine's buffers: they must be fp32. */
static zr_status check_cpu_engine(const zr_engine *e)
{
    zr_dtype p = zr_engine_param_type(&e->cfg), g = zr_engine_grad_type(&e->cfg);
    if (p != ZR_DTYPE_F32 || g != ZR_DTYPE_F32) {
        ZR_FAIL(ZR_ERR_INVALID,
                "the GPT on the CPU computes in fp32 on the engine's buffers, which are %s "
                "parameters and %s gradients: give it an engine with fp32 working buffers",
                zr_dtype_name(p), zr_dtype_name(g));
    }
    return ZR_OK;
}

zr_status zr_gpt_engine_micro(zr_gpt *m, zr_engine *e, const int *inputs, const int *targets,
                              float *loss)
{
    ZR_ASSERT(m != NULL);
    ZR_CHECK(check_cpu_engine(e));
    runner r = {m, NULL};
    return micro(&r, e, inputs, targets, loss);
}

/*
 * The GPU model computes on the engine's buffers: they must be on its GPU, of
 * the types it was made for (zr_gpt_gpu_init).
 */
static zr_status check_engine_on(const zr_gpt_gpu *g, const zr_engine *e)
{
    if (!e->on_device || e->device.ordinal != g->dev.ordinal) {
        ZR_FAIL(ZR_ERR_INVALID,
                "the GPT on %s needs a ZeRO engine on the same GPU (a device transport following "
                "the model's stream), not one in %s memory",
                g->dev.name, e->on_device ? e->device.name : "host");
    }
    zr_dtype p = zr_engine_param_type(&e->cfg), gt = zr_engine_grad_type(&e->cfg);
    if (p != g->param_type || gt != g->grad_type) {
        ZR_FAIL(ZR_ERR_INVALID,
                "the GPT on %s was made for an engine with %s parameters and %s gradients, this "
                "one hands out %s and %s",
                g->dev.name, zr_dtype_name(g->param_type), zr_dtype_name(g->grad_type),
                zr_dtype_name(p), zr_dtype_name(gt));
    }
    return ZR_OK;
}

zr_status zr_gpt_engine_micro_gpu(zr_gpt_gpu *g, zr_engine *e, const int *inputs,
                                  const int *targets, float *loss)
{
    ZR_ASSERT(g != NULL);
    ZR_CHECK(check_engine_on(g, e));
    runner r = {NULL, g};
    return micro(&r, e, inputs, targets, loss);
}

zr_status zr_gpt_engine_walk(zr_engine *e)
{
    ZR_ASSERT(e->dry.event != NULL && e->nunits >= 2);
    runner r = {NULL, NULL};
    return micro(&r, e, NULL, NULL, NULL);
}

static zr_status eval(const runner *r, zr_engine *e, const int *inputs, const int *targets,
                      float *loss)
{
    const void *p_last, *p0;
    ZR_CHECK(forward(r, e, inputs, targets, &p_last, &p0));
    ZR_CHECK(loss_of(r, loss));
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

zr_status zr_gpt_engine_eval(zr_gpt *m, zr_engine *e, const int *inputs, const int *targets,
                             float *loss)
{
    ZR_CHECK(check_cpu_engine(e));
    runner r = {m, NULL};
    return eval(&r, e, inputs, targets, loss);
}

zr_status zr_gpt_engine_eval_gpu(zr_gpt_gpu *g, zr_engine *e, const int *inputs, const int *targets,
                                 float *loss)
{
    ZR_CHECK(check_engine_on(g, e));
    runner r = {NULL, g};
    return eval(&r, e, inputs, targets, loss);
}

/* Unit u of the model file at path into the engine, through a full-size buffer. */
static zr_status load_llmc_unit(zr_engine *e, const zr_gpt *m, const char *path, int u)
{
    float *full;
    ZR_ALLOC(full, zr_gpt_unit_numel(m, u));
    zr_status st;
    ZR_CHECK_GOTO(zr_gpt_read_llmc_unit(path, &m->cfg, u, full), st, done);
    st = zr_engine_set_params(e, u, full);
done:
    zr_free(full);
    return st;
}

zr_status zr_gpt_engine_load_llmc(zr_engine *e, const zr_gpt *m, const char *path)
{
    int n = zr_gpt_unit_count(m);
    ZR_ASSERT(n == e->nunits);
    for (int u = 0; u < n; u++) {
        ZR_CHECK(load_llmc_unit(e, m, path, u));
    }
    return ZR_OK;
}
