/*
 * trainer_device.c - where zr train computes (zr.device, trainer_impl.h):
 * the CPU, or one GPU per rank chosen by node-local rank (zr/device.h), and
 * the model built there.
 *
 * Every rank must compute on the same kind of device: the engine's state
 * follows the model onto the GPU and its collectives move device memory,
 * which only works when every rank does it. So the choice is agreed over the
 * control plane: "auto" takes the GPUs only when every rank sees one, and
 * "cuda" fails on every rank, at once, with the first rank's reason when any
 * rank has none.
 *
 * On GPUs the communicator's data plane becomes a device transport
 * (zr.transport) that follows the model's stream, so the engine built next
 * keeps its state on the GPU (zr/zero.h, "Where the state lives").
 */
#include "trainer_impl.h"

#include <stdio.h>
#include <string.h>

zr_status zr_trainer_pick_device(zr_trainer *t)
{
    const char *want = t->cfg.device;
    t->device = zr_device_cpu();
    ZR_CHECK(zr_gpt_backend_for(&t->mcfg, t->device.kind, &t->be));
    if (strcmp(want, "cpu") == 0) {
        zr_trainer_note(t, ZR_LOG_INFO, "device: cpu (zr.device cpu)");
        return ZR_OK;
    }
    char why[512] = "";
    int has = 0, all = 0;
    ZR_CHECK(zr_comm_gpus_everywhere(&t->comm, &has, &all, why, sizeof why));
    if (strcmp(want, "cuda") == 0) {
        zr_status st = ZR_OK;
        if (!has) {
            st = zr_error_at(ZR_ERR_DEVICE, __FILE__, __LINE__,
                             "zr.device cuda (--device cuda): %s; use --device cpu, or --device "
                             "auto to take the GPUs only where every rank has one",
                             why);
        }
        ZR_CHECK(zr_comm_agree(&t->comm, st));
    } else if (!all) {
        zr_trainer_note(t, ZR_LOG_INFO, "device: cpu (zr.device auto: %s)", why);
        return ZR_OK;
    }
    zr_status st = zr_device_open_for_rank(t->comm.rank[ZR_GROUP_NODE], t->comm.size[ZR_GROUP_NODE],
                                           &t->device);
    if (st == ZR_OK) {
        st = zr_gpt_backend_for(&t->mcfg, t->device.kind, &t->be);
    }
    ZR_CHECK(zr_comm_agree(&t->comm, st));
    char desc[256];
    zr_device_describe(&t->device, desc, sizeof desc);
    zr_trainer_note(t, ZR_LOG_INFO,
                    "device: cuda (zr.device %s), one GPU per rank by node-local rank; rank 0 on "
                    "%s; %s",
                    want, desc,
                    t->cfg.bf16_enabled
                        ? "bf16 compute on bf16 working parameters and gradients (bf16.enabled; "
                          "fp32 master weights)"
                        : "fp32 compute, TF32 off (bf16.enabled false)");
    return ZR_OK;
}

/* The node-local ranks on this rank's GPU (itself included). */
static int gpu_sharing(const zr_trainer *t)
{
    int per_node = t->comm.size[ZR_GROUP_NODE], count = 0;
    if (zr_device_cuda_count(&count) != ZR_OK || count <= 0) {
        zr_error_clear();
        return 1;
    }
    return (per_node + count - 1) / count;
}

/*
 * What one rank holds in its device's memory, predicted before any of it is
 * allocated: the device model (activations; bf16: the unit buffers its
 * engine's fp32 buffers need), the engine's model state and its pool's
 * bound (zr_gpt_engine_predict, the host engine's formulas for the device's
 * working type: the device engine lays its state out the same way), checked
 * against the device's free memory.
 */
static zr_status check_device_memory(zr_trainer *t, int B, int T)
{
    const zr_train_config *c = &t->cfg;
    if (t->be->check_shape != NULL) {
        ZR_CHECK(t->be->check_shape(&t->mcfg, &t->shape));
    }
    size_t free_b = 0, total_b = 0;
    ZR_CHECK(zr_device_mem_info(&t->device, &free_b, &total_b));
    const zr_gpt_memory_prediction p = t->mem_dev; /* set-up's prediction */
    double model = (double)p.activations, need = (double)p.total;
    t->gpu_predicted = (size_t)need;
    int sharing = gpu_sharing(t);
    const double GB = 1e9;
    zr_trainer_note(t, ZR_LOG_INFO,
                    "GPU memory: predicted peak per rank %.3f GB = model state %.3f (stage %d) + "
                    "engine buffers %.3f + activations and unit buffers %.3f (for "
                    "train_micro_batch_size_per_gpu %d x zr.model.seq_len %d); %.3f GB free of "
                    "%.3f GB",
                    need / GB, (double)p.state / GB, c->stage, (double)p.pool / GB, model / GB, B,
                    T, (double)free_b / GB, (double)total_b / GB);
    if (need * sharing > (double)free_b) {
        ZR_FAIL(ZR_ERR_NOMEM,
                "needs %.3f GB of GPU memory per rank (%d rank%s on this GPU), but %s has %.3f GB "
                "free: use more GPUs or a higher zero_optimization.stage (%d), lower "
                "train_micro_batch_size_per_gpu (%d) or zr.model.seq_len (%d), or use fewer ranks "
                "per GPU",
                need / GB, sharing, sharing == 1 ? "" : "s", t->device.name, (double)free_b / GB,
                c->stage, B, T);
    }
    return ZR_OK;
}

