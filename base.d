base.o: src/base/base.c include/zr/base.h

include/zr/base.h:
