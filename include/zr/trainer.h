/*
 * zr/trainer.h - the training loop of zr as a library: a GPT trained across
 * MPI ranks with the ZeRO engine from a finalized zr_train_config, with
 * validation, metrics, checkpoints, resume and resharding.
 *
 * `zr train`, `zr bench train` and tests drive the same loop:
 *
 *   zr_trainer t;
 *   zr_trainer_init(&t, MPI_COMM_WORLD, &cfg, note, ctx);   data, model, engine, lock
 *   if (resuming) zr_trainer_resume(&t);                  newest (or --resume-from) checkpoint
 *   zr_trainer_catch_signals(&t);                          optional: SIGINT/SIGTERM stop the run
 *   while (!zr_trainer_done(&t)) {
 *       zr_trainer_step(&t, &rec);                         one optimizer step; print rec
 *       if (rec.stop) break;                               a stop request, agreed by every rank
 *   }
 *   zr_trainer_finish(&t, &summary);                       final checkpoint, totals
 *   st = zr_trainer_conclude(&t, st);                      every rank ends with the same status
 *   zr_trainer_free(&t, exit_code);
 *
 * Every call is collective: every rank makes the same calls in the same
 * order, and every failure is agreed on, so an error ends every rank with
 * the same message. The trainer prints nothing itself: rank 0's notices go
 * to the note callback, and each step's numbers come back in a record.
 */
#ifndef ZR_TRAINER_H
#define ZR_TRAINER_H

#include <signal.h>

#include "zr/checkpoint.h"
#include "zr/config.h"
#include "zr/data.h"
#include "zr/file.h"
#include "zr/gpt_engine.h"
#include "zr/metrics.h"
#include "zr/schedule.h"

/* Rank 0's notices (level ZR_LOG_INFO: progress news; ZR_LOG_WARN: warnings). */
typedef void (*zr_trainer_note_fn)(void *ctx, zr_log_level level, const char *msg);

/* What one optimizer step did; every field is the same on every rank unless noted. */
typedef struct zr_step_record {
    int step;      /* steps done, counting this one (1-based) */
    int total;     /* zr.train.train_steps */
    float loss;    /* mean training loss over ranks and micro-batches */
    float lr;      /* the scheduled learning rate of this step */
    int validated; /* 1: val_loss holds this step's validation loss */
    float val_loss;
    double grad_norm;    /* before clipping */
    int skipped;         /* non-finite gradients: the update was skipped */
    double tokens_per_s; /* this rank's step time (rank 0's is what is printed) */
    double t_step, t_compute, t_comm, t_optim;          /* this rank, seconds */
    double bytes_intra, bytes_inter, zero3_bytes_inter; /* summed over ranks */
    double eta_s;                                       /* estimate to the last step */
    double device_mem_peak;       /* this rank's peak GPU bytes so far (0 on the CPU device) */
    int print;                    /* 1: a periodic progress line is due (steps_per_print) */
    char checkpoint[ZR_PATH_MAX]; /* saved after this step, "" if none */
    int stop;                     /* a stop was requested (signal): the loop ends here */
} zr_step_record;

/* Totals of the steps this process ran (filled by zr_trainer_finish). */
typedef struct zr_train_summary {
    int start, end; /* steps [start, end) ran in this process */
    double seconds;
    float first_loss, last_loss, val_loss; /* val_loss NaN if never validated */
    double bytes_inter, bytes_intra, zero3_bytes_inter;
    char checkpoint[ZR_PATH_MAX]; /* the final checkpoint, "" if none */
} zr_train_summary;

