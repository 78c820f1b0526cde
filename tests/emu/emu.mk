# tests/emu/emu.mk - the GPU emulator build (issue 23), included by the
# Makefile when EMU=1:
#
#   make EMU=1          -> build/emu/       the whole tree with the emulated GPU
#   make EMU=1 TSAN=1   -> build/emu-tsan/  the same under ThreadSanitizer
#
# No CUDA toolkit is used or needed: every C file is compiled with
# -DZR_CUDA=1 -DZR_CUDA_EMU=1 against the emulator's runtime header
# (tests/emu/include), every .cu file by g++ as C++ against its kernel-side
# header, and everything is linked with libzremu.a, the emulator
# (tests/emu/*.cpp). C++ goes through Open MPI's wrapper, so a .cu file may
# include MPI. The Makefile sets VARIANT and CUDA=0 before anything reads
# them; the rules here are static pattern rules, so they win over the
# generic %.c (and nvcc's %.cu) rules for the files they name.

EMU_CXX := mpicxx.openmpi
EMU_DEFS := -DZR_CUDA=1 -DZR_CUDA_EMU=1 -DZR_NCCL=1 -Itests/emu/include
# the kernels: as the contract says (-O1 keeps a block's threads cheap to
# start and the code easy to debug; no FMA contraction, as nvcc --fmad=false
# for src/quant and src/optim; src/model's FFMA is checked on a GPU only)
EMU_CUFLAGS := -std=c++17 -O1 -g -ffp-contract=off -pthread $(EMU_DEFS) -Iinclude \
               -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -MMD -MP
# the emulator itself (its cuBLAS runs on OpenBLAS: cblas.h)
EMU_LIBFLAGS := -std=c++17 -O2 -g -pthread -Itests/emu/include -Wall -Wextra -MMD -MP \
                $(DEPS_CFLAGS)
ifeq ($(WERROR),1)
  EMU_CUFLAGS += -Werror
  EMU_LIBFLAGS += -Werror
endif
CFLAGS += $(EMU_DEFS)
ifeq ($(TSAN),1)
  CFLAGS += -fsanitize=thread
  EMU_CUFLAGS += -fsanitize=thread
  EMU_LIBFLAGS += -fsanitize=thread
  LDFLAGS += -fsanitize=thread
endif

EMU_LIB := $(BUILD)/libzremu.a
EMU_LIB_SRC := $(wildcard tests/emu/*.cpp)
EMU_LIB_OBJ := $(EMU_LIB_SRC:%.cpp=$(BUILD)/obj/%.o)
EMU_CU_SRC := $(wildcard src/*/*.cu)
EMU_CU_OBJ := $(EMU_CU_SRC:%.cu=$(BUILD)/obj/%.cu.o)
EMU_TEST_SRC := $(wildcard tests/test_*.cu)
EMU_TEST_BIN := $(EMU_TEST_SRC:tests/%.cu=$(BUILD)/tests/%)

LDLIBS += $(EMU_LIB) $(BLAS_LIBS) $(DEPS_LIBS) -lstdc++ -lm -pthread
FLAGS_ID += EMU $(EMU_CXX) $(EMU_CUFLAGS) $(EMU_LIBFLAGS)

.PHONY: emu-tests
build: $(EMU_LIB) $(EMU_TEST_BIN)
# what the emulator suite runs (make test builds only this under TSan): the .cu tests, and
# the C programs of the emu-tsan lines whose host threads meet the emulator's (the transports),
# and zr's own threads: the model's worker pool (test_model), the codecs on it (test_quant)
# and zr bench noise (zr with test_cli_rules)
EMU_TSAN_C_TESTS := $(BUILD)/tests/test_transport $(BUILD)/tests/test_model \
                    $(BUILD)/tests/test_quant $(BUILD)/tests/test_cli_rules $(BUILD)/zr
# the Llama operators' split over the pool: GQA attention's backward by key/value head
EMU_TSAN_C_TESTS += $(BUILD)/tests/test_ops_llama
emu-tests: $(EMU_LIB) $(EMU_TEST_BIN) $(EMU_TSAN_C_TESTS)
$(BUILD)/libzr.a: $(EMU_CU_OBJ)
$(BUILD)/zr $(TEST_BIN): $(EMU_LIB)

$(EMU_LIB_OBJ): $(BUILD)/obj/%.o: %.cpp $(BUILD)/flags
	@mkdir -p $(dir $@)
	$(EMU_CXX) $(EMU_LIBFLAGS) -c $< -o $@

$(EMU_LIB): $(EMU_LIB_OBJ)
	rm -f $@ && ar rcs $@ $^

$(EMU_CU_OBJ): $(BUILD)/obj/%.cu.o: %.cu $(BUILD)/flags
	@mkdir -p $(dir $@)
	$(EMU_CXX) -x c++ $(EMU_CUFLAGS) -c $< -o $@

$(EMU_TEST_BIN): $(BUILD)/tests/%: tests/%.cu $(BUILD)/libzr.a $(EMU_LIB) tests/test.h \
                 $(BUILD)/flags
	@mkdir -p $(dir $@)
	$(EMU_CXX) -x c++ $(EMU_CUFLAGS) $(LDFLAGS) $< -x none $(BUILD)/libzr.a $(LDLIBS) -o $@

-include $(EMU_LIB_OBJ:.o=.d) $(EMU_CU_OBJ:.o=.d) $(EMU_TEST_BIN:=.d)
