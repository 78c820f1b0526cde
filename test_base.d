test_base.o: tests/test_base.c tests/test.h include/zr/base.h

tests/test.h:

include/zr/base.h:
