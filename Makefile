# somashim. `make test`: CPU suite (no GPU). `make demo`: on the GPU where there is one, else on
# the CUDA test double (fetches the headers). `make gpu-test`, `make bench`:
# need a GPU and nvcc; SHIM=path/to/libsomashim.so uses a prebuilt library (no cargo).
SHELL := /bin/bash
CUDA_RUNTIME_PIN := 13.0.96
CUDA_CRT_PIN := 13.0.88
CUDA12_RUNTIME_PIN := 12.9.79
BUILD := build
CUDA_HEADERS := $(BUILD)/cuda/nvidia/cu13/include
SHIM ?=
SHIM_LIB := $(if $(SHIM),$(SHIM),target/release/libsomashim.so)

PREFIX ?= /usr/local

.PHONY: test stress gpu-test gpu-test-cuda12 cuda12-runtime demo bench compat install headers shim clean

# Real CUDA 13.0 headers for the CPU test double, in $(CUDA_HEADERS). Where CUDA_HOME
# is set and $(CUDA_HOME)/include/cuda.h is CUDA 13.0's, that directory is linked there
# and nothing is fetched; else the pinned pip packages (the runtime's, and crt/ which
# cuda_runtime_api.h includes) are fetched once, which needs network access.
headers:
	@if [ -n "$(CUDA_HOME)" ] && [ -f "$(CUDA_HOME)/include/cuda.h" ]; then \
	  v=$$(sed -n 's/^#define CUDA_VERSION \([0-9]*\).*/\1/p' "$(CUDA_HOME)/include/cuda.h"); \
	  if [ "$$v" = 13000 ]; then \
	    rm -rf $(CUDA_HEADERS) && mkdir -p $(dir $(CUDA_HEADERS)) && \
	    ln -s "$$(readlink -f "$(CUDA_HOME)/include")" $(CUDA_HEADERS) && \
	    echo "make headers: using the CUDA 13.0 headers in $(CUDA_HOME)/include (CUDA_HOME)"; \
	    exit $$?; \
	  fi; \
	  echo "make headers: $(CUDA_HOME)/include/cuda.h is CUDA_VERSION $${v:-unknown}, not 13000 (13.0), which the test double is built and checked against: fetching the pinned 13.0 headers instead"; \
	elif [ -n "$(CUDA_HOME)" ]; then \
	  echo "make headers: CUDA_HOME=$(CUDA_HOME) has no include/cuda.h: fetching the pinned 13.0 headers instead"; \
	fi; \
	if [ -L $(CUDA_HEADERS) ] || [ ! -f $(CUDA_HEADERS)/crt/host_defines.h ]; then \
	  rm -rf $(BUILD)/cuda; \
	  echo "make headers: fetching the CUDA 13.0 headers with pip (nvidia-cuda-runtime==$(CUDA_RUNTIME_PIN), nvidia-cuda-crt==$(CUDA_CRT_PIN))"; \
	  python3 -m pip install --quiet --no-deps --disable-pip-version-check --root-user-action=ignore \
	    --target $(BUILD)/cuda nvidia-cuda-runtime==$(CUDA_RUNTIME_PIN) nvidia-cuda-crt==$(CUDA_CRT_PIN) || { \
	    rm -rf $(BUILD)/cuda; \
	    echo "" >&2; \
	    echo "make headers: could not fetch the CUDA 13.0 headers that the CPU test double (make test, and make demo" >&2; \
	    echo "without a GPU) is built against. Either:" >&2; \
	    echo "  - give python3 -m pip network access once: it installs nvidia-cuda-runtime==$(CUDA_RUNTIME_PIN) and" >&2; \
	    echo "    nvidia-cuda-crt==$(CUDA_CRT_PIN) into $(BUILD)/cuda (pip's own error is above); or" >&2; \
	    echo "  - use local headers: CUDA_HOME=/path/to/cuda make test (or make demo), where" >&2; \
	    echo "    /path/to/cuda/include/cuda.h is CUDA 13.0's; or" >&2; \
	    echo "  - copy $(BUILD)/cuda from a checkout where make headers succeeded." >&2; \
	    exit 1; \
	  }; \
	fi

shim:
ifeq ($(SHIM),)
	cargo build --release
endif

test: headers
	cargo build --release
	scripts/cpu_test.sh target/release/libsomashim.so $(CUDA_HEADERS)

# The ordering properties searched deep on the CPU, from a random seed (a few
# minutes; STRESS_CASES per property and setting, PROPTEST_RNG_SEED to repeat one).
stress:
	scripts/stress.sh

gpu-test: shim
	scripts/gpu_test.sh $(SHIM_LIB)

# The shim under the CUDA 12 runtime (shared and static); needs build/cu12,
# which `make cuda12-runtime` fetches (carry it to a machine without network).
gpu-test-cuda12: shim
	scripts/cuda12_test.sh $(SHIM_LIB) $(BUILD)/cu12

cuda12-runtime: $(BUILD)/cu12/nvidia/cuda_runtime/lib/libcudart.so.12
$(BUILD)/cu12/nvidia/cuda_runtime/lib/libcudart.so.12:
	rm -rf $(BUILD)/cu12
	python3 -m pip install --quiet --no-deps --disable-pip-version-check --root-user-action=ignore \
		--target $(BUILD)/cu12 nvidia-cuda-runtime-cu12==$(CUDA12_RUNTIME_PIN)

demo: shim
	scripts/demo.sh $(SHIM_LIB)

bench: shim
	scripts/bench.sh $(SHIM_LIB)

# Every GPU framework installed here, natively and under the shim (scripts/compat.py).
compat: shim
	python3 scripts/compat.py $(SHIM_LIB) $(COMPAT_ARGS)

# PREFIX/lib/libsomashim.so, without the build's debug info (target/release
# keeps it), and PREFIX/bin/somarun (DESTDIR and STRIP are honoured).
install: shim
	scripts/install.sh $(PREFIX) $(SHIM_LIB)

clean:
	rm -rf $(BUILD)
	cargo clean
