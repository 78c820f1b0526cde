test_zero.o: tests/test_zero.c tests/test.h include/zr/base.h \
  /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h \
  /usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h \
  include/zr/gpt_engine.h include/zr/model.h include/zr/zero.h \
  include/zr/coll.h include/zr/comm.h include/zr/quant.h \
  include/zr/optim.h

tests/test.h:

include/zr/base.h:

/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h:

/usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h:

include/zr/gpt_engine.h:

include/zr/model.h:

include/zr/zero.h:

include/zr/coll.h:

include/zr/comm.h:

include/zr/quant.h:

include/zr/optim.h:
