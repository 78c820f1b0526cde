/*
 * fault.c - the checkpoint's test hooks, read from the environment at each
 * point of a save: ZR_FAULT_SAVE kills or fails a rank at one stage (to show
 * that a crash or a failure anywhere leaves a directory that resumes and ends
 * every rank at once), ZR_SLOW_SAVE stretches a save (to stop a job in the
 * middle of one). Both cost one getenv per point when unset.
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep */

#include "ckpt_impl.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/*
 * ZR_FAULT_SAVE=k[@N][:R[:kill|:fail]]: world rank R (default 0) kills itself
 * with SIGKILL (kill, the default) or fails with an I/O error (fail) when its
 * save (of step N, or any save) reaches stage k. Tests use it to prove that a
 * crash at every point of a save leaves a directory that resumes (a SIGKILL
 * runs no handler and flushes nothing, like a power cut of the process), and
 * that a failure at every point, on any rank, ends every rank at once with
 * its message. A value that does not parse injects nothing.
 */
zr_status zr_ckpt_fault_point(int stage, int64_t step, int rank)
{
    const char *env = getenv("ZR_FAULT_SAVE");
    if (env == NULL || env[0] == '\0') {
        return ZR_OK;
    }
    char *end = NULL;
    long long k = strtoll(env, &end, 10), at = -1, who = 0;
    if (end == env) {
        return ZR_OK;
    }
    if (*end == '@') {
        const char *p = end + 1;
        at = strtoll(p, &end, 10);
        if (end == p) {
            return ZR_OK;
        }
    }
    if (*end == ':' && end[1] >= '0' && end[1] <= '9') {
        who = strtoll(end + 1, &end, 10);
    }
    int fail = strcmp(end, ":fail") == 0;
    if ((*end != '\0' && !fail && strcmp(end, ":kill") != 0) || k != stage || who != rank ||
        (at >= 0 && at != step)) {
        return ZR_OK;
    }
    if (fail) {
        ZR_FAIL(ZR_ERR_IO, "fault injected by ZR_FAULT_SAVE=%s: save stage %d of step %lld failed",
                env, stage, (long long)step);
    }
    fprintf(stderr, "zr: ZR_FAULT_SAVE=%s: killing rank %d at save stage %d of step %lld\n", env,
            rank, stage, (long long)step);
    fflush(stderr);
    raise(SIGKILL);
    return ZR_OK;
}

/*
 * ZR_SLOW_SAVE=S: every rank sleeps S seconds (a fraction allowed) after
 * writing its rank file, so that a save takes long enough for a test to stop
 * the job in the middle of it, as a large model's save would. Signals do not
 * cut the sleep short: a handler only asks the run to stop after the save.
 */
void zr_ckpt_slow_point(void)
{
    const char *env = getenv("ZR_SLOW_SAVE");
    char *end = NULL;
    double s = env != NULL ? strtod(env, &end) : 0.0;
    if (env == NULL || end == env || *end != '\0' || !(s > 0) || s > 3600) {
        return;
    }
    double until = zr_now() + s;
    for (double left = s; left > 0; left = until - zr_now()) {
        struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        nanosleep(&ts, NULL);
    }
}
