# trident: `make` builds build/trident; `make run` runs the default job; `make test`.
# `make run` and `make test` first install missing Debian packages (scripts/install_deps.sh)
# and then build in a sub-make, so detection below sees what was just installed.
#
# Overridable: CXX_BASE, CUDA_HOME, NCCL_HOME, NVCC_GENCODE, DEBUG=1, NP (ranks of `make run`).

SHELL := /bin/bash
BUILD ?= build
CUDA_HOME ?= /usr/local/cuda
NCCL_HOME ?= $(CUDA_HOME)
# SASS for A100 and H100/H200, and compute_90 PTX that the driver compiles for a newer GPU.
NVCC_GENCODE ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90]

# ---- tools and libraries ----------------------------------------------------------
# mpicxx wraps g++ with Open MPI's flags; OMPI_CXX picks the compiler underneath.
CXX_BASE ?= g++
CXX := $(shell command -v mpicxx 2>/dev/null || echo $(CXX_BASE))
export OMPI_CXX := $(CXX_BASE)
HAVE_MPI := $(if $(shell command -v mpicxx 2>/dev/null),yes,no)

# -march=native where the compiler accepts it, a portable x86-64 baseline otherwise.
ARCH_FLAGS ?= $(shell $(CXX_BASE) -march=native -x c++ -E /dev/null >/dev/null 2>&1 && echo -march=native || echo -mtune=generic)
HDF5_CFLAGS := $(shell pkg-config --cflags hdf5 2>/dev/null)
HDF5_LIBS := $(shell pkg-config --libs hdf5 2>/dev/null || echo -lhdf5)
HAVE_HDF5 := $(if $(shell pkg-config --exists hdf5 2>/dev/null && echo y),yes,no)
HAVE_DNNL := $(if $(wildcard /usr/include/oneapi/dnnl/dnnl.h),yes,no)
HAVE_BOOST_PO := $(if $(wildcard /usr/include/boost/program_options.hpp),yes,no)
HAVE_GTEST := $(if $(wildcard /usr/include/gtest/gtest.h),yes,no)
# Tokenizers: PCRE2 (the pre-tokenizer patterns of gpt2/llama3) and SentencePiece.
PCRE2_CFLAGS := $(shell pkg-config --cflags libpcre2-8 2>/dev/null)
PCRE2_LIBS := $(shell pkg-config --libs libpcre2-8 2>/dev/null || echo -lpcre2-8)
HAVE_PCRE2 := $(if $(shell pkg-config --exists libpcre2-8 2>/dev/null && echo y),yes,no)
SENTENCEPIECE_CFLAGS := $(shell pkg-config --cflags sentencepiece 2>/dev/null)
SENTENCEPIECE_LIBS := $(shell pkg-config --libs sentencepiece 2>/dev/null || echo -lsentencepiece -lsentencepiece_train)
HAVE_SENTENCEPIECE := $(if $(shell pkg-config --exists sentencepiece 2>/dev/null && echo y),yes,no)
# Prometheus's C++ client (log.metrics_port): its data model and text format.
PROMETHEUS_LIBS := $(shell pkg-config --libs prometheus-cpp-core 2>/dev/null || echo -lprometheus-cpp-core)
HAVE_PROMETHEUS := $(if $(shell pkg-config --exists prometheus-cpp-core 2>/dev/null && echo y),yes,no)
# S3 (checkpoint.upload): libcurl signs SigV4; pugixml reads S3's XML answers.
HAVE_CURL := $(if $(wildcard /usr/include/x86_64-linux-gnu/curl/curl.h /usr/include/curl/curl.h),yes,no)
HAVE_PUGIXML := $(if $(wildcard /usr/include/pugixml.hpp),yes,no)
# libfabric (doctor's provider check): its headers, when installed; the library itself is
# opened at run time (src/cli/system_probes.cpp), not linked.
HAVE_LIBFABRIC := $(if $(wildcard /usr/include/rdma/fabric.h),yes,no)
NVCC := $(shell command -v nvcc 2>/dev/null || { test -x $(CUDA_HOME)/bin/nvcc && echo $(CUDA_HOME)/bin/nvcc; })
HAVE_NCCL := $(if $(wildcard $(NCCL_HOME)/include/nccl.h),yes,no)

ifeq ($(DEBUG),1)
  OPT_FLAGS := -O0 -g -fsanitize=address,undefined
  LINK_OPT := -fsanitize=address,undefined
else
  OPT_FLAGS := -O3 $(ARCH_FLAGS) -g1
  LINK_OPT :=
endif

