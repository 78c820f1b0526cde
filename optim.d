optim.o: src/optim/optim.c include/zr/optim.h include/zr/base.h

include/zr/optim.h:

include/zr/base.h:
