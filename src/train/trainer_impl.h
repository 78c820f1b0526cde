/*
 * trainer_impl.h - what the files of the trainer share (not public).
 *
 *   trainer.c         the loop a reader follows top to bottom: init -> step
 *                     -> save -> finish, and the end of a run
 *   trainer_setup.c   what init prepares before the first step: the
 *                     schedule, data, model shape, loaders, the size and
 *                     memory checks, model and engine; the checkpoint dir
 *                     claimed; the metrics file opened at the first step
 *   trainer_device.c  zr.device: the CPU or each rank's GPU, agreed by every
 *                     rank; the GPU's memory check; the model on it
 *   trainer_resume.c  zr_trainer_resume: the checkpoint to continue from,
 *                     checked against this run, loaded and resharded
 */
#ifndef ZR_TRAINER_IMPL_H
#define ZR_TRAINER_IMPL_H

#include "zr/trainer.h"

/* Rank 0's notice to the caller, formatted (nothing on other ranks or without a callback). */
__attribute__((format(printf, 3, 4))) void zr_trainer_note(const zr_trainer *t, zr_log_level level,
                                                           const char *fmt, ...);

/* Checkpoint-dir warnings (leftovers, set-aside checkpoints) from rank 0; ctx is the trainer. */
void zr_trainer_warn_ckpt(void *ctx, const char *msg);

/*
 * Everything between the communicator and the parameters, each step agreed
 * by every rank: the schedule, the data, the model's shape, the loaders, the
 * size and memory checks, the model, its unit specs, the batch buffers and
 * the engine.
 */
zr_status zr_trainer_setup(zr_trainer *t);

/* One optimizer step's micro-batches must fit the training split (at set-up, and after a
   resume at another world size changed gradient_accumulation_steps). */
zr_status zr_trainer_check_accum(const zr_trainer *t);

/*
 * zr.device: "cpu", "cuda" (every rank opens its GPU by node-local rank, or
 * every rank fails with the first failing rank's reason) or "auto" (the GPUs
 * when every rank sees one, else the CPU); rank 0 says which in one line.
 */
zr_status zr_trainer_pick_device(zr_trainer *t);
/* Whether zr.model.init is a Hugging Face folder (a directory), not an llm.c model file. */
int zr_trainer_init_is_hf(const zr_trainer *t);

/*
 * The model for B x T tokens where it computes: the CPU model, or on a GPU
 * the device model (after checking it and the engine's state against the
 * GPU's free memory), a one-token CPU model for the unit table, and the
 * communicator's device transport (zr.transport) following the model's
 * stream, so that the engine is built on the GPU. Agreed by every rank.
 */
zr_status zr_trainer_init_model(zr_trainer *t, int B, int T);

/* Lock the checkpoint dir, clear a crashed save's leftovers, refuse to mix two runs. */
zr_status zr_trainer_claim_dir(zr_trainer *t);

/* Rank 0 opens the metrics file; a resumed run first cuts it back to its checkpoint's step. */
zr_status zr_trainer_open_metrics(zr_trainer *t, int start);

/*
 * A stop under a launcher saves only within the launcher's grace period
 * (zr_launch_grace_s): at start-up, warn when the expected save time exceeds
 * it; after a save, warn (once) when the step and the save just measured do.
 */
void zr_trainer_check_grace(zr_trainer *t);
void zr_trainer_warn_grace(zr_trainer *t, double step_s, double save_s);

#endif /* ZR_TRAINER_IMPL_H */
