# mpienv.sh - sourced by scripts: Open MPI settings for one machine.
# Root is allowed (CI runs as root), more ranks than cores are allowed (the
# emulated layouts oversubscribe a small machine), shared memory between
# ranks, one BLAS thread per rank, and idle ranks yield their core.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader}"
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_mpi_yield_when_idle=1
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
