trainer.o: src/train/trainer.c include/zr/trainer.h \
  include/zr/checkpoint.h include/zr/model.h include/zr/base.h \
  include/zr/zero.h include/zr/coll.h include/zr/comm.h \
  /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h \
  /usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h \
  include/zr/quant.h include/zr/config.h include/zr/data.h \
  include/zr/file.h include/zr/gpt_engine.h include/zr/metrics.h \
  include/zr/launch.h include/zr/schedule.h

include/zr/trainer.h:

include/zr/checkpoint.h:

include/zr/model.h:

include/zr/base.h:

include/zr/zero.h:

include/zr/coll.h:

include/zr/comm.h:

/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h:

/usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h:

include/zr/quant.h:

include/zr/config.h:

include/zr/data.h:

include/zr/file.h:

include/zr/gpt_engine.h:

include/zr/metrics.h:

include/zr/launch.h:

include/zr/schedule.h:
