/*
 * zr/launch.h - checks that every rank of "zr train" was started the same
 * way, before the ranks' collectives could diverge.
 *
 * mpirun can start ranks with different arguments (MPMD launches, wrapper
 * scripts, per-node environments, a file that differs between nodes). Ranks
 * that disagree on the stage or the step count issue different collectives
 * and would wait for each other forever. So right after the configuration is
 * read, ranks compare it key by key (every key of zr train's table, and
 * --help), and once the data is loaded they compare its identity (token
 * count, vocabulary, a CRC-32C of the tokens at the start and the end). A
 * difference is ZR_ERR_INVALID on every rank with the same message naming
 * each differing key, its values and the ranks holding each value.
 *
 * Cost: one all-gather of 8 bytes per rank when everything agrees; the
 * key-by-key comparison runs only to explain a difference.
 */
#ifndef ZR_LAUNCH_H
#define ZR_LAUNCH_H

#include "zr/comm.h"
#include "zr/config.h"
#include "zr/data.h"

/* Collective over world: same effective configuration and same --help everywhere. */
zr_status zr_launch_check_config(zr_comm *c, const zr_train_config *cfg, int help);

/*
 * Collective over world: the configuration of "zr train" from its arguments
 * (argv[0] is the subcommand's name), finalized for world's size and agreed
 * on by every rank, through a short-lived communicator with no hpZ group.
 * *help is 1 when --help was given (cfg then holds only what was parsed).
 * warn receives unknown-key warnings and notes on every rank.
 */
zr_status zr_launch_read_config(MPI_Comm world, int argc, char **argv, zr_train_config *cfg,
                                int *help, void (*warn)(void *ctx, const char *msg), void *ctx);

/* Collective over world: the dataset read from path (for messages) is the same everywhere. */
zr_status zr_launch_check_data(zr_comm *c, const zr_dataset *d, const char *path);

/*
 * What the data is, in one line a checkpoint records and a resume compares:
 * "text, 123456 tokens, vocabulary 256, CRC-32C of the first and last MiB
 * 1a2b3c4d" (the same fingerprint ranks compare at launch).
 */
void zr_launch_data_id(const zr_dataset *d, char *buf, size_t n);

/*
 * Seconds the launcher waits between the SIGTERM it forwards (for Ctrl-C or
 * a SIGTERM of its own) and the SIGKILL that follows, where zr can see it
 * from the environment envp: Open MPI's odls_base_sigkill_timeout (its
 * OMPI_MCA_ variable, set by --mca too; else the MCA parameter files; else
 * Open MPI's default, 1 s). -1 when it cannot be seen (MPICH's mpiexec waits
 * for the ranks; Slurm's KillWait is not visible to a job). how receives
 * where the value came from.
 */
double zr_launch_grace_s(char *const *envp, char *how, size_t n);

/*
 * The general form: n named values per rank (names the same on every rank,
 * values any text) compared across world; on a difference ZR_ERR_INVALID
 * with "<what>: NAME is VALUE on RANKS, VALUE on RANKS; ...; <hint>".
 */
zr_status zr_launch_agree(zr_comm *c, int n, const char *const *names, const char *const *values,
                          const char *what, const char *hint);

#endif /* ZR_LAUNCH_H */
