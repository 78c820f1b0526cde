plot.o: src/cli/plot.c src/cli/cli.h include/zr/metrics.h \
  include/zr/base.h include/zr/file.h

src/cli/cli.h:

include/zr/metrics.h:

include/zr/base.h:

include/zr/file.h:
