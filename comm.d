comm.o: src/comm/comm.c src/comm/comm_impl.h include/zr/comm.h \
  include/zr/base.h /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h \
  /usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h

src/comm/comm_impl.h:

include/zr/comm.h:

include/zr/base.h:

/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h:

/usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h:
