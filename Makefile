# zr - top-level Makefile.
#
# Plain make (no CMake): the tree is small, every source file is found by its
# folder, and one file that a reader can follow from top to bottom beats a
# generator (README "Build"). Everything lands under build/<variant>/.
#
#   make            release build with Open MPI          -> build/release/
#   make SAN=1      ASan+UBSan build                     -> build/asan/
#   make MPI=mpich  release build against MPICH          -> build/mpich/
#   make test       set-up, all three builds, the whole test suite
#   make demo       set-up, release build, the main job
#
# Layers (one folder each under src/, dependencies point one way):
#   base -> quant -> comm -> coll -> zero -> model/data -> cli
# Every src/<layer>/*.c goes into libzr.a except src/cli, which with bench/
# makes the zr program. tests/test_*.c are one program each.

MPI ?= openmpi
SAN ?= 0
NATIVE ?= 1

ifeq ($(MPI),mpich)
  CC := mpicc.mpich
  VARIANT := mpich
else
  CC := mpicc.openmpi
  VARIANT := release
endif
ifeq ($(SAN),1)
  VARIANT := asan$(if $(filter mpich,$(MPI)),-mpich,)
endif
BUILD ?= build/$(VARIANT)

DEPS_CFLAGS := $(shell pkg-config --cflags openblas libcjson 2>/dev/null)
DEPS_LIBS := $(shell pkg-config --libs openblas libcjson 2>/dev/null)

# -ffp-contract=off: no silent FMA contraction, so scalar and vector paths and
# runs on different machines round the same way.
CFLAGS := -std=c11 -Wall -Wextra -Werror -Wstrict-prototypes -Wmissing-prototypes \
          -Wno-unused-parameter -ffp-contract=off -Iinclude -MMD -MP $(DEPS_CFLAGS)
ifeq ($(SAN),1)
  CFLAGS += -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined \
            -fno-omit-frame-pointer
  LDFLAGS += -fsanitize=address,undefined
else
  CFLAGS += -O3 -g
  ifeq ($(NATIVE),1)
    CFLAGS += $(shell gcc -march=native -E -x c /dev/null >/dev/null 2>&1 && echo -march=native)
  endif
endif
LDLIBS := $(DEPS_LIBS) -lm

LIB_SRC := $(filter-out src/cli/%,$(wildcard src/*/*.c))
CLI_SRC := $(wildcard src/cli/*.c) $(wildcard bench/*.c)
TEST_SRC := $(wildcard tests/test_*.c)

LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

.PHONY: all build setup test demo bench clean format check-format
.DEFAULT_GOAL := all

all: build
build: $(BUILD)/libzr.a $(BUILD)/zr $(TEST_BIN)

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libzr.a: $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/zr: $(CLI_OBJ) $(BUILD)/libzr.a
	$(CC) $(LDFLAGS) $(CLI_OBJ) $(BUILD)/libzr.a $(LDLIBS) -o $@

$(BUILD)/tests/%: tests/%.c $(BUILD)/libzr.a tests/test.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $< $(BUILD)/libzr.a $(LDLIBS) -o $@

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d)

# ---- the two commands of the README ----------------------------------------

setup:
	@scripts/setup.sh

# Each build is a separate make so that it is parsed after set-up installed
# the compilers and libraries it asks pkg-config about.
test: setup
	@$(MAKE) --no-print-directory -s build
	@$(MAKE) --no-print-directory -s build SAN=1
	@$(MAKE) --no-print-directory -s build MPI=mpich
	@tests/run.sh

demo: setup
	@$(MAKE) --no-print-directory -s build
	@scripts/demo.sh

bench: setup
	@$(MAKE) --no-print-directory -s build
	@scripts/bench.sh

clean:
	rm -rf build

format:
	clang-format -i $(wildcard include/zr/*.h src/*/*.c src/*/*.h tests/*.c tests/*.h bench/*.c)

check-format:
	clang-format --dry-run -Werror $(wildcard include/zr/*.h src/*/*.c src/*/*.h tests/*.c tests/*.h bench/*.c)
