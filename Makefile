# zr - top-level Makefile.
#
# Plain make (no CMake): the tree is small, every source file is found by its
# folder, and one file that a reader can follow from top to bottom beats a
# generator (README "Build"). Everything lands under build/<variant>/.
#
#   make            release build with Open MPI, portable x86-64 -> build/release/
#   make NATIVE=1   release build with -march=native             -> build/native/
#   make SAN=1      ASan+UBSan build                             -> build/asan/
#   make MPI=mpich  release build against MPICH                  -> build/mpich/
#   make CUDA=0     any of the above without the CUDA backend (the default
#                   is on wherever nvcc is found: PATH, /usr/local/cuda/bin,
#                   or CUDA_HOME; NCCL from the toolkit or NCCL_HOME)
#   make test       set-up, the format and tree checks, the target/compiler
#                   matrix, all three builds and the two GPU emulator builds
#                   with warnings as errors, the whole test suite
#   make matrix     compile (only) the whole tree for gcc and clang x
#                   -march=x86-64, x86-64-v3, x86-64-v4, warnings as errors
#   make gpu-test   the gpu suite (tests/testlist) on this machine's GPU
#   make demo       set-up, release build, the main job
#   make EMU=1      the tree on the GPU emulator (tests/emu/emu.mk)  -> build/emu/
#   make EMU=1 TSAN=1  the same under ThreadSanitizer              -> build/emu-tsan/
#
# The default build is portable: vector kernels carry target attributes and
# are chosen at run time (__builtin_cpu_supports), so a binary built on one
# node runs on every x86-64 node of a cluster. NATIVE=1 only changes the code
# around them, and builds into its own folder so objects never mix.
#
# Warnings are errors only where zr's own checks build (WERROR=1, which
# `make test` and `make matrix` pass): a user's `make` must not break on a
# warning that a newer compiler invents.
#
# Layers (one folder each under src/, dependencies point one way):
#   base -> quant -> comm -> coll -> optim -> zero -> model/data -> config/ckpt -> train/plan -> cli
# Layers joined by / stand side by side and never include each other;
# scripts/check_tree.sh (make check-tree, run by make test) checks that
# README says the same chain and that the includes of src/ follow it.
# Every src/<layer>/*.c goes into libzr.a except src/cli, which with bench/
# makes the zr program. tests/test_*.c are one program each. With CUDA,
# src/<layer>/*.cu (the kernels) are compiled by nvcc into libzr.a too.

MPI ?= openmpi
SAN ?= 0
NATIVE ?= 0
WERROR ?= 0
DEBUG ?= -g

ifeq ($(MPI),mpich)
  CC := mpicc.mpich
  VARIANT := mpich
else
  CC := mpicc.openmpi
  VARIANT := release
endif
ifeq ($(SAN),1)
  VARIANT := asan$(if $(filter mpich,$(MPI)),-mpich,)
else ifeq ($(NATIVE),1)
  VARIANT := $(if $(filter mpich,$(MPI)),mpich-native,native)
endif
# the GPU emulator build needs no CUDA toolkit and must not pick one up
ifeq ($(EMU),1)
  VARIANT := emu$(if $(filter 1,$(TSAN)),-tsan)
  CUDA := 0
endif
BUILD ?= build/$(VARIANT)

# ---- CUDA (issue 23) ---------------------------------------------------------
#
# On wherever nvcc is found, so that `make test` compiles and links the
# kernels on every machine with a toolkit, GPU or not. ASan builds default to
# CUDA=0: ASan's shadow memory and the CUDA driver's address-space
# reservations do not mix (the ASan suite checks the host code; the kernels'
# checks are the emulator's and the GPU's). MPICH builds keep CUDA: nothing
# in it depends on the MPI.
ifeq ($(SAN),1)
  CUDA ?= 0
endif
CUDA ?= auto
ZR_CUDA := 0
ifneq ($(CUDA),0)
  ifneq ($(CUDA_HOME),)
    NVCC := $(wildcard $(CUDA_HOME)/bin/nvcc)
  else
    NVCC := $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
    NVCC := $(if $(NVCC),$(realpath $(NVCC)))
    CUDA_HOME := $(patsubst %/bin/nvcc,%,$(NVCC))
  endif
  ifneq ($(NVCC),)
    ZR_CUDA := 1
  else ifeq ($(CUDA),1)
    $(error CUDA=1 but no nvcc in CUDA_HOME, on PATH or in /usr/local/cuda/bin)
  else ifeq ($(MAKELEVEL),0)
    $(info zr: no nvcc found (PATH, /usr/local/cuda/bin, CUDA_HOME): building without CUDA)
  endif
endif

# OpenBLAS is compiled against (cblas.h) but not linked: zr opens it at start-up
# after choosing its kernels from the CPU's features (src/base/blas.h), first
# by soname, then from the folder pkg-config names (ZR_BLAS_DIR). BLAS_LIBS
# links it where a program calls it directly (the GPU emulator's cuBLAS).
DEPS_CFLAGS := $(shell pkg-config --cflags openblas libcjson 2>/dev/null)
DEPS_LIBS := $(shell pkg-config --libs libcjson 2>/dev/null)
BLAS_LIBS := $(shell pkg-config --libs openblas 2>/dev/null)
BLAS_DIR := $(shell pkg-config --variable=libdir openblas 2>/dev/null)

# -ffp-contract=off: no silent FMA contraction, so scalar and vector paths and
# runs on different machines round the same way. -fno-trapping-math: zr never
# reads floating-point exception flags, so gcc may evaluate both sides of a
# float select (exp's clamps, GELU) and vectorize the loop; it changes no
# value (clang assumes it by default). -Wno-missing-field-initializers: a
# struct's trailing members left to zero are deliberate (a GPT-2 shape is the
# first six fields of zr_gpt_config; the architecture after them is 0, GPT-2).
CFLAGS := -std=c11 -Wall -Wextra -Wstrict-prototypes -Wmissing-prototypes \
          -Wno-unused-parameter -Wno-missing-field-initializers -ffp-contract=off -fno-trapping-math -Iinclude -MMD -MP \
          $(DEPS_CFLAGS) -DZR_BLAS_DIR=\"$(patsubst %/,%,$(BLAS_DIR))\"
ifeq ($(WERROR),1)
  CFLAGS += -Werror
endif
ifeq ($(SAN),1)
  CFLAGS += -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined \
            -fno-omit-frame-pointer
  LDFLAGS += -fsanitize=address,undefined
else
  CFLAGS += -O3 $(DEBUG)
  ifeq ($(NATIVE),1)
    CFLAGS += $(shell gcc -march=native -E -x c /dev/null >/dev/null 2>&1 && echo -march=native)
  endif
endif
# MARCH: a target for every file (the matrix sets it; empty = the compiler's
# default, which on Debian x86-64 is the portable -march=x86-64)
MARCH ?=
CFLAGS += $(MARCH)
LDLIBS := $(DEPS_LIBS) -ldl -lpthread -lm

ifeq ($(ZR_CUDA),1)
  # NCCL: NCCL_HOME, else the toolkit's or the system's
  ifneq ($(NCCL_HOME),)
    NCCL_CFLAGS := -isystem $(NCCL_HOME)/include
    NCCL_DIR := $(NCCL_HOME)/lib
  else
    NCCL_DIR := $(patsubst %/,%,$(dir $(firstword $(wildcard $(CUDA_HOME)/lib64/libnccl.so \
                  /usr/lib/x86_64-linux-gnu/libnccl.so))))
  endif
  ZR_NCCL := $(if $(NCCL_DIR),1,0)
  # Linked: the CUDA runtime, statically (it opens the driver, libcuda.so.1,
  # at its first call). Not linked: cuBLAS and NCCL, which zr opens at their
  # first use (src/base/cudalib.h), first from the folders found here, then
  # by soname. So a process that never uses them maps none of them (a CPU
  # run, zr --help), and zr starts on a node that lacks them.
  # C files see the runtime API as a system header (its own warnings are not ours)
  CFLAGS += -DZR_CUDA=1 -DZR_NCCL=$(ZR_NCCL) -isystem $(CUDA_HOME)/include $(NCCL_CFLAGS) \
            -DZR_CUBLAS_DIR=\"$(CUDA_HOME)/lib64\" -DZR_NCCL_DIR=\"$(NCCL_DIR)\"
  LDLIBS += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lpthread -lstdc++
  # --fmad=false: no fused multiply-add, so kernels round as the CPU code does
  # (-ffp-contract=off there), wherever a rule must give the CPU's bits (the
  # codecs, AdamW and the sum of squares: src/quant, src/optim). The model's
  # kernels (src/model) may contract: NVCC_FMAD below; their bound against
  # the CPU is tolerance-based (tests/test_backend_ops.c). sm_80 and sm_90
  # binaries plus sm_90 PTX for newer GPUs; ptxas reports registers, spills
  # and local memory per kernel.
  NVCCFLAGS := -std=c++17 -O3 -lineinfo -Iinclude \
               -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
               -gencode arch=compute_90,code=compute_90 \
               -Xptxas -v,-warn-spills,-warn-lmem-usage \
               -Xcompiler -Wall,-Wextra,-Wno-missing-field-initializers
  ifeq ($(WERROR),1)
    NVCCFLAGS += -Werror all-warnings -Xcompiler -Werror
  endif
