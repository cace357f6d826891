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

.PHONY: test gpu-test gpu-test-cuda12 cuda12-runtime demo bench compat install headers shim clean

# Real CUDA 13.0 headers for the CPU test double, from the pinned pip packages
# (the runtime's, and crt/ which cuda_runtime_api.h includes).
headers: $(CUDA_HEADERS)/crt/host_defines.h
$(CUDA_HEADERS)/crt/host_defines.h:
	rm -rf $(BUILD)/cuda
	python3 -m pip install --quiet --no-deps --disable-pip-version-check --root-user-action=ignore \
		--target $(BUILD)/cuda nvidia-cuda-runtime==$(CUDA_RUNTIME_PIN) nvidia-cuda-crt==$(CUDA_CRT_PIN)

shim:
ifeq ($(SHIM),)
	cargo build --release
endif

test: headers
	cargo build --release
	scripts/cpu_test.sh target/release/libsomashim.so $(CUDA_HEADERS)

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
