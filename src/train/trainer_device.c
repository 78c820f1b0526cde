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
    t->on_gpu = 0;
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
    ZR_CHECK(zr_comm_agree(&t->comm, st));
    t->on_gpu = 1;
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

/*
 * The GPU's compute type: bf16.enabled, as in DeepSpeed, means bf16 weights
 * and activations (fp32 accumulation, fp32 master weights in the engine);
 * false gives the fp32 mode compared with the CPU. (On the CPU bf16.enabled
 * sets the wire and the matrix products' inputs: cpu_products below.)
 */
static zr_dtype compute_type(const zr_trainer *t)
{
    return t->cfg.bf16_enabled ? ZR_DTYPE_BF16 : ZR_DTYPE_F32;
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
 * What one rank holds on its GPU, predicted before any of it is allocated:
 * the device model (activations; bf16: the unit buffers its engine's fp32
 * buffers need), the engine's model state and its pool's bound
 * (zr_gpt_engine_predict, the host engine's formulas for the GPU's working
 * type: the device engine lays its state out the same way), checked against
 * the GPU's free memory.
 */
static zr_status check_gpu_memory(zr_trainer *t, int B, int T)
{
    const zr_train_config *c = &t->cfg;
    int bmax = zr_gpt_cuda_max_batch(&t->mcfg, T);
    if (B > bmax) {
        ZR_FAIL(ZR_ERR_INVALID,
                "train_micro_batch_size_per_gpu %d at zr.model.seq_len %d is more than the GPU "
                "model takes (%d: its kernels take micro-batch x seq_len rows up to 2^30 and "
                "micro-batch x heads attention blocks up to 65535); lower "
                "train_micro_batch_size_per_gpu and raise gradient_accumulation_steps",
                B, T, bmax);
    }
    size_t free_b = 0, total_b = 0;
    ZR_CHECK(zr_device_mem_info(&t->device, &free_b, &total_b));
    zr_engine_config ecfg = zr_config_engine(c, 1);
    zr_gpt_memory_prediction p;
    ZR_CHECK(zr_gpt_engine_predict(&t->mcfg, B, T, 0, &ecfg, &t->comm, &p));
    double model = (double)zr_gpt_gpu_device_bytes(&t->mcfg, B, T, compute_type(t), &ecfg);
    double need = model + (double)p.state + (double)p.pool;
    t->gpu_predicted = (size_t)need;
    /* the peak the progress line shows is this run's */
    zr_mem_device_peak_reset();
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
    ZR_CHECK(zr_comm_use_device(&t->comm, &t->device, t->gpu.stream, want, &nccl, &shared));
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
    int mine = zr_gpt_set_products(&t->model, t->cfg.bf16_enabled, why, sizeof why);
    int64_t not_all[2] = {mine < 0, t->cfg.bf16_enabled && mine == 0};
    ZR_CHECK(zr_comm_allreduce_max_i64(&t->comm, ZR_GROUP_WORLD, not_all, 2));
    if (mine < 0) {
        ZR_FAIL(ZR_ERR_NOMEM, "%s", why);
    }
    if (not_all[0]) {
        ZR_FAIL(ZR_ERR_REMOTE, "another rank had no memory for the bf16 products' scratch");
    }
    if (not_all[1] && mine == 1) {
        (void)zr_gpt_set_products(&t->model, 0, why, sizeof why);
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

zr_status zr_trainer_init_model(zr_trainer *t, int B, int T)
{
    if (!t->on_gpu) {
        ZR_CHECK(zr_comm_agree(
            &t->comm, zr_gpt_init_ex(&t->model, &t->mcfg, B, T, t->cfg.activation_checkpointing)));
        return cpu_products(t);
    }
    ZR_CHECK(zr_comm_agree(&t->comm, check_gpu_memory(t, B, T)));
    if (t->cfg.activation_checkpointing) {
        zr_trainer_note(t, ZR_LOG_WARN,
                        "zr.model.activation_checkpointing has no effect on the GPU yet: every "
                        "activation is kept");
    }
    zr_status st = zr_gpt_init_ex(&t->model, &t->mcfg, 1, 1, 0);
    zr_engine_config ecfg = zr_config_engine(&t->cfg, 1);
    if (st == ZR_OK) {
        st = zr_gpt_gpu_init(&t->gpu, &t->device, &t->mcfg, B, T, compute_type(t), &ecfg);
    }
    ZR_CHECK(zr_comm_agree(&t->comm, st));
    return use_transport(t);
}
