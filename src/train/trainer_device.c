/*
 * trainer_device.c - where zr train computes (zr.device, trainer_impl.h):
 * the CPU, or one GPU per rank chosen by node-local rank (zr/device.h), and
 * the model built there.
 *
 * Every rank must compute on the same kind of device: a run that mixed them
 * would still train the same model (the engine is the same), but its speed
 * would be the slowest rank's and "auto" would be a surprise. So the choice
 * is agreed over the control plane: "auto" takes the GPUs only when every
 * rank sees one, and "cuda" fails on every rank, at once, with the first
 * rank's reason when any rank has none.
 */
#include "trainer_impl.h"

#include <stdio.h>
#include <string.h>

/* 1 when this rank sees a GPU; else why not in why. */
static int sees_gpu(char *why, size_t n)
{
    int count = 0;
    if (zr_device_cuda_count(&count) != ZR_OK) {
        snprintf(why, n, "%s", zr_error_message());
        zr_error_clear();
        return 0;
    }
    return count > 0;
}

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
    int has = sees_gpu(why, sizeof why);
    if (strcmp(want, "cuda") == 0) {
        zr_status st = ZR_OK;
        if (!has) {
            st = zr_error_at(ZR_ERR_DEVICE, __FILE__, __LINE__,
                             "zr.device cuda (--device cuda): %s; use --device cpu, or --device "
                             "auto to take the GPUs only where every rank has one",
                             why);
        }
        ZR_CHECK(zr_comm_agree(&t->comm, st));
    } else {
        int64_t missing = has ? 0 : 1;
        ZR_CHECK(zr_comm_allreduce_max_i64(&t->comm, ZR_GROUP_WORLD, &missing, 1));
        if (missing) {
            zr_trainer_note(t, ZR_LOG_INFO, "device: cpu (zr.device auto: %s)",
                            has ? "a rank sees no GPU" : why);
            return ZR_OK;
        }
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
                    t->cfg.bf16_enabled ? "bf16 compute (bf16.enabled; fp32 master weights)"
                                        : "fp32 compute, TF32 off (bf16.enabled false)");
    return ZR_OK;
}

/*
 * The GPU's compute type: bf16.enabled, as in DeepSpeed, means bf16 weights
 * and activations (fp32 accumulation, fp32 master weights in the engine);
 * false gives the fp32 mode compared with the CPU. The CPU computes in fp32
 * either way (there bf16.enabled sets only the wire).
 */
static zr_dtype compute_type(const zr_trainer *t)
{
    return t->cfg.bf16_enabled ? ZR_DTYPE_BF16 : ZR_DTYPE_F32;
}

/* The device model's bytes against this GPU's free memory, before it allocates them. */
static zr_status check_gpu_memory(zr_trainer *t, int B, int T)
{
    size_t free_b = 0, total_b = 0;
    ZR_CHECK(zr_device_mem_info(&t->device, &free_b, &total_b));
    size_t need = zr_gpt_gpu_device_bytes(&t->mcfg, B, T, compute_type(t));
    /* ranks that share a GPU each need their own */
    int per_node = t->comm.size[ZR_GROUP_NODE];
    int sharing = 1, count = 0;
    if (zr_device_cuda_count(&count) == ZR_OK && count > 0) {
        sharing = (per_node + count - 1) / count;
    }
    const double GB = 1e9;
    zr_trainer_note(t, ZR_LOG_INFO,
                    "GPU memory: predicted %.1f MB per rank (activations and unit buffers for "
                    "train_micro_batch_size_per_gpu %d x zr.model.seq_len %d), %.3f GB free of "
                    "%.3f GB",
                    (double)need / 1e6, B, T, (double)free_b / GB, (double)total_b / GB);
    if ((double)need * sharing > (double)free_b) {
        ZR_FAIL(ZR_ERR_NOMEM,
                "needs %.3f GB of GPU memory per rank (%d rank%s on this GPU), but %s has %.3f GB "
                "free: lower train_micro_batch_size_per_gpu (%d) or zr.model.seq_len (%d), or use "
                "fewer ranks per GPU",
                (double)need / GB, sharing, sharing == 1 ? "" : "s", t->device.name,
                (double)free_b / GB, B, T);
    }
    return ZR_OK;
}

zr_status zr_trainer_init_model(zr_trainer *t, int B, int T)
{
    if (!t->on_gpu) {
        return zr_comm_agree(
            &t->comm, zr_gpt_init_ex(&t->model, &t->mcfg, B, T, t->cfg.activation_checkpointing));
    }
    ZR_CHECK(zr_comm_agree(&t->comm, check_gpu_memory(t, B, T)));
    if (t->cfg.activation_checkpointing) {
        zr_trainer_note(t, ZR_LOG_WARN,
                        "zr.model.activation_checkpointing has no effect on the GPU yet: every "
                        "activation is kept");
    }
    zr_status st = zr_gpt_init_ex(&t->model, &t->mcfg, 1, 1, 0);
    if (st == ZR_OK) {
        st = zr_gpt_gpu_init(&t->gpu, &t->device, &t->mcfg, B, T, compute_type(t));
    }
    return zr_comm_agree(&t->comm, st);
}
