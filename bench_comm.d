bench_comm.o: bench/bench_comm.c bench/../src/cli/cli.h include/zr/coll.h \
  include/zr/comm.h include/zr/base.h \
  /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h \
  /usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h \
  include/zr/quant.h

bench/../src/cli/cli.h:

include/zr/coll.h:

include/zr/comm.h:

include/zr/base.h:

/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h:

/usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h:

include/zr/quant.h:
