# Quick start on a fresh Debian 12 machine:
#   make demo   # builds what is missing and runs the main job on loopback
#   make test   # installs missing packages, builds release, asan+ubsan and tsan, runs every test
SHELL := /bin/bash
JOBS ?= $(shell nproc)
PROVIDER ?= tcp
DEPS := cmake ninja-build g++ pkg-config libfabric-dev libfabric-bin libisal-dev \
        libtomlplusplus-dev libcli11-dev libhiredis-dev libfmt-dev libgtest-dev libgmock-dev \
        libbenchmark-dev redis-server iproute2 clang libclang-rt-14-dev
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps build build-asan build-tsan test test-release test-asan test-tsan demo bench clean

all: build

deps:
	@missing=$$(for p in $(DEPS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null \
	  | grep -q 'install ok installed' || echo $$p; done | tr '\n' ' '); \
	if [ -n "$${missing// }" ]; then \
	  echo "installing Debian packages: $$missing"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  $(SUDO) apt-get install -y -q $$missing || { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q $$missing; }; \
	fi

build: deps
	cmake --preset release >/dev/null
	cmake --build --preset release -j $(JOBS)

build-asan: deps
	cmake --preset asan >/dev/null
	cmake --build --preset asan -j $(JOBS)

build-tsan: deps
	cmake --preset tsan >/dev/null
	cmake --build --preset tsan -j $(JOBS)

test-release: build
	ctest --preset release -j $(JOBS)

test-asan: build-asan
	ctest --preset asan -j $(JOBS)

test-tsan: build-tsan
	ctest --preset tsan -j $(JOBS)

# Release first (fastest feedback), then the sanitizer builds.
test: test-release test-asan test-tsan
	@echo "all test suites passed (release, asan+ubsan, tsan)"

demo: build
	./build/bin/dma-demo --provider $(PROVIDER)

# The CRC32C micro-benchmark; the fabric and Redis benchmarks (dma-bench) are issue 5.
bench: build
	./build/bin/dma-bench-crc32c --benchmark_min_time=0.5

clean:
	rm -rf build build-debug build-asan build-tsan
