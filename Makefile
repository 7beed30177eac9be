# lumc: install, test, demo. Every target uses the repo's .venv (created by `make install`).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
LUMC   := $(VENV)/bin/lumc
PYTEST := $(PY) -m pytest

.PHONY: install test conformance demo models clean

# the GPU machine's Triton, beside the dev one: the tests compile every kernel form for cuda:90
# with it too (tests/backends/test_triton_gpu_image.py), as the GPU will
GPU_TRITON     := 3.6.0
GPU_TRITON_DIR := $(VENV)/triton-gpu-image

install:  ## create .venv and install lumc editable with the dev extras (torch pinned to the CPU wheel), and the GPU image's Triton in .venv/triton-gpu-image
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt -e ".[dev]"
	test -f $(GPU_TRITON_DIR)/triton/__init__.py || $(PY) -m pip install -q --no-deps \
		--target $(GPU_TRITON_DIR) triton==$(GPU_TRITON)
	$(LUMC) --version

# pytest-xdist processes for make test (one per core of the CI machine)
TEST_WORKERS ?= 2

test:  ## the default suite (no slow, no GPU tests) on TEST_WORKERS processes; fetches the four models on first use
	$(PYTEST) -q -n $(TEST_WORKERS) -m "not slow and not gpu" --durations=15

conformance:  ## the ONNX backend node tests
	$(PYTEST) tests/conformance -q

DEMO_BUDGET ?= 60s
demo:  ## fetch MiniLM-L3, compile it (short budget, whatever device is here), run it vs onnxruntime, print the report
	mkdir -p build
	path=$$($(LUMC) models fetch minilm-l3) && $(LUMC) compile "$$path" --budget $(DEMO_BUDGET) \
		--shape batch_size=1 --shape sequence_length=128 -o build/minilm.lumc --report build/minilm-report.json
	$(LUMC) run build/minilm.lumc --random --check
	$(LUMC) inspect build/minilm.lumc

models:  ## fetch the four models of the README's Models table into the user cache
	$(LUMC) models fetch all

clean:  ## remove build and test leftovers (not .venv, not the model cache)
	rm -rf build .pytest_cache .hypothesis
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -print | xargs rm -rf

# ---- Triton backend on a GPU (backends/triton/gpu_check.sh) ----------------------------------------
.PHONY: gpu-check gpu-wheels gpu-models gpu-candidates

gpu-check:  ## the main job on an H100/H200 (gpu tests, 6 models compiled, CUDA-graph checked, vs eager/inductor -> docs/gpu-results.md); stops with exit 2 without a GPU
	bash backends/triton/gpu_check.sh

gpu-wheels:  ## fetch the wheels gpu-check installs on the GPU machine (CPython 3.12) into build/wheels
	$(PY) -m pip download -q --only-binary=:all: --no-deps --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
		--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d build/wheels \
		"numpy>=1.26,<2.5" ml_dtypes==0.6.0 platformdirs==4.14.8 pytest==9.2.0 iniconfig==2.3.1 \
		pluggy==1.7.0 packaging==26.4 pygments==2.21.0 hypothesis==6.170.17 sortedcontainers==2.4.0 \
		onnx==1.23.2 protobuf==7.36.2 onnxruntime==1.32.0 flatbuffers==25.12.19 click==8.5.1 \
		rich==15.0.0 markdown-it-py==4.3.0 mdurl==0.1.2 networkx==3.6.1

gpu-candidates:  ## run each gpu-check model's e-graph here (needs egglog, no GPU) and write its candidates to build/gpu-candidates, carried to the GPU machine (its image has no egglog)
	$(PY) -m lumc.compiler.tools.gpu_main --candidates-out build/gpu-candidates

gpu-models:  ## copy the four models (README, Models) into build/gpu-models (carried to the GPU machine)
	mkdir -p build/gpu-models
	for m in silero-vad magika ppocr-det minilm-l3; do cp "$$($(LUMC) models fetch $$m)" build/gpu-models/; done