CPPFLAGS := -I. -Isrc $(HDF5_CFLAGS) $(PCRE2_CFLAGS) $(SENTENCEPIECE_CFLAGS) -DOMPI_SKIP_MPICXX=1 -DTRIDENT_CXX='"$(CXX_BASE) $(shell $(CXX_BASE) -dumpfullversion)"'
CXXFLAGS := -std=c++20 $(OPT_FLAGS) -fopenmp -Wall -Wextra -Wno-unknown-pragmas -MMD -MP
LDLIBS := -ldnnl $(HDF5_LIBS) -lz -lboost_program_options $(PCRE2_LIBS) $(SENTENCEPIECE_LIBS) $(PROMETHEUS_LIBS) -lcrypto -lcurl -lpugixml \
          -fopenmp $(LINK_OPT)

# ---- CUDA (kernels/cuda/*.cu), compiled whenever nvcc is found ------------------------
CUDA_SRCS := $(wildcard kernels/cuda/*.cu)
ifneq ($(NVCC),)
ifneq ($(CUDA_SRCS),)
  CPPFLAGS += -DTRIDENT_CUDA -I$(CUDA_HOME)/include
  CUDA_OBJS := $(CUDA_SRCS:%.cu=$(BUILD)/%.o)
  # cuBLASLt and cuBLAS are not linked: kernels/cuda/cublas_library.cu opens them on a CUDA run's first
  # GEMM (linked, it costs every process, CPU runs too, ~0.4 s at start); the run path finds it.
  # The CUDA runtime is linked statically: no libcudart.so.N to find where the binary runs
  # (a bundle on a machine whose toolkit, if any, is another version); it opens the
  # driver (libcuda.so.1) on the first CUDA call only, so CPU runs need no driver.
  LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart_static -lrt -ldl -lpthread
  ifeq ($(HAVE_NCCL),yes)
    CPPFLAGS += -DTRIDENT_NCCL -I$(NCCL_HOME)/include
    LDLIBS += -L$(NCCL_HOME)/lib64 -Wl,-rpath,$(NCCL_HOME)/lib64 -lnccl
  endif
endif
endif

# ---- sources -----------------------------------------------------------------------
LIB_SRCS := $(wildcard kernels/*.cpp kernels/base/*.cpp kernels/cpu/*.cpp) $(filter-out src/cli/main.cpp,$(wildcard src/*/*.cpp src/*/*/*.cpp))
LIB_OBJS := $(LIB_SRCS:%.cpp=$(BUILD)/%.o) $(CUDA_OBJS)
TEST_SRCS := $(wildcard tests/unit/*.cpp)
TEST_OBJS := $(TEST_SRCS:%.cpp=$(BUILD)/%.o)
MPI_TEST_SRCS := $(wildcard tests/mpi/*.cpp)
MPI_TEST_OBJS := $(MPI_TEST_SRCS:%.cpp=$(BUILD)/%.o)
BENCH_SRCS := $(wildcard benchmarks/*.cpp)
BENCH_BINS := $(BENCH_SRCS:benchmarks/%.cpp=$(BUILD)/bench/%)
# GPU benchmarks (benchmarks/gpu/*.cpp) exist in CUDA builds only.
GPU_BENCH_SRCS := $(if $(CUDA_OBJS),$(wildcard benchmarks/gpu/*.cpp))
BENCH_BINS += $(GPU_BENCH_SRCS:benchmarks/gpu/%.cpp=$(BUILD)/bench/%)

.PHONY: all deps run data test bench clean check-deps summary
all: summary $(BUILD)/trident $(BUILD)/tests/unit_tests $(BUILD)/tests/mpi_tests $(BENCH_BINS)

summary:
	@echo "trident build: compiler $(CXX) ($(CXX_BASE)), flags $(OPT_FLAGS)"
	@echo "  MPI (mpicxx): $(HAVE_MPI)  HDF5: $(HAVE_HDF5)  oneDNN: $(HAVE_DNNL)  Boost.PO: $(HAVE_BOOST_PO)  GoogleTest: $(HAVE_GTEST)"
	@echo "  PCRE2: $(HAVE_PCRE2) ($(PCRE2_LIBS))  SentencePiece: $(HAVE_SENTENCEPIECE) ($(SENTENCEPIECE_LIBS))  libfabric: $(HAVE_LIBFABRIC)"
	@echo "  prometheus-cpp: $(HAVE_PROMETHEUS) ($(PROMETHEUS_LIBS))  libcurl: $(HAVE_CURL)  pugixml: $(HAVE_PUGIXML)"
	@echo "  nvcc: $(if $(NVCC),$(NVCC),no)  NCCL: $(HAVE_NCCL)  CUDA sources: $(words $(CUDA_SRCS))"

deps:
	@bash scripts/install_deps.sh

# The whole library goes into each binary: families and optimizers register themselves by
# name at start (model/families/, optim/), from objects nothing else refers to.
WHOLE_LIB = -Wl,--whole-archive $(BUILD)/libtrident.a -Wl,--no-whole-archive

$(BUILD)/trident: $(BUILD)/src/cli/main.o $(BUILD)/libtrident.a
	$(CXX) $(CXXFLAGS) -o $@ $(filter-out %.a,$^) $(WHOLE_LIB) $(LDLIBS)

# Made anew each time, so that the objects of deleted sources leave it.
$(BUILD)/libtrident.a: $(LIB_OBJS)
	@mkdir -p $(@D)
	@rm -f $@
	ar rcs $@ $^

# Both test binaries share tests/test_main.cpp: MPI initialized, verdicts combined over ranks.
$(BUILD)/tests/unit_tests: $(TEST_OBJS) $(BUILD)/tests/test_main.o $(BUILD)/libtrident.a
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) -o $@ $(filter-out %.a,$^) $(WHOLE_LIB) -lgtest -lpthread $(LDLIBS)

$(BUILD)/tests/mpi_tests: $(MPI_TEST_OBJS) $(BUILD)/tests/test_main.o $(BUILD)/libtrident.a
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) -o $@ $(filter-out %.a,$^) $(WHOLE_LIB) -lgtest -lpthread $(LDLIBS)

# The benchmarks' objects come from pattern rules alone: make would take them for
# intermediates, delete them after linking and build them again on the next make.
.SECONDARY: $(BENCH_SRCS:%.cpp=$(BUILD)/%.o) $(GPU_BENCH_SRCS:%.cpp=$(BUILD)/%.o)

$(BUILD)/bench/%: $(BUILD)/benchmarks/%.o $(BUILD)/libtrident.a
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) -o $@ $(filter-out %.a,$^) $(WHOLE_LIB) $(LDLIBS)

$(BUILD)/bench/%: $(BUILD)/benchmarks/gpu/%.o $(BUILD)/libtrident.a
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) -o $@ $(filter-out %.a,$^) $(WHOLE_LIB) $(LDLIBS)

$(BUILD)/%.o: %.cpp
	@mkdir -p $(@D)
	$(CXX) $(CPPFLAGS) $(CXXFLAGS) -c $< -o $@

# ptxas's report (registers, stack, spills per kernel) is kept beside each object, as
# NAME.ptxas, for tests/cuda/test_attention_spills.sh; nvcc's other messages still show.
$(BUILD)/%.o: %.cu
	@mkdir -p $(@D)
	$(NVCC) -std=c++20 -O3 -lineinfo $(NVCC_GENCODE) -I. -Isrc -MMD -MP -Xptxas -v -c $< -o $@ 2> $(@:.o=.ptxas) || \
	    { cat $(@:.o=.ptxas); exit 1; }
	@grep -vE '^ptxas info|^ +[0-9]+ bytes stack frame' $(@:.o=.ptxas) >&2 || true

# ---- the two commands --------------------------------------------------------------
# The default job: configs/tiny-bpe.ini on 8 ranks as (dp, tp, pp) = (2, 2, 2), one OpenMP
# thread each (`make run NP=1` trains on one rank with every core). Each `make run` starts
# afresh and keeps its checkpoints in runs/<config>/checkpoints, for eval and generate.
NP ?= 8
# Parallel compile jobs of `make run` and `make test` (nvcc is the long pole).
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
RUN_CONFIG ?= configs/tiny-bpe.ini
# `make run DEVICE=cuda NP=1`: the default job on one GPU.
DEVICE ?= cpu
RUN_LAYOUT ?= $(if $(filter 8,$(NP)),--parallel.dp=2 --parallel.tp=2 --parallel.pp=2 --train.micro_batch=2)
MPIRUN ?= mpirun --oversubscribe $(if $(filter 0,$(shell id -u)),--allow-run-as-root) -x OMP_NUM_THREADS=1
LAUNCH = $(if $(filter 1,$(NP)),,$(MPIRUN) -np $(NP))
RUN_CHECKPOINTS ?= runs/$(basename $(notdir $(RUN_CONFIG)))/checkpoints
run: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@$(MAKE) --no-print-directory data
	rm -rf $(RUN_CHECKPOINTS)
	$(LAUNCH) $(BUILD)/trident train --config $(RUN_CONFIG) $(RUN_LAYOUT) --device=$(DEVICE) \
	    --checkpoint.dir=$(RUN_CHECKPOINTS) --checkpoint.every_steps=200

# The default job's data: the fortunes corpus in SentencePiece BPE tokens (a vocabulary
# of 4096 trained on it), as a Megatron indexed dataset; made once, by every rank.
DEFAULT_DATA := build/data/fortunes
data: $(DEFAULT_DATA).idx
$(DEFAULT_DATA).idx: | $(BUILD)/trident
	@mkdir -p $(@D)
	$(LAUNCH) $(BUILD)/trident prepare --input /usr/share/games/fortunes --out $(DEFAULT_DATA) \
	    --data.tokenizer=sentencepiece --train_tokenizer=4096

test: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@bash tests/run_tests.sh $(BUILD)

bench: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@bash benchmarks/run_benchmarks.sh $(BUILD)

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
