# dsinfer - the only build.
#   make            build/dsinfer and build/dsinfer-test (CPU only)
#   make test       build and run the test suite (what CI runs)
#   make asan       the test suite under ASan + UBSan (build/asan)
#   make CUDA=1     add the CUDA backend (sm_90a; CUDA_ARCH overrides)
#   make fuzz       libFuzzer targets (clang) and a short run of each
#   make fmt / fmt-check / deps / clean
BUILD   ?= build
CC      ?= cc
NVCC    ?= nvcc
CUDA_ARCH ?= sm_90a
V ?= 0
SKIP_SLOW ?= 0
Q := $(if $(filter 1,$(V)),,@)

WARN   := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wformat=2 -Wvla \
          -Wcast-qual -Wdouble-promotion -Wno-unused-parameter
OPT    ?= -O2 -g
SAN    ?=
CFLAGS ?=
CFLAGS += $(OPT) $(SAN) -std=c11 -ffp-contract=off -fno-math-errno $(WARN) -MMD -MP -Iinclude -Isrc -Itests \
          -D_GNU_SOURCE
ifeq ($(NATIVE),1)
CFLAGS += -march=native
endif
ifeq ($(WERROR),1)
CFLAGS += -Werror
endif
LDLIBS := -ljansson -lpcre2-8 -lpthread -lm

