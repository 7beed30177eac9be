# lumc: install, test, demo. Every target uses the repo's .venv (created by `make install`).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
LUMC   := $(VENV)/bin/lumc
PYTEST := $(PY) -m pytest

.PHONY: install test conformance demo models clean

install:  ## create .venv and install lumc editable with the dev extras (torch pinned to the CPU wheel)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt -e ".[dev]"
	$(LUMC) --version

test:  ## the default suite (no slow, no GPU tests); fetches the four models on first use
	$(PYTEST) -q -m "not slow and not gpu"

conformance:  ## the ONNX backend node tests
	$(PYTEST) tests/conformance -q

demo:  ## fetch MiniLM-L3 and run it through lumc against onnxruntime
	path=$$($(LUMC) models fetch minilm-l3) && $(LUMC) run "$$path" --random \
		--shape batch_size=2 --shape sequence_length=16 --check

models:  ## fetch the four models of MODELS.md into the user cache
	$(LUMC) models fetch all

clean:  ## remove build and test leftovers (not .venv, not the model cache)
	rm -rf build .pytest_cache .hypothesis
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -print | xargs rm -rf