typedef struct zr_trainer {
    int rank, world;
    zr_train_config cfg;
    zr_comm comm;
    int comm_up;
    zr_dataset data;
    zr_dataset val_data; /* zr.data.val_path's, or empty: the last ZR_VAL_PERCENT of data */
    zr_loader train, val;
    zr_gpt_config mcfg;
    zr_device device;           /* where the model computes (zr.device) */
    const zr_gpt_backend_i *be; /* the GPT's backend for it */
    zr_gpt_shape shape;         /* the micro-batch it computes */
    zr_gpt_run run;             /* the model on it */
    /* in device memory (be->device_memory): the predicted peak bytes per rank there (model
       state, engine buffers, activations), checked at start-up against its free memory */
    size_t gpu_predicted;
    /* what one rank holds, predicted once in set-up (zr_gpt_engine_predict_on): in host
       memory, and in the device's (all zero where the model computes in host memory) */
    zr_gpt_memory_prediction mem_host, mem_dev;
    zr_gpt_specs specs;
    /* the engine's settings from cfg for this device (zr_config_engine), computed once in
       setup when the device is known and used by every check and init that needs them */
    zr_engine_config ecfg;
    zr_engine engine;
    int engine_up;
    zr_ckpt_dir_lock lock;   /* rank 0: exclusive use of the checkpoint dir */
    zr_metrics_file metrics; /* rank 0; metrics.f == NULL when there is no metrics file */
    int metrics_open;        /* the metrics file was opened (at the first step) */
    zr_status metrics_st;    /* rank 0: first failed metrics write, agreed on later */
    char metrics_err[1024];
    int *inputs, *targets;
    char *config_json;
    zr_lr_schedule sched; /* the scheduler section, parsed once */
    zr_trainer_note_fn note;
    void *note_ctx;
    volatile sig_atomic_t stop; /* set by zr_trainer_request_stop (signal handlers) */
    int start, next;            /* first step of this process, next step to run (0-based) */
    int nonfinite;              /* consecutive steps with a non-finite loss or gradient */
    double t_run;
    zr_train_summary sum;
    char data_id[192];    /* what the data is (kind, tokens, CRC of its ends), for manifests */
    int64_t resumed_from; /* the step this run resumed from (rotation keeps it), -1: none */
    char *history_json;   /* the resumes that led to this state (JSON array), or NULL */
    char *resume_event;   /* the metrics line recording this run's resume, or NULL */
    double grace_s;       /* seconds the launcher waits after SIGTERM before SIGKILL; <0 unknown */
    int grace_warned;     /* the warning that a stop may not fit in it was given */
} zr_trainer;

/*
 * Set up a run of cfg (finalized by zr_config_finalize and agreed by every
 * rank): the communicator with the configuration's hpZ group, the data, the
 * model (from zr.model.init or initialised from the seed), the engine, and
 * the checkpoint dir (locked, a crashed save's leftovers cleared, and a fresh
 * run refused when it already holds checkpoints).
 */
zr_status zr_trainer_init(zr_trainer *t, MPI_Comm world, const zr_train_config *cfg,
                          zr_trainer_note_fn note, void *note_ctx);

/*
 * Restore from zr.checkpoint.resume_from or the dir's newest checkpoint.
 * What the checkpoint's configuration and this run's differ in is decided
 * per key (zr_config_policy): a MATCH key (seed, zr.model.init), another
 * model or other data (unless zr.checkpoint.resume_new_data) is refused,
 * naming the key, both values and the checkpoint; every other difference is
 * listed at start-up and recorded in the next manifests and the metrics file.
 */
zr_status zr_trainer_resume(zr_trainer *t);

/* 1 when every step up to zr.train.train_steps has run. */
int zr_trainer_done(const zr_trainer *t);

/*
 * One optimizer step: the micro-batches, the engine step, validation when
 * due, the metrics line, a checkpoint when due or when a stop was requested.
 * rec is filled even when the step fails after its numbers are known (a
 * divergence: ZR_ERR_NONFINITE after zr.train.max_nonfinite_steps).
 */
zr_status zr_trainer_step(zr_trainer *t, zr_step_record *rec);

/* Ask the loop to stop after the current step (async-signal-safe). */
void zr_trainer_request_stop(zr_trainer *t);

/*
 * SIGINT and SIGTERM call zr_trainer_request_stop(t) from now until
 * zr_trainer_free(t): the run stops after the step every rank agrees on,
 * with a checkpoint when it has a checkpoint dir. One trainer per process
 * receives them (the last one that asked).
 */
void zr_trainer_catch_signals(zr_trainer *t);

/* After the last step: the final checkpoint and the run's totals. */
zr_status zr_trainer_finish(zr_trainer *t, zr_train_summary *sum);

/* The memory the engine holds per rank, for the start-up line. */
zr_memory zr_trainer_memory(const zr_trainer *t);

/* Agree on how the run ended; returns the status every rank reports. */
zr_status zr_trainer_conclude(zr_trainer *t, zr_status st);

/*
 * Release everything. When the run failed mid-step, exchanges abandoned by
 * the ranks still own their buffers: the job then ends through the
 * communicator's abort with exit_code instead of returning.
 */
void zr_trainer_free(zr_trainer *t, int exit_code);

#endif /* ZR_TRAINER_H */