endif

# What the build lacks is not compiled (NCCL's layout): the CUDA backend's
# files only where CUDA is built (nvcc, or the emulator: EMU=1), NCCL's
# transport only with NCCL, oneDNN's bf16 products only with oneDNN 2's
# header. Where other code calls into a missing part, a file of its own
# (src/<layer>/*_nocuda.c, *_none.c) goes in instead and refuses with the
# same "built without ..." message.
CUDA_BUILT := $(if $(filter 1,$(ZR_CUDA) $(EMU)),1,0)
NCCL_BUILT := $(if $(filter 1,$(ZR_NCCL) $(EMU)),1,0)
DNNL2 := $(if $(shell grep -qs '^\#define DNNL_VERSION_MAJOR 2$$' \
           /usr/include/oneapi/dnnl/dnnl_version.h && echo y),1,0)
CUDA_ONLY_SRC := src/base/cudalib.c src/base/device_cuda.c src/quant/quant_cuda.c \
                 src/comm/transport_device.c src/comm/transport_staged.c \
                 src/coll/coll_local_cuda.c src/optim/optim_cuda.c src/model/ops_cuda.c \
                 src/model/blas_cuda.c src/model/gpt_backend_cuda.c
LEFT_OUT := $(if $(filter 1,$(CUDA_BUILT)),$(wildcard src/*/*_nocuda.c),$(CUDA_ONLY_SRC)) \
            $(if $(filter 1,$(NCCL_BUILT)),src/comm/transport_nccl_none.c,src/comm/transport_nccl.c) \
            $(if $(filter 1,$(DNNL2)),src/base/blas_bf16_none.c,src/base/blas_bf16.c)
LIB_SRC := $(filter-out src/cli/% $(LEFT_OUT),$(wildcard src/*/*.c))
CU_SRC := $(if $(filter 1,$(ZR_CUDA)),$(wildcard src/*/*.cu))
CLI_SRC := $(wildcard src/cli/*.c) $(wildcard bench/*.c)
TEST_SRC := $(wildcard tests/test_*.c)

LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CU_OBJ := $(CU_SRC:%.cu=$(BUILD)/obj/%.cu.o)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/obj/%.o)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

# Sub-makes run in parallel unless the caller already chose (make -jN).
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
PAR = $(if $(filter -j% --jobserver%,$(MAKEFLAGS)),,-j$(JOBS))

.PHONY: all build objects print-cflags werror-check setup test gpu-test matrix demo bench clean \
        format check-format check-tree check-hf FORCE
.DEFAULT_GOAL := all

all: build
build: $(BUILD)/libzr.a $(BUILD)/zr $(TEST_BIN) $(if $(CU_OBJ),$(BUILD)/ptxas.txt)
# every C file compiled, nothing linked (the matrix: the .cu files are nvcc's,
# compiled once by the build itself)
objects: $(LIB_OBJ) $(CLI_OBJ) $(TEST_OBJ)

# The compiler and flags a folder was built with: when they change (another
# default target, a new flag), every object in it is rebuilt instead of old and
# new code being linked together. -Werror changes no code, so it is left out.
FLAGS_ID := $(CC) $(filter-out -Werror,$(CFLAGS)) $(LDFLAGS) $(LDLIBS) OMPI_CC=$(OMPI_CC) \
            CUDA=$(ZR_CUDA) $(NVCC) $(filter-out -Werror all-warnings,$(NVCCFLAGS)) \
            fmad=model-only
$(BUILD)/flags: FORCE
	@mkdir -p $(dir $@)
	@echo '$(FLAGS_ID)' | cmp -s - $@ || echo '$(FLAGS_ID)' >$@

$(BUILD)/obj/%.o: %.c $(BUILD)/flags
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# nvcc; ptxas' report (-v) goes to <object>.ptxas, anything else to the terminal.
# Contraction per folder: exact everywhere but the model's kernels.
NVCC_FMAD = --fmad=false
$(BUILD)/obj/src/model/%.cu.o: NVCC_FMAD = --fmad=true
# but the Llama family's element rules, the CPU's bits (src/model/llama_rules.h)
$(BUILD)/obj/src/model/llama_cuda.cu.o: NVCC_FMAD = --fmad=false
$(BUILD)/obj/%.cu.o: %.cu $(BUILD)/flags
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FMAD) $(NVCCFLAGS) -MMD -MP -MF $(@:.o=.d) -c $< -o $@ 2>$(@:.o=.ptxas); \
	rc=$$?; grep -Ev '^ptxas info|bytes stack frame' $(@:.o=.ptxas) >&2; exit $$rc

# The kernels' registers, spills and local memory, one report per build; in
# the test builds a kernel that spills or uses local memory fails the build,
# and so does SASS without the instructions scripts/sass_check.sh requires.
$(BUILD)/ptxas.txt: $(CU_OBJ)
	@cat $(CU_OBJ:.o=.ptxas) >$@
	@if [ "$(WERROR)" = 1 ] && ! scripts/ptxas_check.sh $@; then rm -f $@; exit 1; fi
	@if [ "$(WERROR)" = 1 ] && ! NVCC=$(NVCC) CUDA_HOME=$(CUDA_HOME) scripts/sass_check.sh $(CU_OBJ); \
	    then rm -f $@; exit 1; fi

$(BUILD)/libzr.a: $(LIB_OBJ) $(CU_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/zr: $(CLI_OBJ) $(BUILD)/libzr.a
	$(CC) $(LDFLAGS) $(CLI_OBJ) $(BUILD)/libzr.a $(LDLIBS) -o $@

$(BUILD)/tests/%: tests/%.c $(BUILD)/libzr.a tests/test.h $(BUILD)/flags
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $< $(BUILD)/libzr.a $(LDLIBS) -o $@

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TEST_OBJ:.o=.d) $(TEST_BIN:=.d) $(CU_OBJ:.o=.d)

ifeq ($(EMU),1)
  include tests/emu/emu.mk
endif

# ---- the target/compiler matrix ---------------------------------------------
#
# A warning can depend on the compiler and on the target: gcc 12 sees a
# maybe-uninitialized value only when AVX-512 is off (a04b058), so a tree that
# is clean on the developers' AVX-512 machine failed everywhere else. Every
# file is compiled (not linked) for each pair below at the release
# optimisation level with warnings as errors, on whatever machine runs the
# tests. clang goes through the same MPI wrapper (OMPI_CC). One line per pair.

# gcc at the compiler's default target (x86-64) is not a pair: make test's
# release build is exactly that compile, with warnings as errors.
MATRIX_CCS := gcc clang
MATRIX_MARCHS := x86-64 x86-64-v3 x86-64-v4
MATRIX := $(filter-out gcc.x86-64,$(foreach c,$(MATRIX_CCS),$(foreach m,$(MATRIX_MARCHS),$(c).$(m))))

matrix:
	@$(MAKE) --no-print-directory -k $(PAR) $(MATRIX:%=matrix-%) werror-check

matrix-%: FORCE
	@cc=$(word 1,$(subst ., ,$*)); march=$(word 2,$(subst ., ,$*)); \
	dir=build/matrix/$$cc-$$march; mkdir -p $$dir; \
	if OMPI_CC=$$cc $(MAKE) --no-print-directory -s objects MPI=openmpi SAN=0 NATIVE=0 \
	        WERROR=1 DEBUG= MARCH=-march=$$march BUILD=$$dir >$$dir/log 2>&1; then \
	    printf 'matrix  %-5s -march=%-10s ok\n' $$cc $$march; \
	else \
	    printf 'matrix  %-5s -march=%-10s FAILED (%s)\n' $$cc $$march $$dir/log; \
	    grep -E 'error|warning' $$dir/log | head -n 20 | sed 's/^/    | /'; \
	    exit 1; \
	fi

print-cflags:
	@echo '$(CFLAGS)'

# The user's build compiles a file with a warning; the test build refuses it.
werror-check: FORCE
	@mkdir -p build/matrix; f=build/matrix/warning.c; \
	printf 'int zr_warn(void);\nint zr_warn(void)\n{\n    int unused;\n    return 0;\n}\n' >$$f; \
	user=$$($(MAKE) --no-print-directory -s print-cflags WERROR=0 SAN=0 NATIVE=0 MPI=openmpi); \
	test=$$($(MAKE) --no-print-directory -s print-cflags WERROR=1 SAN=0 NATIVE=0 MPI=openmpi); \
	if mpicc.openmpi $$user -MF /dev/null -c $$f -o /dev/null 2>/dev/null && \
	   ! mpicc.openmpi $$test -MF /dev/null -c $$f -o /dev/null 2>/dev/null; then \
	    echo 'werror  make builds despite a warning, make test refuses it: ok'; \
	else \
	    echo 'werror  FAILED: a warning must not stop make, and must stop make test'; exit 1; \
	fi

# ---- the two commands of the README ----------------------------------------

setup:
	@scripts/setup.sh

# Each build is a separate make so that it is parsed after set-up installed
# the compilers and libraries it asks pkg-config about. The test builds treat
# warnings as errors; the matrix runs first because it fails fastest.
test: setup
	@$(MAKE) --no-print-directory -s check-format
	@$(MAKE) --no-print-directory -s check-tree
	@$(MAKE) --no-print-directory -s matrix
	@$(MAKE) --no-print-directory -s $(PAR) build WERROR=1
	@$(MAKE) --no-print-directory -s $(PAR) build WERROR=1 SAN=1
	@$(MAKE) --no-print-directory -s $(PAR) build WERROR=1 MPI=mpich
	@$(MAKE) --no-print-directory -s $(PAR) build WERROR=1 EMU=1
	@$(MAKE) --no-print-directory -s $(PAR) emu-tests WERROR=1 EMU=1 TSAN=1
	@tests/run.sh

demo: setup
	@$(MAKE) --no-print-directory -s $(PAR) build
	@scripts/demo.sh

# The GPU programs of tests/testlist on this machine's GPU (each says it was
# skipped, and why, where there is none), then under compute-sanitizer's tools.
gpu-test: setup
	@$(MAKE) --no-print-directory -s $(PAR) build WERROR=1
	@scripts/gpu_test.sh

bench: setup
	@$(MAKE) --no-print-directory -s $(PAR) build
	@scripts/bench.sh

# zr against transformers, live (issue 43; opt-in, not in make test): the reference data
# regenerated, and GPT-2's train -> export --hf -> from_pretrained round trip. Installs torch
# and transformers into build/hfvenv (ZR_HF_PYTHON: a Python that has them).
check-hf:
	@$(MAKE) --no-print-directory -s $(PAR) build
	@ZR_BUILD=$(BUILD) scripts/check_hf.sh

clean:
	rm -rf build

# The tree is formatted by Debian 12's clang-format (14); other versions
# format some constructs differently, so check-format compares only with 14
# and says so when it cannot (setup installs clang-format).
FORMAT_SRC = $(wildcard include/zr/*.h src/*/*.c src/*/*.h src/*/*.cu tests/*.c tests/*.h \
               tests/*.cu tests/emu/*.cpp tests/emu/*.h tests/emu/include/*.h bench/*.c)
CLANG_FORMAT ?= $(shell command -v clang-format-14 2>/dev/null || command -v clang-format 2>/dev/null)

format:
	$(CLANG_FORMAT) -i $(FORMAT_SRC)

check-format:
	@v=$$($(CLANG_FORMAT) --version 2>/dev/null | sed -n 's/.*version \([0-9]*\).*/\1/p'); \
	if [ "$$v" != 14 ]; then \
	    echo "check-format: skipped (clang-format '$$v' found; the tree is formatted with 14)"; \
	else \
	    $(CLANG_FORMAT) --dry-run -Werror $(FORMAT_SRC) && echo "check-format: ok"; \
	fi

# The layer chain, the include directions and the size limits (README "How
# the code is laid out").
check-tree:
	@scripts/check_tree.sh