LIB_SRC  := $(sort $(wildcard src/core/*.c src/load/*.c src/tok/*.c src/model/*.c src/cache/*.c \
              src/backend/*.c src/backend/cpu/*.c src/run/*.c src/grammar/*.c))
TOOL_SRC := $(sort $(wildcard tools/*.c))
TEST_SRC := $(sort $(wildcard tests/*.c tests/unit/*.c tests/model/*.c))
ifeq ($(CUDA),1)
TEST_SRC += $(sort $(wildcard tests/ops/*.c))
endif

ifeq ($(CUDA),1)
CUDA_SRC := $(sort $(wildcard src/backend/cuda/*.cu))
CUDA_OBJ := $(CUDA_SRC:%.cu=$(BUILD)/%.o)
CFLAGS   += -DDSI_CUDA
CUDA_HOME ?= $(dir $(shell command -v $(NVCC)))..
LDLIBS   += -L$(CUDA_HOME)/lib64 -lcudart -lcublasLt -lcublas -lstdc++
NVFLAGS  := -O3 -lineinfo -std=c++17 -Iinclude -Isrc -gencode=arch=$(subst sm_,compute_,$(CUDA_ARCH)),code=$(CUDA_ARCH) \
            -Xcompiler -Wall,-Wextra,-Wno-unused-parameter -MMD -MP \
            --fmad=false # bitwise parity with the CPU reference (-ffp-contract=off); see cuda/common.cuh
endif

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o) $(CUDA_OBJ)
TOOL_OBJ := $(TOOL_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)

# Rebuild everything when flags change.
STAMP := $(BUILD)/.flags
FLAGS_NOW := $(CC) $(CFLAGS) $(CUDA) $(CUDA_ARCH)
$(shell mkdir -p $(BUILD); echo '$(FLAGS_NOW)' | cmp -s - $(STAMP) || echo '$(FLAGS_NOW)' > $(STAMP))

all: $(BUILD)/dsinfer $(BUILD)/dsinfer-test

$(BUILD)/libdsinfer.a: $(LIB_OBJ)
	$(Q)rm -f $@ && ar rcs $@ $^

$(BUILD)/dsinfer: $(TOOL_OBJ) $(BUILD)/libdsinfer.a
	@echo "  LD    $@"
	$(Q)$(CC) $(CFLAGS) -o $@ $(TOOL_OBJ) $(BUILD)/libdsinfer.a $(LDFLAGS) $(LDLIBS)

$(BUILD)/dsinfer-test: $(TEST_OBJ) $(BUILD)/libdsinfer.a
	@echo "  LD    $@"
	$(Q)$(CC) $(CFLAGS) -o $@ $(TEST_OBJ) $(BUILD)/libdsinfer.a $(LDFLAGS) $(LDLIBS)

$(BUILD)/%.o: %.c $(STAMP)
	@mkdir -p $(dir $@)
	@echo "  CC    $<"
	$(Q)$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/%.o: %.cu $(STAMP)
	@mkdir -p $(dir $@)
	@echo "  NVCC  $<"
	$(Q)$(NVCC) $(NVFLAGS) -c -o $@ $<

test: $(BUILD)/dsinfer $(BUILD)/dsinfer-test
	$(Q)$(BUILD)/dsinfer-test --root .
	$(Q)DSINFER=$(BUILD)/dsinfer SKIP_SLOW=$(SKIP_SLOW) sh tests/cli/run.sh

# The CUDA op parity tests and the CPU-vs-CUDA model checks (needs a GPU; builds with CUDA=1).
test-cuda:
	$(Q)$(MAKE) BUILD=build/cuda CUDA=1 all
	$(Q)build/cuda/dsinfer-test --root . --only 'test_cuda_*'
	$(Q)for t in tests/cli/t_cuda*.sh; do DSINFER=build/cuda/dsinfer sh $$t || exit 1; done

# What CI runs (README's test command): warnings as errors, the suite, the suite under
# ASan/UBSan, a short fuzz run, and the CUDA build when nvcc is present.
check:
	$(Q)$(MAKE) WERROR=1 test
	$(Q)$(MAKE) asan
	$(Q)$(MAKE) fuzz FUZZ_SECONDS=$${FUZZ_SECONDS:-15}
	$(Q)if command -v $(NVCC) >/dev/null 2>&1; then $(MAKE) BUILD=build/cuda CUDA=1 WERROR=1 all; \
	  else echo "nvcc not found: CUDA build skipped"; fi

asan:
	$(Q)$(MAKE) BUILD=build/asan OPT="-O1 -g" \
	    SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	    LDFLAGS="-fsanitize=address,undefined" SKIP_SLOW=1 test

ubsan: asan

# ThreadSanitizer on the threaded parts (pool, serving core).
tsan:
	$(Q)$(MAKE) BUILD=build/tsan OPT="-O1 -g" SAN="-fsanitize=thread" LDFLAGS="-fsanitize=thread" \
	    build/tsan/dsinfer-test
	$(Q)build/tsan/dsinfer-test --root . --only 'test_batch*'
	$(Q)build/tsan/dsinfer-test --root . --only 'test_sched*'
	$(Q)build/tsan/dsinfer-test --root . --only 'test_sample_op*'

FUZZ_TARGETS := $(basename $(notdir $(wildcard tests/fuzz/fuzz_*.c)))
fuzz:
	$(Q)mkdir -p build/fuzz
	$(Q)for t in $(FUZZ_TARGETS); do \
	  echo "  FUZZ  $$t"; \
	  clang -std=c11 -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -Iinclude -Isrc \
	    -o build/fuzz/$$t tests/fuzz/$$t.c $(LIB_SRC) $(LDLIBS) || exit 1; \
	  mkdir -p build/fuzz/corpus-$$t; cp -n tests/fuzz/corpus/$$t/* build/fuzz/corpus-$$t/ 2>/dev/null; \
	  build/fuzz/$$t -max_total_time=$${FUZZ_SECONDS:-20} -rss_limit_mb=2048 build/fuzz/corpus-$$t >build/fuzz/$$t.log 2>&1 \
	    || { tail -40 build/fuzz/$$t.log; exit 1; }; \
	done

FMT_FILES = $(shell git ls-files '*.c' '*.h' '*.cu' '*.cuh')
fmt:
	clang-format -i $(FMT_FILES)
fmt-check:
	clang-format --dry-run --Werror $(FMT_FILES)

deps:
	$(Q)sh tools/check_deps.sh

clean:
	rm -rf build

.PHONY: all test test-cuda check asan ubsan tsan fuzz fmt fmt-check deps clean
-include $(LIB_OBJ:.o=.d) $(TOOL_OBJ:.o=.d) $(TEST_OBJ:.o=.d) $(CUDA_OBJ:.o=.d)