/*
 * zr.transport: NCCL where every rank has a GPU of its own and zr has NCCL
 * ("auto" or "nccl"), else the staged transport; agreed by every rank (it is
 * one collective choice), following the model's stream.
 */
static zr_status use_transport(zr_trainer *t)
{
    const char *want = t->cfg.transport;
    int nccl = 0, shared = 0;
    ZR_CHECK(
        zr_comm_use_device(&t->comm, &t->device, zr_gpt_run_stream(&t->run), want, &nccl, &shared));
    zr_trainer_note(t, ZR_LOG_INFO,
                    "transport: %s (zr.transport %s%s); the ZeRO engine's state on the GPU",
                    nccl ? "NCCL" : "staged through pinned host memory and MPI", want,
                    strcmp(want, "auto") != 0 ? ""
                    : nccl                    ? ": one GPU per rank"
                    : shared                  ? ": ranks share a GPU"
                                              : ": zr was built without NCCL");
    return ZR_OK;
}

/*
 * bf16.enabled on the CPU: the matrix products on bf16 inputs with fp32
 * accumulation where every rank's CPU has them (zr_gpt_set_products), fp32
 * products on every rank otherwise, so that ranks never compute differently.
 * The wire and the engine are what bf16.enabled makes them either way.
 */
static zr_status cpu_products(zr_trainer *t)
{
    char why[256];
    int mine = t->be->set_products(t->run.model, t->cfg.bf16_enabled, why, sizeof why);
    int64_t not_all[2] = {mine < 0, t->cfg.bf16_enabled && mine == 0};
    ZR_CHECK(zr_comm_allreduce_max_i64(&t->comm, ZR_GROUP_WORLD, not_all, 2));
    if (mine < 0) {
        ZR_FAIL(ZR_ERR_NOMEM, "%s", why);
    }
    if (not_all[0]) {
        ZR_FAIL(ZR_ERR_REMOTE, "another rank had no memory for the bf16 products' scratch");
    }
    if (not_all[1] && mine == 1) {
        (void)t->be->set_products(t->run.model, 0, why, sizeof why);
        snprintf(why, sizeof why, "fp32 products: another rank's CPU has no bf16 products");
    }
    if (t->cfg.bf16_enabled && !not_all[1]) {
        zr_trainer_note(t, ZR_LOG_INFO, "bf16.enabled on the CPU: %s; fp32 elsewhere", why);
    } else if (t->cfg.bf16_enabled) {
        zr_log_at(ZR_LOG_WARN, __FILE__, __LINE__, "bf16.enabled on the CPU (rank %d): %s", t->rank,
                  why);
    }
    return ZR_OK;
}

/*
 * The model on the chosen device's backend. Where it keeps its memory on the
 * device, that memory is checked first, and the communicator's data plane
 * becomes a device transport following the model's stream; a backend with
 * bf16 matrix products on fp32 (the CPU's) sets them once every rank agrees.
 */
zr_status zr_trainer_init_model(zr_trainer *t, int B, int T)
{
    /* the peak the progress line shows is this run's */
    zr_mem_device_peak_reset();
    if (t->mem_dev.total > 0) {
        ZR_CHECK(zr_comm_agree(&t->comm, check_device_memory(t, B, T)));
    }
    ZR_CHECK(zr_comm_agree(&t->comm,
                           zr_gpt_run_init(&t->run, &t->device, &t->mcfg, &t->shape, &t->ecfg)));
    if (zr_gpt_run_stream(&t->run) != NULL) {
        /* the collectives follow the model's stream */
        return use_transport(t);
    }
    if (t->be->set_products == NULL && t->cfg.bf16_enabled) {
        zr_trainer_note(t, ZR_LOG_WARN,
                        "bf16.enabled: the %s backend computes its matrix products in fp32 (bf16 "
                        "is the wire's only)",
                        t->be->name);
    }
    return t->be->set_products != NULL ? cpu_products(t) : ZR_OK;
}
