# Gale's front door. `make demo` and `make test` work on a fresh Debian/Ubuntu machine: they
# install missing packages with apt, configure, build, then run.
BUILD ?= build
JOBS ?= $(shell nproc)
CUDA_ARCH ?=
CMAKE_FLAGS ?=
DEMO_DIR ?= demo-data
export PATH := /usr/local/cuda/bin:$(PATH)

ifneq ($(CUDA_ARCH),)
CMAKE_FLAGS += -DCMAKE_CUDA_ARCHITECTURES=$(CUDA_ARCH)
endif

FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60

.PHONY: all deps configure build test test-all demo clean fuzz fuzz-ci fuzz-configure

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# Every test not labelled gpu (CI has the CUDA toolkit but no GPU).
test: build
	cd $(BUILD) && ctest -LE gpu --output-on-failure -j $(JOBS)

# Everything, GPU suites included (on a machine with a GPU).
test-all: build
	cd $(BUILD) && ctest --output-on-failure

# libFuzzer harnesses (tests/fuzz, clang + ASan + UBSan, no CUDA): `make fuzz` runs each for
# FUZZ_SECONDS on a working copy of its corpus (two at a time on two cores); `make fuzz-ci` runs
# each for 25 s on the committed corpus from a fixed seed (reproducible), then the committed regressions.
fuzz-configure: deps
	@scripts/install-deps.sh fuzz
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGALE_WITH_CUDA=OFF \
	    -DGALE_BUILD_TESTS=OFF -DGALE_FUZZ=ON -DGALE_FUZZ_SECONDS=$(FUZZ_SECONDS)

fuzz: fuzz-configure
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz

fuzz-ci: fuzz-configure
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz-ci

# A learnable planted-partition graph, generated, then trained on (GPU when present, else CPU).
demo: build
	@mkdir -p $(DEMO_DIR)
	$(BUILD)/bin/gale preprocess --generate sbm:nodes=200K,classes=10,avg-degree=12,feature-dim=64,homophily=0.8,seed=1 \
	    -o $(DEMO_DIR)/sbm.gale --force
	$(BUILD)/bin/gale info $(DEMO_DIR)/sbm.gale
	$(BUILD)/bin/gale train $(DEMO_DIR)/sbm.gale --device auto --model sage --layers 2 --hidden 128 \
	    --fanouts 10,10 --batch-size 1024 --epochs 10 --seed 1 --metrics $(DEMO_DIR)/metrics.jsonl

clean:
	rm -rf $(BUILD) $(DEMO_DIR)
