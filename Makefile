# kubetrain — the README's two commands are `make run` and `make test`. Each installs missing
# Debian packages (scripts/install-deps.sh), configures, builds, then runs.
BUILD ?= build
JOBS ?= 2
BUILD_TYPE ?= RelWithDebInfo
CMAKE_FLAGS ?=

.PHONY: all deps configure build binaries run test bench fuzz image clean

all: build

deps:
	@scripts/install-deps.sh

configure: deps
	@test -f $(BUILD)/build.ninja || cmake -S . -B $(BUILD) -G Ninja \
	  -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The three programs alone (the tests and benchmarks are `make build`'s, built by `make test`).
binaries: configure
	cmake --build $(BUILD) -j $(JOBS) --target kubetrain kubetrain-worker kubetrain-operator

# The main job: train the tiny GPT on this machine through the operator's local control plane.
run: binaries
	$(BUILD)/bin/kubetrain run examples/jobs/tiny.yaml

# The GPU tests (ctest label gpu) need a CUDA GPU: they are registered disabled here and run by
# scripts/device-check.sh on a GPU machine (docs/PERFORMANCE.md, "GPU").
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE gpu
	@echo "GPU tests (ctest label gpu) not run: they need a CUDA GPU; run scripts/device-check.sh on a GPU machine"

bench: build
	$(BUILD)/bin/bench_planner
	$(BUILD)/bin/bench_worker
	$(BUILD)/bin/bench_overlap
	$(BUILD)/bin/bench_adamw
	$(BUILD)/bin/bench_offload
	$(BUILD)/bin/bench_checkpoint
	$(BUILD)/bin/bench_kube
	$(BUILD)/bin/bench_operator
	python3 bench/fidelity.py --kubetrain $(BUILD)/bin/kubetrain --worker $(BUILD)/bin/kubetrain-worker
	@echo "GPU benchmarks (bench_gpu) not run: they need a CUDA GPU; run scripts/device-check.sh on a GPU machine"

# Every libFuzzer harness (fuzz/, clang 14 ASan + UBSan, its own build in $(BUILD)/fuzz) for
# FUZZ_SECONDS each; fails on any finding and prints the executions (docs/RELIABILITY.md, "Fuzzing").
FUZZ_SECONDS ?= 60
fuzz: deps
	FUZZ_BUILD=$(BUILD)/fuzz JOBS=$(JOBS) fuzz/run.sh all $(FUZZ_SECONDS)

# The container image (Dockerfile), CPU only, without a Docker daemon: buildah on a debootstrapped
# Debian 12 base; tags localhost/kubetrain:latest and :<version> (docs/INSTALL.md, "Building the
# image"). Needs root.
image:
	JOBS=$(JOBS) scripts/build-image.sh

clean:
	rm -rf $(BUILD)
