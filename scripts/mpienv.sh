# mpienv.sh - sourced by scripts: Open MPI settings for one machine.
# Root is allowed (CI runs as root), more ranks than cores are allowed (the
# emulated layouts oversubscribe a small machine), shared memory between
# ranks, one BLAS thread per rank, and idle ranks yield their core.
# A stop saves: on Ctrl-C or SIGTERM, mpirun forwards SIGTERM to the ranks
# and SIGKILLs them odls_base_sigkill_timeout seconds later (1 by default,
# too short to finish a step and write a checkpoint); 30 s (Slurm's default
# KillWait) lets zr finish the step, save and exit. The price: Open MPI 4
# waits that long twice whenever a job ends abnormally (a rank exiting
# non-zero, a signal), even once every rank is gone, so a failing job returns
# about 60 s after its error (tests/run.sh sets 1 again for the suite). Press
# Ctrl-C once: a second one makes mpirun exit at once and leave the ranks
# running (Open MPI 4).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader}"
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_mpi_yield_when_idle=1
export OMPI_MCA_odls_base_sigkill_timeout="${OMPI_MCA_odls_base_sigkill_timeout:-30}"
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
