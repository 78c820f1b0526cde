bench_model.o: bench/bench_model.c bench/../src/cli/cli.h \
  include/zr/model.h include/zr/base.h include/zr/optim.h \
  /usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h \
  /usr/include/x86_64-linux-gnu/openblas-pthread/openblas_config.h

bench/../src/cli/cli.h:

include/zr/model.h:

include/zr/base.h:

include/zr/optim.h:

/usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h:

/usr/include/x86_64-linux-gnu/openblas-pthread/openblas_config.h:
