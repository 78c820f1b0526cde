selfcheck.o: src/cli/selfcheck.c src/cli/cli.h include/zr/comm.h \
  include/zr/base.h /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h \
  /usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h

src/cli/cli.h:

include/zr/comm.h:

include/zr/base.h:

/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h:

/usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h:
